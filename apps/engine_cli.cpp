// The `engine` command line (apps/engine_cli.h): a thin layer over the library
// (engine/train/trainer.h, engine/io/checkpoint.h, engine/train/inference.h). Arguments are parsed by CLI11, one
// subcommand at a time: a command takes only its own options and refuses any other with
// a one-line usage error (exit 2). Every other error is one line on stderr, exit 1.
#include <malloc.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/build_info.h"
#include "engine/io/checkpoint.h"
#include "engine/core/collective.h"
#include "engine/train/config.h"
#include "engine/io/dataset.h"
#include "engine/train/export.h"
#include "engine/train/inference.h"
#include "engine/nn/models/registry.h"
#include "engine/train/model_factory.h"
#include "report/report.h"
#include "engine/train/run_control.h"
#include "engine/run/recovery.h"
#include "engine/run/run_files.h"
#include "engine/run/run_session.h"
#include "engine/train/start_agreement.h"
#include "engine/train/trainer.h"
#include "engine_cli.h"

namespace fs = std::filesystem;
using namespace engine;

namespace {

const char* kMainHelp = R"(engine: trains Fashion-MNIST classifiers (model.name: fashion_cnn, mlp) and never loses a run.

usage: engine <command> [options]

commands:
  train CONFIG.json      train from a config; resumes from the newest sound checkpoint of the run
  resume CKPT.h5         continue the run recorded in a checkpoint (its config is inside), or RUN_DIR
  eval CKPT.h5           test loss, accuracy and confusion matrix of a checkpoint
  inspect CKPT.h5        human summary of a checkpoint
  verify CKPT.h5         integrity and structure check (exit 0 only when sound)
  diff A.h5 B.h5         compare two checkpoints tensor by tensor (exit 0 when identical)
  report RUN_DIR         one self-contained HTML page: curves, confusion matrix, config, checkpoints
  export CKPT.h5         the model as ONNX or safetensors, with metadata and a self-test (docs/export.md)
  verify-export FILE     runs an export's self-test through the engine (exit 0 only when it passes)
  version                the engine's version, its libraries' and the GPU's (also --version)
  keys                   every config key: type, default, valid values, meaning (docs/config.md)

Run `engine <command> --help` for the options of a command.
)";

constexpr int kExitUsage = 2;
// Exit status of train/resume when the disk refused a save (docs/cli.md).
constexpr int kExitSaveFailed = 3;
// Exit statuses of a training run that stopped before its end.
constexpr int kExitInterrupted = 130;  // Ctrl-C / SIGTERM, last.h5 saved
constexpr int kExitTimeLimit = 75;     // --time-limit reached, last.h5 saved (EX_TEMPFAIL)
// When the process started: --time-limit counts from here, as a scheduler does.
const auto g_process_start = std::chrono::steady_clock::now();

// The host's own observer (engine::cli::run's `also`): hears every training event the
// console does, after it.
TrainerObserver* g_also = nullptr;

// Under mpirun/srun with several ranks every error and warning names its rank ("engine:
// rank 2: ..."), and an error on one rank ends every rank (RunSession::abort_job, through
// the job a session joined, which outlives the session), instead of leaving the others
// in a collective.
[[noreturn]] void fail(const std::string& msg, int code = 1) {
  std::cout << std::flush;
  std::cerr << "engine: " + RunSession::rank_tag() + msg + "\n" << std::flush;  // one write: ranks' lines do not mix
  RunSession::abort_job(code);
}

// ---- options -------------------------------------------------------------------------

// What `train` and `resume` share.
struct RunOptions {
  std::string device, run_dir;
  std::vector<std::string> sets;
  std::optional<int64_t> stop_after_epochs;
  std::optional<double> time_limit;  // seconds
  bool reevaluate = false;
};

struct TrainOptions {
  std::string config_path;
  bool fresh = false;
  RunOptions run;
};

struct ResumeOptions {
  std::string checkpoint;
  bool non_strict = false;
  RunOptions run;
};

struct EvalOptions {
  std::string checkpoint, device = "auto", data_dir, dump_logits;
  std::optional<int64_t> limit;
};

struct ReportCliOptions {
  std::string run_dir, output, device, data_dir;
};

struct ExportOptionsCli {
  std::string checkpoint, format, output, data_dir;
};

struct Commands {
  ExportOptionsCli export_;
  std::string verify_export_path;
  TrainOptions train;
  ResumeOptions resume;
  EvalOptions eval;
  ReportCliOptions report;
  std::string inspect_path, verify_path;
  std::string diff_a, diff_b;
};

const std::string kTimeLimitFormats = "5400, 5400s, 90m, 1.5h, 2d, MM:SS, HH:MM:SS or D-HH:MM:SS";

// Help as the rest of the CLI writes it: "usage: engine train [options] CONFIG.json"
// first, then what the command does, then its options with their text wrapped to fit
// 80 columns.
class HelpFormatter : public CLI::Formatter {
 public:
  static constexpr std::size_t kColumn = 34, kWidth = 80;
  HelpFormatter() {
    label("Usage", "usage");
    label("OPTIONS", "options");
    label("Positionals", "arguments");
    label("Options", "options");
    label("REQUIRED", "");
    label("TEXT", "");
    column_width(kColumn);
  }
  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
    if (mode == CLI::AppFormatMode::Sub) return make_expanded(app);
    std::string footer = make_footer(app);
    if (!footer.empty()) footer = "\n" + footer + "\n";
    return make_usage(app, name) + "\n" + wrap(app->get_description(), 0) + "\n" + make_positionals(app) +
           make_groups(app, mode) + footer;
  }
  std::string make_group(std::string group, bool is_positional, std::vector<const CLI::Option*> opts) const override {
    return CLI::Formatter::make_group(group == "Options" ? "options" : group, is_positional, std::move(opts));
  }
  std::string make_option_desc(const CLI::Option* opt) const override {
    return wrap(opt->get_description(), kColumn);
  }
  std::string make_option_opts(const CLI::Option* opt) const override {
    return opt->get_type_name().empty() ? "" : " " + opt->get_type_name();
  }

 private:
  // Words of `text` in lines of at most kWidth columns, the first starting at `indent`;
  // the caller indents the lines after it.
  static std::string wrap(const std::string& text, std::size_t indent) {
    std::istringstream words(text);
    std::string out, word;
    std::size_t col = indent;
    for (bool first = true; words >> word; first = false) {
      if (!first && col + 1 + word.size() > kWidth) {
        out += "\n";
        col = indent;
      } else if (!first) {
        out += " ";
        ++col;
      }
      out += word;
      col += word.size();
    }
    return out;
  }
};

std::shared_ptr<CLI::Formatter> make_formatter() { return std::make_shared<HelpFormatter>(); }

void add_device_option(CLI::App* c, std::string& device, const std::string& what) {
  c->add_option("--device", device, what)->type_name("cpu|cuda|cuda:N|auto");
}

void add_run_options(CLI::App* c, RunOptions& o, const std::string& device_help,
                     const std::string& run_dir_help) {
  add_device_option(c, o.device, device_help);
  c->add_option("--run-dir", o.run_dir, run_dir_help)->type_name("DIR");
  c->add_option("--set", o.sets,
                "override a config key, dotted (repeatable), e.g. --set train.epochs=3 "
                "--set data.train_limit=2000")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false)
      ->take_all();
  c->add_option("--stop-after-epochs", o.stop_after_epochs,
                "stop cleanly once K epochs are complete in total (K >= 1; resume later)")
      ->type_name("K")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            try {
              std::size_t used = 0;
              const long long k = std::stoll(v, &used);
              if (used == v.size() && k >= 1) return "";
            } catch (...) {
            }
            return "expects a whole number of epochs >= 1, got '" + v + "'";
          },
          "", ""));
  c->add_option_function<std::string>(
       "--time-limit",
       [&o](const std::string& v) { o.time_limit = parse_duration_seconds(v); },
       "stop cleanly, last.h5 saved, before T of wall-clock time has passed since start "
       "(exit 75; run again to go on): " + kTimeLimitFormats)
      ->type_name("T")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (parse_duration_seconds(v)) return "";
            return "expects a positive duration (" + kTimeLimitFormats + "), got '" + v + "'";
          },
          "", ""));
  c->add_flag("--reevaluate", o.reevaluate,
              "when the run is already complete, evaluate the test set again (otherwise it "
              "says \"already complete\" and exits 0)");
}

const char* kTrainFooter = R"(If the run directory or a replica (checkpoint.replicas) holds a checkpoint of this run,
training resumes from the newest sound one ("resuming from epoch N", naming any newer
copy skipped as damaged and the copies repaired; docs/recovery.md); a run that is already
complete says so and exits 0. --fresh starts over: the
previous run's files (last.h5, best.h5, epoch_NNNN.h5, metrics.jsonl, tensorboard/,
report.html) are moved aside to <run-dir>.replaced-<UTC time>, which it names.
Ctrl-C or SIGTERM stops after the current step (or evaluation batch) and writes last.h5
first (exit 130); a second Ctrl-C exits at once. SIGUSR1 writes last.h5 and training
goes on (Slurm: --signal=USR1@90). One run at a time per run directory: a second
`train` or `resume` on it is refused, naming the process that holds it.
Exit status: 0 done (or already complete, or stopped by --stop-after-epochs), 130
stopped by a signal, 75 stopped by --time-limit, 3 a save failed (disk full, I/O error;
checkpoint.on_error = stop) with the previous checkpoint intact, 1 error, 2 usage.)";

const char* kResumeFooter = R"(Continues the run recorded in CKPT.h5 with the config stored inside it, writing into
the run directory recorded there unless --run-dir names another. A CKPT.h5 that does not
load is refused, naming the sound checkpoints beside it. Given a run directory instead,
it resumes, as train does, from the newest sound checkpoint of the run in that directory
and in every replica (checkpoint.replicas), writing into that directory (docs/recovery.md).
A checkpoint saved on a GPU resumes on a CPU and the reverse. Signals, the run-directory
lock, "already complete" and exit statuses as for train.)";

// ---- the commands' options --------------------------------------------------------

void train_options(CLI::App* train, Commands& c) {
  train->add_option("CONFIG.json", c.train.config_path, "the training config")->required()->type_name("");
  add_run_options(train, c.train.run, "where to train (overrides the config's `device`)",
                  "where checkpoints and metrics.jsonl go (overrides checkpoint.dir)");
  train->add_flag("--fresh", c.train.fresh,
                  "ignore an existing last.h5 and start from scratch, moving the previous run's files aside");
  train->footer(kTrainFooter);
}

void resume_options(CLI::App* resume, Commands& c) {
  resume->add_option("CKPT.h5", c.resume.checkpoint,
                     "the checkpoint to continue from, or a run directory: its newest sound checkpoint")
      ->required()
      ->type_name("");
  add_run_options(resume, c.resume.run, "where to continue (default: the config's device)",
                  "where to write from now on (default: the stored checkpoint.dir)");
  resume->add_flag("--non-strict", c.resume.non_strict, "apply what matches; print missing/unexpected keys");
  resume->footer(kResumeFooter);
}

void eval_options(CLI::App* eval, Commands& c) {
  eval->add_option("CKPT.h5", c.eval.checkpoint, "the checkpoint to evaluate")->required()->type_name("");
  add_device_option(eval, c.eval.device, "where to evaluate (default auto)");
  eval->add_option("--data-dir", c.eval.data_dir, "dataset directory (default: the checkpoint's data.dir)")
      ->type_name("DIR");
  eval->add_option("--dump-logits", c.eval.dump_logits,
                   "write the test logits as float32 little-endian [N, classes]")
      ->type_name("FILE");
  eval->add_option("--limit", c.eval.limit, "evaluate only the first N test images (N >= 1)")
      ->type_name("N")
      ->check(CLI::Range(int64_t{1}, int64_t{INT64_MAX}).description(""));
  eval->footer("Exit status: 0 evaluated, 1 error, 2 usage.");
}

void inspect_options(CLI::App* inspect, Commands& c) {
  inspect->add_option("CKPT.h5", c.inspect_path, "the checkpoint")->required()->type_name("");
}

void verify_options(CLI::App* verify, Commands& c) {
  verify->add_option("CKPT.h5", c.verify_path, "the checkpoint")->required()->type_name("");
  verify->footer("Exit status: 0 only when the file is sound.");
}

void diff_options(CLI::App* diff, Commands& c) {
  diff->add_option("A.h5", c.diff_a, "the first checkpoint")->required()->type_name("");
  diff->add_option("B.h5", c.diff_b, "the second checkpoint")->required()->type_name("");
  diff->footer("Exit status: 0 identical, 1 different (or an error).");
}

void report_options(CLI::App* report, Commands& c) {
  report->add_option("RUN_DIR", c.report.run_dir, "the run directory")->required()->type_name("");
  report->add_option("-o,--output", c.report.output, "where to write (default RUN_DIR/report.html)")
      ->type_name("FILE");
  add_device_option(report, c.report.device, "where to evaluate best.h5 (default auto)");
  report->add_option("--data-dir", c.report.data_dir, "dataset directory (default: best.h5's data.dir)")
      ->type_name("DIR");
}

void export_options(CLI::App* c, Commands& cmds) {
  ExportOptionsCli& o = cmds.export_;
  c->add_option("CKPT.h5", o.checkpoint, "the checkpoint to export (any model, saved on any device)")
      ->required()
      ->type_name("");
  c->add_option("--format", o.format, "onnx: an inference graph (opset 13); safetensors: PyTorch's state_dict")
      ->required()
      ->type_name("onnx|safetensors")
      ->check(CLI::IsMember({"onnx", "safetensors"}));
  c->add_option("-o,--output", o.output, "the file to write (atomically)")->required()->type_name("FILE");
  c->add_option("--data-dir", o.data_dir, "dataset directory for the recorded test accuracy (default: the "
                                          "checkpoint's data.dir)")
      ->type_name("DIR");
  c->footer("The file carries the engine version, the source checkpoint's path and CRC-32, epoch, global "
            "step, the config's CRC-32, the test accuracy, the input normalisation, and probes: fixed inputs "
            "with the engine's logits and per-logit tolerances (engine verify-export checks them). Exit "
            "status: 0 written, 1 error, 2 usage.");
}

void verify_export_options(CLI::App* c, Commands& cmds) {
  c->add_option("FILE", cmds.verify_export_path, "an .onnx or .safetensors file written by engine export")
      ->required()
      ->type_name("");
  c->footer("Exit status: 0 when every probe's logits are within their tolerances, 1 otherwise.");
}

void no_options(CLI::App*, Commands&) {}

// ---- console -------------------------------------------------------------------------

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
  void on_message(const std::string& m) override {
    clear();
    // A warning names its rank and goes to stderr, which every rank keeps (the stdout
    // of ranks other than 0 is discarded).
    const std::string tag = RunSession::rank_tag();
    if (!tag.empty() && m.rfind("warning", 0) == 0) std::cerr << "engine: " + tag + m + "\n" << std::flush;
    else std::cout << m << std::endl;
    if (g_also) g_also->on_message(m);
  }
  void on_epoch_begin(int64_t epoch, int64_t epochs, int64_t steps) override {
    epoch_ = epoch;
    epochs_ = epochs;
    if (g_also) g_also->on_epoch_begin(epoch, epochs, steps);
  }
  void on_progress(const Progress& p) override {
    if (g_also) g_also->on_progress(p);
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
    if (g_also) g_also->on_epoch_end(m);
  }
  void on_step_end(int64_t global_step) override {
    if (g_also) g_also->on_step_end(global_step);
  }
  void on_checkpoint(const std::string& path, CheckpointKind kind) override {
    if (g_also) g_also->on_checkpoint(path, kind);
  }

 private:
  void clear() {
    if (bar_shown_) std::cout << "\r\033[K" << std::flush;
    bar_shown_ = false;
  }
  bool tty_;
  bool bar_shown_ = false;
  int64_t epoch_ = 0, epochs_ = 0;
};

void print_test(const EvalResult& t) {
  std::printf("test: loss %.4f  accuracy %.2f%% (%lld images)\n", t.loss, 100.0 * t.accuracy,
              static_cast<long long>(t.count));
}

// ---- signals -------------------------------------------------------------------------

// The run the signal handlers talk to (null until the trainer exists, and after fit()).
std::atomic<RunControl*> g_run{nullptr};

void on_stop_signal(int) {
  RunControl* run = g_run.load();
  // A second Ctrl-C (or nothing to save yet): out at once. Saves are atomic (temporary
  // file, fsync, rename), so last.h5 is still the last complete checkpoint. stdout is
  // line-buffered (main), so every line printed so far has reached a redirected log:
  // stdio's fflush is not async-signal-safe, so it cannot be called here.
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

// ---- config --------------------------------------------------------------------------

// config_from_json, plus model.name checked against the registry (the config layer
// sits below the models, so it cannot know them; a host may bring its own).
Config validate_config(const nlohmann::json& j, const std::string& origin) {
  Config cfg = config_from_json(j, origin);
  require_choice(origin, "model.name", cfg.model.name, model_names());
  return cfg;
}

bool valid(const nlohmann::json& j, const std::string& origin) {
  try {
    validate_config(j, origin);
    return true;
  } catch (const ConfigError&) {
    return false;
  }
}

// The config of `base` (a file's or a checkpoint's, named `origin`) with the command
// line's overrides. An error is blamed on where the bad value came from: the file, a
// --set, or --device/--run-dir.
Config resolve_config(const nlohmann::json& base, const std::string& origin, const RunOptions& o) {
  nlohmann::json with_sets = base;
  for (const std::string& s : o.sets) apply_override(with_sets, s);
  nlohmann::json with_all = with_sets;
  if (!o.device.empty()) with_all["device"] = o.device;
  if (!o.run_dir.empty()) with_all["checkpoint"]["dir"] = o.run_dir;
  try {
    return validate_config(with_all, origin);
  } catch (const ConfigError&) {
    if (!valid(base, origin)) throw;  // the file's own error, worded for the file
    if (!valid(with_sets, "--set")) validate_config(with_sets, "--set");
    validate_config(with_all, "--device/--run-dir");
    throw;
  }
}

// ---- train and resume ----------------------------------------------------------------

// Everything `train` and `resume` share once each has its config: the console, the
// signal handlers, restoring, "already complete", and the run's end. The job is the
// library's RunSession (engine/run/run_session.h): under mpirun/srun every rank builds one;
// rank 0 alone prints and owns the run directory (its lock, checkpoints, metrics), the
// other ranks train silently and write nothing (docs/distributed.md).
class TrainingSession {
 public:
  // The run directory's lock is taken here (rank 0), before the data is loaded, so that
  // a second writer is refused at once.
  TrainingSession(Config cfg, const RunOptions& o)
      : opts_(o), session_(std::move(cfg), RunSessionOptions{/*quiet_other_ranks=*/true}) {
    install_signal_handlers();
  }

  // Rank 0, or the only process.
  bool writes_run_dir() const { return session_.writes_run_dir(); }

  Trainer& start() {
    Trainer& t = session_.start(make_model(session_.config()), &observer_);
    if (session_.size() > 1)
      std::cout << "data-parallel on " << session_.size() << " ranks (" << session_.collective().name()
                << (session_.collective().one_host() ? ", one host" : ", several hosts") << ")\n";
    return t;
  }

  // Ranks started with another config, build, data or checkpoint than rank 0 are refused
  // by every rank (exit 2) before anything is trained (docs/distributed.md "Faults").
  void require_same_start(const std::string& checkpoint) {
    if (session_.size() == 1) return;
    try {
      print_agreement(session_.agree_on_start(checkpoint), checkpoint);
    } catch (const StartMismatchError& e) {
      refuse_mismatch(e);
    }
  }

  // `engine train`: the library's recovery on start (RunSession::begin, docs/recovery.md):
  // --fresh, or the newest sound checkpoint of every tier, the repairs, "already complete".
  void begin(StartFrom from) {
    RunBegin b;
    try {
      b = session_.begin({from, opts_.reevaluate});
    } catch (const StartMismatchError& e) {
      refuse_mismatch(e);
    }
    if (b.agreement) print_agreement(*b.agreement, b.checkpoint);
    print_header();
    for (const std::string& line : b.messages) observer_.on_message(line);
    print_load_report(b.load_report);
    already_complete_ = b.outcome == RunBegin::Outcome::AlreadyComplete;
  }

  void print_header() {
    Trainer& t = session_.trainer();
    const Config& cfg = session_.config();
    std::cout << "training " << cfg.model.name << " (" << t.model().parameter_count() << " parameters) on "
              << session_.device().str() << ", run dir " << cfg.checkpoint.dir << "\n";
  }

  static void print_agreement(const StartAgreement& a, const std::string& checkpoint) {
    std::cout << "ranks agree on config, build, data (" << a.data_bytes / 1000000.0 << " MB) and "
              << (checkpoint.empty() ? "starting fresh" : "checkpoint") << " (hashing " << std::fixed
              << std::setprecision(1) << a.hash_ms << " ms, test split read early " << a.test_load_ms
              << " ms, exchange " << a.exchange_ms << " ms)\n"
              << std::defaultfloat;
  }

  [[noreturn]] static void refuse_mismatch(const StartMismatchError& e) {
    // Every rank knows: each says so and exits, no abort needed.
    std::cout << std::flush;
    std::cerr << "engine: " + RunSession::rank_tag() + e.what() + "\n" << std::flush;
    std::exit(kExitUsage);
  }

  const Config& config() const { return session_.config(); }
  Device device() const { return session_.device(); }

  static void print_load_report(const StateReport& r) {
    if (r.clean()) return;
    std::cout << "non-strict load: " << r.summary() << "\n" << r.str();
  }

  // After an explicit restore (engine resume FILE): the library's "already complete".
  void check_complete() { already_complete_ = !opts_.reevaluate && session_.already_complete(); }

  int run() {
    const Config& cfg = session_.config();
    Trainer& t = session_.trainer();
    if (already_complete_) {
      std::cout << "already complete: " << t.epochs_done() << " epoch(s) trained and the test set evaluated"
                << " (see " << (fs::path(cfg.checkpoint.dir) / run_files::kMetrics).string()
                << "); nothing to do (--reevaluate evaluates the test set again, --set "
                   "train.epochs=N trains on)\n";
      return 0;
    }
    StopPlan stop;
    stop.after_epochs = opts_.stop_after_epochs;
    stop.time_limit_seconds = opts_.time_limit;
    stop.time_limit_from = g_process_start;
    g_run.store(&t.control());
    FitResult r;
    try {
      r = session_.fit(stop);  // rank 0 through the run directory, the other ranks write nothing
    } catch (const CheckpointWriteError& e) {
      // checkpoint.on_error = stop: the previous checkpoint is intact, so the same command
      // resumes from it once the disk is fixed.
      g_run.store(nullptr);
      fail(std::string(e.what()) + "; training stopped (checkpoint.on_error = stop), the previous checkpoint is intact",
           kExitSaveFailed);
    }
    g_run.store(nullptr);
    if (r.ending == FitResult::Ending::Stopped) {
      std::cout << "stopped after " << t.epochs_done() << " epoch(s), step " << t.global_step()
                << "; checkpoint in " << cfg.checkpoint.dir << "/last.h5\n";
      switch (r.stop_cause) {
        case FitResult::StopCause::Requested: return kExitInterrupted;
        case FitResult::StopCause::TimeLimit: return kExitTimeLimit;
        default: return 0;
      }
    }
    if (r.test) print_test(*r.test);
    return 0;
  }

 private:
  RunOptions opts_;
  ConsoleObserver observer_;  // before session_: the trainer it holds reports to it
  RunSession session_;
  bool already_complete_ = false;
};

int cmd_train(const TrainOptions& a) {
  const std::string& path = a.config_path;
  std::ifstream in(path);
  if (!in || fs::is_directory(path)) load_config(path);  // words the error (missing, a directory)
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception&) {
    load_config(path);  // words the error with line and column
  }
  TrainingSession session(resolve_config(j, path, a.run), a.run);
  session.start();
  // --fresh moves the previous run's files aside (nothing is destroyed); otherwise the
  // newest sound checkpoint of every tier is resumed from (docs/recovery.md).
  session.begin(a.fresh ? StartFrom::Scratch : StartFrom::Newest);
  return session.run();
}

// `engine resume RUN_DIR`: the run of the newest sound checkpoint in RUN_DIR, with every
// tier its config names, as `engine train` resumes it.
int resume_run_dir(const ResumeOptions& a) {
  const std::string& dir = a.checkpoint;
  const std::vector<CheckpointCopy> copies = survey_directory(dir);
  if (copies.empty() || copies.front().verdict != CopyVerdict::Sound) {
    std::string tried;
    for (const CheckpointCopy& c : copies) tried += (tried.empty() ? "" : ", ") + c.path + " (" + c.reason + ")";
    fail(dir + ": no sound checkpoint to resume from" + (tried.empty() ? " (the directory holds none)" : "; tried " + tried));
  }
  const std::string& newest = copies.front().path;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(load_checkpoint(newest).config_json);
  } catch (const nlohmann::json::exception&) {
    fail(newest + ": the stored config is not valid JSON");
  }
  RunOptions run = a.run;
  if (run.run_dir.empty()) run.run_dir = dir;  // the directory named, wherever the run was first
  TrainingSession session(resolve_config(j, newest + " (stored config)", run), run);
  session.start();
  session.begin(StartFrom::Newest);
  return session.run();
}

int cmd_resume(const ResumeOptions& a) {
  const std::string& path = a.checkpoint;
  if (fs::is_directory(path)) return resume_run_dir(a);
  Checkpoint ckpt;
  try {
    ckpt = load_checkpoint(path);
  } catch (const CheckpointError& e) {
    // The user asked for this file: refused, but the sound ones beside it are named.
    fail(std::string(e.what()) + sound_alternatives(path));
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ckpt.config_json);
  } catch (const std::exception&) {
    fail(path + ": the stored config is not valid JSON");
  }
  TrainingSession session(resolve_config(j, path + " (stored config)", a.run), a.run);
  Trainer& trainer = session.start();
  session.require_same_start(path);
  StateReport r;
  try {
    r = trainer.restore(ckpt, a.non_strict ? LoadMode::NonStrict : LoadMode::Strict);
  } catch (const std::exception& e) {
    fail(path + ": " + e.what());
  }
  TrainingSession::print_load_report(r);
  std::cout << "resuming from epoch " << trainer.epochs_done() << " (saved on " << ckpt.meta.saved_on
            << ", now on " << session.device().str() << "), run dir " << session.config().checkpoint.dir << "\n";
  session.check_complete();
  return session.run();
}

// ---- eval ----------------------------------------------------------------------------

int cmd_eval(const EvalOptions& a) {
  const std::string& path = a.checkpoint;
  const Device device = resolve_device(a.device);
  const Classifier clf(path, device, make_model);
  DataConfig data = clf.config().data;
  if (!a.data_dir.empty()) data.dir = a.data_dir;
  if (a.limit) data.test_limit = *a.limit;
  const std::unique_ptr<Dataset> dataset = make_dataset(data, Device::cpu());
  const SplitData& test = dataset->get(Split::Test);
  const Predictions p = clf.predict(test.images.u8(), test.count, Scores::Logits);
  const EvalResult t = score_logits(p, test.labels.u8());
  // The counters for the header line (the classifier keeps only the model).
  const Checkpoint ckpt = load_checkpoint(path);
  std::cout << "checkpoint " << path << " (epoch " << ckpt.groups.at("trainer").get_int("epoch")
            << ", saved on " << ckpt.meta.saved_on << "), evaluated on " << device.str() << "\n";
  print_test(t);
  std::cout << "confusion matrix (rows: true class, columns: predicted):\n";
  for (const std::vector<int64_t>& row : t.confusion) {
    for (const int64_t count : row) std::cout << std::setw(6) << count;
    std::cout << "\n";
  }
  if (!a.dump_logits.empty()) {
    std::ofstream out(a.dump_logits, std::ios::binary);
    out.write(reinterpret_cast<const char*>(p.scores.data()),
              static_cast<std::streamsize>(p.scores.size() * sizeof(float)));
    if (!out) fail(a.dump_logits + ": cannot write logits");
    std::cout << "logits [" << p.count << ", " << p.classes << "] written to " << a.dump_logits << "\n";
  }
  return 0;
}

// ---- export ----------------------------------------------------------------------------

std::string with_thousands(int64_t v) {
  std::string digits = std::to_string(v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

int cmd_export(const ExportOptionsCli& a) {
  const auto start = std::chrono::steady_clock::now();
  ExportOptions options;
  options.data_dir = a.data_dir;
  const ExportSummary s = export_checkpoint(a.checkpoint, parse_export_format(a.format), a.output, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::ostringstream o;
  o << std::fixed << std::setprecision(2) << "exported " << s.model << " (" << with_thousands(s.parameters)
    << " parameters) of " << a.checkpoint << " (epoch " << s.metadata.at("epoch") << ", step "
    << s.metadata.at("global_step") << ") to " << s.path << ": " << to_string(s.format)
    << (s.format == ExportFormat::Onnx ? " opset " + std::to_string(kExportOnnxOpset) : std::string()) << ", "
    << with_thousands(static_cast<int64_t>(s.bytes)) << " bytes, test accuracy " << 100 * s.test_accuracy << " % on "
    << s.test_count << " images, " << kExportProbes << " probes (tolerance <= " << std::setprecision(3)
    << std::scientific << s.max_tolerance << "), " << std::fixed << std::setprecision(2) << seconds << " s\n";
  std::cout << o.str();
  return 0;
}

int cmd_verify_export(const std::string& path) {
  const ExportCheck c = verify_export(path);
  std::ostringstream o;
  o << path << ": OK (" << to_string(c.format) << ", " << c.model << ", " << c.probes << " probes x " << c.classes
    << " logits within their tolerances: max |diff| " << std::setprecision(3) << c.max_abs_diff << ", at most "
    << std::fixed << std::setprecision(1) << 100 * c.worst_fraction << " % of a tolerance; tolerances "
    << std::scientific << std::setprecision(2) << c.min_tolerance << " to " << c.max_tolerance << ")\n";
  std::cout << o.str();
  return 0;
}

// ---- the others ----------------------------------------------------------------------

int cmd_diff(const std::string& a, const std::string& b) {
  const CheckpointDiff d = diff_checkpoints(a, b);
  std::cout << d.report;
  std::cout << (d.identical ? "identical\n" : "different\n");
  return d.identical ? 0 : 1;
}

int cmd_report(const ReportCliOptions& a) {
  ReportOptions opt;
  opt.make_model = [](const Config& c) { return make_model(c); };
  opt.output = a.output;
  if (!a.device.empty()) opt.device = a.device;
  opt.data_dir = a.data_dir;
  const ReportSummary r = write_run_report(a.run_dir, opt);
  for (const std::string& n : r.notes) std::cerr << "engine: note: " << n << "\n";
  std::cout << "report of " << r.epochs << " epoch(s) written to " << r.path << "\n";
  return 0;
}

// `engine --version`: the build's components, then the collectives it can run ranks with.
std::string version_text() {
  std::string out = to_string(build_info());
  out += "mpi: " + (mpi_built() ? mpi_library_version() : std::string("not built (one process only)")) + "\n";
  if (!nccl_built()) {
    out += "nccl: not built (CUDA ranks exchange through MPI)\n";
  } else {
    const std::string v = nccl_version();  // opened at run time: may be missing here
    out += "nccl: " + (v.empty() ? std::string("built, but libnccl.so.2 does not load here") : v) + "\n";
  }
  out += "checkpoint parser: " + checkpoint_parser_confinement().summary + "\n";
  return out;
}

// ---- the commands --------------------------------------------------------------------

// docs/config.md's key tables, one per top-level section, in the table's order.
int cmd_keys() {
  std::string section = "-";
  for (const ConfigKeyInfo& k : config_keys()) {
    const auto dot = k.dotted.find('.');
    const std::string s = dot == std::string::npos ? "" : k.dotted.substr(0, dot);
    if (s != section) {
      std::cout << (section == "-" ? "" : "\n") << "### " << (s.empty() ? "Top level" : "`" + s + "`")
                << "\n\n| Key | Type | Default | Valid | Meaning |\n|---|---|---|---|---|\n";
      section = s;
    }
    std::cout << to_markdown_row(k) << "\n";
  }
  return 0;
}

// Whether a command forks the checkpoint parser (io/hdf5_sandbox.h) before it runs:
// while the process is still small, since it will load checkpoints.
enum class ParsesCheckpoints { No, Yes };

struct Command {
  const char* name;
  const char* summary;  // the first line of its --help
  ParsesCheckpoints parser;
  void (*options)(CLI::App*, Commands&);
  int (*run)(const Commands&);
};

// What the program does: one row per command, in the order of engine --help.
const Command kCommands[] = {
    {"train", "Trains the model described by CONFIG.json (see docs/config.md).", ParsesCheckpoints::Yes,
     train_options, [](const Commands& c) { return cmd_train(c.train); }},
    {"resume", "Continues the run recorded in a checkpoint.", ParsesCheckpoints::Yes, resume_options,
     [](const Commands& c) { return cmd_resume(c.resume); }},
    {"eval", "Evaluates the model of a checkpoint on the test set: loss, accuracy, confusion matrix.",
     ParsesCheckpoints::Yes, eval_options, [](const Commands& c) { return cmd_eval(c.eval); }},
    {"inspect",
     "Human summary of a checkpoint: version, saved_on, counters, every tensor with dtype, shape and norm.",
     ParsesCheckpoints::No, inspect_options,
     [](const Commands& c) {
       std::cout << inspect_checkpoint(c.inspect_path);
       return 0;
     }},
    {"verify", "Integrity and structure check of a checkpoint: checksum and structure.", ParsesCheckpoints::No,
     verify_options,
     [](const Commands& c) {
       verify_checkpoint_file(c.verify_path);
       std::cout << c.verify_path << ": OK\n";
       // A sound verdict from a parser that ran unconfined is still sound, but the user
       // is told the file was parsed with less protection than docs/security.md describes.
       const CheckpointParserConfinement parser = checkpoint_parser_confinement();
       if (!parser.seccomp_filter)
         std::cerr << "engine: warning: " << c.verify_path << " was parsed without the parser's seccomp filter ("
                   << parser.reason << "); ENGINE_PARSER_SECCOMP=require refuses instead (docs/security.md)\n";
       return 0;
     }},
    {"diff", "Compares two checkpoints tensor by tensor, scalar by scalar.", ParsesCheckpoints::No, diff_options,
     [](const Commands& c) { return cmd_diff(c.diff_a, c.diff_b); }},
    {"report",
     "Writes one self-contained HTML file (no network, no scripts) of a run: loss, accuracy, "
     "learning-rate and loss-scale curves per epoch (from RUN_DIR/metrics.jsonl, else the "
     "metrics of RUN_DIR/last.h5), the confusion matrix of best.h5 on the test set, the "
     "run's config, and the checkpoints present with their epoch, size and integrity.",
     ParsesCheckpoints::No, report_options, [](const Commands& c) { return cmd_report(c.report); }},
    {"export",
     "Writes the model of a checkpoint as an ONNX inference graph or a safetensors file of PyTorch's "
     "state_dict, with its metadata and self-test probes (docs/export.md).",
     ParsesCheckpoints::Yes, export_options, [](const Commands& c) { return cmd_export(c.export_); }},
    {"verify-export",
     "Runs an export's self-test: rebuilds the model from the file, runs its probe inputs through the "
     "engine's CPU kernels and checks the logits against the recorded ones within their tolerances.",
     ParsesCheckpoints::No, verify_export_options,
     [](const Commands& c) { return cmd_verify_export(c.verify_export_path); }},
    {"version", "The engine's version, its libraries' and the GPU's.", ParsesCheckpoints::No, no_options,
     [](const Commands&) {
       std::cout << version_text();
       return 0;
     }},
    {"keys",
     "Every config key as docs/config.md's tables give it (markdown): key, type, default, valid values, "
     "meaning; the tables are generated from the engine's key table.",
     ParsesCheckpoints::No, no_options, [](const Commands&) { return cmd_keys(); }},
};

const Command* find_command(const std::string& name) {
  for (const Command& c : kCommands)
    if (name == c.name) return &c;
  return nullptr;
}

void build_commands(CLI::App& app, Commands& c) {
  app.formatter(make_formatter());
  app.require_subcommand(1);
  app.set_help_flag("-h,--help", "print this help and exit");  // copied by each command
  for (const Command& cmd : kCommands) {
    CLI::App* sub = app.add_subcommand(cmd.name, cmd.summary);
    cmd.options(sub, c);
    sub->formatter(make_formatter());
  }
  app.set_help_flag();  // after the subcommands, which copy it; main prints kMainHelp itself
}

// The subcommand being parsed when CLI11 threw (for the message), or null at the top.
const CLI::App* deepest_parsed(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) return sub;
  return nullptr;
}

}  // namespace

int engine::cli::run(int argc, char** argv, TrainerObserver* also) {
  g_also = also;
  // Tensor buffers of 1 MiB and more get their own mappings and go back to the OS when
  // freed (glibc would otherwise raise this threshold and keep them in the heap).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  // Line by line even into a file or a pipe: a process that ends at once (a second
  // Ctrl-C, _exit) must not lose the lines it printed (the header, the epochs).
  std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);
  if (argc < 2) {
    std::cerr << kMainHelp;
    return kExitUsage;
  }
  const std::string first = argv[1];
  if (first == "-h" || first == "--help" || first == "help") {
    std::cout << kMainHelp;
    return 0;
  }
  // ENGINE_CPU_KERNELS forcing a path this CPU lacks: refused before anything runs (an
  // illegal instruction later would be a crash, not an error).
  try {
    (void)cpu_kernels_in_use();
  } catch (const std::runtime_error& e) {
    fail(e.what(), kExitUsage);
  }
  if (first == "--version") {
    std::cout << version_text();
    return 0;
  }

  if (!find_command(first)) fail("unknown command '" + first + "' (see engine --help)", kExitUsage);
  CLI::App app{"", "engine"};
  Commands c;
  build_commands(app, c);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    const CLI::App* sub = deepest_parsed(app);
    std::cout << (sub ? sub->help("engine") : std::string(kMainHelp));
    return 0;
  } catch (const CLI::ParseError& e) {
    const CLI::App* sub = deepest_parsed(app);
    const std::string cmd = sub ? sub->get_name() : first;
    fail(cmd + ": " + e.what() + " (see engine " + cmd + " --help)", kExitUsage);
  }

  const Command& cmd = *find_command(deepest_parsed(app)->get_name());
  try {
    if (cmd.parser == ParsesCheckpoints::Yes) start_checkpoint_parser();
    return cmd.run(c);
  } catch (const std::exception& e) {
    fail(e.what());
  }
}
