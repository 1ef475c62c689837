// Builds without NCCL (no CUDA, or no nccl.h at configure time; cmake/engine_nccl.cmake).
#include <stdexcept>

#include "engine/core/collective.h"

namespace engine {

bool nccl_built() { return false; }
std::string nccl_version() { return ""; }

std::unique_ptr<Collective> make_nccl_collective(std::unique_ptr<Collective>, int) {
  throw std::runtime_error("dist.backend=nccl: this engine was built without NCCL (it needs the CUDA backend "
                           "and nccl.h at configure time); use dist.backend=mpi");
}

}  // namespace engine
