// The run directory's file names and housekeeping (engine/run/run_files.h).
#include "engine/run/run_files.h"
#include "core/utc_time.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <vector>

#include "io/read_file.h"

namespace engine {

namespace fs = std::filesystem;

std::string run_files::milestone(int64_t epochs_done) {
  char name[32];
  std::snprintf(name, sizeof name, "epoch_%04lld.h5", static_cast<long long>(epochs_done));
  return name;
}

std::string run_files::best_of_epoch(int64_t epochs_done) { return "best_" + milestone(epochs_done); }

bool run_files::is_run_file(const std::string& n) {
  auto ends_with = [&](const std::string& s) {
    return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
  };
  if (n == kLast || n == kBest || n == kMetrics || n == kTensorBoard || n == kReport || n == kStepDigests) return true;
  if ((n.rfind("epoch_", 0) == 0 || n.rfind("best_epoch_", 0) == 0) && ends_with(".h5")) return true;
  return n.size() > 1 && n[0] == '.' && n.find(".tmp.") != std::string::npos;  // .last.h5.tmp.PID
}

namespace {

// std::filesystem::exists, through `env`: a failure other than "not there" throws as it does.
bool exists(Env& env, const fs::path& p) {
  FileInfo info;
  if (env.stat(p.string(), info) == 0) return true;
  const int err = errno;
  if (err == ENOENT || err == ENOTDIR) return false;
  throw fs::filesystem_error("status", p, std::error_code(err, std::generic_category()));
}

}  // namespace

MovedAside move_previous_run_aside(const std::string& dir, Env* env_given) {
  Env& env = env_or_posix(env_given);
  std::vector<std::string> names;
  if (env.list_dir(dir, names) != 0) {
    const int err = errno;
    throw std::runtime_error(dir + ": cannot list the run directory: " + std::strerror(err));
  }
  std::vector<fs::path> old;
  for (const std::string& name : names)
    if (run_files::is_run_file(name)) old.push_back(fs::path(dir) / name);
  MovedAside moved;
  if (old.empty()) return moved;
  fs::path run = fs::absolute(fs::path(dir)).lexically_normal();
  if (run.filename().empty()) run = run.parent_path();  // "runs/x/"
  const std::string stamp = utc_text(env.wall_now(), UtcFormat::Compact);
  fs::path aside = run.parent_path() / (run.filename().string() + ".replaced-" + stamp);
  for (int i = 2; exists(env, aside); ++i)
    aside = run.parent_path() / (run.filename().string() + ".replaced-" + stamp + "-" + std::to_string(i));
  if (env.make_dirs(aside.string()) != 0) {
    const int err = errno;
    throw std::runtime_error(aside.string() + ": cannot create a directory for the previous run's files: " +
                             std::strerror(err));
  }
  for (const fs::path& p : old) {
    if (env.rename(p.string(), (aside / p.filename()).string()) != 0) {
      const int err = errno;
      throw std::runtime_error(p.string() + ": cannot move it aside to " + aside.string() + ": " +
                               std::strerror(err) + " (move or remove the previous run's files yourself)");
    }
  }
  moved.dir = aside.string();
  moved.files = old.size();
  return moved;
}

bool test_result_recorded(const std::string& run_dir, Env* env) {
  std::string text;
  if (read_whole_file(env_or_posix(env), (fs::path(run_dir) / run_files::kMetrics).string(), text) != 0) return false;
  std::istringstream in(text);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  try {
    return !last.empty() && nlohmann::json::parse(last).contains("test_acc");
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

}  // namespace engine
