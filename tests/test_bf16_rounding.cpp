// bf16 rounding (kernels/bf16_math.h) against PyTorch's float32 -> bfloat16 conversion
// (tests/data/bf16_golden.inc, from tools/bf16_golden.py), and the bf16 reference ops
// (kernels/ref/mixed_precision.cpp) on cases worked out by hand: what CI can check of
// the bf16 math without a GPU. tests/ops/cases_bf16.cpp holds the reference ops against
// the fp32 reference on every shape (on the CPU), and a GPU run checks the CUDA ops
// against the reference.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <ios>
#include <limits>
#include <vector>

#include "kernels/bf16_math.h"
#include "kernels/op_table.h"
#include "kernels/ops.h"
#include "support/error_text.h"

using namespace engine::kernels;

namespace {
struct Golden {
  uint32_t f32;
  uint16_t bf16;
};
const Golden kGolden[] = {
#include "data/bf16_golden.inc"
};
bool is_quiet_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x0040u) != 0; }
}  // namespace

TEST_CASE("bf16 rounding equals PyTorch's: ties to even, overflow to inf, subnormals, NaN quiet") {
  int checked = 0;
  for (const Golden& g : kGolden) {
    CAPTURE(g.f32);
    const float f = f32_from_bits(g.f32);
    const uint16_t h = bf16_bits_from_f32(f);
    if (std::isnan(f)) {
      CHECK(is_quiet_nan(h));
      CHECK((h & 0x8000u) == ((g.f32 >> 16) & 0x8000u));  // the sign is kept
      CHECK(std::isnan(round_to_bf16(f)));
    } else {
      CHECK(h == g.bf16);
    }
    ++checked;
  }
  CHECK(checked > 8000);
}

TEST_CASE("every bf16 value widens exactly and rounds back to itself") {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = f32_from_bf16_bits(static_cast<uint16_t>(h));
    const bool nan = (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;
    if (nan) {
      CHECK(std::isnan(f));
      // A signalling NaN comes back quiet, with its sign and payload.
      if (bf16_bits_from_f32(f) != (h | 0x0040u)) FAIL_CHECK("bf16 NaN 0x" << std::hex << h << " not kept quiet");
      continue;
    }
    if (f32_bits(f) != h << 16) FAIL_CHECK("bf16 0x" << std::hex << h << " does not widen to its bits");
    if (bf16_bits_from_f32(f) != h) FAIL_CHECK("bf16 0x" << std::hex << h << " does not round back");
  }
  CHECK(f32_from_bf16_bits(0x3f80u) == 1.0f);
  CHECK(f32_from_bf16_bits(0x7f7fu) == 3.3895313892515355e38f);
  CHECK(f32_from_bf16_bits(0x0001u) == std::ldexp(1.0f, -133));
  CHECK(f32_from_bf16_bits(0xff80u) == -std::numeric_limits<float>::infinity());
  // The largest float is past the largest bf16's rounding boundary: inf, as IEEE rounds.
  CHECK(std::isinf(round_to_bf16(std::numeric_limits<float>::max())));
  CHECK(round_to_bf16(std::numeric_limits<float>::denorm_min()) == 0.0f);
  CHECK(std::signbit(round_to_bf16(-std::numeric_limits<float>::denorm_min())));
}

TEST_CASE("bf16 linear: operands rounded, the product summed exactly, no result rounding") {
  const LinearShape s{1, 1, 1};
  float y = 0.0f;
  const float one = 1.0f;
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties to even gives 1.
  const float halfway = 1.0f + std::ldexp(1.0f, -8);
  ref::linear_forward(s, engine::Precision::Bf16, BatchSplit{}, &halfway, &one, nullptr, &y);
  CHECK(y == 1.0f);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  const float halfway_up = 1.0f + 3.0f * std::ldexp(1.0f, -8);
  ref::linear_forward(s, engine::Precision::Bf16, BatchSplit{}, &halfway_up, &one, nullptr, &y);
  CHECK(y == 1.0f + std::ldexp(1.0f, -6));
  // fp16 would keep 1 + 2^-8 (10 mantissa bits); the fp32 op keeps it too.
  ref::linear_forward(s, engine::Precision::Fp32, BatchSplit{}, &halfway, &one, nullptr, &y);
  CHECK(y == halfway);

  // 257 ones: 257 is not a bf16 value (spacing 2 above 256), and linear's result is not
  // rounded to bf16.
  const LinearShape wide{1, 257, 1};
  const std::vector<float> ones(257, 1.0f);
  ref::linear_forward(wide, engine::Precision::Bf16, BatchSplit{}, ones.data(), ones.data(), nullptr, &y);
  CHECK(y == 257.0f);
  // The bias is added in fp32, after the product.
  const float bias = 0.25f;
  ref::linear_forward(wide, engine::Precision::Bf16, BatchSplit{}, ones.data(), ones.data(), &bias, &y);
  CHECK(y == 257.25f);
}

TEST_CASE("bf16 conv: the result rounded to bf16 before the fp32 bias") {
  // 257 input channels of one pixel, a 1x1 kernel of ones: the sum 257 rounds to 256 in
  // bf16 (spacing 2 there, ties to even), then the bias 0.5 is added in fp32.
  const ConvShape s{1, 257, 1, 1, 1, 1, 1, 0};
  const std::vector<float> ones(257, 1.0f);
  float y = 0.0f;
  ref::conv2d_forward(s, engine::Precision::Bf16, BatchSplit{}, ones.data(), ones.data(), nullptr, &y);
  CHECK(y == 256.0f);
  const float bias = 0.5f;
  ref::conv2d_forward(s, engine::Precision::Bf16, BatchSplit{}, ones.data(), ones.data(), &bias, &y);
  CHECK(y == 256.5f);
  ref::conv2d_forward(s, engine::Precision::Fp32, BatchSplit{}, ones.data(), ones.data(), &bias, &y);
  CHECK(y == 257.5f);

  // Backward: dx and dw rounded to bf16 too; db from the fp32 dy.
  const float dy = 1.0f + std::ldexp(1.0f, -8);  // rounds to 1 as an operand
  std::vector<float> dx(257), dw(257);
  float db = 0.0f;
  ref::conv2d_backward(s, engine::Precision::Bf16, ones.data(), ones.data(), &dy, dx.data(), dw.data(), &db);
  CHECK(dx[0] == 1.0f);
  CHECK(dw[256] == 1.0f);
  CHECK(db == dy);
}

TEST_CASE("bf16 has fp32's range: a large gradient stays finite (no loss scaling needed)") {
  const LinearShape s{1, 1, 1};
  const float x = 1.0f, w = 1.0f, dy = 70000.0f;  // beyond fp16's 65504, far inside bf16's range
  float dx = 0.0f, dw = 0.0f, db = 0.0f;
  ref::linear_backward(s, engine::Precision::Bf16, &x, &w, &dy, &dx, &dw, &db);
  CHECK(dx == 70144.0f);  // 70000 rounded to bf16 (spacing 512 there)
  CHECK(dw == 70144.0f);
  CHECK(db == 70000.0f);  // the bias gradient stays fp32
  const float big = round_to_bf16(3.0e38f);
  CHECK(std::isfinite(big));
  CHECK(std::fabs(big - 3.0e38f) <= std::ldexp(3.0e38f, -8));  // within the unit roundoff
}

TEST_CASE("the CPU does not run bf16: refused in one line before any kernel runs; the facade runs fp32 there") {
  const LinearShape s{1, 1, 1};
  const float x = 1.0f;
  float y = 0.0f;
  CHECK_FALSE(engine::kernels::supports_op(cpu_ops(), engine::kernels::OpId::linear_forward, engine::Precision::Bf16));
  CHECK(engine::kernels::supports_op(cpu_ops(), engine::kernels::OpId::linear_forward, engine::Precision::Fp32));
  CHECK(test_support::error_of([&] { cpu_ops().linear_forward(s, engine::Precision::Bf16, BatchSplit{}, &x, &x, nullptr, &y); }) ==
        "kernels: linear_forward in bf16 is not supported by the cpu backend");
  CHECK(y == 0.0f);
}
