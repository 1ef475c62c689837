// The runs that test_recovery and test_replicas start from: a small Fashion-MNIST run
// stopped after 3 epochs, driven through the CLI, and a run of the synthetic data set
// driven through the library.
#pragma once
#include <doctest/doctest.h>

#include <cerrno>  // program_invocation_short_name (glibc)
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "cli_util.h"
#include "engine/io/checkpoint.h"
#include "engine/io/env.h"
#include "engine/nn/models/registry.h"
#include "engine/train/trainer.h"
#include "synthetic_data.h"

namespace test_util {

inline bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// A run directory holding the state after 3 of the reference's 4 epochs (last.h5 and
// best.h5 at global step 48, epoch_0002.h5 at step 32), made once per process (named
// after the test executable: test executables run in parallel).
inline const std::string& three_epochs() {
  static const std::string dir = [] {
    const std::string d = fresh_dir(std::string(program_invocation_short_name) + "_three_epochs");
    const RunResult r = run(small_run(d) + " --stop-after-epochs 3");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return d;
  }();
  return dir;
}

// A copy of three_epochs()'s run files in a fresh directory.
inline std::string copy_of_three_epochs(const std::string& name) {
  const std::string d = fresh_dir(name);
  for (const char* f : {"last.h5", "best.h5", "epoch_0002.h5", "metrics.jsonl"})
    std::filesystem::copy_file(three_epochs() + "/" + f, d + "/" + f);
  return d;
}

inline int64_t global_step_of(const std::string& path) {
  return engine::load_checkpoint(path).groups.at("trainer").get_int("global_step");
}

inline std::string replicas_flag(const std::string& dir) {
  return " --set 'checkpoint.replicas=[\"" + dir + "\"]'";
}

// ---- the library, on the synthetic data set -------------------------------------------

inline engine::Config synthetic(const std::string& dir, int64_t epochs) {
  engine::Config c = synthetic_mlp_config();
  c.train.epochs = epochs;
  c.checkpoint.dir = dir;
  c.logging.tensorboard = false;
  return c;
}

inline std::unique_ptr<engine::Model> synthetic_model(const engine::Config& c) {
  return engine::make_model_for(c.model, SyntheticDataset::kShape, SyntheticDataset::kClasses);
}

inline std::unique_ptr<engine::Trainer> synthetic_trainer(const engine::Config& c,
                                                          engine::TrainerObserver* observer = nullptr,
                                                          engine::Env* env = nullptr) {
  engine::TrainerOptions options;
  options.observer = observer;
  options.data = std::make_unique<SyntheticDataset>();
  options.env = env;
  return std::make_unique<engine::Trainer>(c, engine::Device::cpu(), synthetic_model(c), std::move(options));
}

}  // namespace test_util
