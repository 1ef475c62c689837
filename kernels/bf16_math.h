// bfloat16 (bf16: fp32's sign and 8-bit exponent, 7 stored mantissa bits) rounding,
// written once for host and device: what the bf16 mixed-precision ops do to their
// operands (kernels/cuda/mixed_precision.cpp casts with __float2bfloat16_rn), so that the
// reference (kernels/ref/) can round the same way and CI checks the bf16 ops' math
// without a GPU. Round to nearest, ties to even; a magnitude that rounds past the largest
// finite bf16 (0x7f7f, about 3.39e38) becomes inf; inf stays inf; NaN stays NaN (quiet);
// subnormals are kept (bf16 has fp32's exponent range, so they round like any value).
#pragma once
#include <cstdint>

#include "engine/kernels/hd.h"
#include "kernels/float_bits.h"

namespace engine::kernels {

ENGINE_HD uint16_t bf16_bits_from_f32(float f) {
  const uint32_t u = f32_bits(f);
  // NaN: keep the sign and the top payload bits, set the quiet bit (a payload held only
  // in the low 16 bits would otherwise truncate to inf).
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Round the low 16 bits away, ties to even. A carry into the exponent is right, up to
  // inf itself (0x7f80): that is IEEE's overflow under round to nearest.
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

ENGINE_HD float f32_from_bf16_bits(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

// x rounded to the nearest bf16 value, as a float.
ENGINE_HD float round_to_bf16(float x) { return f32_from_bf16_bits(bf16_bits_from_f32(x)); }

}  // namespace engine::kernels
