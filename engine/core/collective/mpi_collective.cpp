// The collective over MPI_COMM_WORLD (Open MPI): compiled only when CMake finds MPI
// (cmake/engine_mpi.cmake). MPI is initialised only when a launcher started this
// process (engine/core/collective/collective.cpp decides); a plain run makes no MPI call.
#include <mpi.h>

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/collective/mpi_entry.h"

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

using Clock = std::chrono::steady_clock;

// Exit status of a job the watchdog aborted (an ordinary error: docs/cli.md's 1).
constexpr int kExitWatchdog = 1;

class MpiCollective final : public Collective {
 public:
  explicit MpiCollective(const CollectiveOptions& options) : timeout_s_(options.timeout_s) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // The watchdog's roll call travels on its own communicator, so that it can never be
    // matched with the traffic of a collective in flight.
    check(MPI_Comm_dup(MPI_COMM_WORLD, &roll_call_), "MPI_Comm_dup");
    // The ranks that share this host's memory: all of them, or the job spans hosts (the
    // same answer on every rank).
    MPI_Comm local = MPI_COMM_NULL;
    check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local),
          "MPI_Comm_split_type");
    int local_size = 0;
    MPI_Comm_size(local, &local_size);
    // The world rank of the host's local rank 0 (the host's lowest rank: the split keeps
    // the world order), found without communicating: no collective runs on `local`.
    {
      MPI_Group local_group = MPI_GROUP_NULL, world_group = MPI_GROUP_NULL;
      MPI_Comm_group(local, &local_group);
      MPI_Comm_group(MPI_COMM_WORLD, &world_group);
      const int first_local = 0;
      check(MPI_Group_translate_ranks(local_group, 1, &first_local, world_group, &host_first_rank_),
            "MPI_Group_translate_ranks");
      MPI_Group_free(&local_group);
      MPI_Group_free(&world_group);
    }
    MPI_Comm_free(&local);
    one_host_ = local_size == size_;
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  bool one_host() const override { return one_host_; }
  int host_first_rank() const override { return host_first_rank_; }
  void allgather(const void* send, std::size_t bytes, void* recv) override {
    // Bytes as MPI_BYTE; pieces here are far below 2^31.
    if (bytes > static_cast<std::size_t>(1) << 30) throw std::runtime_error("MPI allgather: piece too large");
    MPI_Request req = MPI_REQUEST_NULL;
    check(MPI_Iallgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE,
                         MPI_COMM_WORLD, &req),
          "MPI_Iallgather");
    wait(req, "allgather", bytes);
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    if (bytes > static_cast<std::size_t>(1) << 30) throw std::runtime_error("MPI broadcast: piece too large");
    MPI_Request req = MPI_REQUEST_NULL;
    check(MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD, &req), "MPI_Ibcast");
    wait(req, "broadcast from rank " + std::to_string(root), bytes);
  }
  void alltoall(const void* send, std::size_t bytes, void* recv) override {
    if (bytes > static_cast<std::size_t>(1) << 30) throw std::runtime_error("MPI alltoall: piece too large");
    MPI_Request req = MPI_REQUEST_NULL;
    check(MPI_Ialltoall(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE,
                        MPI_COMM_WORLD, &req),
          "MPI_Ialltoall");
    wait(req, "alltoall", bytes);
  }
  [[noreturn]] void abort(int exit_code) override {
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; this is for the compiler
  }

 private:
  // Polls `req` until it completes; past the deadline, the roll call and the abort.
  // MPI_Test is called back to back (a blocking MPI call spins the same way, and large
  // messages only progress inside MPI calls): for 50 us without pause (a small exchange
  // completes in about 1 us), then yielding the core between tests; a wait that has
  // lasted over 10 ms (a rank saving a checkpoint, a slower rank) then sleeps between
  // tests, at most 1 ms, so it adds at most 1 ms to a wait of 10 ms or more.
  void wait(MPI_Request& req, const std::string& what, std::size_t bytes) {
    ++calls_;
    int done = 0;
    check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) return;
    const Clock::time_point start = Clock::now();
    const Clock::time_point deadline = start + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(timeout_s_));
    const std::chrono::microseconds spin_for(50), yield_for(10000);
    auto nap = std::chrono::microseconds(50);
    while (true) {
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      const Clock::time_point now = Clock::now();
      if (now >= deadline) time_out(what, bytes);
      if (now - start < spin_for) {
        continue;
      } else if (now - start < yield_for) {
        sched_yield();
      } else {
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, std::chrono::microseconds(1000));
      }
    }
  }

  // The deadline passed. Which ranks are gone cannot be seen from a collective in flight,
  // so every rank that times out sends a one-word "I am here" to every other rank and
  // listens for theirs for a grace period: a rank that is stopped, hung outside MPI or
  // dead does not answer. The lowest rank that is here prints the one line; every rank
  // that is here then aborts the job (MPI_Abort: mpirun ends every process).
  [[noreturn]] void time_out(const std::string& what, std::size_t bytes) {
    const int w = size_;
    std::vector<int64_t> mine(1, calls_), theirs(static_cast<std::size_t>(w), -1);
    std::vector<MPI_Request> sends(static_cast<std::size_t>(w), MPI_REQUEST_NULL),
        recvs(static_cast<std::size_t>(w), MPI_REQUEST_NULL);
    constexpr int kTag = 7177;
    for (int r = 0; r < w; ++r) {
      if (r == rank_) continue;
      MPI_Isend(mine.data(), 1, MPI_INT64_T, r, kTag, roll_call_, &sends[static_cast<std::size_t>(r)]);
      MPI_Irecv(&theirs[static_cast<std::size_t>(r)], 1, MPI_INT64_T, r, kTag, roll_call_,
                &recvs[static_cast<std::size_t>(r)]);
    }
    // Ranks blocked in the same (or the next) collective time out within about a step
    // of each other; 2 s covers that at this engine's step times.
    const double grace_s = std::min(2.0, timeout_s_);
    const Clock::time_point until =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_s));
    std::vector<bool> here(static_cast<std::size_t>(w), false);
    here[static_cast<std::size_t>(rank_)] = true;
    while (Clock::now() < until) {
      bool all = true;
      for (int r = 0; r < w; ++r) {
        if (here[static_cast<std::size_t>(r)]) continue;
        int got = 0;
        MPI_Test(&recvs[static_cast<std::size_t>(r)], &got, MPI_STATUS_IGNORE);
        if (got) here[static_cast<std::size_t>(r)] = true;
        else all = false;
      }
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::string missing;
    int lowest_here = rank_;
    for (int r = 0; r < w; ++r) {
      if (!here[static_cast<std::size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      else lowest_here = std::min(lowest_here, r);
    }
    if (lowest_here == rank_) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%g", timeout_s_);
      const std::string who =
          missing.empty()
              ? "every rank answered the roll call afterwards, so the ranks are out of step (a bug: please report it)"
              : std::string(missing.find(',') == std::string::npos ? "rank " : "ranks ") + missing +
                    " did not answer (stopped, hung or dead)";
      std::fprintf(stderr, "engine: rank %d: watchdog: %s of %zu bytes (collective call %lld) did not complete within %s s "
                   "(dist.timeout_s); %s; aborting the job\n",
                   rank_, what.c_str(), bytes, static_cast<long long>(calls_), secs, who.c_str());
      std::fflush(stderr);
    } else {
      // Let the lowest rank here print its line before the job goes.
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    abort(kExitWatchdog);
  }

  int rank_ = 0, size_ = 1;
  double timeout_s_;
  int64_t calls_ = 0;  // collective calls made: the same count on every rank in step
  bool one_host_ = true;
  int host_first_rank_ = 0;
  MPI_Comm roll_call_ = MPI_COMM_NULL;
};

}  // namespace

std::unique_ptr<Collective> make_mpi_collective(const LaunchInfo& launch, const CollectiveOptions& options) {
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
  auto c = std::make_unique<MpiCollective>(options);
  if (c->size() != launch.size || c->rank() != launch.rank)
    throw std::runtime_error("MPI reports rank " + std::to_string(c->rank()) + " of " + std::to_string(c->size()) +
                             ", the launcher's environment rank " + std::to_string(launch.rank) + " of " +
                             std::to_string(launch.size));
  return c;
}

}  // namespace dist
}  // namespace engine
