// fit() into the trainer's run directory (cfg.checkpoint.dir), as `engine train` runs it:
// for tests that train through fit() and look at the files.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli_util.h"
#include "engine/io/checkpoint.h"
#include "engine/train/config.h"
#include "engine/train/model_factory.h"
#include "engine/run/run_directory.h"
#include "engine/train/trainer.h"

namespace test_util {

// A short run of the default model on `device` ("cpu", "cuda"): `train_limit` training
// images, 256 validation images (from the end of the training file), 256 test images, batches of 64, `epochs`
// epochs, no milestones; its run directory is `run_dir`.
inline engine::Config small_run_config(const std::string& device, const std::string& run_dir,
                                       int64_t train_limit = 512, int64_t epochs = 2) {
  engine::Config c;
  c.device = device;
  c.data.dir = data_dir();
  c.data.train_limit = train_limit;
  c.data.val_split = 256;
  c.data.test_limit = 256;
  c.data.batch_size = 64;
  c.train.epochs = epochs;
  c.checkpoint.dir = run_dir;
  c.checkpoint.every_n_epochs = std::nullopt;
  return c;
}

inline engine::FitResult fit_in_run_dir(engine::Trainer& trainer, const engine::StopPlan& stop = {}) {
  engine::RunDirectory run(trainer);
  return run.fit(stop);
}

// With checkpoint.async a run prints an epoch's line while that epoch's checkpoints may
// still be on the writer thread: waits (up to 60 s) until `path` loads and holds at least
// `min_global_step` steps. True when it does.
inline bool wait_for_checkpoint(const std::string& path, int64_t min_global_step) {
  for (int i = 0; i < 600; ++i) {
    try {
      if (engine::load_checkpoint(path).groups.at("trainer").get_int("global_step") >= min_global_step) return true;
    } catch (const std::exception&) {
    }
    ::usleep(100000);
  }
  return false;
}

// Trains `cfg` on `device` through fit() in its run directory and keeps a copy of every
// checkpoint as the observer hears of it (on the training thread, before the next save
// is handed to the writer), in `keep_dir`, numbered in order: NNN-last.h5, NNN-best.h5...
// For comparing runs save by save (checkpoint.async on against off).
inline std::vector<std::string> keep_every_checkpoint(const engine::Config& cfg, engine::Device device,
                                                      const std::string& keep_dir) {
  namespace fs = std::filesystem;
  class KeepEach : public engine::TrainerObserver {
   public:
    explicit KeepEach(std::string dir) : dir_(std::move(dir)) { fs::create_directories(dir_); }
    void on_checkpoint(const std::string& path, engine::CheckpointKind) override {
      kept.push_back(dir_ + "/" + std::to_string(kept.size()) + "-" + fs::path(path).filename().string());
      fs::copy_file(path, kept.back());
    }
    std::vector<std::string> kept;

   private:
    std::string dir_;
  } keep(keep_dir);
  engine::TrainerOptions options;
  options.observer = &keep;
  engine::Trainer t(cfg, device, engine::make_model(cfg), std::move(options));
  if (fit_in_run_dir(t).ending != engine::FitResult::Ending::Completed)
    throw std::runtime_error("keep_every_checkpoint: the run in " + cfg.checkpoint.dir + " did not complete");
  return keep.kept;
}

}  // namespace test_util
