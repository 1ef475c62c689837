// `engine --version` / `engine version` and the library's build_info().
#include <doctest/doctest.h>

#include <regex>
#include <string>

#include "cli_util.h"
#include "engine/core/build_info.h"
#include "engine/io/checkpoint.h"

using namespace test_util;

namespace {
bool has_line(const std::string& text, const std::string& pattern) {
  return std::regex_search(text, std::regex("(^|\n)" + pattern + "\n"));
}
}  // namespace

TEST_CASE("build_info names the engine, HDF5, the CPU kernels, OpenMP and the CUDA backend") {
  const engine::BuildInfo info = engine::build_info();
  CHECK(std::regex_match(info.engine_version, std::regex(R"(\d+\.\d+\.\d+)")));
  CHECK(std::regex_match(info.hdf5, std::regex(R"(\d+\.\d+\.\d+)")));
  CHECK(std::regex_match(info.cpu_kernels, std::regex(R"((avx512|avx2|portable) \(\d+ threads?(, ENGINE_CPU_KERNELS)?\).*)")));
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
    CHECK(has_line(r.output, "engine " + info.engine_version));
    CHECK(has_line(r.output, "HDF5: " + info.hdf5));
    CHECK(has_line(r.output, "cpu kernels: " + std::regex_replace(info.cpu_kernels, std::regex(R"([()])"), R"(\$&)")));
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
  for (const char* path : {"avx512", "avx2", "portable"}) {
    CAPTURE(path);
    const RunResult r = run_with_env(std::string("ENGINE_CPU_KERNELS=") + path, "--version");
    INFO(r.output);
    const bool runs = r.exit_code == 0;
    if (runs) {
      CHECK(has_line(r.output, std::string("cpu kernels: ") + path + R"( \(\d+ threads?, ENGINE_CPU_KERNELS\).*)"));
    } else {
      CHECK(r.exit_code == 2);
      CHECK(r.output == std::string("engine: ENGINE_CPU_KERNELS=") + path + ": this CPU cannot run it (it runs: " +
                            r.output.substr(r.output.find("(it runs: ") + 10));
    }
    CHECK((std::string(path) == "portable" ? runs : true));
  }
  for (const char* cmd : {"--version", "inspect none.h5", "train none.json"}) {
    CAPTURE(cmd);
    const RunResult r = run_with_env("ENGINE_CPU_KERNELS=sse9", cmd);
    CHECK(r.exit_code == 2);
    CHECK(r.output == "engine: ENGINE_CPU_KERNELS=sse9: not a path (avx512, avx2 or portable)\n");
  }
}
