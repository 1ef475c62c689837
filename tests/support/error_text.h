// Test-only: the one-line message of what a call throws, for tests that compare error texts.
#pragma once
#include <exception>
#include <functional>
#include <string>

namespace test_support {

// The what() of the std::exception `f` throws, or "NO ERROR".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "NO ERROR";
}

}  // namespace test_support
