// Recovery on start (engine/run/recovery.h, docs/recovery.md).
#include "engine/run/recovery.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/io/memory_tier.h"
#include "engine/run/run_files.h"
#include "io/fnv1a.h"

namespace engine {

namespace fs = std::filesystem;

namespace {

// The resolved config without the keys a run may change between its sessions.
nlohmann::json identity_config(nlohmann::json j) {
  if (!j.is_object()) return j;
  for (const char* key : {"device", "train", "checkpoint", "logging", "cuda"}) j.erase(key);
  if (auto d = j.find("data"); d != j.end() && d->is_object()) {
    d->erase("dir");
    d->erase("test_limit");
  }
  if (auto d = j.find("dist"); d != j.end() && d->is_object()) {
    d->erase("backend");
    d->erase("timeout_s");
  }
  return j;
}

// A stored config normalised as this engine writes it (defaults filled in), so that a
// checkpoint written before a key existed still matches; as stored when it does not parse.
nlohmann::json resolved(const std::string& config_json) {
  nlohmann::json j = nlohmann::json::parse(config_json, nullptr, false);
  if (j.is_discarded()) return nlohmann::json();
  try {
    return config_to_json(config_from_json(j, "stored config"));
  } catch (const std::exception&) {
    return j;
  }
}

RunIdentity identity_of(const nlohmann::json& resolved_config) {
  RunIdentity id;
  const nlohmann::json j = identity_config(resolved_config);
  if (j.is_object() && j.contains("seed") && j["seed"].is_number_unsigned()) id.seed = j["seed"].get<uint64_t>();
  id.config_hash = fnv1a(j.dump());
  return id;
}

// The first key whose value differs, as "optimizer.lr 0.002 there, 0.001 here".
std::string first_difference(const nlohmann::json& there, const nlohmann::json& here, const std::string& prefix = "") {
  if (there.is_object() && here.is_object()) {
    std::vector<std::string> keys;
    for (auto it = here.begin(); it != here.end(); ++it) keys.push_back(it.key());
    for (auto it = there.begin(); it != there.end(); ++it)
      if (!here.contains(it.key())) keys.push_back(it.key());
    for (const std::string& k : keys) {
      const nlohmann::json a = there.contains(k) ? there[k] : nlohmann::json("(absent)");
      const nlohmann::json b = here.contains(k) ? here[k] : nlohmann::json("(absent)");
      if (a != b) return first_difference(a, b, prefix.empty() ? k : prefix + "." + k);
    }
    return "";
  }
  return (prefix.empty() ? "config" : prefix) + " " + there.dump() + " there, " + here.dump() + " here";
}

// The error of a load without its leading "<path>: ".
std::string reason_of(const std::string& path, const std::string& what) {
  return what.rfind(path + ": ", 0) == 0 ? what.substr(path.size() + 2) : what;
}

// The checkpoints of `dir` in the order of preference for equal steps.
std::vector<std::string> checkpoint_files(Env& env, const std::string& dir) {
  std::vector<std::string> names;
  if (env.list_dir(dir, names) != 0) return {};
  std::vector<std::string> numbered;
  for (const std::string& n : names)
    if (is_run_checkpoint(n) && n != run_files::kLast && n != run_files::kBest) numbered.push_back(n);
  // Newest epoch first; a milestone before a best_epoch file of the same epoch.
  std::sort(numbered.begin(), numbered.end(), [](const std::string& a, const std::string& b) {
    auto epoch = [](const std::string& n) { return std::stoll(n.substr(n.size() - 7, 4)); };
    if (epoch(a) != epoch(b)) return epoch(a) > epoch(b);
    return a > b;  // "epoch_" > "best_epoch_"
  });
  std::vector<std::string> files;
  for (const std::string& n : names)
    if (n == run_files::kLast) files.push_back(n);
  files.insert(files.end(), numbered.begin(), numbered.end());
  for (const std::string& n : names)
    if (n == run_files::kBest) files.push_back(n);
  return files;
}

// Loads `dir/file` as a resume would; the copy's verdict, counters and (when `keep`) the state.
CheckpointCopy examine(Env& env, const std::string& dir, const std::string& file, std::optional<Checkpoint>* keep,
                       std::optional<nlohmann::json>* config) {
  CheckpointCopy c;
  c.dir = dir;
  c.file = file;
  c.path = (fs::path(dir) / file).string();
  try {
    Checkpoint ckpt = load_checkpoint(c.path, &env);
    const StateDict& t = ckpt.group("trainer");
    c.global_step = t.get_int("global_step");
    c.epochs_done = t.get_int("epoch");
    c.step_in_epoch = t.get_int("step_in_epoch");
    c.verdict = CopyVerdict::Sound;
    if (config) *config = resolved(ckpt.config_json);
    if (keep) *keep = std::move(ckpt);
  } catch (const std::exception& e) {
    c.verdict = CopyVerdict::Damaged;
    c.reason = reason_of(c.path, e.what());
  }
  return c;
}

std::string counters_text(const CheckpointCopy& c) {
  return "epoch " + std::to_string(c.epochs_done) + ", global step " + std::to_string(c.global_step);
}

}  // namespace

bool is_run_checkpoint(const std::string& n) {
  if (n == run_files::kLast || n == run_files::kBest) return true;
  auto numbered = [&](const std::string& prefix) {
    if (n.size() != prefix.size() + 7 || n.compare(0, prefix.size(), prefix) != 0) return false;
    if (n.compare(n.size() - 3, 3, ".h5") != 0) return false;
    return std::all_of(n.begin() + static_cast<std::ptrdiff_t>(prefix.size()), n.end() - 3,
                       [](char ch) { return ch >= '0' && ch <= '9'; });
  };
  return numbered("epoch_") || numbered("best_epoch_");
}

RunIdentity run_identity(const Config& cfg) { return identity_of(config_to_json(cfg)); }

std::string to_string(const RunIdentity& id) {
  char hash[20];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(id.config_hash));
  return "seed " + std::to_string(id.seed) + ", config " + hash;
}

std::vector<const CheckpointCopy*> RunSurvey::skipped() const {
  std::vector<const CheckpointCopy*> out;
  const CheckpointCopy* used = chosen_copy();
  for (const CheckpointCopy& c : copies) {
    if (c.verdict == CopyVerdict::Damaged) out.push_back(&c);
    else if (c.verdict == CopyVerdict::OtherRun && (!used || c.global_step > used->global_step)) out.push_back(&c);
  }
  return out;
}

std::string RunSurvey::skipped_text() const {
  std::string text;
  for (const CheckpointCopy* c : skipped()) text += (text.empty() ? "" : "; ") + c->path + ": " + c->reason;
  return text;
}

const CheckpointCopy* RunSurvey::other_run_in_run_dir() const {
  for (const CheckpointCopy& c : copies)
    if (c.verdict == CopyVerdict::OtherRun && !tiers.empty() && c.dir == tiers.front()) return &c;
  return nullptr;
}

RunSurvey survey_run(const Config& cfg, Env* env_given) {
  Env& env = env_or_posix(env_given);
  RunSurvey s;
  s.tiers.push_back(cfg.checkpoint.dir);
  for (const std::string& r : cfg.checkpoint.replicas) s.tiers.push_back(r);
  const nlohmann::json here = identity_config(config_to_json(cfg));
  const RunIdentity mine = run_identity(cfg);
  for (const std::string& dir : s.tiers) {
    for (const std::string& file : checkpoint_files(env, dir)) {
      std::optional<Checkpoint> state;
      std::optional<nlohmann::json> config;
      CheckpointCopy c = examine(env, dir, file, &state, &config);
      if (c.verdict == CopyVerdict::Sound && identity_of(*config) != mine) {
        c.verdict = CopyVerdict::OtherRun;
        c.reason = "another run's checkpoint (" + first_difference(identity_config(*config), here) + ")";
      }
      // Strictly newer wins, so that for equal steps the earlier copy (the run directory's
      // last.h5 first) is the one resumed from.
      const bool newest = c.verdict == CopyVerdict::Sound && (!s.chosen || c.global_step > s.copies[*s.chosen].global_step);
      s.copies.push_back(c);
      if (newest) {
        s.chosen = s.copies.size() - 1;
        s.state = std::move(state);
      }
    }
  }
  return s;
}

MemoryTierSurvey survey_memory_tier(const Config& cfg) {
  MemoryTierSurvey s;
  if (!cfg.checkpoint.memory_tier) return s;
  s.file = memory_tier::file_for(*cfg.checkpoint.memory_tier, cfg.checkpoint.dir);
  memory_tier::Contents c =
      memory_tier::read(s.file, memory_tier::canonical_run_dir(cfg.checkpoint.dir), memory_tier::Read::States);
  if (!c.problem.empty()) {
    if (c.problem != "no slot file") s.skipped.push_back(s.file + ": " + c.problem);
    return s;
  }
  const nlohmann::json here = identity_config(config_to_json(cfg));
  const RunIdentity mine = run_identity(cfg);
  memory_tier::Slot* best = nullptr;
  for (memory_tier::Slot& slot : c.slots) {
    const std::string name = s.file + " slot " + std::to_string(slot.index);
    if (!slot.problem.empty()) {
      if (slot.problem != "never written") s.skipped.push_back(name + ": " + slot.problem);
      continue;
    }
    const nlohmann::json config = resolved(slot.state->config_json);
    if (identity_of(config) != mine) {
      s.skipped.push_back(name + ": another run's state (" + first_difference(identity_config(config), here) + ")");
      continue;
    }
    if (!best || slot.sequence > best->sequence) best = &slot;
  }
  if (!best) return s;
  CheckpointCopy copy;
  copy.path = s.file + " slot " + std::to_string(best->index);
  copy.dir = *cfg.checkpoint.memory_tier;
  copy.file = "slot " + std::to_string(best->index);
  try {
    const StateDict& t = best->state->group("trainer");
    copy.global_step = t.get_int("global_step");
    copy.epochs_done = t.get_int("epoch");
    copy.step_in_epoch = t.get_int("step_in_epoch");
  } catch (const std::exception& e) {
    s.skipped.push_back(copy.path + ": " + e.what());
    return s;
  }
  copy.verdict = CopyVerdict::Sound;
  s.copy = copy;
  s.state = std::move(best->state);
  return s;
}

std::vector<CheckpointCopy> survey_directory(const std::string& dir, Env* env_given) {
  Env& env = env_or_posix(env_given);
  std::vector<CheckpointCopy> out;
  for (const std::string& file : checkpoint_files(env, dir)) out.push_back(examine(env, dir, file, nullptr, nullptr));
  std::stable_sort(out.begin(), out.end(), [](const CheckpointCopy& a, const CheckpointCopy& b) {
    return (a.verdict == CopyVerdict::Sound ? a.global_step : -2) > (b.verdict == CopyVerdict::Sound ? b.global_step : -2);
  });
  return out;
}

std::string sound_alternatives(const std::string& path, Env* env) {
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::string list;
  for (const CheckpointCopy& c : survey_directory(dir.string(), env)) {
    if (c.verdict != CopyVerdict::Sound || fs::path(c.path).lexically_normal() == fs::path(path).lexically_normal())
      continue;
    list += (list.empty() ? "" : ", ") + c.path + " (" + counters_text(c) + ")";
  }
  if (list.empty()) return "";
  return "; sound checkpoints beside it: " + list + "; `engine resume " + dir.string() + "` resumes from the newest";
}

}  // namespace engine
