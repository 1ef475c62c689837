#include "train/run_protocol.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/io/checkpoint.h"

namespace engine {
namespace {

// One process: the requests as they are, the clock checked when asked, sink failures
// thrown where they happen.
class OneProcessProtocol final : public RunProtocol {
 public:
  Agreed agree(bool stop_requested, bool checkpoint_requested, const std::function<bool()>&,
               const std::function<bool()>& save_due, StepDigests* digests) override {
    if (digests) digests->replicas = {digests->replica};
    return {stop_requested, checkpoint_requested, save_due && save_due()};
  }
  // The time limit is checked right before the step it is about (after whatever the
  // previous step saved), not in agree().
  bool time_limit_before_step(const std::function<bool()>& late) override { return late(); }
  bool time_limit_now(const std::function<bool()>& late) override { return late(); }
  void call_sink(const std::function<void()>& call) override { call(); }
  bool holds_sink_failure() const override { return false; }
  void finish_run() override {}
  void reset() override {}
};

// What a rank's held sink failure was, as agreed between the ranks (the largest wins).
enum class SinkFailure : int64_t { None = 0, Other = 1, Write = 2 };

// Several ranks: every decision is one small exchange (Collective::agree_max of six
// int64), so every rank acts on the same answer at the same step.
class RanksProtocol final : public RunProtocol {
 public:
  explicit RanksProtocol(Collective& comm) : comm_(comm) {}

  Agreed agree(bool stop_requested, bool checkpoint_requested, const std::function<bool()>& next_step_late,
               const std::function<bool()>& save_due, StepDigests* digests) override {
    // Rank 0 decides the next step's time limit and a save by time now, in the same exchange.
    const bool late = owns_clock() && next_step_late && next_step_late();
    const bool due = owns_clock() && save_due && save_due();
    const std::vector<int64_t> all = exchange(stop_requested || stop_agreed_, checkpoint_requested, late, due, digests);
    stop_agreed_ = all[0] != 0;
    next_step_late_ = all[2] != 0;
    return {stop_agreed_, all[1] != 0, all[5] != 0};
  }
  bool time_limit_before_step(const std::function<bool()>&) override { return next_step_late_; }
  bool time_limit_now(const std::function<bool()>& late) override {
    const bool mine = owns_clock() && late();
    const std::vector<int64_t> all = exchange(stop_agreed_, false, mine);
    stop_agreed_ = all[0] != 0;
    return all[2] != 0;
  }
  void call_sink(const std::function<void()>& call) override {
    if (held_) return;  // the run stops at the next agreement: no further saves
    try {
      call();
    } catch (...) {
      held_ = std::current_exception();
    }
  }
  bool holds_sink_failure() const override { return held_ != nullptr; }
  void finish_run() override { exchange(stop_agreed_, false, false); }
  void reset() override {
    stop_agreed_ = next_step_late_ = false;
    held_ = nullptr;
  }

 private:
  // Only rank 0's clock decides the time limit: the ranks' clocks and limits may differ.
  bool owns_clock() const { return comm_.rank() == 0; }

  // The flags' maximum over the ranks; with `digests`, their words ride along in the same
  // allgather: the parts summed (modulo 2^64), the replicas by rank.
  std::vector<int64_t> exchange(bool stop, bool checkpoint, bool late, bool save_due = false,
                                StepDigests* digests = nullptr) {
    const int rank = comm_.rank();
    SinkFailure failure = SinkFailure::None;
    if (held_) try {
        std::rethrow_exception(held_);
      } catch (const CheckpointWriteError&) {
        failure = SinkFailure::Write;
      } catch (...) {
        failure = SinkFailure::Other;
      }
    std::vector<int64_t> local = {stop, checkpoint, late, static_cast<int64_t>(failure),
                                  failure == SinkFailure::None ? 0 : rank + 1, save_due};
    const std::size_t flags = local.size();
    if (digests) {
      local.push_back(static_cast<int64_t>(digests->replica));
      for (const uint64_t p : digests->parts) local.push_back(static_cast<int64_t>(p));
    }
    const int w = comm_.size();
    std::vector<int64_t> gathered(local.size() * static_cast<std::size_t>(w));
    comm_.allgather(local.data(), local.size() * sizeof(int64_t), gathered.data());
    std::vector<int64_t> all(local.begin(), local.begin() + static_cast<std::ptrdiff_t>(flags));
    for (int r = 0; r < w; ++r)
      for (std::size_t i = 0; i < flags; ++i) all[i] = std::max(all[i], gathered[r * local.size() + i]);
    if (digests) {
      digests->replicas.assign(static_cast<std::size_t>(w), 0);
      std::vector<uint64_t> sums(digests->parts.size(), 0);
      for (int r = 0; r < w; ++r) {
        const int64_t* row = gathered.data() + r * local.size() + flags;
        digests->replicas[static_cast<std::size_t>(r)] = static_cast<uint64_t>(row[0]);
        for (std::size_t i = 0; i < sums.size(); ++i) sums[i] += static_cast<uint64_t>(row[1 + i]);
      }
      digests->parts = std::move(sums);
    }
    if (all[3] != static_cast<int64_t>(SinkFailure::None)) {
      if (held_) {
        const std::exception_ptr e = held_;
        held_ = nullptr;
        std::rethrow_exception(e);
      }
      const std::string what = "rank " + std::to_string(rank) + ": rank " + std::to_string(all[4] - 1) +
                               " could not save a checkpoint (its message says why), so every rank stops";
      if (all[3] == static_cast<int64_t>(SinkFailure::Write)) throw CheckpointWriteError(what);
      throw std::runtime_error(what);
    }
    return all;
  }

  Collective& comm_;
  bool stop_agreed_ = false;     // a rank asked to stop (this fit)
  bool next_step_late_ = false;  // rank 0's time decision for the next step, agreed
  std::exception_ptr held_;      // this rank's sink failure, until the next agreement
};

}  // namespace

std::unique_ptr<RunProtocol> make_run_protocol(Collective& comm) {
  if (comm.size() == 1) return std::make_unique<OneProcessProtocol>();
  return std::make_unique<RanksProtocol>(comm);
}

}  // namespace engine
