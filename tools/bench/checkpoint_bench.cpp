// Times save_checkpoint and load_checkpoint on a real training state of the default
// config, for comparison with torch.save/torch.load (tools/bench/torch_checkpoint.py;
// tools/bench/checkpoint_io.sh runs both).
//
//   checkpoint_bench [--reps N] [--dir DIR] [--config PATH] [--set KEY=VALUE]... [--json]
//
// The state: a CPU Trainer of configs/mnist.json (needs the Fashion-MNIST files) after
// one AdamW step, taken the way a Ctrl-C takes it (control().request_stop(), then fit runs one step
// and stops): model, optimizer moments (step 1), scheduler, scaler, RNG, counters with
// the per-sample loss buffer of the epoch (55000 floats with the full split), metrics.
// Trainer::snapshot() is taken once; then save_checkpoint (temporary file, fsync,
// rename, directory fsync) and load_checkpoint (checksum, structure, read) are each
// timed N times (after one untimed warm-up) into DIR/bench.h5. Prints median, min and
// mean in milliseconds and the file size; --json prints one JSON line instead.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "engine/train/model_factory.h"
#include "engine/run/run_directory.h"
#include "engine/train/trainer.h"
#include "engine/io/checkpoint.h"
#include "engine/train/config.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "checkpoint_bench: %s\n", msg.c_str());
  std::exit(1);
}

struct Stats {
  double median = 0, min = 0, mean = 0;
};

Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Stats s;
  const std::size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  s.min = v.front();
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(n);
  return s;
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  bool json_out = false;
  std::string dir, config_path;
  std::vector<std::string> sets;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--reps") {
      const std::string v = value();
      reps = std::atoi(v.c_str());
      if (reps < 1) die("--reps must be a positive integer, got '" + v + "'");
    } else if (a == "--dir") {
      dir = value();
    } else if (a == "--config") {
      config_path = value();
    } else if (a == "--set") {
      sets.push_back(value());
    } else if (a == "--json") {
      json_out = true;
    } else if (a == "-h" || a == "--help") {
      std::cout << "usage: checkpoint_bench [--reps N] [--dir DIR] [--config PATH] "
                   "[--set KEY=VALUE]... [--json]\n";
      return 0;
    } else {
      die("unknown option '" + a + "' (try --help)");
    }
  }

  try {
    // The config: the given file, else configs/mnist.json next to the binary's source
    // tree when found, else the built-in defaults (identical to configs/mnist.json).
    nlohmann::json j = engine::default_config_json();
    std::string origin = "defaults";
    if (config_path.empty()) {
      for (const char* c : {"configs/mnist.json", "../configs/mnist.json"})
        if (fs::exists(c)) { config_path = c; break; }
    }
    if (!config_path.empty()) {
      std::ifstream in(config_path);
      if (!in) die(config_path + ": cannot open config file");
      j = nlohmann::json::parse(in);
      origin = config_path;
    }
    for (const std::string& s : sets) engine::apply_override(j, s);

    fs::path work = dir.empty() ? fs::temp_directory_path() / ("checkpoint_bench." + std::to_string(::getpid()))
                                : fs::path(dir);
    fs::create_directories(work);
    j["device"] = "cpu";
    j["checkpoint"]["dir"] = (work / "run").string();
    j["checkpoint"]["verify"] = false;
    const engine::Config cfg = engine::config_from_json(j, origin);

    const auto t_setup = Clock::now();
    engine::Trainer trainer(cfg, engine::Device::cpu(), engine::make_model(cfg));
    trainer.control().request_stop();  // fit() runs one step, writes a mid-epoch last.h5, and stops
    engine::RunDirectory(trainer).fit();
    if (trainer.global_step() != 1) die("expected one training step, got " + std::to_string(trainer.global_step()));
    const double setup_ms = ms_since(t_setup);

    auto t0 = Clock::now();
    const engine::Checkpoint ckpt = trainer.snapshot();
    const double snapshot_ms = ms_since(t0);
    std::size_t tensor_bytes = 0, tensors = 0, scalars = 0;
    for (const auto& [g, d] : ckpt.groups) {
      for (const auto& [k, t] : d.tensors) { tensor_bytes += t.nbytes(); ++tensors; }
      scalars += d.scalars.size();
    }

    const std::string path = (work / "bench.h5").string();
    engine::save_checkpoint(path, ckpt);  // warm-up
    std::vector<double> save_ms, load_ms;
    for (int r = 0; r < reps; ++r) {
      t0 = Clock::now();
      engine::save_checkpoint(path, ckpt);
      save_ms.push_back(ms_since(t0));
    }
    const auto file_bytes = static_cast<long long>(fs::file_size(path));
    (void)engine::load_checkpoint(path);  // warm-up
    std::size_t loaded_groups = 0;
    for (int r = 0; r < reps; ++r) {
      t0 = Clock::now();
      const engine::Checkpoint back = engine::load_checkpoint(path);
      load_ms.push_back(ms_since(t0));
      loaded_groups = back.groups.size();
    }
    if (loaded_groups != ckpt.groups.size()) die("load_checkpoint returned a different number of groups");

    const Stats s = stats(save_ms), l = stats(load_ms);
    if (json_out) {
      nlohmann::json out = {{"reps", reps},
                            {"save_ms", {{"median", s.median}, {"min", s.min}, {"mean", s.mean}}},
                            {"load_ms", {{"median", l.median}, {"min", l.min}, {"mean", l.mean}}},
                            {"snapshot_ms", snapshot_ms},
                            {"file_bytes", file_bytes},
                            {"tensor_bytes", tensor_bytes},
                            {"tensors", tensors},
                            {"scalars", scalars},
                            {"setup_ms", setup_ms}};
      std::cout << out.dump() << "\n";
    } else {
      std::printf("engine checkpoint: %zu groups, %zu tensors (%.2f MiB of data), %zu scalars\n",
                  ckpt.groups.size(), tensors, tensor_bytes / 1048576.0, scalars);
      std::printf("snapshot()      : %8.3f ms (once)\n", snapshot_ms);
      std::printf("save_checkpoint : median %8.3f ms  min %8.3f ms  mean %8.3f ms  (%d reps)\n",
                  s.median, s.min, s.mean, reps);
      std::printf("load_checkpoint : median %8.3f ms  min %8.3f ms  mean %8.3f ms  (%d reps)\n",
                  l.median, l.min, l.mean, reps);
      std::printf("file size       : %lld bytes (%.2f MiB)  %s\n", file_bytes, file_bytes / 1048576.0,
                  path.c_str());
    }
    if (dir.empty()) fs::remove_all(work);
  } catch (const std::exception& e) {
    die(e.what());
  }
  return 0;
}
