// What this build of the engine is made of, and the GPU it finds: the answer to
// `engine --version`, for bug reports and benchmark records.
#pragma once
#include <string>
#include <vector>

namespace engine {

enum class CudaBackend { Off, On };

struct BuildInfo {
  std::string engine_version;  // the project version, e.g. "0.1.0"
  CudaBackend cuda = CudaBackend::Off;
  // With the CUDA backend on (empty otherwise):
  std::string cuda_runtime;  // CUDA runtime version compiled against, e.g. "13.0"
  std::string cudnn;         // library in use, with the headers' version, e.g. "9.13.0 (headers 9.13.0)"
  std::string cublas;        // likewise
  std::string cuda_driver;   // CUDA version the installed driver supports; "" without a driver
  std::vector<std::string> gpus;  // one description per visible GPU; empty: no CUDA device
  // Always:
  std::string hdf5;    // HDF5 library version in use
  // The CPU kernels' instruction-set path and threads, e.g. "avx512 (2 threads)"
  // (cpu_kernels_in_use); "unusable: ..." when ENGINE_CPU_KERNELS asks for what the CPU lacks.
  std::string cpu_kernels;
  std::string openmp;  // OpenMP version the compiler implements, e.g. "4.5 (201511)"
};

// Never throws for a missing GPU or driver: those are ordinary answers.
BuildInfo build_info();

// The CPU kernels' path (avx512, avx2 or portable: chosen from CPUID, or forced by the
// environment variable ENGINE_CPU_KERNELS) and the threads, e.g. "avx2 (2 threads)".
// Every path gives the same bits. Throws std::runtime_error, one line naming the
// variable, when it names no path or one this CPU cannot run.
std::string cpu_kernels_in_use();

// One "name: value" line per component, as `engine --version` prints it.
std::string to_string(const BuildInfo& info);

}  // namespace engine
