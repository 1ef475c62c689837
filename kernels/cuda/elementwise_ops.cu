// CUDA kernels for every op that is not a convolution or a GEMM: ReLU, 2x2 max
// pooling, dropout, batch normalisation, cross-entropy, the deterministic sum, batch
// gathering, Adam, loss-scale unscaling, fp16 casts, and the channel bias/sum helpers
// the conv and linear ops share.
//
// Determinism: no kernel here uses atomics to combine values. Every reduction has a
// fixed partition (depending only on the sizes, never on the GPU) and a fixed tree
// order, so results are bitwise identical from run to run. Per-element math comes
// from kernels/elementwise.h, shared with the CPU backend; with -fmad=false (set in
// CMakeLists.txt: nvcc's default is -fmad=true) and IEEE division/sqrt (nvcc's
// defaults) those elements give the same bits as the CPU.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/batchnorm_math.h"
#include "kernels/cuda/block_sum.h"
#include "kernels/cuda/by_chunks.h"
#include "kernels/cuda/cast.h"
#include "kernels/step_digest.h"
#include "kernels/cuda/context.h"
#include "kernels/cuda/reduction_order.h"
#include "kernels/elementwise.h"
#include "kernels/ops.h"

namespace engine::kernels::cuda {

namespace {

// Threads per block everywhere. Reductions rely on it being a power of two.
constexpr int kThreads = kReduceThreads;

cudaStream_t stream() { return Context::get().stream(); }

// Grid-stride loop index helpers (64-bit: tensors may exceed 2^31 elements).
__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// ---- Per-channel reductions over many blocks ----------------------------------------
//
// The partition and the order are kernels/cuda/reduction_order.h's (channel_slices,
// slice_length). Grids are (c, slices): block (ch, s) reduces slice s of channel ch,
// each thread walking its fixed strided subset of the slice, and the block adds the
// threads' values in block_sum's fixed tree. The slice partials (double) go to
// partials[ch * slices + s]; a later kernel adds a channel's partials in slice order,
// 0 to slices - 1 (combine_partials). No atomics: the bits never depend on scheduling.

// Element e of channel ch of an [n, c, hw] tensor.
__device__ __forceinline__ int64_t bn_index(int64_t e, int c, int ch, int64_t hw) {
  return ((e / hw) * c + ch) * hw + e % hw;
}

// The element range [begin, end) of this block's slice (grid (c, slices)).
struct Slice {
  int64_t begin, end;
};
__device__ __forceinline__ Slice block_slice(int64_t m) {
  const int64_t length = slice_length(m, gridDim.y);
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * length;
  const int64_t end = begin + length < m ? begin + length : m;
  return Slice{begin < m ? begin : m, end};
}

// Sum of one channel's slice partials, in slice order: every caller gets the same bits.
__device__ double combine_partials(const double* partials, int ch, int slices) {
  double total = 0.0;
  for (int s = 0; s < slices; ++s) total += partials[static_cast<int64_t>(ch) * slices + s];
  return total;
}

// partials[ch * slices + s] = sum of x over slice s of channel ch.
__global__ void channel_partials_kernel(int n, int c, int64_t hw, const float* x,
                                        double* partials) {
  __shared__ double buffer[kThreads];
  const int ch = blockIdx.x;
  const Slice sl = block_slice(static_cast<int64_t>(n) * hw);
  double acc = 0.0;
  for (int64_t e = sl.begin + threadIdx.x; e < sl.end; e += blockDim.x)
    acc += static_cast<double>(x[bn_index(e, c, ch, hw)]);
  const double total = block_sum(acc, buffer);
  if (threadIdx.x == 0) partials[static_cast<int64_t>(ch) * gridDim.y + blockIdx.y] = total;
}

// ---- Channel helpers ----------------------------------------------------------------

__global__ void add_channel_bias_kernel(int64_t total, int c, int64_t hw, const float* bias,
                                        float* y) {
  for (int64_t e = first_index(); e < total; e += grid_stride()) {
    const int ch = static_cast<int>((e / hw) % c);
    y[e] += bias[ch];
  }
}

// Second pass of channel_sum: one thread per channel adds its slice partials.
__global__ void channel_sum_final_kernel(int c, int slices, const double* partials, float* out) {
  const int ch = blockIdx.x * blockDim.x + threadIdx.x;
  if (ch < c) out[ch] = static_cast<float>(combine_partials(partials, ch, slices));
}

// ---- ReLU ---------------------------------------------------------------------------

__global__ void relu_forward_kernel(int64_t n, const float* x, float* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = relu(x[i]);
}

__global__ void relu_backward_kernel(int64_t n, const float* y, const float* dy, float* dx) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dx[i] = relu_grad(y[i], dy[i]);
}

// ---- Max pooling 2x2, stride 2 ------------------------------------------------------

// One thread per output; candidates visited in row-major window order. PyTorch's rule,
// as in the reference: move on when a later value is strictly greater (ties keep the
// first maximum) or is NaN (NaN propagates).
__global__ void maxpool_forward_kernel(int64_t outputs, int h, int w, const float* x, float* y,
                                       int32_t* argmax) {
  const int oh_count = h / 2, ow_count = w / 2;
  for (int64_t o = first_index(); o < outputs; o += grid_stride()) {
    const int ow = static_cast<int>(o % ow_count);
    const int64_t t = o / ow_count;
    const int oh = static_cast<int>(t % oh_count);
    const int64_t plane = t / oh_count;  // n*C + c
    const int64_t base = (plane * h + 2 * oh) * w + 2 * ow;
    const int64_t candidates[4] = {base, base + 1, base + w, base + w + 1};
    float best = x[base];
    int64_t best_index = base;
    for (int q = 1; q < 4; ++q) {
      const float v = x[candidates[q]];
      if (v > best || isnan(v)) {
        best = v;
        best_index = candidates[q];
      }
    }
    y[o] = best;
    argmax[o] = static_cast<int32_t>(best_index);
  }
}

// One thread per input: windows do not overlap, so each input belongs to exactly one
// output and gathers its gradient from it. No scatter, no atomics, and every dx
// element is written (overwrite semantics).
__global__ void maxpool_backward_kernel(int64_t inputs, int h, int w, const float* dy,
                                        const int32_t* argmax, float* dx) {
  const int oh_count = h / 2, ow_count = w / 2;
  for (int64_t e = first_index(); e < inputs; e += grid_stride()) {
    const int col = static_cast<int>(e % w);
    const int64_t t = e / w;
    const int row = static_cast<int>(t % h);
    const int64_t plane = t / h;
    const int64_t o = (plane * oh_count + row / 2) * ow_count + col / 2;
    dx[e] = (static_cast<int64_t>(argmax[o]) == e) ? dy[o] : 0.0f;
  }
}

// ---- Dropout ------------------------------------------------------------------------

// Each element draws its own Philox value by position (philox_at), so the mask is the
// CPU's mask bit for bit, whatever the launch configuration.
__global__ void dropout_forward_kernel(int64_t n, const float* x, float p, float scale,
                                       PhiloxStream s, const uint64_t* counter, uint64_t offset,
                                       float* y, uint8_t* keep) {
  offset += *counter;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const bool k = dropout_keep(s, offset, static_cast<uint64_t>(i), p);
    y[i] = k ? x[i] * scale : 0.0f;
    keep[i] = k ? 1 : 0;
  }
}

__global__ void dropout_backward_kernel(int64_t n, const float* dy, const uint8_t* keep,
                                        float scale, float* dx) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dx[i] = keep[i] ? dy[i] * scale : 0.0f;
}

// ---- Batch normalisation ------------------------------------------------------------
//
// Training statistics and the backward pass run over grids (c, slices) with the fixed
// slice partition above, in three (forward) or two (backward) kernels. Every block of
// a channel recomputes the channel's totals from the same partials in the same order,
// so all blocks see identical values. The per-element and per-channel formulas are the
// reference's, in double, so only the summation order differs from it.

// Forward pass 2: each block forms its channel's mean (pass 1: channel_partials_kernel
// over x), then sums (x - mean)^2 over its slice: two passes for accuracy.
__global__ void batchnorm_sq_partials_kernel(int n, int c, int64_t hw, const float* x,
                                             const double* sum_partials, double* sq_partials) {
  __shared__ double buffer[kThreads];
  __shared__ double mean_shared;
  const int ch = blockIdx.x;
  const int64_t m = static_cast<int64_t>(n) * hw;
  if (threadIdx.x == 0)
    mean_shared = combine_partials(sum_partials, ch, gridDim.y) / static_cast<double>(m);
  __syncthreads();  // mean_shared is written once, before any thread reads it
  const double mean = mean_shared;

  const Slice sl = block_slice(m);
  double acc = 0.0;
  for (int64_t e = sl.begin + threadIdx.x; e < sl.end; e += blockDim.x) {
    const double d = static_cast<double>(x[bn_index(e, c, ch, hw)]) - mean;
    acc += d * d;
  }
  const double total = block_sum(acc, buffer);
  if (threadIdx.x == 0) sq_partials[static_cast<int64_t>(ch) * gridDim.y + blockIdx.y] = total;
}

// Forward pass 3: mean and biased variance from the partials, the normalised output
// over this block's slice; block (ch, 0) also saves the statistics and updates the
// running ones (no other block touches them).
__global__ void batchnorm_normalize_kernel(int n, int c, int64_t hw, const float* x,
                                           const float* gamma, const float* beta, float eps,
                                           float momentum, const double* sum_partials,
                                           const double* sq_partials, float* running_mean,
                                           float* running_var, float* save_mean,
                                           float* save_invstd, float* y) {
  __shared__ double stats[2];  // mean, invstd
  const int ch = blockIdx.x;
  const int64_t m = static_cast<int64_t>(n) * hw;
  if (threadIdx.x == 0) {
    const double mean = combine_partials(sum_partials, ch, gridDim.y) / static_cast<double>(m);
    const double sq = combine_partials(sq_partials, ch, gridDim.y);
    const double var = sq / static_cast<double>(m);  // biased: used to normalise
    const double invstd = 1.0 / sqrt(var + static_cast<double>(eps));
    stats[0] = mean;
    stats[1] = invstd;
    if (blockIdx.y == 0) {
      save_mean[ch] = static_cast<float>(mean);
      save_invstd[ch] = static_cast<float>(invstd);
      bn_update_running(mean, sq, static_cast<double>(m), momentum, running_mean[ch], running_var[ch]);
    }
  }
  __syncthreads();  // stats are written once, before any thread reads them
  const double mean = stats[0], invstd = stats[1];
  const double g = gamma[ch], b = beta[ch];
  const Slice sl = block_slice(m);
  for (int64_t e = sl.begin + threadIdx.x; e < sl.end; e += blockDim.x) {
    const int64_t idx = bn_index(e, c, ch, hw);
    y[idx] = static_cast<float>((static_cast<double>(x[idx]) - mean) * invstd * g + b);
  }
}

__global__ void batchnorm_eval_kernel(int64_t total, int c, int64_t hw, const float* x,
                                      const float* gamma, const float* beta,
                                      const float* running_mean, const float* running_var,
                                      float eps, float* y) {
  // The reference's expression with its types: a float difference, the rest in double.
  for (int64_t e = first_index(); e < total; e += grid_stride()) {
    const int ch = static_cast<int>((e / hw) % c);
    const double invstd =
        1.0 / sqrt(static_cast<double>(running_var[ch]) + static_cast<double>(eps));
    const float centred = x[e] - running_mean[ch];
    y[e] = static_cast<float>(static_cast<double>(centred) * invstd * gamma[ch] + beta[ch]);
  }
}

// Backward. With xhat = (x - mean) * invstd:
//   dbeta = sum dy,  dgamma = sum dy * xhat,
//   dx = gamma * invstd / m * (m * dy - dbeta - xhat * dgamma)
// in double, as the reference writes it (double keeps the m*dy cancellation harmless).
// Pass 1: both sums over this block's slice.
__global__ void batchnorm_backward_partials_kernel(int n, int c, int64_t hw, const float* x,
                                                   const float* dy, const float* save_mean,
                                                   const float* save_invstd,
                                                   double* dy_partials,
                                                   double* dy_xhat_partials) {
  __shared__ double buffer[kThreads];
  const int ch = blockIdx.x;
  const double mean = save_mean[ch];
  const double invstd = save_invstd[ch];
  const Slice sl = block_slice(static_cast<int64_t>(n) * hw);
  double acc_dy = 0.0, acc_dy_xhat = 0.0;
  for (int64_t e = sl.begin + threadIdx.x; e < sl.end; e += blockDim.x) {
    const int64_t idx = bn_index(e, c, ch, hw);
    const double g = dy[idx];
    acc_dy += g;
    acc_dy_xhat += g * (static_cast<double>(x[idx]) - mean) * invstd;
  }
  const double sum_dy = block_sum(acc_dy, buffer);
  const double sum_dy_xhat = block_sum(acc_dy_xhat, buffer);
  if (threadIdx.x == 0) {
    const int64_t p = static_cast<int64_t>(ch) * gridDim.y + blockIdx.y;
    dy_partials[p] = sum_dy;
    dy_xhat_partials[p] = sum_dy_xhat;
  }
}

// Pass 2: the channel's sums from the partials; block (ch, 0) writes dbeta and dgamma,
// every block writes dx over its slice (dx may be dy: each element is read, then
// written, by the same thread).
__global__ void batchnorm_backward_dx_kernel(int n, int c, int64_t hw, const float* x,
                                             const float* dy, const float* gamma,
                                             const float* save_mean, const float* save_invstd,
                                             const double* dy_partials,
                                             const double* dy_xhat_partials, float* dx,
                                             float* dgamma, float* dbeta) {
  __shared__ double sums[2];  // sum dy, sum dy * xhat
  const int ch = blockIdx.x;
  if (threadIdx.x == 0) {
    sums[0] = combine_partials(dy_partials, ch, gridDim.y);
    sums[1] = combine_partials(dy_xhat_partials, ch, gridDim.y);
    if (blockIdx.y == 0) {
      if (dbeta) dbeta[ch] = static_cast<float>(sums[0]);
      if (dgamma) dgamma[ch] = static_cast<float>(sums[1]);
    }
  }
  if (!dx) return;  // uniform across the block: no thread is left waiting below
  __syncthreads();  // sums are written once, before any thread reads them
  const double sum_dy = sums[0], sum_dy_xhat = sums[1];

  const int64_t m = static_cast<int64_t>(n) * hw;
  const double mean = save_mean[ch];
  const double invstd = save_invstd[ch];
  const double md = static_cast<double>(m);
  const double k = static_cast<double>(gamma[ch]) * invstd / md;
  const Slice sl = block_slice(m);
  for (int64_t e = sl.begin + threadIdx.x; e < sl.end; e += blockDim.x) {
    const int64_t idx = bn_index(e, c, ch, hw);
    const double xhat = (static_cast<double>(x[idx]) - mean) * invstd;
    dx[idx] = static_cast<float>(k * (md * dy[idx] - sum_dy - xhat * sum_dy_xhat));
  }
}

// ---- Cross-entropy ------------------------------------------------------------------

constexpr int kWarp = 32;

// Max with its index over the warp; on equal values the lower index wins, so the
// overall result is the first maximum. index == INT_MAX marks a lane without a
// candidate. Values are never NaN here, so the order is total and every lane ends with
// the same pair.
__device__ void warp_argmax(float& value, int& index) {
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, value, offset);
    const int i = __shfl_xor_sync(0xffffffffu, index, offset);
    if (i != INT_MAX && (index == INT_MAX || v > value || (v == value && i < index))) {
      value = v;
      index = i;
    }
  }
}

// Butterfly sum: lane l adds its partner's value; addition is commutative, so both
// partners get the same bits and every lane ends with the same total.
__device__ double warp_sum(double value) {
  for (int offset = kWarp / 2; offset > 0; offset >>= 1)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// ---- Softmax ----------------------------------------------------------------------

struct GpuExp {
  __host__ __device__ double operator()(double x) const { return exp(x); }
};

// One thread per row: the classifier's rows are short (10 classes).
__global__ void softmax_kernel(int n, int classes, const float* logits, float* probs) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    softmax_row(logits + i * classes, classes, probs + i * classes, GpuExp{});
}

// One warp per sample (the loops over classes are strided by lane). Log-softmax in
// double around the maximum logit for stability. An out-of-range label gives a NaN
// loss (and no one-hot term) rather than a memory error.
// The gradient is normalised by batch_total (the whole batch's size; n when the kernel
// sees all of it, more when it sees one rank's part: cross_entropy).
__global__ void cross_entropy_kernel(int n, int batch_total, int classes, const float* logits,
                                     const int32_t* labels, const float* grad_scale,
                                     const int64_t* first, float* dlogits, float* sample_loss,
                                     float* sample_correct) {
  const int lane = threadIdx.x % kWarp;
  const int64_t sample = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  if (sample >= n) return;  // whole warps leave together (blockDim is a multiple of 32)
  const float* row = logits + sample * classes;

  // The reference's argmax: start at class 0, move on only to a strictly greater
  // value. So a NaN never becomes the maximum unless it is class 0, and then nothing
  // replaces it. Here: the first maximum of the non-NaN values (NaN skipped, so the
  // warp reduction sees a total order), then class 0 when it is NaN or all are NaN.
  float best = -INFINITY;
  int best_index = INT_MAX;
  for (int j = lane; j < classes; j += kWarp) {
    const float v = row[j];
    if (isnan(v)) continue;
    if (best_index == INT_MAX || v > best) {
      best = v;
      best_index = j;
    }
  }
  warp_argmax(best, best_index);
  if (best_index == INT_MAX || isnan(row[0])) best_index = 0;
  const double max_logit = row[best_index];

  double sum = 0.0;
  for (int j = lane; j < classes; j += kWarp) sum += exp(static_cast<double>(row[j]) - max_logit);
  sum = warp_sum(sum);
  const double lse = max_logit + log(sum);

  const int label = labels[sample];
  const bool valid = label >= 0 && label < classes;
  if (lane == 0) {
    const int64_t at = *first + sample;
    sample_loss[at] = valid ? static_cast<float>(lse - static_cast<double>(row[label])) : NAN;
    sample_correct[at] = (valid && best_index == label) ? 1.0f : 0.0f;
  }
  if (dlogits) {
    // The reference's expression and order: (softmax - onehot) * grad_scale / batch_total.
    float* drow = dlogits + sample * classes;
    for (int j = lane; j < classes; j += kWarp) {
      const double softmax = exp(static_cast<double>(row[j]) - lse);
      const double onehot = (j == label) ? 1.0 : 0.0;
      drow[j] = static_cast<float>((softmax - onehot) * static_cast<double>(*grad_scale) /
                                   static_cast<double>(batch_total));
    }
  }
}

// ---- Deterministic sum --------------------------------------------------------------

// Pass 1: block b sums elements b*kThreads + t, stepping by the whole grid; the grid
// size depends only on n, so the partition is the same on every GPU and every run.
__global__ void sum_partials_kernel(int64_t n, const float* x, double* partials) {
  __shared__ double buffer[kThreads];
  double acc = 0.0;
  for (int64_t i = first_index(); i < n; i += grid_stride()) acc += static_cast<double>(x[i]);
  const double total = block_sum(acc, buffer);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// Pass 2: one block adds the partials, again in a fixed order.
__global__ void sum_final_kernel(int count, const double* partials, double* result) {
  __shared__ double buffer[kThreads];
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  const double total = block_sum(acc, buffer);
  if (threadIdx.x == 0) *result = total;
}

// ---- Batch gathering ----------------------------------------------------------------

__global__ void gather_batch_kernel(int n, int pixels, const uint8_t* images,
                                    const uint8_t* labels, const int32_t* indices,
                                    const int64_t* first, float mean, float inv_std, float* out,
                                    int32_t* labels_out) {
  indices += *first;
  const int64_t total = static_cast<int64_t>(n) * pixels;
  for (int64_t e = first_index(); e < total; e += grid_stride()) {
    const int64_t i = e / pixels, p = e % pixels;
    const int64_t src = static_cast<int64_t>(indices[i]) * pixels + p;
    out[e] = normalize_pixel(images[src], mean, inv_std);
  }
  for (int64_t i = first_index(); i < n; i += grid_stride())
    labels_out[i] = static_cast<int32_t>(labels[indices[i]]);
}

// ---- Optimiser and loss scaling -----------------------------------------------------

// The step digests' partial sums (kernels/step_digest.h): a warp's lanes summed by
// shuffles, one atomic add per warp. Integer sums: exact, so the order the blocks add
// in does not change them.
__device__ void add_digest(uint64_t value, uint64_t* to) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  if ((threadIdx.x & 31) == 0) atomicAdd(reinterpret_cast<unsigned long long*>(to), static_cast<unsigned long long>(value));
}

__global__ void adam_kernel(int64_t n, float* param, const float* grad, float* exp_avg,
                            float* exp_avg_sq, AdamHyper h, const AdamStepFactors* factors,
                            const int32_t* skip, int64_t index_first, uint64_t* digests) {
  const bool update = !(skip && *skip);
  if (!update && !digests) return;
  const AdamStepFactors f = *factors;
  uint64_t dp = 0, dm = 0, dv = 0;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    float p = param[i], m = exp_avg[i], v = exp_avg_sq[i];
    if (update) {
      adam_element(p, grad[i], m, v, h, f);
      param[i] = p;
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
    }
    if (digests) {
      const uint64_t at = static_cast<uint64_t>(index_first + i);
      dp += digest_term(at, digest_word(p));
      dm += digest_term(at, digest_word(m));
      dv += digest_term(at, digest_word(v));
    }
  }
  if (!digests) return;  // the same for every thread: no lane leaves a shuffle early
  add_digest(dp, digests);
  add_digest(dm, digests + 1);
  add_digest(dv, digests + 2);
}

__global__ void digest_words_kernel(int64_t n, const uint32_t* words, int64_t index_first, uint64_t* sum) {
  uint64_t d = 0;
  for (int64_t i = first_index(); i < n; i += grid_stride())
    d += digest_term(static_cast<uint64_t>(index_first + i), words[i]);
  add_digest(d, sum);
}

// One block: every thread adds its share of each range, the block adds the threads'.
__global__ void step_digest_finish_kernel(int n_sums, uint64_t* sums, int n_ranges, const DigestRange* ranges,
                                          const float* loss, const int64_t* loss_first, int loss_count,
                                          uint64_t* ring, int64_t* next, int capacity) {
  __shared__ unsigned long long part[kThreads];
  uint64_t* row = ring + (*next % capacity) * (n_sums + n_ranges + 1);
  for (int i = threadIdx.x; i < n_sums; i += blockDim.x) {
    row[i] = sums[i];
    sums[i] = 0;
  }
  for (int r = 0; r <= n_ranges; ++r) {
    const bool is_loss = r == n_ranges;
    const float* data = is_loss ? loss + *loss_first : ranges[r].data;
    const int64_t n = is_loss ? loss_count : ranges[r].n, first = is_loss ? *loss_first : 0;
    uint64_t d = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      d += digest_term(static_cast<uint64_t>(first + i), digest_word(data[i]));
    part[threadIdx.x] = d;
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t total = 0;
      for (int t = 0; t < blockDim.x; ++t) total += part[t];
      row[n_sums + r] = total;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) ++*next;  // after every thread has read it (the barriers above)
}

__global__ void unscale_check_kernel(int64_t n, float* grad, const float* inv_scale_at,
                                     int32_t* found_inf) {
  const float inv_scale = *inv_scale_at;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    float g = grad[i];
    // Racing threads all store the same value 1, so a plain store is enough; the flag
    // is never cleared here (loss_scale_update clears it after the step).
    if (unscale_element(g, inv_scale)) *found_inf = 1;
    grad[i] = g;
  }
}

// ---- Casts --------------------------------------------------------------------------

__global__ void f32_to_f16_kernel(int64_t n, const float* in, __half* out) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = __float2half_rn(in[i]);
}

__global__ void f16_to_f32_kernel(int64_t n, const __half* in, float* out) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = __half2float(in[i]);
}

}  // namespace

// ---- Shared helpers -----------------------------------------------------------------

void add_channel_bias(int n, int c, int64_t hw, const float* bias, float* y) {
  const int64_t total = static_cast<int64_t>(n) * c * hw;
  if (total <= 0) return;
  add_channel_bias_kernel<<<grid_for(total, kThreads), kThreads, 0, stream()>>>(total, c, hw,
                                                                               bias, y);
  ENGINE_CUDA_CHECK_LAUNCH("add_channel_bias_kernel");
}

void channel_sum(int n, int c, int64_t hw, const float* x, float* out) {
  if (c <= 0) return;
  const int64_t m = static_cast<int64_t>(n) * hw;
  if (m <= 0) {  // an empty sum is zero
    ENGINE_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float) * c, stream()));
    return;
  }
  const int slices = channel_slices(m);
  // Held until the last kernel reading the workspace is queued (context.h, Threading).
  const SharedStateLock lock;
  double* partials = static_cast<double*>(
      Context::get().workspace(sizeof(double) * static_cast<std::size_t>(c) * slices));
  channel_partials_kernel<<<dim3(c, slices), kThreads, 0, stream()>>>(n, c, hw, x, partials);
  ENGINE_CUDA_CHECK_LAUNCH("channel_partials_kernel");
  channel_sum_final_kernel<<<(c + kThreads - 1) / kThreads, kThreads, 0, stream()>>>(
      c, slices, partials, out);
  ENGINE_CUDA_CHECK_LAUNCH("channel_sum_final_kernel");
}

// ---- Ops ----------------------------------------------------------------------------

void relu_forward(int64_t n, const float* x, float* y) {
  if (n <= 0) return;
  relu_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(n, x, y);
  ENGINE_CUDA_CHECK_LAUNCH("relu_forward_kernel");
}

void relu_backward(int64_t n, const float* y, const float* dy, float* dx) {
  if (n <= 0) return;
  relu_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(n, y, dy, dx);
  ENGINE_CUDA_CHECK_LAUNCH("relu_backward_kernel");
}

void maxpool2x2_forward(const PoolShape& s, const float* x, float* y, int32_t* argmax) {
  const int64_t outputs = static_cast<int64_t>(s.n) * s.c * (s.h / 2) * (s.w / 2);
  if (outputs <= 0) return;
  maxpool_forward_kernel<<<grid_for(outputs, kThreads), kThreads, 0, stream()>>>(
      outputs, s.h, s.w, x, y, argmax);
  ENGINE_CUDA_CHECK_LAUNCH("maxpool_forward_kernel");
}

void maxpool2x2_backward(const PoolShape& s, const float* dy, const int32_t* argmax, float* dx) {
  const int64_t inputs = static_cast<int64_t>(s.n) * s.c * s.h * s.w;
  if (inputs <= 0) return;
  maxpool_backward_kernel<<<grid_for(inputs, kThreads), kThreads, 0, stream()>>>(
      inputs, s.h, s.w, dy, argmax, dx);
  ENGINE_CUDA_CHECK_LAUNCH("maxpool_backward_kernel");
}

void dropout_forward(int64_t n, const float* x, float p, PhiloxStream s, const uint64_t* counter,
                     uint64_t offset, float* y, uint8_t* keep) {
  if (n <= 0) return;
  dropout_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
      n, x, p, dropout_scale(p), s, counter, offset, y, keep);
  ENGINE_CUDA_CHECK_LAUNCH("dropout_forward_kernel");
}

void dropout_backward(int64_t n, const float* dy, const uint8_t* keep, float p, float* dx) {
  if (n <= 0) return;
  dropout_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
      n, dy, keep, dropout_scale(p), dx);
  ENGINE_CUDA_CHECK_LAUNCH("dropout_backward_kernel");
}

void batchnorm_forward_train(const BatchNormShape& s, BatchSplit split, const float* x, const float* gamma,
                             const float* beta, float eps, float momentum, float* running_mean,
                             float* running_var, float* save_mean, float* save_invstd, float* y) {
  if (!split.whole())
    return batchnorm_forward_train_by_chunks(s, split.chunks, split.bounds, x, gamma, beta, eps, momentum,
                                             running_mean, running_var, save_mean, save_invstd, y);
  const int64_t m = static_cast<int64_t>(s.n) * s.hw;
  if (s.c <= 0 || m <= 0) return;
  const int slices = channel_slices(m);
  const std::size_t count = static_cast<std::size_t>(s.c) * slices;
  const SharedStateLock lock;
  double* sum_partials =
      static_cast<double*>(Context::get().workspace(2 * count * sizeof(double)));
  double* sq_partials = sum_partials + count;
  const dim3 grid(s.c, slices);
  channel_partials_kernel<<<grid, kThreads, 0, stream()>>>(s.n, s.c, s.hw, x, sum_partials);
  ENGINE_CUDA_CHECK_LAUNCH("channel_partials_kernel");
  batchnorm_sq_partials_kernel<<<grid, kThreads, 0, stream()>>>(s.n, s.c, s.hw, x, sum_partials,
                                                                sq_partials);
  ENGINE_CUDA_CHECK_LAUNCH("batchnorm_sq_partials_kernel");
  batchnorm_normalize_kernel<<<grid, kThreads, 0, stream()>>>(
      s.n, s.c, s.hw, x, gamma, beta, eps, momentum, sum_partials, sq_partials, running_mean,
      running_var, save_mean, save_invstd, y);
  ENGINE_CUDA_CHECK_LAUNCH("batchnorm_normalize_kernel");
}

void batchnorm_forward_eval(const BatchNormShape& s, const float* x, const float* gamma,
                            const float* beta, const float* running_mean,
                            const float* running_var, float eps, float* y) {
  const int64_t total = static_cast<int64_t>(s.n) * s.c * s.hw;
  if (total <= 0) return;
  batchnorm_eval_kernel<<<grid_for(total, kThreads), kThreads, 0, stream()>>>(
      total, s.c, s.hw, x, gamma, beta, running_mean, running_var, eps, y);
  ENGINE_CUDA_CHECK_LAUNCH("batchnorm_eval_kernel");
}

void batchnorm_backward(const BatchNormShape& s, BatchSplit split, const float* x, const float* dy,
                        const float* gamma, const float* save_mean, const float* save_invstd,
                        float* dx, float* dgamma, float* dbeta) {
  if (!split.whole())
    return batchnorm_backward_by_chunks(s, split.chunks, split.bounds, x, dy, gamma, save_mean, save_invstd, dx,
                                        dgamma, dbeta);
  const int64_t m = static_cast<int64_t>(s.n) * s.hw;
  if (s.c <= 0 || m <= 0) return;
  const int slices = channel_slices(m);
  const std::size_t count = static_cast<std::size_t>(s.c) * slices;
  const SharedStateLock lock;
  double* dy_partials =
      static_cast<double*>(Context::get().workspace(2 * count * sizeof(double)));
  double* dy_xhat_partials = dy_partials + count;
  const dim3 grid(s.c, slices);
  batchnorm_backward_partials_kernel<<<grid, kThreads, 0, stream()>>>(
      s.n, s.c, s.hw, x, dy, save_mean, save_invstd, dy_partials, dy_xhat_partials);
  ENGINE_CUDA_CHECK_LAUNCH("batchnorm_backward_partials_kernel");
  batchnorm_backward_dx_kernel<<<grid, kThreads, 0, stream()>>>(
      s.n, s.c, s.hw, x, dy, gamma, save_mean, save_invstd, dy_partials, dy_xhat_partials, dx,
      dgamma, dbeta);
  ENGINE_CUDA_CHECK_LAUNCH("batchnorm_backward_dx_kernel");
}

void softmax(int n, int classes, const float* logits, float* probs) {
  if (n <= 0) return;
  softmax_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(n, classes, logits, probs);
  ENGINE_CUDA_CHECK_LAUNCH("softmax_kernel");
}

void cross_entropy(int n, int batch_total, int classes, const float* logits, const int32_t* labels,
                   const float* grad_scale, const int64_t* first, float* dlogits, float* sample_loss,
                   float* sample_correct) {
  if (n <= 0 || classes <= 0) return;
  constexpr int kSamplesPerBlock = kThreads / kWarp;
  const unsigned int blocks = static_cast<unsigned int>((n + kSamplesPerBlock - 1) / kSamplesPerBlock);
  cross_entropy_kernel<<<blocks, kThreads, 0, stream()>>>(n, batch_total, classes, logits, labels, grad_scale,
                                                          first, dlogits, sample_loss, sample_correct);
  ENGINE_CUDA_CHECK_LAUNCH("cross_entropy_kernel");
}

double reduce_sum(int64_t n, const float* x) {
  if (n <= 0) return 0.0;
  Context& ctx = Context::get();
  // At most 1024 partials: enough blocks to fill the GPU, few enough for one block
  // to finish. The count depends only on n (never on the GPU), keeping the order fixed.
  const int64_t wanted = (n + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(wanted < 1024 ? wanted : 1024);
  double host = 0.0;
  {
    // Until the copy of the result is queued: a later user of the workspace is then
    // ordered after it on the one stream, so the wait below needs no lock.
    const SharedStateLock lock;
    double* partials = static_cast<double*>(ctx.workspace((blocks + 1) * sizeof(double)));
    double* result = partials + blocks;
    sum_partials_kernel<<<blocks, kThreads, 0, ctx.stream()>>>(n, x, partials);
    ENGINE_CUDA_CHECK_LAUNCH("sum_partials_kernel");
    sum_final_kernel<<<1, kThreads, 0, ctx.stream()>>>(blocks, partials, result);
    ENGINE_CUDA_CHECK_LAUNCH("sum_final_kernel");
    ENGINE_CUDA_CHECK(cudaMemcpyAsync(&host, result, sizeof(double), cudaMemcpyDeviceToHost,
                                      ctx.stream()));
  }
  // Synchronous on purpose: the value is needed on the host now (once per epoch).
  ENGINE_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
  return host;
}

void gather_batch(int n, int pixels, const uint8_t* images, const uint8_t* labels,
                  const int32_t* indices, const int64_t* first, float mean, float std, float* out,
                  int32_t* labels_out) {
  if (n <= 0) return;
  const int64_t total = static_cast<int64_t>(n) * (pixels > 0 ? pixels : 1);
  const float inv_std = 1.0f / std;
  gather_batch_kernel<<<grid_for(total, kThreads), kThreads, 0, stream()>>>(
      n, pixels, images, labels, indices, first, mean, inv_std, out, labels_out);
  ENGINE_CUDA_CHECK_LAUNCH("gather_batch_kernel");
}

void adam_update(int64_t n, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                 const AdamHyper& h, const AdamStepFactors* f, const int32_t* skip, int64_t index_first,
                 uint64_t* digests) {
  if (n <= 0) return;
  adam_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(n, param, grad, exp_avg,
                                                                 exp_avg_sq, h, f, skip, index_first, digests);
  ENGINE_CUDA_CHECK_LAUNCH("adam_kernel");
}

void step_digest_finish(int n_sums, uint64_t* sums, int n_ranges, const DigestRange* ranges, const float* loss,
                        const int64_t* loss_first, int loss_count, uint64_t* ring, int64_t* next, int capacity) {
  step_digest_finish_kernel<<<1, kThreads, 0, stream()>>>(n_sums, sums, n_ranges, ranges, loss, loss_first,
                                                          loss_count, ring, next, capacity);
  ENGINE_CUDA_CHECK_LAUNCH("step_digest_finish_kernel");
}

void digest_words(int64_t n, const uint32_t* words, int64_t index_first, uint64_t* sum) {
  if (n <= 0) return;
  digest_words_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(n, words, index_first, sum);
  ENGINE_CUDA_CHECK_LAUNCH("digest_words_kernel");
}

__global__ void round_to_float_kernel(int64_t n, const double* x, float* y) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = __double2float_rn(x[i]);
}

void round_to_float(int64_t n, const double* x, float* y) {
  if (n <= 0) return;
  round_to_float_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(n, x, y);
  ENGINE_CUDA_CHECK_LAUNCH("round_to_float_kernel");
}

// One thread: the per-step bookkeeping that would otherwise need the host to know
// whether the step was skipped.
__global__ void adam_prepare_step_kernel(int count, const double* lr, AdamFactorInputs in,
                                         const int32_t* skip, int64_t* steps, AdamStepFactors* out) {
  if (*skip) return;
  for (int i = 0; i < count; ++i) out[i] = adam_factors_at(*lr, in, ++steps[i]);
}

__global__ void loss_scale_update_kernel(LossScaleState* state, LossScaleRule rule) {
  loss_scale_update_rule(*state, rule);
}

void adam_prepare_step(int count, const double* lr, AdamFactorInputs in, const int32_t* skip, int64_t* steps,
                       AdamStepFactors* out) {
  adam_prepare_step_kernel<<<1, 1, 0, stream()>>>(count, lr, in, skip, steps, out);
  ENGINE_CUDA_CHECK_LAUNCH("adam_prepare_step_kernel");
}

void loss_scale_update(LossScaleState* state, LossScaleRule rule) {
  loss_scale_update_kernel<<<1, 1, 0, stream()>>>(state, rule);
  ENGINE_CUDA_CHECK_LAUNCH("loss_scale_update_kernel");
}

void unscale_check(int64_t n, float* grad, const float* inv_scale, int32_t* found_inf) {
  if (n <= 0) return;
  unscale_check_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(n, grad, inv_scale,
                                                                          found_inf);
  ENGINE_CUDA_CHECK_LAUNCH("unscale_check_kernel");
}

void cast_f32_to_f16(int64_t n, const float* in, void* out) {
  if (n <= 0) return;
  f32_to_f16_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
      n, in, static_cast<__half*>(out));
  ENGINE_CUDA_CHECK_LAUNCH("f32_to_f16_kernel");
}

void cast_f16_to_f32(int64_t n, const void* in, float* out) {
  if (n <= 0) return;
  f16_to_f32_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
      n, static_cast<const __half*>(in), out);
  ENGINE_CUDA_CHECK_LAUNCH("f16_to_f32_kernel");
}

}  // namespace engine::kernels::cuda
