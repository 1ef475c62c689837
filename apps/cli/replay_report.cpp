#include "cli/replay_report.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/exit.h"
#include "engine/run/recovery.h"

namespace engine::cli {

ReplaySource open_source(const std::string& path, int code) {
  ReplaySource s;
  s.path = path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    s.run_dir = true;
    const std::vector<CheckpointCopy> copies = survey_directory(path);
    if (copies.empty() || copies.front().verdict != CopyVerdict::Sound)
      fail(path + ": no sound checkpoint in this run directory", code);
    s.checkpoint_path = copies.front().path;
  } else {
    s.checkpoint_path = path;
  }
  try {
    s.checkpoint = load_checkpoint(s.checkpoint_path);
  } catch (const CheckpointError& e) {
    fail(e.what(), code);
  }
  return s;
}

std::string step_place(const StepDigest& d) {
  return "global step " + std::to_string(d.global_step) + " (epoch " + std::to_string(d.epoch) + ", step " +
         std::to_string(d.step_in_epoch) + " of the epoch)";
}

std::string describe_difference(const StepDigest& a, const StepDigest& b) {
  const StepDigestDifference d = compare_step_digests(a, b);
  std::string out;
  out += std::string("  data position: ") + (d.data_position ? "differs" : "same") + " (shuffle draw " +
         std::to_string(a.shuffle_offset) + " vs " + std::to_string(b.shuffle_offset) + ", epoch " +
         std::to_string(a.epoch) + " vs " + std::to_string(b.epoch) + ")\n";
  out += "  rng: ";
  if (d.rng.empty()) out += "same";
  for (std::size_t i = 0; i < d.rng.size(); ++i) out += (i ? ", " : "") + d.rng[i] + " differs";
  out += "\n";
  out += std::string("  loss: ") + (d.loss ? "differs" : "same") + "\n";
  out += "  tensors: " + std::to_string(d.tensors.size()) + " of " +
         std::to_string(std::max(a.tensors.size(), b.tensors.size())) + " differ";
  for (std::size_t i = 0; i < d.tensors.size(); ++i) out += (i ? ", " : ": ") + d.tensors[i];
  out += "\n";
  return out;
}

std::map<int64_t, StepDigest> read_run_digests(const std::string& dir, std::string& note) {
  const std::string path = (std::filesystem::path(dir) / step_digest_log::kFileName).string();
  const step_digest_log::Contents c = step_digest_log::read(path);
  note.clear();
  if (!c.cut_reason.empty()) note = path + ": " + c.cut_reason + " (not trusted from there on)";
  std::map<int64_t, StepDigest> by_step;
  for (const StepDigest& d : c.steps) by_step[d.global_step] = d;
  return by_step;
}

namespace {
void flatten(const nlohmann::json& j, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
    return;
  }
  out[prefix] = j.dump();
}
}  // namespace

std::string config_differences(const std::string& config_a, const std::string& config_b) {
  std::map<std::string, std::string> a, b;
  flatten(nlohmann::json::parse(config_a, nullptr, false), "", a);
  flatten(nlohmann::json::parse(config_b, nullptr, false), "", b);
  std::string out;
  for (const auto& [key, value] : a) {
    auto it = b.find(key);
    const std::string other = it == b.end() ? "(absent)" : it->second;
    if (other != value) out += "  " + key + ": " + value + " vs " + other + "\n";
  }
  for (const auto& [key, value] : b)
    if (!a.count(key)) out += "  " + key + ": (absent) vs " + value + "\n";
  return out;
}

}  // namespace engine::cli
