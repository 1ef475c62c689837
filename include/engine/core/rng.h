// The engine's only source of randomness: one Philox4x32-10 generator keyed by the
// seed, with named streams (cuRAND subsequences) whose positions are plain integer
// counters. Saving the seed and the counters saves the generator exactly.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/kernels/philox.h"
#include "engine/core/state.h"

namespace engine {

enum class RngStream : int { Init = 0, Shuffle = 1, Dropout = 2 };
inline constexpr int kRngStreamCount = 3;
const char* rng_stream_name(RngStream s);  // "init", "shuffle", "dropout"

class Rng : public Stateful {
 public:
  explicit Rng(uint64_t seed = 0) : seed_(seed) {}

  uint64_t seed() const { return seed_; }
  PhiloxStream stream(RngStream s) const;
  uint64_t counter(RngStream s) const { return counters_[static_cast<int>(s)]; }
  // Reserves `count` consecutive 32-bit outputs of a stream; returns the first's position.
  uint64_t take(RngStream s, uint64_t count);
  uint32_t next_u32(RngStream s) { return philox_at(stream(s), take(s, 1)); }

  // Uniform float32 in [lo, hi) from consecutive outputs of a stream.
  void fill_uniform(RngStream s, float* out, int64_t n, float lo, float hi);
  // A random permutation of 0..n-1 (Fisher-Yates) drawn from `s` starting at
  // position `offset`, without touching the counters: epoch permutations can be
  // re-derived from a saved offset when resuming in the middle of an epoch.
  std::vector<int32_t> permutation(RngStream s, uint64_t offset, int32_t n) const;
  // Number of outputs permutation(n) consumes.
  static uint64_t permutation_draws(int32_t n) { return n > 1 ? static_cast<uint64_t>(n - 1) : 0; }

  StateDict state() const override;
  void load_state(const StateDict& in) override;

 private:
  uint64_t seed_;
  uint64_t counters_[kRngStreamCount] = {0, 0, 0};
};

}  // namespace engine
