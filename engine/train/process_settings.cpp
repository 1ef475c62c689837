#include "engine/train/process_settings.h"

#include "kernels/cuda/settings.h"

namespace engine {

void apply_process_settings(const Config& cfg) {
  kernels::cuda::set_deterministic(cfg.cuda.deterministic);
  kernels::cuda::set_batch_chunks(cfg.cuda.batch_chunks);
}

}  // namespace engine
