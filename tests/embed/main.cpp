// A host program that embeds the engine through its installed package: it builds its
// Config in code, trains one epoch on a subset with its own observer, registers state of
// its own (a Stateful) as a checkpoint group next to the trainer's, reloads everything
// with strict reports, checks that every bit came back, and evaluates.
//
//   embed RUN_DIR [--device cpu|cuda|auto] [--data DIR]
//
// Exit status 0 when every check passes, 1 otherwise (each failure is printed).
#include <engine/io/checkpoint.h>
#include <engine/train/config.h>
#include <engine/core/device.h>
#include <engine/train/model_factory.h>
#include <engine/core/state.h>
#include <engine/run/run_directory.h>
#include <engine/train/trainer.h>
#include <nlohmann/json.hpp>  // config_to_json returns a json by value

#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace engine;

namespace {

int g_failures = 0;

void check(bool ok, const std::string& what) {
  std::cout << (ok ? "ok:   " : "FAIL: ") << what << "\n";
  if (!ok) ++g_failures;
}

// What the host sees of the run, through the observer interface.
class HostObserver : public TrainerObserver {
 public:
  void on_epoch_begin(int64_t, int64_t, int64_t steps) override {
    ++epochs_begun;
    steps_per_epoch = steps;
  }
  void on_progress(const Progress& p) override { last_progress_step = p.step; }
  void on_epoch_end(const EpochMetrics& m) override {
    ended.push_back(m);
    std::printf("epoch %lld: train_loss %.4f  val_loss %.4f  val_acc %.2f%%\n",
                static_cast<long long>(m.epoch), m.train_loss, m.val_loss, 100.0 * m.val_acc);
  }
  void on_checkpoint(const std::string& path, CheckpointKind kind) override {
    checkpoints[checkpoint_kind_name(kind)] = path;
  }

  int64_t epochs_begun = 0, steps_per_epoch = 0, last_progress_step = -1;
  std::vector<EpochMetrics> ended;
  std::map<std::string, std::string> checkpoints;  // kind -> path
};

// The host's own state: a counter, a label, a history and a tensor, saved as the group
// "host" through the same interface as the engine's components.
class HostState : public Stateful {
 public:
  int64_t runs = 0;
  std::string label;
  std::vector<double> val_acc_history;
  Tensor class_weights = Tensor::zeros({10});

  StateDict state() const override {
    StateDict d;
    d.scalars["runs"] = runs;
    d.scalars["label"] = label;
    d.scalars["val_acc_history"] = val_acc_history;
    d.tensors["class_weights"] = class_weights;
    return d;
  }
  void load_state(const StateDict& in) override {
    runs = in.get_int("runs");
    label = in.get_string("label");
    val_acc_history = in.get_series("val_acc_history");
    class_weights.copy_from(in.get_tensor("class_weights"));
  }
};

std::string clean_or_summary(const StateReport& r) {
  return r.clean() ? "(clean)" : "(" + r.summary() + ")";
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  return std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

// Every tensor and scalar of `a` equals its namesake in `b`, bit for bit.
bool same_state(const StateDict& a, const StateDict& b) {
  if (!compare_state(a, b).clean()) return false;
  for (const auto& [key, t] : a.tensors)
    if (!same_bits(t, b.tensors.at(key))) return false;
  for (const auto& [key, s] : a.scalars)
    if (s != b.scalars.at(key)) return false;
  return true;
}

bool same_training_state(Trainer& a, Trainer& b) {
  const Checkpoint x = a.snapshot(), y = b.snapshot();
  if (x.groups.size() != y.groups.size()) return false;
  for (const auto& [name, group] : x.groups) {
    if (!y.groups.count(name)) return false;
    if (!same_state(group, y.groups.at(name))) {
      std::cout << "      group " << name << " differs\n";
      return false;
    }
  }
  return true;
}

Config make_config(const std::string& run_dir, const std::string& device, const std::string& data) {
  Config cfg;
  cfg.seed = 20240501;
  cfg.device = device;
  if (!data.empty()) cfg.data.dir = data;
  cfg.data.train_limit = 512;
  cfg.data.val_split = 256;
  cfg.data.test_limit = 512;
  cfg.data.batch_size = 32;
  cfg.train.epochs = 1;
  cfg.checkpoint.dir = run_dir;
  cfg.checkpoint.every_n_epochs.reset();
  // Validate it like a config file would be (throws ConfigError naming the key).
  return config_from_json(config_to_json(cfg), "embed (config built in code)");
}

int run(const std::string& run_dir, const std::string& device_name, const std::string& data) {
  const Config cfg = make_config(run_dir, device_name, data);
  const Device device = resolve_device(cfg.device);
  std::cout << "engine embedded: CUDA backend " << (cuda_built() ? "built" : "not built")
            << ", training on " << device.str() << ", run dir " << run_dir << "\n";

  // 1. The host's own state, registered as the checkpoint group "host" before training:
  // every checkpoint the trainer writes holds it from then on.
  HostState host;
  host.runs = 1;
  host.label = "embedded run";
  {
    std::vector<float> w(10);
    for (int c = 0; c < 10; ++c) w[c] = 0.1f * static_cast<float>(c) + 1.0f / 3.0f;
    host.class_weights = Tensor::from_vector({10}, w);
  }

  // 2. Train one epoch with the host's own observer.
  HostObserver obs;
  TrainerOptions options;
  options.observer = &obs;
  Trainer trainer(cfg, device, make_model(cfg), std::move(options));
  trainer.add_state_group("host", &host);
  RunDirectory run(trainer);  // run_dir's checkpoints, metrics.jsonl and lock
  const FitResult fit = run.fit();
  for (const EpochMetrics& m : obs.ended) host.val_acc_history.push_back(m.val_acc);
  check(fit.ending == FitResult::Ending::Completed, "fit() completed");
  check(trainer.epochs_done() == 1 && obs.epochs_begun == 1 && obs.ended.size() == 1,
        "one epoch trained, observed once at its start and once at its end");
  check(obs.steps_per_epoch == 512 / 32 && trainer.global_step() == obs.steps_per_epoch,
        "16 steps of 32 images (train_limit 512)");
  check(!obs.ended.empty() && std::isfinite(obs.ended[0].train_loss) &&
            obs.ended[0].train_loss > 0 && obs.ended[0].val_acc > 0,
        "the epoch's metrics are finite");
  check(obs.checkpoints.count("last") == 1 && fs::exists(obs.checkpoints["last"]),
        "the observer saw last.h5 written");
  check(fit.test.has_value() && fit.test->count == 512, "fit() evaluated 512 test images");
  if (!fit.test) return 1;
  // Chance is 10%; one epoch on 512 images lands far above it.
  check(fit.test->accuracy > 0.3, "test accuracy " + std::to_string(fit.test->accuracy) + " > 0.3");

  // 3. The host saves the whole state itself (written atomically, reloaded and verified).
  const std::string path = (fs::path(run_dir) / "embed.h5").string();
  trainer.save_checkpoint(path);
  verify_checkpoint_file(path);
  check(load_checkpoint(path).groups.count("host") == 1, "saved and verified " + path + " with the group \"host\"");

  // 4. A trainer that does not know the group refuses it strictly, naming it.
  {
    Trainer stranger(cfg, device, make_model(cfg));
    bool refused = false;
    try {
      stranger.resume_from(path, LoadMode::Strict);
    } catch (const std::exception& e) {
      refused = std::string(e.what()).find("host/") != std::string::npos;
      std::cout << "      strict restore without the host group registered: " << e.what() << "\n";
    }
    check(refused && stranger.epochs_done() == 0,
          "a strict restore that meets a group the trainer does not know refuses, naming it, and changes nothing");
  }

  // 5. A fresh trainer and a fresh host state, registered, reloaded strictly.
  Trainer restored(cfg, device, make_model(cfg));
  HostState host_back;
  restored.add_state_group("host", &host_back);
  const StateReport report = restored.resume_from(path, LoadMode::Strict);
  check(report.clean(), "strict report for the trainer and host state " + clean_or_summary(report));
  check(same_state(host.state(), host_back.state()), "the host state came back bit for bit");
  check(host_back.runs == 1 && host_back.label == "embedded run" &&
            host_back.val_acc_history.size() == 1,
        "host counters, label and history came back");
  check(restored.epochs_done() == 1 && restored.global_step() == trainer.global_step(),
        "epoch and step counters came back");
  check(same_training_state(trainer, restored), "every group came back bit for bit");

  // 6. The checkpoint fit() wrote itself (last.h5 holds "host" too), through resume_from.
  Trainer resumed(cfg, device, make_model(cfg));
  HostState host_last;
  resumed.add_state_group("host", &host_last);
  const StateReport last_report = resumed.resume_from(obs.checkpoints["last"], LoadMode::Strict);
  check(last_report.clean(), "resume_from(last.h5, Strict) report " + clean_or_summary(last_report));
  check(host_last.runs == 1 && host_last.label == "embedded run", "last.h5 holds the host group");

  // 7. Evaluate the reloaded model: the same numbers as at the end of fit().
  const EvalResult eval = restored.evaluate(Split::Test);
  std::printf("test after reload: loss %.6f  accuracy %.4f (%lld images)\n", eval.loss,
              eval.accuracy, static_cast<long long>(eval.count));
  check(eval.count == fit.test->count && eval.loss == fit.test->loss &&
            eval.accuracy == fit.test->accuracy && eval.confusion == fit.test->confusion,
        "the reloaded model evaluates exactly as the trained one");
  int64_t total = 0;
  for (const auto& row : eval.confusion)
    for (int64_t n : row) total += n;
  check(total == eval.count, "the confusion matrix counts every test image");
  return g_failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string run_dir, device = "cpu", data;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--device" || a == "--data") && i + 1 < argc) {
      (a == "--device" ? device : data) = argv[++i];
    } else if (run_dir.empty() && !a.empty() && a[0] != '-') {
      run_dir = a;
    } else {
      std::cerr << "usage: embed RUN_DIR [--device cpu|cuda|auto] [--data DIR]\n";
      return 2;
    }
  }
  if (run_dir.empty()) {
    std::cerr << "usage: embed RUN_DIR [--device cpu|cuda|auto] [--data DIR]\n";
    return 2;
  }
  try {
    const int rc = run(run_dir, device, data);
    std::cout << (rc == 0 ? "embed: all checks passed\n" : "embed: FAILED\n");
    return rc;
  } catch (const std::exception& e) {
    std::cerr << "embed: error: " << e.what() << "\n";
    return 1;
  }
}
