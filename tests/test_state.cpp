// The uniform state interface and the RNG's state.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "engine/core/rng.h"
#include "engine/core/state.h"
#include "engine/nn/models/fashion_cnn.h"

using namespace engine;

TEST_CASE("compare_state reports missing, unexpected and mismatched keys") {
  StateDict want, got;
  want.tensors["a"] = Tensor::zeros({2, 3});
  want.tensors["b"] = Tensor::zeros({4});
  want.scalars["n"] = int64_t{3};
  want.scalars["s"] = std::string("x");
  got.tensors["a"] = Tensor::zeros({3, 2});
  got.tensors["c"] = Tensor::zeros({1});
  got.scalars["n"] = 3.0;
  StateReport r = compare_state(want, got);
  CHECK(r.missing == std::vector<std::string>{"b", "s"});
  CHECK(r.unexpected == std::vector<std::string>{"c"});
  REQUIRE(r.mismatched.size() == 2);
  CHECK(r.mismatched[0].find("[2, 3]") != std::string::npos);
  CHECK(r.summary().find("2 missing") != std::string::npos);
  StateDict merged = merge_matching(want, got);
  CHECK(merged.tensors.at("a").shape() == Shape{2, 3});  // mismatched: kept
  CHECK(compare_state(want, want).clean());
}

TEST_CASE("the model's state keys are PyTorch's state_dict keys with PyTorch shapes") {
  FashionCnn m;
  StateDict s = m.state();
  CHECK(m.parameter_count() == 421834);
  const std::vector<std::pair<std::string, Shape>> expect = {
      {"conv1.weight", {32, 1, 3, 3}}, {"conv1.bias", {32}}, {"bn1.weight", {32}},
      {"bn1.bias", {32}}, {"bn1.running_mean", {32}}, {"bn1.running_var", {32}},
      {"conv2.weight", {64, 32, 3, 3}}, {"conv2.bias", {64}}, {"bn2.weight", {64}},
      {"bn2.bias", {64}}, {"bn2.running_mean", {64}}, {"bn2.running_var", {64}},
      {"fc1.weight", {128, 3136}}, {"fc1.bias", {128}}, {"fc2.weight", {10, 128}}, {"fc2.bias", {10}}};
  CHECK(s.tensors.size() == expect.size());
  for (auto& [k, shape] : expect) {
    CAPTURE(k);
    REQUIRE(s.tensors.count(k));
    CHECK(s.tensors.at(k).shape() == shape);
  }
  CHECK(s.get_int("bn1.num_batches_tracked") == 0);
  CHECK(s.get_int("bn2.num_batches_tracked") == 0);
}

TEST_CASE("model initialisation is PyTorch's default scheme and deterministic in the seed") {
  Rng r1(7), r2(7), r3(8);
  FashionCnn a, b, c;
  a.reset_parameters(r1);
  b.reset_parameters(r2);
  c.reset_parameters(r3);
  const auto wa = a.state().tensors.at("fc1.weight").to_vector();
  CHECK(wa == b.state().tensors.at("fc1.weight").to_vector());
  CHECK(wa != c.state().tensors.at("fc1.weight").to_vector());
  const float bound = 1.0f / std::sqrt(3136.0f);
  float lo = 1, hi = -1;
  for (float v : wa) lo = std::min(lo, v), hi = std::max(hi, v);
  CHECK(lo >= -bound);
  CHECK(hi <= bound);
  CHECK(hi > 0.99f * bound);  // 401k uniform draws reach the edges
  CHECK(r1.counter(RngStream::Init) == static_cast<uint64_t>(a.parameter_count() - 2 * 32 - 2 * 64));
}

TEST_CASE("rng state round-trips; permutations depend only on seed and offset") {
  Rng r(42);
  r.take(RngStream::Shuffle, 100);
  r.next_u32(RngStream::Dropout);
  Rng s(0);
  s.load_state(r.state());
  CHECK(s.seed() == 42);
  CHECK(s.counter(RngStream::Shuffle) == 100);
  CHECK(s.counter(RngStream::Dropout) == 1);
  CHECK(s.next_u32(RngStream::Dropout) == r.next_u32(RngStream::Dropout));
  const auto p1 = r.permutation(RngStream::Shuffle, 5, 1000);
  const auto p2 = s.permutation(RngStream::Shuffle, 5, 1000);
  CHECK(p1 == p2);
  std::vector<int32_t> sorted = p1;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 1000; ++i) CHECK(sorted[i] == i);
  CHECK(p1 != r.permutation(RngStream::Shuffle, 6, 1000));
  // Streams are independent: different subsequences give different values.
  CHECK(philox_at(r.stream(RngStream::Shuffle), 0) != philox_at(r.stream(RngStream::Dropout), 0));
}
