// RunSession (include/engine/run/run_session.h): one process of a training job, with one
// rank or several; rank 0 alone owns the run directory.
#include "engine/run/run_session.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <iostream>
#include <filesystem>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>

#include "engine/train/dist_backend.h"
#include "engine/train/process_settings.h"
#include "engine/io/memory_tier.h"
#include "engine/run/run_directory.h"
#include "engine/run/run_files.h"
#include "engine/run/run_lock.h"
#include "io/checkpoint_reader.h"
#include "io/read_file.h"

namespace engine {

namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// This process's job: the collective of the last session that joined one, kept to the
// end of the process so that abort_job() can still end every rank after the session has
// been unwound by the very exception being reported. One per process: MPI is
// initialised once and cannot be joined again after it finalises.
std::mutex g_job_mutex;
std::shared_ptr<Collective> g_job;

std::shared_ptr<Collective> process_job() {
  std::lock_guard<std::mutex> hold(g_job_mutex);
  return g_job;
}

// <dir>, created when absent, and its lock: taken before the data is loaded, so that a
// second writer is refused at once.
RunDirLock lock_run_dir(Env& env, const std::string& dir) {
  if (env.make_dirs(dir) != 0) {
    const int err = errno;
    throw std::runtime_error(dir + ": cannot create the run directory: " + std::strerror(err));
  }
  return RunDirLock::acquire(dir, &env);  // RunDirBusy naming the holder
}

}  // namespace

struct RunSession::Impl {
  Config cfg;
  Env* env = nullptr;  // RunSessionOptions::env
  Device device;
  std::shared_ptr<Collective> comm;  // outlives the trainer, which uses it; shared with g_job
  std::optional<RunDirLock> lock;    // rank 0, until start() hands it to the RunDirectory
  std::unique_ptr<Trainer> trainer;
  std::unique_ptr<RunDirectory> run_dir;  // after trainer: it writes the trainer's state, so it goes first
  // checkpoint.peer_replica: the first rank on another host than rank 0, which keeps a
  // copy of every save in its own checkpoint.dir; -1 when there is none.
  int peer_rank = -1;
  std::vector<std::string> notes;  // this rank's lines for begin()'s messages
};

RunSession::RunSession(Config cfg, const RunSessionOptions& options) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.cfg = std::move(cfg);
  s.env = &env_or_posix(options.env);
  s.device = resolve_device(s.cfg.device);
  s.comm = std::shared_ptr<Collective>(make_run_collective(s.cfg.dist.backend, s.device, detect_launch(),
                                                           CollectiveOptions{s.cfg.dist.timeout_s}));
  {
    std::lock_guard<std::mutex> hold(g_job_mutex);
    g_job = s.comm;
  }
  if (options.quiet_other_ranks && !writes_run_dir() && !std::freopen("/dev/null", "w", stdout))
    throw std::runtime_error("cannot silence stdout");
  if (writes_run_dir()) s.lock.emplace(lock_run_dir(*s.env, s.cfg.checkpoint.dir));
  if (s.cfg.checkpoint.peer_replica && size() > 1) choose_peer();
}

void RunSession::choose_peer() {
  Impl& s = *impl_;
  std::vector<int32_t> first(static_cast<std::size_t>(size()));
  const int32_t mine = s.comm->host_first_rank();
  s.comm->allgather(&mine, sizeof mine, first.data());
  for (int r = 1; r < size() && s.peer_rank < 0; ++r)
    if (first[static_cast<std::size_t>(r)] != first[0]) s.peer_rank = r;
  if (s.peer_rank < 0) {
    if (writes_run_dir())
      s.notes.push_back("warning: checkpoint.peer_replica: every rank runs on rank 0's host; no peer copy");
    return;
  }
  // After rank 0 holds its lock (this exchange follows it): a peer that shares rank 0's
  // directory (a shared file system) finds it taken, and keeps no copy.
  int64_t ready = 0;
  if (rank() == s.peer_rank) {
    try {
      s.lock.emplace(lock_run_dir(*s.env, s.cfg.checkpoint.dir));
      ready = 1;
    } catch (const std::exception& e) {
      s.notes.push_back(std::string("warning: checkpoint.peer_replica: no copy on this host: ") + e.what());
    }
  }
  ready = s.comm->agree_max({ready})[0];
  if (!ready) {
    if (writes_run_dir())
      s.notes.push_back("warning: checkpoint.peer_replica: rank " + std::to_string(s.peer_rank) +
                        " cannot keep a copy (its message says why)");
    s.peer_rank = -1;
  } else if (writes_run_dir()) {
    s.notes.push_back("peer copy: rank " + std::to_string(s.peer_rank) + ", on another host, keeps a copy of every save in its " +
                      s.cfg.checkpoint.dir);
  }
}

RunSession::~RunSession() = default;

int RunSession::rank() const { return impl_->comm->rank(); }
int RunSession::size() const { return impl_->comm->size(); }
Collective& RunSession::collective() const { return *impl_->comm; }
const Config& RunSession::config() const { return impl_->cfg; }
Device RunSession::device() const { return impl_->device; }

Trainer& RunSession::start(std::unique_ptr<Model> model, TrainerObserver* observer, std::unique_ptr<Dataset> data) {
  Impl& s = *impl_;
  if (s.trainer) throw std::logic_error("RunSession::start: the session has started already");
  apply_process_settings(s.cfg);  // cuda.deterministic is process-wide
  TrainerOptions options;
  options.observer = observer;
  options.data = std::move(data);
  options.collective = s.comm.get();
  options.env = s.env;
  s.trainer = std::make_unique<Trainer>(s.cfg, s.device, std::move(model), std::move(options));
  if (writes_run_dir() || rank() == s.peer_rank) {
    s.run_dir = std::make_unique<RunDirectory>(*s.trainer, std::move(s.lock),
                                               writes_run_dir() ? RunDirRole::Owner : RunDirRole::PeerCopy);
    s.lock.reset();
  }
  return *s.trainer;
}

Trainer& RunSession::trainer() {
  if (!impl_->trainer) throw std::logic_error("RunSession::trainer: call start() first");
  return *impl_->trainer;
}

RunDirectory* RunSession::run_directory() { return impl_->run_dir.get(); }

StartAgreement RunSession::agree_on_start(const std::string& checkpoint_path) {
  Trainer& t = trainer();
  if (size() == 1) return {};
  return engine::agree_on_start(*impl_->comm, impl_->cfg, t.dataset(), checkpoint_path, impl_->env);
}

namespace {

// Rank 0's text on every rank.
void broadcast_text(Collective& comm, std::string& text) {
  int64_t n = static_cast<int64_t>(text.size());
  comm.broadcast(&n, sizeof n, 0);
  text.resize(static_cast<std::size_t>(n));
  if (n > 0) comm.broadcast(&text[0], static_cast<std::size_t>(n), 0);
}

// "runs/x/last.h5 (checksum mismatch ...), runs/x/best.h5 (truncated ...)".
std::string tried_text(const RunSurvey& survey) {
  std::string text;
  for (const CheckpointCopy& c : survey.copies) text += (text.empty() ? "" : ", ") + c.path + " (" + c.reason + ")";
  return text;
}

}  // namespace

// The memory tier (docs/recovery.md): one process on the CPU keeps it.
bool RunSession::keeps_memory_tier() const {
  const Impl& s = *impl_;
  return s.cfg.checkpoint.memory_tier && s.run_dir && writes_run_dir() && size() == 1 && s.trainer &&
         s.trainer->device().is_cpu();
}

std::vector<std::string> RunSession::continue_from_restored() {
  Impl& s = *impl_;
  trainer();  // std::logic_error before start()
  std::vector<std::string> lines;
  if (!keeps_memory_tier()) return lines;
  const std::string& dir = *s.cfg.checkpoint.memory_tier;
  for (const std::string& gone : memory_tier::remove_abandoned(dir))
    lines.push_back("removed " + gone + ": the memory tier of a run whose directory is gone");
  // Its steps follow whatever the run directory trained last, not the state restored:
  // a relaunch must not resume from them.
  const std::string file = memory_tier::file_for(dir, s.cfg.checkpoint.dir);
  if (::unlink(file.c_str()) == 0)
    lines.push_back("removed " + file + ": the memory tier of the run directory's previous steps");
  s.run_dir->keep_memory_tier(dir);
  return lines;
}

RunBegin RunSession::begin(const BeginOptions& options) {
  Impl& s = *impl_;
  Trainer& t = trainer();
  if (s.peer_rank >= 0 && options.from == StartFrom::Newest) return begin_with_peer(options);
  RunBegin b;
  b.messages = s.notes;
  std::string path;  // to resume from, "" fresh
  const bool memory = keeps_memory_tier();
  const std::string memory_file =
      memory ? memory_tier::file_for(*s.cfg.checkpoint.memory_tier, s.cfg.checkpoint.dir) : std::string();
  if (memory)
    for (const std::string& gone : memory_tier::remove_abandoned(*s.cfg.checkpoint.memory_tier))
      b.messages.push_back("removed " + gone + ": the memory tier of a run whose directory is gone");
  MemoryTierSurvey in_memory;
  if (s.run_dir && options.from == StartFrom::Scratch) {  // the peer's copy goes aside too
    for (const std::string& tier : s.run_dir->tiers()) {
      FileInfo info;
      if (s.env->stat(tier, info) != 0 || info.kind != FileKind::Directory) continue;  // no replica yet
      const MovedAside moved = move_previous_run_aside(tier, s.env);
      if (moved.files)
        b.messages.push_back("--fresh: moved the previous run's " + std::to_string(moved.files) + " file(s) to " +
                             moved.dir);
    }
    if (memory && ::unlink(memory_file.c_str()) == 0)
      b.messages.push_back("--fresh: removed the previous run's memory tier " + memory_file);
  } else if (writes_run_dir()) {
    const auto t0 = std::chrono::steady_clock::now();
    b.survey = survey_run(s.cfg, s.env);
    if (memory) {
      in_memory = survey_memory_tier(s.cfg);
      b.memory_tier_file = in_memory.file;
    }
    b.seconds.survey = seconds_since(t0);
    // Another run's checkpoint in the run directory: resuming it would mix two runs, and
    // this run's saves would destroy it.
    if (const CheckpointCopy* other = b.survey.other_run_in_run_dir())
      throw CheckpointError(other->path + ": " + other->reason +
                            "; it is neither resumed nor overwritten: train into another run directory "
                            "(--run-dir), or start over with --fresh, which moves its files aside");
    const bool damaged = std::any_of(b.survey.copies.begin(), b.survey.copies.end(),
                                     [](const CheckpointCopy& c) { return c.verdict == CopyVerdict::Damaged; });
    const CheckpointCopy* used = b.survey.chosen_copy();
    if (in_memory.copy && (!used || in_memory.copy->global_step > used->global_step)) {
      path = in_memory.copy->path;  // newer than every disk copy
    } else if (used) {
      path = used->path;
      in_memory.state.reset();
    } else if (damaged) {
      throw CheckpointError(s.cfg.checkpoint.dir + ": no sound checkpoint of this run in any tier; tried " +
                            tried_text(b.survey) + " (--fresh moves these files aside and starts over)");
    } else {
      // Only replicas of another run: not resumed; this run's saves replace them.
      for (const CheckpointCopy& c : b.survey.copies)
        b.messages.push_back("warning: " + c.path + ": " + c.reason + "; not resumed, this run's saves replace it");
    }
  }
  if (size() > 1) {
    // Rank 0's choice, as this rank sees it: the same file in this rank's run directory
    // when rank 0 chose one of its own (the run directory's path may differ from host to
    // host), and this rank's last.h5 when rank 0 starts fresh but this rank's run
    // directory holds one; the start agreement then refuses ranks that would not start
    // from the same bytes.
    std::string rank0_dir = s.cfg.checkpoint.dir;
    broadcast_text(*s.comm, path);
    broadcast_text(*s.comm, rank0_dir);
    if (!writes_run_dir()) {
      const fs::path mine_last = fs::path(s.cfg.checkpoint.dir) / run_files::kLast;
      FileInfo info;
      if (path.empty() && s.env->stat(mine_last.string(), info) == 0) path = mine_last.string();
      else if (!path.empty() && fs::path(path).parent_path() == fs::path(rank0_dir))
        path = (fs::path(s.cfg.checkpoint.dir) / fs::path(path).filename()).string();
    }
    b.agreement = engine::agree_on_start(*s.comm, s.cfg, t.dataset(), path, s.env);
  }
  if (!path.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      // Rank 0 restores the state the survey loaded; the others load the same file.
      b.load_report = in_memory.state   ? t.restore(*in_memory.state, LoadMode::Strict)
                      : b.survey.state ? t.restore(*b.survey.state, LoadMode::Strict)
                                       : t.resume_from(path, LoadMode::Strict);
    } catch (const CheckpointError&) {
      throw;
    } catch (const std::exception& e) {
      throw CheckpointError(path + ": " + e.what());
    }
    b.survey.state.reset();
    b.seconds.restore = seconds_since(t0);
    b.outcome = RunBegin::Outcome::Resumed;
    b.checkpoint = path;
    if (writes_run_dir()) {
      std::string line = "resuming from epoch " + std::to_string(t.epochs_done()) + ", step " +
                         std::to_string(t.step_in_epoch()) + " of epoch " + std::to_string(t.epochs_done() + 1) +
                         " (" + path + ")";
      if (in_memory.state)
        line += b.survey.chosen_copy() ? "; the disk's newest is " + b.survey.chosen_copy()->path + " (global step " +
                                             std::to_string(b.survey.chosen_copy()->global_step) + ")"
                                       : "; the disk holds none";
      std::string skipped = b.survey.skipped_text();
      for (const std::string& m : in_memory.skipped) skipped += (skipped.empty() ? "" : "; ") + m;
      if (!skipped.empty()) line += "; skipped " + skipped;
      b.messages.push_back(line);
      const auto r0 = std::chrono::steady_clock::now();
      for (const std::string& repaired : s.run_dir->repair(b.survey)) b.messages.push_back(repaired);
      b.seconds.repair = seconds_since(r0);
    }
  }
  if (!options.reevaluate && already_complete()) b.outcome = RunBegin::Outcome::AlreadyComplete;
  if (memory && b.outcome == RunBegin::Outcome::AlreadyComplete) ::unlink(memory_file.c_str());
  else if (memory) s.run_dir->keep_memory_tier(*s.cfg.checkpoint.memory_tier);
  return b;
}

// checkpoint.peer_replica: rank 0 and the peer each survey what they can see; the job
// resumes from the newest, whose owner sends its bytes to every rank.
RunBegin RunSession::begin_with_peer(const BeginOptions& options) {
  Impl& s = *impl_;
  Trainer& t = trainer();
  RunBegin b;
  b.messages = s.notes;
  const bool peer = rank() == s.peer_rank;
  if (writes_run_dir()) {
    b.survey = survey_run(s.cfg, s.env);
    if (const CheckpointCopy* other = b.survey.other_run_in_run_dir())
      throw CheckpointError(other->path + ": " + other->reason +
                            "; it is neither resumed nor overwritten: train into another run directory "
                            "(--run-dir), or start over with --fresh, which moves its files aside");
  } else if (peer) {
    Config local = s.cfg;
    local.checkpoint.replicas.clear();  // the copy is this host's checkpoint.dir alone
    b.survey = survey_run(local, s.env);
    for (CheckpointCopy& c : b.survey.copies)
      if (c.verdict == CopyVerdict::OtherRun) b.messages.push_back("warning: " + c.path + ": " + c.reason + "; not resumed");
  }
  // What each rank can see: its newest sound global step (-1: none), and whether it saw
  // a damaged copy.
  const bool damaged = std::any_of(b.survey.copies.begin(), b.survey.copies.end(),
                                   [](const CheckpointCopy& c) { return c.verdict == CopyVerdict::Damaged; });
  const int64_t mine[2] = {b.survey.chosen_copy() ? b.survey.chosen_copy()->global_step : -1, damaged ? 1 : 0};
  std::vector<int64_t> all(2 * static_cast<std::size_t>(size()));
  s.comm->allgather(mine, sizeof mine, all.data());
  int owner = -1;
  bool any_damaged = false;
  for (int r = 0; r < size(); ++r) {
    const int64_t step = all[2 * static_cast<std::size_t>(r)];
    any_damaged = any_damaged || all[2 * static_cast<std::size_t>(r) + 1] != 0;
    if (step >= 0 && (owner < 0 || step > all[2 * static_cast<std::size_t>(owner)])) owner = r;
  }
  if (owner < 0 && any_damaged)
    throw CheckpointError(s.cfg.checkpoint.dir + ": no sound checkpoint of this run in any tier or on rank " +
                          std::to_string(s.peer_rank) + "'s host; tried " +
                          (b.survey.copies.empty() ? std::string("nothing on this rank") : tried_text(b.survey)) +
                          " (--fresh moves these files aside and starts over)");
  // The bytes travel once the ranks agree on everything else (the checkpoint is checked
  // by the transfer itself: every rank loads the same bytes).
  b.agreement = engine::agree_on_start(*s.comm, s.cfg, t.dataset(), "", s.env);
  if (owner >= 0) {
    std::string bytes, source;
    if (rank() == owner) {
      const CheckpointCopy& used = *b.survey.chosen_copy();
      source = (owner == 0 ? "" : "rank " + std::to_string(owner) + "'s ") + used.path;
      if (read_whole_file(*s.env, used.path, bytes) != 0) {
        const int err = errno;
        throw CheckpointError(used.path + ": cannot read it again to send it to the other ranks: " + std::strerror(err));
      }
    }
    int64_t n = static_cast<int64_t>(bytes.size());
    s.comm->broadcast(&n, sizeof n, owner);
    bytes.resize(static_cast<std::size_t>(n));
    s.comm->broadcast(&bytes[0], bytes.size(), owner);
    int64_t source_n = static_cast<int64_t>(source.size());
    s.comm->broadcast(&source_n, sizeof source_n, owner);
    source.resize(static_cast<std::size_t>(source_n));
    if (source_n > 0) s.comm->broadcast(&source[0], source.size(), owner);
    const Checkpoint ckpt = checkpoint_internal::load_checkpoint_from_bytes(
        source, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
    try {
      b.load_report = t.restore(ckpt, LoadMode::Strict);
    } catch (const std::exception& e) {
      throw CheckpointError(source + ": " + e.what());
    }
    b.survey.state.reset();
    b.outcome = RunBegin::Outcome::Resumed;
    b.checkpoint = source;
    if (s.run_dir) {
      std::string line = "resuming from epoch " + std::to_string(t.epochs_done()) + ", step " +
                         std::to_string(t.step_in_epoch()) + " of epoch " + std::to_string(t.epochs_done() + 1) +
                         " (" + source + ")";
      if (const std::string skipped = b.survey.skipped_text(); !skipped.empty()) line += "; skipped " + skipped;
      b.messages.push_back(line);
      const std::vector<std::string> repaired =
          rank() == owner ? s.run_dir->repair(b.survey)
                          : s.run_dir->repair_from(bytes, all[2 * static_cast<std::size_t>(owner)], source, b.survey);
      b.messages.insert(b.messages.end(), repaired.begin(), repaired.end());
    }
  }
  if (!options.reevaluate && already_complete()) b.outcome = RunBegin::Outcome::AlreadyComplete;
  return b;
}

bool RunSession::already_complete() {
  Impl& s = *impl_;
  Trainer& t = trainer();
  // Rank 0's answer: the others may not see <run-dir>.
  int64_t complete = 0;
  if (writes_run_dir())
    complete = (t.epochs_done() >= s.cfg.train.epochs || t.early_stop_reached()) &&
               test_result_recorded(s.cfg.checkpoint.dir, s.env);
  if (size() > 1) s.comm->broadcast(&complete, sizeof complete, 0);
  return complete != 0;
}

FitResult RunSession::fit(const StopPlan& stop) {
  Trainer& t = trainer();
  return impl_->run_dir ? impl_->run_dir->fit(stop) : t.fit(stop);
}

std::string RunSession::rank_tag() {
  const LaunchInfo launch = detect_launch();
  return launch.launched && launch.size > 1 ? "rank " + std::to_string(launch.rank) + ": " : "";
}

void RunSession::abort_job(int exit_code) {
  std::cout << std::flush;
  std::cerr << std::flush;
  std::fflush(nullptr);
  if (const std::shared_ptr<Collective> job = process_job(); job && job->size() > 1)
    job->abort(exit_code);  // every rank ends with exit_code
  std::exit(exit_code);
}

}  // namespace engine
