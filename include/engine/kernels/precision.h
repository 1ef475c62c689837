// The one precision enum of the engine: the arithmetic of the convolution and linear ops,
// what the config's precision.mode names, and what an op of the op list computes in.
// Fp16 and Bf16 are mixed precision on CUDA (fp16 or bfloat16 operands, fp32
// accumulation, fp32 parameters and results); on the CPU they are fp32.
#pragma once

namespace engine {

enum class Precision { Fp32, Fp16, Bf16 };  // spelt "fp32" | "fp16" | "bf16" (precision.mode)

inline const char* to_string(Precision v) {
  switch (v) {
    case Precision::Fp16: return "fp16";
    case Precision::Bf16: return "bf16";
    case Precision::Fp32: break;
  }
  return "fp32";
}

}  // namespace engine
