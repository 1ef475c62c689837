// The backend-comparison harness of the op list (kernels/op_list.inc), in the manner of
// ggml's test-backend-ops: each op's cases are declared once (OP_CASE, below), and each
// case runs on every backend present (cpu under whichever forced CPU path the process
// runs, tests/kernels_forced_paths.sh; cuda when built with CUDA and a device is present),
// against ref::. tests/ops/test_ops.cpp asserts that every op of kernels::kOps has a case.
//
// One copy of the comparison helpers (check_close, check_bits, the tolerances derived
// from the summation order) and of the shape tables lives here.
//
// Tolerances (u = 2^-24, the float32 unit roundoff), cpu against ref:
//  - Exact ops (relu, maxpool values and argmax, dropout masks and outputs, gather_batch,
//    adam_update, unscale_check, batch-norm evaluation on cuda) must match bit for bit:
//    both backends run the same per-element function from kernels/elementwise.h or pure
//    data movement.
//  - GEMM-based ops (conv, linear): the reference accumulates in double and rounds once;
//    the fast path sums in float. For an output that is a sum of T terms t_j, the
//    rounding errors of float summation form a random walk whose standard deviation is
//    ~0.4 * u * sqrt(T) * ||t||_2. We allow  u * |ref| + 16 * u * sqrt(T) * ||t||_2
//    (gemm_tol), ~40 standard deviations, with ||t||_2^2 computed exactly by running the
//    reference op on the squared inputs. A missing, duplicated or misplaced term moves
//    the output by ~||t||_2 / sqrt(T), which is 1 / (16 u T) >= 300x the tolerance for
//    every T used here, so indexing bugs cannot hide inside it. The chunked forms add
//    one rounding per tree level: T = terms + chunks.
//  - Plain sums of T terms (bias gradients, batch-norm statistics and parameter
//    gradients): one float ulp plus 16 * u * sqrt(T) * sum|t| (sum_tol), again ~40
//    standard deviations, and below the smallest plausible bug (a 1/m vs 1/(m-1)
//    normaliser, relative 1/T) for every T used here. reduce_sum is specified as a
//    double accumulation: 1e-12 of the sum of magnitudes.
//  - Batch norm's fast path folds the normalisation into y = x * a + b in float: a few
//    roundings of |x a|, |mean a| and |beta| (8 u of their sum), plus the propagated
//    tolerances of its mean and 1/std; its backward likewise.
//  - cross_entropy: both sides compute in double; 4 u relative (plus 4 u of the largest
//    |logit| for the loss). softmax: one float ulp (each side's exp within ~1 ulp of
//    double).
// cuda against ref:
//  - bit for bit where the GPU evaluates the reference's per-element formula with the
//    same types (-fmad=false);
//  - our own reductions (batch-norm statistics and gradients, bias gradients,
//    reduce_sum): bounds derived from the summation order, about one ulp
//    (tests/gpu/reduction_bounds.h, checked on the CPU by tests/test_reduction_bounds.cpp);
//  - cuDNN convolutions and cuBLAS GEMMs: 1e-4 of the output's magnitude (the algorithm
//    and so its error is the library's choice); cross-entropy rel 1e-5;
//  - fp16 ops: 2e-3 sqrt(K) max|a| max|b| + 1e-3 |want| (+ 1e-3 max|bias|): rounding
//    x, w, dy to fp16 moves each product by at most ~2 * 2^-11 relative, random signs
//    over K terms; ~15 sigma, while a wrong layout is ~100x larger;
//  - bf16 ops: the fp16 bound scaled by the ratio of the unit roundoffs, 2^-8 / 2^-11 = 8
//    (1.6e-2 sqrt(K) max|a| max|b| + 8e-3 |want| + 8e-3 max|bias|), the same ~15 sigma;
//    a wrong layout is still ~12x larger. The bf16 reference against the fp32 reference
//    is held to the same bound on the CPU (tests/ops/cases_bf16.cpp);
//  - chunked ops: outputs and weight gradients 1e-4 of the magnitude, the double channel
//    sums 1e-12 of the sum of magnitudes, the bias-gradient tree 2 u sum|dy|, batch-norm
//    outputs 1e-5.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "gradcheck.h"
#include "kernels/chunk_tree.h"
#include "kernels/op_table.h"
#include "kernels/ops.h"

namespace ops_test {

namespace ref = engine::kernels::ref;
using engine::PhiloxStream;
using engine::Precision;
using engine::kernels::OpId;
using engine::kTreeChunks;
using engine::kernels::AdamHyper;
using engine::kernels::AdamFactorInputs;
using engine::kernels::AdamStepFactors;
using engine::kernels::LossScaleRule;
using engine::kernels::LossScaleState;
using engine::kernels::adam_factors_at;
using engine::kernels::loss_scale_factors;
using engine::kernels::BatchNormShape;
using engine::kernels::BatchSplit;
using engine::kernels::ConvShape;
using engine::kernels::LinearShape;
using engine::kernels::OpTable;
using engine::kernels::PoolShape;
using engine::kernels::WeightDecayMode;

constexpr double kU = 1.0 / 16777216.0;  // 2^-24
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- Backends ---------------------------------------------------------------------------

// A backend under test: its op table and where its memory lives.
struct Backend {
  const char* name;  // "cpu" or "cuda"
  bool cuda;
  const OpTable* ops;
  bool is_cpu() const { return !cuda; }
};

// The backends present in this process: cpu always; cuda when the build has CUDA and a
// device is present. Why cuda is absent (for the report), or "" when present.
const std::vector<Backend>& backends();
const std::string& cuda_absent_reason();

// The memory of one case on one backend: host copies on the cpu, device arrays on cuda.
// Outputs start poisoned (every byte 0xff: NaN floats and doubles, -1 ints), so an op
// that leaves an output unwritten shows up.
class Mem {
 public:
  explicit Mem(const Backend& b) : b_(b) {}
  ~Mem();
  Mem(const Mem&) = delete;
  Mem& operator=(const Mem&) = delete;

  template <class T>
  T* in(const std::vector<T>& host) {
    T* p = static_cast<T*>(alloc(host.size() * sizeof(T)));
    put(p, host);
    return p;
  }
  // One value in the backend's memory: what an op reads as a per-step value.
  template <class T>
  const T* value(const T& v) {
    return in(std::vector<T>{v});
  }
  template <class T>
  T* out(std::size_t n) {
    T* p = static_cast<T*>(alloc(n * sizeof(T)));
    std::vector<unsigned char> junk(n * sizeof(T), 0xff);
    write(p, junk.data(), junk.size());
    return p;
  }
  template <class T>
  void put(T* p, const std::vector<T>& host) {
    REQUIRE(size_of(p) == host.size() * sizeof(T));
    write(p, host.data(), host.size() * sizeof(T));
  }
  template <class T>
  std::vector<T> get(const T* p) const {
    std::vector<T> host(size_of(p) / sizeof(T));
    read(host.data(), p, host.size() * sizeof(T));
    return host;
  }
  // The poison pattern of an output of n elements, to check "left untouched".
  template <class T>
  static std::vector<T> poison(std::size_t n) {
    std::vector<T> v(n);
    std::memset(static_cast<void*>(v.data()), 0xff, n * sizeof(T));
    return v;
  }

 private:
  void* alloc(std::size_t bytes);
  std::size_t size_of(const void* p) const;
  void write(void* dst, const void* src, std::size_t bytes);
  void read(void* dst, const void* src, std::size_t bytes) const;
  struct Block {
    void* p;
    std::size_t bytes;
  };
  const Backend& b_;
  std::vector<Block> blocks_;
};

// ---- Registry -----------------------------------------------------------------------------

enum class Where { Every, CpuOnly, CudaOnly };

struct OpCase {
  std::string ops;  // the op names it checks, ", "-separated
  const char* what;
  Where where;
  Precision precision;  // what the case runs its ops in (OP_CASE_IN)
  void (*fn)(const Backend&);
};
std::vector<OpCase>& registry();
bool register_case(const char* ops, const char* what, Where where, Precision precision, void (*fn)(const Backend&));
// Whether backend b runs every op of a ", "-separated list in `precision` (its table
// has the op, and supports_op says it runs it in that precision).
bool runs_ops(const Backend& b, const char* ops, Precision precision);
// Runs a case on every backend present that runs all its ops in its precision; says
// which were not present.
void run_case(const char* ops, Where where, Precision precision, void (*fn)(const Backend&));
// (op, case, backend) checks run so far, for the closing count.
int& checks_run();

// Whether every name of a ", "-separated list is an op of kernels/op_list.inc (at compile
// time: a case naming an op that does not exist does not build).
constexpr bool is_op(std::string_view name) {
  for (const auto& op : engine::kernels::kOps)
    if (name == op.name) return true;
  return false;
}
constexpr bool all_ops(std::string_view list) {
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    std::string_view name = list.substr(0, comma);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    if (!is_op(name)) return false;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return true;
}

#define OPS_TEST_CAT2(a, b) a##b
#define OPS_TEST_CAT(a, b) OPS_TEST_CAT2(a, b)
#define OPS_TEST_CASE_IMPL(FN, WHERE, PREC, WHAT, ...)                                          \
  static_assert(::ops_test::all_ops(#__VA_ARGS__), "OP_CASE names an op not in op_list.inc"); \
  static void FN(const ::ops_test::Backend& b);                                               \
  static const bool OPS_TEST_CAT(FN, _registered) =                                           \
      ::ops_test::register_case(#__VA_ARGS__, WHAT, WHERE, PREC, &FN);                        \
  TEST_CASE(#__VA_ARGS__ ": " WHAT) { ::ops_test::run_case(#__VA_ARGS__, WHERE, PREC, &FN); } \
  static void FN(const ::ops_test::Backend& b)

// OP_CASE("what it checks", op, op...) { body using `b` (the backend) }: one case,
// run on every backend present that has these ops, compared with ref::, in fp32.
#define OP_CASE(WHAT, ...)                                                                         \
  OPS_TEST_CASE_IMPL(OPS_TEST_CAT(ops_case_, __LINE__), ::ops_test::Where::Every, ::engine::Precision::Fp32, \
                     WHAT, __VA_ARGS__)
// OP_CASE_IN(precision, "what", op, op...): the same in another precision of the ops'
// AnyPrecision form, on every backend that runs them in it (supports_op).
#define OP_CASE_IN(PREC, WHAT, ...) \
  OPS_TEST_CASE_IMPL(OPS_TEST_CAT(ops_case_, __LINE__), ::ops_test::Where::Every, PREC, WHAT, __VA_ARGS__)
// CPU_CASE: a property of the cpu path itself (thread counts, its summation order).
#define CPU_CASE(WHAT, ...)                                                                          \
  OPS_TEST_CASE_IMPL(OPS_TEST_CAT(ops_case_, __LINE__), ::ops_test::Where::CpuOnly, ::engine::Precision::Fp32, \
                     WHAT, __VA_ARGS__)
// CUDA_CASE: a comparison with ref:: that only the GPU's order needs (ragged slices of
// its reductions, sizes too slow for the cpu run); reported as not run without cuda.
#define CUDA_CASE(WHAT, ...)                                                                          \
  OPS_TEST_CASE_IMPL(OPS_TEST_CAT(ops_case_, __LINE__), ::ops_test::Where::CudaOnly, ::engine::Precision::Fp32, \
                     WHAT, __VA_ARGS__)

// ---- Random inputs ----------------------------------------------------------------------

inline std::vector<float> uniform(std::size_t n, std::mt19937& g, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}
// Values from a small set, so that maxima tie often.
inline std::vector<float> quantised(std::size_t n, std::mt19937& g, int levels) {
  std::uniform_int_distribution<int> d(0, levels - 1);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(d(g)) * 0.5f - 1.0f;
  return v;
}
// x[n, c, i] = mu_c + sigma_c * U(-1, 1): batch-norm input whose channels have different
// offsets and scales.
inline std::vector<float> bn_input(const BatchNormShape& s, std::mt19937& g) {
  std::uniform_real_distribution<float> mu(-3.0f, 3.0f), sigma(0.1f, 2.0f), u(-1.0f, 1.0f);
  std::vector<float> m(s.c), sd(s.c);
  for (int c = 0; c < s.c; ++c) {
    m[c] = mu(g);
    sd[c] = sigma(g);
  }
  std::vector<float> x(static_cast<std::size_t>(s.n) * s.c * s.hw);
  for (int n = 0; n < s.n; ++n)
    for (int c = 0; c < s.c; ++c)
      for (int i = 0; i < s.hw; ++i) x[(static_cast<std::size_t>(n) * s.c + c) * s.hw + i] = m[c] + sd[c] * u(g);
  return x;
}
inline std::vector<float> squared(const std::vector<float>& v) {
  std::vector<float> s(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) s[i] = v[i] * v[i];
  return s;
}
inline double magnitude(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}
inline double sum_abs(const std::vector<float>& v) {
  double s = 0.0;
  for (float x : v) s += std::fabs(static_cast<double>(x));
  return s;
}

// ---- Comparisons ------------------------------------------------------------------------

// |got - want| <= tol(i) for every element; NaN anywhere fails unless nan_matches_nan
// and both are NaN. Reports the number of failures and the first one. With
// KERNEL_TEST_VERBOSE set, prints the largest |diff| / tol (the margin left).
template <class T, class Tol>
void check_close(const std::string& what, const std::vector<T>& got, const std::vector<T>& want, Tol tol,
                 bool nan_matches_nan = false) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  double first_tol = 0.0, worst_ratio = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    if (nan_matches_nan && std::isnan(g) && std::isnan(w)) continue;
    if (g == w) continue;  // equal infinities too (inf - inf is NaN)
    const double err = std::fabs(g - w);
    const double t = tol(i);
    if (!(err <= t)) {
      if (bad++ == 0) {
        first = i;
        first_tol = t;
      }
    } else if (t > 0) {
      worst_ratio = std::max(worst_ratio, err / t);
    }
  }
  if (std::getenv("KERNEL_TEST_VERBOSE")) MESSAGE(what << ": max |diff|/tol over passing elements " << worst_ratio);
  if (bad == 0) return;
  std::ostringstream o;
  o.precision(9);
  o << what << ": " << bad << " of " << got.size() << " elements outside tolerance; first at [" << first
    << "] got " << got[first] << " want " << want[first] << " |diff| "
    << std::fabs(static_cast<double>(got[first]) - static_cast<double>(want[first])) << " tol " << first_tol;
  FAIL_CHECK(o.str());
}

// |got - want| <= abs + rel |want| (NaN matches NaN): the CUDA harnesses' form.
template <class T>
void check_rel(const std::string& what, const std::vector<T>& got, const std::vector<T>& want, double rel,
               double abs) {
  check_close(what, got, want, [&](std::size_t i) { return abs + rel * std::fabs(static_cast<double>(want[i])); },
              true);
}
// cuDNN convolutions and cuBLAS GEMMs: within 1e-4 of the output's largest magnitude.
inline void check_gemm_like(const std::string& what, const std::vector<float>& got, const std::vector<float>& want) {
  check_rel(what, got, want, 0.0, 1e-4 * std::max(1.0, magnitude(want)));
}

template <class T>
void check_bits(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      if (bad++ == 0) first = i;
    }
  if (bad == 0) return;
  std::ostringstream o;
  o.precision(9);
  o << what << ": " << bad << " of " << got.size() << " elements differ bitwise; first at [" << first << "] got "
    << +got[first] << " want " << +want[first];
  FAIL_CHECK(o.str());
}

// Tolerance of a float sum of `terms` products against the double reference.
inline double gemm_tol(double ref_value, double sum_sq, double terms) {
  return kU * std::fabs(ref_value) + 16.0 * kU * std::sqrt(terms) * std::sqrt(sum_sq) + 1e-30;
}
// Tolerance of a sum of `terms` values whose magnitudes add up to `sum_abs`,
// accumulated in float or double and rounded to float, against the double reference.
inline double sum_tol(double ref_value, double sum_abs_value, double terms) {
  return 2.0 * kU * std::fabs(ref_value) + 16.0 * kU * std::sqrt(terms) * sum_abs_value + 1e-37;
}

// The fp16 product bound (header): K terms of a*b whose operands were rounded to a format
// of unit roundoff `unit`; fp16's (2^-11) gives the constants, a coarser format scales them.
inline void check_rounded_operands(const std::string& what, const std::vector<float>& got,
                                   const std::vector<float>& want, int64_t k, double max_a, double max_b,
                                   double max_bias, double unit) {
  const double r = unit / 0x1p-11;
  const double abs = 2e-3 * r * std::sqrt(static_cast<double>(std::max<int64_t>(k, 1))) * max_a * max_b +
                     1e-3 * r * max_bias + 1e-30;
  check_rel(what, got, want, 1e-3 * r, abs);
}
inline void check_f16(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                      int64_t k, double max_a, double max_b, double max_bias) {
  check_rounded_operands(what, got, want, k, max_a, max_b, max_bias, 0x1p-11);
}
// bf16: 8 significant bits, unit roundoff 2^-8.
inline void check_bf16(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                       int64_t k, double max_a, double max_b, double max_bias) {
  check_rounded_operands(what, got, want, k, max_a, max_b, max_bias, 0x1p-8);
}

#define CHECK_GRAD(name, result)                                      \
  do {                                                                \
    const ::gradcheck::Result r_ = (result);                          \
    CHECK_MESSAGE(r_.ok(), ::gradcheck::describe(name, r_));          \
  } while (0)

// ---- Shapes -------------------------------------------------------------------------------

std::string conv_name(const ConvShape& s);

// The conv shapes, one table: the model's layers (conv1 and conv2 at several batches),
// batch 1/3/13 (more samples than the 8 batch chunks), odd sizes, pad 0 and pad wider
// than the kernel, non-square kernels and images, 1x1, a kernel as large as the image,
// fewer samples than chunks (empty chunks). `chunks`: also used for the chunked ops.
struct ConvCase {
  ConvShape s;
  bool chunks;
};
extern const ConvCase kConvShapes[];
extern const std::size_t kConvShapeCount;

// Linear shapes: the model's fc1/fc2, batch 1/3/13, a training batch, 1x1x1, ragged.
struct LinearCase {
  LinearShape s;
  bool chunks;
};
extern const LinearCase kLinearShapes[];
extern const std::size_t kLinearShapeCount;

// ---- Chunks ---------------------------------------------------------------------------------

// One rank's share of an n-sample batch: its chunks' bounds relative to its first sample.
struct Share {
  int first = 0, count = 0, chunks = kTreeChunks;
  std::vector<int> bounds;
};
Share share(int n, int rank, int world);
inline Share whole(int n) { return share(n, 0, 1); }

// A conv or linear layer's inputs for the chunked ops (x, w in [-w_range, w_range], bias,
// dy, drawn in that order) over the whole batch's chunks, and the ref chunked ops'
// results: what the fp32, fp16 and bf16 chunked cases compare with.
struct ChunkedLayerCase {
  std::vector<int> bounds;
  std::vector<float> x, w, bias, dy, y_ref, dx_ref, dw_ref;
  std::vector<double> db_ref;
};
inline ChunkedLayerCase chunked_case(const ConvShape& s, std::mt19937& g, float w_range) {
  ChunkedLayerCase c;
  c.bounds = whole(s.n).bounds;
  c.x = uniform(static_cast<std::size_t>(s.n) * s.c * s.h * s.w, g);
  c.w = uniform(static_cast<std::size_t>(s.k) * s.c * s.r * s.s, g, -w_range, w_range);
  c.bias = uniform(s.k, g);
  c.dy = uniform(static_cast<std::size_t>(s.n) * s.k * s.out_h() * s.out_w(), g);
  c.y_ref.resize(c.dy.size());
  c.dx_ref.resize(c.x.size());
  c.dw_ref.resize(c.w.size());
  c.db_ref.resize(s.k);
  ref::conv2d_forward(s, engine::Precision::Fp32, BatchSplit{kTreeChunks, c.bounds.data()}, c.x.data(), c.w.data(), c.bias.data(), c.y_ref.data());
  ref::conv2d_backward_chunks(s, engine::Precision::Fp32, kTreeChunks, c.bounds.data(), c.x.data(), c.w.data(), c.dy.data(), c.dx_ref.data(),
                              c.dw_ref.data(), c.db_ref.data());
  return c;
}
inline ChunkedLayerCase chunked_case(const LinearShape& s, std::mt19937& g, float w_range) {
  ChunkedLayerCase c;
  c.bounds = whole(s.n).bounds;
  c.x = uniform(static_cast<std::size_t>(s.n) * s.in, g);
  c.w = uniform(static_cast<std::size_t>(s.out) * s.in, g, -w_range, w_range);
  c.bias = uniform(s.out, g);
  c.dy = uniform(static_cast<std::size_t>(s.n) * s.out, g);
  c.y_ref.resize(c.dy.size());
  c.dx_ref.resize(c.x.size());
  c.dw_ref.resize(c.w.size());
  c.db_ref.resize(s.out);
  ref::linear_forward(s, engine::Precision::Fp32, BatchSplit{kTreeChunks, c.bounds.data()}, c.x.data(), c.w.data(), c.bias.data(), c.y_ref.data());
  ref::linear_backward_chunks(s, engine::Precision::Fp32, kTreeChunks, c.bounds.data(), c.x.data(), c.w.data(), c.dy.data(), c.dx_ref.data(),
                              c.dw_ref.data(), c.db_ref.data());
  return c;
}

// Sums W ranks' subtree vectors (rank-major, len each) over the top of the tree.
template <class T>
std::vector<T> top_of_tree(std::vector<T> parts, int world, std::size_t len) {
  engine::kernels::tree_sum_in_place(parts.data(), world, static_cast<int64_t>(len), static_cast<int64_t>(len));
  parts.resize(len);
  return parts;
}
template <class T>
std::vector<T> slice(const std::vector<T>& v, std::size_t per_sample, int first, int count) {
  return std::vector<T>(v.begin() + static_cast<std::ptrdiff_t>(first * per_sample),
                        v.begin() + static_cast<std::ptrdiff_t>((first + count) * per_sample));
}

}  // namespace ops_test
