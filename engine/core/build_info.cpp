// engine --version: the versions this build was made with and finds at run time.
#include "engine/core/build_info.h"

#include <H5public.h>

#include <sstream>
#include <stdexcept>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cuda_runtime.h"

#ifndef ENGINE_VERSION
#define ENGINE_VERSION "0.0.0-dev"  // standalone builds; CMake defines the real one
#endif

namespace engine {

namespace {

std::string openmp_version() {
#if defined(_OPENMP)
  const long date = _OPENMP;
  const char* name = "";
  // The specification release each date macro value stands for.
  if (date >= 202111) name = "5.2";
  else if (date >= 202011) name = "5.1";
  else if (date >= 201811) name = "5.0";
  else if (date >= 201511) name = "4.5";
  else if (date >= 201307) name = "4.0";
  else if (date >= 201107) name = "3.1";
  else if (date >= 200805) name = "3.0";
  return std::string(name) + (name[0] ? " " : "") + "(" + std::to_string(date) + ")";
#else
  return "off";
#endif
}

std::string hdf5_version() {
  unsigned major = 0, minor = 0, release = 0;
  if (H5get_libversion(&major, &minor, &release) < 0) return "unknown";
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

}  // namespace

std::string cpu_kernels_in_use() {
  try {
    return kernels::cpu::cpu_kernels_description();
  } catch (const kernels::cpu::CpuKernelsError& e) {
    throw std::runtime_error(e.what());
  }
}

BuildInfo build_info() {
  BuildInfo info;
  info.engine_version = ENGINE_VERSION;
  if (kernels::cuda::built()) {
    info.cuda = CudaBackend::On;
    const kernels::cuda::BackendVersions v = kernels::cuda::backend_versions();
    info.cuda_runtime = v.runtime;
    info.cudnn = v.cudnn;
    info.cublas = v.cublas;
    info.cuda_driver = v.driver;
    for (int i = 0; i < kernels::cuda::device_count(); ++i)
      info.gpus.push_back(kernels::cuda::device_name(i));
  }
  info.hdf5 = hdf5_version();
  try {
    info.cpu_kernels = cpu_kernels_in_use();
  } catch (const std::runtime_error& e) {
    info.cpu_kernels = std::string("unusable: ") + e.what();
  }
  info.openmp = openmp_version();
  return info;
}

std::string to_string(const BuildInfo& info) {
  std::ostringstream out;
  out << "engine " << info.engine_version << "\n";
  if (info.cuda == CudaBackend::On) {
    out << "CUDA backend: on (built against CUDA runtime " << info.cuda_runtime << ")\n";
    out << "cuDNN: " << info.cudnn << "\n";
    out << "cuBLAS: " << info.cublas << "\n";
    out << "CUDA driver: "
        << (info.cuda_driver.empty() ? "none found" : "supports CUDA " + info.cuda_driver) << "\n";
    if (info.gpus.empty()) out << "GPU: no CUDA device\n";
    for (std::size_t i = 0; i < info.gpus.size(); ++i)
      out << "GPU " << i << ": " << info.gpus[i] << "\n";
  } else {
    out << "CUDA backend: off (CPU-only build)\n";
  }
  out << "HDF5: " << info.hdf5 << "\n";
  out << "cpu kernels: " << info.cpu_kernels << "\n";
  out << "OpenMP: " << info.openmp << "\n";
  return out.str();
}

}  // namespace engine
