// fp16 rounding (kernels/fp16_math.h) against numpy's float32 -> float16 conversion
// (tests/data/f16_golden.inc, from tools/f16_golden.py), and the fp16 reference ops
// (kernels/ref/mixed_precision.cpp) on cases worked out by hand: what CI can check of
// the mixed-precision math without a GPU. A GPU run checks the CUDA ops against this
// reference (tests/ops/cases_reduced_precision.cpp).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <ios>
#include <limits>
#include <vector>

#include "kernels/fp16_math.h"
#include "kernels/op_table.h"
#include "kernels/ops.h"
#include "support/error_text.h"

using namespace engine::kernels;

namespace {
struct Golden {
  uint32_t f32;
  uint16_t f16;
};
const Golden kGolden[] = {
#include "data/f16_golden.inc"
};
}  // namespace

TEST_CASE("fp16 rounding equals numpy's: ties to even, overflow to inf, subnormals") {
  int checked = 0;
  for (const Golden& g : kGolden) {
    CAPTURE(g.f32);
    const float f = f32_from_bits(g.f32);
    const uint16_t h = f16_bits_from_f32(f);
    if (std::isnan(f)) {
      CHECK((h & 0x7c00u) == 0x7c00u);
      CHECK((h & 0x03ffu) != 0);
      CHECK(std::isnan(round_to_f16(f)));
    } else {
      CHECK(h == g.f16);
    }
    ++checked;
  }
  CHECK(checked > 5000);
}

TEST_CASE("every fp16 value widens exactly and rounds back to itself") {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = f32_from_f16_bits(static_cast<uint16_t>(h));
    const bool nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
    if (nan) {
      CHECK(std::isnan(f));
      continue;
    }
    if (f16_bits_from_f32(f) != h) FAIL_CHECK("fp16 0x" << std::hex << h << " does not round back");
  }
  CHECK(f32_from_f16_bits(0x3c00u) == 1.0f);
  CHECK(f32_from_f16_bits(0x7bffu) == 65504.0f);
  CHECK(f32_from_f16_bits(0x0001u) == std::ldexp(1.0f, -24));
  CHECK(f32_from_f16_bits(0xfc00u) == -std::numeric_limits<float>::infinity());
}

TEST_CASE("fp16 linear: operands rounded, the product summed exactly, no result rounding") {
  const LinearShape s{1, 1, 1};
  float y = 0.0f;
  const float one = 1.0f;
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties to even gives 1.
  const float halfway = 1.0f + std::ldexp(1.0f, -11);
  ref::linear_forward(s, engine::Precision::Fp16, BatchSplit{}, &halfway, &one, nullptr, &y);
  CHECK(y == 1.0f);
  // 1 + 3 * 2^-11 lies halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
  const float halfway_up = 1.0f + 3.0f * std::ldexp(1.0f, -11);
  ref::linear_forward(s, engine::Precision::Fp16, BatchSplit{}, &halfway_up, &one, nullptr, &y);
  CHECK(y == 1.0f + std::ldexp(1.0f, -9));
  // The fp32 op keeps the operand.
  ref::linear_forward(s, engine::Precision::Fp32, BatchSplit{}, &halfway, &one, nullptr, &y);
  CHECK(y == halfway);

  // 2049 ones: 2049 is exact in fp32, and linear's result is not rounded to fp16.
  const LinearShape wide{1, 2049, 1};
  const std::vector<float> ones(2049, 1.0f);
  ref::linear_forward(wide, engine::Precision::Fp16, BatchSplit{}, ones.data(), ones.data(), nullptr, &y);
  CHECK(y == 2049.0f);
  // The bias is added in fp32, after the product.
  const float bias = 0.25f;
  ref::linear_forward(wide, engine::Precision::Fp16, BatchSplit{}, ones.data(), ones.data(), &bias, &y);
  CHECK(y == 2049.25f);
}

TEST_CASE("fp16 conv: the result rounded to fp16 before the fp32 bias") {
  // 2049 input channels of one pixel, a 1x1 kernel of ones: the sum 2049 rounds to 2048
  // in fp16 (spacing 2 there, ties to even), then the bias 0.5 is added in fp32.
  const ConvShape s{1, 2049, 1, 1, 1, 1, 1, 0};
  const std::vector<float> ones(2049, 1.0f);
  float y = 0.0f;
  ref::conv2d_forward(s, engine::Precision::Fp16, BatchSplit{}, ones.data(), ones.data(), nullptr, &y);
  CHECK(y == 2048.0f);
  const float bias = 0.5f;
  ref::conv2d_forward(s, engine::Precision::Fp16, BatchSplit{}, ones.data(), ones.data(), &bias, &y);
  CHECK(y == 2048.5f);
  ref::conv2d_forward(s, engine::Precision::Fp32, BatchSplit{}, ones.data(), ones.data(), &bias, &y);
  CHECK(y == 2049.5f);

  // Backward: dx and dw rounded to fp16 too; db from the fp32 dy.
  const float dy = 1.0f + std::ldexp(1.0f, -11);  // rounds to 1 as an operand
  std::vector<float> dx(2049), dw(2049);
  float db = 0.0f;
  ref::conv2d_backward(s, engine::Precision::Fp16, ones.data(), ones.data(), &dy, dx.data(), dw.data(), &db);
  CHECK(dx[0] == 1.0f);
  CHECK(dw[2048] == 1.0f);
  CHECK(db == dy);
}

TEST_CASE("fp16: an operand beyond the range is inf, which the scaler finds in the gradients") {
  const LinearShape s{1, 1, 1};
  const float x = 1.0f, w = 1.0f, dy = 70000.0f;  // beyond 65504: inf as fp16
  float dx = 0.0f, dw = 0.0f, db = 0.0f;
  ref::linear_backward(s, engine::Precision::Fp16, &x, &w, &dy, &dx, &dw, &db);
  CHECK(std::isinf(dx));
  CHECK(std::isinf(dw));
  CHECK(db == 70000.0f);  // the bias gradient stays fp32
  CHECK(round_to_f16(65519.0f) == 65504.0f);
  CHECK(std::isinf(round_to_f16(65520.0f)));
}

TEST_CASE("the CPU does not run fp16: refused in one line before any kernel runs; the facade runs fp32 there") {
  const LinearShape s{1, 1, 1};
  const float x = 1.0f;
  float y = 0.0f;
  CHECK_FALSE(engine::kernels::supports_op(cpu_ops(), engine::kernels::OpId::linear_forward, engine::Precision::Fp16));
  CHECK(engine::kernels::supports_op(cpu_ops(), engine::kernels::OpId::linear_forward, engine::Precision::Fp32));
  CHECK(test_support::error_of([&] { cpu_ops().linear_forward(s, engine::Precision::Fp16, BatchSplit{}, &x, &x, nullptr, &y); }) ==
        "kernels: linear_forward in fp16 is not supported by the cpu backend");
  CHECK(y == 0.0f);
}
