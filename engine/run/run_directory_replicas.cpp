// The run directory's replicas (checkpoint.replicas, docs/recovery.md): each saved file
// written again to every second-tier directory, on the replica thread while the writer
// is idle, and their failures reported once per kind on the training thread.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine/run/run_files.h"
#include "io/atomic_file.h"
#include "io/deferred_remove.h"
#include "run/run_directory_impl.h"

namespace engine {

namespace fs = std::filesystem;
using namespace run_directory_internal;

namespace {

// The replica thread is a background tier: it takes the CPU and the disk only when
// training and the run directory's writer leave them (lowest CPU priority; the idle I/O
// class, where the I/O scheduler has one). Linux; a hint elsewhere ignored.
void yield_to_training() {
#if defined(__linux__)
  const pid_t tid = static_cast<pid_t>(::syscall(SYS_gettid));
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), 19);
  constexpr int kWhoProcess = 1, kClassIdle = 3, kClassShift = 13;  // linux/ioprio.h
  (void)::syscall(SYS_ioprio_set, kWhoProcess, tid, kClassIdle << kClassShift);
#endif
}

}  // namespace

// The replica's directory made and locked (once); nothing, or why it cannot be written.
std::optional<RunDirectory::Impl::ReplicaFailure> RunDirectory::Impl::make_ready(std::size_t i) {
  Replica& r = replicas[i];
  if (r.lock) {
    if (env.make_dirs(r.dir) == 0) return std::nullopt;  // removed meanwhile: made again
    const int err = errno;
    return ReplicaFailure{i, failure_kind(std::strerror(err), false),
                          r.dir + ": cannot create the replica directory: " + std::strerror(err)};
  }
  if (env.make_dirs(r.dir) != 0) {
    const int err = errno;
    return ReplicaFailure{i, failure_kind(std::strerror(err), false),
                          r.dir + ": cannot create the replica directory: " + std::strerror(err)};
  }
  try {
    r.lock.emplace(RunDirLock::acquire(r.dir, &env));
  } catch (const RunDirBusy& e) {
    return ReplicaFailure{i, failure_kind(e.what(), true), e.what()};
  } catch (const std::exception& e) {
    return ReplicaFailure{i, failure_kind(e.what(), false), e.what()};
  }
  sweep_dead_writers(env, r.dir);
  return std::nullopt;
}

// On the training thread: once per replica and kind of failure.
void RunDirectory::Impl::report_replica_failure(const ReplicaFailure& f) {
  Replica& r = replicas[f.replica];
  if (!r.reported.insert(f.kind).second) return;
  trainer.observer().on_message("warning: replica " + r.dir + " not written: " + f.message +
                                "; training goes on (reported once per kind of failure)");
}

void RunDirectory::Impl::replica_loop() {
  block_signals_on_this_thread();
  yield_to_training();
  std::unique_lock<std::mutex> g(mutex);
  for (;;) {
    // Only while the run directory's writer is idle: a replica never delays the save
    // that the training thread may be waiting for.
    replica_wake.wait(g, [this] { return (!replica_pending.empty() && queue.empty()) || replica_quit; });
    if (replica_pending.empty()) return;
    ReplicaCopy c = std::move(replica_pending.front());
    replica_pending.pop_front();
    replica_busy = true;
    g.unlock();
    write_replicas(c, ReplicaTurn::WhileWriterIdle);
    g.lock();
    replica_busy = false;
    idle.notify_all();
  }
}

// Hands a saved file to the replicas: queued for the replica thread (replacing an older
// version of the same file still waiting), or written now without checkpoint.async.
void RunDirectory::Impl::hand_to_replicas(ReplicaCopy c) {
  if (!replica_writer.joinable()) {
    write_replicas(c, ReplicaTurn::Now);
    return;
  }
  {
    std::lock_guard<std::mutex> g(mutex);
    auto same = std::find_if(replica_pending.begin(), replica_pending.end(),
                             [&](const ReplicaCopy& p) { return p.file == c.file; });
    if (same != replica_pending.end()) *same = std::move(c);
    else replica_pending.push_back(std::move(c));
  }
  replica_wake.notify_all();
}

// Every usable replica gets the file, atomically; then its milestones are rotated and
// its best_epoch files pruned like the run directory's.
void RunDirectory::Impl::write_replicas(const ReplicaCopy& c, ReplicaTurn when) {
  std::vector<ReplicaFailure> failed;
  std::vector<std::size_t> written;
  for (std::size_t i = 0; i < replicas.size(); ++i) {
    if (std::optional<ReplicaFailure> f = make_ready(i)) {
      failed.push_back(*f);
      continue;
    }
    try {
      // In 1 MiB pieces, each after the run directory's writer is idle again: a save
      // queued meanwhile is never kept waiting behind a whole replica write.
      atomic_write(env, (fs::path(replicas[i].dir) / c.file).string(), [&](int fd) {
        constexpr std::size_t kPiece = std::size_t(1) << 20;
        const auto* bytes = reinterpret_cast<const unsigned char*>(c.image->data());
        for (std::size_t at = 0; at < c.image->size(); at += kPiece) {
          if (when == ReplicaTurn::WhileWriterIdle) {
            std::unique_lock<std::mutex> g(mutex);
            replica_wake.wait(g, [this] { return queue.empty(); });
          }
          if (const int err = write_fully_at(env, fd, bytes + at, std::min(kPiece, c.image->size() - at),
                                             static_cast<off_t>(at)))
            return err;
        }
        return 0;
      });
      tidy(replicas[i].dir, c.kind, c.keep_best);
      written.push_back(i);
    } catch (const std::exception& e) {
      failed.push_back({i, failure_kind(e.what(), false), e.what()});
    }
  }
  std::lock_guard<std::mutex> g(mutex);
  replica_failures.insert(replica_failures.end(), failed.begin(), failed.end());
  replicas_written.insert(replicas_written.end(), written.begin(), written.end());
}

}  // namespace engine
