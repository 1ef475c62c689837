// Which instruction-set path the CPU kernels run (kernels/cpu/gemm.h): chosen once from
// CPUID and XCR0 (what the CPU has and the OS saves on a context switch), or forced by
// the environment variable ENGINE_CPU_KERNELS=avx512|avx2|portable, which reaches every
// rank under mpirun. Every path gives the same bits; only the speed differs.
#pragma once
#include <stdexcept>
#include <string>

namespace engine::kernels::cpu {

// ENGINE_CPU_KERNELS names no path, or one this CPU lacks: one line naming the variable.
struct CpuKernelsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class CpuKernels { Avx512, Avx2, Portable };

const char* cpu_kernels_name(CpuKernels k);
// What this CPU (and OS) can run.
bool cpu_supports(CpuKernels k);
// FMA in hardware. Without it the portable path's std::fma is glibc's correctly rounded
// software fma: the same bits, many times slower.
bool cpu_has_hardware_fma();

// The path in use: ENGINE_CPU_KERNELS when set, else the fastest the CPU supports.
// Throws CpuKernelsError when the variable names no path or one the CPU lacks.
CpuKernels cpu_kernels();
// "avx512 (2 threads)"-style text for --version: the path, why (forced or detected),
// and a note when the portable path has no hardware FMA.
std::string cpu_kernels_description();

// The threads the CPU kernels' parallel regions use when started from the calling
// thread (OMP_NUM_THREADS at start). Every count gives the same bits, so it may change
// between any two ops.
int cpu_threads();
void set_cpu_threads(int threads);

}  // namespace engine::kernels::cpu
