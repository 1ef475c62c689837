// IEEE binary16 (fp16) rounding, written once for host and device: what the mixed-
// precision ops do to their operands (kernels/cuda/mixed_precision.cpp casts with
// __float2half_rn), so that the reference (kernels/ref/) can round the same way and CI
// checks the fp16 ops' math without a GPU. Round to nearest, ties to even; a magnitude
// at or beyond 65520 becomes inf; NaN stays NaN (quiet); subnormals are kept.
#pragma once
#include <cstdint>

#include "engine/kernels/hd.h"
#include "kernels/float_bits.h"

namespace engine::kernels {

ENGINE_HD uint16_t f16_bits_from_f32(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((mag >> 13) & 0x3ffu));  // NaN, quiet
  if (mag >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 (and inf): inf
  if (mag >= 0x38800000u) {  // >= 2^-14: normal. Rebias the exponent, round 13 bits away.
    const uint32_t rebiased = mag - 0x38000000u;  // exponent 127 -> 15
    const uint32_t half = rebiased >> 13, rest = rebiased & 0x1fffu;
    const uint32_t up = rest > 0x1000u || (rest == 0x1000u && (half & 1u));
    return static_cast<uint16_t>(sign | (half + up));  // a carry into the exponent is right
  }
  if (mag < 0x33000000u) return sign;  // < 2^-25: below half the smallest subnormal, to zero
  // Subnormal: the value in units of 2^-24, with the implicit bit made explicit.
  const uint32_t exponent = mag >> 23;            // 102 .. 112
  const uint32_t mantissa = (mag & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exponent;         // 14 .. 24
  const uint32_t half = mantissa >> shift, rest = mantissa & ((1u << shift) - 1u), mid = 1u << (shift - 1u);
  const uint32_t up = rest > mid || (rest == mid && (half & 1u));
  return static_cast<uint16_t>(sign | (half + up));
}

ENGINE_HD float f32_from_f16_bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return f32_from_bits(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent != 0) return f32_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in float.
  const float m = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
  return sign ? -m : m;
}

// x rounded to the nearest fp16 value, as a float.
ENGINE_HD float round_to_f16(float x) { return f32_from_f16_bits(f16_bits_from_f32(x)); }

}  // namespace engine::kernels
