// Times each fast-CPU op of one training step at the default config's shapes
// (batch 128), to see where an epoch goes. Usage: kernel_bench [iterations]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "kernels/ops.h"

using namespace engine::kernels;
using Clock = std::chrono::steady_clock;

static std::vector<float> rnd(std::size_t n, std::mt19937& g) {
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

static void time_op(const char* name, int iters, const std::function<void()>& f) {
  f();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) f();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / iters;
  std::printf("%-28s %8.3f ms\n", name, ms);
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 10;
  const int n = 128;
  std::mt19937 g(1);
  ConvShape c1{n, 1, 28, 28, 32, 3, 3, 1}, c2{n, 32, 14, 14, 64, 3, 3, 1};
  auto x1 = rnd(n * 784, g), w1 = rnd(32 * 9, g), b1 = rnd(32, g), y1 = rnd(n * 32 * 784, g);
  auto x2 = rnd(n * 32 * 196, g), w2 = rnd(64 * 288, g), b2 = rnd(64, g), y2 = rnd(n * 64 * 196, g);
  auto dw1 = w1, db1 = b1, dw2 = w2, db2 = b2, dx2 = x2;
  time_op("conv1 forward", iters, [&] { cpu::conv2d_forward(c1, x1.data(), w1.data(), b1.data(), y1.data()); });
  time_op("conv1 backward (no dx)", iters, [&] { cpu::conv2d_backward(c1, x1.data(), w1.data(), y1.data(), nullptr, dw1.data(), db1.data()); });
  time_op("conv2 forward", iters, [&] { cpu::conv2d_forward(c2, x2.data(), w2.data(), b2.data(), y2.data()); });
  time_op("conv2 backward", iters, [&] { cpu::conv2d_backward(c2, x2.data(), w2.data(), y2.data(), dx2.data(), dw2.data(), db2.data()); });
  BatchNormShape bn1{n, 32, 784};
  auto gm = rnd(64, g), bt = rnd(64, g), rm = rnd(64, g), rv = std::vector<float>(64, 1.0f), sm = rm, si = rm;
  auto ybn = y1, dxbn = y1;
  time_op("bn1 forward train", iters, [&] { cpu::batchnorm_forward_train(bn1, y1.data(), gm.data(), bt.data(), 1e-5f, 0.1f, rm.data(), rv.data(), sm.data(), si.data(), ybn.data()); });
  time_op("bn1 backward", iters, [&] { cpu::batchnorm_backward(bn1, y1.data(), ybn.data(), gm.data(), sm.data(), si.data(), dxbn.data(), dw1.data(), db1.data()); });
  time_op("relu1 forward", iters, [&] { cpu::relu_forward(n * 32 * 784, y1.data(), ybn.data()); });
  time_op("relu1 backward", iters, [&] { cpu::relu_backward(n * 32 * 784, y1.data(), ybn.data(), dxbn.data()); });
  PoolShape p1{n, 32, 28, 28};
  std::vector<float> yp(n * 32 * 196);
  std::vector<int32_t> am(n * 32 * 196);
  time_op("pool1 forward", iters, [&] { cpu::maxpool2x2_forward(p1, y1.data(), yp.data(), am.data()); });
  time_op("pool1 backward", iters, [&] { cpu::maxpool2x2_backward(p1, yp.data(), am.data(), dxbn.data()); });
  LinearShape f1{n, 3136, 128};
  auto xf = rnd(n * 3136, g), wf = rnd(128 * 3136, g), bf = rnd(128, g), yf = rnd(n * 128, g), dxf = xf, dwf = wf, dbf = bf;
  time_op("fc1 forward", iters, [&] { cpu::linear_forward(f1, xf.data(), wf.data(), bf.data(), yf.data()); });
  time_op("fc1 backward", iters, [&] { cpu::linear_backward(f1, xf.data(), wf.data(), yf.data(), dxf.data(), dwf.data(), dbf.data()); });
  auto mf = wf, vf = wf;
  AdamHyper h;
  AdamStepFactors sf{1e-3f, 0.5f, 0.99999f, 0.1f, 0.001f};
  time_op("adam fc1.weight", iters, [&] { cpu::adam_update(128 * 3136, wf.data(), dwf.data(), mf.data(), vf.data(), h, sf); });
  return 0;
}
