#include "core/collective/nccl_bootstrap.h"

#include <stdexcept>
#include <string>

namespace engine::dist {

NcclId agree_nccl_id(Collective& bootstrap, const std::function<NcclId()>& make_id) {
  NcclId id{};
  if (bootstrap.rank() == 0) id = make_id();
  bootstrap.broadcast(id.data(), id.size(), 0);
  return id;
}

int nccl_device_for(int rank, int local_rank, int device_count) {
  if (device_count <= 0)
    throw std::runtime_error("rank " + std::to_string(rank) + ": dist.backend=nccl needs a GPU, and this machine "
                             "has none");
  if (local_rank < 0 || local_rank >= device_count)
    throw std::runtime_error("rank " + std::to_string(rank) + " is local rank " + std::to_string(local_rank) +
                             " on its machine, which has " + std::to_string(device_count) +
                             " GPU(s): NCCL needs one GPU per rank, so start at most " +
                             std::to_string(device_count) + " ranks per machine (or use dist.backend=mpi)");
  return local_rank;
}

}  // namespace engine::dist
