// `engine --version` / `engine version` and the library's build_info().
#include <doctest/doctest.h>

#include <cstdlib>
#include <regex>
#include <string>

#include "cli_util.h"
#include "engine/core/build_info.h"
#include "engine/io/checkpoint.h"
#include "kernels/cpu/cpu_features.h"

using namespace test_util;

namespace {
bool has_line(const std::string& text, const std::string& pattern) {
  return std::regex_search(text, std::regex("(^|\n)" + pattern + "\n"));
}

// `s` as a regex that matches it literally.
std::string regex_escape(const std::string& s) {
  return std::regex_replace(s, std::regex(R"([.()+*?^$|\[\]{}\\])"), R"(\$&)");
}

using engine::kernels::cpu::CpuKernels;
constexpr CpuKernels kPaths[] = {CpuKernels::Avx512, CpuKernels::Avx2, CpuKernels::Portable};

// What this CPU runs, fastest first, as the feature check answers it ("avx2, portable").
std::string supported_paths() {
  std::string s;
  for (CpuKernels k : kPaths)
    if (engine::kernels::cpu::cpu_supports(k)) s += (s.empty() ? "" : ", ") + std::string(cpu_kernels_name(k));
  return s;
}
}  // namespace

TEST_CASE("build_info names the engine, HDF5, the CPU kernels, OpenMP and the CUDA backend") {
  const engine::BuildInfo info = engine::build_info();
  // The versions CMake knows (tests/CMakeLists.txt), not the library's own answer.
  CHECK(info.engine_version == ENGINE_TEST_PROJECT_VERSION);
#if defined(ENGINE_TEST_HDF5_VERSION)
  CHECK(info.hdf5 == ENGINE_TEST_HDF5_VERSION);
#else
  CHECK(std::regex_match(info.hdf5, std::regex(R"(\d+\.\d+\.\d+)")));
#endif
  // The path the CPU kernels run is the fastest this CPU supports (no ENGINE_CPU_KERNELS
  // in the test's environment), or the forced one.
  const std::string fastest = supported_paths().substr(0, supported_paths().find(','));
  if (std::getenv("ENGINE_CPU_KERNELS") == nullptr)
    CHECK(std::regex_match(info.cpu_kernels, std::regex(fastest + R"( \(\d+ threads?\).*)")));
  else
    CHECK(std::regex_match(info.cpu_kernels, std::regex(R"((avx512|avx2|portable) \(\d+ threads?, ENGINE_CPU_KERNELS\).*)")));
  CHECK(!info.openmp.empty());
#if defined(ENGINE_WITH_CUDA)
  CHECK(info.cuda == engine::CudaBackend::On);
  CHECK(std::regex_match(info.cuda_runtime, std::regex(R"(\d+\.\d+)")));
  CHECK(std::regex_match(info.cudnn, std::regex(R"(\d+\.\d+\.\d+ \(headers \d+\.\d+\.\d+\))")));
  CHECK(std::regex_match(info.cublas, std::regex(R"(\d+\.\d+\.\d+ \(headers \d+\.\d+\.\d+\))")));
#else
  CHECK(info.cuda == engine::CudaBackend::Off);
  CHECK(info.cuda_runtime.empty());
  CHECK(info.gpus.empty());
#endif
}

TEST_CASE("engine --version and engine version print the build") {
  const engine::BuildInfo info = engine::build_info();
  for (const char* cmd : {"--version", "version"}) {
    CAPTURE(cmd);
    const RunResult r = run(cmd);
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(has_line(r.output, regex_escape("engine " ENGINE_TEST_PROJECT_VERSION)));
#if defined(ENGINE_TEST_HDF5_VERSION)
    CHECK(has_line(r.output, regex_escape("HDF5: " ENGINE_TEST_HDF5_VERSION)));
#endif
    CHECK(has_line(r.output, "cpu kernels: " + regex_escape(info.cpu_kernels)));
    CHECK(has_line(r.output, "OpenMP: .+"));
    // The parser's confinement as this machine gives it (test_crafted checks the filter
    // itself; tests/aarch64.sh the line without it, under qemu-user).
    const engine::CheckpointParserConfinement parser = engine::checkpoint_parser_confinement();
    CHECK(r.output.find("\ncheckpoint parser: " + parser.summary + "\n") != std::string::npos);
#if defined(ENGINE_WITH_CUDA)
    CHECK(has_line(r.output, R"(CUDA backend: on \(built against CUDA runtime \d+\.\d+\))"));
    CHECK(has_line(r.output, R"(cuDNN: \d+\.\d+\.\d+ \(headers \d+\.\d+\.\d+\))"));
    CHECK(has_line(r.output, R"(cuBLAS: \d+\.\d+\.\d+ \(headers \d+\.\d+\.\d+\))"));
    CHECK(has_line(r.output, "CUDA driver: .+"));
    // A machine without a GPU says so; one with a GPU names it.
    if (info.gpus.empty())
      CHECK(has_line(r.output, "GPU: no CUDA device"));
    else
      CHECK(r.output.find("\nGPU 0: " + info.gpus[0] + "\n") != std::string::npos);
#else
    CHECK(has_line(r.output, R"(CUDA backend: off .*)"));
#endif
  }
}

TEST_CASE("ENGINE_CPU_KERNELS forces a path; one this CPU lacks, or none, is a one-line error and exit 2") {
  // Whether a forced path runs, and the list the refusal gives, follow this CPU's
  // features as the test reads them, and the portable path runs everywhere.
  REQUIRE(engine::kernels::cpu::cpu_supports(CpuKernels::Portable));
  for (CpuKernels k : kPaths) {
    const std::string path = cpu_kernels_name(k);
    CAPTURE(path);
    const RunResult r = run_with_env("ENGINE_CPU_KERNELS=" + path, "--version");
    INFO(r.output);
    if (engine::kernels::cpu::cpu_supports(k)) {
      CHECK(r.exit_code == 0);
      CHECK(has_line(r.output, "cpu kernels: " + path + R"( \(\d+ threads?, ENGINE_CPU_KERNELS\).*)"));
    } else {
      CHECK(r.exit_code == 2);
      CHECK(r.output == "engine: ENGINE_CPU_KERNELS=" + path + ": this CPU cannot run it (it runs: " +
                            supported_paths() + ")\n");
    }
  }
  for (const char* cmd : {"--version", "inspect none.h5", "train none.json"}) {
    CAPTURE(cmd);
    const RunResult r = run_with_env("ENGINE_CPU_KERNELS=sse9", cmd);
    CHECK(r.exit_code == 2);
    CHECK(r.output == "engine: ENGINE_CPU_KERNELS=sse9: not a path (avx512, avx2 or portable)\n");
  }
}
