// Times the fast-CPU ops of one training step of the default config (fashion_cnn,
// batch 128, fp32), the very calls the layers make (engine/nn/layers.cpp): the chunked
// forms over the 8 fixed chunks, in step order, forward then backward then the AdamW
// update of every parameter. Prints each op's time, its GFLOP/s where it multiplies,
// its share of the step, the sum, and that sum times the steps of one epoch.
//
//   kernel_bench [iterations] [--ranks W]
//       iterations: default 20; ENGINE_CPU_KERNELS chooses the path, OMP_NUM_THREADS
//       the threads, as for the engine.
//       --ranks W (1, 2, 4 or 8): the ops of rank 0 of a W-rank run instead: its 8/W
//       chunks of the batch, BatchNorm in the separate steps that a rank interleaves
//       with its exchanges, by channel groups (engine/core/batchnorm_ops.cpp), and AdamW
//       over its 1/W shard.
//
// The sum leaves out what is not an op (the data pipeline, the loss bookkeeping, the
// tree of the BatchNorm sums between its two passes), so it is a floor for the step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <omp.h>

#include "kernels/chunk_tree.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/ops.h"

using namespace engine::kernels;
using engine::kTreeChunks;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<float> rnd(std::size_t n, std::mt19937& g) {
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

struct Row {
  std::string name;
  double ms;
  double gflop;  // 0: not a product
};

struct Bench {
  int iters;
  std::vector<Row> rows;
  void op(const std::string& name, double gflop, const std::function<void()>& f) {
    f();  // warm: buffers grown, pages touched
    std::vector<double> ms(iters);
    for (int i = 0; i < iters; ++i) {
      const auto t0 = Clock::now();
      f();
      ms[i] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    }
    // The median: this VM's neighbours slow single runs by a quarter or more.
    std::nth_element(ms.begin(), ms.begin() + iters / 2, ms.end());
    rows.push_back({name, ms[iters / 2], gflop});
  }
};

double conv_gflop(const ConvShape& s) {
  return 2.0 * s.n * s.k * s.c * s.r * s.s * s.out_h() * s.out_w() * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20, ranks = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ranks" && i + 1 < argc) {
      ranks = std::atoi(argv[++i]);
      if (ranks != 1 && ranks != 2 && ranks != 4 && ranks != 8) {
        std::fprintf(stderr, "kernel_bench: --ranks must be 1, 2, 4 or 8, got '%s'\n", argv[i]);
        return 2;
      }
    } else {
      iters = std::atoi(argv[i]);
      if (iters < 1) {
        std::fprintf(stderr, "kernel_bench: iterations must be a positive integer, got '%s'\n", argv[i]);
        return 2;
      }
    }
  }
  const int global_batch = 128, train_images = 55000;
  // Rank 0's chunks of the global batch: the first 8/W, as BatchChunks splits them.
  const int chunks = kTreeChunks / ranks;
  const int n = tree_chunk_begin(global_batch, chunks);
  int bounds[kTreeChunks + 1];
  for (int c = 0; c <= chunks; ++c) bounds[c] = tree_chunk_begin(global_batch, c);
  std::mt19937 g(1);

  const ConvShape c1{n, 1, 28, 28, 32, 3, 3, 1}, c2{n, 32, 14, 14, 64, 3, 3, 1};
  const BatchNormShape bn1{n, 32, 784}, bn2{n, 64, 196};
  const PoolShape p1{n, 32, 28, 28}, p2{n, 64, 14, 14};
  const LinearShape f1{n, 3136, 128}, f2{n, 128, 10};
  const int classes = 10;

  // Activations, as the layers hold them.
  auto x = rnd(n * 784, g);
  // Each block pools before its ReLU (models/fashion_cnn.cpp): m is the pooled map, r
  // its ReLU (in place in the model).
  auto y1 = rnd(n * 32 * 784, g), a1 = y1, m1 = rnd(n * 32 * 196, g), r1 = m1;
  auto y2 = rnd(n * 64 * 196, g), a2 = y2, m2 = rnd(n * 3136, g), r2 = m2;
  auto h1 = rnd(n * 128, g), hr = h1, hd = h1, logits = rnd(n * classes, g);
  std::vector<int32_t> am1(n * 32 * 196), am2(n * 3136), labels(n);
  for (int i = 0; i < n; ++i) labels[i] = i % classes;
  std::vector<uint8_t> keep(n * 128);
  // Parameters, gradients, moments.
  auto w1 = rnd(32 * 9, g), b1 = rnd(32, g), w2 = rnd(64 * 288, g), b2 = rnd(64, g);
  auto g1 = std::vector<float>(32, 1.0f), be1 = std::vector<float>(32, 0.0f);
  auto g2 = std::vector<float>(64, 1.0f), be2 = std::vector<float>(64, 0.0f);
  auto wf1 = rnd(128 * 3136, g), bf1 = rnd(128, g), wf2 = rnd(10 * 128, g), bf2 = rnd(10, g);
  std::vector<float> rm(64, 0.0f), rv(64, 1.0f), sm1(32), si1(32), sm2(64), si2(64);
  std::vector<float> dlogits(n * classes), loss(n), correct(n);
  // Gradients: each backward op reads a fixed random one and writes its own output, so
  // repeated runs never feed an op the growing or vanishing (subnormal, slow) values of
  // its own earlier runs.
  const auto g_h = rnd(n * 128, g), g_q2 = rnd(n * 3136, g), g_y2 = rnd(n * 64 * 196, g);
  const auto g_q1 = rnd(n * 32 * 196, g), g_y1 = rnd(n * 32 * 784, g);
  auto dh = h1, dh2 = h1, dh3 = h1, dq2 = m2, dq2b = m2, dy2 = y2, dy2c = y2, dq1 = m1, dq1b = m1, dy1 = y1, dy1c = y1;
  std::vector<float> dw1(w1.size()), dw2(w2.size()), dwf1(wf1.size()), dwf2(wf2.size());
  std::vector<double> db1(32), db2(64), dbf1(128), dbf2(10);
  std::vector<float> dg1(32), dbe1(32), dg2(64), dbe2(64);

  // BatchNorm: the fused one-process op, or a rank's steps by channel groups (the
  // exchanges and the per-channel arithmetic between the steps left out: factors of 1
  // and 0 stand in).
  std::vector<double> bn_sum(64), bn_sq(64), bn_dy(64), bn_dyxc(64);
  const std::vector<float> ones(64, 1.0f), zeros(64, 0.0f);
  using Vec = std::vector<float>;
  auto bn_forward = [&](const BatchNormShape& s, const Vec& in, const Vec& gamma, const Vec& beta, Vec& mean,
                        Vec& invstd, Vec& out) {
    if (ranks == 1) {
      cpu::batchnorm_forward_train(s, BatchSplit{chunks, bounds}, in.data(), gamma.data(), beta.data(), 1e-5f, 0.1f,
                                          rm.data(), rv.data(), mean.data(), invstd.data(), out.data());
      return;
    }
    const int group = cpu::batchnorm_channel_group(s, 1);
    for (int c0 = 0; c0 < s.c; c0 += group) {
      BatchNormShape gs = s;
      gs.c_begin = c0;
      gs.c_end = std::min(s.c, c0 + group);
      cpu::batchnorm_chunk_sums(gs, chunks, bounds, in.data(), bn_sum.data());
      cpu::batchnorm_chunk_centered_squares(gs, chunks, bounds, in.data(), mean.data(), bn_sq.data());
      cpu::batchnorm_scale_shift(gs, in.data(), ones.data(), zeros.data(), out.data());
    }
  };
  auto bn_backward = [&](const BatchNormShape& s, const Vec& in, const Vec& dy, const Vec& gamma, const Vec& mean,
                         const Vec& invstd, Vec& dx, Vec& dgamma, Vec& dbeta) {
    if (ranks == 1) {
      cpu::batchnorm_backward(s, BatchSplit{chunks, bounds}, in.data(), dy.data(), gamma.data(), mean.data(),
                                     invstd.data(), dx.data(), dgamma.data(), dbeta.data());
      return;
    }
    // The whole layer, one exchange (engine/core/batchnorm_ops.cpp, backward_steps).
    cpu::batchnorm_backward_chunk_sums(s, chunks, bounds, in.data(), dy.data(), mean.data(), bn_dy.data(),
                                       bn_dyxc.data());
    cpu::batchnorm_backward_apply(s, in.data(), dy.data(), mean.data(), ones.data(), zeros.data(), zeros.data(),
                                  dx.data());
  };

  Bench b{iters, {}};
  // ---- forward
  b.op("conv1 forward", conv_gflop(c1), [&] { cpu::conv2d_forward(c1, engine::Precision::Fp32, BatchSplit{chunks, bounds}, x.data(), w1.data(), b1.data(), y1.data()); });
  b.op("bn1 forward (train)", 0, [&] { bn_forward(bn1, y1, g1, be1, sm1, si1, a1); });
  b.op("pool1 forward", 0, [&] { cpu::maxpool2x2_forward(p1, a1.data(), m1.data(), am1.data()); });
  b.op("relu1 forward", 0, [&] { cpu::relu_forward(n * 32 * 196, m1.data(), r1.data()); });
  b.op("conv2 forward", conv_gflop(c2), [&] { cpu::conv2d_forward(c2, engine::Precision::Fp32, BatchSplit{chunks, bounds}, r1.data(), w2.data(), b2.data(), y2.data()); });
  b.op("bn2 forward (train)", 0, [&] { bn_forward(bn2, y2, g2, be2, sm2, si2, a2); });
  b.op("pool2 forward", 0, [&] { cpu::maxpool2x2_forward(p2, a2.data(), m2.data(), am2.data()); });
  b.op("relu2 forward", 0, [&] { cpu::relu_forward(n * 3136, m2.data(), r2.data()); });
  b.op("fc1 forward", 2.0 * n * 3136 * 128 * 1e-9, [&] { cpu::linear_forward(f1, engine::Precision::Fp32, BatchSplit{chunks, bounds}, r2.data(), wf1.data(), bf1.data(), h1.data()); });
  b.op("relu3 forward", 0, [&] { cpu::relu_forward(n * 128, h1.data(), hr.data()); });
  // The per-step values the ops read from (here host) memory.
  const uint64_t zero_u64 = 0;
  const int64_t zero_i64 = 0;
  const float one_f32 = 1.0f;
  b.op("dropout forward", 0, [&] { cpu::dropout_forward(n * 128, hr.data(), 0.25f, engine::PhiloxStream{0, 1}, &zero_u64, 0, hd.data(), keep.data()); });
  b.op("fc2 forward", 2.0 * n * 128 * 10 * 1e-9, [&] { cpu::linear_forward(f2, engine::Precision::Fp32, BatchSplit{chunks, bounds}, hd.data(), wf2.data(), bf2.data(), logits.data()); });
  b.op("cross-entropy", 0, [&] { cpu::cross_entropy(n, n, classes, logits.data(), labels.data(), &one_f32, &zero_i64, dlogits.data(), loss.data(), correct.data()); });
  // ---- backward
  b.op("fc2 backward", 4.0 * n * 128 * 10 * 1e-9, [&] { cpu::linear_backward_chunks(f2, engine::Precision::Fp32, chunks, bounds, hd.data(), wf2.data(), dlogits.data(), dh.data(), dwf2.data(), dbf2.data()); });
  b.op("dropout backward", 0, [&] { cpu::dropout_backward(n * 128, g_h.data(), keep.data(), 0.25f, dh2.data()); });
  b.op("relu3 backward", 0, [&] { cpu::relu_backward(n * 128, hr.data(), g_h.data(), dh3.data()); });
  b.op("fc1 backward", 4.0 * n * 3136 * 128 * 1e-9, [&] { cpu::linear_backward_chunks(f1, engine::Precision::Fp32, chunks, bounds, r2.data(), wf1.data(), g_h.data(), dq2.data(), dwf1.data(), dbf1.data()); });
  b.op("relu2 backward", 0, [&] { cpu::relu_backward(n * 3136, r2.data(), g_q2.data(), dq2b.data()); });
  b.op("pool2 backward", 0, [&] { cpu::maxpool2x2_backward(p2, g_q2.data(), am2.data(), dy2.data()); });
  b.op("bn2 backward", 0, [&] { bn_backward(bn2, y2, g_y2, g2, sm2, si2, dy2c, dg2, dbe2); });
  b.op("conv2 backward (dW, db, dx)", 2 * conv_gflop(c2), [&] { cpu::conv2d_backward_chunks(c2, engine::Precision::Fp32, chunks, bounds, r1.data(), w2.data(), g_y2.data(), dq1.data(), dw2.data(), db2.data()); });
  b.op("relu1 backward", 0, [&] { cpu::relu_backward(n * 32 * 196, r1.data(), g_q1.data(), dq1b.data()); });
  b.op("pool1 backward", 0, [&] { cpu::maxpool2x2_backward(p1, g_q1.data(), am1.data(), dy1.data()); });
  b.op("bn1 backward", 0, [&] { bn_backward(bn1, y1, g_y1, g1, sm1, si1, dy1c, dg1, dbe1); });
  b.op("conv1 backward (dW, db)", conv_gflop(c1), [&] { cpu::conv2d_backward_chunks(c1, engine::Precision::Fp32, chunks, bounds, x.data(), w1.data(), g_y1.data(), nullptr, dw1.data(), db1.data()); });
  // ---- AdamW over every parameter (10 tensors, 421,834 floats), or rank 0's 1/W of each
  const AdamHyper h;
  const AdamStepFactors sf{1e-3f, 0.5f, 0.99999f, 0.1f, 0.001f};
  std::vector<std::vector<float>*> params = {&w1, &b1, &g1, &be1, &w2, &b2, &g2, &be2, &wf1, &bf1, &wf2, &bf2};
  std::vector<std::vector<float>> grads, m, v;
  for (auto* p : params) grads.push_back(*p), m.emplace_back(p->size(), 0.0f), v.emplace_back(p->size(), 0.0f);
  b.op("adamw (all parameters)", 0, [&] {
    for (std::size_t i = 0; i < params.size(); ++i)
      cpu::adam_update(static_cast<int64_t>(params[i]->size() / ranks), params[i]->data(), grads[i].data(), m[i].data(), v[i].data(), h, &sf, nullptr, 0, nullptr);
  });
  // The same with the step digests (kernels/step_digest.h) fused in: what train.step_digests costs.
  std::vector<uint64_t> digest_sums(3 * params.size(), 0);
  b.op("adamw with step digests", 0, [&] {
    for (std::size_t i = 0; i < params.size(); ++i)
      cpu::adam_update(static_cast<int64_t>(params[i]->size() / ranks), params[i]->data(), grads[i].data(), m[i].data(), v[i].data(), h, &sf, nullptr, 0, digest_sums.data() + 3 * i);
  });

  // Not a part of the step's sum: it replaces the row above when digests are on.
  const Row with_digests = b.rows.back();
  b.rows.pop_back();
  double total = 0, flops = 0;
  for (const Row& r : b.rows) total += r.ms, flops += r.gflop;
  std::printf("kernel_bench: one training step, batch %d, %d chunks", global_batch, kTreeChunks);
  if (ranks > 1) std::printf(", rank 0 of %d (%d images, %d chunks)", ranks, n, chunks);
  std::printf("; cpu kernels %s, %d threads; median of %d runs\n", cpu::cpu_kernels_name(cpu::cpu_kernels()),
              omp_get_max_threads(), iters);
  std::printf("%-30s %9s %9s %7s\n", "op", "ms", "GFLOP/s", "share");
  for (const Row& r : b.rows) {
    char rate[32] = "";
    if (r.gflop > 0) std::snprintf(rate, sizeof rate, "%.1f", r.gflop / (r.ms * 1e-3));
    std::printf("%-30s %9.3f %9s %6.1f%%\n", r.name.c_str(), r.ms, rate, 100.0 * r.ms / total);
  }
  const int steps = (train_images + global_batch - 1) / global_batch;
  std::printf("%-30s %9.3f %9.1f\n", "step (sum of the ops)", total, flops / (total * 1e-3));
  std::printf("epoch of %d images (%d steps), ops only: %.2f s\n", train_images, steps, total * steps * 1e-3);
  const double adam_ms = b.rows.back().ms;
  std::printf("%-30s %9.3f  (+%.3f ms, %+.2f%% of the step: train.step_digests)\n", with_digests.name.c_str(),
              with_digests.ms, with_digests.ms - adam_ms, 100.0 * (with_digests.ms - adam_ms) / total);
  return 0;
}
