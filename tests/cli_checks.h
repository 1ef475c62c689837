// Assertions on the engine's output shared by the CLI tests (doctest).
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cli_util.h"

namespace test_util {

// Exactly one line of output, mentioning every needle, and a non-zero exit.
inline void expect_one_line_error(const RunResult& r, const std::vector<std::string>& needles) {
  INFO(r.output);
  CHECK(r.exit_code != 0);
  CHECK(r.signal == 0);
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  for (const auto& n : needles) {
    CAPTURE(n);
    CHECK(r.output.find(n) != std::string::npos);
  }
}

}  // namespace test_util
