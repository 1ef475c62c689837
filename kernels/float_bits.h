// A float's IEEE binary32 bits and back, written once for host and device: what the
// rounding helpers (kernels/fp16_math.h, kernels/bf16_math.h) work on.
#pragma once
#include <cstdint>
#include <cstring>

#include "engine/kernels/hd.h"

namespace engine::kernels {

ENGINE_HD uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
ENGINE_HD float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace engine::kernels
