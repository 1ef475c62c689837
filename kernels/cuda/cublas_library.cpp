// cublas_library() (kernels/cuda/cublas_library.h): dlopen on first use.
#include "kernels/cuda/cublas_library.h"

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/shared_library.h"

namespace engine::kernels::cuda {

namespace {

std::string soname() { return "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR); }

CublasLibrary open_library() {
  const std::string name = cublas_library_name();
  std::vector<std::string> files = {name};
#ifdef ENGINE_CUBLAS_TOOLKIT_DIR
  if (name == soname()) files.push_back(std::string(ENGINE_CUBLAS_TOOLKIT_DIR) + "/" + name);  // off the loader's path
#endif
  std::string why;
  void* handle = open_shared_library(files, why);
  if (!handle)
    throw std::runtime_error("cannot load cuBLAS " + name + " (" + why +
                             "); put its folder (/usr/local/cuda/lib64, or PyTorch's site-packages/nvidia/cublas/lib) "
                             "on LD_LIBRARY_PATH, set ENGINE_CUBLAS_LIBRARY to the file, or use --device cpu");
  const std::string missing = "cuBLAS " + name + " has no symbol ";
  CublasLibrary lib;
  resolve_symbol(handle, "cublasCreate_v2", lib.create, missing);
  resolve_symbol(handle, "cublasSetStream_v2", lib.set_stream, missing);
  resolve_symbol(handle, "cublasSetWorkspace_v2", lib.set_workspace, missing);
  resolve_symbol(handle, "cublasSetMathMode", lib.set_math_mode, missing);
  resolve_symbol(handle, "cublasSetAtomicsMode", lib.set_atomics_mode, missing);
  resolve_symbol(handle, "cublasGetStatusString", lib.status_string, missing);
  resolve_symbol(handle, "cublasGetProperty", lib.get_property, missing);
  resolve_symbol(handle, "cublasSgemm_v2", lib.sgemm, missing);
  resolve_symbol(handle, "cublasGemmEx", lib.gemm_ex, missing);
  return lib;
}

}  // namespace

void bind_cublas_handle(const CublasLibrary& lib, cublasHandle_t h, cudaStream_t stream, void* workspace,
                        std::size_t bytes) {
  const auto check = [&](cublasStatus_t st, const char* call) {
    if (st != CUBLAS_STATUS_SUCCESS)
      throw std::runtime_error(std::string("cuBLAS error: ") + lib.status_string(st) + " in " + call);
  };
  if (!workspace || bytes == 0) throw std::logic_error("bind_cublas_handle: no workspace");
  check(lib.set_stream(h, stream), "cublasSetStream");
  // After the stream, which resets the workspace (see the header).
  check(lib.set_workspace(h, workspace, bytes), "cublasSetWorkspace");
  // Plain fp32 arithmetic: no TF32 tensor-core math (that would need
  // CUBLAS_TF32_TENSOR_OP_MATH), so GEMMs stay close to the fp32 CPU reference.
  check(lib.set_math_mode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  // Atomics-free kernels only (the default, stated because determinism relies on it).
  check(lib.set_atomics_mode(h, CUBLAS_ATOMICS_NOT_ALLOWED), "cublasSetAtomicsMode");
}

std::string cublas_library_name() {
  const char* env = std::getenv("ENGINE_CUBLAS_LIBRARY");
  return env && *env ? env : soname();
}

const CublasLibrary& cublas_library() { return load_once(open_library); }

}  // namespace engine::kernels::cuda
