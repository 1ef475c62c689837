// The `engine` command line: a thin layer over the library (engine/trainer.h,
// engine/checkpoint.h). Every error is one line on stderr and a non-zero exit.
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/build_info.h"
#include "engine/trainer.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/idx.h"
#include "engine/report.h"
#include "engine/run_control.h"
#include "engine/run_lock.h"
#include "engine/models/registry.h"

namespace fs = std::filesystem;
using namespace engine;

namespace {

const char* kMainHelp = R"(engine: trains Fashion-MNIST classifiers (model.name: fashion_cnn, mlp) and never loses a run.

usage: engine <command> [options]

commands:
  train CONFIG.json      train from a config; resumes from <run-dir>/last.h5 when it exists
  resume CKPT.h5         continue the run recorded in a checkpoint (its config is inside)
  eval CKPT.h5           test loss, accuracy and confusion matrix of a checkpoint
  inspect CKPT.h5        human summary of a checkpoint
  verify CKPT.h5         integrity and structure check (exit 0 only when sound)
  diff A.h5 B.h5         compare two checkpoints tensor by tensor (exit 0 when identical)
  report RUN_DIR         one self-contained HTML page: curves, confusion matrix, config, checkpoints
  version                the engine's version, its libraries' and the GPU's (also --version)

Run `engine <command> --help` for the options of a command.
)";

const char* kTrainHelp = R"(usage: engine train CONFIG.json [options]

Trains the model described by CONFIG.json (see docs/config.md). If the run directory
already holds last.h5, training resumes from it ("resuming from epoch N"); --fresh
starts over. Ctrl-C or SIGTERM stops after the current step (or evaluation batch) and
writes last.h5 first (exit 130); a second Ctrl-C exits at once. SIGUSR1 writes last.h5
and training goes on (Slurm: --signal=USR1@90). One run at a time per run directory: a
second `train` or `resume` on it is refused, naming the process that holds it.
Exit status: 0 done, 130 stopped by a signal, 75 stopped by --time-limit, 3 a save
failed (disk full, I/O error; checkpoint.on_error = stop) with the previous checkpoint
intact, 1 error, 2 usage.

options:
  --device cpu|cuda|cuda:N|auto   where to train (overrides the config's `device`)
  --run-dir DIR                   where checkpoints, metrics.jsonl go (overrides checkpoint.dir)
  --set KEY=VALUE                 override any config key, dotted (repeatable), e.g.
                                  --set train.epochs=3 --set data.train_limit=2000
  --fresh                         ignore an existing last.h5 and start from scratch
  --stop-after-epochs K           stop cleanly once K epochs are complete (resume later)
  --time-limit T                  stop cleanly, last.h5 saved, before T of wall-clock time
                                  has passed since start (exit 75; run again to go on):
                                  5400, 5400s, 90m, 1.5h, MM:SS, HH:MM:SS or D-HH:MM:SS
  -h, --help                      this help
)";

const char* kResumeHelp = R"(usage: engine resume CKPT.h5 [options]

Continues the run recorded in CKPT.h5 with the config stored inside it, writing into
the run directory recorded there unless --run-dir names another. A checkpoint saved on
a GPU resumes on a CPU and the reverse.

options:
  --device cpu|cuda|cuda:N|auto   where to continue (default: the config's device)
  --run-dir DIR                   where to write from now on
  --set KEY=VALUE                 override config keys (e.g. train.epochs=30)
  --non-strict                    apply what matches; print missing/unexpected keys
  --stop-after-epochs K, --time-limit T   as for train
  (signals, the run-directory lock and exit statuses as for train)
  -h, --help                      this help
)";

const char* kEvalHelp = R"(usage: engine eval CKPT.h5 [options]

Evaluates the model of a checkpoint on the test set: loss, accuracy, confusion matrix.

options:
  --device cpu|cuda|cuda:N|auto   where to evaluate (default auto)
  --data-dir DIR                  dataset directory (default: the checkpoint's data.dir)
  --dump-logits FILE              write the test logits as float32 little-endian [N, classes]
  --limit N                       evaluate only the first N test images
  -h, --help                      this help
)";

const char* kReportHelp = R"(usage: engine report RUN_DIR [options]

Writes one self-contained HTML file (no network, no scripts; open it in any browser)
with the loss, accuracy, learning-rate and loss-scale curves per epoch (from
RUN_DIR/metrics.jsonl, else the metrics of RUN_DIR/last.h5), the confusion matrix of
best.h5 on the test set, the run's config, and the checkpoints present with their
epoch, size and integrity.

options:
  -o, --output FILE               where to write (default RUN_DIR/report.html)
  --device cpu|cuda|cuda:N|auto   where to evaluate best.h5 (default auto)
  --data-dir DIR                  dataset directory (default: best.h5's data.dir)
  -h, --help                      this help
)";

struct Args {
  std::vector<std::string> positional;
  std::vector<std::string> sets;
  std::string device, run_dir, dump_logits, data_dir, output;
  bool fresh = false, non_strict = false, help = false;
  std::optional<int64_t> stop_after_epochs, limit;
  std::optional<double> time_limit;  // seconds
};

// Exit status of train/resume when the disk refused a save (docs/cli.md).
constexpr int kExitSaveFailed = 3;
// When the process started: --time-limit counts from here, as a scheduler does.
const auto g_process_start = std::chrono::steady_clock::now();

// Exit statuses of a training run that stopped before its end.
constexpr int kExitInterrupted = 130;  // Ctrl-C / SIGTERM, last.h5 saved
constexpr int kExitTimeLimit = 75;     // --time-limit reached, last.h5 saved (EX_TEMPFAIL)

[[noreturn]] void fail(const std::string& msg, int code = 1) {
  std::cerr << "engine: " << msg << "\n";
  std::exit(code);
}

int64_t parse_int(const std::string& opt, const std::string& v) {
  try {
    std::size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used != v.size() || x < 0) throw std::invalid_argument("");
    return x;
  } catch (...) {
    fail(opt + " expects a non-negative integer, got '" + v + "'", 2);
  }
}

Args parse_args(int argc, char** argv, int first) {
  Args a;
  for (int i = first; i < argc; ++i) {
    const std::string s = argv[i];
    auto value = [&](const std::string& opt) -> std::string {
      if (i + 1 >= argc) fail(opt + " needs a value", 2);
      return argv[++i];
    };
    if (s == "-h" || s == "--help") a.help = true;
    else if (s == "--device") a.device = value(s);
    else if (s == "--run-dir") a.run_dir = value(s);
    else if (s == "--set") a.sets.push_back(value(s));
    else if (s.rfind("--set=", 0) == 0) a.sets.push_back(s.substr(6));
    else if (s == "--fresh") a.fresh = true;
    else if (s == "--non-strict") a.non_strict = true;
    else if (s == "--dump-logits") a.dump_logits = value(s);
    else if (s == "--data-dir") a.data_dir = value(s);
    else if (s == "-o" || s == "--output") a.output = value(s);
    else if (s == "--limit") a.limit = parse_int(s, value(s));
    else if (s == "--stop-after-epochs") a.stop_after_epochs = parse_int(s, value(s));
    else if (s == "--time-limit") {
      const std::string v = value(s);
      a.time_limit = parse_duration_seconds(v);
      if (!a.time_limit)
        fail("--time-limit expects a positive duration (5400, 90m, 1.5h, HH:MM:SS), got '" + v + "'", 2);
    }
    else if (s.size() > 1 && s[0] == '-') fail("unknown option '" + s + "' (see --help)", 2);
    else a.positional.push_back(s);
  }
  return a;
}

std::string fmt_seconds(double s) {
  if (s < 0) s = 0;
  char buf[32];
  const int t = static_cast<int>(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%d:%02d:%02d", t / 3600, t / 60 % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%d:%02d", t / 60, t % 60);
  return buf;
}

// Terminal: a live progress bar per epoch. Pipe/file: one plain line per epoch.
class ConsoleObserver : public TrainerObserver {
 public:
  ConsoleObserver() : tty_(::isatty(STDOUT_FILENO) != 0) {}
  void on_message(const std::string& m) override { clear(); std::cout << m << std::endl; }
  void on_epoch_begin(int64_t epoch, int64_t epochs, int64_t) override {
    epoch_ = epoch;
    epochs_ = epochs;
  }
  void on_progress(const Progress& p) override {
    if (!tty_) return;
    const int width = 30;
    const int filled = p.steps ? static_cast<int>(width * p.step / p.steps) : width;
    std::ostringstream o;
    o << "\r\033[Kepoch " << p.epoch << "/" << p.epochs << " [" << std::string(filled, '#')
      << std::string(width - filled, '.') << "] " << p.step << "/" << p.steps << "  "
      << std::fixed << std::setprecision(0) << p.samples_per_second << " img/s  eta "
      << fmt_seconds(p.eta_seconds) << "  loss " << std::setprecision(4) << p.running_loss;
    std::cout << o.str() << std::flush;
    bar_shown_ = true;
  }
  void on_epoch_end(const EpochMetrics& m) override {
    clear();
    std::printf("epoch %lld/%lld  train_loss %.4f  val_loss %.4f  val_acc %.2f%%  lr %.3g  %.1fs\n",
                static_cast<long long>(m.epoch), static_cast<long long>(epochs_), m.train_loss,
                m.val_loss, 100.0 * m.val_acc, m.lr, m.epoch_seconds);
    std::fflush(stdout);
  }
  void on_checkpoint(const std::string&, CheckpointKind) override {}

 private:
  void clear() {
    if (bar_shown_) std::cout << "\r\033[K" << std::flush;
    bar_shown_ = false;
  }
  bool tty_;
  bool bar_shown_ = false;
  int64_t epoch_ = 0, epochs_ = 0;
};

// The run the signal handlers talk to (null until the trainer exists, and after fit()).
std::atomic<RunControl*> g_run{nullptr};

void on_stop_signal(int) {
  RunControl* run = g_run.load();
  // A second Ctrl-C (or nothing to save yet): out at once. Saves are atomic (temporary
  // file, fsync, rename), so last.h5 is still the last complete checkpoint.
  if (!run || run->request_stop()) {
    static const char msg[] = "\nengine: interrupted again, exiting now (last.h5 holds the last complete checkpoint)\n";
    if (run) (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
    ::_exit(kExitInterrupted);
  }
}

void on_checkpoint_signal(int) {
  if (RunControl* run = g_run.load()) run->request_checkpoint();
}

// Installed before anything is loaded, so an early SIGUSR1 is not fatal (its default).
void install_signal_handlers() {
  struct sigaction sa {};
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = on_stop_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sa.sa_handler = on_checkpoint_signal;
  sigaction(SIGUSR1, &sa, nullptr);
}

// The run directory's lock, taken before the data is loaded so that a second writer is
// refused at once.
RunDirLock lock_run_dir(const std::string& dir) {
  try {
    fs::create_directories(dir);
    return RunDirLock::acquire(dir);
  } catch (const std::filesystem::filesystem_error& e) {
    fail(dir + ": cannot create the run directory: " + e.code().message());
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

void print_report(const StateReport& r) {
  if (r.clean()) return;
  std::cout << "non-strict load: " << r.summary() << "\n" << r.str();
}

void print_test(const EvalResult& t) {
  std::printf("test: loss %.4f  accuracy %.2f%% (%lld images)\n", t.loss, 100.0 * t.accuracy,
              static_cast<long long>(t.count));
}

int run_training(Trainer& trainer, const Args& a, ConsoleObserver&) {
  StopPlan stop;
  stop.after_epochs = a.stop_after_epochs;
  stop.time_limit_seconds = a.time_limit;
  stop.time_limit_from = g_process_start;
  g_run.store(&trainer.control());
  FitResult r;
  try {
    r = trainer.fit(stop);
  } catch (const CheckpointWriteError& e) {
    // checkpoint.on_error = stop: the previous checkpoint is intact, so the same command
    // resumes from it once the disk is fixed.
    g_run.store(nullptr);
    fail(std::string(e.what()) + "; training stopped (checkpoint.on_error = stop), the previous checkpoint is intact",
         kExitSaveFailed);
  }
  g_run.store(nullptr);
  if (r.ending == FitResult::Ending::Stopped) {
    std::cout << "stopped after " << trainer.epochs_done() << " epoch(s), step "
              << trainer.global_step() << "; checkpoint in " << trainer.config().checkpoint.dir
              << "/last.h5\n";
    switch (r.stop_cause) {
      case FitResult::StopCause::Requested: return kExitInterrupted;
      case FitResult::StopCause::TimeLimit: return kExitTimeLimit;
      default: return 0;
    }
  }
  if (r.test) print_test(*r.test);
  return 0;
}

nlohmann::json apply_sets(nlohmann::json j, const std::vector<std::string>& sets) {
  for (const std::string& s : sets) apply_override(j, s);
  return j;
}

// Data-parallel runs under mpirun/srun (docs/distributed.md). Until the run directory
// is split out of the Trainer, ranks > 0 print nothing and write their (identical)
// checkpoints to a private scratch directory, removed at exit: rank 0 owns the run dir.
struct RankOutputGuard {
  std::string scratch;
  RankOutputGuard(const Collective& c, Config& cfg) {
    if (c.rank() == 0) return;
    if (!std::freopen("/dev/null", "w", stdout)) fail("rank " + std::to_string(c.rank()) + ": cannot silence stdout");
    scratch = (fs::temp_directory_path() / ("engine-rank" + std::to_string(c.rank()) + "-" + std::to_string(::getpid()))).string();
    cfg.checkpoint.dir = scratch;
    cfg.logging.tensorboard = false;
  }
  ~RankOutputGuard() {
    std::error_code ec;
    if (!scratch.empty()) fs::remove_all(scratch, ec);
  }
};

int cmd_train(const Args& a) {
  if (a.help) { std::cout << kTrainHelp; return 0; }
  if (a.positional.size() != 1) fail("train needs exactly one CONFIG.json (see engine train --help)", 2);
  const std::string path = a.positional[0];
  std::ifstream in(path);
  if (!in) fail(path + ": cannot open config file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    // Let the config module word it (it reports line and column).
    (void)e;
    load_config(path);
  }
  j = apply_sets(j, a.sets);
  if (!a.device.empty()) j["device"] = a.device;
  if (!a.run_dir.empty()) j["checkpoint"]["dir"] = a.run_dir;
  Config cfg = config_from_json(j, path);
  const std::unique_ptr<Collective> comm = make_process_collective(detect_launch());  // mpirun/srun: MPI
  const std::string last = (fs::path(cfg.checkpoint.dir) / "last.h5").string();
  const RankOutputGuard rank_output(*comm, cfg);
  const Device device = resolve_device(cfg.device);
  install_signal_handlers();
  RunDirLock lock = lock_run_dir(cfg.checkpoint.dir);
  ConsoleObserver obs;
  const bool resume = !a.fresh && fs::exists(last);
  Trainer trainer(cfg, device, make_model(cfg), &obs, SplitsNeeded::All, nullptr, comm.get());
  if (comm->size() > 1) std::cout << "data-parallel on " << comm->size() << " ranks (" << comm->name() << ")\n";
  trainer.use_run_lock(std::move(lock));
  std::cout << "training " << cfg.model.name << " (" << trainer.model().parameter_count()
            << " parameters) on " << device.str() << ", run dir " << cfg.checkpoint.dir << "\n";
  if (resume) {
    StateReport r;
    try {
      r = trainer.resume_from(last, LoadMode::Strict);
    } catch (const std::exception& e) {
      fail(std::string(e.what()) + " (start over with --fresh)");
    }
    print_report(r);
    std::cout << "resuming from epoch " << trainer.epochs_done() << ", step "
              << trainer.step_in_epoch() << " of epoch " << trainer.epochs_done() + 1 << " ("
              << last << ")\n";
  } else if (a.fresh && fs::exists(last)) {
    std::cout << "--fresh: starting over (the existing checkpoints will be overwritten)\n";
  }
  return run_training(trainer, a, obs);
}

int cmd_resume(const Args& a) {
  if (a.help) { std::cout << kResumeHelp; return 0; }
  if (a.positional.size() != 1) fail("resume needs exactly one CKPT.h5 (see engine resume --help)", 2);
  const std::string path = a.positional[0];
  Checkpoint ckpt = load_checkpoint(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ckpt.config_json);
  } catch (const std::exception& e) {
    fail(path + ": the stored config is not valid JSON");
  }
  j = apply_sets(j, a.sets);
  if (!a.device.empty()) j["device"] = a.device;
  if (!a.run_dir.empty()) j["checkpoint"]["dir"] = a.run_dir;
  Config cfg = config_from_json(j, path + " (stored config)");
  const Device device = resolve_device(cfg.device);
  install_signal_handlers();
  RunDirLock lock = lock_run_dir(cfg.checkpoint.dir);
  ConsoleObserver obs;
  Trainer trainer(cfg, device, make_model(cfg), &obs);
  trainer.use_run_lock(std::move(lock));
  StateReport r;
  try {
    r = trainer.restore(ckpt, a.non_strict ? LoadMode::NonStrict : LoadMode::Strict);
  } catch (const std::exception& e) {
    fail(path + ": " + e.what());
  }
  print_report(r);
  std::cout << "resuming from epoch " << trainer.epochs_done() << " (saved on "
            << ckpt.meta.saved_on << ", now on " << device.str() << "), run dir "
            << cfg.checkpoint.dir << "\n";
  return run_training(trainer, a, obs);
}

int cmd_eval(const Args& a) {
  if (a.help) { std::cout << kEvalHelp; return 0; }
  if (a.positional.size() != 1) fail("eval needs exactly one CKPT.h5 (see engine eval --help)", 2);
  const std::string path = a.positional[0];
  Checkpoint ckpt = load_checkpoint(path);
  nlohmann::json j = nlohmann::json::parse(ckpt.config_json);
  j["device"] = a.device.empty() ? "auto" : a.device;
  if (!a.data_dir.empty()) j["data"]["dir"] = a.data_dir;
  if (a.limit) j["data"]["test_limit"] = *a.limit;
  Config cfg = config_from_json(j, path + " (stored config)");
  const Device device = resolve_device(cfg.device);
  Trainer trainer(cfg, device, make_model(cfg), nullptr, SplitsNeeded::TestOnly);
  Model& model = trainer.model();
  const StateReport r = compare_state(model.state(), ckpt.groups.at("model"));
  if (!r.clean()) fail(path + ": model state does not match: " + r.summary());
  model.load_state(ckpt.groups.at("model"));
  const EvalResult t = trainer.evaluate(Split::Test);
  std::cout << "checkpoint " << path << " (epoch " << ckpt.groups.at("trainer").get_int("epoch")
            << ", saved on " << ckpt.meta.saved_on << "), evaluated on " << device.str() << "\n";
  print_test(t);
  std::cout << "confusion matrix (rows: true class, columns: predicted):\n";
  for (const std::vector<int64_t>& row : t.confusion) {
    for (const int64_t count : row) std::cout << std::setw(6) << count;
    std::cout << "\n";
  }
  if (!a.dump_logits.empty()) {
    const Tensor z = trainer.logits(Split::Test, t.count);
    const std::vector<float> v = z.to_vector();
    std::ofstream out(a.dump_logits, std::ios::binary);
    out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    if (!out) fail(a.dump_logits + ": cannot write logits");
    std::cout << "logits [" << z.dim(0) << ", " << z.dim(1) << "] written to " << a.dump_logits << "\n";
  }
  return 0;
}

int cmd_inspect(const Args& a) {
  if (a.help || a.positional.size() != 1) {
    std::cout << "usage: engine inspect CKPT.h5\n";
    return a.help ? 0 : 2;
  }
  std::cout << inspect_checkpoint(a.positional[0]);
  return 0;
}

int cmd_verify(const Args& a) {
  if (a.help || a.positional.size() != 1) {
    std::cout << "usage: engine verify CKPT.h5   (exit 0 only when the file is sound)\n";
    return a.help ? 0 : 2;
  }
  verify_checkpoint_file(a.positional[0]);
  std::cout << a.positional[0] << ": OK\n";
  return 0;
}

int cmd_diff(const Args& a) {
  if (a.help || a.positional.size() != 2) {
    std::cout << "usage: engine diff A.h5 B.h5   (exit 0 when identical, 1 when they differ)\n";
    return a.help ? 0 : 2;
  }
  const CheckpointDiff d = diff_checkpoints(a.positional[0], a.positional[1]);
  std::cout << d.report;
  std::cout << (d.identical ? "identical\n" : "different\n");
  return d.identical ? 0 : 1;
}

int cmd_report(const Args& a) {
  if (a.help) { std::cout << kReportHelp; return 0; }
  if (a.positional.size() != 1) fail("report needs exactly one RUN_DIR (see engine report --help)", 2);
  ReportOptions opt;
  opt.make_model = [](const Config& c) { return make_model(c); };
  opt.output = a.output;
  if (!a.device.empty()) opt.device = a.device;
  opt.data_dir = a.data_dir;
  const ReportSummary r = write_run_report(a.positional[0], opt);
  for (const std::string& n : r.notes) std::cerr << "engine: note: " << n << "\n";
  std::cout << "report of " << r.epochs << " epoch(s) written to " << r.path << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Tensor buffers of 1 MiB and more get their own mappings and go back to the OS when
  // freed (glibc would otherwise raise this threshold and keep them in the heap).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  if (argc < 2) {
    std::cerr << kMainHelp;
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    std::cout << kMainHelp;
    return 0;
  }
  try {
    if (cmd == "--version" || cmd == "version") {
      std::cout << to_string(build_info());
      return 0;
    }
    const Args a = parse_args(argc, argv, 2);
    // Forked now, while the process is small: training loads checkpoints later
    // (resume, verification after a save), and the parser keeps what it shares.
    if (cmd == "train" || cmd == "resume" || cmd == "eval") start_checkpoint_parser();
    if (cmd == "train") return cmd_train(a);
    if (cmd == "resume") return cmd_resume(a);
    if (cmd == "eval") return cmd_eval(a);
    if (cmd == "inspect") return cmd_inspect(a);
    if (cmd == "verify") return cmd_verify(a);
    if (cmd == "diff") return cmd_diff(a);
    if (cmd == "report") return cmd_report(a);
    fail("unknown command '" + cmd + "' (see engine --help)", 2);
  } catch (const std::exception& e) {
    fail(e.what());
  }
}
