// The exchanges of data-parallel training between the ranks of one job
// (docs/distributed.md). No MPI or NCCL header here: the MPI implementation lives in
// engine/core/collective/mpi_collective.cpp, compiled when CMake finds MPI.
//
// Every cross-rank sum in the engine is a gather followed by an ordered sum that each
// rank computes itself (kernels/chunk_tree.h), never a library reduction whose order
// the library picks: so the interface has gathers and broadcasts, not reductions.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace engine {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "single", "mpi", or a test's own name: for messages.
  virtual std::string name() const = 0;
  // Every rank gives `bytes` bytes at `send`; `recv` (size() * bytes) receives rank r's
  // at offset r * bytes, on every rank. `send` may not overlap `recv`.
  virtual void allgather(const void* send, std::size_t bytes, void* recv) = 0;
  // The `bytes` bytes at `data` on rank `root` copied into `data` on every rank.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  // Every rank gives size() pieces of `bytes` bytes at `send`, piece s (at s * bytes)
  // for rank s; `recv` (size() * bytes) receives every rank's piece for this rank, rank
  // r's at r * bytes. What a reduce-scatter moves, with the sum left to the receiver
  // (ParameterShards). This default goes through allgather (size() times the bytes);
  // the MPI collective sends each piece once (MPI_Alltoall).
  virtual void alltoall(const void* send, std::size_t bytes, void* recv);

  // Ends the whole job at once, every rank with `exit_code` (never returns): what a rank
  // that fails alone calls, so that the others do not wait for it in a collective. The
  // MPI collective calls MPI_Abort; the default ends this process only (std::exit).
  [[noreturn]] virtual void abort(int exit_code);
  // The same two on GPU memory (CUDA ranks; docs/distributed.md, "GPU ranks"). These
  // defaults stage through host memory and the host exchanges above (so dist.backend=mpi
  // works with CUDA ranks); the NCCL collective exchanges on the device, ordered on the
  // compute stream.
  virtual void allgather_device(const void* send, std::size_t bytes, void* recv);
  virtual void broadcast_device(void* data, std::size_t bytes, int root);

  // Whether every rank runs on this host, so that a small exchange costs microseconds
  // rather than a network round trip: the CPU batch norm then takes its channels in
  // cache-sized groups, one small exchange each (engine/core/batchnorm_ops.cpp). The same
  // answer on every rank. This default (one process, the tests' collectives) says yes.
  virtual bool one_host() const { return true; }
  // The lowest rank on this rank's host (0 when every rank shares one host, as in this
  // default): which ranks share a disk, for checkpoint.peer_replica.
  virtual int host_first_rank() const { return 0; }

  // Agreement on a small vector (stop flags, a step number): every rank gets the
  // element-wise maximum of all ranks' `local` (which must have the same length on
  // every rank). Built on allgather: the same answer on every rank.
  std::vector<int64_t> agree_max(const std::vector<int64_t>& local);
};

// One process, no exchange: rank 0 of 1. Makes no MPI call.
class SingleProcessCollective final : public Collective {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single"; }
  void allgather(const void* send, std::size_t bytes, void* recv) override;
  void broadcast(void*, std::size_t, int) override {}
  void alltoall(const void* send, std::size_t bytes, void* recv) override { allgather(send, bytes, recv); }
};

// How a collective behaves when the ranks do not all answer (docs/distributed.md "Faults").
struct CollectiveOptions {
  // Watchdog: a collective not complete after this many seconds (config dist.timeout_s)
  // means a rank has died, stopped or hung: this rank prints one line naming the
  // operation and the ranks that did not answer, then aborts the job. Must be > 0.
  double timeout_s = 300;
};

// How this process was started, from the launcher's environment variables (Open MPI's
// mpirun: OMPI_COMM_WORLD_*; Slurm's srun: SLURM_PROCID/SLURM_NTASKS; PMI/PMIx).
struct LaunchInfo {
  bool launched = false;  // started by mpirun or srun
  std::string launcher;   // "mpirun", "srun", "pmi" or ""
  int rank = 0, size = 1, local_rank = 0;
};
LaunchInfo detect_launch();

// Whether this build has the MPI collective, and the MPI library's version string
// ("" without MPI).
bool mpi_built();
std::string mpi_library_version();

// This process's collective: MPI (initialised here) when started by a launcher and the
// build has MPI, the single-process one otherwise (no MPI call at all). Throws
// std::runtime_error when a launcher started several ranks and the build has no MPI.
std::unique_ptr<Collective> make_process_collective(const LaunchInfo& launch,
                                                    const CollectiveOptions& options = {});

// NCCL (engine/core/collective/nccl_collective.cpp): whether this build has the NCCL collective
// (CUDA and nccl.h found at configure time), and the version of the libnccl.so.2 that
// loads at run time ("" when none loads: the library is opened with dlopen on first use,
// so a binary without NCCL installed still runs everything else).
bool nccl_built();
std::string nccl_version();
// A collective whose device exchanges go through NCCL, over the ranks of `bootstrap`
// (which it takes over; its host exchanges are the bootstrap's). Rank 0 creates the NCCL
// id, the bootstrap broadcasts it; this rank uses GPU `local_rank`. Throws
// std::runtime_error with a message (no NCCL in this build, libnccl.so.2 not loadable,
// local rank >= GPU count, an NCCL error).
std::unique_ptr<Collective> make_nccl_collective(std::unique_ptr<Collective> bootstrap, int local_rank);

}  // namespace engine
