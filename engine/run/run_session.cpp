// RunSession (include/engine/run/run_session.h): one process of a training job, with one
// rank or several; rank 0 alone owns the run directory.
#include "engine/run/run_session.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>

#include "engine/train/dist_backend.h"
#include "engine/train/process_settings.h"
#include "engine/run/run_directory.h"
#include "engine/run/run_lock.h"

namespace engine {

namespace {

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
  s.trainer = std::make_unique<Trainer>(s.cfg, s.device, std::move(model), observer, SplitsNeeded::All,
                                        std::move(data), s.comm.get(), s.env);
  if (writes_run_dir()) {
    s.run_dir = std::make_unique<RunDirectory>(*s.trainer, std::move(s.lock));
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
