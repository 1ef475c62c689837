// World-size invariance without MPI (docs/distributed.md): W = 1, 2, 4 and 8 ranks
// simulated by threads of one process, exchanging through an in-process Collective,
// each train the CNN and the MLP for an epoch and a bit (a ragged last batch, smaller
// than the 8 chunks, an epoch end with validation, a test evaluation) and every rank's
// whole state (snapshot()) must be bit-identical to the plain single-process Trainer's.
#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/batch_chunks.h"
#include "engine/core/collective.h"
#include "engine/nn/models/registry.h"
#include "engine/train/trainer.h"
#include "support/thread_collective.h"
#include "synthetic_data.h"

namespace {

using namespace engine;

using test_support::run_ranks;

// ---- data and runs -------------------------------------------------------------------

// 1x28x28 images in 10 classes for the CNN: class k brightens row band k, over noise.
class Synthetic28 : public Dataset {
 public:
  Synthetic28(int64_t train, int64_t val, int64_t test) : counts_{train, val, test} {}
  ImageShape sample_shape() const override { return {1, 28, 28}; }
  int num_classes() const override { return 10; }
  Device device() const override { return Device::cpu(); }
  const SplitData& get(Split s) override {
    auto& slot = splits_[static_cast<int>(s)];
    if (!slot) slot = make(counts_[static_cast<int>(s)], 77u * (static_cast<uint32_t>(s) + 1));
    return *slot;
  }
  void release(Split s) override { splits_[static_cast<int>(s)].reset(); }

 private:
  SplitData make(int64_t count, uint32_t seed) const {
    SplitData d;
    d.count = count;
    d.images = Tensor::empty({count, 784}, DType::U8);
    d.labels = Tensor::empty({count}, DType::U8);
    uint32_t state = seed;
    auto next = [&state] { return state = state * 1664525u + 1013904223u; };
    for (int64_t i = 0; i < count; ++i) {
      const int label = static_cast<int>(next() >> 16) % 10;
      d.labels.u8()[i] = static_cast<uint8_t>(label);
      for (int p = 0; p < 784; ++p) {
        const bool lit = (p / 28) / 3 == label;
        d.images.u8()[i * 784 + p] = static_cast<uint8_t>((next() >> 24) % 100 + (lit ? 140 : 0));
      }
    }
    return d;
  }
  int64_t counts_[3];
  std::optional<SplitData> splits_[3];
};

enum class Arch { Cnn, Mlp };

Config run_config(Arch arch, int chunks = 8) {
  Config c;
  c.dist.chunks = chunks;
  c.device = "cpu";
  c.seed = 7;
  c.model.name = arch == Arch::Cnn ? "fashion_cnn" : "mlp";
  c.model.dropout = 0.3;
  // CNN: 100 = 4 * 24 + 4 (a last batch of 4 < 8 chunks: some ranks get no sample);
  // MLP: 90 = 5 * 16 + 10.
  c.data.batch_size = arch == Arch::Cnn ? 24 : 16;
  c.data.mean = 0.35;
  c.data.std = 0.25;
  c.optimizer.lr = 3e-3;
  c.train.epochs = 3;
  c.checkpoint.every_n_epochs = std::nullopt;
  return c;
}

std::unique_ptr<Trainer> make_trainer(Arch arch, Collective* comm, TrainerObserver* observer = nullptr,
                                      int chunks = 8) {
  const Config c = run_config(arch, chunks);
  std::unique_ptr<Dataset> data;
  std::unique_ptr<Model> model;
  if (arch == Arch::Cnn) {
    data = std::make_unique<Synthetic28>(100, 30, 20);
    model = make_model_for(c.model, ImageShape{1, 28, 28}, 10);
  } else {
    data = std::make_unique<test_util::SyntheticDataset>(90, 45, 21);
    model = make_model_for(c.model, test_util::SyntheticDataset::kShape, test_util::SyntheticDataset::kClasses);
  }
  TrainerOptions options;
  options.observer = observer;
  options.data = std::move(data);
  options.collective = comm;
  return std::make_unique<Trainer>(c, Device::cpu(), std::move(model), std::move(options));
}

struct RunOutcome {
  Checkpoint state;
  std::vector<double> step_losses;
  EvalResult test;
};

// One epoch and two steps of the next (the ragged last batch, validation at the epoch
// end), then a test evaluation.
RunOutcome train_a_bit(Trainer& t) {
  RunOutcome o;
  for (int i = 0; i < 20; ++i) {
    const StepResult r = t.train_step();
    o.step_losses.push_back(r.loss);
    if (r.epoch == 2 && r.step_in_epoch == 2) break;
  }
  o.test = t.evaluate(Split::Test);
  o.state = t.snapshot();
  return o;
}

// Bit-identical state, wall-clock timings aside.
void expect_same_state(const Checkpoint& want, const Checkpoint& got) {
  REQUIRE(want.groups.size() == got.groups.size());
  for (const auto& [group, sd] : want.groups) {
    CAPTURE(group);
    REQUIRE(got.groups.count(group));
    const StateDict& g = got.groups.at(group);
    REQUIRE(g.tensors.size() == sd.tensors.size());
    for (const auto& [key, t] : sd.tensors) {
      CAPTURE(key);
      REQUIRE(g.tensors.count(key));
      const Tensor& u = g.tensors.at(key);
      REQUIRE(u.shape() == t.shape());
      REQUIRE(u.dtype() == t.dtype());
      CHECK(std::memcmp(u.raw(), t.raw(), static_cast<std::size_t>(t.nbytes())) == 0);
    }
    REQUIRE(g.scalars.size() == sd.scalars.size());
    for (const auto& [key, s] : sd.scalars) {
      CAPTURE(key);
      if (key.size() > 8 && key.compare(key.size() - 8, 8, "_seconds") == 0) continue;
      REQUIRE(g.scalars.count(key));
      CHECK(g.scalars.at(key) == s);
    }
  }
}

void check_world_sizes(Arch arch, std::vector<int> worlds, int chunks = 8) {
  auto plain = make_trainer(arch, nullptr, nullptr, chunks);
  const RunOutcome want = train_a_bit(*plain);
  REQUIRE(plain->history().size() == 1);  // an epoch end with validation was reached
  for (int world : worlds) {
    CAPTURE(world);
    CAPTURE(chunks);
    std::vector<RunOutcome> got(static_cast<std::size_t>(world));
    run_ranks(world, [&](int rank, Collective& comm) {
      auto t = make_trainer(arch, &comm, nullptr, chunks);
      got[rank] = train_a_bit(*t);
    });
    for (int rank = 0; rank < world; ++rank) {
      CAPTURE(rank);
      CHECK(got[rank].step_losses == want.step_losses);
      CHECK(got[rank].test.loss == want.test.loss);
      CHECK(got[rank].test.accuracy == want.test.accuracy);
      CHECK(got[rank].test.confusion == want.test.confusion);
      expect_same_state(want.state, got[rank].state);
    }
  }
}

}  // namespace

TEST_CASE("BatchChunks: rank r of W holds chunks [8r/W, 8(r+1)/W) of the global batch, as whole subtrees") {
  const int64_t batch = 13;  // chunks of 1 or 2 samples: 0,1,3,4,6,8,9,11,13
  BatchChunks whole(batch);
  REQUIRE(whole.blocks().size() == 1);
  CHECK(whole.blocks()[0].chunks == 8);
  CHECK(whole.local_begin() == 0);
  CHECK(whole.local_count() == 13);
  CHECK_FALSE(whole.needs_completion());
  const std::vector<int> want_bounds = {0, 1, 3, 4, 6, 8, 9, 11, 13};
  CHECK(whole.blocks()[0].bounds == want_bounds);
  run_ranks(4, [&](int rank, Collective& comm) {
    BatchChunks p(batch, &comm);
    REQUIRE(p.blocks().size() == 1);
    CHECK(p.blocks()[0].chunks == 2);
    CHECK(p.local_begin() == want_bounds[2 * rank]);
    CHECK(p.local_count() == want_bounds[2 * rank + 2] - want_bounds[2 * rank]);
    CHECK(p.blocks()[0].bounds[1] == want_bounds[2 * rank + 1] - want_bounds[2 * rank]);
    // gather_samples: every rank ends with every sample's value.
    std::vector<int32_t> v(batch, -1);
    for (int i = 0; i < p.local_count(); ++i) v[p.local_begin() + i] = static_cast<int32_t>(100 + p.local_begin() + i);
    p.gather_samples(v.data());
    for (int i = 0; i < batch; ++i) CHECK(v[i] == 100 + i);
  });
  // 3 ranks: [0, 2), [2, 5), [5, 8) -> blocks {0-1}, {2-3, 4}, {5, 6-7}.
  run_ranks(3, [&](int rank, Collective& comm) {
    BatchChunks p(batch, &comm);
    std::vector<std::pair<int, int>> got;
    for (const BatchChunks::Block& b : p.blocks()) got.push_back({b.first_chunk, b.chunks});
    const std::vector<std::vector<std::pair<int, int>>> want = {{{0, 2}}, {{2, 2}, {4, 1}}, {{5, 1}, {6, 2}}};
    CHECK(got == want[rank]);
    CHECK(p.needs_completion());
    int covered = 0;
    for (const BatchChunks::Block& b : p.blocks()) {
      CHECK(b.begin == covered);
      covered += b.count;
    }
    CHECK(covered == p.local_count());
  });
  // One process with 16 chunks: two blocks of 8, combined.
  BatchChunks sixteen(40, nullptr, 16);
  CHECK(sixteen.blocks().size() == 2);
  CHECK(sixteen.needs_completion());
}

TEST_CASE("BatchChunks::complete gives every rank the one-process tree sum, bit for bit, at any world size") {
  // Chunk partials chosen so that another order of summation gives other bits.
  const float part[8] = {1e8f, 1.0f, -1e8f, 3.0f, 0.5f, 1e-3f, 7e7f, -7e7f};
  const float want = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  const float sequential = part[0] + part[1] + part[2] + part[3] + part[4] + part[5] + part[6] + part[7];
  REQUIRE(want != sequential);  // the test can tell the orders apart
  for (int world = 1; world <= 8; ++world) {
    CAPTURE(world);
    run_ranks(world, [&](int, Collective& comm) {
      BatchChunks p(8, &comm);
      // Each block's subtree sum, as a layer's chunked op computes it.
      std::vector<float> parts;
      for (const BatchChunks::Block& b : p.blocks()) {
        std::vector<float> sub(part + b.first_chunk, part + b.first_chunk + b.chunks);
        for (int step = 1; step < b.chunks; step *= 2)
          for (int i = 0; i + step < b.chunks; i += 2 * step) sub[i] += sub[i + step];
        parts.push_back(sub[0]);
      }
      float v = 0;
      p.complete(parts.data(), 1, &v);
      CHECK(v == want);
    });
  }
}

TEST_CASE("more ranks than dist.chunks are refused, naming the key") {
  for (int world : {3, 5}) {
    CAPTURE(world);
    std::vector<std::string> messages(static_cast<std::size_t>(world));
    run_ranks(world, [&](int rank, Collective& comm) {
      try {
        make_trainer(Arch::Mlp, &comm, nullptr, 2);
      } catch (const std::invalid_argument& e) {
        messages[rank] = e.what();
      }
    });
    for (const std::string& m : messages) {
      CHECK(m.find("world size " + std::to_string(world)) != std::string::npos);
      CHECK(m.find("dist.chunks = 2") != std::string::npos);
    }
  }
  CHECK_THROWS_WITH_AS(make_trainer(Arch::Mlp, nullptr, nullptr, 12), doctest::Contains("power of two"), std::invalid_argument);
}

TEST_CASE("a checkpoint resumes only with the dist.chunks it was trained with") {
  auto a = make_trainer(Arch::Mlp, nullptr);
  a->train_step();
  const Checkpoint ckpt = a->snapshot();
  auto b = make_trainer(Arch::Mlp, nullptr, nullptr, 16);
  CHECK_THROWS_WITH_AS(b->restore(ckpt, LoadMode::Strict), doctest::Contains("dist.chunks = 8"), std::runtime_error);
  auto c = make_trainer(Arch::Mlp, nullptr);
  CHECK(c->restore(ckpt, LoadMode::Strict).clean());
}

TEST_CASE("the MLP trains bit-identically on 1 to 8 ranks and in one process") {
  check_world_sizes(Arch::Mlp, {1, 2, 3, 4, 5, 6, 7, 8});
}

TEST_CASE("the CNN (synchronised batch norm, dropout) trains bit-identically on 1, 2, 3, 4, 5, 6 and 8 ranks") {
  check_world_sizes(Arch::Cnn, {1, 2, 3, 4, 5, 6, 8});
}

TEST_CASE("with dist.chunks = 16 the CNN trains bit-identically on 16 ranks, 3 ranks and in one process") {
  check_world_sizes(Arch::Cnn, {3, 16}, 16);
}

TEST_CASE("a state taken mid-epoch on 4 ranks continues on 2 ranks and in one process like a straight run") {
  // Straight: 7 steps in one process (epoch 1 has 5 steps of the MLP run).
  auto straight = make_trainer(Arch::Mlp, nullptr);
  for (int i = 0; i < 7; ++i) straight->train_step();
  const Checkpoint want = straight->snapshot();

  // 3 steps on 4 ranks (mid-epoch), then the rest elsewhere.
  std::vector<Checkpoint> mid(4);
  run_ranks(4, [&](int rank, Collective& comm) {
    auto t = make_trainer(Arch::Mlp, &comm);
    for (int i = 0; i < 3; ++i) t->train_step();
    mid[rank] = t->snapshot();
  });
  for (int rank = 1; rank < 4; ++rank) expect_same_state(mid[0], mid[rank]);

  std::vector<Checkpoint> on_two(2);
  run_ranks(2, [&](int rank, Collective& comm) {
    auto t = make_trainer(Arch::Mlp, &comm);
    REQUIRE(t->restore(mid[0], LoadMode::Strict).clean());
    for (int i = 0; i < 4; ++i) t->train_step();
    on_two[rank] = t->snapshot();
  });
  for (const Checkpoint& c : on_two) expect_same_state(want, c);

  auto one = make_trainer(Arch::Mlp, nullptr);
  REQUIRE(one->restore(mid[0], LoadMode::Strict).clean());
  for (int i = 0; i < 4; ++i) one->train_step();
  expect_same_state(want, one->snapshot());
}

// ---- stops agreed between the ranks (docs/distributed.md "Stops and preemption") -----

namespace {

// Asks this rank's trainer to stop, or to checkpoint, once global step `at` has ended
// (the request is then seen after the next step, as a signal arriving mid-step is), and
// may slow the rank down after every step.
class RequestAt : public TrainerObserver {
 public:
  enum class What { Stop, Checkpoint };
  RequestAt(What what, int64_t at, double sleep_seconds = 0) : what_(what), at_(at), sleep_(sleep_seconds) {}
  void attach(Trainer& t) { t_ = &t; }
  void on_step_end(int64_t step) override {
    if (step == at_ && t_) {
      if (what_ == What::Stop) t_->control().request_stop();
      else t_->control().request_checkpoint();
    }
    if (sleep_ > 0) std::this_thread::sleep_for(std::chrono::duration<double>(sleep_));
  }

 private:
  What what_;
  int64_t at_;
  double sleep_;
  Trainer* t_ = nullptr;
};

// Rank 0's run directory, in memory: the state of every save, and a disk that may refuse
// the n-th save (CheckpointWriteError, as checkpoint.on_error = stop has it).
class MemorySink : public RunSink {
 public:
  struct Saved {
    CheckpointKind kind;
    int64_t global_step;
    Checkpoint state;
  };
  explicit MemorySink(int fail_on_save = 0) : fail_on_(fail_on_save) {}
  void save(Trainer& t, CheckpointKind kind) override {
    if (++count_ == fail_on_) throw CheckpointWriteError("memory/last.h5: no space left on device (test)");
    Checkpoint c = t.snapshot();  // shares the live tensors: keep a copy
    for (auto& [group, d] : c.groups)
      for (auto& [key, tensor] : d.tensors) tensor = tensor.clone();
    saves.push_back({kind, t.global_step(), std::move(c)});
  }
  void record_metrics(Trainer&, const std::optional<EvalResult>&) override {}
  double save_estimate(const Trainer&) const override { return 0; }
  void flush(Trainer&) override {}
  std::vector<Saved> saves;

 private:
  int fail_on_;
  int count_ = 0;
};

Checkpoint straight_state_after(int64_t steps) {
  auto t = make_trainer(Arch::Mlp, nullptr);
  for (int64_t i = 0; i < steps; ++i) t->train_step();
  return t->snapshot();
}

// The whole run (3 epochs and the test evaluation) in one process, and from `mid` on
// `world` ranks.
Checkpoint straight_to_the_end() {
  auto t = make_trainer(Arch::Mlp, nullptr);
  REQUIRE(t->fit().ending == FitResult::Ending::Completed);
  return t->snapshot();
}
void expect_resume_reaches(const Checkpoint& mid, int world, const Checkpoint& want) {
  std::vector<Checkpoint> got(static_cast<std::size_t>(world));
  run_ranks(world, [&](int rank, Collective& comm) {
    auto t = make_trainer(Arch::Mlp, &comm);
    REQUIRE(t->restore(mid, LoadMode::Strict).clean());
    REQUIRE(t->fit().ending == FitResult::Ending::Completed);
    got[rank] = t->snapshot();
  });
  for (const Checkpoint& c : got) expect_same_state(want, c);
}

struct RankStop {
  FitResult result;
  int64_t global_step = 0;
  Checkpoint state;
};

// A fit() on `world` ranks, rank r with observer requests[r] (null: none) and rank 0
// with `sink` and `plans[r]`.
std::vector<RankStop> fit_on_ranks(int world, const std::vector<std::shared_ptr<RequestAt>>& requests,
                                   RunSink* sink = nullptr, const std::vector<StopPlan>& plans = {}) {
  std::vector<RankStop> out(static_cast<std::size_t>(world));
  run_ranks(world, [&](int rank, Collective& comm) {
    RequestAt* obs = rank < static_cast<int>(requests.size()) ? requests[rank].get() : nullptr;
    auto t = make_trainer(Arch::Mlp, &comm, obs);
    if (obs) obs->attach(*t);
    const StopPlan plan = rank < static_cast<int>(plans.size()) ? plans[rank] : StopPlan{};
    out[rank].result = t->fit(plan, rank == 0 ? sink : nullptr);
    out[rank].global_step = t->global_step();
    out[rank].state = t->snapshot();
  });
  return out;
}

using What = RequestAt::What;

}  // namespace

TEST_CASE("a stop requested on the ranks at different steps stops every rank at the same step") {
  // The MLP run has 6 steps an epoch. Rank 0 is asked after step 2, rank 1 two steps
  // later: every rank stops after step 3 (the first request seen), in epoch 1.
  const Checkpoint end = straight_to_the_end();
  std::vector<std::shared_ptr<RequestAt>> req = {std::make_shared<RequestAt>(What::Stop, 2),
                                                 std::make_shared<RequestAt>(What::Stop, 4), nullptr, nullptr};
  MemorySink sink;
  const std::vector<RankStop> got = fit_on_ranks(4, req, &sink);
  const Checkpoint want = straight_state_after(3);
  for (int rank = 0; rank < 4; ++rank) {
    CAPTURE(rank);
    CHECK(got[rank].result.ending == FitResult::Ending::Stopped);
    CHECK(got[rank].result.stop_cause == FitResult::StopCause::Requested);
    CHECK(got[rank].global_step == 3);
    expect_same_state(want, got[rank].state);
  }
  // One checkpoint, at that step (rank 0's sink), and it resumes to the straight run's end.
  REQUIRE(sink.saves.size() == 1);
  CHECK(sink.saves[0].kind == CheckpointKind::MidEpoch);
  CHECK(sink.saves[0].global_step == 3);
  expect_same_state(want, sink.saves[0].state);
  expect_resume_reaches(sink.saves[0].state, 2, end);
  expect_resume_reaches(sink.saves[0].state, 1, end);

  SUBCASE("a stop requested on rank 2 only, in epoch 2") {
    std::vector<std::shared_ptr<RequestAt>> only2 = {nullptr, nullptr, std::make_shared<RequestAt>(What::Stop, 8)};
    MemorySink sink2;
    const std::vector<RankStop> got2 = fit_on_ranks(4, only2, &sink2);
    const Checkpoint want2 = straight_state_after(9);
    for (int rank = 0; rank < 4; ++rank) {
      CAPTURE(rank);
      CHECK(got2[rank].result.stop_cause == FitResult::StopCause::Requested);
      CHECK(got2[rank].global_step == 9);
      expect_same_state(want2, got2[rank].state);
    }
    REQUIRE(!sink2.saves.empty());
    CHECK(sink2.saves.back().global_step == 9);
    expect_resume_reaches(sink2.saves.back().state, 4, end);
  }
}

TEST_CASE("a stop requested on one rank during validation ends every rank's validation at the same batch") {
  // Rank 1 is asked once step 6 (epoch 1's last) has ended: the request is first seen by
  // the agreement before the first validation batch, on every rank.
  const Checkpoint end = straight_to_the_end();
  std::vector<std::shared_ptr<RequestAt>> req = {nullptr, std::make_shared<RequestAt>(What::Stop, 6)};
  MemorySink sink;
  const std::vector<RankStop> got = fit_on_ranks(2, req, &sink);
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    CHECK(got[rank].result.stop_cause == FitResult::StopCause::Requested);
    CHECK(got[rank].global_step == 6);
    CHECK(got[rank].result.epochs_done == 0);  // the epoch ends on resume, validation included
  }
  expect_same_state(got[0].state, got[1].state);
  REQUIRE(sink.saves.size() == 1);
  CHECK(sink.saves[0].kind == CheckpointKind::MidEpoch);
  expect_resume_reaches(sink.saves[0].state, 2, end);
}

TEST_CASE("a checkpoint requested on one rank only: one checkpoint at one step, and training goes on") {
  const Checkpoint end = straight_to_the_end();
  std::vector<std::shared_ptr<RequestAt>> req = {nullptr, nullptr, nullptr, std::make_shared<RequestAt>(What::Checkpoint, 3)};
  MemorySink sink;
  const std::vector<RankStop> got = fit_on_ranks(4, req, &sink);
  for (int rank = 0; rank < 4; ++rank) {
    CAPTURE(rank);
    CHECK(got[rank].result.ending == FitResult::Ending::Completed);
    expect_same_state(end, got[rank].state);
  }
  std::vector<const MemorySink::Saved*> mid;
  for (const auto& s : sink.saves)
    if (s.kind == CheckpointKind::MidEpoch) mid.push_back(&s);
  REQUIRE(mid.size() == 1);
  CHECK(mid[0]->global_step == 4);
  expect_same_state(straight_state_after(4), mid[0]->state);
  expect_resume_reaches(mid[0]->state, 1, end);
}

TEST_CASE("the time limit is rank 0's: it stops every rank at one step, other ranks' limits decide nothing") {
  const Checkpoint end = straight_to_the_end();
  SUBCASE("rank 0's limit runs out (rank 0 is slowed down after each step)") {
    std::vector<std::shared_ptr<RequestAt>> slow0 = {std::make_shared<RequestAt>(What::Stop, -1, 0.12)};
    StopPlan limited;
    limited.time_limit_seconds = 1.0;
    MemorySink sink;
    const std::vector<RankStop> got = fit_on_ranks(2, slow0, &sink, {limited, StopPlan{}});
    const int64_t at = got[0].global_step;
    MESSAGE("rank 0's time limit stopped both ranks at global step " << at);
    CHECK(at > 0);
    CHECK(at < 18);
    for (int rank = 0; rank < 2; ++rank) {
      CAPTURE(rank);
      CHECK(got[rank].result.stop_cause == FitResult::StopCause::TimeLimit);
      CHECK(got[rank].global_step == at);
    }
    const Checkpoint want = straight_state_after(at);
    expect_same_state(want, got[1].state);
    REQUIRE(!sink.saves.empty());
    CHECK(sink.saves.back().global_step == at);
    expect_same_state(want, sink.saves.back().state);
    expect_resume_reaches(sink.saves.back().state, 2, end);
  }
  SUBCASE("a limit on rank 1 only, already past, stops nothing") {
    StopPlan past;
    past.time_limit_seconds = 0.001;
    past.time_limit_from = std::chrono::steady_clock::now() - std::chrono::seconds(10);
    const std::vector<RankStop> got = fit_on_ranks(2, {}, nullptr, {StopPlan{}, past});
    for (int rank = 0; rank < 2; ++rank) {
      CAPTURE(rank);
      CHECK(got[rank].result.ending == FitResult::Ending::Completed);
      expect_same_state(end, got[rank].state);
    }
  }
}

TEST_CASE("a save that fails on rank 0 stops every rank with a CheckpointWriteError, none left waiting") {
  // Rank 0's saves: 1 last.h5 and 2 best.h5 at the end of epoch 1 (step 6), 3 the
  // mid-epoch last.h5 of a checkpoint request on rank 1 (seen after step 9). The first
  // fails: every rank stops before epoch 2; the third: after step 10.
  for (int fail_on : {1, 3}) {
    CAPTURE(fail_on);
    std::vector<std::string> errors(4);
    std::vector<int64_t> steps(4);
    run_ranks(4, [&](int rank, Collective& comm) {
      RequestAt ask(What::Checkpoint, rank == 1 ? 8 : -1);
      auto t = make_trainer(Arch::Mlp, &comm, &ask);
      ask.attach(*t);
      MemorySink sink(fail_on);
      try {
        t->fit({}, rank == 0 ? &sink : nullptr);
      } catch (const CheckpointWriteError& e) {
        errors[rank] = e.what();
      }
      steps[rank] = t->global_step();
    });
    CHECK(errors[0].find("no space left on device") != std::string::npos);
    for (int rank = 1; rank < 4; ++rank) {
      CAPTURE(rank);
      CHECK(errors[rank].find("rank 0 could not save a checkpoint") != std::string::npos);
      CHECK(steps[rank] == steps[0]);
    }
    MESSAGE("save " << fail_on << " failed: every rank stopped after global step " << steps[0] << ": " << errors[1]);
  }
}

// ---- step digests compared between the ranks (docs/replay.md) -------------------------

namespace {

// Flips one bit of this rank's bn1.running_mean once global step `at` has ended: a
// replicated state that no exchange rewrites, as a memory fault would leave it.
class FlipBitAt : public TrainerObserver {
 public:
  explicit FlipBitAt(int64_t at) : at_(at) {}
  void attach(Trainer& t) { t_ = &t; }
  void on_step_end(int64_t step) override {
    if (step != at_ || !t_) return;
    Tensor mean = t_->model().state().tensors.at("bn1.running_mean");  // the live buffer
    uint32_t bits;
    std::memcpy(&bits, mean.f32() + 3, sizeof bits);
    bits ^= 1u << 9;
    std::memcpy(mean.f32() + 3, &bits, sizeof bits);
  }

 private:
  int64_t at_;
  Trainer* t_ = nullptr;
};

// Rank 0's step records and saves: what a run directory would keep.
class RecordingSink : public MemorySink {
 public:
  void record_step_digests(Trainer&, const std::vector<StepDigest>& steps) override {
    records.insert(records.end(), steps.begin(), steps.end());
  }
  std::vector<StepDigest> records;
};

}  // namespace

TEST_CASE("the ranks compare their replicas' step digests: one flipped bit stops every rank at the next step, "
          "naming the rank, with nothing of it saved; the resumed run ends with the straight run's bits") {
  // The CNN: 5 steps an epoch, 3 epochs; last.h5 at each epoch's end.
  auto straight = make_trainer(Arch::Cnn, nullptr);
  RecordingSink straight_sink;
  REQUIRE(straight->fit({}, &straight_sink).ending == FitResult::Ending::Completed);
  const Checkpoint end = straight->snapshot();
  REQUIRE(straight_sink.records.size() == 15);

  for (const int world : {3, 2}) {
    CAPTURE(world);
    const int odd = 1;  // the rank whose memory flips a bit after step 6
    RecordingSink sink;
    std::vector<std::string> errors(static_cast<std::size_t>(world));
    std::vector<int64_t> steps(static_cast<std::size_t>(world));
    run_ranks(world, [&](int rank, Collective& comm) {
      FlipBitAt flip(rank == odd ? 6 : -1);
      auto t = make_trainer(Arch::Cnn, &comm, &flip);
      flip.attach(*t);
      try {
        t->fit({}, rank == 0 ? &sink : nullptr);
      } catch (const ReplicaDivergence& e) {
        errors[rank] = e.what();
      }
      steps[rank] = t->global_step();
    });
    MESSAGE(errors[0]);  // what every rank says
    for (int rank = 0; rank < world; ++rank) {
      CAPTURE(rank);
      CHECK(steps[rank] == 7);
      const std::string want = world == 3 ? "differs on rank 1 (step digests)" : "differs on ranks 0, 1 (step digests)";
      CHECK(errors[rank].find(want) != std::string::npos);
      CHECK(errors[rank].find("at global step 7 (epoch 2 step 2)") != std::string::npos);
    }
    // The records rank 0 kept are the straight run's, to step 6; no save after step 6.
    REQUIRE(sink.records.size() == 6);
    for (std::size_t i = 0; i < 6; ++i) CHECK(sink.records[i].combined() == straight_sink.records[i].combined());
    REQUIRE(!sink.saves.empty());
    CHECK(sink.saves.back().global_step <= 6);
    // Relaunched from the last save: the straight run's end, bit for bit.
    std::vector<Checkpoint> got(static_cast<std::size_t>(world));
    run_ranks(world, [&](int rank, Collective& comm) {
      auto t = make_trainer(Arch::Cnn, &comm);
      REQUIRE(t->restore(sink.saves.back().state, LoadMode::Strict).clean());
      REQUIRE(t->fit().ending == FitResult::Ending::Completed);
      got[rank] = t->snapshot();
    });
    for (const Checkpoint& c : got) expect_same_state(end, c);
  }
}
