// `engine replay CKPT.h5|RUN_DIR --to STEP -o OUT.h5 [--check RUN_DIR]` (docs/replay.md).
#include <chrono>
#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "cli/exit.h"
#include "cli/replay_report.h"
#include "engine/core/device.h"
#include "engine/run/replay.h"

namespace engine::cli {

void replay_options(CLI::App* replay, Commands& c) {
  replay->add_option("SOURCE", c.replay.source,
                     "a checkpoint to continue from, or a run directory: replayed from the run's start")
      ->required()
      ->type_name("");
  replay->add_option("--to", c.replay.to, "the global step to stop at (may be mid-epoch)")
      ->required()
      ->type_name("STEP")
      ->check(CLI::Range(int64_t{0}, int64_t{INT64_MAX}).description(""));
  replay->add_option("-o,--output", c.replay.output, "where to write the checkpoint at STEP")->type_name("OUT.h5");
  replay->add_option("--check", c.replay.check_dir,
                     "compare every replayed step with RUN_DIR/step_digests.jsonl; stop at the first that differs")
      ->type_name("RUN_DIR");
  // For `engine audit`: it rewrites this file as its replays start and end, so that the
  // ones still running use the cores the others freed (the bits do not depend on it).
  replay->add_option("--threads-file", c.replay.threads_file)->group("");
  replay->add_flag("--from-start", c.replay.from_start, "replay a checkpoint's run from its start (step 0)");
  add_device_option(replay, c.replay.device, "where to replay (default cpu; a GPU run's bits need a GPU)");
  replay->add_option("--data-dir", c.replay.data_dir, "dataset directory (default: the stored data.dir)")
      ->type_name("DIR");
  replay->footer(
      "Trains with the config stored in the checkpoint, from its state (or, given a run directory or\n"
      "--from-start, from the run's start) to exactly global step STEP, and writes a full checkpoint\n"
      "there: `engine diff` against a run's own checkpoint of that step names the elements that differ.\n"
      "Exit status: 0 replayed (and, with --check, every step matched), 1 a step differed or an error,\n"
      "2 usage.");
}

namespace {

// Sets the CPU threads to the count `path` holds, when it holds one that differs.
void follow_threads_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return;
  int threads = 0;
  const bool read = std::fscanf(f, "%d", &threads) == 1;
  std::fclose(f);
  if (read && threads >= 1 && threads <= 4096 && threads != cpu_threads()) set_cpu_threads(threads);
}

}  // namespace

int cmd_replay(const ReplayCliOptions& a) {
  if (a.output.empty() && a.check_dir.empty()) fail("replay: give -o OUT.h5, --check RUN_DIR, or both", kExitUsage);
  const ReplaySource src = open_source(a.source, 1);
  ReplayOptions opts;
  opts.device = resolve_device(a.device);
  opts.data_dir = a.data_dir;
  const ReplayFrom from = src.run_dir || a.from_start ? ReplayFrom::RunStart : ReplayFrom::Checkpoint;
  std::unique_ptr<Trainer> trainer;
  try {
    trainer = replay_trainer(src.checkpoint, src.checkpoint_path, from, opts);
  } catch (const std::exception& e) {
    fail(e.what());
  }
  std::map<int64_t, StepDigest> recorded;
  if (!a.check_dir.empty()) {
    std::string note;
    recorded = read_run_digests(a.check_dir, note);
    if (!note.empty()) std::cerr << "engine: warning: " << note << "\n";
    if (recorded.empty()) fail(a.check_dir + ": no step digests recorded (step_digests.jsonl is missing or empty)");
  }
  const int64_t start = trainer->global_step();
  std::cout << "replaying " << (from == ReplayFrom::RunStart ? "the run's start" : src.checkpoint_path) << " (step "
            << start << ") to step " << a.to << " on " << opts.device.str() << "\n";
  int64_t checked = 0;
  bool parted = false;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    replay_to(*trainer, a.to, [&](const StepDigest* step) {
      if (!a.threads_file.empty()) follow_threads_file(a.threads_file);
      if (!step) return true;
      const StepDigest& d = *step;
      auto it = recorded.find(d.global_step);
      if (it == recorded.end()) return true;
      ++checked;
      if (it->second.combined() == d.combined()) return true;
      parted = true;
      std::cout << "parted from " << a.check_dir << " at " << step_place(d) << ":\n"
                << describe_difference(it->second, d);
      return false;
    });
  } catch (const std::exception& e) {
    fail(src.checkpoint_path + ": " + e.what());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t steps = trainer->global_step() - start;
  char rate[64];
  std::snprintf(rate, sizeof rate, "%.2f s, %.1f steps/s", seconds, seconds > 0 ? steps / seconds : 0.0);
  std::cout << "replayed " << steps << " steps (" << rate << ")\n";
  if (parted) return 1;
  if (!a.check_dir.empty())
    std::cout << "checked " << checked << " steps against " << a.check_dir << "/" << step_digest_log::kFileName
              << ": every one matches\n";
  if (!a.output.empty()) {
    try {
      trainer->save_checkpoint(a.output);
    } catch (const std::exception& e) {
      fail(e.what());
    }
    std::cout << "wrote " << a.output << " (global step " << trainer->global_step() << ", step digest "
              << digest_hex(trainer->step_digest()) << ")\n";
  }
  return 0;
}

}  // namespace engine::cli
