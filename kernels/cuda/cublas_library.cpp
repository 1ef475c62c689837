// cublas_library() (kernels/cuda/cublas_library.h): dlopen on first use.
#include "kernels/cuda/cublas_library.h"

#include <cstdlib>
#include <stdexcept>
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
  resolve_symbol(handle, "cublasSetMathMode", lib.set_math_mode, missing);
  resolve_symbol(handle, "cublasSetAtomicsMode", lib.set_atomics_mode, missing);
  resolve_symbol(handle, "cublasGetStatusString", lib.status_string, missing);
  resolve_symbol(handle, "cublasGetProperty", lib.get_property, missing);
  resolve_symbol(handle, "cublasSgemm_v2", lib.sgemm, missing);
  resolve_symbol(handle, "cublasGemmEx", lib.gemm_ex, missing);
  return lib;
}

}  // namespace

std::string cublas_library_name() {
  const char* env = std::getenv("ENGINE_CUBLAS_LIBRARY");
  return env && *env ? env : soname();
}

const CublasLibrary& cublas_library() { return load_once(open_library); }

}  // namespace engine::kernels::cuda
