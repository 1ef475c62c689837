// cublas_library() (kernels/cuda/cublas_library.h): dlopen on first use.
#include "kernels/cuda/cublas_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <type_traits>

namespace engine::kernels::cuda {

namespace {

std::string soname() { return "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR); }

CublasLibrary open_library() {
  const std::string name = cublas_library_name();
  // dlerror() returns the message once, then null.
  auto last_error = [] {
    const char* e = dlerror();
    return std::string(e ? e : "unknown error");
  };
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string why = handle ? "" : last_error();
#ifdef ENGINE_CUBLAS_TOOLKIT_DIR
  if (!handle && name == soname()) {  // the toolkit the build used, off the loader's path
    const std::string at = std::string(ENGINE_CUBLAS_TOOLKIT_DIR) + "/" + name;
    handle = dlopen(at.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) why += "; " + at + ": " + last_error();
  }
#endif
  if (!handle)
    throw std::runtime_error("cannot load cuBLAS " + name + " (" + why +
                             "); put its folder (/usr/local/cuda/lib64, or PyTorch's site-packages/nvidia/cublas/lib) "
                             "on LD_LIBRARY_PATH, set ENGINE_CUBLAS_LIBRARY to the file, or use --device cpu");
  CublasLibrary lib;
  auto resolve = [&](auto& fn, const char* symbol) {
    void* p = dlsym(handle, symbol);
    if (!p) throw std::runtime_error("cuBLAS " + name + " has no symbol " + symbol);
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
  resolve(lib.create, "cublasCreate_v2");
  resolve(lib.set_stream, "cublasSetStream_v2");
  resolve(lib.set_math_mode, "cublasSetMathMode");
  resolve(lib.set_atomics_mode, "cublasSetAtomicsMode");
  resolve(lib.status_string, "cublasGetStatusString");
  resolve(lib.get_property, "cublasGetProperty");
  resolve(lib.sgemm, "cublasSgemm_v2");
  resolve(lib.gemm_ex, "cublasGemmEx");
  return lib;  // the handle stays open: handles may be destroyed as late as exit
}

}  // namespace

std::string cublas_library_name() {
  const char* env = std::getenv("ENGINE_CUBLAS_LIBRARY");
  return env && *env ? env : soname();
}

const CublasLibrary& cublas_library() {
  static std::mutex mutex;
  static CublasLibrary lib;
  static bool loaded = false;
  std::lock_guard<std::mutex> hold(mutex);
  if (!loaded) {
    lib = open_library();
    loaded = true;
  }
  return lib;
}

}  // namespace engine::kernels::cuda
