// TEST ONLY: an emulated CUDA device, for the emulated_cuda_* tests (tests/CMakeLists.txt,
// docs/testing.md). A drop-in replacement of kernels/no_cuda.cpp, chosen only by the CMake
// cache variable ENGINE_CUDA_EMULATION_SOURCE in a build with ENGINE_CUDA=OFF; no normal
// build compiles it.
//
// "The GPU" is host memory: built() is true, one device exists, alloc/free/copy/memset/
// synchronize, pinned memory, stream marks and the casts work on host memory, and every
// op of the op list (kernels/op_list.inc) is a forwarder that writes a trace line and runs
// the CPU's op. So the engine's CUDA control flow (whole-batch ops with
// cuda.batch_chunks=false, the loss scaler's flag read-back, the host-side finishing of
// batch norm with batch_chunks=true, ...) runs, and its cost can be counted, without a GPU.
//
// What it emulates: the calls (which op, with which arguments, in which order) and the
// device work around them (allocations, copies each way, synchronisations, memsets).
// What it does not: the bits of the CUDA kernels. The Every ops run the CPU's op (cpu::);
// conv and linear in fp16 and bf16 over the whole batch their reference (ref::, which
// rounds operands and results as the CUDA ops do), by chunks the CPU's op in fp32
// (counted work, not 16-bit arithmetic); tree_sum_parts(_f64) sum
// on the host in the fixed tree order of kernels/chunk_tree.h, as kernels/cuda/chunk_ops.cu
// does. Only the casts round as a GPU would (kernels/fp16_math.h, kernels/bf16_math.h:
// round to nearest even; widening exact).
// Streams do not exist: everything is done when it is called. Nor is what a CUDA op does
// inside itself seen: its scratch buffers, and its own host round-trips (the chunked
// batch norm's per-channel finish on the host, kernels/cuda/chunk_ops.cu, copies a few
// per-channel vectors each way inside batchnorm_*_chunks); only reduce_sum's result,
// which the op's contract returns to the host, is traced (`copy_d2h 8 result`). The
// counts are of what the engine asks of the device through the runtime and the op list.
//
// Trace: when the environment variable ENGINE_EMULATED_CUDA_TRACE names a file, one line
// per event is appended to it:
//   op NAME arg=value ...   (pointers in hex; a chunked op's bounds as [b0,...,bchunks], a batch split as whole or chunks[b0,...,bchunks])
//   alloc BYTES POINTER | copy_h2d BYTES | copy_d2h BYTES | copy_d2d BYTES | memset BYTES | sync
//   copy_d2h BYTES result   (after an op that returns a value to the host: reduce_sum)
// (pinned host memory: alloc_pinned BYTES, copy_d2h_async BYTES, copy_h2d_async BYTES, mark,
// wait; graphs: capture_begin, capture_end OPS, graph_launch OPS, then the graph's ops).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <atomic>
#include <mutex>
#include <new>
#include <thread>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/chunk_tree.h"
#include "kernels/cuda/cast.h"
#include "kernels/cuda/settings.h"
#include "kernels/cuda_runtime.h"
#include "kernels/bf16_math.h"
#include "kernels/fp16_math.h"
#include "kernels/ops.h"
// Test support, by its path from here: this file is compiled in the kernels layer.
#include "../support/op_call.h"

namespace engine::kernels::cuda {

namespace {

// ---- The trace ----------------------------------------------------------------------------

std::mutex g_trace_mutex;

std::FILE* trace_file() {
  static std::FILE* f = [] {
    const char* path = std::getenv("ENGINE_EMULATED_CUDA_TRACE");
    return (path && *path) ? std::fopen(path, "a") : nullptr;
  }();
  return f;
}

void trace_line(const std::string& line) {
  std::FILE* f = trace_file();
  if (!f) return;
  std::lock_guard<std::mutex> lock(g_trace_mutex);
  std::fputs(line.c_str(), f);
  std::fputc('\n', f);
  std::fflush(f);
}

void trace_bytes(const char* event, std::size_t bytes) {
  if (trace_file()) trace_line(std::string(event) + " " + std::to_string(bytes));
}

// One `op` line (tests/support/op_call.h says how each argument is written).
template <class... Args>
void trace_op(const char* op, const char* arg_names, const Args&... args) {
  if (!trace_file()) return;
  const test_support::OpCall call = test_support::describe_call(op, arg_names, args...);
  std::string line = "op " + call.op;
  for (std::size_t i = 0; i < call.names.size(); ++i) line += " " + call.names[i] + "=" + call.values[i];
  trace_line(line);
}

// ---- fp16 on the host ------------------------------------------------------------------

template <class T>
void host_tree_sum_parts(int count, int64_t len, const T* parts, T* out) {
  if (count != 1 && count != 2 && count != 4 && count != 8)
    throw std::invalid_argument("tree_sum_parts: count must be 1, 2, 4 or 8, got " + std::to_string(count));
  // Per element, pairwise in the order of tree_sum_in_place (kernels/chunk_tree.h), as
  // the CUDA kernel sums each element's `count` parts.
  for (int64_t j = 0; j < len; ++j) {
    T v[8];
    for (int r = 0; r < count; ++r) v[r] = parts[static_cast<int64_t>(r) * len + j];
    tree_sum_in_place(v, count, 1, 1);
    out[j] = v[0];
  }
}

// ---- Graph capture ------------------------------------------------------------------------
// A capture records the ops (and memsets) queued meanwhile as closures; a launch runs
// them in order, traced as they run, after a `graph_launch N` line. What CUDA refuses
// during a capture (an allocation, a copy the host waits for, a value read back) throws.

// The capture in progress, and the thread that began it. CUDA has one stream here
// (kernels/cuda/context.h): what another thread queues during a capture would be recorded
// into the graph, and a wait for it would end the capture, so any GPU call of another
// thread during a capture throws (the engine serialises them: core/graph_capture.h).
std::atomic<std::vector<std::function<void()>>*> g_recording{nullptr};
std::atomic<std::thread::id> g_capture_thread{};

[[noreturn]] void capture_refused(const std::string& what) {
  throw std::logic_error("emulated CUDA: " + what + " during a graph capture");
}

// Whether this call is recorded into the capture; throws for another thread's call.
bool recording(const char* what) {
  if (!g_recording.load()) return false;
  if (g_capture_thread.load() != std::this_thread::get_id())
    capture_refused(std::string(what) + " from a thread other than the capturing one (CUDA would record it "
                    "into the graph)");
  return true;
}

template <class R>
void trace_result() {
  if constexpr (!std::is_void_v<R>)
    if (trace_file()) trace_line("copy_d2h " + std::to_string(sizeof(R)) + " result");
}

}  // namespace

// ---- The runtime -------------------------------------------------------------------------

bool built() { return true; }
int device_count() { return 1; }
std::string device_name(int index) { return index == 0 ? "emulated CUDA device (host memory, test only)" : ""; }
void set_device(int index) {
  if (index != 0) throw std::runtime_error("emulated CUDA: no device " + std::to_string(index));
}
void* alloc(std::size_t bytes) {
  if (recording("an allocation")) capture_refused("an allocation of " + std::to_string(bytes) + " bytes");
  void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  if (!p) throw std::bad_alloc();
  if (trace_file()) trace_line("alloc " + std::to_string(bytes) + " " + test_support::hex(p));
  return p;
}
void free(void* p) {
  // Called from destructors, which cannot throw: another thread's free during a capture
  // (which CUDA would record into the graph) ends the process, saying so.
  if (g_recording.load() && g_capture_thread.load() != std::this_thread::get_id()) {
    std::fputs("emulated CUDA: a free from a thread other than the capturing one during a graph capture\n", stderr);
    std::abort();
  }
  std::free(p);
}
void copy(void* dst, const void* src, std::size_t bytes, CopyKind kind) {
  if (recording("a copy") && kind != CopyKind::DeviceToDevice) capture_refused("a copy the host waits for");
  trace_bytes(kind == CopyKind::HostToDevice   ? "copy_h2d"
              : kind == CopyKind::DeviceToHost ? "copy_d2h"
                                               : "copy_d2d",
              bytes);
  if (bytes) std::memmove(dst, src, bytes);
}
void memset_zero(void* p, std::size_t bytes) {
  if (recording("a memset")) {
    g_recording.load()->push_back([=] {
      trace_bytes("memset", bytes);
      if (bytes) std::memset(p, 0, bytes);
    });
    return;
  }
  trace_bytes("memset", bytes);
  if (bytes) std::memset(p, 0, bytes);
}
void synchronize() {
  if (recording("a synchronization")) capture_refused("a synchronization");
  if (trace_file()) trace_line("sync");
}
void* alloc_pinned_host(std::size_t bytes) {
  trace_bytes("alloc_pinned", bytes);
  // Page-aligned, as cudaHostAlloc's memory is (the async save wraps it as tensors).
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096 + 4096);
  if (!p) throw std::bad_alloc();
  return p;
}
void free_pinned_host(void* p) { std::free(p); }
void copy_to_pinned_host_async(void* dst, const void* src, std::size_t bytes) {
  (void)recording("a copy to the host");
  trace_bytes("copy_d2h_async", bytes);
  if (bytes) std::memcpy(dst, src, bytes);
}
void copy_from_pinned_host_async(void* dst, const void* src, std::size_t bytes) {
  if (recording("an upload")) capture_refused("the per-step values' upload (it belongs before the graph's launch)");
  trace_bytes("copy_h2d_async", bytes);
  if (bytes) std::memcpy(dst, src, bytes);
}
void begin_capture() {
  if (recording("a capture")) capture_refused("a second capture");
  if (trace_file()) trace_line("capture_begin");
  g_capture_thread.store(std::this_thread::get_id());
  g_recording.store(new std::vector<std::function<void()>>());
  // ENGINE_EMULATED_CUDA_CAPTURE_HOLD_MS: the capture stays open this long before the
  // step's work is recorded, so that another thread's GPU work meets it (the test of
  // inference during training, tests/emulated_cuda/inference_during_capture.cpp).
  if (const char* hold = std::getenv("ENGINE_EMULATED_CUDA_CAPTURE_HOLD_MS"))
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(hold)));
}
Graph end_capture() {
  if (!recording("end_capture")) throw std::logic_error("emulated CUDA: end_capture without a capture");
  auto* ops = g_recording.exchange(nullptr);
  if (trace_file()) trace_line("capture_end " + std::to_string(ops->size()));
  return Graph(ops, [](void* p) { delete static_cast<std::vector<std::function<void()>>*>(p); });
}
void abandon_capture() {
  delete g_recording.exchange(nullptr);
  if (trace_file()) trace_line("capture_abandoned");
}
void launch(const Graph& graph) {
  if (recording("a graph launch")) capture_refused("a graph launch");
  const auto& ops = *static_cast<const std::vector<std::function<void()>>*>(graph.get());
  if (trace_file()) trace_line("graph_launch " + std::to_string(ops.size()));
  for (const auto& op : ops) op();
}
StreamMark mark_stream() {
  if (trace_file()) trace_line("mark");
  return std::make_shared<int>(0);  // the work before it is already done
}
void wait_for(const StreamMark& mark) {
  if (mark && trace_file()) trace_line("wait");
}
void* compute_stream() {
  static int stream = 0;
  return &stream;
}
BackendVersions backend_versions() {
  BackendVersions v;
  v.runtime = "emulated";
  return v;
}

// As kernels/no_cuda.cpp: the settings are kept.
static bool g_deterministic = true;
void set_deterministic(bool on) { g_deterministic = on; }
bool deterministic() { return g_deterministic; }
static bool g_batch_chunks = false;  // the config default (cuda.batch_chunks)
void set_batch_chunks(bool on) { g_batch_chunks = on; }
bool batch_chunks() { return g_batch_chunks; }

void cast_f32_to_f16(int64_t n, const float* in, void* out) {
  trace_op("cast_f32_to_f16", "(n, in, out)", n, static_cast<const void*>(in), static_cast<const void*>(out));
  uint16_t* o = static_cast<uint16_t*>(out);
  for (int64_t i = 0; i < n; ++i) o[i] = f16_bits_from_f32(in[i]);
}
void cast_f16_to_f32(int64_t n, const void* in, float* out) {
  trace_op("cast_f16_to_f32", "(n, in, out)", n, in, static_cast<const void*>(out));
  const uint16_t* h = static_cast<const uint16_t*>(in);
  for (int64_t i = 0; i < n; ++i) out[i] = f32_from_f16_bits(h[i]);
}
void cast_f32_to_bf16(int64_t n, const float* in, void* out) {
  trace_op("cast_f32_to_bf16", "(n, in, out)", n, static_cast<const void*>(in), static_cast<const void*>(out));
  uint16_t* o = static_cast<uint16_t*>(out);
  for (int64_t i = 0; i < n; ++i) o[i] = bf16_bits_from_f32(in[i]);
}
void cast_bf16_to_f32(int64_t n, const void* in, float* out) {
  trace_op("cast_bf16_to_f32", "(n, in, out)", n, in, static_cast<const void*>(out));
  const uint16_t* h = static_cast<const uint16_t*>(in);
  for (int64_t i = 0; i < n; ++i) out[i] = f32_from_bf16_bits(h[i]);
}

// ---- The ops: trace, then the CPU's op --------------------------------------------------

// The CPU op each op runs: cpu::name for the Every ops; for the CudaOnly ops, below.
#define ENGINE_EMU_RUN_Every(name, args) return cpu::name args;
#define ENGINE_EMU_RUN_CudaOnly(name, args) return emulated_##name args;
// Conv and linear (AnyPrecision): in fp32 the CPU's op; the whole-batch fp16 and bf16 ops
// run their reference (kernels/ref/mixed_precision.cpp), which rounds as the CUDA ops do;
// the chunked ones (a Chunks op, or an Either op given chunks) run the CPU's op in fp32
// (counted work, not 16-bit arithmetic).
#define ENGINE_EMU_RUN_Fp32Only_Whole(name, backends, args) ENGINE_EMU_RUN_##backends(name, args)
#define ENGINE_EMU_RUN_Fp32Only_Chunks(name, backends, args) ENGINE_EMU_RUN_##backends(name, args)
#define ENGINE_EMU_RUN_AnyPrecision_Whole(name, backends, args) \
  if (p == Precision::Fp32) return cpu::name args;               \
  return ref::name args;
#define ENGINE_EMU_RUN_AnyPrecision_Chunks(name, backends, args) \
  {                                                               \
    const Precision p = Precision::Fp32;                          \
    return cpu::name args;                                        \
  }
#define ENGINE_EMU_RUN_Fp32Only_Either(name, backends, args) ENGINE_EMU_RUN_##backends(name, args)
#define ENGINE_EMU_RUN_AnyPrecision_Either(name, backends, args) \
  if (!split.whole()) ENGINE_EMU_RUN_AnyPrecision_Chunks(name, backends, args) \
  ENGINE_EMU_RUN_AnyPrecision_Whole(name, backends, args)

namespace {
void emulated_tree_sum_parts(int count, int64_t len, const float* parts, float* out) {
  host_tree_sum_parts(count, len, parts, out);
}
void emulated_tree_sum_parts_f64(int count, int64_t len, const double* parts, double* out) {
  host_tree_sum_parts(count, len, parts, out);
}
}  // namespace

// An op that returns a value (reduce_sum) reads it back to the host on a GPU: a
// device-to-host copy, traced after the op as `copy_d2h BYTES result`.
// During a graph capture an op is recorded, with its arguments as they are now, and runs
// when the graph is launched: a per-step value passed by value would run stale there.
#define ENGINE_OP(name, batch, precision, backends, ret, params, args)                      \
  ret name params {                                                                         \
    if (recording("op " #name)) {                                                          \
      if (!std::is_void_v<ret>) capture_refused(#name " returns a value to the host");      \
      g_recording.load()->push_back([=] {                                                          \
        trace_op(#name, #args, ENGINE_EMU_UNPACK args);                                     \
        ENGINE_EMU_RUN_##precision##_##batch(name, backends, args)                          \
      });                                                                                   \
      return ret();                                                                         \
    }                                                                                       \
    trace_op(#name, #args, ENGINE_EMU_UNPACK args);                                         \
    trace_result<ret>();                                                                    \
    ENGINE_EMU_RUN_##precision##_##batch(name, backends, args)                              \
  }
#define ENGINE_EMU_UNPACK(...) __VA_ARGS__
#include "kernels/op_list.inc"
#undef ENGINE_OP
#undef ENGINE_EMU_UNPACK
#undef ENGINE_EMU_RUN_Every
#undef ENGINE_EMU_RUN_CudaOnly
#undef ENGINE_EMU_RUN_Fp32Only_Whole
#undef ENGINE_EMU_RUN_Fp32Only_Chunks
#undef ENGINE_EMU_RUN_AnyPrecision_Whole
#undef ENGINE_EMU_RUN_AnyPrecision_Chunks
#undef ENGINE_EMU_RUN_Fp32Only_Either
#undef ENGINE_EMU_RUN_AnyPrecision_Either

}  // namespace engine::kernels::cuda
