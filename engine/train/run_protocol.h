// How the ranks of a run act as one (docs/distributed.md "Stops and preemption"): the
// stop and checkpoint requests every rank acts on at the same step, the time limit that
// only the clock-owning rank decides, and a sink failure held on its rank until every
// rank can act on it. The Trainer talks only to this interface; one process and several
// ranks are its two implementations (make_run_protocol), so the run loop has no branch
// on the world size.
#pragma once
#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "engine/core/collective.h"

namespace engine {

class RunProtocol {
 public:
  virtual ~RunProtocol() = default;

  struct Agreed {
    bool stop = false, checkpoint = false;
    bool save_due = false;  // checkpoint.every_seconds: the clock-owning rank's answer
  };
  // What the ranks compare and add up after a step, in the same exchange (step digests,
  // docs/replay.md): no extra round.
  struct StepDigests {
    uint64_t replica = 0;            // in: this rank's digest of the state every rank holds
    std::vector<uint64_t> parts;     // in: this rank's shard's sums; out: every rank's added
    std::vector<uint64_t> replicas;  // out: every rank's `replica`, by rank
  };
  // After a step, and between evaluation batches that a stop may cut short: the stop
  // and checkpoint requests every rank acts on. `next_step_late` (may be empty) is
  // asked, on the rank whose clock decides, whether the next step would overrun the
  // time limit; time_limit_before_step() then gives the answer every rank acts on. A
  // sink failure held on any rank is thrown here, on every rank.
  // `save_due` (may be empty) is asked on the same rank whether a save by time is due
  // now (checkpoint.every_seconds); every rank gets its answer.
  // With `digests` (after a step), the parts are added up and the replicas gathered too.
  virtual Agreed agree(bool stop_requested, bool checkpoint_requested,
                       const std::function<bool()>& next_step_late, const std::function<bool()>& save_due,
                       StepDigests* digests = nullptr) = 0;
  // Before a step that follows a step of this epoch: whether the time limit stops here.
  virtual bool time_limit_before_step(const std::function<bool()>& late) = 0;
  // At an epoch boundary, or before the test evaluation: whether the time limit stops
  // here (`late` asked on the clock-owning rank only; the same answer on every rank).
  virtual bool time_limit_now(const std::function<bool()>& late) = 0;

  // A call of the run's sink (a save, metrics, a flush). One process: the call, its
  // exceptions thrown here. Several ranks: a failure is held (and later calls skipped)
  // until the next agree(), so that no rank throws alone while the others wait in a
  // collective.
  virtual void call_sink(const std::function<void()>& call) = 0;
  virtual bool holds_sink_failure() const = 0;
  // The end of a fit(): a failure of the saves just flushed reaches every rank.
  virtual void finish_run() = 0;
  // A new fit(): nothing agreed or held from the previous one.
  virtual void reset() = 0;
};

// The protocol for `comm`'s ranks: one process (no exchange) or several.
std::unique_ptr<RunProtocol> make_run_protocol(Collective& comm);

}  // namespace engine
