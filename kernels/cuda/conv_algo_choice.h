// Which of cuDNN's convolution algorithms a plan takes (kernels/cuda/conv_cudnn.cpp),
// as plain data, so the rule is tested on the CPU (tests/test_conv_algo_choice.cpp)
// without cuDNN. Results come best first; the first acceptable one is taken:
//  * it succeeded (status CUDNN_STATUS_SUCCESS);
//  * deterministic mode: cuDNN reports it CUDNN_DETERMINISTIC;
//  * fp32: no tensor-op math (it would let TF32 in);
//  * it needs at most kConvMaxWorkspace of scratch.
// When none is: fp32 and fp16 fall back to a deterministic general-purpose algorithm that
// supports every stride-1 shape (forward: implicit GEMM; backward: ALGO_1), which has run
// on GPUs in both; bf16 refuses with one line, because no fallback has run in bf16.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "kernels/cuda/conv_cudnn.h"

namespace engine::kernels::cuda {

// Algorithms needing more scratch than this are passed over (FFT variants can ask for
// gigabytes); the fallbacks need little or none.
constexpr std::size_t kConvMaxWorkspace = std::size_t{1} << 30;

enum class ConvDirection { Forward, BackwardData, BackwardFilter };

// One of cuDNN's results (cudnnConvolution*AlgoPerf_t), as the rule reads it.
struct ConvAlgoResult {
  bool succeeded = false;
  bool deterministic = false;
  bool tensor_op_math = false;
  std::size_t memory = 0;
};

struct ConvAlgoChoice {
  enum class Kind { Result, Fallback, Refused };
  Kind kind = Kind::Refused;
  int index = -1;       // Kind::Result: which result
  std::string refusal;  // Kind::Refused: why, one line
};

inline const char* direction_name(ConvDirection d) {
  switch (d) {
    case ConvDirection::BackwardData: return "backward-data";
    case ConvDirection::BackwardFilter: return "backward-filter";
    case ConvDirection::Forward: break;
  }
  return "forward";
}

// `what`: the convolution, for the refusal (its shape and type).
inline ConvAlgoChoice choose_conv_algo(const std::vector<ConvAlgoResult>& results, bool deterministic,
                                       ConvData data, ConvDirection direction, const std::string& what) {
  int failed = 0, nondeterministic = 0, too_big = 0;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const ConvAlgoResult& r = results[i];
    if (!r.succeeded) {
      ++failed;
    } else if (deterministic && !r.deterministic) {
      ++nondeterministic;
    } else if (data == ConvData::Float && r.tensor_op_math) {
      continue;  // TF32 (fp32 only, so never counted in a refusal)
    } else if (r.memory > kConvMaxWorkspace) {
      ++too_big;
    } else {
      ConvAlgoChoice c;
      c.kind = ConvAlgoChoice::Kind::Result;
      c.index = static_cast<int>(i);
      return c;
    }
  }
  ConvAlgoChoice c;
  if (data != ConvData::BFloat16) {
    c.kind = ConvAlgoChoice::Kind::Fallback;
    return c;
  }
  c.kind = ConvAlgoChoice::Kind::Refused;
  c.refusal = std::string("cuDNN offers no usable ") + (deterministic ? "deterministic " : "") +
              direction_name(direction) + " algorithm for the convolution " + what + " (" +
              std::to_string(results.size()) + " results: " + std::to_string(failed) + " not supported, " +
              std::to_string(nondeterministic) + " not deterministic, " + std::to_string(too_big) +
              " needing over 1 GiB of workspace), and the fp32 and fp16 fallback has never run in bf16: "
              "use precision.mode=fp16 or fp32 on this GPU";
  return c;
}

}  // namespace engine::kernels::cuda
