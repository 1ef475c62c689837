// cuBLAS, opened with dlopen on first use instead of linked: libcublasLt alone makes a
// process ~210 MB larger the moment it is mapped, which every CPU-only run of a CUDA
// build used to pay (peak RSS of `engine train --device cpu`: 309 MiB, 235 MiB of it
// before the first step), and a CUDA build now runs on a host without cuBLAS until a
// CUDA op needs it. cublas_api.h gives the types and, through decltype, the exact
// signatures (the NCCL collective loads libnccl the same way).
//
// The library is libcublas.so.<major of the headers> on the loader's path (the
// program's RUNPATH, LD_LIBRARY_PATH, ld.so.cache), then the same file in the toolkit
// folder the build found; ENGINE_CUBLAS_LIBRARY, when set, names the file instead.
#pragma once
#include <cublas_api.h>

#include <cstddef>
#include <string>

namespace engine::kernels::cuda {

// cublasGemmEx with a cublasComputeType_t (the header adds a C++ overload taking the
// older cudaDataType; the cast picks the library's own and checks its signature).
using CublasGemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                        const void*, const void*, cudaDataType, int, const void*, cudaDataType, int,
                                        const void*, void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

struct CublasLibrary {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSetAtomicsMode) set_atomics_mode = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
  decltype(&cublasGetProperty) get_property = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  decltype(static_cast<CublasGemmEx>(&cublasGemmEx)) gemm_ex = nullptr;
};

// The process's cuBLAS, loaded once; throws std::runtime_error naming the file and
// what to do when it cannot be loaded (retried on the next call).
const CublasLibrary& cublas_library();

// The workspace every handle of the engine is given: cuBLAS's recommendation for Hopper
// (4 MiB for earlier GPUs; more is harmless).
constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20;

// Binds handle `h` to `stream` with `workspace` (`bytes`, device memory the caller keeps
// for the handle's life) as its workspace, plain fp32 math and no atomics. The workspace
// is set after the stream because cublasSetStream resets it to cuBLAS's own: without one
// of the engine's, a GEMM captured into a CUDA graph records cuBLAS's cudaMallocAsync and
// cudaFreeAsync into the graph, outside the engine's buffers, and may choose another
// kernel than the eager call did. Throws std::runtime_error naming the failing call.
void bind_cublas_handle(const CublasLibrary& lib, cublasHandle_t h, cudaStream_t stream, void* workspace,
                        std::size_t bytes);

// The file cublas_library() opens or would open.
std::string cublas_library_name();

}  // namespace engine::kernels::cuda
