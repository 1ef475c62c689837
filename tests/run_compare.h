// Comparing two runs of the CLI: the same last.h5 bits and the same metrics, and an
// uninterrupted reference run to compare with (one per set of extra flags, per process).
#pragma once
#include <doctest/doctest.h>

#include <cerrno>  // program_invocation_short_name (glibc)
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_util.h"

namespace test_util {

inline std::vector<double> column(const std::string& run_dir, const char* key) {
  std::vector<double> v;
  for (const std::string& l : read_lines(run_dir + "/metrics.jsonl")) {
    auto j = nlohmann::json::parse(l);
    if (j.contains(key)) v.push_back(j[key].get<double>());
  }
  return v;
}

inline void expect_same_run(const std::string& a, const std::string& b) {
  const RunResult d = run("diff \"" + a + "/last.h5\" \"" + b + "/last.h5\"");
  INFO(d.output);
  CHECK(d.exit_code == 0);
  for (const char* key : {"train_loss", "val_loss", "val_acc", "lr", "test_acc"}) {
    CAPTURE(key);
    const auto ca = column(a, key), cb = column(b, key);
    CHECK(!ca.empty());
    CHECK(ca == cb);  // exact: the same bits
  }
}

// An uninterrupted run with the same flags (the stored config must match too).
inline std::string reference_run(const std::string& extra = "") {
  static std::map<std::string, std::string> dirs;
  auto it = dirs.find(extra);
  if (it != dirs.end()) return it->second;
  // Named after the test executable: test executables run in parallel.
  const std::string dir = fresh_dir(std::string(program_invocation_short_name) + "_reference_" +
                                    std::to_string(dirs.size()));
  const RunResult r = run(small_run(dir) + extra);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  dirs[extra] = dir;
  return dir;
}

}  // namespace test_util
