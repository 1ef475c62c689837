// The reference's conv and linear ops in every precision (op_list.inc's AnyPrecision
// ops): fp32 is kernels/ref/reference.cpp's; fp16 and bf16 are the CUDA ops'
// rounding (kernels/cuda/mixed_precision.cpp) spelled out over the fp32 reference, so that
// CI checks their definition without a GPU and a GPU run checks the CUDA ops against it.
// The two formats round at the same points, each with its own rounding:
//  * x, w and dy rounded to the format (kernels/fp16_math.h, kernels/bf16_math.h),
//    products summed exactly (double);
//  * conv2d: y, dx and dw rounded to the format (cuDNN's PSEUDO_HALF and PSEUDO_BFLOAT16
//    results are in the tensors' type), then widened; linear: y, dx and dw are the fp32
//    sums (cuBLAS writes fp32);
//  * the bias added in fp32 after that rounding; the bias gradient summed from the
//    fp32 dy, as in the fp32 ops.
// A value beyond the format's range becomes inf when rounded, operand or result (for
// bf16, whose range is fp32's, only what rounds past its largest finite value).
#include <vector>

#include "kernels/bf16_math.h"
#include "kernels/fp16_math.h"
#include "kernels/op_table.h"
#include "kernels/ops.h"
#include "kernels/ref/reference_fp32.h"

namespace engine::kernels::ref {
namespace {

using Round = float (*)(float);

int64_t conv_x(const ConvShape& s) { return static_cast<int64_t>(s.n) * s.c * s.h * s.w; }
int64_t conv_w(const ConvShape& s) { return static_cast<int64_t>(s.k) * s.c * s.r * s.s; }
int64_t conv_y(const ConvShape& s) { return static_cast<int64_t>(s.n) * s.k * s.out_h() * s.out_w(); }

std::vector<float> rounded(Round round, const float* v, int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = round(v[i]);
  return out;
}
void round_in_place(Round round, float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) v[i] = round(v[i]);
}
// y[n, k, hw] += b[k], in fp32.
void add_bias(int n, int k, int64_t hw, const float* b, float* y) {
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < k; ++c)
      for (int64_t p = 0; p < hw; ++p) y[(static_cast<int64_t>(i) * k + c) * hw + p] += b[c];
}

void conv_forward_rounded(Round round, const ConvShape& s, const float* x, const float* w, const float* b,
                          float* y) {
  const std::vector<float> xr = rounded(round, x, conv_x(s)), wr = rounded(round, w, conv_w(s));
  conv2d_forward_fp32(s, xr.data(), wr.data(), nullptr, y);
  round_in_place(round, y, conv_y(s));
  if (b) add_bias(s.n, s.k, static_cast<int64_t>(s.out_h()) * s.out_w(), b, y);
}

void conv_backward_rounded(Round round, const ConvShape& s, const float* x, const float* w, const float* dy,
                           float* dx, float* dw, float* db) {
  const std::vector<float> xr = rounded(round, x, conv_x(s)), wr = rounded(round, w, conv_w(s)),
                           dyr = rounded(round, dy, conv_y(s));
  std::vector<float> dw_unused;
  if (!dw) dw_unused.resize(static_cast<std::size_t>(conv_w(s)));
  float* dw_out = dw ? dw : dw_unused.data();
  conv2d_backward_fp32(s, xr.data(), wr.data(), dyr.data(), dx, dw_out, nullptr);
  if (dx) round_in_place(round, dx, conv_x(s));
  round_in_place(round, dw_out, conv_w(s));
  if (db) {  // from the fp32 dy
    std::vector<float> dw_fp32(static_cast<std::size_t>(conv_w(s)));
    conv2d_backward_fp32(s, x, w, dy, nullptr, dw_fp32.data(), db);
  }
}

void linear_forward_rounded(Round round, const LinearShape& s, const float* x, const float* w, const float* b,
                            float* y) {
  const std::vector<float> xr = rounded(round, x, static_cast<int64_t>(s.n) * s.in),
                           wr = rounded(round, w, static_cast<int64_t>(s.out) * s.in);
  linear_forward_fp32(s, xr.data(), wr.data(), nullptr, y);
  if (b) add_bias(s.n, s.out, 1, b, y);
}

void linear_backward_rounded(Round round, const LinearShape& s, const float* x, const float* w, const float* dy,
                             float* dx, float* dw, float* db) {
  const std::vector<float> xr = rounded(round, x, static_cast<int64_t>(s.n) * s.in),
                           wr = rounded(round, w, static_cast<int64_t>(s.out) * s.in),
                           dyr = rounded(round, dy, static_cast<int64_t>(s.n) * s.out);
  std::vector<float> dw_unused;
  if (!dw) dw_unused.resize(static_cast<std::size_t>(s.out) * s.in);
  linear_backward_fp32(s, xr.data(), wr.data(), dyr.data(), dx, dw ? dw : dw_unused.data(), nullptr);
  if (db) {  // from the fp32 dy
    std::vector<float> dw_fp32(static_cast<std::size_t>(s.out) * s.in);
    linear_backward_fp32(s, x, w, dy, nullptr, dw_fp32.data(), db);
  }
}

// The rounding of a 16-bit precision.
Round rounding_of(Precision p) { return p == Precision::Fp16 ? round_to_f16 : round_to_bf16; }

}  // namespace

// The forward ops' split does not matter: a sample's outputs come from it alone.
void conv2d_forward(const ConvShape& s, Precision p, BatchSplit, const float* x, const float* w, const float* b,
                    float* y) {
  if (p == Precision::Fp32) return conv2d_forward_fp32(s, x, w, b, y);
  conv_forward_rounded(rounding_of(p), s, x, w, b, y);
}
void conv2d_backward(const ConvShape& s, Precision p, const float* x, const float* w, const float* dy, float* dx,
                     float* dw, float* db) {
  if (p == Precision::Fp32) return conv2d_backward_fp32(s, x, w, dy, dx, dw, db);
  conv_backward_rounded(rounding_of(p), s, x, w, dy, dx, dw, db);
}
void linear_forward(const LinearShape& s, Precision p, BatchSplit, const float* x, const float* w, const float* b,
                    float* y) {
  if (p == Precision::Fp32) return linear_forward_fp32(s, x, w, b, y);
  linear_forward_rounded(rounding_of(p), s, x, w, b, y);
}
void linear_backward(const LinearShape& s, Precision p, const float* x, const float* w, const float* dy, float* dx,
                     float* dw, float* db) {
  if (p == Precision::Fp32) return linear_backward_fp32(s, x, w, dy, dx, dw, db);
  linear_backward_rounded(rounding_of(p), s, x, w, dy, dx, dw, db);
}

}  // namespace engine::kernels::ref
