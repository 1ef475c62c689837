// Test-only stand-in for a power cut: `engine_kill_after N train CONFIG.json [options]`
// does what `engine train` does with those options (config file, --set, --device,
// --run-dir, resume from <run-dir>/last.h5 when present) and SIGKILLs itself right after
// global step N, once any checkpoint due by then is on disk (the writer thread of
// checkpoint.async is waited for): no cleanup, no flush of anything else. Built from tests/ only; the shipped CLI has no such flag.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/train/config.h"
#include "engine/train/model_factory.h"
#include "engine/run/run_directory.h"
#include "engine/train/trainer.h"

namespace {

[[noreturn]] void die(const std::string& msg) {
  std::cerr << "engine_kill_after: " << msg << "\n";
  std::exit(2);
}

class KillAfterStep : public engine::TrainerObserver {
 public:
  explicit KillAfterStep(int64_t step) : step_(step) {}
  void on_step_end(int64_t global_step) override {
    if (global_step != step_) return;
    if (run && trainer) run->flush(*trainer);
    std::fflush(nullptr);
    ::kill(::getpid(), SIGKILL);
  }

 private:
  int64_t step_;

 public:
  engine::RunDirectory* run = nullptr;
  engine::Trainer* trainer = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || std::string(argv[2]) != "train")
    die("usage: engine_kill_after N train CONFIG.json [--device D] [--run-dir DIR] [--set K=V]...");
  const int64_t kill_step = std::stoll(argv[1]);
  const std::string config_path = argv[3];
  std::ifstream in(config_path);
  if (!in) die(config_path + ": cannot open config file");
  nlohmann::json j = nlohmann::json::parse(in);
  for (int i = 4; i < argc; ++i) {
    const std::string opt = argv[i];
    if (i + 1 >= argc) die(opt + " needs a value");
    const std::string value = argv[++i];
    if (opt == "--set") engine::apply_override(j, value);
    else if (opt == "--device") j["device"] = value;
    else if (opt == "--run-dir") j["checkpoint"]["dir"] = value;
    else die("unknown option '" + opt + "'");
  }
  try {
    const engine::Config cfg = engine::config_from_json(j, config_path);
    KillAfterStep killer(kill_step);
    engine::TrainerOptions options;
    options.observer = &killer;
    engine::Trainer trainer(cfg, engine::resolve_device(cfg.device), engine::make_model(cfg), std::move(options));
    const std::string last = (std::filesystem::path(cfg.checkpoint.dir) / "last.h5").string();
    if (std::filesystem::exists(last)) trainer.resume_from(last, engine::LoadMode::Strict);
    engine::RunDirectory run_dir(trainer);
    killer.run = &run_dir;
    killer.trainer = &trainer;
    run_dir.fit();
  } catch (const std::exception& e) {
    die(e.what());
  }
  die("the run ended before global step " + std::to_string(kill_step));
}
