// The run directory's writer (run_directory_impl.h): the jobs queued by the training
// thread, written on the writer thread (or inline without checkpoint.async), the
// snapshot buffer they are written from, milestones rotated and best_epoch files
// pruned after a save, and the outcomes reported back on the training thread.
#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "engine/run/run_files.h"
#include "io/atomic_file.h"
#include "io/checkpoint_copies.h"
#include "kernels/cpu/bulk_copy.h"
#include "run/run_directory_impl.h"
#include "run/tfevents.h"
#include "train/save_verification.h"

namespace engine {

namespace fs = std::filesystem;
using namespace run_directory_internal;

void RunDirectory::Impl::writer_loop() {
  block_signals_on_this_thread();
  std::unique_lock<std::mutex> g(mutex);
  for (;;) {
    wake.wait(g, [this] { return !queue.empty() || quit; });
    if (queue.empty()) return;  // quit, and nothing left to write
    const Job j = queue.front();
    g.unlock();
    run_job(j);
    g.lock();
    queue.pop_front();  // the snapshot buffer is free once no checkpoint job holds it
    idle.notify_all();
    if (queue.empty()) replica_wake.notify_all();
  }
}

// A checkpoint: serialise, CRC, write, fsync, rename, fsync the directory
// (save_checkpoint), verify, rotate milestones. Metrics: metrics.jsonl, TensorBoard.
// On the writer thread, or on the training thread without checkpoint.async.
void RunDirectory::Impl::run_job(const Job& j) {
  const auto t0 = env.monotonic_now();
  std::exception_ptr error;
  try {
    if (j.state) {
      kernels::cuda::wait_for(j.copies_done);
      // One image for every tier: the run directory's file now, the replicas' from the
      // same sealed bytes on the replica thread (whether or not this write succeeded).
      std::shared_ptr<std::string> image = replicas.empty() ? nullptr : std::make_shared<std::string>();
      const std::exception_ptr failed =
          checkpoint_internal::save_checkpoint_copies({j.path}, *j.state, &env, image.get()).front();
      if (image) hand_to_replicas({fs::path(j.path).filename().string(), j.kind, j.keep_best, std::move(image)});
      if (failed) std::rethrow_exception(failed);
      if (cfg.checkpoint.verify) verify_saved_checkpoint(j.path, *j.state, *prototype, env);
      tidy(dir, j.kind, j.keep_best);
    } else {
      // Replaced like a checkpoint: a crash leaves the old or the new file, never a torn one.
      write_file_atomically(env, j.path, j.text);
      if (cfg.logging.tensorboard) tfevents::write_run_events(env, dir, j.history, j.test);
    }
  } catch (...) {
    error = std::current_exception();
  }
  std::lock_guard<std::mutex> g(mutex);
  if (j.state) {
    records[j.record].total_seconds = seconds_since(env, j.requested);
    slowest_write = std::max(slowest_write, seconds_since(env, t0));
  }
  outcomes.push_back({j.path, j.kind, j.state != nullptr, error});
}

// After a save into `tier`: the milestones rotated, the best_epoch files pruned.
void RunDirectory::Impl::tidy(const std::string& tier, CheckpointKind kind, const std::vector<int64_t>& keep_best) {
  if (kind == CheckpointKind::Milestone) rotate_milestones(tier);
  if (kind == CheckpointKind::KeepBest) prune_best_epochs(tier, keep_best);
}

// Keep only the best_epoch_NNNN.h5 of the k best epochs.
void RunDirectory::Impl::prune_best_epochs(const std::string& tier, const std::vector<int64_t>& keep) {
  std::vector<std::string> names;
  if (env.list_dir(tier, names) != 0) throw_filesystem_error("directory iterator cannot open directory", tier, errno);
  for (const std::string& f : names) {
    if (f.rfind("best_epoch_", 0) != 0 || !is_run_checkpoint(f)) continue;
    const int64_t e = std::stoll(f.substr(11, 4));
    if (std::count(keep.begin(), keep.end(), e) > 0) continue;
    const std::string p = (fs::path(tier) / f).string();
    if (env.remove(p) != 0 && errno != ENOENT) throw_filesystem_error("cannot remove", p, errno);
  }
}

// Keep the newest keep_last milestones, plus those named in keep_epochs.
void RunDirectory::Impl::rotate_milestones(const std::string& dir) {
  std::vector<std::string> names;
  if (env.list_dir(dir, names) != 0) throw_filesystem_error("directory iterator cannot open directory", dir, errno);
  std::vector<std::pair<int64_t, fs::path>> milestones;
  for (const std::string& f : names) {
    long long e = 0;
    char tail[8] = {0};
    if (std::sscanf(f.c_str(), "epoch_%lld.%3s", &e, tail) == 2 && std::string(tail) == "h5" && f.size() == 13)
      milestones.emplace_back(e, fs::path(dir) / f);
  }
  std::sort(milestones.rbegin(), milestones.rend());
  int64_t kept = 0;
  for (auto& [e, p] : milestones) {
    const auto& pinned = cfg.checkpoint.keep_epochs;
    if (std::count(pinned.begin(), pinned.end(), e) > 0) continue;
    if (kept++ < cfg.checkpoint.keep_last || env.remove(p.string()) == 0) continue;
    const int err = errno;
    if (err != ENOENT) throw_filesystem_error("cannot remove", p.string(), err);  // gone already: no error
  }
}

// Runs `j` now (no writer thread) or queues it.
void RunDirectory::Impl::submit(Job j) {
  {
    std::lock_guard<std::mutex> g(mutex);
    if (writer.joinable()) {
      queue.push_back(std::move(j));
      wake.notify_all();
      return;
    }
  }
  run_job(j);
}

// On the training thread: the observer hears of completed saves; a failed one is a
// warning (checkpoint.on_error = continue) or thrown (stop; and always for a failed
// verification, which is not the disk's refusal but a wrong file).
void RunDirectory::Impl::report_outcomes() {
  std::vector<Outcome> done;
  std::vector<ReplicaFailure> failed;
  std::vector<std::size_t> written;
  {
    std::lock_guard<std::mutex> g(mutex);
    done.swap(outcomes);
    failed.swap(replica_failures);
    written.swap(replicas_written);
  }
  for (const std::size_t i : written) replicas[i].reported.clear();  // a new failure is news again
  for (const ReplicaFailure& f : failed) report_replica_failure(f);
  for (const Outcome& o : done) {
    if (!o.error) {
      if (o.checkpoint) trainer.observer().on_checkpoint(o.path, o.kind);
      if (o.checkpoint) peer_reported.clear();  // a new failure is news again
      continue;
    }
    try {
      std::rethrow_exception(o.error);
    } catch (const CheckpointWriteError& e) {
      if (role == RunDirRole::PeerCopy) {
        // A copy: reported once per kind, training goes on.
        if (peer_reported.insert(failure_kind(e.what(), false)).second)
          trainer.observer().on_message(std::string("warning: peer copy not written: ") + e.what() +
                                        "; training goes on (reported once per kind of failure)");
        continue;
      }
      if (!continue_after_write_failure()) throw;
      warn_write_failure(e);
    }
  }
}

void RunDirectory::Impl::warn_write_failure(const CheckpointWriteError& e) {
  trainer.observer().on_message(std::string("warning: ") + e.what() +
                                "; training goes on (checkpoint.on_error = continue), the next save retries");
}

RunDirectory::Impl::Snapshot RunDirectory::Impl::copy_into_buffer(const Checkpoint& live) {
  auto c = std::make_shared<Checkpoint>(live);  // meta, config and scalars by value; tensors below
  bool copies_queued = false;
  for (auto& [group, d] : c->groups) {
    auto& bufs = buffers[group];
    for (auto& [key, t] : d.tensors) {
      Tensor& b = bufs[key];
      if (!b.defined() || b.shape() != t.shape() || b.dtype() != t.dtype()) b = host_buffer_for(t);
      if (t.numel() > 0 && t.device().is_cuda()) {
        kernels::cuda::copy_to_pinned_host_async(b.raw(), t.raw(), t.nbytes());
        copies_queued = true;
      } else if (t.numel() > 0) {
        // Only the writer thread reads the buffer: streaming stores spare the training
        // thread the cache misses of a cold destination (part of the target of <= 1 ms).
        kernels::cpu::copy_bypassing_cache(b.raw(), t.raw(), t.nbytes());
      }
      t = b;
    }
  }
  Snapshot s;
  if (copies_queued) s.copies_done = kernels::cuda::mark_stream();
  s.state = std::move(c);
  return s;
}

Tensor RunDirectory::Impl::host_buffer_for(const Tensor& t) {
  if (!t.device().is_cuda()) return Tensor::empty(t.shape(), t.dtype());
  void* p = kernels::cuda::alloc_pinned_host(t.nbytes());
  std::shared_ptr<void> owner(p, [](void* q) { kernels::cuda::free_pinned_host(q); });
  return Tensor::wrap_host(std::move(owner), p, t.shape(), t.dtype());
}

}  // namespace engine
