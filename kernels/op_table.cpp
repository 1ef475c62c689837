#include "kernels/op_table.h"

#include <atomic>
#include <stdexcept>
#include <string>

namespace engine::kernels {
namespace {

// The CPU's entries for the ops it does not have (CudaOnly): reaching one is a bug in
// the caller, reported with the op's name.
#define ENGINE_OP_MISSING_Every(name, ret, params)
#define ENGINE_OP_MISSING_CudaOnly(name, ret, params)                                   \
  [[noreturn]] ret name params {                                                        \
    throw std::logic_error("kernels: " #name " has no CPU backend (it is CUDA only)"); \
  }
namespace cpu_missing {
#define ENGINE_OP(name, batch, precision, backends, ret, params, args) \
  ENGINE_OP_MISSING_##backends(name, ret, params)
#include "kernels/op_list.inc"
#undef ENGINE_OP
}  // namespace cpu_missing

#define ENGINE_OP_CPU_ENTRY_Every(name) &cpu::name,
#define ENGINE_OP_CPU_ENTRY_CudaOnly(name) &cpu_missing::name,
const OpTable kCpu{
    "cpu",
    &cpu_op_supports,
#define ENGINE_OP(name, batch, precision, backends, ret, params, args) ENGINE_OP_CPU_ENTRY_##backends(name)
#include "kernels/op_list.inc"
#undef ENGINE_OP
};

const OpTable kCuda{
    "cuda",
    &cuda_op_supports,
#define ENGINE_OP(name, batch, precision, backends, ret, params, args) &cuda::name,
#include "kernels/op_list.inc"
#undef ENGINE_OP
};

std::atomic<const OpTable*> g_cpu{&kCpu};

}  // namespace

bool ref_op_supports(OpId op, Precision p) {
  const OpInfo& i = op_info(op);
  if (i.backends != OpBackends::Every) return false;  // ref:: has what the CPU has
  return p == Precision::Fp32 || (i.precisions == OpPrecisions::AnyPrecision && i.batch != OpBatch::Chunks);
}
bool cpu_op_supports(OpId op, Precision p) {
  return p == Precision::Fp32 && op_info(op).backends == OpBackends::Every;
}
bool cuda_op_supports(OpId op, Precision p) {
  return p == Precision::Fp32 || op_info(op).precisions == OpPrecisions::AnyPrecision;
}

void refuse_precision(const char* backend, OpId op, Precision p) {
  throw std::invalid_argument(std::string("kernels: ") + op_info(op).name + " in " + to_string(p) +
                              " is not supported by the " + backend + " backend");
}

const OpTable& cpu_ops() { return *g_cpu.load(std::memory_order_relaxed); }
const OpTable& builtin_cpu_ops() { return kCpu; }
const OpTable* use_cpu_ops(const OpTable* table) { return g_cpu.exchange(table ? table : &kCpu); }
const OpTable& cuda_ops() { return kCuda; }

}  // namespace engine::kernels
