// The same run on every CPU-kernel path this CPU can run (ENGINE_CPU_KERNELS=avx512,
// avx2, portable) and at 1 and 2 threads: `engine diff` calls every last.h5 identical
// to the default path's at 2 threads. 2 epochs of 2,000 images (the portable path is
// the slow one: a minute or two).
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_util.h"
#include "kernels/cpu/cpu_features.h"

using namespace test_util;
namespace cpu = engine::kernels::cpu;

namespace {

std::string paths_run(const std::string& run_dir) {
  return "train \"" + source_dir() + "/configs/mnist.json\" --device cpu --run-dir \"" + run_dir +
         "\" --set data.dir=\"" + data_dir() + "\" --set data.train_limit=2000 --set data.val_split=500" +
         " --set data.test_limit=500 --set train.epochs=2 --set logging.tensorboard=false";
}

}  // namespace

TEST_CASE("every CPU-kernel path and thread count trains to the same bits") {
  if (!dataset_available()) return;
  const std::string base = fresh_dir("cpu_paths");
  const RunResult ref = run_with_env("OMP_NUM_THREADS=2", paths_run(base + "/default_2"));
  INFO(ref.output);
  REQUIRE(ref.exit_code == 0);
  int runs = 0;
  for (cpu::CpuKernels path : {cpu::CpuKernels::Avx512, cpu::CpuKernels::Avx2, cpu::CpuKernels::Portable}) {
    const std::string name = cpu::cpu_kernels_name(path);
    if (!cpu::cpu_supports(path)) {
      MESSAGE(name << ": this CPU cannot run it; skipped");
      continue;
    }
    for (int threads : {1, 2}) {
      const std::string dir = base + "/" + name + "_" + std::to_string(threads);
      CAPTURE(dir);
      const RunResult r =
          run_with_env("ENGINE_CPU_KERNELS=" + name + " OMP_NUM_THREADS=" + std::to_string(threads), paths_run(dir));
      INFO(r.output);
      REQUIRE(r.exit_code == 0);
      const RunResult d = run("diff \"" + base + "/default_2/last.h5\" \"" + dir + "/last.h5\"");
      INFO(d.output);
      CHECK(d.exit_code == 0);
      CHECK(d.output.find("verdict: identical") != std::string::npos);
      ++runs;
    }
  }
  CHECK(runs >= 2);  // the portable path runs everywhere
}

// The flags the bits depend on (-ffp-contract=off, the target's baseline) are set for
// every build type: a Debug build (-O0, CPU-only; CTest builds it in the fixture
// cpu_paths_debug_build and names it in $ENGINE_DEBUG_BIN) trains to the Release build's
// bits, on every path this CPU can run.
TEST_CASE("a Debug build trains to the same bits as the Release build") {
  if (!dataset_available()) return;
  const char* debug_bin = std::getenv("ENGINE_DEBUG_BIN");
  if (!debug_bin) {
    MESSAGE("ENGINE_DEBUG_BIN is not set (CTest sets it): skipped");
    return;
  }
  REQUIRE(std::filesystem::exists(debug_bin));
  const std::string base = fresh_dir("cpu_paths_debug");
  const std::string args = "train \"" + source_dir() + "/configs/mnist.json\" --device cpu --set data.dir=\"" +
                           data_dir() + "\" --set data.train_limit=500 --set data.val_split=100" +
                           " --set data.test_limit=200 --set train.epochs=2 --set logging.tensorboard=false";
  const RunResult version = run_program("", debug_bin, "--version");
  INFO(version.output);
  REQUIRE(version.exit_code == 0);
  for (cpu::CpuKernels path : {cpu::CpuKernels::Avx512, cpu::CpuKernels::Avx2, cpu::CpuKernels::Portable}) {
    const std::string name = cpu::cpu_kernels_name(path);
    if (!cpu::cpu_supports(path)) continue;
    const std::string env = "ENGINE_CPU_KERNELS=" + name + " OMP_NUM_THREADS=2";
    const RunResult release = run_with_env(env, args + " --run-dir \"" + base + "/release_" + name + "\"");
    INFO(release.output);
    REQUIRE(release.exit_code == 0);
    const RunResult debug = run_program(env, debug_bin, args + " --run-dir \"" + base + "/debug_" + name + "\"");
    INFO(debug.output);
    REQUIRE(debug.exit_code == 0);
    const RunResult d =
        run("diff \"" + base + "/release_" + name + "/last.h5\" \"" + base + "/debug_" + name + "/last.h5\"");
    CAPTURE(name);
    INFO(d.output);
    CHECK(d.exit_code == 0);
    CHECK(d.output.find("verdict: identical") != std::string::npos);
  }
}
