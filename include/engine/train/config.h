// The training configuration: a JSON file (configs/mnist.json), validated key by key
// (docs/config.md), with dotted-key overrides from the command line. Config is the
// sections of every layer (engine/io/config_table.h says which layer declares which)
// plus the two top-level keys, seed and device.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/io/config_sections.h"
#include "engine/io/config_table.h"
#include "engine/nn/config_sections.h"
#include "engine/train/config_sections.h"

namespace engine {

struct Config {
  uint64_t seed = 0;
  std::string device = "auto";  // "auto" | "cpu" | "cuda" | "cuda:N"
  DataConfig data;
  ModelConfig model;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  PrecisionConfig precision;
  TrainConfig train;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  CudaConfig cuda;
  DistConfig dist;

  int64_t effective_t_max() const { return scheduler.t_max ? *scheduler.t_max : train.epochs; }
};

// Parses and validates. `origin` names the source in error messages (a path).
// Unknown keys are errors that name the closest valid key; missing keys take defaults.
Config config_from_json(const nlohmann::json& j, const std::string& origin);
Config load_config(const std::string& path);
// Applies "dotted.key=value" overrides to the JSON before validation. The value is
// parsed as JSON when it can be (3, 1e-3, true, null, [0.9,0.99], "x"), else taken as a
// string. An unknown key is a ConfigError naming the closest valid key.
void apply_override(nlohmann::json& j, const std::string& assignment);
// The complete resolved config (every key, defaults filled in), e.g. for checkpoints.
nlohmann::json config_to_json(const Config& c);
// The defaults as JSON (the schema of valid keys).
nlohmann::json default_config_json();
// Every key, in file order, as docs/config.md's key tables state them.
std::vector<ConfigKeyInfo> config_keys();

}  // namespace engine
