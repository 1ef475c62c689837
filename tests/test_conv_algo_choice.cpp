// cuDNN's convolution algorithm choice (kernels/cuda/conv_algo_choice.h), on the CPU:
// the first acceptable result, the fallback in fp32 and fp16, and bf16's refusal when
// cuDNN offers nothing usable (its fallback has never run in bf16).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kernels/cuda/conv_algo_choice.h"

using engine::kernels::cuda::choose_conv_algo;
using engine::kernels::cuda::ConvAlgoChoice;
using engine::kernels::cuda::ConvAlgoResult;
using engine::kernels::cuda::ConvData;
using engine::kernels::cuda::ConvDirection;

namespace {
ConvAlgoResult result(bool ok, bool det, bool tensor_op, std::size_t memory = 0) {
  ConvAlgoResult r;
  r.succeeded = ok;
  r.deterministic = det;
  r.tensor_op_math = tensor_op;
  r.memory = memory;
  return r;
}
}  // namespace

TEST_CASE("the first acceptable result is taken, in each type") {
  const std::vector<ConvAlgoResult> rs = {result(false, true, false), result(true, false, false),
                                          result(true, true, true), result(true, true, false, std::size_t{2} << 30),
                                          result(true, true, false)};
  // fp32: not the failed one, not the nondeterministic one, not TF32, not the 2 GiB one.
  ConvAlgoChoice c = choose_conv_algo(rs, true, ConvData::Float, ConvDirection::Forward, "x");
  CHECK(c.kind == ConvAlgoChoice::Kind::Result);
  CHECK(c.index == 4);
  // fp16 and bf16 welcome tensor cores.
  for (ConvData d : {ConvData::Half, ConvData::BFloat16}) {
    c = choose_conv_algo(rs, true, d, ConvDirection::BackwardData, "x");
    CHECK(c.kind == ConvAlgoChoice::Kind::Result);
    CHECK(c.index == 2);
  }
  // Not deterministic mode: the fastest that succeeded.
  c = choose_conv_algo(rs, false, ConvData::Half, ConvDirection::BackwardFilter, "x");
  CHECK(c.index == 1);
}

TEST_CASE("nothing usable: fp32 and fp16 fall back, bf16 refuses with one line") {
  const std::vector<ConvAlgoResult> rs = {result(false, true, false), result(true, false, true),
                                          result(true, true, false, std::size_t{3} << 30)};
  for (ConvData d : {ConvData::Float, ConvData::Half}) {
    const ConvAlgoChoice c = choose_conv_algo(rs, true, d, ConvDirection::Forward, "x");
    CHECK(c.kind == ConvAlgoChoice::Kind::Fallback);
  }
  const ConvAlgoChoice c =
      choose_conv_algo(rs, true, ConvData::BFloat16, ConvDirection::BackwardFilter, "bf16 n=64 c=1 h=28 w=28 k=32 r=3 s=3 pad=1");
  CHECK(c.kind == ConvAlgoChoice::Kind::Refused);
  CHECK(c.refusal ==
        "cuDNN offers no usable deterministic backward-filter algorithm for the convolution bf16 n=64 c=1 h=28 "
        "w=28 k=32 r=3 s=3 pad=1 (3 results: 1 not supported, 1 not deterministic, 1 needing over 1 GiB of "
        "workspace), and the fp32 and fp16 fallback has never run in bf16: use precision.mode=fp16 or fp32 on "
        "this GPU");
  CHECK(c.refusal.find('\n') == std::string::npos);
  // No results at all (heuristics that return nothing).
  CHECK(choose_conv_algo({}, true, ConvData::BFloat16, ConvDirection::Forward, "x").kind ==
        ConvAlgoChoice::Kind::Refused);
  CHECK(choose_conv_algo({}, true, ConvData::Half, ConvDirection::Forward, "x").kind ==
        ConvAlgoChoice::Kind::Fallback);
}
