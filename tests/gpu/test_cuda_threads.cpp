// The CUDA backend's shared state (workspace, 16-bit scratch, conv plan cache, cuBLAS and
// cuDNN handles: kernels/cuda/context.h, "Threading") used from several host threads
// at once: two Classifiers, a Classifier and a Trainer, and raw ops that grow the
// workspace and the scratch meanwhile, each giving the bits of the same work run
// alone. Also: the persistent buffers never move or shrink once handed out, and
// growing one during graph capture throws. Exits 77 (skipped) where no GPU is present.
#include <doctest/doctest.h>

#if defined(ENGINE_WITH_CUDA)  // a CPU-only build compiles only the skip below
#include <cuda_runtime_api.h>
#endif

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cli_util.h"
#include "gpu/device_test_util.h"  // skips (exit 77) without a GPU
#include "run_dir_util.h"
#include "engine/train/config.h"
#include "engine/core/device.h"
#include "engine/train/inference.h"
#include "engine/train/model_factory.h"
#include "engine/train/trainer.h"
#if defined(ENGINE_WITH_CUDA)
#include "kernels/cuda/context.h"
#endif
#include "kernels/cuda_runtime.h"
#include "kernels/ops.h"

using namespace test_util;
namespace gpu = engine::kernels::cuda;
using engine::kernels::BatchSplit;

#if defined(ENGINE_WITH_CUDA)
namespace {

std::string cpu_fixture() { return source_dir() + "/tests/data/checkpoint_v2_cpu_mid_epoch.h5"; }

std::vector<uint8_t> random_images(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> v(static_cast<std::size_t>(n) * 784);
  for (uint8_t& b : v) b = static_cast<uint8_t>(byte(rng));
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host)
      : count_(host.size()), ptr_(static_cast<T*>(gpu::alloc(count_ * sizeof(T)))) {
    gpu::copy(ptr_, host.data(), count_ * sizeof(T), gpu::CopyKind::HostToDevice);
  }
  explicit DeviceArray(std::size_t count) : count_(count), ptr_(static_cast<T*>(gpu::alloc(count * sizeof(T)))) {}
  ~DeviceArray() { gpu::free(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() { return ptr_; }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    gpu::copy(host.data(), ptr_, count_ * sizeof(T), gpu::CopyKind::DeviceToHost);
    return host;
  }

 private:
  std::size_t count_;
  T* ptr_;
};

// Raw ops that use every piece of shared state, at shapes (scale 1..4) that need ever
// larger workspace and scratch: batch-norm statistics and gradients and conv bias
// gradients (workspace), fp32 and fp16 convolutions (plan cache, cuDNN, workspace,
// scratch), fp16 and fp32 GEMMs (cuBLAS, scratch). Returns every output, downloaded.
std::vector<std::vector<float>> op_mix(int scale) {
  using engine::kernels::BatchNormShape;
  using engine::kernels::ConvShape;
  using engine::kernels::LinearShape;
  std::mt19937 rng(static_cast<uint32_t>(1000 + scale));
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  auto make = [&](std::size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
  };
  std::vector<std::vector<float>> out;
  const BatchNormShape bn{32 * scale, 64, 196};
  const std::size_t bn_total = static_cast<std::size_t>(bn.n) * bn.c * bn.hw;
  DeviceArray<float> x(make(bn_total)), dy(make(bn_total)), g(make(64)), b(make(64)), rm(make(64)),
      rv(std::vector<float>(64, 1.0f)), sm(64), si(64), y(bn_total), dx(bn_total), dg(64), db(64);
  gpu::batchnorm_forward_train(bn, BatchSplit{}, x.get(), g.get(), b.get(), 1e-5f, 0.1f, rm.get(), rv.get(), sm.get(), si.get(),
                               y.get());
  gpu::batchnorm_backward(bn, BatchSplit{}, x.get(), dy.get(), g.get(), sm.get(), si.get(), dx.get(), dg.get(), db.get());
  for (auto* a : {&y, &dx, &dg, &db, &sm, &si}) out.push_back(a->download());

  ConvShape cs;
  cs.n = 16 * scale, cs.c = 32, cs.h = 14, cs.w = 14, cs.k = 64, cs.r = 3, cs.s = 3, cs.pad = 1;
  const std::size_t nx = static_cast<std::size_t>(cs.n) * cs.c * cs.h * cs.w, nw = 64 * 32 * 9;
  const std::size_t ny = static_cast<std::size_t>(cs.n) * cs.k * cs.out_h() * cs.out_w();
  DeviceArray<float> cx(make(nx)), cw(make(nw)), cb(make(64)), cy(ny), cdy(make(ny)), cdx(nx), cdw(nw), cdb(64),
      hy(ny), hdx(nx), hdw(nw), hdb(64);
  gpu::conv2d_forward(cs, engine::Precision::Fp32, BatchSplit{}, cx.get(), cw.get(), cb.get(), cy.get());
  gpu::conv2d_backward(cs, engine::Precision::Fp32, cx.get(), cw.get(), cdy.get(), cdx.get(), cdw.get(), cdb.get());
  gpu::conv2d_forward(cs, engine::Precision::Fp16, BatchSplit{}, cx.get(), cw.get(), cb.get(), hy.get());
  gpu::conv2d_backward(cs, engine::Precision::Fp16, cx.get(), cw.get(), cdy.get(), hdx.get(), hdw.get(), hdb.get());
  for (auto* a : {&cy, &cdx, &cdw, &cdb, &hy, &hdx, &hdw, &hdb}) out.push_back(a->download());

  const LinearShape ls{64 * scale, 3136, 128};
  const std::size_t lx = static_cast<std::size_t>(ls.n) * ls.in, lw = static_cast<std::size_t>(ls.out) * ls.in;
  const std::size_t ly = static_cast<std::size_t>(ls.n) * ls.out;
  DeviceArray<float> ix(make(lx)), iw(make(lw)), ib(make(128)), iy(ly), idy(make(ly)), idx(lx), idw(lw), idb(128),
      fy(ly), fdx(lx), fdw(lw), fdb(128);
  gpu::linear_forward(ls, engine::Precision::Fp32, BatchSplit{}, ix.get(), iw.get(), ib.get(), iy.get());
  gpu::linear_backward(ls, engine::Precision::Fp32, ix.get(), iw.get(), idy.get(), idx.get(), idw.get(), idb.get());
  gpu::linear_forward(ls, engine::Precision::Fp16, BatchSplit{}, ix.get(), iw.get(), ib.get(), fy.get());
  gpu::linear_backward(ls, engine::Precision::Fp16, ix.get(), iw.get(), idy.get(), fdx.get(), fdw.get(), fdb.get());
  for (auto* a : {&iy, &idx, &idw, &idb, &fy, &fdx, &fdw, &fdb}) out.push_back(a->download());
  return out;
}

engine::Config small_gpu_config(const std::string& dir) { return small_run_config("cuda", dir, 1024, 1); }

}  // namespace

TEST_CASE("two CUDA classifiers and raw ops in three threads give the bits of each run alone") {
  const engine::Device cuda = engine::Device::cuda(0);
  const engine::Classifier a(cpu_fixture(), cuda, engine::make_model);
  const engine::Classifier b(cpu_fixture(), cuda, engine::make_model);
  const int64_t n = 700;  // 10 full batches of 64 and a ragged one of 60
  const std::vector<uint8_t> images_a = random_images(n, 1), images_b = random_images(n, 2);
  const engine::Predictions want_a = a.predict(images_a.data(), n, engine::Scores::Logits);
  const engine::Predictions want_b = b.predict(images_b.data(), n, engine::Scores::Logits);
  std::vector<std::vector<std::vector<float>>> want_ops;
  for (int scale = 1; scale <= 4; ++scale) want_ops.push_back(op_mix(scale));

  std::atomic<int> mismatches_a{0}, mismatches_b{0}, mismatches_ops{0};
  std::atomic<int> errors{0};
  auto guarded = [&](auto body) {
    return [&errors, body] {
      try {
        body();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "thread failed: %s\n", e.what());
        ++errors;
      }
    };
  };
  std::thread ta(guarded([&] {
    for (int rep = 0; rep < 12; ++rep)
      if (!same_bits(a.predict(images_a.data(), n, engine::Scores::Logits).scores, want_a.scores)) ++mismatches_a;
  }));
  std::thread tb(guarded([&] {
    for (int rep = 0; rep < 12; ++rep)
      if (!same_bits(b.predict(images_b.data(), n, engine::Scores::Logits).scores, want_b.scores)) ++mismatches_b;
  }));
  std::thread tops(guarded([&] {
    for (int rep = 0; rep < 3; ++rep)
      for (int scale = 1; scale <= 4; ++scale) {
        const auto got = op_mix(scale);
        for (std::size_t i = 0; i < got.size(); ++i)
          if (!same_bits(got[i], want_ops[scale - 1][i])) ++mismatches_ops;
      }
  }));
  ta.join();
  tb.join();
  tops.join();
  CHECK(errors == 0);
  CHECK(mismatches_a == 0);
  CHECK(mismatches_b == 0);
  CHECK(mismatches_ops == 0);
}

TEST_CASE("a CUDA classifier and a CUDA trainer in two threads give the bits of each run alone") {
  if (!dataset_available()) {
    MESSAGE("Fashion-MNIST not found: skipped");
    return;
  }
  const engine::Device cuda = engine::Device::cuda(0);
  const std::string serial_dir = fresh_dir("cuda_threads_serial"), threaded_dir = fresh_dir("cuda_threads_both");
  {
    const engine::Config c = small_gpu_config(serial_dir);
    engine::Trainer t(c, cuda, engine::make_model(c));
    t.train_epoch();
    t.save_checkpoint(serial_dir + "/after.h5");
  }
  const engine::Classifier clf(cpu_fixture(), cuda, engine::make_model);
  const int64_t n = 512;
  const std::vector<uint8_t> images = random_images(n, 3);
  const engine::Predictions want = clf.predict(images.data(), n, engine::Scores::Logits);

  std::atomic<bool> training{true};
  std::atomic<int> predictions{0}, mismatches{0}, errors{0};
  std::thread classify([&] {
    try {
      while (training.load() || predictions.load() < 3) {
        if (!same_bits(clf.predict(images.data(), n, engine::Scores::Logits).scores, want.scores)) ++mismatches;
        ++predictions;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "classifier thread failed: %s\n", e.what());
      ++errors;
    }
  });
  try {
    const engine::Config c = small_gpu_config(threaded_dir);
    engine::Trainer t(c, cuda, engine::make_model(c));
    t.train_epoch();
    t.save_checkpoint(threaded_dir + "/after.h5");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer failed: %s\n", e.what());
    ++errors;
  }
  training = false;
  classify.join();
  CHECK(errors == 0);
  CHECK(mismatches == 0);
  MESSAGE(predictions.load() << " classifier calls ran alongside the training epoch");
  const RunResult d = run("diff \"" + serial_dir + "/after.h5\" \"" + threaded_dir + "/after.h5\"");
  INFO(d.output);
  CHECK(d.exit_code == 0);
}

TEST_CASE("persistent buffers: addresses stay valid, growth during graph capture throws") {
  gpu::Context& ctx = gpu::Context::get();
  {
    const gpu::SharedStateLock lock;
    void* small = ctx.workspace(1024);
    const std::size_t capacity = ctx.workspace_capacity();
    REQUIRE(capacity >= 1024);
    CHECK(ctx.workspace(capacity) == small);  // within the capacity: the same buffer
    void* grown = ctx.workspace(capacity + 1);
    CHECK(ctx.workspace_capacity() >= 2 * capacity);  // geometric growth
    CHECK(grown != small);
    // The old buffer is retired, not freed: its memory is still a live allocation.
    cudaPointerAttributes attributes{};
    CHECK(cudaPointerGetAttributes(&attributes, small) == cudaSuccess);
    CHECK(attributes.type == cudaMemoryTypeDevice);
  }
  // Inside a capture, a request within the capacity is served; one beyond it throws
  // and names the buffer, and the capture can still be ended cleanly.
  cudaStream_t stream = ctx.stream();
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  bool threw = false;
  std::string message;
  {
    const gpu::SharedStateLock lock;
    CHECK(ctx.capturing());
    CHECK(ctx.workspace(ctx.workspace_capacity()) != nullptr);
    try {
      (void)ctx.workspace(ctx.workspace_capacity() + 1);
    } catch (const std::logic_error& e) {
      threw = true;
      message = e.what();
    }
  }
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  if (graph) cudaGraphDestroy(graph);
  CHECK(threw);
  CHECK(message.find("workspace") != std::string::npos);
  CHECK(message.find("capture") != std::string::npos);
  CHECK_FALSE(ctx.capturing());
  gpu::synchronize();
}

TEST_CASE("CUDA error messages name the source file relative to the source root") {
  CHECK(std::string(gpu::source_relative("/home/build/engine/kernels/cuda/context.cpp")) ==
        "kernels/cuda/context.cpp");
  CHECK(std::string(gpu::source_relative("/a/kernels/b/kernels/cuda/x.cu")) == "kernels/cuda/x.cu");
  CHECK(std::string(gpu::source_relative("/tmp/elsewhere/file.cpp")) == "file.cpp");
  CHECK(std::string(gpu::source_relative("plain.cpp")) == "plain.cpp");
  // A real failure: an invalid device pointer copy reports a relative path.
  try {
    ENGINE_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL("no exception");
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find("(tests/") == std::string::npos);
    CHECK(what.find("test_cuda_threads.cpp:") != std::string::npos);
    CHECK(what.find(source_dir()) == std::string::npos);
  }
}
#endif  // ENGINE_WITH_CUDA
