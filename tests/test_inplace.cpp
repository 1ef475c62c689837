// The ops that layers run in place (kernels/op_list.inc) give the same bits in place as
// out of place, on the reference and the fast CPU backends.
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "kernels/ops.h"

using namespace engine::kernels;

namespace {
std::vector<float> random_vector(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
}  // namespace

TEST_CASE("relu forward and backward in place") {
  const auto x = random_vector(1000, 1), dy = random_vector(1000, 2);
  std::vector<float> y(1000), dx(1000);
  cpu::relu_forward(1000, x.data(), y.data());
  std::vector<float> inplace = x;
  cpu::relu_forward(1000, inplace.data(), inplace.data());
  CHECK(inplace == y);
  cpu::relu_backward(1000, y.data(), dy.data(), dx.data());
  std::vector<float> g = dy;
  cpu::relu_backward(1000, y.data(), g.data(), g.data());
  CHECK(g == dx);
  g = dy;
  ref::relu_backward(1000, y.data(), g.data(), g.data());
  CHECK(g == dx);
}

TEST_CASE("batchnorm backward with dx == dy, whole batch and by chunks") {
  BatchNormShape s{3, 4, 50};
  const std::size_t n = 3 * 4 * 50;
  const auto x = random_vector(n, 3), dy = random_vector(n, 4), gamma = random_vector(4, 5);
  const std::vector<float> mean = {0.1f, -0.2f, 0.3f, 0.0f}, invstd = {1.1f, 0.9f, 1.3f, 0.7f};
  const int bounds[] = {0, 1, 1, 2, 3};  // four chunks, one of them empty
  for (const BatchSplit split : {BatchSplit{}, BatchSplit{4, bounds}})
  for (auto backend : {&cpu::batchnorm_backward, &ref::batchnorm_backward}) {
    CAPTURE(split.chunks);
    std::vector<float> dx(n), dg(4), db(4), dg2(4), db2(4);
    backend(s, split, x.data(), dy.data(), gamma.data(), mean.data(), invstd.data(), dx.data(), dg.data(),
            db.data());
    std::vector<float> g = dy;
    backend(s, split, x.data(), g.data(), gamma.data(), mean.data(), invstd.data(), g.data(), dg2.data(),
            db2.data());
    CHECK(g == dx);
    CHECK(dg == dg2);
    CHECK(db == db2);
  }
}
