// Private to the run directory (engine/run/run_directory*.cpp): RunDirectory::Impl, what
// a RunDirectory holds, and the helpers its files share. Its members are defined by
// topic: run_directory.cpp (taking the directory, starting and ending the threads),
// run_directory_writer.cpp (the writer thread: jobs, the snapshot buffer, milestones,
// outcomes) and run_directory_replicas.cpp (the replica thread and its tiers).
#pragma once
#include <pthread.h>
#include <signal.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "engine/io/memory_tier.h"
#include "engine/io/step_digest.h"
#include "engine/run/run_directory.h"
#include "kernels/cuda_runtime.h"

namespace engine {

using Clock = std::chrono::steady_clock;

namespace run_directory_internal {

inline double seconds_since(Env& env, Clock::time_point t0) {
  return std::chrono::duration<double>(env.monotonic_now() - t0).count();
}

// What the std::filesystem call this stands for throws, worded as it words it.
[[noreturn]] inline void throw_filesystem_error(const char* what, const std::string& path, int err) {
  namespace fs = std::filesystem;
  throw fs::filesystem_error(what, fs::path(path), std::error_code(err, std::generic_category()));
}

// What kind of failure a replica's error is, so that each kind is reported once: the
// system's reason at the end of the message ("No space left on device"), or "busy".
inline std::string failure_kind(const std::string& what, bool busy) {
  if (busy) return "busy";
  const std::size_t colon = what.rfind(": ");
  return colon == std::string::npos ? what : what.substr(colon + 2);
}

// The writer thread takes no asynchronous signal: the CLI's handlers run on the training
// thread, and SIGXFSZ stays blocked so that a write past `ulimit -f` fails with EFBIG.
inline void block_signals_on_this_thread() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGUSR1, SIGHUP, SIGQUIT, SIGXFSZ, SIGPIPE}) sigaddset(&set, sig);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

}  // namespace run_directory_internal

struct RunDirectory::Impl {
  // One file to write, in the order asked: a checkpoint (its state as it was when asked,
  // in the snapshot buffer) or a small text file (metrics.jsonl, with the TensorBoard events).
  struct Job {
    std::string path;
    CheckpointKind kind = CheckpointKind::Last;
    std::shared_ptr<const Checkpoint> state;  // null: a metrics job
    // Set when device tensors of `state` are still being copied into the snapshot buffer
    // on the compute stream: the writer waits for it before it reads them.
    kernels::cuda::StreamMark copies_done;
    std::size_t record = 0;
    Clock::time_point requested;
    // metrics job
    std::string text;
    std::vector<EpochMetrics> history;
    std::optional<EvalResult> test;
    // What the state was taken at (see save()): equal keys, equal state.
    std::array<int64_t, 3> taken_at{};
    // A KeepBest save: the epochs whose best_epoch_NNNN.h5 stay (checkpoint.keep_best).
    std::vector<int64_t> keep_best;
  };
  // A second-tier directory (checkpoint.replicas): written on the replica thread, under
  // its own lock, its failures reported once per kind on the training thread.
  struct Replica {
    std::string dir;
    std::optional<RunDirLock> lock;  // taken when the directory first becomes usable
    std::set<std::string> reported;  // training thread: the failure kinds told already
  };
  struct ReplicaFailure {
    std::size_t replica;
    std::string kind, message;
  };
  // A saved file's sealed bytes, for the replicas: the newest version of each file name
  // waits here. The replica thread writes them from this copy of the image, and only while
  // the run directory's writer is idle, so that the snapshot buffer, which the training
  // thread waits for, is free as soon as the run directory's file is written and
  // verified; when saves come faster than that, a file's older version still waiting is
  // replaced by the newer one (each replica always gets each file's newest version).
  struct ReplicaCopy {
    std::string file;
    CheckpointKind kind = CheckpointKind::Last;
    std::vector<int64_t> keep_best;
    std::shared_ptr<const std::string> image;
  };
  // A finished job, reported on the training thread (observer calls, warnings, errors).
  struct Outcome {
    std::string path;
    CheckpointKind kind;
    bool checkpoint;
    std::exception_ptr error;
  };

  Impl(Trainer& t, std::optional<RunDirLock> given, RunDirRole r);
  ~Impl();

  // The replicas (run_directory_replicas.cpp).
  std::optional<ReplicaFailure> make_ready(std::size_t i);
  void report_replica_failure(const ReplicaFailure& f);
  void replica_loop();
  void hand_to_replicas(ReplicaCopy c);
  enum class ReplicaTurn { Now, WhileWriterIdle };
  void write_replicas(const ReplicaCopy& c, ReplicaTurn when);

  // The writer (run_directory_writer.cpp).
  void writer_loop();
  void run_job(const Job& j);
  void tidy(const std::string& tier, CheckpointKind kind, const std::vector<int64_t>& keep_best);
  void prune_best_epochs(const std::string& tier, const std::vector<int64_t>& keep);
  void rotate_milestones(const std::string& dir);
  void submit(Job j);
  void report_outcomes();
  void warn_write_failure(const CheckpointWriteError& e);

  // Nothing queued or being written, in any tier (mutex held).
  bool all_written() const { return queue.empty() && replica_pending.empty() && !replica_busy; }

  // The queued checkpoint that still holds the snapshot buffer, if any (mutex held).
  const Job* pending_checkpoint() const {
    for (auto it = queue.rbegin(); it != queue.rend(); ++it)
      if (it->state) return &*it;
    return nullptr;
  }

  void wait_until(const std::function<bool()>& done) {
    std::unique_lock<std::mutex> g(mutex);
    idle.wait(g, done);
  }

  // The one reading of checkpoint.on_error.
  bool continue_after_write_failure() const { return cfg.checkpoint.on_error == SaveErrorPolicy::Continue; }

  // The state into the snapshot buffer: host tensors kept from save to save (reallocated
  // only when a shape changes). Only called while no queued job holds the buffer. The
  // buffer of a device tensor is pinned host memory: its copies are queued on the
  // compute stream behind the step that produced the state, and `copies_done` marks
  // their end for the writer thread, which waits for it before it reads them. The
  // training thread does not wait: the next step queues behind the copies.
  struct Snapshot {
    std::shared_ptr<const Checkpoint> state;
    kernels::cuda::StreamMark copies_done;  // null when every tensor was on the host
  };
  Snapshot copy_into_buffer(const Checkpoint& live);
  static Tensor host_buffer_for(const Tensor& t);

  Trainer& trainer;
  Env& env;  // the trainer's: this directory's files and timings, the writer thread's too
  const Config cfg;
  const std::string dir;
  const RunDirRole role;
  std::set<std::string> peer_reported;  // PeerCopy: the failure kinds told already
  std::optional<RunDirLock> lock;
  std::vector<Replica> replicas;  // their locks: the replica thread's (and before it starts)
  const std::unique_ptr<Model> prototype;  // the writer's: verification builds its instances from it
  std::map<std::string, std::map<std::string, Tensor>> buffers;  // training thread only
  std::optional<double> state_bytes;  // for the first save's estimate
  // step_digests.jsonl, opened at the first record (training thread only); a write that
  // failed is told once and ends the record (training goes on).
  step_digest_log::Writer digest_log;
  bool digest_log_failed = false;
  // The memory tier's slot file (keep_memory_tier; training thread only). A write that
  // failed is told once and ends the tier for this process (training goes on).
  std::unique_ptr<memory_tier::Writer> memory_tier;

  mutable std::mutex mutex;  // guards what follows
  std::condition_variable wake, idle;
  std::deque<Job> queue;  // front: the job being written
  bool quit = false;
  std::vector<Outcome> outcomes;
  std::condition_variable replica_wake;
  std::deque<ReplicaCopy> replica_pending;
  bool replica_busy = false, replica_quit = false;
  std::vector<ReplicaFailure> replica_failures;  // for the training thread to report
  std::vector<std::size_t> replicas_written;     // replicas written since the last report
  std::vector<SaveRecord> records;
  double slowest_write = -1;  // seconds of the slowest checkpoint write + verification so far

  std::thread replica_writer;  // started before `writer`, which hands it copies
  std::thread writer;          // last: started once everything above exists
};

}  // namespace engine
