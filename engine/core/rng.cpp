#include "engine/core/rng.h"

#include <stdexcept>
#include <utility>

namespace engine {

const char* rng_stream_name(RngStream s) {
  switch (s) {
    case RngStream::Init: return "init";
    case RngStream::Shuffle: return "shuffle";
    case RngStream::Dropout: return "dropout";
  }
  return "?";
}

PhiloxStream Rng::stream(RngStream s) const {
  // Subsequence 0 is left unused so no stream coincides with a plain curand_init(seed, 0, 0).
  return PhiloxStream{seed_, static_cast<uint64_t>(s) + 1};
}

uint64_t Rng::take(RngStream s, uint64_t count) {
  const uint64_t first = counters_[static_cast<int>(s)];
  counters_[static_cast<int>(s)] += count;
  return first;
}

void Rng::fill_uniform(RngStream s, float* out, int64_t n, float lo, float hi) {
  const PhiloxStream ps = stream(s);
  const uint64_t first = take(s, static_cast<uint64_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out[i] = lo + (hi - lo) * philox_uniform(philox_at(ps, first + static_cast<uint64_t>(i)));
}

std::vector<int32_t> Rng::permutation(RngStream s, uint64_t offset, int32_t n) const {
  std::vector<int32_t> p(static_cast<std::size_t>(n));
  for (int32_t i = 0; i < n; ++i) p[i] = i;
  const PhiloxStream ps = stream(s);
  uint64_t pos = offset;
  for (int32_t i = n - 1; i > 0; --i) {
    // j uniform in [0, i] by the multiply-shift map (bias below 2^-32 * n: negligible).
    const uint64_t r = philox_at(ps, pos++);
    const int32_t j = static_cast<int32_t>((r * static_cast<uint64_t>(i + 1)) >> 32);
    std::swap(p[i], p[j]);
  }
  return p;
}

StateDict Rng::state() const {
  StateDict d;
  d.scalars["algorithm"] = std::string("philox4x32-10");
  d.scalars["seed"] = static_cast<int64_t>(seed_);
  for (int i = 0; i < kRngStreamCount; ++i)
    d.scalars[rng_stream_name(static_cast<RngStream>(i))] = static_cast<int64_t>(counters_[i]);
  return d;
}

void Rng::load_state(const StateDict& in) {
  if (in.get_string("algorithm") != "philox4x32-10")
    throw std::runtime_error("rng: unsupported algorithm '" + in.get_string("algorithm") + "'");
  seed_ = static_cast<uint64_t>(in.get_int("seed"));
  for (int i = 0; i < kRngStreamCount; ++i)
    counters_[i] = static_cast<uint64_t>(in.get_int(rng_stream_name(static_cast<RngStream>(i))));
}

}  // namespace engine
