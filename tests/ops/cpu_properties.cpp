// Properties of the cpu path itself, not comparisons with ref:: (they have no cuda
// counterpart): Philox known answers, thread-count independence of the fast kernels,
// copy_bypassing_cache, the batch-norm channel group.
#include <omp.h>

#include "engine/kernels/philox.h"
#include "kernels/cpu/bulk_copy.h"
#include "kernels/cpu/scratch.h"
#include "ops/harness.h"

using namespace ops_test;
namespace cpu = engine::kernels::cpu;

// ---------------------------------------------------------------------------------
// Philox4x32-10 (engine/kernels/philox.h)
// ---------------------------------------------------------------------------------
TEST_CASE("philox4x32_10 matches the Random123 known-answer vectors") {
  // Random123 tests/kat_vectors, the three "philox4x32 10" lines: ctr[4] key[2] -> out[4].
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& k : kats) {
    engine::Philox4x32 c{{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]}};
    const engine::Philox4x32 r = engine::philox4x32_10(c, k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) CHECK(r.v[i] == k.out[i]);
  }
}

TEST_CASE("philox_at lays out the stream as cuRAND does") {
  // Value j of (seed, subsequence) is word j % 4 of
  // philox({j/4 lo, j/4 hi, subsequence lo, subsequence hi}, {seed lo, seed hi}).
  const PhiloxStream streams[] = {{0, 0}, {42, 3}, {0x0123456789abcdefull, 0xfedcba9876543210ull}};
  const uint64_t positions[] = {0, 1, 2, 3, 4, 5, 7, 1000001, (1ull << 34) + 2, ~0ull};
  for (const PhiloxStream& s : streams)
    for (const uint64_t j : positions) {
      const uint64_t block = j / 4;
      engine::Philox4x32 c{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                            static_cast<uint32_t>(s.subsequence),
                            static_cast<uint32_t>(s.subsequence >> 32)}};
      const engine::Philox4x32 r = engine::philox4x32_10(c, static_cast<uint32_t>(s.seed),
                                                         static_cast<uint32_t>(s.seed >> 32));
      CHECK(engine::philox_at(s, j) == r.v[j % 4]);
    }
  // The first four outputs of (seed 0, subsequence 0) are the first KAT vector.
  CHECK(engine::philox_at({0, 0}, 0) == 0x6627e8d5u);
  CHECK(engine::philox_at({0, 0}, 3) == 0x9b00dbd8u);
}

TEST_CASE("philox_uniform gives 24-bit floats in [0, 1)") {
  CHECK(engine::philox_uniform(0u) == 0.0f);
  CHECK(engine::philox_uniform(0xffu) == 0.0f);  // the low 8 bits are dropped
  CHECK(engine::philox_uniform(0x100u) == 1.0f / 16777216.0f);
  CHECK(engine::philox_uniform(0xffffffffu) == 16777215.0f / 16777216.0f);
  CHECK(engine::philox_uniform(0xffffffffu) < 1.0f);
  CHECK(engine::philox_uniform(0x80000000u) == 0.5f);
}

// ---------------------------------------------------------------------------------
// Thread-count independence of the fast path
// ---------------------------------------------------------------------------------
namespace {
struct ThreadGuard {
  int saved = omp_get_max_threads();
  ~ThreadGuard() { omp_set_num_threads(saved); }
};
}  // namespace

namespace {
using Outputs = std::vector<std::vector<float>>;  // y, dx, dw, db

// Runs `op` with 1, 2 and 3 threads into fresh outputs of the given sizes: the bits of
// y, dx, dw and db must not depend on the thread count.
template <typename Op>
void check_bits_across_thread_counts(const std::string& what, const std::vector<std::size_t>& sizes, Op op) {
  const char* names[] = {" y", " dx", " dw", " db"};
  Outputs first;
  for (const int threads : {1, 2, 3}) {
    CAPTURE(threads);
    omp_set_num_threads(threads);
    Outputs out;
    for (std::size_t n : sizes) out.emplace_back(n);
    op(out);
    if (threads == 1) {
      first = out;
      continue;
    }
    for (std::size_t i = 0; i < out.size(); ++i) check_bits(what + names[i], out[i], first[i]);
  }
}
}  // namespace

CPU_CASE("conv2d, linear and batch norm give the same bits with 1, 2 and 3 threads", conv2d_forward, conv2d_backward, linear_forward, linear_backward, batchnorm_forward_train, batchnorm_backward) {
  ThreadGuard guard;
  std::mt19937 g(1201);
  const ConvShape conv_shapes[] = {{4, 32, 14, 14, 64, 3, 3, 1}, {13, 3, 10, 9, 8, 3, 3, 1},
                                   {1, 2, 5, 5, 3, 2, 3, 0}};
  for (const ConvShape& s : conv_shapes) {
    CAPTURE(conv_name(s));
    const std::size_t nx = static_cast<std::size_t>(s.n) * s.c * s.h * s.w;
    const std::size_t nw = static_cast<std::size_t>(s.k) * s.c * s.r * s.s;
    const std::size_t ny = static_cast<std::size_t>(s.n) * s.k * s.out_h() * s.out_w();
    const auto x = uniform(nx, g, -1.0f, 1.0f), w = uniform(nw, g, -0.2f, 0.2f),
               b = uniform(s.k, g, -0.2f, 0.2f), dy = uniform(ny, g, -1.0f, 1.0f);
    check_bits_across_thread_counts("conv", {ny, nx, nw, static_cast<std::size_t>(s.k)}, [&](Outputs& o) {
      cpu::conv2d_forward(s, engine::Precision::Fp32, BatchSplit{}, x.data(), w.data(), b.data(), o[0].data());
      cpu::conv2d_backward(s, engine::Precision::Fp32, x.data(), w.data(), dy.data(), o[1].data(), o[2].data(), o[3].data());
    });
  }
  const LinearShape lin_shapes[] = {{4, 3136, 128}, {13, 128, 10}, {64, 128, 10}, {3, 5, 7}};
  for (const LinearShape& s : lin_shapes) {
    CAPTURE(s.n);
    CAPTURE(s.in);
    CAPTURE(s.out);
    const std::size_t nx = static_cast<std::size_t>(s.n) * s.in, nw = static_cast<std::size_t>(s.out) * s.in,
                      ny = static_cast<std::size_t>(s.n) * s.out;
    const auto x = uniform(nx, g, -1.0f, 1.0f), w = uniform(nw, g, -0.1f, 0.1f),
               b = uniform(s.out, g, -0.1f, 0.1f), dy = uniform(ny, g, -1.0f, 1.0f);
    check_bits_across_thread_counts("linear", {ny, nx, nw, static_cast<std::size_t>(s.out)}, [&](Outputs& o) {
      cpu::linear_forward(s, engine::Precision::Fp32, BatchSplit{}, x.data(), w.data(), b.data(), o[0].data());
      cpu::linear_backward(s, engine::Precision::Fp32, x.data(), w.data(), dy.data(), o[1].data(), o[2].data(), o[3].data());
    });
  }
  // Batchnorm reduces inside one thread per channel: also thread-count independent.
  const BatchNormShape bs{13, 8, 49};
  const auto x = bn_input(bs, g);
  const auto gamma = uniform(bs.c, g, 0.5f, 1.5f), beta = uniform(bs.c, g, -1.0f, 1.0f),
             dy = uniform(x.size(), g, -1.0f, 1.0f);
  std::vector<float> y1, dx1, dg1;
  for (const int threads : {1, 2, 3}) {
    CAPTURE(threads);
    omp_set_num_threads(threads);
    std::vector<float> rm(bs.c, 0.0f), rv(bs.c, 1.0f), sm(bs.c), si(bs.c), y(x.size()), dx(x.size()),
        dg(bs.c), dbeta(bs.c);
    cpu::batchnorm_forward_train(bs, BatchSplit{}, x.data(), gamma.data(), beta.data(), 1e-5f, 0.1f, rm.data(),
                                 rv.data(), sm.data(), si.data(), y.data());
    cpu::batchnorm_backward(bs, BatchSplit{}, x.data(), dy.data(), gamma.data(), sm.data(), si.data(), dx.data(),
                            dg.data(), dbeta.data());
    if (threads == 1) {
      y1 = y, dx1 = dx, dg1 = dg;
      continue;
    }
    check_bits("bn y", y, y1);
    check_bits("bn dx", dx, dx1);
    check_bits("bn dgamma", dg, dg1);
  }
}

TEST_CASE("cpu copy_bypassing_cache copies every byte, at every alignment and size") {
  // Sizes around the streaming threshold and its 64-byte body, offsets that misalign the
  // destination and the source differently; the reference is a byte loop.
  std::mt19937 gen(7);
  const std::size_t threshold = engine::kernels::cpu::kStreamingMinBytes;
  std::vector<std::size_t> sizes{0, 1, 15, 64, 1000, threshold - 1, threshold, threshold + 1,
                                 threshold + 63, threshold + 65, 5'080'000 + 13};
  for (std::size_t bytes : sizes) {
    for (std::size_t dst_off : {0, 1, 8, 15}) {
      for (std::size_t src_off : {0, 3, 16}) {
        std::vector<unsigned char> src(bytes + 32), dst(bytes + 32, 0xA5), expect(dst);
        for (auto& b : src) b = static_cast<unsigned char>(gen());
        for (std::size_t i = 0; i < bytes; ++i) expect[dst_off + i] = src[src_off + i];
        engine::kernels::cpu::copy_bypassing_cache(dst.data() + dst_off, src.data() + src_off, bytes);
        INFO("bytes " << bytes << ", dst offset " << dst_off << ", src offset " << src_off);
        CHECK(dst == expect);  // the bytes outside [dst_off, dst_off + bytes) untouched too
      }
    }
  }
}

TEST_CASE("the cpu batch-norm channel group: 512 KiB of the inputs, at least one channel, at most all, whatever the threads") {
  // conv1 of a 2-rank step: 64 x 32 x 784 floats, 200,704 bytes per channel.
  const BatchNormShape conv1{64, 32, 784}, huge{1024, 8, 784}, tiny{2, 5, 3};
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    CAPTURE(threads);
    CHECK(cpu::batchnorm_channel_group(conv1, 1) == 2);
    CHECK(cpu::batchnorm_channel_group(conv1, 2) == 1);
    CHECK(cpu::batchnorm_channel_group(huge, 2) == 1);
    CHECK(cpu::batchnorm_channel_group(tiny, 2) == 5);  // a small layer: one exchange
  }
  omp_set_num_threads(2);
}

