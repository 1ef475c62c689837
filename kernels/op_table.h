// The op list (kernels/op_list.inc) as data: what each op is, and each backend as a table
// of its ops. The op facade (engine/core/tensor_ops.cpp) calls every kernel through the
// table of the tensors' device, so a backend is one table, and a test can stand its own
// table in front of one (a recording backend that logs each op and runs the CPU's).
#pragma once
#include <cstddef>

#include "engine/kernels/precision.h"
#include "kernels/ops.h"

namespace engine::kernels {

enum class OpBatch { Whole, Chunks, Either };  // Either: its parameter `split` (BatchSplit)
enum class OpPrecisions { Fp32Only, AnyPrecision };  // AnyPrecision: its parameter `p`
enum class OpBackends { Every, CudaOnly };

struct OpInfo {
  const char* name;
  OpBatch batch;
  OpPrecisions precisions;
  OpBackends backends;
};

// Every op, in the list's order, and its index there.
inline constexpr OpInfo kOps[] = {
#define ENGINE_OP(name, batch, precision, backends, ret, params, args) \
  {#name, OpBatch::batch, OpPrecisions::precision, OpBackends::backends},
#include "kernels/op_list.inc"
#undef ENGINE_OP
};
inline constexpr std::size_t kOpCount = sizeof(kOps) / sizeof(kOps[0]);
enum class OpId {
#define ENGINE_OP(name, batch, precision, backends, ret, params, args) name,
#include "kernels/op_list.inc"
#undef ENGINE_OP
};
inline const OpInfo& op_info(OpId op) { return kOps[static_cast<std::size_t>(op)]; }

// Which precisions each backend runs an op in: ref, every precision of an AnyPrecision
// op that is not a Chunks op (its forward ops' chunks are their whole batch, sample by
// sample) and fp32 otherwise; cpu, fp32 (the facade runs fp16 and bf16 as fp32
// on the CPU); cuda, every precision of an AnyPrecision op. Every backend runs its ops
// in fp32; ref and cpu have no CudaOnly op (false in every precision).
bool ref_op_supports(OpId op, Precision p);
bool cpu_op_supports(OpId op, Precision p);
bool cuda_op_supports(OpId op, Precision p);
// The one-line refusal of an op in a precision its backend does not run:
// "kernels: conv2d_backward_chunks in fp16 is not supported by the cpu backend".
[[noreturn]] void refuse_precision(const char* backend, OpId op, Precision p);
// What each backend's AnyPrecision op calls first.
inline void require_supported(bool (*supports)(OpId, Precision), const char* backend, OpId op, Precision p) {
  if (!supports(op, p)) refuse_precision(backend, op, p);
}

// One backend: a function pointer per op, named as the op, and which precisions it runs
// each op in. An op the backend lacks (a CudaOnly op in the CPU's table) throws
// std::logic_error naming the op.
struct OpTable {
  const char* backend;  // "cpu", "cuda", or a test's own name
  bool (*supports)(OpId op, Precision p);
#define ENGINE_OP(name, batch, precision, backends, ret, params, args) ret(*name) params;
#include "kernels/op_list.inc"
#undef ENGINE_OP
};

// Whether `table` runs `op` in `p` (ggml's supports_op): the op facade asks before it
// calls, so an unsupported form is one line before any kernel runs.
inline bool supports_op(const OpTable& table, OpId op, Precision p) { return table.supports(op, p); }

// The tables tt:: calls: the CPU's, and the GPU's (in a CPU-only build every op of it
// throws "built without CUDA").
const OpTable& cpu_ops();
const OpTable& cuda_ops();

// A table stood in front of the CPU's, for tracing: one that logs each op with its
// arguments and runs builtin_cpu_ops()'s (tests/test_op_trace.cpp records a training
// step's ops this way). Null restores the built-in table. Returns the table it
// replaces. Set it while no op runs: ops on other threads may see either table.
const OpTable* use_cpu_ops(const OpTable* table);
const OpTable& builtin_cpu_ops();

}  // namespace engine::kernels
