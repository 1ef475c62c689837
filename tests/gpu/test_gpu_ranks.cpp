// CUDA ranks in the Trainer (docs/distributed.md "GPU ranks"): 2 ranks sharing one GPU,
// as threads of one process exchanging through the in-process collective (the host-
// staged exchange; NCCL refuses two ranks on one GPU), train the MLP and the CNN with
// the chunked CUDA ops and must end with the whole state of one process on that GPU,
// bit for bit. CUDA ranks are opt-in (ENGINE_CUDA_RANKS=1) until this has passed on a
// GPU (tools/gpu-check.sh, stage ranks). Exits 77 (skipped) where no GPU is present.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "cli_util.h"
#include "gpu/device_test_util.h"  // skips (exit 77) without a GPU
#include "engine/core/device.h"
#include "engine/nn/models/registry.h"
#include "engine/train/model_factory.h"
#include "engine/train/process_settings.h"
#include "engine/train/trainer.h"
#include "support/thread_collective.h"
#include "synthetic_data.h"

namespace {

using namespace engine;
using test_support::run_ranks;

enum class Arch { Mlp, Cnn };

Config ranks_config(Arch arch) {
  Config c;
  c.device = "cuda";
  c.seed = 5;
  c.model.name = arch == Arch::Mlp ? "mlp" : "fashion_cnn";
  c.model.dropout = 0.3;
  c.data.batch_size = arch == Arch::Mlp ? 16 : 48;  // ragged last batches below
  c.data.dir = test_util::data_dir();
  c.data.train_limit = 200;
  c.data.val_split = 50;
  c.data.test_limit = 60;
  c.train.epochs = 2;
  c.cuda.batch_chunks = true;
  c.cuda.deterministic = true;
  c.checkpoint.every_n_epochs = std::nullopt;
  return c;
}

std::unique_ptr<Trainer> make_trainer(Arch arch, Collective* comm) {
  const Config c = ranks_config(arch);
  const Device d = Device::cuda(0);
  TrainerOptions options;
  options.collective = comm;
  if (arch == Arch::Mlp) {
    options.data = std::make_unique<test_util::SyntheticDataset>(90, 30, 21, d);
    return std::make_unique<Trainer>(
        c, d, make_model_for(c.model, test_util::SyntheticDataset::kShape, test_util::SyntheticDataset::kClasses),
        std::move(options));
  }
  return std::make_unique<Trainer>(c, d, make_model(c), std::move(options));
}

struct Outcome {
  Checkpoint state;  // a deep copy on the host
  EvalResult test;
};

Outcome train(Trainer& t) {
  Outcome o;
  for (int i = 0; i < 40; ++i)
    if (t.train_step().epoch_end && t.epochs_done() == 2) break;
  o.test = t.evaluate(Split::Test);
  o.state = t.snapshot();
  for (auto& [group, d] : o.state.groups)
    for (auto& [key, tensor] : d.tensors) tensor = tensor.to(Device::cpu());
  return o;
}

void expect_same(const Outcome& want, const Outcome& got) {
  CHECK(got.test.loss == want.test.loss);
  CHECK(got.test.confusion == want.test.confusion);
  REQUIRE(got.state.groups.size() == want.state.groups.size());
  for (const auto& [group, sd] : want.state.groups) {
    CAPTURE(group);
    const StateDict& g = got.state.groups.at(group);
    for (const auto& [key, t] : sd.tensors) {
      CAPTURE(key);
      REQUIRE(g.tensors.count(key));
      const Tensor& u = g.tensors.at(key);
      REQUIRE(u.nbytes() == t.nbytes());
      CHECK(std::memcmp(u.raw(), t.raw(), t.nbytes()) == 0);
    }
  }
}

void check_two_ranks(Arch arch) {
  setenv("ENGINE_CUDA_RANKS", "1", 1);
  Config c = ranks_config(arch);
  apply_process_settings(c);  // cuda.batch_chunks and deterministic algorithms, process-wide
  auto one = make_trainer(arch, nullptr);
  const Outcome want = train(*one);
  std::vector<Outcome> got(2);
  run_ranks(2, [&](int rank, Collective& comm) {
    auto t = make_trainer(arch, &comm);
    got[rank] = train(*t);
  });
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    expect_same(want, got[rank]);
  }
}

}  // namespace

TEST_CASE("GPU ranks: the MLP on 2 ranks sharing one GPU ends with one process's state, bit for bit") {
  check_two_ranks(Arch::Mlp);
}

TEST_CASE("GPU ranks: the CNN (synchronised batch norm, dropout) on 2 ranks sharing one GPU, bit for bit") {
  if (!test_util::dataset_available()) {
    MESSAGE("no Fashion-MNIST at " << test_util::data_dir() << ": the CNN case is skipped");
    return;
  }
  check_two_ranks(Arch::Cnn);
}

TEST_CASE("GPU ranks stay refused without ENGINE_CUDA_RANKS=1") {
  unsetenv("ENGINE_CUDA_RANKS");
  std::vector<std::string> messages(2);
  run_ranks(2, [&](int rank, Collective& comm) {
    try {
      make_trainer(Arch::Mlp, &comm);
    } catch (const std::invalid_argument& e) {
      messages[rank] = e.what();
    }
  });
  for (const std::string& m : messages) CHECK(m.find("ENGINE_CUDA_RANKS=1") != std::string::npos);
}
