// bf16 rounding (kernels/bf16_math.h) against PyTorch's float32 -> bfloat16 conversion
// (tests/data/bf16_golden.inc, from tools/bf16_golden.py).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <ios>
#include <limits>
#include <vector>

#include "kernels/bf16_math.h"

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
