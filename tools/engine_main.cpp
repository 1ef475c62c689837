// The `engine` command line: a thin layer over the library (engine/trainer.h,
// engine/checkpoint.h). Every error is one line on stderr and a non-zero exit.
#include <malloc.h>
#include <unistd.h>

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

#include "engine/trainer.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/idx.h"

namespace fs = std::filesystem;
using namespace engine;

namespace {

const char* kMainHelp = R"(engine: trains the Fashion-MNIST CNN and never loses a run.

usage: engine <command> [options]

commands:
  train CONFIG.json      train from a config; resumes from <run-dir>/last.h5 when it exists
  resume CKPT.h5         continue the run recorded in a checkpoint (its config is inside)
  eval CKPT.h5           test loss, accuracy and confusion matrix of a checkpoint
  inspect CKPT.h5        human summary of a checkpoint
  verify CKPT.h5         integrity and structure check (exit 0 only when sound)
  diff A.h5 B.h5         compare two checkpoints tensor by tensor (exit 0 when identical)

Run `engine <command> --help` for the options of a command.
)";

const char* kTrainHelp = R"(usage: engine train CONFIG.json [options]

Trains the model described by CONFIG.json (see docs/config.md). If the run directory
already holds last.h5, training resumes from it ("resuming from epoch N"); --fresh
starts over. Ctrl-C or SIGTERM stops after the current step and writes last.h5 first.

options:
  --device cpu|cuda|cuda:N|auto   where to train (overrides the config's `device`)
  --run-dir DIR                   where checkpoints, metrics.jsonl go (overrides checkpoint.dir)
  --set KEY=VALUE                 override any config key, dotted (repeatable), e.g.
                                  --set train.epochs=3 --set data.train_limit=2000
  --fresh                         ignore an existing last.h5 and start from scratch
  --stop-after-epochs K           stop cleanly once K epochs are complete (resume later)
  --kill-after-steps N            testing aid: SIGKILL itself right after global step N
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
  --stop-after-epochs K, --kill-after-steps N   as for train
  -h, --help                      this help
)";

const char* kEvalHelp = R"(usage: engine eval CKPT.h5 [options]

Evaluates the model of a checkpoint on the test set: loss, accuracy, confusion matrix.

options:
  --device cpu|cuda|cuda:N|auto   where to evaluate (default auto)
  --data-dir DIR                  dataset directory (default: the checkpoint's data.dir)
  --dump-logits FILE              write the test logits as float32 little-endian [N,10]
  --limit N                       evaluate only the first N test images
  -h, --help                      this help
)";

struct Args {
  std::vector<std::string> positional;
  std::vector<std::string> sets;
  std::string device, run_dir, dump_logits, data_dir;
  bool fresh = false, non_strict = false, help = false;
  std::optional<int64_t> stop_after_epochs, kill_after_steps, limit;
};

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
    else if (s == "--limit") a.limit = parse_int(s, value(s));
    else if (s == "--stop-after-epochs") a.stop_after_epochs = parse_int(s, value(s));
    else if (s == "--kill-after-steps") a.kill_after_steps = parse_int(s, value(s));
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

void on_signal(int) { request_stop(); }

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
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
  install_stop_handlers();
  StopPlan stop;
  stop.after_epochs = a.stop_after_epochs;
  stop.kill_after_steps = a.kill_after_steps;
  const FitResult r = trainer.fit(stop);
  if (r.ending == FitResult::Ending::Stopped) {
    std::cout << "stopped after " << trainer.epochs_done() << " epoch(s), step "
              << trainer.global_step() << "; checkpoint in " << trainer.config().checkpoint.dir
              << "/last.h5\n";
    return stop_requested() ? 130 : 0;
  }
  if (r.test) print_test(*r.test);
  return 0;
}

nlohmann::json apply_sets(nlohmann::json j, const std::vector<std::string>& sets) {
  for (const std::string& s : sets) apply_override(j, s);
  return j;
}

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
  const Device device = resolve_device(cfg.device);
  ConsoleObserver obs;
  const std::string last = (fs::path(cfg.checkpoint.dir) / "last.h5").string();
  const bool resume = !a.fresh && fs::exists(last);
  Trainer trainer(cfg, device, &obs);
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
  ConsoleObserver obs;
  Trainer trainer(cfg, device, &obs);
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
  Trainer trainer(cfg, device, nullptr, SplitsNeeded::TestOnly);
  FashionCnn& model = trainer.model();
  const StateReport r = compare_state(model.state(), ckpt.groups.at("model"));
  if (!r.clean()) fail(path + ": model state does not match: " + r.summary());
  model.load_state(ckpt.groups.at("model"));
  const EvalResult t = trainer.evaluate(Split::Test);
  std::cout << "checkpoint " << path << " (epoch " << ckpt.groups.at("trainer").get_int("epoch")
            << ", saved on " << ckpt.meta.saved_on << "), evaluated on " << device.str() << "\n";
  print_test(t);
  std::cout << "confusion matrix (rows: true class, columns: predicted):\n";
  for (int i = 0; i < 10; ++i) {
    for (int k = 0; k < 10; ++k) std::cout << std::setw(6) << t.confusion[i][k];
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
    fail("unknown command '" + cmd + "' (see engine --help)", 2);
  } catch (const std::exception& e) {
    fail(e.what());
  }
}
