// The reference of the mixed-precision (fp16) conv and linear ops: the CUDA ops' rounding
// (kernels/cuda/mixed_precision.cpp) spelled out over the fp32 reference, so that CI
// checks their definition without a GPU and a GPU run checks the CUDA ops against it:
//  * x, w and dy rounded to fp16 (kernels/fp16_math.h), products summed exactly (double);
//  * conv2d: y, dx and dw rounded to fp16 (cuDNN's PSEUDO_HALF results are fp16), then
//    widened; linear: y, dx and dw are the fp32 sums (cuBLAS writes fp32);
//  * the bias added in fp32 after that rounding; the bias gradient summed from the
//    fp32 dy, as in the fp32 ops.
// A value beyond the fp16 range becomes inf when rounded, operand or result.
#include <vector>

#include "kernels/fp16_math.h"
#include "kernels/ops.h"

namespace engine::kernels::ref {
namespace {

int64_t conv_x(const ConvShape& s) { return static_cast<int64_t>(s.n) * s.c * s.h * s.w; }
int64_t conv_w(const ConvShape& s) { return static_cast<int64_t>(s.k) * s.c * s.r * s.s; }
int64_t conv_y(const ConvShape& s) { return static_cast<int64_t>(s.n) * s.k * s.out_h() * s.out_w(); }

std::vector<float> rounded(const float* v, int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = round_to_f16(v[i]);
  return out;
}
void round_in_place(float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) v[i] = round_to_f16(v[i]);
}
// y[n, k, hw] += b[k], in fp32.
void add_bias(int n, int k, int64_t hw, const float* b, float* y) {
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < k; ++c)
      for (int64_t p = 0; p < hw; ++p) y[(static_cast<int64_t>(i) * k + c) * hw + p] += b[c];
}

}  // namespace

void conv2d_forward_f16(const ConvShape& s, const float* x, const float* w, const float* b, float* y) {
  const std::vector<float> x16 = rounded(x, conv_x(s)), w16 = rounded(w, conv_w(s));
  conv2d_forward(s, x16.data(), w16.data(), nullptr, y);
  round_in_place(y, conv_y(s));
  if (b) add_bias(s.n, s.k, static_cast<int64_t>(s.out_h()) * s.out_w(), b, y);
}

void conv2d_backward_f16(const ConvShape& s, const float* x, const float* w, const float* dy, float* dx,
                         float* dw, float* db) {
  const std::vector<float> x16 = rounded(x, conv_x(s)), w16 = rounded(w, conv_w(s)), dy16 = rounded(dy, conv_y(s));
  std::vector<float> dw_unused;
  if (!dw) dw_unused.resize(static_cast<std::size_t>(conv_w(s)));
  float* dw_out = dw ? dw : dw_unused.data();
  conv2d_backward(s, x16.data(), w16.data(), dy16.data(), dx, dw_out, nullptr);
  if (dx) round_in_place(dx, conv_x(s));
  round_in_place(dw_out, conv_w(s));
  if (db) {  // from the fp32 dy
    std::vector<float> dw_fp32(static_cast<std::size_t>(conv_w(s)));
    conv2d_backward(s, x, w, dy, nullptr, dw_fp32.data(), db);
  }
}

void linear_forward_f16(const LinearShape& s, const float* x, const float* w, const float* b, float* y) {
  const std::vector<float> x16 = rounded(x, static_cast<int64_t>(s.n) * s.in),
                           w16 = rounded(w, static_cast<int64_t>(s.out) * s.in);
  linear_forward(s, x16.data(), w16.data(), nullptr, y);
  if (b) add_bias(s.n, s.out, 1, b, y);
}

void linear_backward_f16(const LinearShape& s, const float* x, const float* w, const float* dy, float* dx,
                         float* dw, float* db) {
  const std::vector<float> x16 = rounded(x, static_cast<int64_t>(s.n) * s.in),
                           w16 = rounded(w, static_cast<int64_t>(s.out) * s.in),
                           dy16 = rounded(dy, static_cast<int64_t>(s.n) * s.out);
  std::vector<float> dw_unused;
  if (!dw) dw_unused.resize(static_cast<std::size_t>(s.out) * s.in);
  linear_backward(s, x16.data(), w16.data(), dy16.data(), dx, dw ? dw : dw_unused.data(), nullptr);
  if (db) {  // from the fp32 dy
    std::vector<float> dw_fp32(static_cast<std::size_t>(s.out) * s.in);
    linear_backward(s, x, w, dy, nullptr, dw_fp32.data(), db);
  }
}

}  // namespace engine::kernels::ref
