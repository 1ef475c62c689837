// The CUDA chunked ops (kernels/cuda/chunk_ops.cu) and the GPU ranks built on them
// (docs/distributed.md, "GPU ranks"):
//  * every op against the reference chunked op (kernels/chunk_ops.inc, ref::) on ragged
//    shapes, empty chunks included. Tolerances: the conv/linear outputs and weight
//    gradients 1e-4 of the magnitude (cuDNN / cuBLAS pick the per-chunk algorithm, as in
//    test_cuda_ops.cpp); the double channel sums 1e-12 of the sum of magnitudes (both
//    sum in double, in different orders within a chunk); batch-norm outputs 1e-5;
//  * the decomposition, bitwise: for W = 2, 4, 8 each rank's share (its chunks, bounds
//    relative to its first sample) gathered and finished by tree_sum_parts equals the
//    whole batch by 8 chunks, and each rank's outputs equal the whole batch's rows;
//  * layers (conv, batch norm, ReLU, linear) at W = 2 by threads on one GPU (the staging
//    device exchange of Collective) give W = 1's outputs and gradients bit for bit.
// Exits with 77 (CTest: skipped) without a CUDA backend or a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/batch_chunks.h"
#include "engine/core/collective.h"
#include "engine/nn/layers.h"
#include "engine/core/rng.h"
#include "kernels/chunk_tree.h"
#include "kernels/cuda/settings.h"
#include "gpu/device_test_util.h"
#include "kernels/cuda_runtime.h"
#include "kernels/ops.h"
#include "support/random_data.h"
#include "support/thread_collective.h"

namespace gpu = engine::kernels::cuda;
namespace ref = engine::kernels::ref;
using engine::kernels::BatchNormShape;
using engine::kernels::ConvShape;
using engine::kernels::LinearShape;
using engine::kTreeChunks;
using engine::kernels::tree_chunk_begin;
using test_support::uniform;

using gpu_test::DeviceArray;

namespace {

std::vector<int> whole_bounds(int n) {
  std::vector<int> b(kTreeChunks + 1);
  for (int c = 0; c <= kTreeChunks; ++c) b[c] = tree_chunk_begin(n, c);
  return b;
}

// max |a - b| <= rel * scale, scale = max(1, max |b|) unless given.
template <typename T>
void check_close(const std::vector<T>& a, const std::vector<T>& b, double rel, const char* what, double scale = -1) {
  REQUIRE(a.size() == b.size());
  if (scale < 0) {
    scale = 1.0;
    for (T v : b) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  }
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  INFO(what << ": max difference " << worst << ", allowed " << rel * scale);
  CHECK(worst <= rel * scale);
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The reference's chunked bias gradient rounds each chunk's double sum to float (the
// whole-batch op's float db, kernels/ref) before the tree; CUDA keeps doubles. So they
// differ by at most u = 2^-24 times the sum of the chunks' |sums| <= u * sum |dy|; twice
// that for the double sums and the tree.
constexpr double kChunkDbRel = 2.0 * 0x1p-24;

double sum_abs(const std::vector<float>& v) {
  double s = 0.0;
  for (float x : v) s += std::fabs(static_cast<double>(x));
  return s;
}

}  // namespace

TEST_CASE("CUDA chunked conv and linear ops match the reference chunked ops") {
  std::mt19937 g(7);
  for (int n : {13, 5}) {  // 5 samples: three empty chunks
    CAPTURE(n);
    const std::vector<int> b = whole_bounds(n);
    ConvShape s{n, 3, 8, 8, 4, 3, 3, 1};
    const std::size_t xn = static_cast<std::size_t>(n) * 3 * 64, yn = static_cast<std::size_t>(n) * 4 * 64;
    const std::vector<float> x = uniform(xn, g), w = uniform(4 * 3 * 9, g), bias = uniform(4, g), dy = uniform(yn, g);
    std::vector<float> y_ref(yn), dx_ref(xn), dw_ref(w.size());
    std::vector<double> db_ref(4);
    ref::conv2d_forward_chunks(s, kTreeChunks, b.data(), x.data(), w.data(), bias.data(), y_ref.data());
    ref::conv2d_backward_chunks(s, kTreeChunks, b.data(), x.data(), w.data(), dy.data(), dx_ref.data(),
                                dw_ref.data(), db_ref.data());
    DeviceArray<float> dx_(x), dw_(w), dbias(bias), ddy(dy), dyo(yn), ddx(xn), ddw(w.size());
    DeviceArray<double> ddb(4);
    gpu::conv2d_forward_chunks(s, kTreeChunks, b.data(), dx_.get(), dw_.get(), dbias.get(), dyo.get());
    gpu::conv2d_backward_chunks(s, kTreeChunks, b.data(), dx_.get(), dw_.get(), ddy.get(), ddx.get(), ddw.get(),
                                ddb.get());
    check_close(dyo.download(), y_ref, 1e-4, "conv y");
    check_close(ddx.download(), dx_ref, 1e-4, "conv dx");
    check_close(ddw.download(), dw_ref, 1e-4, "conv dw");
    check_close(ddb.download(), db_ref, kChunkDbRel, "conv db", sum_abs(dy));
    // Deterministic: the same bits again.
    const std::vector<float> dw_first = ddw.download();
    gpu::conv2d_backward_chunks(s, kTreeChunks, b.data(), dx_.get(), dw_.get(), ddy.get(), ddx.get(), ddw.get(),
                                ddb.get());
    CHECK(same_bits(ddw.download(), dw_first));

    LinearShape ls{n, 20, 7};
    const std::vector<float> lx = uniform(static_cast<std::size_t>(n) * 20, g), lw = uniform(140, g),
                             lb = uniform(7, g), ldy = uniform(static_cast<std::size_t>(n) * 7, g);
    std::vector<float> ly_ref(ldy.size()), ldx_ref(lx.size()), ldw_ref(lw.size());
    std::vector<double> ldb_ref(7);
    ref::linear_forward_chunks(ls, kTreeChunks, b.data(), lx.data(), lw.data(), lb.data(), ly_ref.data());
    ref::linear_backward_chunks(ls, kTreeChunks, b.data(), lx.data(), lw.data(), ldy.data(), ldx_ref.data(),
                                ldw_ref.data(), ldb_ref.data());
    DeviceArray<float> d_lx(lx), d_lw(lw), d_lb(lb), d_ldy(ldy), d_ly(ldy.size()), d_ldx(lx.size()), d_ldw(lw.size());
    DeviceArray<double> d_ldb(7);
    gpu::linear_forward_chunks(ls, kTreeChunks, b.data(), d_lx.get(), d_lw.get(), d_lb.get(), d_ly.get());
    gpu::linear_backward_chunks(ls, kTreeChunks, b.data(), d_lx.get(), d_lw.get(), d_ldy.get(), d_ldx.get(),
                                d_ldw.get(), d_ldb.get());
    check_close(d_ly.download(), ly_ref, 1e-4, "linear y");
    check_close(d_ldx.download(), ldx_ref, 1e-4, "linear dx");
    check_close(d_ldw.download(), ldw_ref, 1e-4, "linear dw");
    check_close(d_ldb.download(), ldb_ref, kChunkDbRel, "linear db", sum_abs(ldy));
  }
}

TEST_CASE("CUDA chunked batch-norm ops match the reference chunked ops") {
  std::mt19937 g(11);
  for (int n : {13, 5}) {
    CAPTURE(n);
    const std::vector<int> b = whole_bounds(n);
    BatchNormShape s{n, 5, 36};
    const std::size_t total = static_cast<std::size_t>(n) * 5 * 36;
    const std::vector<float> x = uniform(total, g, -2.0f, 3.0f), dy = uniform(total, g), gamma = uniform(5, g, 0.5f, 1.5f),
                             beta = uniform(5, g), mean = uniform(5, g);
    std::vector<double> sum_ref(5), sq_ref(5), sdy_ref(5), sxc_ref(5);
    ref::batchnorm_chunk_sums(s, kTreeChunks, b.data(), x.data(), sum_ref.data());
    ref::batchnorm_chunk_centered_squares(s, kTreeChunks, b.data(), x.data(), mean.data(), sq_ref.data());
    ref::batchnorm_backward_chunk_sums(s, kTreeChunks, b.data(), x.data(), dy.data(), mean.data(), sdy_ref.data(),
                                       sxc_ref.data());
    DeviceArray<float> dx(x), ddy(dy), dgamma(gamma), dbeta(beta), dmean(mean);
    DeviceArray<double> sum(5), sq(5), sdy(5), sxc(5);
    gpu::batchnorm_chunk_sums(s, kTreeChunks, b.data(), dx.get(), sum.get());
    gpu::batchnorm_chunk_centered_squares(s, kTreeChunks, b.data(), dx.get(), dmean.get(), sq.get());
    gpu::batchnorm_backward_chunk_sums(s, kTreeChunks, b.data(), dx.get(), ddy.get(), dmean.get(), sdy.get(), sxc.get());
    const double scale = 16.0 * static_cast<double>(total);  // |x| <= 3, |x - mean| <= 4: sums of magnitudes
    check_close(sum.download(), sum_ref, 1e-12, "sum x", scale);
    check_close(sq.download(), sq_ref, 1e-12, "sum (x - mean)^2", scale);
    check_close(sdy.download(), sdy_ref, 1e-12, "sum dy", scale);
    check_close(sxc.download(), sxc_ref, 1e-12, "sum dy (x - mean)", scale);

    // The fused ops.
    std::vector<float> rm_ref(5, 0.1f), rv_ref(5, 0.9f), sm_ref(5), si_ref(5), y_ref(total), dx_ref(total),
        dg_ref(5), db_ref(5);
    DeviceArray<float> rm(rm_ref), rv(rv_ref), sm(5), si(5), y(total), dxo(total), dg(5), db(5);
    ref::batchnorm_forward_train_chunks(s, kTreeChunks, b.data(), x.data(), gamma.data(), beta.data(), 1e-5f, 0.1f,
                                        rm_ref.data(), rv_ref.data(), sm_ref.data(), si_ref.data(), y_ref.data());
    gpu::batchnorm_forward_train_chunks(s, kTreeChunks, b.data(), dx.get(), dgamma.get(), dbeta.get(), 1e-5f, 0.1f,
                                        rm.get(), rv.get(), sm.get(), si.get(), y.get());
    check_close(y.download(), y_ref, 1e-5, "bn y");
    check_close(rm.download(), rm_ref, 1e-6, "running mean");
    check_close(rv.download(), rv_ref, 1e-6, "running var");
    check_close(sm.download(), sm_ref, 1e-6, "save mean");
    check_close(si.download(), si_ref, 1e-6, "save invstd");
    ref::batchnorm_backward_chunks(s, kTreeChunks, b.data(), x.data(), dy.data(), gamma.data(), sm_ref.data(),
                                   si_ref.data(), dx_ref.data(), dg_ref.data(), db_ref.data());
    gpu::batchnorm_backward_chunks(s, kTreeChunks, b.data(), dx.get(), ddy.get(), dgamma.get(), sm.get(), si.get(),
                                   dxo.get(), dg.get(), db.get());
    check_close(dxo.download(), dx_ref, 1e-5, "bn dx");
    check_close(dg.download(), dg_ref, 1e-5, "bn dgamma");
    check_close(db.download(), db_ref, 1e-5, "bn dbeta");
  }
}

TEST_CASE("CUDA cross_entropy normalises by the whole batch") {
  std::mt19937 g(3);
  const int n = 6, total = 24, classes = 10;
  const std::vector<float> logits = uniform(static_cast<std::size_t>(n) * classes, g, -3.0f, 3.0f);
  std::vector<int32_t> labels(n);
  for (int i = 0; i < n; ++i) labels[i] = (i * 7) % classes;
  std::vector<float> d_ref(logits.size()), l_ref(n), c_ref(n);
  ref::cross_entropy(n, total, classes, logits.data(), labels.data(), 2.0f, d_ref.data(), l_ref.data(), c_ref.data());
  DeviceArray<float> dl(logits), dd(logits.size()), ll(n), cc(n);
  DeviceArray<int32_t> lab(labels);
  gpu::cross_entropy(n, total, classes, dl.get(), lab.get(), 2.0f, dd.get(), ll.get(), cc.get());
  check_close(dd.download(), d_ref, 1e-5, "dlogits");
  check_close(ll.download(), l_ref, 1e-5, "loss");
  CHECK(same_bits(cc.download(), c_ref));
}

// Rank r of W: its chunks' bounds relative to its first sample (as BatchChunks gives).
struct Share {
  int begin, count;
  std::vector<int> bounds;
};
Share share_of(int n, int world, int rank) {
  const int per = kTreeChunks / world, first = per * rank;
  Share s{tree_chunk_begin(n, first), 0, {}};
  for (int c = 0; c <= per; ++c) s.bounds.push_back(tree_chunk_begin(n, first + c) - s.begin);
  s.count = s.bounds.back();
  return s;
}

TEST_CASE("CUDA chunked ops: rank shares plus the top of the tree give the whole batch, bit for bit") {
  std::mt19937 g(5);
  const int n = 29;
  ConvShape s{n, 2, 6, 6, 3, 3, 3, 1};
  const int64_t in = 2 * 36, out = 3 * 36, wn = 3 * 2 * 9;
  const std::vector<float> x = uniform(n * in, g), w = uniform(wn, g), bias = uniform(3, g), dy = uniform(n * out, g);
  DeviceArray<float> dx(x), dw(w), dbias(bias), ddy(dy), y_whole(n * out), dw_whole(wn);
  DeviceArray<double> db_whole(3), bn_whole(2);
  const std::vector<int> b = whole_bounds(n);
  gpu::conv2d_forward_chunks(s, kTreeChunks, b.data(), dx.get(), dw.get(), dbias.get(), y_whole.get());
  gpu::conv2d_backward_chunks(s, kTreeChunks, b.data(), dx.get(), dw.get(), ddy.get(), nullptr, dw_whole.get(),
                              db_whole.get());
  BatchNormShape bs{n, 2, 36};
  gpu::batchnorm_chunk_sums(bs, kTreeChunks, b.data(), dx.get(), bn_whole.get());
  const std::vector<float> y_all = y_whole.download();
  for (int world : {2, 4, 8}) {
    CAPTURE(world);
    DeviceArray<float> dw_parts(wn * world);
    DeviceArray<double> db_parts(3 * world), bn_parts(2 * world);
    for (int r = 0; r < world; ++r) {
      const Share sh = share_of(n, world, r);
      ConvShape part = s;
      part.n = sh.count;
      DeviceArray<float> y_part(std::max<int64_t>(1, sh.count * out));
      const int chunks = kTreeChunks / world;
      gpu::conv2d_forward_chunks(part, chunks, sh.bounds.data(), dx.get() + sh.begin * in, dw.get(), dbias.get(),
                                 y_part.get());
      const std::vector<float> yp = y_part.download();
      CHECK(std::memcmp(yp.data(), y_all.data() + sh.begin * out, sizeof(float) * sh.count * out) == 0);
      gpu::conv2d_backward_chunks(part, chunks, sh.bounds.data(), dx.get() + sh.begin * in, dw.get(),
                                  ddy.get() + sh.begin * out, nullptr, dw_parts.get() + r * wn, db_parts.get() + r * 3);
      BatchNormShape bpart{sh.count, 2, 36};
      gpu::batchnorm_chunk_sums(bpart, chunks, sh.bounds.data(), dx.get() + sh.begin * in, bn_parts.get() + r * 2);
    }
    gpu::tree_sum_parts(world, wn, dw_parts.get(), dw_parts.get());
    gpu::tree_sum_parts_f64(world, 3, db_parts.get(), db_parts.get());
    gpu::tree_sum_parts_f64(world, 2, bn_parts.get(), bn_parts.get());
    const std::vector<float> dwp = dw_parts.download();
    const std::vector<double> dbp = db_parts.download(), bnp = bn_parts.download();
    CHECK(same_bits(std::vector<float>(dwp.begin(), dwp.begin() + wn), dw_whole.download()));
    CHECK(same_bits(std::vector<double>(dbp.begin(), dbp.begin() + 3), db_whole.download()));
    CHECK(same_bits(std::vector<double>(bnp.begin(), bnp.begin() + 2), bn_whole.download()));
  }
}

// ---- Layers at W = 2 by threads on one GPU ---------------------------------------------

namespace {

// conv -> batch norm -> ReLU -> flatten -> linear on this rank's share of a batch; the
// outputs of its samples and every gradient, on the host.
struct LayerRun {
  std::vector<float> logits;
  std::vector<std::vector<float>> grads;
};
LayerRun run_layers(const std::vector<float>& batch, int n, engine::Collective* comm) {
  using namespace engine;
  Conv2d conv("conv", 1, 4, 3, 1);
  BatchNorm2d bn("bn", 4);
  ReLU relu("relu");
  Flatten flat("flat");
  Linear fc("fc", 4 * 8 * 8, 10);
  Rng init(42);
  conv.reset_parameters(init);
  fc.reset_parameters(init);
  const Device d = Device::cuda(0);
  conv.to(d);
  bn.to(d);
  fc.to(d);
  const BatchChunks plan(n, comm);
  std::vector<Layer*> layers{&conv, &bn, &relu, &flat, &fc};
  for (Layer* l : layers) l->set_batch_chunks(&plan);
  const int local = plan.local_count();
  std::vector<float> mine(batch.begin() + plan.local_begin() * 64, batch.begin() + (plan.local_begin() + local) * 64);
  Tensor x = Tensor::from_vector({local, 1, 8, 8}, mine).to(d);
  Rng rng(1);
  for (Layer* l : layers) x = l->forward(x, Mode::Train, rng);
  LayerRun out;
  out.logits = x.to(Device::cpu()).to_vector();
  Tensor g = x;  // d(sum of logits) / d logits = 1: a fixed upstream gradient
  g = Tensor::from_vector(x.shape(), std::vector<float>(static_cast<std::size_t>(x.numel()), 1.0f)).to(d);
  for (int i = static_cast<int>(layers.size()) - 1; i >= 0; --i)
    g = layers[i]->backward(g, i == 0 ? InputGrad::NotNeeded : InputGrad::Needed);
  for (Layer* l : layers)
    for (Parameter* p : l->parameters()) out.grads.push_back(p->grad.to(Device::cpu()).to_vector());
  for (Layer* l : layers) l->set_batch_chunks(nullptr);
  return out;
}

}  // namespace

TEST_CASE("CUDA layers at W = 2 by threads on one GPU give the bits of W = 1") {
  gpu::set_batch_chunks(true);  // the chunked path (off by default until it has run on a GPU)
  std::mt19937 g(9);
  const int n = 22;
  const std::vector<float> batch = uniform(static_cast<std::size_t>(n) * 64, g);
  const LayerRun one = run_layers(batch, n, nullptr);
  std::vector<LayerRun> runs(2);
  test_support::run_ranks(2, [&](int r, engine::Collective& c) { runs[r] = run_layers(batch, n, &c); });
  std::vector<float> joined = runs[0].logits;
  joined.insert(joined.end(), runs[1].logits.begin(), runs[1].logits.end());
  CHECK(same_bits(joined, one.logits));
  for (int r = 0; r < 2; ++r) {
    REQUIRE(runs[r].grads.size() == one.grads.size());
    for (std::size_t i = 0; i < one.grads.size(); ++i) {
      CAPTURE(r);
      CAPTURE(i);
      CHECK(same_bits(runs[r].grads[i], one.grads[i]));
    }
  }
}

namespace {
// Rank 0 of 2 that is never asked to exchange (the layer refuses before any exchange).
class IdleTwoRanks final : public engine::Collective {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "idle"; }
  void allgather(const void*, std::size_t, void*) override { throw std::logic_error("no exchange expected"); }
  void broadcast(void*, std::size_t, int) override { throw std::logic_error("no exchange expected"); }
};
}  // namespace

TEST_CASE("cuda.batch_chunks=false is refused with several ranks, and used in one process") {
  using namespace engine;
  Conv2d conv("conv1", 1, 2, 3, 1);
  Rng init(1);
  conv.reset_parameters(init);
  conv.to(Device::cuda(0));
  Tensor x = Tensor::zeros({4, 1, 8, 8}, DType::F32, Device::cuda(0));
  IdleTwoRanks two;
  const BatchChunks plan(8, &two);  // rank 0 of 2 holds 4 of the 8 samples
  conv.set_batch_chunks(&plan);
  Rng rng(2);
  gpu::set_batch_chunks(false);
  std::string message;
  try {
    conv.forward(x, Mode::Train, rng);
  } catch (const std::invalid_argument& e) {
    message = e.what();
  }
  CHECK(message == "conv1: cuda.batch_chunks=false computes whole batches, which needs one process; this run has 2 "
                   "ranks (set cuda.batch_chunks=true)");
  const BatchChunks one(4);
  conv.set_batch_chunks(&one);
  CHECK_NOTHROW(conv.forward(x, Mode::Train, rng));
  gpu::set_batch_chunks(false);  // the default
  conv.set_batch_chunks(nullptr);
}
