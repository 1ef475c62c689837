// Where a test executable writes its files: one directory per process under
// $ENGINE_TEST_TMP (set by CTest) or /tmp, made on first use and removed when the
// process exits. A child made by fork() that exits leaves it to its parent.
#pragma once
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace test_util {

// "<root>/<prefix>_<pid>"; the prefix of the first call names it for the whole process.
inline const std::filesystem::path& scratch_root(const char* prefix) {
  struct Root {
    std::filesystem::path path;
    pid_t owner = getpid();
    ~Root() {
      if (getpid() != owner) return;
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const Root root{[prefix] {
    const char* env = std::getenv("ENGINE_TEST_TMP");
    const std::filesystem::path p =
        std::filesystem::path(env && *env ? env : "/tmp") / (std::string(prefix) + "_" + std::to_string(getpid()));
    std::filesystem::create_directories(p);
    return p;
  }()};
  return root.path;
}

}  // namespace test_util
