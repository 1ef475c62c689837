// The default device exchanges of Collective (include/engine/core/collective.h): through host
// memory and the host exchanges, so any collective (MPI, single, a test's) serves CUDA
// ranks. The NCCL collective overrides both.
#include <cstddef>
#include <vector>

#include "engine/core/collective.h"
#include "kernels/cuda_runtime.h"

namespace engine {

void Collective::allgather_device(const void* send, std::size_t bytes, void* recv) {
  const std::size_t w = static_cast<std::size_t>(size());
  std::vector<unsigned char> host_send(bytes), host_recv(bytes * w);
  kernels::cuda::copy(host_send.data(), send, bytes, kernels::cuda::CopyKind::DeviceToHost);
  allgather(host_send.data(), bytes, host_recv.data());
  kernels::cuda::copy(recv, host_recv.data(), bytes * w, kernels::cuda::CopyKind::HostToDevice);
}

void Collective::broadcast_device(void* data, std::size_t bytes, int root) {
  std::vector<unsigned char> host(bytes);
  kernels::cuda::copy(host.data(), data, bytes, kernels::cuda::CopyKind::DeviceToHost);
  broadcast(host.data(), bytes, root);
  kernels::cuda::copy(data, host.data(), bytes, kernels::cuda::CopyKind::HostToDevice);
}

}  // namespace engine
