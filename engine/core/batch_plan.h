// Private to the op facade: how the batch-reducing ops find their batch plan and cut it.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "core/tensor_ops.h"
#include "kernels/cuda/settings.h"

namespace engine::tt::detail {

// The plan of the n samples a layer was given: the trainer's, or the whole batch in one
// process (the run's chunks: one block) made in `own`.
inline const BatchChunks& plan_for(const BatchCompute& how, int64_t n, std::optional<BatchChunks>& own) {
  if (!how.plan) return own.emplace(n);
  if (how.plan->local_count() != n)
    throw std::logic_error(how.layer + ": given " + std::to_string(n) + " samples, the batch plan gives this rank " +
                           std::to_string(how.plan->local_count()));
  return *how.plan;
}

// Whether an op on `d` computes by chunks: always on the CPU; on CUDA when a batch plan
// is given and cuda.batch_chunks is on (docs/distributed.md, "GPU ranks"). Otherwise
// the CUDA whole-batch ops, which need one process.
inline bool by_chunks(const BatchCompute& how, Device d) {
  if (d.is_cpu()) return true;
  if (how.plan && kernels::cuda::batch_chunks()) return true;
  if (how.plan && how.plan->distributed())
    throw std::invalid_argument(how.layer + ": cuda.batch_chunks=false computes whole batches, which needs one "
                                "process; this run has " + std::to_string(how.plan->world_size()) +
                                " ranks (set cuda.batch_chunks=true)");
  return false;
}

// The tensor's values readable on the host: itself on the CPU, a copy from a GPU.
inline Tensor on_host(const Tensor& t) { return t.device().is_cpu() ? t : t.to(Device::cpu()); }
// Writes host values back to `dst`, unless they are dst's own storage (on the CPU).
inline void store(Tensor& dst, const Tensor& host) {
  if (dst.device().is_cuda()) dst.copy_from(host);
}

}  // namespace engine::tt::detail
