// The options `train` and `resume` share, and the config they make of a file's or a
// checkpoint's with the command line's overrides.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/train/config.h"

namespace engine::cli {

struct RunOptions {
  std::string device, run_dir;
  std::vector<std::string> sets;
  std::optional<int64_t> stop_after_epochs;
  std::optional<double> time_limit;  // seconds
  bool reevaluate = false;
};

// --device, as every command that loads a model takes it.
void add_device_option(CLI::App* c, std::string& device, const std::string& what);

// --device, --run-dir, --set, --stop-after-epochs, --time-limit, --reevaluate.
void add_run_options(CLI::App* c, RunOptions& o, const std::string& device_help, const std::string& run_dir_help);

// The config of `base` (a file's or a checkpoint's, named `origin`) with the command
// line's overrides. An error is blamed on where the bad value came from: the file, a
// --set, or --device/--run-dir.
Config resolve_config(const nlohmann::json& base, const std::string& origin, const RunOptions& o);

}  // namespace engine::cli
