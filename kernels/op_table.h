// The op list (kernels/op_list.inc) as data: what each op is, and each backend as a table
// of its ops. The op facade (engine/core/tensor_ops.cpp) calls every kernel through the
// table of the tensors' device, so a backend is one table, and a test can stand its own
// table in front of one (a recording backend that logs each op and runs the CPU's).
#pragma once
#include <cstddef>

#include "engine/kernels/precision.h"
#include "kernels/ops.h"

namespace engine::kernels {

enum class OpBatch { Whole, Chunks };
enum class OpBackends { Every, RefCuda, CudaOnly };

struct OpInfo {
  const char* name;
  OpBatch batch;
  Precision precision;  // engine/kernels/precision.h
  OpBackends backends;
};

// Every op, in the list's order.
inline constexpr OpInfo kOps[] = {
#define ENGINE_OP(name, batch, precision, backends, ret, params, args) \
  {#name, OpBatch::batch, Precision::precision, OpBackends::backends},
#include "kernels/op_list.inc"
#undef ENGINE_OP
};
inline constexpr std::size_t kOpCount = sizeof(kOps) / sizeof(kOps[0]);

// One backend: a function pointer per op, named as the op. An op the backend lacks
// (a RefCuda or CudaOnly op in the CPU's table) throws std::logic_error naming the op.
struct OpTable {
  const char* backend;  // "cpu", "cuda", or a test's own name
#define ENGINE_OP(name, batch, precision, backends, ret, params, args) ret(*name) params;
#include "kernels/op_list.inc"
#undef ENGINE_OP
};

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
