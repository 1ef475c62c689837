#include "cli/run_options.h"

#include "engine/nn/models/registry.h"
#include "engine/train/run_control.h"

namespace engine::cli {
namespace {

const std::string kTimeLimitFormats = "5400, 5400s, 90m, 1.5h, 2d, MM:SS, HH:MM:SS or D-HH:MM:SS";

// config_from_json, plus model.name checked against the registry (the config layer
// sits below the models, so it cannot know them; a host may bring its own).
Config validate_config(const nlohmann::json& j, const std::string& origin) {
  Config cfg = config_from_json(j, origin);
  require_choice(origin, "model.name", cfg.model.name, model_names());
  return cfg;
}

bool valid(const nlohmann::json& j, const std::string& origin) {
  try {
    validate_config(j, origin);
    return true;
  } catch (const ConfigError&) {
    return false;
  }
}

}  // namespace

void add_device_option(CLI::App* c, std::string& device, const std::string& what) {
  c->add_option("--device", device, what)->type_name("cpu|cuda|cuda:N|auto");
}

void add_run_options(CLI::App* c, RunOptions& o, const std::string& device_help,
                     const std::string& run_dir_help) {
  add_device_option(c, o.device, device_help);
  c->add_option("--run-dir", o.run_dir, run_dir_help)->type_name("DIR");
  c->add_option("--set", o.sets,
                "override a config key, dotted (repeatable), e.g. --set train.epochs=3 "
                "--set data.train_limit=2000")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false)
      ->take_all();
  c->add_option("--stop-after-epochs", o.stop_after_epochs,
                "stop cleanly once K epochs are complete in total (K >= 1; resume later)")
      ->type_name("K")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            try {
              std::size_t used = 0;
              const long long k = std::stoll(v, &used);
              if (used == v.size() && k >= 1) return "";
            } catch (...) {
            }
            return "expects a whole number of epochs >= 1, got '" + v + "'";
          },
          "", ""));
  c->add_option_function<std::string>(
       "--time-limit",
       [&o](const std::string& v) { o.time_limit = parse_duration_seconds(v); },
       "stop cleanly, last.h5 saved, before T of wall-clock time has passed since start "
       "(exit 75; run again to go on): " + kTimeLimitFormats)
      ->type_name("T")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (parse_duration_seconds(v)) return "";
            return "expects a positive duration (" + kTimeLimitFormats + "), got '" + v + "'";
          },
          "", ""));
  c->add_flag("--reevaluate", o.reevaluate,
              "when the run is already complete, evaluate the test set again (otherwise it "
              "says \"already complete\" and exits 0)");
}

Config resolve_config(const nlohmann::json& base, const std::string& origin, const RunOptions& o) {
  nlohmann::json with_sets = base;
  for (const std::string& s : o.sets) apply_override(with_sets, s);
  nlohmann::json with_all = with_sets;
  if (!o.device.empty()) with_all["device"] = o.device;
  if (!o.run_dir.empty()) with_all["checkpoint"]["dir"] = o.run_dir;
  try {
    return validate_config(with_all, origin);
  } catch (const ConfigError&) {
    if (!valid(base, origin)) throw;  // the file's own error, worded for the file
    if (!valid(with_sets, "--set")) validate_config(with_sets, "--set");
    validate_config(with_all, "--device/--run-dir");
    throw;
  }
}

}  // namespace engine::cli
