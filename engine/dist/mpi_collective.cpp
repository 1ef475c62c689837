// The collective over MPI_COMM_WORLD (Open MPI): compiled only when CMake finds MPI
// (cmake/engine_mpi.cmake). MPI is initialised only when a launcher started this
// process (engine/dist/collective.cpp decides); a plain run makes no MPI call.
#include <mpi.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>

#include "dist/mpi_entry.h"

namespace engine {

bool mpi_built() { return true; }

std::string mpi_library_version() {
  char v[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(v, &len);  // callable before MPI_Init
  std::string s(v, static_cast<std::size_t>(len));
  const auto nl = s.find_first_of(",\n");
  return nl == std::string::npos ? s : s.substr(0, nl);
}

namespace dist {
namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string(what) + " failed: " + std::string(msg, static_cast<std::size_t>(len)));
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

class MpiCollective final : public Collective {
 public:
  MpiCollective() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  void allgather(const void* send, std::size_t bytes, void* recv) override {
    // Bytes as MPI_BYTE; pieces here are far below 2^31.
    if (bytes > static_cast<std::size_t>(1) << 30) throw std::runtime_error("MPI allgather: piece too large");
    check(MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE,
                        MPI_COMM_WORLD),
          "MPI_Allgather");
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    if (bytes > static_cast<std::size_t>(1) << 30) throw std::runtime_error("MPI broadcast: piece too large");
    check(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  }

 private:
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Collective> make_mpi_collective(const LaunchInfo& launch) {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
      std::atexit(finalize_at_exit);
    }
    // Errors come back as codes (turned into exceptions with a message) instead of
    // aborting the job without one.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  });
  auto c = std::make_unique<MpiCollective>();
  if (c->size() != launch.size || c->rank() != launch.rank)
    throw std::runtime_error("MPI reports rank " + std::to_string(c->rank()) + " of " + std::to_string(c->size()) +
                             ", the launcher's environment rank " + std::to_string(launch.rank) + " of " +
                             std::to_string(launch.size));
  return c;
}

}  // namespace dist
}  // namespace engine
