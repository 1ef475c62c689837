#include "kernels/op_table.h"

#include <atomic>
#include <stdexcept>

namespace engine::kernels {
namespace {

// The CPU's entries for the ops it does not have (RefCuda, CudaOnly): reaching one is a
// bug in the caller (the facade runs fp16 and bf16 as fp32 on the CPU), reported with the
// op's name.
#define ENGINE_OP_MISSING_Every(name, ret, params)
#define ENGINE_OP_MISSING_CudaOnly(name, ret, params)                                   \
  [[noreturn]] ret name params {                                                        \
    throw std::logic_error("kernels: " #name " has no CPU backend (it is CUDA only)"); \
  }
#define ENGINE_OP_MISSING_RefCuda(name, ret, params)                                      \
  [[noreturn]] ret name params {                                                         \
    throw std::logic_error("kernels: " #name                                             \
                           " has no CPU backend (the CPU runs fp16 and bf16 as fp32)"); \
  }
namespace cpu_missing {
#define ENGINE_OP(name, batch, precision, backends, ret, params, args) \
  ENGINE_OP_MISSING_##backends(name, ret, params)
#include "kernels/op_list.inc"
#undef ENGINE_OP
}  // namespace cpu_missing

#define ENGINE_OP_CPU_ENTRY_Every(name) &cpu::name,
#define ENGINE_OP_CPU_ENTRY_CudaOnly(name) &cpu_missing::name,
#define ENGINE_OP_CPU_ENTRY_RefCuda(name) &cpu_missing::name,
const OpTable kCpu{
    "cpu",
#define ENGINE_OP(name, batch, precision, backends, ret, params, args) ENGINE_OP_CPU_ENTRY_##backends(name)
#include "kernels/op_list.inc"
#undef ENGINE_OP
};

const OpTable kCuda{
    "cuda",
#define ENGINE_OP(name, batch, precision, backends, ret, params, args) &cuda::name,
#include "kernels/op_list.inc"
#undef ENGINE_OP
};

std::atomic<const OpTable*> g_cpu{&kCpu};

}  // namespace

const OpTable& cpu_ops() { return *g_cpu.load(std::memory_order_relaxed); }
const OpTable& builtin_cpu_ops() { return kCpu; }
const OpTable* use_cpu_ops(const OpTable* table) { return g_cpu.exchange(table ? table : &kCpu); }
const OpTable& cuda_ops() { return kCuda; }

}  // namespace engine::kernels
