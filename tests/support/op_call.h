// Test-only: one op call of the op list (kernels/op_list.inc) as text, for the backends
// that record what they are asked (tests/test_op_trace.cpp's recording table, the
// emulated CUDA device of tests/emulated_cuda/). Arguments are written without spaces:
// pointers in hex, floats exactly (%a), shapes and structs field by field; a chunked op's
// `bounds` and a BatchSplit's (host arrays read when the op is called) by their values,
// since their values, not their address, are what a replayed CUDA graph would keep.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace test_support {

inline std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}
inline std::string describe(const void* p) { return hex(p); }
inline std::string describe(int v) { return std::to_string(v); }
inline std::string describe(long v) { return std::to_string(v); }
inline std::string describe(long long v) { return std::to_string(v); }
inline std::string describe(unsigned long v) { return std::to_string(v); }
inline std::string describe(unsigned long long v) { return std::to_string(v); }
inline std::string describe(float v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%a", static_cast<double>(v));
  return buf;
}
inline std::string describe(engine::Precision p) { return engine::to_string(p); }
inline std::string describe(const engine::kernels::ConvShape& s) {
  return "conv{n=" + std::to_string(s.n) + ",c=" + std::to_string(s.c) + ",h=" + std::to_string(s.h) +
         ",w=" + std::to_string(s.w) + ",k=" + std::to_string(s.k) + ",r=" + std::to_string(s.r) +
         ",s=" + std::to_string(s.s) + ",pad=" + std::to_string(s.pad) + "}";
}
inline std::string describe(const engine::kernels::LinearShape& s) {
  return "linear{n=" + std::to_string(s.n) + ",in=" + std::to_string(s.in) + ",out=" + std::to_string(s.out) + "}";
}
inline std::string describe(const engine::kernels::BatchNormShape& s) {
  return "bn{n=" + std::to_string(s.n) + ",c=" + std::to_string(s.c) + ",hw=" + std::to_string(s.hw) +
         ",channels=" + std::to_string(s.c_begin) + ".." + std::to_string(s.c_end) + "}";
}
// The whole batch, or the chunks by their bounds' values (a host array read at the call).
inline std::string describe(const engine::kernels::BatchSplit& split) {
  if (split.whole()) return "whole";
  std::string v;
  for (int c = 0; c <= split.chunks; ++c) v += (c ? "," : "chunks[") + std::to_string(split.bounds[c]);
  return v + "]";
}
inline std::string describe(const engine::kernels::PoolShape& s) {
  return "pool{n=" + std::to_string(s.n) + ",c=" + std::to_string(s.c) + ",h=" + std::to_string(s.h) +
         ",w=" + std::to_string(s.w) + "}";
}
inline std::string describe(const engine::PhiloxStream& s) {
  return "philox{" + std::to_string(s.seed) + "," + std::to_string(s.subsequence) + "}";
}
inline std::string describe(const engine::kernels::AdamHyper& h) {
  return "hyper{lr=" + describe(h.lr) + ",b1=" + describe(h.beta1) + ",b2=" + describe(h.beta2) +
         ",eps=" + describe(h.eps) + ",wd=" + describe(h.weight_decay) + "}";
}
inline std::string describe(const engine::kernels::AdamStepFactors& f) {
  return "factors{" + describe(f.step_size) + "," + describe(f.bias_correction2_sqrt) + "," +
         describe(f.decay_factor) + "," + describe(f.one_minus_beta1) + "," + describe(f.one_minus_beta2) + "}";
}
inline std::string describe(const engine::kernels::AdamFactorInputs& in) {
  return "adam{b1=" + std::to_string(in.beta1) + ",b2=" + std::to_string(in.beta2) + ",wd=" +
         std::to_string(in.weight_decay) + "}";
}
inline std::string describe(const engine::kernels::LossScaleRule& r) {
  return "rule{growth=" + std::to_string(r.growth_factor) + ",backoff=" + std::to_string(r.backoff_factor) +
         ",interval=" + std::to_string(r.growth_interval) + "}";
}

// "(s, x, w)", an op's argument list as the op list spells it -> {s, x, w}.
inline std::vector<std::string> split_names(const char* text) {
  std::vector<std::string> out;
  std::string cur;
  for (const char* p = text; *p; ++p) {
    if (*p == '(' || *p == ' ' || *p == '\n' || *p == '\\') continue;
    if (*p == ',' || *p == ')') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += *p;
    }
  }
  return out;
}

struct OpCall {
  std::string op;
  std::vector<std::string> names, values;
};

// The call of `op` with the arguments named by `arg_names` (the op list's `args`).
template <class... Args>
OpCall describe_call(const char* op, const char* arg_names, const Args&... args) {
  OpCall call{op, split_names(arg_names), {describe(args)...}};
  int chunks = -1;
  const int* bounds = nullptr;
  std::size_t at = 0;
  const void* pointers[] = {static_cast<const void*>(&args)...};
  for (std::size_t i = 0; i < call.names.size(); ++i) {
    if (call.names[i] == "chunks") chunks = *static_cast<const int*>(pointers[i]);
    if (call.names[i] == "bounds") {
      bounds = *static_cast<const int* const*>(pointers[i]);
      at = i;
    }
  }
  if (bounds && chunks >= 0) {
    std::string v;
    for (int c = 0; c <= chunks; ++c) v += (c ? "," : "[") + std::to_string(bounds[c]);
    call.values[at] = v + "]";
  }
  return call;
}

}  // namespace test_support
