// What `engine bisect`, `engine replay --check` and `engine audit` print about two
// records of one step that differ (docs/replay.md, "Reading the report").
#pragma once
#include <map>
#include <string>

#include "engine/io/checkpoint.h"
#include "engine/io/step_digest.h"

namespace engine::cli {

// What a replay, a bisect or an audit starts from: a checkpoint file, or a run directory
// (its newest sound checkpoint gives the config; its step_digests.jsonl the record).
struct ReplaySource {
  std::string path;
  bool run_dir = false;
  std::string checkpoint_path;  // the file, or the run's newest sound checkpoint
  Checkpoint checkpoint;
};
// Ends the command with one line (exit `code`) when `path` is neither a loadable
// checkpoint nor a run directory with a sound one.
ReplaySource open_source(const std::string& path, int code);

// "global step 37 (epoch 3, step 5 of the epoch)".
std::string step_place(const StepDigest& d);

// Indented lines, one per part: data position, RNG, loss, and the tensors that differ
// (every one named).
std::string describe_difference(const StepDigest& a, const StepDigest& b);

// A run directory's step digests by global step; `note` says what was cut, if anything.
std::map<int64_t, StepDigest> read_run_digests(const std::string& dir, std::string& note);

// The keys whose values differ between two stored configs ("data.train_limit: 1024 vs
// 2048"), one per line, indented; "" when they are the same.
std::string config_differences(const std::string& config_a, const std::string& config_b);

}  // namespace engine::cli
