// What the memory tier costs a training step (docs/recovery.md, "The memory tier";
// tools/bench/memory_tier.sh runs it): a CPU Trainer of configs/mnist.json trains N
// steps; after each, the state goes to a slot file the way the run directory keeps it
// (Trainer::snapshot(), memory_tier::Writer::write). Each step and each write are timed;
// prints the medians and the cost ratio (step + write) / step.
//
//   memory_tier_bench [--steps N] [--dir DIR] [--config PATH] [--set KEY=VALUE]... [--json]
//
// DIR: where the slot file goes (default /dev/shm). Needs the Fashion-MNIST files.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "engine/io/memory_tier.h"
#include "engine/train/config.h"
#include "engine/train/model_factory.h"
#include "engine/train/trainer.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "memory_tier_bench: %s\n", msg.c_str());
  std::exit(1);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

}  // namespace

int main(int argc, char** argv) {
  int steps = 100;
  bool json_out = false;
  std::string dir = "/dev/shm", config_path;
  std::vector<std::string> sets;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--steps") {
      const std::string v = value();
      steps = std::atoi(v.c_str());
      if (steps < 1) die("--steps must be a positive integer, got '" + v + "'");
    } else if (a == "--dir") {
      dir = value();
    } else if (a == "--config") {
      config_path = value();
    } else if (a == "--set") {
      sets.push_back(value());
    } else if (a == "--json") {
      json_out = true;
    } else if (a == "-h" || a == "--help") {
      std::cout << "usage: memory_tier_bench [--steps N] [--dir DIR] [--config PATH] [--set KEY=VALUE]... [--json]\n";
      return 0;
    } else {
      die("unknown option '" + a + "' (try --help)");
    }
  }
  try {
    nlohmann::json j = engine::default_config_json();
    std::string origin = "defaults";
    if (config_path.empty())
      for (const char* c : {"configs/mnist.json", "../configs/mnist.json"})
        if (fs::exists(c)) {
          config_path = c;
          break;
        }
    if (!config_path.empty()) {
      std::ifstream in(config_path);
      if (!in) die(config_path + ": cannot open config file");
      j = nlohmann::json::parse(in);
      origin = config_path;
    }
    for (const std::string& s : sets) engine::apply_override(j, s);
    j["device"] = "cpu";
    const std::string run = (fs::temp_directory_path() / ("memory_tier_bench." + std::to_string(::getpid()))).string();
    j["checkpoint"]["dir"] = run;
    const engine::Config cfg = engine::config_from_json(j, origin);
    engine::Trainer trainer(cfg, engine::Device::cpu(), engine::make_model(cfg));
    engine::memory_tier::Writer writer(dir, run);
    for (int w = 0; w < 3; ++w) {  // warm-up: the first steps touch their buffers, the first write makes the file
      trainer.train_step();
      writer.write(trainer.snapshot(), trainer.global_step());
    }
    std::vector<double> step_ms, write_ms, snapshot_ms;
    for (int s = 0; s < steps; ++s) {
      auto t0 = Clock::now();
      trainer.train_step();
      step_ms.push_back(ms_since(t0));
      t0 = Clock::now();
      const engine::Checkpoint state = trainer.snapshot();
      snapshot_ms.push_back(ms_since(t0));
      writer.write(state, trainer.global_step());
      write_ms.push_back(ms_since(t0));
    }
    const double step = median(step_ms), write = median(write_ms), snapshot = median(snapshot_ms);
    const double bytes = static_cast<double>(writer.last_bytes());
    writer.remove();
    fs::remove_all(run);
    if (json_out) {
      std::cout << nlohmann::json{{"steps", steps}, {"step_ms", step}, {"write_ms", write},
                                  {"snapshot_ms", snapshot}, {"ratio", (step + write) / step}, {"slot_bytes", bytes}}
                       .dump()
                << "\n";
    } else {
      std::printf("%d steps: median step %.3f ms, median write %.3f ms (of which snapshot() %.3f; %.2f MB into %s): "
                  "(step + write) / step %.4f\n",
                  steps, step, write, snapshot, bytes / 1e6, dir.c_str(), (step + write) / step);
    }
  } catch (const std::exception& e) {
    die(e.what());
  }
  return 0;
}
