// The cuBLAS handle's set-up (kernels/cuda/cublas_library.h, bind_cublas_handle), on the
// CPU: a CUDA build's host code, run against a cuBLAS of fakes that records each call.
// cublasSetStream resets a handle's workspace to cuBLAS's own, which then allocates with
// cudaMallocAsync inside a CUDA graph's capture: the engine's workspace must be the one
// set last, after the stream.
#include <doctest/doctest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cublas_library.h"

namespace {

struct Call {
  std::string name;
  const void* handle;
  const void* arg;
  std::size_t bytes;
};
std::vector<Call> g_calls;
cublasStatus_t g_fail_workspace = CUBLAS_STATUS_SUCCESS;

cublasStatus_t fake_set_stream(cublasHandle_t h, cudaStream_t s) {
  g_calls.push_back({"set_stream", h, s, 0});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t fake_set_workspace(cublasHandle_t h, void* w, size_t bytes) {
  g_calls.push_back({"set_workspace", h, w, bytes});
  return g_fail_workspace;
}
cublasStatus_t fake_set_math_mode(cublasHandle_t h, cublasMath_t mode) {
  g_calls.push_back({"set_math_mode", h, nullptr, static_cast<std::size_t>(mode)});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t fake_set_atomics_mode(cublasHandle_t h, cublasAtomicsMode_t mode) {
  g_calls.push_back({"set_atomics_mode", h, nullptr, static_cast<std::size_t>(mode)});
  return CUBLAS_STATUS_SUCCESS;
}
const char* fake_status_string(cublasStatus_t st) {
  return st == CUBLAS_STATUS_ALLOC_FAILED ? "CUBLAS_STATUS_ALLOC_FAILED" : "other";
}

engine::kernels::cuda::CublasLibrary fake_library() {
  engine::kernels::cuda::CublasLibrary lib;
  lib.set_stream = fake_set_stream;
  lib.set_workspace = fake_set_workspace;
  lib.set_math_mode = fake_set_math_mode;
  lib.set_atomics_mode = fake_set_atomics_mode;
  lib.status_string = fake_status_string;
  return lib;
}

}  // namespace

TEST_CASE("bind_cublas_handle sets the engine's workspace after the stream, then the math") {
  g_calls.clear();
  g_fail_workspace = CUBLAS_STATUS_SUCCESS;
  alignas(64) static unsigned char handle_storage[64], stream_storage[64], workspace[64];
  auto* h = reinterpret_cast<cublasHandle_t>(handle_storage);
  auto* stream = reinterpret_cast<cudaStream_t>(stream_storage);
  const std::size_t bytes = engine::kernels::cuda::kCublasWorkspaceBytes;
  engine::kernels::cuda::bind_cublas_handle(fake_library(), h, stream, workspace, bytes);
  REQUIRE(g_calls.size() == 4);
  int last_stream = -1, last_workspace = -1;
  for (int i = 0; i < static_cast<int>(g_calls.size()); ++i) {
    CHECK(g_calls[i].handle == static_cast<const void*>(h));
    if (g_calls[i].name == "set_stream") last_stream = i;
    if (g_calls[i].name == "set_workspace") last_workspace = i;
  }
  REQUIRE(last_stream >= 0);
  REQUIRE(last_workspace >= 0);
  CHECK(last_workspace > last_stream);  // cublasSetStream resets the workspace
  CHECK(g_calls[last_stream].arg == static_cast<const void*>(stream));
  CHECK(g_calls[last_workspace].arg == static_cast<const void*>(workspace));
  CHECK(g_calls[last_workspace].bytes == bytes);
  // At least cuBLAS's recommendation for Hopper (32 MiB).
  CHECK(bytes >= (std::size_t{32} << 20));
  CHECK(g_calls[2].name == "set_math_mode");
  CHECK(g_calls[2].bytes == static_cast<std::size_t>(CUBLAS_DEFAULT_MATH));
  CHECK(g_calls[3].name == "set_atomics_mode");
  CHECK(g_calls[3].bytes == static_cast<std::size_t>(CUBLAS_ATOMICS_NOT_ALLOWED));
}

TEST_CASE("bind_cublas_handle: a failing call is one line naming it; no workspace is refused") {
  g_calls.clear();
  alignas(64) static unsigned char handle_storage[64], workspace[64];
  auto* h = reinterpret_cast<cublasHandle_t>(handle_storage);
  g_fail_workspace = CUBLAS_STATUS_ALLOC_FAILED;
  std::string what;
  try {
    engine::kernels::cuda::bind_cublas_handle(fake_library(), h, nullptr, workspace, 1024);
  } catch (const std::runtime_error& e) {
    what = e.what();
  }
  CHECK(what == "cuBLAS error: CUBLAS_STATUS_ALLOC_FAILED in cublasSetWorkspace");
  g_fail_workspace = CUBLAS_STATUS_SUCCESS;
  CHECK_THROWS_AS(engine::kernels::cuda::bind_cublas_handle(fake_library(), h, nullptr, nullptr, 1024),
                  std::logic_error);
}
