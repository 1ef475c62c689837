// The run directory's file names and housekeeping (engine/run_files.h).
#include "engine/run_files.h"
#include "core/utc_time.h"

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <system_error>
#include <vector>

namespace engine {

namespace fs = std::filesystem;

std::string run_files::milestone(int64_t epochs_done) {
  char name[32];
  std::snprintf(name, sizeof name, "epoch_%04lld.h5", static_cast<long long>(epochs_done));
  return name;
}

bool run_files::is_run_file(const std::string& n) {
  auto ends_with = [&](const std::string& s) {
    return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
  };
  if (n == kLast || n == kBest || n == kMetrics || n == kTensorBoard || n == kReport) return true;
  if (n.rfind("epoch_", 0) == 0 && ends_with(".h5")) return true;
  return n.size() > 1 && n[0] == '.' && n.find(".tmp.") != std::string::npos;  // .last.h5.tmp.PID
}

MovedAside move_previous_run_aside(const std::string& dir) {
  std::vector<fs::path> old;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
    if (run_files::is_run_file(e.path().filename().string())) old.push_back(e.path());
  if (ec) throw std::runtime_error(dir + ": cannot list the run directory: " + ec.message());
  MovedAside moved;
  if (old.empty()) return moved;
  fs::path run = fs::absolute(fs::path(dir)).lexically_normal();
  if (run.filename().empty()) run = run.parent_path();  // "runs/x/"
  const std::string stamp = utc_now(UtcFormat::Compact);
  fs::path aside = run.parent_path() / (run.filename().string() + ".replaced-" + stamp);
  for (int i = 2; fs::exists(aside); ++i)
    aside = run.parent_path() / (run.filename().string() + ".replaced-" + stamp + "-" + std::to_string(i));
  fs::create_directories(aside, ec);
  if (ec)
    throw std::runtime_error(aside.string() + ": cannot create a directory for the previous run's files: " +
                             ec.message());
  for (const fs::path& p : old) {
    fs::rename(p, aside / p.filename(), ec);
    if (ec)
      throw std::runtime_error(p.string() + ": cannot move it aside to " + aside.string() + ": " + ec.message() +
                               " (move or remove the previous run's files yourself)");
  }
  moved.dir = aside.string();
  moved.files = old.size();
  return moved;
}

bool test_result_recorded(const std::string& run_dir) {
  std::ifstream in(fs::path(run_dir) / run_files::kMetrics);
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
