#include "engine/train/dist_backend.h"

#include <stdexcept>
#include <string>

namespace engine {

DistBackend resolve_dist_backend(DistBackend requested, Device device, int world_size, bool nccl_in_build) {
  switch (requested) {
    case DistBackend::Mpi:
      return DistBackend::Mpi;
    case DistBackend::Nccl:
      if (!device.is_cuda())
        throw std::invalid_argument("dist.backend=nccl needs CUDA ranks, this run is on " + device.str() +
                                    " (use dist.backend=mpi or auto)");
      if (!nccl_in_build)
        throw std::invalid_argument("dist.backend=nccl: this engine was built without NCCL (use dist.backend=mpi "
                                    "or auto)");
      return DistBackend::Nccl;
    case DistBackend::Auto:
      break;
  }
  return device.is_cuda() && world_size > 1 && nccl_in_build ? DistBackend::Nccl : DistBackend::Mpi;
}

std::unique_ptr<Collective> make_run_collective(DistBackend requested, Device device, const LaunchInfo& launch,
                                                const CollectiveOptions& options) {
  std::unique_ptr<Collective> process = make_process_collective(launch, options);
  if (resolve_dist_backend(requested, device, process->size(), nccl_built()) != DistBackend::Nccl) return process;
  return make_nccl_collective(std::move(process), launch.local_rank);
}

}  // namespace engine
