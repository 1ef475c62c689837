// Replay (engine/run/replay.h): a trainer from a checkpoint's stored config, trained step
// by step to a chosen global step.
#include "engine/run/replay.h"

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "engine/train/config.h"
#include "engine/train/model_factory.h"

namespace engine {

std::unique_ptr<Trainer> replay_trainer(const Checkpoint& ckpt, const std::string& path, ReplayFrom from,
                                        const ReplayOptions& options) {
  const nlohmann::json j = nlohmann::json::parse(ckpt.config_json, nullptr, false);
  if (!j.is_object()) throw CheckpointError(path + ": the stored config is not valid JSON");
  Config cfg;
  try {
    cfg = config_from_json(j, path + " (stored config)");
  } catch (const std::exception& e) {
    throw CheckpointError(e.what());
  }
  if (!options.data_dir.empty()) cfg.data.dir = options.data_dir;
  // The replay records its steps' digests whatever the run did: they are what it checks.
  cfg.train.step_digests = true;
  TrainerOptions topts;
  topts.observer = options.observer;
  auto trainer = std::make_unique<Trainer>(cfg, options.device, make_model(cfg), std::move(topts));
  if (from == ReplayFrom::Checkpoint) {
    const StateReport r = trainer->restore(ckpt, LoadMode::Strict);
    if (!r.clean()) throw CheckpointError(path + ": its state does not load: " + r.summary());
  }
  return trainer;
}

int64_t last_step_of_run(Trainer& trainer) {
  const Config& cfg = trainer.config();
  const int64_t n = trainer.dataset().get(Split::Train).count, batch = cfg.data.batch_size;
  return cfg.train.epochs * ((n + batch - 1) / batch);
}

int64_t replay_to(Trainer& trainer, int64_t to, const std::function<bool(const StepDigest*)>& after_step) {
  if (to < trainer.global_step())
    throw std::invalid_argument("step " + std::to_string(to) + " is behind the replay's start (step " +
                                std::to_string(trainer.global_step()) + ")");
  const int64_t last = last_step_of_run(trainer);
  if (to > last)
    throw std::invalid_argument("step " + std::to_string(to) + " is beyond the run's last step (" +
                                std::to_string(last) + ": " + std::to_string(trainer.config().train.epochs) +
                                " epochs)");
  while (trainer.global_step() < to) {
    trainer.train_step();
    if (after_step && !after_step(trainer.last_step_digest() ? &*trainer.last_step_digest() : nullptr)) break;
  }
  return trainer.global_step();
}

}  // namespace engine
