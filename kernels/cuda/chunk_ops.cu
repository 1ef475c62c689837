// The Chunks ops of kernels/op_list.inc (conv and linear in every precision) on the
// GPU: a batch computed by its fixed chunks (kernels/chunk_tree.h) so that every cross-sample sum is
// the fixed tree over per-chunk partials, and a rank holding some of the chunks computes
// exactly its subtree (docs/distributed.md, "GPU ranks").
//
// - Forward: the whole-batch op (cuDNN / cuBLAS) once per chunk, starting at the chunk's
//   first sample: a sample's outputs never depend on which chunks sit beside it.
// - Weight gradients: the whole-batch op once per chunk into its own buffer, then the
//   tree over the chunks (tree_sum_in_place, the CPU's order) in tree_chunks_kernel.
// - Bias gradients and batch-norm sums: one block per (channel, chunk) sums the chunk in
//   double in block_sum's fixed order; the tree over the chunks follows.
// - Batch norm's per-channel finish (kernels/batchnorm_math.h) runs on the host on c
//   values, the function BatchNorm2d uses between exchanges, so the fused op and the
//   steps with exchanges in between give the same bits.
// No atomics anywhere: the bits depend only on the sizes and the chunk bounds.
#include "engine/kernels/precision.h"
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/batchnorm_math.h"
#include "kernels/chunk_tree.h"
#include "kernels/cuda/block_sum.h"
#include "kernels/cuda/by_chunks.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/reduction_order.h"
#include "kernels/cuda/settings.h"
#include "kernels/cuda_runtime.h"
#include "kernels/ops.h"

namespace engine::kernels::cuda {

namespace {

constexpr int kThreads = kReduceThreads;

cudaStream_t stream() { return Context::get().stream(); }

// Scratch owned by this file (never the context's workspace: the per-chunk cuDNN calls
// use that one while these buffers are live). Used under SharedStateLock.
PersistentBuffer g_chunk_parts{"chunk partials"};
PersistentBuffer g_channel_parts{"chunk channel partials"};

struct ChunkBounds {
  int b[kTreeChunks + 1];
};

enum class ChannelTerm { Value, CenteredSquare, GradAndGradCentered };

// Block (ch, k) of a (c, chunks) grid: over the samples of chunk k, channel ch,
// part_a[k * c + ch] = sum of the term, part_b (GradAndGradCentered only) the second sum.
// Value: x. CenteredSquare: (x - mean[ch])^2. GradAndGradCentered: dy, dy * (x - mean[ch]).
__global__ void channel_chunk_sums_kernel(ChannelTerm term, int c, int64_t hw, ChunkBounds bounds,
                                          const float* x, const float* dy, const float* mean,
                                          double* part_a, double* part_b) {
  __shared__ double buffer[kThreads];
  const int ch = blockIdx.x, k = blockIdx.y;
  const int64_t first = bounds.b[k];
  const int64_t m = (bounds.b[k + 1] - first) * hw;
  const double mu = mean ? static_cast<double>(mean[ch]) : 0.0;
  double a = 0.0, b = 0.0;
  for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
    const int64_t idx = ((first + e / hw) * c + ch) * hw + e % hw;
    if (term == ChannelTerm::Value) {
      a += static_cast<double>(x[idx]);
    } else if (term == ChannelTerm::CenteredSquare) {
      const double d = static_cast<double>(x[idx]) - mu;
      a += d * d;
    } else {
      const double g = dy[idx];
      a += g;
      b += g * (static_cast<double>(x[idx]) - mu);
    }
  }
  const double total_a = block_sum(a, buffer);
  const double total_b = term == ChannelTerm::GradAndGradCentered ? block_sum(b, buffer) : 0.0;
  if (threadIdx.x == 0) {
    part_a[static_cast<int64_t>(k) * c + ch] = total_a;
    if (part_b) part_b[static_cast<int64_t>(k) * c + ch] = total_b;
  }
}

// out[j] = the tree sum over i < count of parts[i * len + j] (count a power of two,
// at most kTreeChunks). out may be parts: element j is read and written by one thread.
template <class T>
__global__ void tree_chunks_kernel(int count, int64_t len, const T* parts, T* out) {
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < len;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    T v[kTreeChunks];
    for (int i = 0; i < count; ++i) v[i] = parts[i * len + j];
    tree_sum_in_place(v, count, 1, 1);
    out[j] = v[0];
  }
}

template <class T>
void launch_tree(int count, int64_t len, const T* parts, T* out) {
  if (len <= 0) return;
  tree_chunks_kernel<T><<<grid_for(len, kThreads), kThreads, 0, stream()>>>(count, len, parts, out);
  ENGINE_CUDA_CHECK_LAUNCH("tree_chunks_kernel");
}

void require_tree_count(int chunks) {
  if (chunks < 1 || chunks > kTreeChunks || (chunks & (chunks - 1)) != 0)
    throw std::invalid_argument("chunked op: " + std::to_string(chunks) + " chunks (1, 2, 4 or 8 expected)");
}

ChunkBounds to_bounds(int chunks, const int* bounds) {
  require_tree_count(chunks);
  ChunkBounds b{};
  for (int i = 0; i <= chunks; ++i) b.b[i] = bounds[i];
  return b;
}

// Per-channel tree sums over the chunks into device doubles out_a (and out_b), c each.
void channel_chunk_tree(ChannelTerm term, int c, int64_t hw, int chunks, const int* bounds, const float* x,
                        const float* dy, const float* mean, double* out_a, double* out_b) {
  if (c <= 0) return;
  const ChunkBounds b = to_bounds(chunks, bounds);
  const SharedStateLock lock;
  const std::size_t count = static_cast<std::size_t>(c) * chunks;
  double* parts = static_cast<double*>(g_channel_parts.get(2 * count * sizeof(double)));
  double* parts_b = out_b ? parts + count : nullptr;
  channel_chunk_sums_kernel<<<dim3(c, chunks), kThreads, 0, stream()>>>(term, c, hw, b, x, dy, mean, parts,
                                                                        parts_b);
  ENGINE_CUDA_CHECK_LAUNCH("channel_chunk_sums_kernel");
  launch_tree(chunks, c, parts, out_a);
  if (out_b) launch_tree(chunks, c, parts_b, out_b);
}

// Elementwise batch-norm passes (the reference's types: double products, float results).
__global__ void scale_shift_kernel(int64_t total, int c, int64_t hw, const float* x, const float* scale,
                                   const float* shift, float* y) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int ch = static_cast<int>((e / hw) % c);
    y[e] = static_cast<float>(static_cast<double>(x[e]) * scale[ch] + shift[ch]);
  }
}

__global__ void backward_apply_kernel(int64_t total, int c, int64_t hw, const float* x, const float* dy,
                                      const float* mean, const float* k, const float* mean_dy,
                                      const float* proj, float* dx) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int ch = static_cast<int>((e / hw) % c);
    const double xc = static_cast<double>(x[e]) - mean[ch];
    dx[e] = static_cast<float>(static_cast<double>(k[ch]) *
                               (dy[e] - static_cast<double>(mean_dy[ch]) - xc * proj[ch]));
  }
}

// ---- Conv / linear by chunks ----------------------------------------------------------


// Per-sample sizes and the whole-batch op for a sub-batch, for conv and linear alike.
struct ConvOps {
  using Shape = ConvShape;
  static int64_t in_size(const Shape& s) { return static_cast<int64_t>(s.c) * s.h * s.w; }
  static int64_t out_size(const Shape& s) { return static_cast<int64_t>(s.k) * s.out_h() * s.out_w(); }
  static int64_t out_hw(const Shape& s) { return static_cast<int64_t>(s.out_h()) * s.out_w(); }
  static int out_channels(const Shape& s) { return s.k; }
  static int64_t weight_size(const Shape& s) { return static_cast<int64_t>(s.k) * s.c * s.r * s.s; }
  static void forward(Precision m, const Shape& s, const float* x, const float* w, const float* b, float* y) {
    conv2d_forward(s, m, BatchSplit{}, x, w, b, y);
  }
  static void backward(Precision m, const Shape& s, const float* x, const float* w, const float* dy, float* dx,
                       float* dw) {
    conv2d_backward(s, m, x, w, dy, dx, dw, nullptr);
  }
};

struct LinearOps {
  using Shape = LinearShape;
  static int64_t in_size(const Shape& s) { return s.in; }
  static int64_t out_size(const Shape& s) { return s.out; }
  static int64_t out_hw(const Shape&) { return 1; }
  static int out_channels(const Shape& s) { return s.out; }
  static int64_t weight_size(const Shape& s) { return static_cast<int64_t>(s.out) * s.in; }
  static void forward(Precision m, const Shape& s, const float* x, const float* w, const float* b, float* y) {
    linear_forward(s, m, BatchSplit{}, x, w, b, y);
  }
  static void backward(Precision m, const Shape& s, const float* x, const float* w, const float* dy, float* dx,
                       float* dw) {
    linear_backward(s, m, x, w, dy, dx, dw, nullptr);
  }
};

template <class Ops>
void forward_chunks(Precision math, const typename Ops::Shape& s, int chunks, const int* bounds, const float* x,
                    const float* w, const float* b, float* y) {
  const ChunkBounds cb = to_bounds(chunks, bounds);
  for (int k = 0; k < chunks; ++k) {
    typename Ops::Shape part = s;
    part.n = cb.b[k + 1] - cb.b[k];
    if (part.n <= 0) continue;
    Ops::forward(math, part, x + cb.b[k] * Ops::in_size(s), w, b, y + cb.b[k] * Ops::out_size(s));
  }
}

template <class Ops>
void backward_chunks(Precision math, const typename Ops::Shape& s, int chunks, const int* bounds, const float* x,
                     const float* w, const float* dy, float* dx, float* dw_tree, double* db_tree) {
  const ChunkBounds cb = to_bounds(chunks, bounds);
  const int64_t wn = Ops::weight_size(s);
  const SharedStateLock lock;
  // One chunk: its gradient is the tree; several: per-chunk buffers, then the tree.
  float* parts = dw_tree;
  if (dw_tree && chunks > 1)
    parts = static_cast<float*>(g_chunk_parts.get(sizeof(float) * static_cast<std::size_t>(wn) * chunks));
  for (int k = 0; k < chunks; ++k) {
    typename Ops::Shape part = s;
    part.n = cb.b[k + 1] - cb.b[k];
    float* dw_k = parts ? parts + k * wn : nullptr;
    if (part.n <= 0) {  // an empty chunk adds zero (the whole-batch op writes nothing for n = 0)
      if (dw_k) memset_zero(dw_k, sizeof(float) * static_cast<std::size_t>(wn));
      continue;
    }
    Ops::backward(math, part, x + cb.b[k] * Ops::in_size(s), w, dy + cb.b[k] * Ops::out_size(s),
                  dx ? dx + cb.b[k] * Ops::in_size(s) : nullptr, dw_k);
  }
  if (dw_tree && chunks > 1) launch_tree(chunks, wn, parts, dw_tree);
  if (db_tree)
    channel_chunk_tree(ChannelTerm::Value, Ops::out_channels(s), Ops::out_hw(s), chunks, bounds, dy, nullptr,
                       nullptr, db_tree, nullptr);
}

template <class T>
std::vector<T> to_host(const T* device, int n) {
  std::vector<T> v(static_cast<std::size_t>(n));
  copy(v.data(), device, sizeof(T) * v.size(), CopyKind::DeviceToHost);
  return v;
}
template <class T>
void to_device(T* device, const std::vector<T>& v) {
  copy(device, v.data(), sizeof(T) * v.size(), CopyKind::HostToDevice);
}

// Device scratch for a few per-channel vectors of the fused batch-norm ops. Freed
// stream-ordered (cudaFreeAsync) or by cudaFree, which waits: never under a running kernel.
struct DeviceFloats {
  explicit DeviceFloats(std::size_t n) : p(static_cast<float*>(alloc(sizeof(float) * (n ? n : 1)))) {}
  ~DeviceFloats() { free(p); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* p;
};
struct DeviceDoubles {
  explicit DeviceDoubles(std::size_t n) : p(static_cast<double*>(alloc(sizeof(double) * (n ? n : 1)))) {}
  ~DeviceDoubles() { free(p); }
  DeviceDoubles(const DeviceDoubles&) = delete;
  DeviceDoubles& operator=(const DeviceDoubles&) = delete;
  double* p;
};

}  // namespace

// The steps on CUDA take every channel: the driver walks channel groups only on the CPU,
// where a group stays in cache between its exchanges (kernels/ops.h).
namespace {
void require_all_channels(const BatchNormShape& s, const char* op) {
  if (!s.all_channels())
    throw std::invalid_argument(std::string("cuda::") + op + ": a channel range is a CPU-only option");
}
}  // namespace

// ---- The ops ------------------------------------------------------------------------

void conv2d_forward_by_chunks(const ConvShape& s, Precision p, int chunks, const int* bounds, const float* x,
                              const float* w, const float* b, float* y) {
  forward_chunks<ConvOps>(p, s, chunks, bounds, x, w, b, y);
}
void linear_forward_by_chunks(const LinearShape& s, Precision p, int chunks, const int* bounds, const float* x,
                              const float* w, const float* b, float* y) {
  forward_chunks<LinearOps>(p, s, chunks, bounds, x, w, b, y);
}
void conv2d_backward_chunks(const ConvShape& s, Precision p, int chunks, const int* bounds, const float* x,
                            const float* w, const float* dy, float* dx, float* dw_tree, double* db_tree) {
  backward_chunks<ConvOps>(p, s, chunks, bounds, x, w, dy, dx, dw_tree, db_tree);
}
void linear_backward_chunks(const LinearShape& s, Precision p, int chunks, const int* bounds, const float* x,
                            const float* w, const float* dy, float* dx, float* dw_tree, double* db_tree) {
  backward_chunks<LinearOps>(p, s, chunks, bounds, x, w, dy, dx, dw_tree, db_tree);
}

void tree_sum_parts(int count, int64_t len, const float* parts, float* out) {
  require_tree_count(count);
  launch_tree(count, len, parts, out);
}
void tree_sum_parts_f64(int count, int64_t len, const double* parts, double* out) {
  require_tree_count(count);
  launch_tree(count, len, parts, out);
}

void batchnorm_chunk_sums(const BatchNormShape& s, int chunks, const int* bounds, const float* x,
                          double* sum_tree) {
  require_all_channels(s, "batchnorm_chunk_sums");
  channel_chunk_tree(ChannelTerm::Value, s.c, s.hw, chunks, bounds, x, nullptr, nullptr, sum_tree, nullptr);
}
void batchnorm_chunk_centered_squares(const BatchNormShape& s, int chunks, const int* bounds, const float* x,
                                      const float* mean, double* sq_tree) {
  require_all_channels(s, "batchnorm_chunk_centered_squares");
  channel_chunk_tree(ChannelTerm::CenteredSquare, s.c, s.hw, chunks, bounds, x, nullptr, mean, sq_tree,
                     nullptr);
}
void batchnorm_backward_chunk_sums(const BatchNormShape& s, int chunks, const int* bounds, const float* x,
                                   const float* dy, const float* mean, double* sum_dy_tree,
                                   double* sum_dy_xc_tree) {
  require_all_channels(s, "batchnorm_backward_chunk_sums");
  channel_chunk_tree(ChannelTerm::GradAndGradCentered, s.c, s.hw, chunks, bounds, x, dy, mean, sum_dy_tree,
                     sum_dy_xc_tree);
}

void batchnorm_scale_shift(const BatchNormShape& s, const float* x, const float* scale, const float* shift,
                           float* y) {
  require_all_channels(s, "batchnorm_scale_shift");
  const int64_t total = static_cast<int64_t>(s.n) * s.c * s.hw;
  if (total <= 0) return;
  scale_shift_kernel<<<grid_for(total, kThreads), kThreads, 0, stream()>>>(total, s.c, s.hw, x, scale, shift, y);
  ENGINE_CUDA_CHECK_LAUNCH("scale_shift_kernel");
}

void batchnorm_backward_apply(const BatchNormShape& s, const float* x, const float* dy, const float* mean,
                              const float* k, const float* mean_dy, const float* proj, float* dx) {
  require_all_channels(s, "batchnorm_backward_apply");
  const int64_t total = static_cast<int64_t>(s.n) * s.c * s.hw;
  if (total <= 0) return;
  backward_apply_kernel<<<grid_for(total, kThreads), kThreads, 0, stream()>>>(total, s.c, s.hw, x, dy, mean, k,
                                                                              mean_dy, proj, dx);
  ENGINE_CUDA_CHECK_LAUNCH("backward_apply_kernel");
}

// The Either batch-norm ops by chunks: the steps above with the finish on the host,
// exactly what BatchNorm2d does with exchanges in between (so W = 1 and W > 1 give the
// same bits).
void batchnorm_forward_train_by_chunks(const BatchNormShape& s, int chunks, const int* bounds, const float* x,
                                       const float* gamma, const float* beta, float eps, float momentum,
                                       float* running_mean, float* running_var, float* save_mean,
                                       float* save_invstd, float* y) {
  if (s.c <= 0) return;
  const std::size_t c = static_cast<std::size_t>(s.c);
  const double m = static_cast<double>(s.n) * s.hw;
  DeviceDoubles sums(2 * c);
  DeviceFloats vecs(3 * c);  // mean, scale, shift
  batchnorm_chunk_sums(s, chunks, bounds, x, sums.p);
  const std::vector<double> sum = to_host(sums.p, s.c);
  std::vector<float> mean_f(c);
  for (std::size_t i = 0; i < c; ++i) mean_f[i] = static_cast<float>(bn_mean(sum[i], m));
  to_device(vecs.p, mean_f);
  batchnorm_chunk_centered_squares(s, chunks, bounds, x, vecs.p, sums.p + c);
  const std::vector<double> sq = to_host(sums.p + c, s.c);
  const std::vector<float> g = to_host(gamma, s.c), b = to_host(beta, s.c);
  std::vector<float> rm = to_host(running_mean, s.c), rv = to_host(running_var, s.c);
  std::vector<float> scale(c), shift(c), smean(c), sinv(c);
  for (std::size_t i = 0; i < c; ++i) {
    const BnForwardFactors f = bn_forward_finish(sum[i], sq[i], m, g[i], b[i], eps, momentum, rm[i], rv[i]);
    scale[i] = f.scale;
    shift[i] = f.shift;
    smean[i] = f.save_mean;
    sinv[i] = f.save_invstd;
  }
  to_device(running_mean, rm);
  to_device(running_var, rv);
  to_device(save_mean, smean);
  to_device(save_invstd, sinv);
  std::vector<float> ss(scale);
  ss.insert(ss.end(), shift.begin(), shift.end());
  to_device(vecs.p + c, ss);
  batchnorm_scale_shift(s, x, vecs.p + c, vecs.p + 2 * c, y);
}

void batchnorm_backward_by_chunks(const BatchNormShape& s, int chunks, const int* bounds, const float* x,
                                  const float* dy, const float* gamma, const float* save_mean,
                                  const float* save_invstd, float* dx, float* dgamma, float* dbeta) {
  if (s.c <= 0) return;
  const std::size_t c = static_cast<std::size_t>(s.c);
  const double m = static_cast<double>(s.n) * s.hw;
  DeviceDoubles sums(2 * c);
  DeviceFloats vecs(5 * c);  // k, mean_dy, proj, dgamma, dbeta
  batchnorm_backward_chunk_sums(s, chunks, bounds, x, dy, save_mean, sums.p, sums.p + c);
  const std::vector<double> all = to_host(sums.p, 2 * s.c);
  const std::vector<float> g = to_host(gamma, s.c), inv = to_host(save_invstd, s.c);
  std::vector<float> v(5 * c);
  for (std::size_t i = 0; i < c; ++i) {
    const BnBackwardFactors f = bn_backward_finish(all[i], all[c + i], m, g[i], inv[i]);
    v[i] = f.k;
    v[c + i] = f.mean_dy;
    v[2 * c + i] = f.proj;
    v[3 * c + i] = f.dgamma;
    v[4 * c + i] = f.dbeta;
  }
  to_device(vecs.p, v);
  if (dgamma) copy(dgamma, vecs.p + 3 * c, sizeof(float) * c, CopyKind::DeviceToDevice);
  if (dbeta) copy(dbeta, vecs.p + 4 * c, sizeof(float) * c, CopyKind::DeviceToDevice);
  if (dx) batchnorm_backward_apply(s, x, dy, save_mean, vecs.p, vecs.p + c, vecs.p + 2 * c, dx);
}

void* compute_stream() { return static_cast<void*>(Context::get().stream()); }

// ---- The A/B switch (kernels/cuda/settings.h) -----------------------------------------
static bool g_batch_chunks = false;  // the config default (cuda.batch_chunks)
void set_batch_chunks(bool on) { g_batch_chunks = on; }
bool batch_chunks() { return g_batch_chunks; }

}  // namespace engine::kernels::cuda
