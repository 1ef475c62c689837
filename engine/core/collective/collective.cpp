#include "engine/core/collective.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "core/collective/mpi_entry.h"

namespace engine {

std::vector<int64_t> Collective::agree_max(const std::vector<int64_t>& local) {
  const int w = size();
  std::vector<int64_t> all(local.size() * static_cast<std::size_t>(w));
  allgather(local.data(), local.size() * sizeof(int64_t), all.data());
  std::vector<int64_t> out = local;
  for (int r = 0; r < w; ++r)
    for (std::size_t i = 0; i < local.size(); ++i) out[i] = std::max(out[i], all[r * local.size() + i]);
  return out;
}

void Collective::alltoall(const void* send, std::size_t bytes, void* recv) {
  const std::size_t w = static_cast<std::size_t>(size()), me = static_cast<std::size_t>(rank());
  std::vector<unsigned char> all(w * w * bytes);
  allgather(send, w * bytes, all.data());
  for (std::size_t r = 0; r < w; ++r)
    if (bytes) std::memcpy(static_cast<unsigned char*>(recv) + r * bytes, all.data() + (r * w + me) * bytes, bytes);
}

void Collective::abort(int exit_code) { std::exit(exit_code); }

void SingleProcessCollective::allgather(const void* send, std::size_t bytes, void* recv) {
  if (bytes) std::memmove(recv, send, bytes);
}

namespace {
// A non-negative integer environment variable, or -1 when unset or not a number.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > (1 << 24)) return -1;
  return static_cast<int>(x);
}
}  // namespace

LaunchInfo detect_launch() {
  LaunchInfo l;
  struct Source {
    const char *launcher, *rank, *size, *local_rank;
  };
  // Open MPI's mpirun first (it may itself run under Slurm), then srun, then PMI(x).
  const Source sources[] = {
      {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
      {"pmi", "PMIX_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
      {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
  };
  for (const Source& s : sources) {
    const int rank = env_int(s.rank), size = env_int(s.size);
    if (rank < 0 || size < 1 || rank >= size) continue;
    // srun sets SLURM_PROCID for every job step; only a step it launched has SLURM_STEP_ID.
    if (std::string(s.launcher) == "srun" && !std::getenv("SLURM_STEP_ID")) continue;
    l.launched = true;
    l.launcher = s.launcher;
    l.rank = rank;
    l.size = size;
    l.local_rank = std::max(0, env_int(s.local_rank));
    return l;
  }
  return l;
}

std::unique_ptr<Collective> make_process_collective(const LaunchInfo& launch, const CollectiveOptions& options) {
  if (!launch.launched) return std::make_unique<SingleProcessCollective>();
  if (!mpi_built()) {
    if (launch.size == 1) return std::make_unique<SingleProcessCollective>();
    throw std::runtime_error("started by " + launch.launcher + " as rank " + std::to_string(launch.rank) +
                             " of " + std::to_string(launch.size) +
                             ", but this engine was built without MPI (install libopenmpi-dev and "
                             "reconfigure)");
  }
  if (!(options.timeout_s > 0)) throw std::invalid_argument("dist.timeout_s must be > 0 seconds");
  return dist::make_mpi_collective(launch, options);
}

}  // namespace engine
