// The NCCL collective (docs/distributed.md, "GPU ranks"): device exchanges with
// ncclAllGather / ncclBroadcast on the compute stream, host exchanges through the
// bootstrap collective (MPI, or the single-process one for a 1-rank communicator).
//
// libnccl.so.2 is opened with dlopen on first use, never linked: the library is ~200 MB
// (the GPU pack cannot carry it) and a binary without NCCL installed still runs
// everything else. nccl.h gives the types and, through decltype, the exact signatures.
// ENGINE_NCCL_LIBRARY, when set, names the file to open instead of libnccl.so.2.
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/collective/nccl_bootstrap.h"
#include "engine/core/collective.h"
#include "kernels/cuda_runtime.h"
#include "kernels/shared_library.h"

namespace engine {

static_assert(sizeof(ncclUniqueId) == dist::kNcclIdBytes, "dist::NcclId must hold an ncclUniqueId");

namespace {

struct NcclLibrary {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
};

std::string library_name() {
  const char* env = std::getenv("ENGINE_NCCL_LIBRARY");
  return env && *env ? env : "libnccl.so.2";
}

// Opens the library and resolves every symbol, or throws with what to do. The handle
// is never closed: communicators may be destroyed as late as exit.
NcclLibrary open_library() {
  const std::string name = library_name();
  std::string why;
  void* handle = kernels::open_shared_library({name}, why);
  if (!handle)
    throw std::runtime_error("dist.backend=nccl: cannot load the NCCL library " + name + " (" + why +
                             "); put its folder on LD_LIBRARY_PATH (PyTorch's pip wheel has it under "
                             "site-packages/nvidia/nccl/lib), set ENGINE_NCCL_LIBRARY to the file, or use "
                             "dist.backend=mpi");
  const std::string missing = "dist.backend=nccl: " + name + " (NCCL 2.x expected) has no symbol ";
  NcclLibrary lib;
  kernels::resolve_symbol(handle, "ncclGetVersion", lib.get_version, missing);
  kernels::resolve_symbol(handle, "ncclGetUniqueId", lib.get_unique_id, missing);
  kernels::resolve_symbol(handle, "ncclCommInitRank", lib.comm_init_rank, missing);
  kernels::resolve_symbol(handle, "ncclCommDestroy", lib.comm_destroy, missing);
  kernels::resolve_symbol(handle, "ncclGetErrorString", lib.get_error_string, missing);
  kernels::resolve_symbol(handle, "ncclAllGather", lib.all_gather, missing);
  kernels::resolve_symbol(handle, "ncclBroadcast", lib.broadcast, missing);
  return lib;
}

// The process's library, loaded once; a failed load is retried (and reported) each time.
const NcclLibrary& library() { return kernels::load_once(open_library); }

std::string version_string(int code) {
  // NCCL_VERSION(X, Y, Z) is X * 10000 + Y * 100 + Z since 2.9 (X * 1000 + Y * 100 + Z before).
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(std::unique_ptr<Collective> bootstrap, int local_rank)
      : bootstrap_(std::move(bootstrap)), lib_(library()) {
    const int rank = bootstrap_->rank();
    // Before any other CUDA work of this process: the context binds to this device.
    kernels::cuda::set_device(dist::nccl_device_for(rank, local_rank, kernels::cuda::device_count()));
    const dist::NcclId id = dist::agree_nccl_id(*bootstrap_, [&] {
      ncclUniqueId u;
      check(lib_.get_unique_id(&u), "ncclGetUniqueId");
      dist::NcclId out;
      std::memcpy(out.data(), &u, sizeof u);
      return out;
    });
    ncclUniqueId u;
    std::memcpy(&u, id.data(), sizeof u);
    check(lib_.comm_init_rank(&comm_, bootstrap_->size(), u, rank), "ncclCommInitRank");
  }
  ~NcclCollective() override {
    if (comm_) (void)lib_.comm_destroy(comm_);  // errors at exit are of no use to anyone
  }

  int rank() const override { return bootstrap_->rank(); }
  int size() const override { return bootstrap_->size(); }
  std::string name() const override { return "nccl over " + bootstrap_->name(); }
  void allgather(const void* send, std::size_t bytes, void* recv) override { bootstrap_->allgather(send, bytes, recv); }
  void broadcast(void* data, std::size_t bytes, int root) override { bootstrap_->broadcast(data, bytes, root); }
  void alltoall(const void* send, std::size_t bytes, void* recv) override { bootstrap_->alltoall(send, bytes, recv); }
  bool one_host() const override { return bootstrap_->one_host(); }
  int host_first_rank() const override { return bootstrap_->host_first_rank(); }
  // The bootstrap (MPI) ends the job; NCCL's communicator dies with the processes.
  [[noreturn]] void abort(int exit_code) override {
    bootstrap_->abort(exit_code);
    std::_Exit(exit_code);  // not reached: the bootstrap's abort does not return
  }

  // Queued on the compute stream: kernels queued later see the result, a copy to the
  // host waits for it.
  void allgather_device(const void* send, std::size_t bytes, void* recv) override {
    if (bytes == 0) return;
    check(lib_.all_gather(send, recv, bytes, ncclUint8, comm_, stream()), "ncclAllGather");
  }
  void broadcast_device(void* data, std::size_t bytes, int root) override {
    if (bytes == 0) return;
    check(lib_.broadcast(data, data, bytes, ncclUint8, root, comm_, stream()), "ncclBroadcast");
  }

 private:
  static cudaStream_t stream() { return static_cast<cudaStream_t>(kernels::cuda::compute_stream()); }
  void check(ncclResult_t r, const char* call) const {
    if (r == ncclSuccess) return;
    throw std::runtime_error("rank " + std::to_string(bootstrap_->rank()) + ": " + call + " failed: " +
                             lib_.get_error_string(r));
  }

  std::unique_ptr<Collective> bootstrap_;
  const NcclLibrary& lib_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

bool nccl_built() { return true; }

std::string nccl_version() {
  try {
    int code = 0;
    if (library().get_version(&code) != ncclSuccess) return "";
    return version_string(code) + " (headers " + version_string(NCCL_VERSION_CODE) + ")";
  } catch (const std::runtime_error&) {
    return "";  // not loadable here: `engine --version` says "not found"
  }
}

std::unique_ptr<Collective> make_nccl_collective(std::unique_ptr<Collective> bootstrap, int local_rank) {
  if (!bootstrap) throw std::invalid_argument("make_nccl_collective: no bootstrap collective");
  return std::make_unique<NcclCollective>(std::move(bootstrap), local_rank);
}

}  // namespace engine
