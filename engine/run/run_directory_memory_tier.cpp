// The run directory's memory tier (engine/run/run_directory.h, keep_memory_tier): the
// state after every step, copied into the run's slot file (engine/io/memory_tier.h).
#include "run/run_directory_impl.h"

namespace engine {

void RunDirectory::keep_memory_tier(const std::string& dir) {
  Impl& m = *impl_;
  try {
    m.memory_tier = std::make_unique<memory_tier::Writer>(dir, m.dir);
  } catch (const std::exception& e) {
    m.trainer.observer().on_message(std::string("warning: memory tier not kept: ") + e.what() +
                                    "; training goes on with the disk tiers");
  }
}

std::string RunDirectory::memory_tier_file() const {
  return impl_->memory_tier ? impl_->memory_tier->path() : std::string();
}

void RunDirectory::keep_step(Trainer& trainer) {
  Impl& m = *impl_;
  if (!m.memory_tier) return;
  try {
    // The live tensors themselves (snapshot() aliases them): one copy, into the slot.
    m.memory_tier->write(trainer.snapshot(), trainer.global_step());
  } catch (const std::exception& e) {
    m.trainer.observer().on_message(std::string("warning: memory tier no longer kept: ") + e.what() +
                                    "; training goes on with the disk tiers");
    m.memory_tier->remove();
    m.memory_tier.reset();
  }
}

}  // namespace engine
