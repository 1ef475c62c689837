// What a checkpoint save costs the training thread (tools/bench/async_save.sh runs it).
// One epoch of --steps steps of the Fashion-MNIST CNN, trained by a host loop over
// Trainer::train_step() into a RunDirectory, saving (verified) after every step or only
// at the epoch's end, each mode timed from the first step until the last save is on disk.
//
//   async_save_bench --data DIR [--steps 50] [--rounds 5] [--dir DIR] [--sync] [--set K=V]...
//
// Prints per mode the median epoch time over the rounds, the training-thread stall per
// save (median and largest), and the ratio every-step / end-only.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/train/config.h"
#include "engine/train/model_factory.h"
#include "engine/run/run_directory.h"
#include "engine/train/trainer.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void die(const std::string& m) {
  std::cerr << "async_save_bench: " << m << "\n";
  std::exit(1);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// The q-quantile by the nearest rank: a measured value, never an interpolation.
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[rank == 0 ? 0 : rank - 1];
}

struct Round {
  double seconds = 0;
  std::vector<double> stalls;  // per save
  double state_mb = 0;
};

Round run_epoch(const engine::Config& cfg, bool every_step) {
  engine::Trainer trainer(cfg, engine::Device::cpu(), engine::make_model(cfg));
  engine::RunDirectory run(trainer);
  const auto t0 = Clock::now();
  for (;;) {
    const engine::StepResult s = trainer.train_step();
    if (s.epoch_end) break;
    if (every_step) run.save(trainer, engine::CheckpointKind::MidEpoch);
  }
  run.save(trainer, engine::CheckpointKind::Last);
  run.flush(trainer);
  Round r;
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  for (const engine::SaveRecord& s : run.saves()) r.stalls.push_back(s.stall_seconds);
  for (const auto& [g, d] : trainer.snapshot().groups)
    for (const auto& [k, t] : d.tensors) r.state_mb += static_cast<double>(t.nbytes()) / 1e6;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string data, dir;
  int steps = 50, rounds = 5;
  bool sync = false;
  std::vector<std::string> sets;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--data") data = value();
    else if (a == "--dir") dir = value();
    else if (a == "--steps") steps = std::stoi(value());
    else if (a == "--rounds") rounds = std::stoi(value());
    else if (a == "--sync") sync = true;
    else if (a == "--set") sets.push_back(value());
    else die("unknown option '" + a + "'");
  }
  if (data.empty()) die("--data DIR (the Fashion-MNIST files) is required");
  if (steps < 1 || rounds < 1) die("--steps and --rounds must be positive");
  const fs::path work = dir.empty() ? fs::temp_directory_path() / ("async_save_bench." + std::to_string(::getpid())) : fs::path(dir);
  fs::create_directories(work);

  nlohmann::json j = engine::default_config_json();
  j["device"] = "cpu";
  j["data"]["dir"] = data;
  j["data"]["batch_size"] = 64;
  j["data"]["train_limit"] = steps * 64;  // the validation split comes on top
  j["data"]["val_split"] = 256;
  j["data"]["test_limit"] = 64;
  j["train"]["epochs"] = 1;
  j["checkpoint"]["verify"] = true;
  j["checkpoint"]["async"] = !sync;
  j["checkpoint"]["every_n_epochs"] = nullptr;
  j["logging"]["tensorboard"] = false;
  for (const std::string& s : sets) engine::apply_override(j, s);

  std::vector<double> every_s, end_s, ratios, stalls;
  double state_mb = 0;
  for (int r = 0; r < rounds; ++r) {
    // Alternating, the order swapped every round: a shared machine drifts.
    for (int k = 0; k < 2; ++k) {
      const bool every = (r + k) % 2 == 0;
      j["checkpoint"]["dir"] = (work / (every ? "every" : "end")).string();
      fs::remove_all(j["checkpoint"]["dir"].get<std::string>());
      const Round res = run_epoch(engine::config_from_json(j, "async_save_bench"), every);
      (every ? every_s : end_s).push_back(res.seconds);
      if (every) stalls.insert(stalls.end(), res.stalls.begin(), res.stalls.end());
      state_mb = res.state_mb;
    }
    ratios.push_back(every_s.back() / end_s.back());
  }
  if (dir.empty()) fs::remove_all(work);
  std::printf("state %.2f MB, %d steps per epoch, checkpoint.async %s, verify on, %d rounds\n", state_mb, steps,
              sync ? "false" : "true", rounds);
  std::printf("epoch, saving after every step: median %.3f s\n", median(every_s));
  std::printf("epoch, saving at its end only:  median %.3f s\n", median(end_s));
  std::printf("ratio every-step / end-only: median %.3f (range %.3f .. %.3f)\n", median(ratios),
              *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()));
  std::printf("training-thread stall per save: median %.3f ms, 90th percentile %.3f ms, largest %.3f ms (%zu saves)\n",
              1e3 * median(stalls), 1e3 * quantile(stalls, 0.9),
              1e3 * *std::max_element(stalls.begin(), stalls.end()), stalls.size());
  return 0;
}
