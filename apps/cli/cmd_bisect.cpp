// `engine bisect A B` (docs/replay.md): where two runs part.
#include <iostream>
#include <vector>

#include "cli/commands.h"
#include "cli/exit.h"
#include "cli/replay_report.h"
#include "engine/run/recovery.h"
#include "engine/run/replay.h"

namespace engine::cli {
namespace {

constexpr int kCannotCompare = 2;

struct Side {
  ReplaySource src;
  std::map<int64_t, StepDigest> log;  // run directories only
  std::string log_note;
  int64_t end = 0;  // the newest step its checkpoints hold
  // Every sound checkpoint of a run directory (or the file): global step -> path, digest.
  std::map<int64_t, std::pair<std::string, uint64_t>> checkpoints;
};

Side open_side(const std::string& path) {
  Side s{open_source(path, kCannotCompare), {}, {}, 0, {}};
  auto add = [&](const std::string& file) {
    try {
      const Checkpoint c = load_checkpoint(file);
      const int64_t step = c.group("trainer").get_int("global_step");
      s.checkpoints.emplace(step, std::make_pair(file, stored_step_digest(c, file)));
      s.end = std::max(s.end, step);
    } catch (const std::exception&) {
      // A damaged copy is no shared state; the survey already chose a sound one.
    }
  };
  if (s.src.run_dir) {
    s.log = read_run_digests(path, s.log_note);
    for (const CheckpointCopy& c : survey_directory(path))
      if (c.verdict == CopyVerdict::Sound) add(c.path);
  } else {
    add(path);
  }
  return s;
}

// The log's steps 1..through all present (a record of every step, none cut).
bool covers(const Side& s, int64_t through) {
  for (int64_t g = 1; g <= through; ++g)
    if (!s.log.count(g)) return false;
  return true;
}

std::string describe(const Side& s) {
  std::string out = s.src.path + (s.src.run_dir ? " (run directory" : " (checkpoint");
  if (s.src.run_dir) {
    out += s.log.empty() ? ", no step digests"
                         : ", step digests of steps " + std::to_string(s.log.begin()->first) + ".." +
                               std::to_string(s.log.rbegin()->first);
  }
  return out + ", checkpoints through step " + std::to_string(s.end) + ")";
}

int report_parted(const StepDigest& a, const StepDigest& b, const char* how) {
  std::cout << "parted at " << step_place(a) << " (" << how << "):\n" << describe_difference(a, b);
  return 1;
}

}  // namespace

void bisect_options(CLI::App* bisect, Commands& c) {
  bisect->add_option("A", c.bisect.a, "a run directory or a checkpoint")->required()->type_name("");
  bisect->add_option("B", c.bisect.b, "a run directory or a checkpoint")->required()->type_name("");
  add_device_option(bisect, c.bisect.device, "where to replay when the record does not say (default cpu)");
  bisect->add_option("--data-dir", c.bisect.data_dir, "dataset directory for replays (default: the stored data.dir)")
      ->type_name("DIR");
  bisect->footer(
      "Compares the runs' step digests (step_digests.jsonl) step by step; where they are missing, cut\n"
      "or cover different ranges, replays both runs from the newest state they share (their start when\n"
      "they share none) and compares each step as it goes.\n"
      "Exit status: 0 identical, 1 parted, 2 could not compare (one line says why).");
}

int cmd_bisect(const BisectOptions& o) {
  Side a = open_side(o.a), b = open_side(o.b);
  std::cout << "A: " << describe(a) << "\nB: " << describe(b) << "\n";
  for (const Side* s : {&a, &b})
    if (!s->log_note.empty()) std::cout << "note: " << s->log_note << "\n";
  const std::string configs = config_differences(a.src.checkpoint.config_json, b.src.checkpoint.config_json);
  std::cout << (configs.empty() ? "configs: the same\n" : "configs differ:\n" + configs);
  const CheckpointMeta &ma = a.src.checkpoint.meta, &mb = b.src.checkpoint.meta;
  std::cout << "builds: engine " << ma.engine_version << " on " << ma.saved_on << " vs engine " << mb.engine_version
            << " on " << mb.saved_on << "\n";

  // 1. The records, where both runs have them from their first step.
  const int64_t end = std::min(a.end, b.end);
  std::optional<int64_t> known_part;
  if (!a.log.empty() && !b.log.empty()) {
    for (const auto& [step, da] : a.log) {
      auto it = b.log.find(step);
      if (it == b.log.end() || da.combined() == it->second.combined()) continue;
      if (covers(a, step) && covers(b, step)) return report_parted(da, it->second, "from the recorded step digests");
      known_part = step;  // a gap before it: the replay below finds the first
      break;
    }
    const int64_t last = std::min(a.log.rbegin()->first, b.log.rbegin()->first);
    if (!known_part && covers(a, last) && covers(b, last)) {
      std::cout << "identical through step " << last << " (from the recorded step digests)\n";
      return 0;
    }
  }
  if (!a.src.run_dir && !b.src.run_dir && a.end == b.end &&
      a.checkpoints.begin()->second.second == b.checkpoints.begin()->second.second) {
    std::cout << "identical through step " << a.end << " (the checkpoints' step digests)\n";
    return 0;
  }

  // 2. Replay both from the newest state they share: checkpoints of one step with one
  // digest, before any difference known; else their runs' start.
  const int64_t limit = known_part ? *known_part : end;
  std::optional<std::pair<std::string, std::string>> shared;
  int64_t shared_step = 0;
  for (const auto& [step, fa] : a.checkpoints) {
    auto it = b.checkpoints.find(step);
    if (step <= limit && it != b.checkpoints.end() && it->second.second == fa.second && step >= shared_step) {
      shared = std::make_pair(fa.first, it->second.first);
      shared_step = step;
    }
  }
  if (limit <= shared_step) {
    std::cout << "identical through step " << shared_step << " (the checkpoints' step digests)\n";
    return 0;
  }
  ReplayOptions opts;
  opts.data_dir = o.data_dir;
  std::unique_ptr<Trainer> ta, tb;
  try {
    opts.device = resolve_device(o.device);
    if (shared) {
      std::cout << "replaying both from the state they share at step " << shared_step << " (" << shared->first
                << ", " << shared->second << ") to step " << limit << "\n";
      ta = replay_trainer(load_checkpoint(shared->first), shared->first, ReplayFrom::Checkpoint, opts);
      tb = replay_trainer(load_checkpoint(shared->second), shared->second, ReplayFrom::Checkpoint, opts);
    } else {
      std::cout << "replaying both from their runs' start to step " << limit << "\n";
      ta = replay_trainer(a.src.checkpoint, a.src.checkpoint_path, ReplayFrom::RunStart, opts);
      tb = replay_trainer(b.src.checkpoint, b.src.checkpoint_path, ReplayFrom::RunStart, opts);
    }
    for (int64_t g = ta->global_step() + 1; g <= limit; ++g) {
      replay_to(*ta, g);
      replay_to(*tb, g);
      const StepDigest &da = *ta->last_step_digest(), &db = *tb->last_step_digest();
      if (da.combined() != db.combined()) return report_parted(da, db, "by replaying both");
    }
  } catch (const std::exception& e) {
    fail(std::string("bisect: cannot replay: ") + e.what(), kCannotCompare);
  }
  std::cout << "identical through step " << limit << " (by replaying both)\n";
  return 0;
}

}  // namespace engine::cli
