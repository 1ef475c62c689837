#include "engine/train/config.h"

#include <algorithm>

#include "io/config_keys.h"

namespace engine {
namespace {

using nlohmann::json;

// "auto", "cpu", "cuda", or "cuda:N" with N a decimal device index.
bool valid_device(const std::string& d) {
  if (d == "auto" || d == "cpu" || d == "cuda") return true;
  const std::string prefix = "cuda:";
  if (d.compare(0, prefix.size(), prefix) != 0) return false;
  const std::string index = d.substr(prefix.size());
  // Nine digits always fit in an int, which is what device indices are.
  if (index.empty() || index.size() > 9) return false;
  return std::all_of(index.begin(), index.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

// The whole table, in the order keys are read (the first bad key is the one reported)
// and documented (docs/config.md, checked against config_keys() by test_config).
const ConfigSection<Config>& keys() {
  static const ConfigSection<Config> table = [] {
    ConfigSection<Config> t = {
        {"seed", "integer", "0 … 2^63−1",
       R"doc(Seeds every random stream: weight initialisation, shuffling, and dropout. The validation split does not depend on it. The same seed and config give the same run.)doc",
         [](const ConfigReader& r, const std::string& dotted, Config& c) {
           int64_t seed = 0;
           if (r.integer(dotted, seed, 0, kConfigInt64Max)) c.seed = static_cast<uint64_t>(seed);
         },
         [](const Config& c) { return json(c.seed); }},
        {"device", "string", "`auto`, `cpu`, `cuda`, `cuda:N`",
       R"doc(Where to train. `auto` uses the first GPU when the CUDA backend is built and a GPU is present, otherwise the CPU. `cuda:N` selects GPU N.)doc",
         [](const ConfigReader& r, const std::string& dotted, Config& c) {
           if (r.string(dotted, c.device) && !valid_device(c.device))
             r.fail(dotted, "must be one of auto, cpu, cuda, cuda:N (N a device index), got " +
                                short_json(*r.find(dotted)));
         },
         [](const Config& c) { return json(c.device); }},
    };
    nest(t, "data", &Config::data, data_config_keys());
    nest(t, "model", &Config::model, model_config_keys());
    nest(t, "optimizer", &Config::optimizer, optimizer_config_keys());
    nest(t, "scheduler", &Config::scheduler, scheduler_config_keys());
    nest(t, "precision", &Config::precision, precision_config_keys());
    nest(t, "train", &Config::train, train_config_keys());
    nest(t, "checkpoint", &Config::checkpoint, checkpoint_config_keys());
    nest(t, "logging", &Config::logging, logging_config_keys());
    nest(t, "cuda", &Config::cuda, cuda_config_keys());
    nest(t, "dist", &Config::dist, dist_config_keys());
    return t;
  }();
  return table;
}

}  // namespace

Config config_from_json(const json& j, const std::string& origin) { return read_config(keys(), j, origin); }

Config load_config(const std::string& path) { return config_from_json(read_config_json(path), path); }

void apply_override(json& j, const std::string& assignment) {
  apply_config_override(j, assignment, default_config_json());
}

json config_to_json(const Config& c) { return write_config(keys(), c); }

json default_config_json() { return config_to_json(Config{}); }

std::vector<ConfigKeyInfo> config_keys() { return key_infos(keys()); }

}  // namespace engine
