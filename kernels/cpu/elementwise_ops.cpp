// Fast CPU versions of the non-GEMM ops: OpenMP over independent elements, channels
// or samples. Every reduction runs inside one thread in a fixed order, so results do
// not depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/batchnorm_math.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/chunk_tree.h"
#include "kernels/ops.h"
#include "kernels/det_math.h"
#include "kernels/step_digest.h"

namespace engine::kernels::cpu {

namespace {

// Sums of one channel plane (hw contiguous floats) with 16 float lanes, reduced in a
// fixed order into double: vectorisable and independent of the thread count.
constexpr int kLanes = 16;

template <class F>
double plane_sum(int hw, F term) {
  float lanes[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= hw; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lanes[j] += term(i + j);
  double total = 0.0;
  for (; i < hw; ++i) total += term(i);
  for (int j = 0; j < kLanes; ++j) total += lanes[j];
  return total;
}

}  // namespace

// Training-mode batch norm over the whole batch: each channel's sums in one pass.
static void batchnorm_forward_train_whole(const BatchNormShape& s, const float* x, const float* gamma,
                                          const float* beta, float eps, float momentum, float* running_mean,
                                          float* running_var, float* save_mean, float* save_invstd, float* y) {
  const double m = static_cast<double>(s.n) * s.hw;
#pragma omp parallel for schedule(static)
  for (int c = 0; c < s.c; ++c) {
    double sum = 0.0, sq = 0.0;
    for (int n = 0; n < s.n; ++n) {
      const float* xp = x + (static_cast<int64_t>(n) * s.c + c) * s.hw;
      sum += plane_sum(s.hw, [xp](int i) { return xp[i]; });
    }
    const double mean = sum / m;
    const float mean_f = static_cast<float>(mean);
    // Centred second pass: no catastrophic cancellation for large means.
    for (int n = 0; n < s.n; ++n) {
      const float* xp = x + (static_cast<int64_t>(n) * s.c + c) * s.hw;
      sq += plane_sum(s.hw, [xp, mean_f](int i) {
        const float d = xp[i] - mean_f;
        return d * d;
      });
    }
    // y = x * scale + shift, folded once per channel (kernels/batchnorm_math.h).
    const BnForwardFactors f =
        bn_forward_finish(sum, sq, m, gamma[c], beta[c], eps, momentum, running_mean[c], running_var[c]);
    for (int n = 0; n < s.n; ++n) {
      const int64_t off = (static_cast<int64_t>(n) * s.c + c) * s.hw;
      for (int i = 0; i < s.hw; ++i) y[off + i] = x[off + i] * f.scale + f.shift;
    }
    save_mean[c] = f.save_mean;
    save_invstd[c] = f.save_invstd;
  }
}

void batchnorm_forward_eval(const BatchNormShape& s, const float* x, const float* gamma,
                            const float* beta, const float* running_mean,
                            const float* running_var, float eps, float* y) {
#pragma omp parallel for schedule(static)
  for (int c = 0; c < s.c; ++c) {
    const double invstd = 1.0 / std::sqrt(static_cast<double>(running_var[c]) + eps);
    const float a = static_cast<float>(invstd * gamma[c]);
    const float bias = static_cast<float>(beta[c] - running_mean[c] * invstd * gamma[c]);
    for (int n = 0; n < s.n; ++n) {
      const int64_t off = (static_cast<int64_t>(n) * s.c + c) * s.hw;
      for (int i = 0; i < s.hw; ++i) y[off + i] = x[off + i] * a + bias;
    }
  }
}

static void batchnorm_backward_whole(const BatchNormShape& s, const float* x, const float* dy,
                                     const float* gamma, const float* save_mean, const float* save_invstd,
                                     float* dx, float* dgamma, float* dbeta) {
  const double m = static_cast<double>(s.n) * s.hw;
#pragma omp parallel for schedule(static)
  for (int c = 0; c < s.c; ++c) {
    const float mean = save_mean[c], invstd = save_invstd[c];
    double sum_dy = 0.0, sum_dy_xc = 0.0;
    for (int n = 0; n < s.n; ++n) {
      const int64_t off = (static_cast<int64_t>(n) * s.c + c) * s.hw;
      const float* dp = dy + off;
      const float* xp = x + off;
      sum_dy += plane_sum(s.hw, [dp](int i) { return dp[i]; });
      sum_dy_xc += plane_sum(s.hw, [dp, xp, mean](int i) { return dp[i] * (xp[i] - mean); });
    }
    const double sum_dy_xhat = sum_dy_xc * invstd;
    // dx = k * (dy - mean(dy) - xhat * mean(dy*xhat)), k = gamma * invstd
    const float k = gamma[c] * invstd;
    const float mean_dy = static_cast<float>(sum_dy / m);
    const float proj = static_cast<float>(sum_dy_xhat / m * invstd);  // per unit of (x - mean)
    for (int n = 0; n < s.n; ++n) {
      const int64_t off = (static_cast<int64_t>(n) * s.c + c) * s.hw;
      for (int i = 0; i < s.hw; ++i)
        dx[off + i] = k * (dy[off + i] - mean_dy - (x[off + i] - mean) * proj);
    }
    dgamma[c] = static_cast<float>(sum_dy_xhat);
    dbeta[c] = static_cast<float>(sum_dy);
  }
}

void relu_forward(int64_t n, const float* x, float* y) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = relu(x[i]);
}

void relu_backward(int64_t n, const float* y, const float* dy, float* dx) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dx[i] = relu_grad(y[i], dy[i]);
}

#if defined(__x86_64__)
namespace {
// 16 windows at a time: the two input rows' even and odd columns split out by a
// permute, then the same comparisons in the same order as below, lane by lane (a later
// value wins when greater, ordered, or NaN), so the same values and argmax.
__attribute__((target("avx512f"))) void maxpool2x2_forward_avx512(const PoolShape& s, const float* x, float* y,
                                                                 int32_t* argmax, int nc) {
  const int h = s.h, w = s.w, oh_n = s.h / 2, ow_n = s.w / 2;
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int oh = 0; oh < oh_n; ++oh) {
    const int32_t base = (nc * h + 2 * oh) * w;
    const float* r0 = x + base;
    const float* r1 = r0 + w;
    float* yo = y + (static_cast<int64_t>(nc) * oh_n + oh) * ow_n;
    int32_t* ao = argmax + (static_cast<int64_t>(nc) * oh_n + oh) * ow_n;
    for (int ow0 = 0; ow0 < ow_n; ow0 += 16) {
      const int n = std::min(16, ow_n - ow0), cols = 2 * n;  // windows, input columns
      const __mmask16 lo = static_cast<__mmask16>(cols >= 16 ? 0xFFFF : (1u << cols) - 1);
      const __mmask16 hi = static_cast<__mmask16>(cols > 16 ? (1u << (cols - 16)) - 1 : 0);
      const float* p0 = r0 + 2 * ow0;
      const float* p1 = r1 + 2 * ow0;
      const __m512 l0 = _mm512_maskz_loadu_ps(lo, p0), h0 = _mm512_maskz_loadu_ps(hi, p0 + 16);
      const __m512 l1 = _mm512_maskz_loadu_ps(lo, p1), h1 = _mm512_maskz_loadu_ps(hi, p1 + 16);
      const __m512 a = _mm512_permutex2var_ps(l0, even, h0), b = _mm512_permutex2var_ps(l0, odd, h0);
      const __m512 c = _mm512_permutex2var_ps(l1, even, h1), d = _mm512_permutex2var_ps(l1, odd, h1);
      __m512 best = a;
      __m512i at = _mm512_setzero_si512();
      const __m512 values[3] = {b, c, d};
      const int offsets[3] = {1, w, w + 1};
      for (int i = 0; i < 3; ++i) {
        const __m512 v = values[i];
        const __mmask16 wins = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        best = _mm512_mask_mov_ps(best, wins, v);
        at = _mm512_mask_mov_epi32(at, wins, _mm512_set1_epi32(offsets[i]));
      }
      const __mmask16 out = static_cast<__mmask16>(n >= 16 ? 0xFFFF : (1u << n) - 1);
      _mm512_mask_storeu_ps(yo + ow0, out, best);
      const __m512i first = _mm512_add_epi32(_mm512_set1_epi32(base + 2 * ow0), even);  // each window's (0,0)
      _mm512_mask_storeu_epi32(ao + ow0, out, _mm512_add_epi32(first, at));
    }
  }
}

// The backward's single pass 16 windows at a time: each window's four values (dy at its
// argmax, +0 elsewhere) interleaved back into the two input rows by a permute.
__attribute__((target("avx512f"))) void maxpool2x2_backward_avx512(const PoolShape& s, const float* dy,
                                                                  const int32_t* argmax, float* dx, int nc) {
  const int h = s.h, w = s.w, oh_n = h / 2, ow_n = w / 2;
  // Lane 2i of the low half and of the high half: window i (even column), 2i + 1: odd.
  const __m512i lo_idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi_idx = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const __m512i lane2 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512 zero = _mm512_setzero_ps();
  for (int oh = 0; oh < oh_n; ++oh) {
    const int32_t base = (nc * h + 2 * oh) * w;
    float* r0 = dx + base;
    float* r1 = r0 + w;
    const float* d = dy + (static_cast<int64_t>(nc) * oh_n + oh) * ow_n;
    const int32_t* a = argmax + (static_cast<int64_t>(nc) * oh_n + oh) * ow_n;
    for (int ow0 = 0; ow0 < ow_n; ow0 += 16) {
      const int n = std::min(16, ow_n - ow0), cols = 2 * n;
      const __mmask16 in = static_cast<__mmask16>(n >= 16 ? 0xFFFF : (1u << n) - 1);
      const __m512 v = _mm512_maskz_loadu_ps(in, d + ow0);
      const __m512i at = _mm512_sub_epi32(_mm512_maskz_loadu_epi32(in, a + ow0),
                                          _mm512_add_epi32(_mm512_set1_epi32(base + 2 * ow0), lane2));
      const __m512 v00 = _mm512_mask_mov_ps(zero, _mm512_cmpeq_epi32_mask(at, _mm512_setzero_si512()), v);
      const __m512 v01 = _mm512_mask_mov_ps(zero, _mm512_cmpeq_epi32_mask(at, _mm512_set1_epi32(1)), v);
      const __m512 v10 = _mm512_mask_mov_ps(zero, _mm512_cmpeq_epi32_mask(at, _mm512_set1_epi32(w)), v);
      const __m512 v11 = _mm512_mask_mov_ps(zero, _mm512_cmpeq_epi32_mask(at, _mm512_set1_epi32(w + 1)), v);
      const __mmask16 lo = static_cast<__mmask16>(cols >= 16 ? 0xFFFF : (1u << cols) - 1);
      const __mmask16 hi = static_cast<__mmask16>(cols > 16 ? (1u << (cols - 16)) - 1 : 0);
      _mm512_mask_storeu_ps(r0 + 2 * ow0, lo, _mm512_permutex2var_ps(v00, lo_idx, v01));
      _mm512_mask_storeu_ps(r0 + 2 * ow0 + 16, hi, _mm512_permutex2var_ps(v00, hi_idx, v01));
      _mm512_mask_storeu_ps(r1 + 2 * ow0, lo, _mm512_permutex2var_ps(v10, lo_idx, v11));
      _mm512_mask_storeu_ps(r1 + 2 * ow0 + 16, hi, _mm512_permutex2var_ps(v10, hi_idx, v11));
    }
  }
}

// The same two passes 8 windows at a time with AVX2: even and odd columns split by
// in-lane shuffles and a 64-bit permute; comparisons and choices as above.
__attribute__((target("avx2"))) inline __m256i first_lanes(int n) {  // lanes [0, n) all ones
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

__attribute__((target("avx2"))) void maxpool2x2_forward_avx2(const PoolShape& s, const float* x, float* y,
                                                             int32_t* argmax, int nc) {
  const int h = s.h, w = s.w, oh_n = s.h / 2, ow_n = s.w / 2;
  const __m256i lane2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  for (int oh = 0; oh < oh_n; ++oh) {
    const int32_t base = (nc * h + 2 * oh) * w;
    const float* r0 = x + base;
    const float* r1 = r0 + w;
    float* yo = y + (static_cast<int64_t>(nc) * oh_n + oh) * ow_n;
    int32_t* ao = argmax + (static_cast<int64_t>(nc) * oh_n + oh) * ow_n;
    for (int ow0 = 0; ow0 < ow_n; ow0 += 8) {
      const int n = std::min(8, ow_n - ow0), cols = 2 * n;
      const __m256i lo = first_lanes(std::min(8, cols)), hi = first_lanes(cols - 8);
      __m256 split[2][2];  // [row][even, odd]
      for (int row = 0; row < 2; ++row) {
        const float* p = (row ? r1 : r0) + 2 * ow0;
        const __m256 l = _mm256_maskload_ps(p, lo), u = _mm256_maskload_ps(p + 8, hi);
        // shuffle: lanes (0 2 8 10 | 4 6 12 14); the 64-bit permute puts them in order
        split[row][0] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(l, u, 0x88)), 0xD8));
        split[row][1] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(l, u, 0xDD)), 0xD8));
      }
      __m256 best = split[0][0];
      __m256 at = _mm256_setzero_ps();  // the offsets, as int32 bits
      const __m256 values[3] = {split[0][1], split[1][0], split[1][1]};
      const int offsets[3] = {1, w, w + 1};
      for (int i = 0; i < 3; ++i) {
        const __m256 v = values[i];
        const __m256 wins = _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        best = _mm256_blendv_ps(best, v, wins);
        at = _mm256_blendv_ps(at, _mm256_castsi256_ps(_mm256_set1_epi32(offsets[i])), wins);
      }
      const __m256i out = first_lanes(n);
      _mm256_maskstore_ps(yo + ow0, out, best);
      const __m256i first = _mm256_add_epi32(_mm256_set1_epi32(base + 2 * ow0), lane2);
      _mm256_maskstore_epi32(ao + ow0, out, _mm256_add_epi32(first, _mm256_castps_si256(at)));
    }
  }
}

__attribute__((target("avx2"))) void maxpool2x2_backward_avx2(const PoolShape& s, const float* dy,
                                                              const int32_t* argmax, float* dx, int nc) {
  const int h = s.h, w = s.w, oh_n = h / 2, ow_n = w / 2;
  const __m256i lane2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256 zero = _mm256_setzero_ps();
  for (int oh = 0; oh < oh_n; ++oh) {
    const int32_t base = (nc * h + 2 * oh) * w;
    float* r0 = dx + base;
    float* r1 = r0 + w;
    const float* d = dy + (static_cast<int64_t>(nc) * oh_n + oh) * ow_n;
    const int32_t* a = argmax + (static_cast<int64_t>(nc) * oh_n + oh) * ow_n;
    for (int ow0 = 0; ow0 < ow_n; ow0 += 8) {
      const int n = std::min(8, ow_n - ow0), cols = 2 * n;
      const __m256i in = first_lanes(n);
      const __m256 v = _mm256_maskload_ps(d + ow0, in);
      const __m256i at = _mm256_sub_epi32(_mm256_maskload_epi32(a + ow0, in),
                                          _mm256_add_epi32(_mm256_set1_epi32(base + 2 * ow0), lane2));
      const __m256i lo = first_lanes(std::min(8, cols)), hi = first_lanes(cols - 8);
      for (int row = 0; row < 2; ++row) {
        // dy where the window's argmax is this row's even (odd) column, +0 elsewhere
        const __m256 even = _mm256_blendv_ps(
            zero, v, _mm256_castsi256_ps(_mm256_cmpeq_epi32(at, _mm256_set1_epi32(row ? w : 0))));
        const __m256 odd = _mm256_blendv_ps(
            zero, v, _mm256_castsi256_ps(_mm256_cmpeq_epi32(at, _mm256_set1_epi32(row ? w + 1 : 1))));
        // interleave: unpacklo/hi give (e0 o0 e1 o1 | e4 o4 e5 o5) and (e2 o2 e3 o3 | e6 o6 e7 o7)
        const __m256 a0 = _mm256_unpacklo_ps(even, odd), a1 = _mm256_unpackhi_ps(even, odd);
        float* p = (row ? r1 : r0) + 2 * ow0;
        _mm256_maskstore_ps(p, lo, _mm256_permute2f128_ps(a0, a1, 0x20));
        _mm256_maskstore_ps(p + 8, hi, _mm256_permute2f128_ps(a0, a1, 0x31));
      }
    }
  }
}
}  // namespace
#endif

namespace {
// One plane (nc) of the pooling, in the loops every CPU runs. Forward: window order
// (0,0), (0,1), (1,0), (1,1); a later value wins when greater or NaN.
void maxpool2x2_forward_plane(const PoolShape& s, const float* x, float* y, int32_t* argmax, int nc) {
  const int h = s.h, w = s.w, oh_n = s.h / 2, ow_n = s.w / 2;
  for (int oh = 0; oh < oh_n; ++oh) {
    const int32_t base = (nc * h + 2 * oh) * w;
    const float* r0 = x + base;
    const float* r1 = r0 + w;
    float* yo = y + (static_cast<int64_t>(nc) * oh_n + oh) * ow_n;
    int32_t* ao = argmax + (static_cast<int64_t>(nc) * oh_n + oh) * ow_n;
    for (int ow = 0; ow < ow_n; ++ow) {
      const float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
      float best = a;
      int32_t at = 0;
      if (b > best || std::isnan(b)) best = b, at = 1;
      if (c > best || std::isnan(c)) best = c, at = w;
      if (d > best || std::isnan(d)) best = d, at = w + 1;
      yo[ow] = best;
      ao[ow] = base + 2 * ow + at;
    }
  }
}

// Backward: windows do not overlap, so each window's four inputs are written once, in
// order, with dy at the argmax and +0 elsewhere: the same floats as zeroing dx and
// scattering dy, in one pass.
void maxpool2x2_backward_plane(const PoolShape& s, const float* dy, const int32_t* argmax, float* dx, int nc) {
  const int h = s.h, w = s.w, oh_n = h / 2, ow_n = w / 2;
  for (int oh = 0; oh < oh_n; ++oh) {
    const int32_t base = (nc * h + 2 * oh) * w;
    float* r0 = dx + base;
    float* r1 = r0 + w;
    const float* d = dy + (static_cast<int64_t>(nc) * oh_n + oh) * ow_n;
    const int32_t* a = argmax + (static_cast<int64_t>(nc) * oh_n + oh) * ow_n;
    for (int ow = 0; ow < ow_n; ++ow) {
      const int32_t at = a[ow] - (base + 2 * ow);  // 0, 1, w or w + 1
      const float v = d[ow];
      r0[2 * ow] = at == 0 ? v : 0.0f;
      r0[2 * ow + 1] = at == 1 ? v : 0.0f;
      r1[2 * ow] = at == w ? v : 0.0f;
      r1[2 * ow + 1] = at == w + 1 ? v : 0.0f;
    }
  }
}

using PoolForwardPlane = void (*)(const PoolShape&, const float*, float*, int32_t*, int);
using PoolBackwardPlane = void (*)(const PoolShape&, const float*, const int32_t*, float*, int);

// The path's plane loops. They take one plane a call and the loop over planes stays in
// the callers below: clang's OpenMP outlined regions do not inherit a function's target
// attribute (the fuzz build).
PoolForwardPlane forward_plane_for(CpuKernels path) {
#if defined(__x86_64__)
  if (path == CpuKernels::Avx512) return maxpool2x2_forward_avx512;
  if (path == CpuKernels::Avx2) return maxpool2x2_forward_avx2;
#endif
  (void)path;
  return maxpool2x2_forward_plane;
}
PoolBackwardPlane backward_plane_for(CpuKernels path) {
#if defined(__x86_64__)
  if (path == CpuKernels::Avx512) return maxpool2x2_backward_avx512;
  if (path == CpuKernels::Avx2) return maxpool2x2_backward_avx2;
#endif
  (void)path;
  return maxpool2x2_backward_plane;
}
}  // namespace

void maxpool2x2_forward(const PoolShape& s, const float* x, float* y, int32_t* argmax) {
  static const PoolForwardPlane plane = forward_plane_for(cpu_kernels());
#pragma omp parallel for schedule(static)
  for (int nc = 0; nc < s.n * s.c; ++nc) plane(s, x, y, argmax, nc);
}

void maxpool2x2_backward(const PoolShape& s, const float* dy, const int32_t* argmax, float* dx) {
  static const PoolBackwardPlane plane = backward_plane_for(cpu_kernels());
  const int h = s.h, w = s.w;
#pragma omp parallel for schedule(static)
  for (int nc = 0; nc < s.n * s.c; ++nc) {
    plane(s, dy, argmax, dx, nc);
    // +0 in an odd last column or row, which no window reads
    float* p = dx + static_cast<int64_t>(nc) * h * w;
    if (w % 2)
      for (int ih = 0; ih < h / 2 * 2; ++ih) p[static_cast<int64_t>(ih) * w + w - 1] = 0.0f;
    if (h % 2) std::fill(p + static_cast<int64_t>(h - 1) * w, p + static_cast<int64_t>(h) * w, 0.0f);
  }
}

void dropout_forward(int64_t n, const float* x, float p, PhiloxStream stream, const uint64_t* counter,
                     uint64_t offset, float* y, uint8_t* keep) {
  const float scale = dropout_scale(p);
  offset += *counter;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const bool k = dropout_keep(stream, offset, static_cast<uint64_t>(i), p);
    keep[i] = k ? 1 : 0;
    y[i] = k ? x[i] * scale : 0.0f;
  }
}

void dropout_backward(int64_t n, const float* dy, const uint8_t* keep, float p, float* dx) {
  const float scale = dropout_scale(p);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dx[i] = keep[i] ? dy[i] * scale : 0.0f;
}

void round_to_float(int64_t n, const double* x, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i]);
}

void softmax(int n, int classes, const float* logits, float* probs) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; ++i)
    softmax_row(logits + static_cast<int64_t>(i) * classes, classes, probs + static_cast<int64_t>(i) * classes,
                [](double x) { return det::exp(x); });
}

void cross_entropy(int n, int batch_total, int classes, const float* logits, const int32_t* labels,
                   const float* grad_scale_at, const int64_t* first, float* dlogits, float* sample_loss,
                   float* sample_correct) {
  sample_loss += *first;
  sample_correct += *first;
  const float grad_scale = dlogits ? *grad_scale_at : 0.0f;
  // One exp per logit (the reference takes two: one for the sum, one for the softmax):
  // the exponentials are kept and the softmax is e_k / sum.
#pragma omp parallel
  {
    std::vector<double> e(static_cast<std::size_t>(classes));
#pragma omp for schedule(static)
    for (int i = 0; i < n; ++i) {
      const float* z = logits + static_cast<int64_t>(i) * classes;
      const int arg = argmax_first(z, classes);
      const double zmax = z[arg];
      double sum = 0.0;
      for (int k = 0; k < classes; ++k) {
        e[k] = det::exp(z[k] - zmax);
        sum += e[k];
      }
      const int label = labels[i];
      sample_loss[i] = static_cast<float>(zmax + det::log(sum) - z[label]);
      sample_correct[i] = arg == label ? 1.0f : 0.0f;
      if (!dlogits) continue;
      const double inv_sum = 1.0 / sum;
      float* d = dlogits + static_cast<int64_t>(i) * classes;
      for (int k = 0; k < classes; ++k)
        d[k] = static_cast<float>((e[k] * inv_sum - (k == label ? 1.0 : 0.0)) * grad_scale / batch_total);
    }
  }
}

double reduce_sum(int64_t n, const float* x) {
  // Eight independent double accumulators (no serial dependency chain; the compiler
  // vectorises them), combined in a fixed order: the same bits on every call and for
  // any thread count.
  constexpr int kAcc = 8;
  double acc[kAcc] = {};
  int64_t i = 0;
  for (; i + kAcc <= n; i += kAcc)
    for (int j = 0; j < kAcc; ++j) acc[j] += x[i + j];
  double tail = 0.0;
  for (; i < n; ++i) tail += x[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

void gather_batch(int n, int pixels, const uint8_t* images, const uint8_t* labels,
                  const int32_t* indices, const int64_t* first, float mean, float std, float* out,
                  int32_t* labels_out) {
  indices += *first;
  // A byte has 256 values: normalise each once (with the shared per-element function,
  // so the bits equal the reference's) and gather by table lookup.
  const float inv_std = 1.0f / std;
  float table[256];
  for (int b = 0; b < 256; ++b) table[b] = normalize_pixel(static_cast<uint8_t>(b), mean, inv_std);
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; ++i) {
    const uint8_t* img = images + static_cast<int64_t>(indices[i]) * pixels;
    float* o = out + static_cast<int64_t>(i) * pixels;
    for (int p = 0; p < pixels; ++p) o[p] = table[img[p]];
    labels_out[i] = labels[indices[i]];
  }
}

namespace {

#if defined(__x86_64__)
// digest_floats eight words at a time: the keys go up by 8 * kDigestIndexMultiplier per
// vector; the even and odd lanes' 64-bit products go to two accumulators. A sum of the
// same terms, so the same digest (tests/ops: against the reference).
__attribute__((target("avx2"))) uint64_t digest_floats_avx2(const float* x, int64_t n, uint64_t first) {
  const uint32_t* w = reinterpret_cast<const uint32_t*>(x);
  const uint32_t k0 = digest_key(first), m = kDigestIndexMultiplier;
  __m256i key = _mm256_setr_epi32(static_cast<int>(k0), static_cast<int>(k0 + m), static_cast<int>(k0 + 2 * m),
                                  static_cast<int>(k0 + 3 * m), static_cast<int>(k0 + 4 * m),
                                  static_cast<int>(k0 + 5 * m), static_cast<int>(k0 + 6 * m),
                                  static_cast<int>(k0 + 7 * m));
  const __m256i step = _mm256_set1_epi32(static_cast<int>(8 * m)), one = _mm256_set1_epi32(1);
  __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i a = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i)), key);
    const __m256i b = _mm256_or_si256(a, one);
    even = _mm256_add_epi64(even, _mm256_mul_epu32(a, b));
    odd = _mm256_add_epi64(odd, _mm256_mul_epu32(_mm256_srli_epi64(a, 32), _mm256_srli_epi64(b, 32)));
    key = _mm256_add_epi32(key, step);
  }
  alignas(32) uint64_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), even);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes + 4), odd);
  uint64_t sum = 0;
  for (const uint64_t l : lanes) sum += l;
  return sum + kernels::digest_words(w + i, n - i, first + static_cast<uint64_t>(i));
}
#endif

uint64_t digest_floats_fast(const float* x, int64_t n, uint64_t first, bool avx2) {
#if defined(__x86_64__)
  if (avx2) return digest_floats_avx2(x, n, first);
#endif
  (void)avx2;
  return digest_floats(x, n, first);
}

}  // namespace

void adam_update(int64_t n, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                 const AdamHyper& h, const AdamStepFactors* factors, const int32_t* skip, int64_t index_first,
                 uint64_t* digests) {
  const bool update = !(skip && *skip);
  const AdamStepFactors f = *factors;
  if (!digests) {
    if (!update) return;
#pragma omp parallel for schedule(static) if (n > 4096)
    for (int64_t i = 0; i < n; ++i) adam_element(param[i], grad[i], exp_avg[i], exp_avg_sq[i], h, f);
    return;
  }
  // The digests where the data already is: each block is hashed right after its update,
  // while it is in L1. The sums are exact (integers), so the blocks' threads and order
  // do not change them.
  constexpr int64_t kBlock = 2048;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  uint64_t dp = 0, dm = 0, dv = 0;
  static const bool avx2 = cpu_kernels() != CpuKernels::Portable;
#pragma omp parallel for schedule(static) reduction(+ : dp, dm, dv) if (n > 4096)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t lo = blk * kBlock, len = std::min(kBlock, n - lo);
    if (update)
      for (int64_t i = lo; i < lo + len; ++i) adam_element(param[i], grad[i], exp_avg[i], exp_avg_sq[i], h, f);
    const uint64_t at = static_cast<uint64_t>(index_first + lo);
    dp += digest_floats_fast(param + lo, len, at, avx2);
    dm += digest_floats_fast(exp_avg + lo, len, at, avx2);
    dv += digest_floats_fast(exp_avg_sq + lo, len, at, avx2);
  }
  digests[0] += dp;
  digests[1] += dm;
  digests[2] += dv;
}

void digest_words(int64_t n, const uint32_t* words, int64_t index_first, uint64_t* sum) {
  static const bool avx2 = cpu_kernels() != CpuKernels::Portable;
  constexpr int64_t kBlock = 16384;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  uint64_t total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (n > 4 * kBlock)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t lo = blk * kBlock;
    total += digest_floats_fast(reinterpret_cast<const float*>(words + lo), std::min(kBlock, n - lo),
                                static_cast<uint64_t>(index_first + lo), avx2);
  }
  *sum += total;
}

void step_digest_finish(int n_sums, uint64_t* sums, int n_ranges, const DigestRange* ranges, const float* loss,
                        const int64_t* loss_first, int loss_count, uint64_t* ring, int64_t* next, int capacity) {
  static const bool avx2 = cpu_kernels() != CpuKernels::Portable;
  uint64_t* row = ring + (*next % capacity) * (n_sums + n_ranges + 1);
  for (int i = 0; i < n_sums; ++i) {
    row[i] = sums[i];
    sums[i] = 0;
  }
  for (int r = 0; r < n_ranges; ++r) row[n_sums + r] = digest_floats_fast(ranges[r].data, ranges[r].n, 0, avx2);
  row[n_sums + n_ranges] =
      digest_floats_fast(loss + *loss_first, loss_count, static_cast<uint64_t>(*loss_first), avx2);
  ++*next;
}

void adam_prepare_step(int count, const double* lr, AdamFactorInputs in, const int32_t* skip, int64_t* steps,
                       AdamStepFactors* out) {
  if (*skip) return;
  for (int i = 0; i < count; ++i) out[i] = adam_factors_at(*lr, in, ++steps[i]);
}

void loss_scale_update(LossScaleState* state, LossScaleRule rule) { loss_scale_update_rule(*state, rule); }

void unscale_check(int64_t n, float* grad, const float* inv_scale_at, int32_t* found_inf) {
  const float inv_scale = *inv_scale_at;
  int32_t found = 0;
#pragma omp parallel for schedule(static) reduction(| : found) if (n > 4096)
  for (int64_t i = 0; i < n; ++i)
    if (unscale_element(grad[i], inv_scale)) found = 1;
  if (found) *found_inf = 1;
}

// ---- batch norm by chunks: per (channel, chunk) sums in the order of the unchunked
// op (samples in sequence, 16-lane plane sums), then the fixed tree over the chunks.
// The per-channel helpers serve both the separate steps (data-parallel: sums exchanged
// in between) and the fused one-process ops, so the two give the same bits.

namespace {

const float* bn_plane(const BatchNormShape& s, const float* t, int n, int c) {
  return t + (static_cast<int64_t>(n) * s.c + c) * s.hw;
}

// One plane's terms, shared by the channel-at-a-time ops (the data-parallel steps) and
// the image-at-a-time fused ones, so the two give the same bits.
double bn_plane_sum(int hw, const float* xp) {
  return plane_sum(hw, [xp](int i) { return xp[i]; });
}
double bn_plane_centered_sq(int hw, const float* xp, float mean) {
  return plane_sum(hw, [xp, mean](int i) {
    const float d = xp[i] - mean;
    return d * d;
  });
}
void bn_plane_scale_shift(int hw, const float* x, float a, float b, float* y) {
  for (int i = 0; i < hw; ++i) y[i] = x[i] * a + b;
}
double bn_plane_dy_xc(int hw, const float* dp, const float* xp, float mean) {
  return plane_sum(hw, [dp, xp, mean](int i) { return dp[i] * (xp[i] - mean); });
}

double bn_channel_sum(const BatchNormShape& s, int chunks, const int* bounds, const float* x, int c) {
  double part[kTreeChunks] = {};  // zeroed: GCC cannot tell that chunks <= kTreeChunks
  for (int k = 0; k < chunks; ++k) {
    double sum = 0.0;
    for (int n = bounds[k]; n < bounds[k + 1]; ++n) {
      sum += bn_plane_sum(s.hw, bn_plane(s, x, n, c));
    }
    part[k] = sum;
  }
  return tree_sum(part, chunks);
}

double bn_channel_centered_sq(const BatchNormShape& s, int chunks, const int* bounds, const float* x, int c,
                              float mean) {
  double part[kTreeChunks] = {};
  for (int k = 0; k < chunks; ++k) {
    double sq = 0.0;
    for (int n = bounds[k]; n < bounds[k + 1]; ++n) {
      sq += bn_plane_centered_sq(s.hw, bn_plane(s, x, n, c), mean);
    }
    part[k] = sq;
  }
  return tree_sum(part, chunks);
}

void bn_channel_scale_shift(const BatchNormShape& s, const float* x, int c, float a, float b, float* y) {
  for (int n = 0; n < s.n; ++n) {
    const int64_t off = (static_cast<int64_t>(n) * s.c + c) * s.hw;
    bn_plane_scale_shift(s.hw, x + off, a, b, y + off);
  }
}

// dx of one plane (BnBackwardFactors: dx = k * (dy - mean_dy - (x - mean) * proj)).
void bn_plane_backward_apply(int hw, const float* x, const float* dy, float mean, float k, float mean_dy, float proj,
                             float* dx) {
  for (int i = 0; i < hw; ++i) dx[i] = k * (dy[i] - mean_dy - (x[i] - mean) * proj);
}

// The backward's two sums of channels [c_begin, c_end), per (chunk, channel), then the
// tree over the chunks: sum_dy[c], sum_dy_xc[c]. Image by image, an image's channels
// (one contiguous stretch) before the next, the chunks in parallel: a channel at a time
// read its planes (3 KB, 0.8 KB) one image apart from beyond L2. Each (chunk, channel)
// sum still takes its images in order, each plane's 16-lane sum added from +0.
void bn_backward_sums(const BatchNormShape& s, int chunks, const int* bounds, const float* x, const float* dy,
                      const float* mean, double* sum_dy, double* sum_dy_xc) {
  const int c0 = s.c_begin, c1 = s.channel_end(), width = c1 - c0;
  if (width <= 0) return;
  std::vector<double> parts(static_cast<std::size_t>(2) * chunks * width, 0.0);  // [chunk][c]: dy, then dy * (x - mean)
  double* p_dy = parts.data();
  double* p_xc = parts.data() + static_cast<std::size_t>(chunks) * width;
#pragma omp parallel for schedule(static)
  for (int k = 0; k < chunks; ++k)
    for (int n = bounds[k]; n < bounds[k + 1]; ++n)
      for (int c = c0; c < c1; ++c) {
        const float* dp = bn_plane(s, dy, n, c);
        p_dy[k * width + c - c0] += bn_plane_sum(s.hw, dp);
        p_xc[k * width + c - c0] += bn_plane_dy_xc(s.hw, dp, bn_plane(s, x, n, c), mean[c]);
      }
  for (int c = c0; c < c1; ++c) {
    sum_dy[c] = tree_sum(p_dy + c - c0, chunks, width);
    sum_dy_xc[c] = tree_sum(p_xc + c - c0, chunks, width);
  }
}

// dx of channels [c_begin, c_end), image by image (images in parallel).
void bn_backward_apply(const BatchNormShape& s, const float* x, const float* dy, const float* mean, const float* k,
                       const float* mean_dy, const float* proj, float* dx) {
  const int c0 = s.c_begin, c1 = s.channel_end();
#pragma omp parallel for schedule(static)
  for (int n = 0; n < s.n; ++n)
    for (int c = c0; c < c1; ++c) {
      const int64_t off = (static_cast<int64_t>(n) * s.c + c) * s.hw;
      bn_plane_backward_apply(s.hw, x + off, dy + off, mean[c], k[c], mean_dy[c], proj[c], dx + off);
    }
}

}  // namespace

int batchnorm_channel_group(const BatchNormShape& s, int tensors) {
  // Measured on a 2-MiB-L2 Xeon: conv1's statistics of a 2-rank step (200 KB of x per
  // channel) ran as fast as the fused one-process op in groups of 2 channels and a third
  // slower from 3 on. No thread count enters: every rank must choose the same groups.
  constexpr int64_t kGroupBytes = int64_t{1} << 19;
  const int64_t per_channel = std::max<int64_t>(1, int64_t{4} * s.n * s.hw * std::max(1, tensors));
  const int64_t group = std::max<int64_t>(1, kGroupBytes / per_channel);
  return static_cast<int>(std::min<int64_t>(std::max(1, s.c), group));
}

void batchnorm_chunk_sums(const BatchNormShape& s, int chunks, const int* bounds, const float* x,
                          double* sum_tree) {
#pragma omp parallel for schedule(static)
  for (int c = s.c_begin; c < s.channel_end(); ++c) sum_tree[c] = bn_channel_sum(s, chunks, bounds, x, c);
}

void batchnorm_chunk_centered_squares(const BatchNormShape& s, int chunks, const int* bounds,
                                      const float* x, const float* mean, double* sq_tree) {
#pragma omp parallel for schedule(static)
  for (int c = s.c_begin; c < s.channel_end(); ++c) sq_tree[c] = bn_channel_centered_sq(s, chunks, bounds, x, c, mean[c]);
}

void batchnorm_scale_shift(const BatchNormShape& s, const float* x, const float* scale,
                           const float* shift, float* y) {
#pragma omp parallel for schedule(static)
  for (int c = s.c_begin; c < s.channel_end(); ++c) bn_channel_scale_shift(s, x, c, scale[c], shift[c], y);
}

void batchnorm_backward_chunk_sums(const BatchNormShape& s, int chunks, const int* bounds,
                                   const float* x, const float* dy, const float* mean,
                                   double* sum_dy_tree, double* sum_dy_xc_tree) {
  bn_backward_sums(s, chunks, bounds, x, dy, mean, sum_dy_tree, sum_dy_xc_tree);
}

void batchnorm_backward_apply(const BatchNormShape& s, const float* x, const float* dy,
                              const float* mean, const float* k, const float* mean_dy,
                              const float* proj, float* dx) {
  bn_backward_apply(s, x, dy, mean, k, mean_dy, proj, dx);
}

// By chunks: the steps above fused per channel (one pass over memory per channel), with
// kernels/batchnorm_math.h between them: the same bits as the steps with nothing exchanged.
static void batchnorm_forward_train_by_chunks(const BatchNormShape& s, int chunks, const int* bounds,
                                              const float* x, const float* gamma, const float* beta, float eps,
                                              float momentum, float* running_mean, float* running_var,
                                              float* save_mean, float* save_invstd, float* y) {
  // A channel at a time (its three passes, the last two from L2): image by image, as the
  // backward runs, took bn1's forward from 0.85 to 1.00 ms (bn2's from 0.52 to 0.49).
  const double m = static_cast<double>(s.n) * s.hw;
#pragma omp parallel for schedule(static)
  for (int c = 0; c < s.c; ++c) {
    const double sum = bn_channel_sum(s, chunks, bounds, x, c);
    const float mean_f = static_cast<float>(bn_mean(sum, m));
    const double sq = bn_channel_centered_sq(s, chunks, bounds, x, c, mean_f);
    const BnForwardFactors f =
        bn_forward_finish(sum, sq, m, gamma[c], beta[c], eps, momentum, running_mean[c], running_var[c]);
    save_mean[c] = f.save_mean;
    save_invstd[c] = f.save_invstd;
    bn_channel_scale_shift(s, x, c, f.scale, f.shift, y);
  }
}

static void batchnorm_backward_by_chunks(const BatchNormShape& s, int chunks, const int* bounds, const float* x,
                                         const float* dy, const float* gamma, const float* save_mean,
                                         const float* save_invstd, float* dx, float* dgamma, float* dbeta) {
  // The data-parallel steps' sums and dx with nothing exchanged in between: the same bits.
  // Image by image (kernel_bench, 2 threads: bn1's backward 1.41-1.44 -> 1.27-1.29 ms,
  // bn2's 0.72-0.74 -> 0.59-0.62, against a channel at a time).
  const double m = static_cast<double>(s.n) * s.hw;
  BatchNormShape all = s;
  all.c_begin = 0;
  all.c_end = -1;
  std::vector<double> sum_dy(static_cast<std::size_t>(s.c)), sum_dy_xc(static_cast<std::size_t>(s.c));
  bn_backward_sums(all, chunks, bounds, x, dy, save_mean, sum_dy.data(), sum_dy_xc.data());
  std::vector<float> k(static_cast<std::size_t>(s.c)), mean_dy(k.size()), proj(k.size());
  for (int c = 0; c < s.c; ++c) {
    const BnBackwardFactors f = bn_backward_finish(sum_dy[c], sum_dy_xc[c], m, gamma[c], save_invstd[c]);
    k[c] = f.k;
    mean_dy[c] = f.mean_dy;
    proj[c] = f.proj;
    dgamma[c] = f.dgamma;
    dbeta[c] = f.dbeta;
  }
  bn_backward_apply(all, x, dy, save_mean, k.data(), mean_dy.data(), proj.data(), dx);
}

void batchnorm_forward_train(const BatchNormShape& s, BatchSplit split, const float* x, const float* gamma,
                             const float* beta, float eps, float momentum, float* running_mean,
                             float* running_var, float* save_mean, float* save_invstd, float* y) {
  if (split.whole())
    return batchnorm_forward_train_whole(s, x, gamma, beta, eps, momentum, running_mean, running_var, save_mean,
                                         save_invstd, y);
  batchnorm_forward_train_by_chunks(s, split.chunks, split.bounds, x, gamma, beta, eps, momentum, running_mean,
                                    running_var, save_mean, save_invstd, y);
}

void batchnorm_backward(const BatchNormShape& s, BatchSplit split, const float* x, const float* dy,
                        const float* gamma, const float* save_mean, const float* save_invstd, float* dx,
                        float* dgamma, float* dbeta) {
  if (split.whole()) return batchnorm_backward_whole(s, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
  batchnorm_backward_by_chunks(s, split.chunks, split.bounds, x, dy, gamma, save_mean, save_invstd, dx, dgamma,
                               dbeta);
}

}  // namespace engine::kernels::cpu
