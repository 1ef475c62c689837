// Random test inputs, shared by the kernel, gradient and GPU tests.
#pragma once
#include <cstddef>
#include <random>
#include <vector>

namespace test_support {

// n floats drawn uniformly from [lo, hi) by g (a seeded std::mt19937, so every run of a
// test sees the same inputs).
inline std::vector<float> uniform(std::size_t n, std::mt19937& g, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

}  // namespace test_support
