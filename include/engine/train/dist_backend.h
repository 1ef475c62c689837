// dist.backend (include/engine/train/config.h) resolved for a run: which collective carries
// the exchanges of data-parallel training (docs/distributed.md, "GPU ranks").
#pragma once
#include <memory>

#include "engine/core/collective.h"
#include "engine/train/config.h"
#include "engine/core/device.h"

namespace engine {

// Mpi: the launcher's collective (MPI, or the single-process one), whose device
// exchanges stage through host memory. Nccl: NCCL for the device exchanges.
// Auto gives Nccl for CUDA ranks (world size > 1) when this build has NCCL, Mpi
// otherwise (one process exchanges nothing: no NCCL needed). Throws
// std::invalid_argument naming dist.backend for Nccl on a CPU device or in a build
// without NCCL.
DistBackend resolve_dist_backend(DistBackend requested, Device device, int world_size, bool nccl_in_build);

// This process's collective: make_process_collective(launch, options), wrapped in an NCCL
// communicator (make_nccl_collective, GPU = launch.local_rank) when the backend
// resolves to Nccl. Call before any CUDA work (NCCL picks this rank's GPU).
std::unique_ptr<Collective> make_run_collective(DistBackend requested, Device device, const LaunchInfo& launch,
                                                const CollectiveOptions& options = {});

}  // namespace engine
