// backend_versions() (kernels/cuda_runtime.h): the CUDA, cuDNN and cuBLAS versions this
// build was compiled against and links, and what the driver supports. None of these
// calls needs a GPU.
#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cublas_library.h"
#include "kernels/cuda_runtime.h"

namespace engine::kernels::cuda {

namespace {

// CUDA encodes versions as 1000 * major + 10 * minor (13000 is 13.0).
std::string cuda_version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

// cuDNN 9 encodes versions as 10000 * major + 100 * minor + patch.
std::string cudnn_version_text(std::size_t v) {
  return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." +
         std::to_string(v % 100);
}

// Loads the library (kernels/cuda/cublas_library.h): --version says whether it loads.
std::string cublas_runtime_version() {
  int major = 0, minor = 0, patch = 0;
  try {
    const CublasLibrary& lib = cublas_library();
    if (lib.get_property(MAJOR_VERSION, &major) != CUBLAS_STATUS_SUCCESS ||
        lib.get_property(MINOR_VERSION, &minor) != CUBLAS_STATUS_SUCCESS ||
        lib.get_property(PATCH_LEVEL, &patch) != CUBLAS_STATUS_SUCCESS)
      return "unknown";
  } catch (const std::runtime_error&) {
    return cublas_library_name() + " not loadable";
  }
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

}  // namespace

BackendVersions backend_versions() {
  BackendVersions v;
  v.runtime = cuda_version_text(CUDART_VERSION);
  v.cudnn = cudnn_version_text(cudnnGetVersion()) + " (headers " +
            cudnn_version_text(CUDNN_VERSION) + ")";
  v.cublas = cublas_runtime_version() + " (headers " + std::to_string(CUBLAS_VER_MAJOR) + "." +
             std::to_string(CUBLAS_VER_MINOR) + "." + std::to_string(CUBLAS_VER_PATCH) + ")";
  int driver = 0;
  // Success with 0 means no driver is installed; an error means the same to us.
  if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0)
    v.driver = cuda_version_text(driver);
  else
    (void)cudaGetLastError();
  return v;
}

}  // namespace engine::kernels::cuda
