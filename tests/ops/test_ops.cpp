// The registry's own checks: every op of the op list (kernels/op_list.inc) has at least
// one case (a new op without one fails here), and cuda is present where it must be
// (ENGINE_TEST_OPS_REQUIRE_CUDA=1, the `gpu`-labelled run of this executable).
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <set>
#include <string>

#include "ops/harness.h"

using namespace ops_test;

namespace {
// ENGINE_TEST_OPS_REQUIRE_CUDA=skip (the `gpu_test_ops` ctest entry): without cuda there
// is nothing this run adds, so it exits 77 (skipped) before doctest's main. =1 (tools/
// gpu-check.sh) makes the absence a failure instead (the test case below).
struct SkipWithoutCuda {
  SkipWithoutCuda() {
    const char* require = std::getenv("ENGINE_TEST_OPS_REQUIRE_CUDA");
    if (require && std::string(require) == "skip" && !cuda_absent_reason().empty()) {
      std::printf("cuda not present (%s): skipping\n", cuda_absent_reason().c_str());
      std::fflush(stdout);
      std::exit(77);
    }
  }
} skip_without_cuda;
}  // namespace

TEST_CASE("registry: every op of kernels::kOps has at least one declared case") {
  std::set<std::string> covered;
  for (const OpCase& c : registry()) {
    std::size_t at = 0;
    while (at <= c.ops.size()) {
      const std::size_t comma = c.ops.find(',', at);
      std::string name = c.ops.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
      name.erase(0, name.find_first_not_of(' '));
      name.erase(name.find_last_not_of(' ') + 1);
      covered.insert(name);
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
  }
  for (const auto& op : engine::kernels::kOps) {
    INFO("op " << op.name << " has no case in tests/ops/ (declare one with OP_CASE)");
    CHECK(covered.count(op.name) == 1);
  }
  int per_backend = 0, cuda_checks = 0;
  for (const OpCase& c : registry()) {
    const int ops = static_cast<int>(std::count(c.ops.begin(), c.ops.end(), ',')) + 1;
    const bool cpu = c.where != Where::CudaOnly && runs_ops(backends().front(), c.ops.c_str(), c.precision);
    per_backend += cpu ? ops : 0;
    cuda_checks += c.where != Where::CpuOnly ? ops : 0;
  }
  MESSAGE("(op, case, backend) checks: cpu " << per_backend << ", cuda " << cuda_checks << " when present");
  MESSAGE(registry().size() << " cases over " << engine::kernels::kOpCount << " ops; backends present: "
                            << backends().size() << std::string(backends().size() > 1 ? " (cpu, cuda)" : " (cpu)"));
}

TEST_CASE("backends: cuda present when required") {
  const char* require = std::getenv("ENGINE_TEST_OPS_REQUIRE_CUDA");
  const bool required = require && std::string(require) == "1";
  if (cuda_absent_reason().empty()) {
    MESSAGE("cuda: present");
  } else if (required) {
    FAIL_CHECK("ENGINE_TEST_OPS_REQUIRE_CUDA=1 but cuda is not present: " << cuda_absent_reason());
  } else {
    MESSAGE("cuda: not present (" << cuda_absent_reason() << "); the cuda checks are not run");
  }
}
