#include "core/tensor_ops.h"

#include <optional>
#include <stdexcept>
#include <vector>

#include "core/batch_plan.h"
#include "core/dispatch.h"
#include "engine/core/parameter_shards.h"

namespace engine::tt {

using detail::by_chunks;
using detail::OpChecks;
using detail::on_host;
using detail::plan_for;

namespace {

ConvShape block_shape(const ConvShape& s, const BatchChunks::Block& b) {
  ConvShape t = s;
  t.n = b.count;
  return t;
}
LinearShape block_shape(const LinearShape& s, const BatchChunks::Block& b) { return {b.count, s.in, s.out}; }
int64_t in_sample(const ConvShape& s) { return static_cast<int64_t>(s.c) * s.h * s.w; }
int64_t out_sample(const ConvShape& s) { return static_cast<int64_t>(s.k) * s.out_h() * s.out_w(); }
int64_t in_sample(const LinearShape& s) { return s.in; }
int64_t out_sample(const LinearShape& s) { return s.out; }

// The chunked forward of a conv or linear layer, block by block (BatchChunks::Block: a
// whole subtree of the chunk tree, at most the 8 chunks one op call takes). A sample's
// outputs do not depend on the block: each chunk's GEMMs start at its first sample.
template <class Shape, class Op>
void forward_blocks(const BatchChunks& plan, const Shape& s, const float* x, float* y, Op op) {
  for (const BatchChunks::Block& b : plan.blocks())
    op(block_shape(s, b), b.chunks, b.bounds.data(), x + b.begin * in_sample(s), y + b.begin * out_sample(s));
}

// The bias block sums of one CPU backward with nothing to complete: a buffer per thread,
// reused by every call on it (a call needs it only until it returns), so that a training
// step allocates nothing (tests/test_op_trace.cpp).
double* cpu_bias_sums(int64_t n) {
  thread_local std::vector<double> sums;
  if (sums.size() < static_cast<std::size_t>(n)) sums.resize(static_cast<std::size_t>(n));
  return sums.data();
}

// The same on a GPU: one buffer per thread that only grows (a step allocates nothing after
// its first, and a CUDA graph of the step keeps its address).
double* gpu_bias_sums(Device d, int64_t n) {
  thread_local Tensor sums;
  if (!sums.defined() || sums.device() != d || sums.numel() < n) sums = Tensor::empty({n}, DType::F64, d);
  return sums.f64();
}

// Where a backward's weight and bias block sums go: straight into the gradients when
// there is one block and nothing to complete; into the plan's deferred parts when the
// trainer completes them in its pass after backward; otherwise into block-sum tensors on
// the gradients' device, which complete() sums into the gradients over the blocks and
// the ranks (BatchChunks::complete).
class GradientBlocks {
 public:
  GradientBlocks(const BatchChunks& plan, Tensor& dw, Tensor& db)
      : plan_(plan), dw_(dw), db_(db), blocks_(plan.blocks().size()) {
    const Device d = dw.device();
    if (!plan.needs_completion()) {
      if (db.defined())
        db_scratch_ = d.is_cpu() ? cpu_bias_sums(db.numel()) : gpu_bias_sums(d, db.numel());
      else
        db_parts_ = Tensor::empty({0}, DType::F64, d);
      return;
    }
    if (GradientParts* deferred = plan.deferred_gradients()) {
      if (d.is_cuda()) throw std::logic_error("tt: deferred gradient parts are host memory; CUDA completes in the op");
      dw_deferred_ = deferred->floats(dw, blocks_);
      db_deferred_ = deferred->doubles(db, blocks_);
      return;
    }
    dw_parts_ = Tensor::empty({static_cast<int64_t>(blocks_), dw.numel()}, DType::F32, d);
    db_parts_ = Tensor::empty({static_cast<int64_t>(blocks_), db.numel()}, DType::F64, d);
  }
  float* dw(std::size_t block) {
    if (!plan_.needs_completion()) return dw_.f32();
    return (dw_deferred_ ? dw_deferred_ : dw_parts_.f32()) + block * static_cast<std::size_t>(dw_.numel());
  }
  double* db(std::size_t block) {
    if (db_scratch_) return db_scratch_;
    return (db_deferred_ ? db_deferred_ : db_parts_.f64()) + block * static_cast<std::size_t>(db_.numel());
  }
  // The gradients complete (the bias's double tree rounded to float), unless deferred.
  void complete() {
    if (db_deferred_) return;
    if (db_scratch_) {  // one block: its tree is the sum, rounded into db on its device
      detail::ops_on(db_.device()).round_to_float(db_.numel(), db_scratch_, db_.f32());
      return;
    }
    if (plan_.needs_completion()) {
      if (dw_.device().is_cuda()) plan_.complete_device(dw_parts_.f32(), dw_.numel(), dw_.f32());
      else plan_.complete(dw_parts_.f32(), dw_.numel(), dw_.f32());
    }
    Tensor sums = on_host(db_parts_);
    if (plan_.needs_completion()) plan_.complete(sums.f64(), db_.numel(), sums.f64());
    // On the CPU the gradient itself, else a host buffer copied up once.
    Tensor rounded = db_.device().is_cpu() ? db_ : Tensor::empty(db_.shape());
    for (int64_t i = 0; i < db_.numel(); ++i) rounded.f32()[i] = static_cast<float>(sums.f64()[i]);
    detail::store(db_, rounded);
  }

 private:
  const BatchChunks& plan_;
  Tensor& dw_;
  Tensor& db_;
  std::size_t blocks_;
  float* dw_deferred_ = nullptr;
  double* db_deferred_ = nullptr;
  double* db_scratch_ = nullptr;
  Tensor dw_parts_, db_parts_;
};

// The chunked backward of a conv or linear layer: dx per block, the weight and bias
// gradients from the block sums. `op(shape, chunks, bounds, x, dy, dx, dw, db)` is the
// backend's chunked backward.
template <class Shape, class Op>
void backward_blocks(const BatchChunks& plan, const Shape& s, const float* x, const float* dy, float* dx,
                     Tensor& dw, Tensor& db, Op op) {
  GradientBlocks parts(plan, dw, db);
  for (std::size_t i = 0; i < plan.blocks().size(); ++i) {
    const BatchChunks::Block& b = plan.blocks()[i];
    op(block_shape(s, b), b.chunks, b.bounds.data(), x + b.begin * in_sample(s), dy + b.begin * out_sample(s),
       dx ? dx + b.begin * in_sample(s) : nullptr, parts.dw(i), parts.db(i));
  }
  parts.complete();
}

float* data_or_null(Tensor* t) { return t ? t->f32() : nullptr; }

}  // namespace

// ---- Convolution and linear --------------------------------------------------------------
// Each runs by chunks (the CPU always; CUDA with cuda.batch_chunks) or over the whole
// batch (CUDA), in the layer's precision where the device runs it (the CPU runs fp16 and
// bf16 as fp32). The ops of each, by layer kind:
namespace {

using kernels::OpId;
using kernels::OpTable;

template <class Shape>
struct LayerOps;
template <>
struct LayerOps<ConvShape> {
  static constexpr const char* forward = "conv2d_forward";
  static constexpr const char* backward = "conv2d_backward";
  static constexpr auto forward_op = &OpTable::conv2d_forward;
  static constexpr auto backward_chunks = &OpTable::conv2d_backward_chunks;
  static constexpr auto whole_backward = &OpTable::conv2d_backward;
  static constexpr OpId forward_id = OpId::conv2d_forward, backward_chunks_id = OpId::conv2d_backward_chunks,
                        whole_backward_id = OpId::conv2d_backward;
  static int64_t weights(const ConvShape& s) { return static_cast<int64_t>(s.k) * s.c * s.r * s.s; }
  static int64_t biases(const ConvShape& s) { return s.k; }
  static bool valid(const ConvShape& s) {
    return s.n >= 0 && s.c > 0 && s.k > 0 && s.r > 0 && s.s > 0 && s.pad >= 0 && s.out_h() > 0 && s.out_w() > 0;
  }
  static constexpr const char* valid_text = "a non-empty kernel no larger than the padded input";
};
template <>
struct LayerOps<LinearShape> {
  static constexpr const char* forward = "linear_forward";
  static constexpr const char* backward = "linear_backward";
  static constexpr auto forward_op = &OpTable::linear_forward;
  static constexpr auto backward_chunks = &OpTable::linear_backward_chunks;
  static constexpr auto whole_backward = &OpTable::linear_backward;
  static constexpr OpId forward_id = OpId::linear_forward, backward_chunks_id = OpId::linear_backward_chunks,
                        whole_backward_id = OpId::linear_backward;
  static int64_t weights(const LinearShape& s) { return static_cast<int64_t>(s.out) * s.in; }
  static int64_t biases(const LinearShape& s) { return s.out; }
  static bool valid(const LinearShape& s) { return s.n >= 0 && s.in > 0 && s.out > 0; }
  static constexpr const char* valid_text = "positive in and out features";
};

// The precision a layer computes in on device d (the CPU runs fp16 and bf16 as fp32),
// refused in one line, before any kernel runs, when d's backend does not run `op` in it.
Precision precision_on(const OpTable& ops, kernels::OpId op, Precision p, const Device& d) {
  const Precision used = d.is_cuda() ? p : Precision::Fp32;
  if (!kernels::supports_op(ops, op, used)) kernels::refuse_precision(ops.backend, op, used);
  return used;
}

template <class Shape>
OpChecks forward_checks(const char* op, const BatchCompute& how, const Shape& s, const Tensor& x, const Tensor& w,
                        const Tensor& b, const Tensor& y) {
  using L = LayerOps<Shape>;
  OpChecks checks(op, &how.layer);
  checks.that(L::valid(s), L::valid_text)
      .exact("w", w, DType::F32, L::weights(s))
      .exact("x", x, DType::F32, s.n * in_sample(s))
      .optional("b", b, DType::F32, L::biases(s))
      .exact("y", y, DType::F32, s.n * out_sample(s));
  return checks;
}

template <class Shape>
void layer_forward(const BatchCompute& how, const Shape& s, const Tensor& x, const Tensor& w, const Tensor& b,
                   Tensor& y) {
  using L = LayerOps<Shape>;
  const Device d = forward_checks(L::forward, how, s, x, w, b, y).device();
  const OpTable& ops = detail::ops_on(d);
  const auto op = ops.*L::forward_op;
  const Precision p = precision_on(ops, L::forward_id, how.precision, d);
  if (by_chunks(how, d)) {
    std::optional<BatchChunks> whole;
    forward_blocks(plan_for(how, s.n, whole), s, x.f32(), y.f32(),
                   [&](const Shape& bs, int chunks, const int* bounds, const float* bx, float* by) {
                     op(bs, p, kernels::BatchSplit{chunks, bounds}, bx, w.f32(), b.f32(), by);
                   });
  } else {
    op(s, p, kernels::BatchSplit{}, x.f32(), w.f32(), b.f32(), y.f32());
  }
}

template <class Shape>
void layer_backward(const BatchCompute& how, const Shape& s, const Tensor& x, const Tensor& w, const Tensor& dy,
                    Tensor* dx, Tensor& dw, Tensor& db) {
  using L = LayerOps<Shape>;
  OpChecks checks(L::backward, &how.layer);
  checks.that(L::valid(s), L::valid_text)
      .exact("w", w, DType::F32, L::weights(s))
      .exact("x", x, DType::F32, s.n * in_sample(s))
      .exact("dy", dy, DType::F32, s.n * out_sample(s))
      .exact("dw", dw, DType::F32, L::weights(s))
      .optional("db", db, DType::F32, L::biases(s));
  if (dx) checks.exact("dx", *dx, DType::F32, s.n * in_sample(s));
  const Device d = checks.device();
  const OpTable& ops = detail::ops_on(d);
  if (by_chunks(how, d)) {
    const auto op = ops.*L::backward_chunks;
    const Precision p = precision_on(ops, L::backward_chunks_id, how.precision, d);
    std::optional<BatchChunks> whole;
    backward_blocks(plan_for(how, s.n, whole), s, x.f32(), dy.f32(), data_or_null(dx), dw, db,
                    [&](const Shape& bs, int chunks, const int* bounds, const float* bx, const float* bdy,
                        float* bdx, float* pdw, double* pdb) {
                      op(bs, p, chunks, bounds, bx, w.f32(), bdy, bdx, pdw, pdb);
                    });
  } else {
    (ops.*L::whole_backward)(s, precision_on(ops, L::whole_backward_id, how.precision, d), x.f32(), w.f32(),
                             dy.f32(), data_or_null(dx), dw.f32(), db.f32());
  }
}

}  // namespace

void conv2d_forward(const BatchCompute& how, const ConvShape& s, const Tensor& x, const Tensor& w,
                    const Tensor& b, Tensor& y) {
  layer_forward(how, s, x, w, b, y);
}

void conv2d_backward(const BatchCompute& how, const ConvShape& s, const Tensor& x, const Tensor& w,
                     const Tensor& dy, Tensor* dx, Tensor& dw, Tensor& db) {
  layer_backward(how, s, x, w, dy, dx, dw, db);
}

void linear_forward(const BatchCompute& how, const LinearShape& s, const Tensor& x, const Tensor& w,
                    const Tensor& b, Tensor& y) {
  layer_forward(how, s, x, w, b, y);
}

void linear_backward(const BatchCompute& how, const LinearShape& s, const Tensor& x, const Tensor& w,
                     const Tensor& dy, Tensor* dx, Tensor& dw, Tensor& db) {
  layer_backward(how, s, x, w, dy, dx, dw, db);
}

// ---- Element-wise, pooling, dropout --------------------------------------------------------

void relu_forward(const Tensor& x, Tensor& y) {
  const Device d = OpChecks("relu_forward")
                       .exact("x", x, DType::F32, x.numel())
                       .exact("y", y, DType::F32, x.numel())
                       .device();
  detail::ops_on(d).relu_forward(x.numel(), x.f32(), y.f32());
}

void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  const Device d = OpChecks("relu_backward")
                       .exact("dy", dy, DType::F32, dy.numel())
                       .exact("y", y, DType::F32, dy.numel())
                       .exact("dx", dx, DType::F32, dy.numel())
                       .device();
  detail::ops_on(d).relu_backward(dy.numel(), y.f32(), dy.f32(), dx.f32());
}

namespace {
int64_t pool_in(const PoolShape& s) { return static_cast<int64_t>(s.n) * s.c * s.h * s.w; }
int64_t pool_out(const PoolShape& s) { return static_cast<int64_t>(s.n) * s.c * (s.h / 2) * (s.w / 2); }
bool pool_valid(const PoolShape& s) { return s.n >= 0 && s.c >= 0 && s.h >= 0 && s.w >= 0 && s.h % 2 == 0 && s.w % 2 == 0; }
}  // namespace

void maxpool2x2_forward(const PoolShape& s, const Tensor& x, Tensor& y, Tensor& argmax) {
  const Device d = OpChecks("maxpool2x2_forward")
                       .that(pool_valid(s), "H and W even")
                       .exact("x", x, DType::F32, pool_in(s))
                       .exact("y", y, DType::F32, pool_out(s))
                       .exact("argmax", argmax, DType::I32, pool_out(s))
                       .device();
  detail::ops_on(d).maxpool2x2_forward(s, x.f32(), y.f32(), argmax.i32());
}

void maxpool2x2_backward(const PoolShape& s, const Tensor& dy, const Tensor& argmax, Tensor& dx) {
  const Device d = OpChecks("maxpool2x2_backward")
                       .that(pool_valid(s), "H and W even")
                       .exact("dy", dy, DType::F32, pool_out(s))
                       .exact("argmax", argmax, DType::I32, pool_out(s))
                       .exact("dx", dx, DType::F32, pool_in(s))
                       .device();
  detail::ops_on(d).maxpool2x2_backward(s, dy.f32(), argmax.i32(), dx.f32());
}

void dropout_forward(const BatchCompute& how, const Tensor& x, float p, Rng& rng, Tensor& y, Tensor& keep) {
  const Device d = OpChecks("dropout_forward", &how.layer)
                       .that(p >= 0.0f && p < 1.0f, "0 <= p < 1")
                       .exact("x", x, DType::F32, x.numel())
                       .exact("y", y, DType::F32, x.numel())
                       .exact("keep", keep, DType::U8, x.numel())
                       .device();
  const int64_t n = x.rank() > 0 ? x.dim(0) : 0;
  uint64_t per_sample = 1;
  for (int i = 1; i < x.rank(); ++i) per_sample *= static_cast<uint64_t>(x.dim(i));
  std::optional<BatchChunks> whole;
  const BatchChunks& plan = plan_for(how, n, whole);
  by_chunks(how, d);  // refuses whole-batch CUDA over several ranks
  const uint64_t first = rng.take(RngStream::Dropout, static_cast<uint64_t>(plan.global_batch()) * per_sample);
  const uint64_t local = static_cast<uint64_t>(plan.local_begin()) * per_sample;
  // The kernel reads the stream's counter at the step's start from the step's values, and
  // adds this call's place in the step, the same every step.
  const StepValues* step = how.plan ? how.plan->step_values() : nullptr;
  if (step) {
    const DeviceValue<uint64_t> counter = step->dropout_counter();
    if (counter.device != d || first < counter.value)
      throw std::logic_error("tt::dropout_forward (" + how.layer + "): the step's values are not this step's");
    detail::ops_on(d).dropout_forward(x.numel(), x.f32(), p, rng.stream(RngStream::Dropout), counter.ptr,
                                      first - counter.value + local, y.f32(), keep.u8());
    return;
  }
  // No step's values (a layer used alone): the counter is sent for this call.
  thread_local StepValues alone;
  alone.scalars.dropout_counter = first;
  alone.upload(d);
  detail::ops_on(d).dropout_forward(x.numel(), x.f32(), p, rng.stream(RngStream::Dropout),
                                    alone.dropout_counter().ptr, local, y.f32(), keep.u8());
}

void dropout_backward(const Tensor& dy, const Tensor& keep, float p, Tensor& dx) {
  const Device d = OpChecks("dropout_backward")
                       .that(p >= 0.0f && p < 1.0f, "0 <= p < 1")
                       .exact("dy", dy, DType::F32, dy.numel())
                       .exact("keep", keep, DType::U8, dy.numel())
                       .exact("dx", dx, DType::F32, dy.numel())
                       .device();
  detail::ops_on(d).dropout_backward(dy.numel(), dy.f32(), keep.u8(), p, dx.f32());
}

// ---- Loss, sums, data, optimizer -----------------------------------------------------------

void cross_entropy(const Tensor& logits, const Tensor& labels, int batch_total, DeviceValue<float> grad_scale,
                   Tensor* dlogits, Tensor& sample_loss, Tensor& sample_correct, DeviceValue<int64_t> first) {
  OpChecks checks("cross_entropy");
  checks.that(logits.rank() == 2, "logits of shape [n, classes]");
  const int n = static_cast<int>(logits.dim(0)), classes = static_cast<int>(logits.dim(1));
  checks.that(classes > 0 && batch_total >= n && first.value >= 0, "classes > 0, n <= batch_total and first >= 0")
      .exact("logits", logits, DType::F32, logits.numel())
      .at_least("labels", labels, DType::I32, n)
      .at_least("sample_loss", sample_loss, DType::F32, first.value + n)
      .at_least("sample_correct", sample_correct, DType::F32, first.value + n)
      .value("first", first.ptr, first.device);
  if (dlogits) checks.exact("dlogits", *dlogits, DType::F32, logits.numel()).value("grad_scale", grad_scale.ptr, grad_scale.device);
  detail::ops_on(checks.device())
      .cross_entropy(n, batch_total, classes, logits.f32(), labels.i32(), grad_scale.ptr, first.ptr,
                     data_or_null(dlogits), sample_loss.f32(), sample_correct.f32());
}

void softmax(const Tensor& logits, Tensor& probs) {
  OpChecks checks("softmax");
  checks.that(logits.rank() == 2, "logits of shape [n, classes]");
  const int n = static_cast<int>(logits.dim(0)), classes = static_cast<int>(logits.dim(1));
  checks.exact("logits", logits, DType::F32, logits.numel()).exact("probs", probs, DType::F32, logits.numel());
  detail::ops_on(checks.device()).softmax(n, classes, logits.f32(), probs.f32());
}

double reduce_sum(const Tensor& x, int64_t first, int64_t n) {
  const Device d = OpChecks("reduce_sum")
                       .that(first >= 0 && n >= 0, "a non-negative range")
                       .at_least("x", x, DType::F32, first + n)
                       .device();
  return detail::ops_on(d).reduce_sum(n, x.f32() + first);
}

void gather_batch(const Tensor& images, const Tensor& labels, const Tensor& indices, DeviceValue<int64_t> first,
                  int n, float mean, float std, Tensor& x, Tensor& labels_out) {
  int64_t pixels = 1;  // per sample, from x's shape: n may be 0
  for (int d = 1; d < x.rank(); ++d) pixels *= x.dim(d);
  const Device d = OpChecks("gather_batch")
                       .that(first.value >= 0 && n >= 0 && x.rank() >= 1, "a non-negative range and a batch tensor x")
                       .at_least("x", x, DType::F32, n * pixels)
                       .at_least("labels_out", labels_out, DType::I32, n)
                       .at_least("indices", indices, DType::I32, first.value + n)
                       .exact("images", images, DType::U8, labels.numel() * pixels)
                       .exact("labels", labels, DType::U8, labels.numel())
                       .value("first", first.ptr, first.device)
                       .device();
  detail::ops_on(d).gather_batch(n, static_cast<int>(pixels), images.u8(), labels.u8(), indices.i32(), first.ptr,
                                 mean, std, x.f32(), labels_out.i32());
}

void adam_update(Tensor& param, const Tensor& grad, int64_t first, int64_t n, Tensor& exp_avg,
                 Tensor& exp_avg_sq, const kernels::AdamHyper& h, DeviceValue<kernels::AdamStepFactors> f,
                 DeviceValue<int32_t> skip, Tensor* digests, int64_t digest_slot) {
  OpChecks checks("adam_update");
  if (digests)
    checks.that(digest_slot >= 0, "digest_slot >= 0")
        .at_least("digests", *digests, DType::U8, (3 * digest_slot + 3) * static_cast<int64_t>(sizeof(uint64_t)));
  const Device d = checks
                       .that(first >= 0 && n >= 0, "a non-negative range")
                       .at_least("param", param, DType::F32, first + n)
                       .at_least("grad", grad, DType::F32, first + n)
                       .at_least("exp_avg", exp_avg, DType::F32, n)
                       .at_least("exp_avg_sq", exp_avg_sq, DType::F32, n)
                       .value("f", f.ptr, f.device)
                       .optional_value("skip", skip.ptr, skip.device)
                       .device();
  uint64_t* sums = digests ? static_cast<uint64_t*>(digests->raw()) + 3 * digest_slot : nullptr;
  detail::ops_on(d).adam_update(n, param.f32() + first, grad.f32() + first, exp_avg.f32(), exp_avg_sq.f32(), h,
                                f.ptr, skip.ptr, first, sums);
}

void digest(const Tensor& x, int64_t first, int64_t n, Tensor& sums, int64_t slot) {
  const Device d = OpChecks("digest")
                       .that(first >= 0 && n >= 0 && slot >= 0, "a non-negative range and slot")
                       .at_least("x", x, DType::F32, first + n)
                       .at_least("sums", sums, DType::U8, (slot + 1) * static_cast<int64_t>(sizeof(uint64_t)))
                       .device();
  detail::ops_on(d).digest_words(n, reinterpret_cast<const uint32_t*>(x.f32() + first), first,
                                 static_cast<uint64_t*>(sums.raw()) + slot);
}

void step_digest_finish(Tensor& sums, int n_ranges, const Tensor& ranges, const Tensor& loss,
                        DeviceValue<int64_t> loss_first, int loss_count, Tensor& ring, Tensor& next, int capacity) {
  const int64_t n_sums = sums.numel() / static_cast<int64_t>(sizeof(uint64_t));
  const int64_t row = n_sums + n_ranges + 1;
  const Device d = OpChecks("step_digest_finish")
                       .that(n_ranges >= 0 && loss_count >= 0 && capacity >= 1, "non-negative counts, a ring")
                       .exact("sums", sums, DType::U8, n_sums * static_cast<int64_t>(sizeof(uint64_t)))
                       .exact("ranges", ranges, DType::U8, n_ranges * static_cast<int64_t>(sizeof(kernels::DigestRange)))
                       .at_least("loss", loss, DType::F32, loss_count)
                       .value("loss_first", loss_first.ptr, loss_first.device)
                       .exact("ring", ring, DType::U8, capacity * row * static_cast<int64_t>(sizeof(uint64_t)))
                       .exact("next", next, DType::U8, static_cast<int64_t>(sizeof(int64_t)))
                       .device();
  detail::ops_on(d).step_digest_finish(static_cast<int>(n_sums), static_cast<uint64_t*>(sums.raw()), n_ranges,
                                       static_cast<const kernels::DigestRange*>(ranges.raw()), loss.f32(),
                                       loss_first.ptr, loss_count, static_cast<uint64_t*>(ring.raw()),
                                       static_cast<int64_t*>(next.raw()), capacity);
}

void adam_prepare_step(int count, DeviceValue<double> lr, const kernels::AdamFactorInputs& in,
                       DeviceValue<int32_t> skip, Tensor& steps, Tensor& factors) {
  const Device d = OpChecks("adam_prepare_step")
                       .that(count >= 0, "count >= 0")
                       .exact("steps", steps, DType::U8, count * static_cast<int64_t>(sizeof(int64_t)))
                       .exact("factors", factors, DType::U8,
                              count * static_cast<int64_t>(sizeof(kernels::AdamStepFactors)))
                       .value("lr", lr.ptr, lr.device)
                       .value("skip", skip.ptr, skip.device)
                       .device();
  detail::ops_on(d).adam_prepare_step(count, lr.ptr, in, skip.ptr, static_cast<int64_t*>(steps.raw()),
                                      static_cast<kernels::AdamStepFactors*>(factors.raw()));
}

namespace {
constexpr int64_t kScalerStateBytes = static_cast<int64_t>(sizeof(kernels::LossScaleState));
kernels::LossScaleState* scaler_state_of(Tensor& t) { return static_cast<kernels::LossScaleState*>(t.raw()); }
}  // namespace

void unscale_check(Tensor& grad, Tensor& scaler_state) {
  const Device d = OpChecks("unscale_check")
                       .exact("grad", grad, DType::F32, grad.numel())
                       .exact("scaler_state", scaler_state, DType::U8, kScalerStateBytes)
                       .device();
  kernels::LossScaleState* s = scaler_state_of(scaler_state);
  // Member addresses on the device, not reads: offsetof, as the state may be GPU memory.
  auto* base = reinterpret_cast<unsigned char*>(s);
  detail::ops_on(d).unscale_check(grad.numel(), grad.f32(),
                                  reinterpret_cast<const float*>(base + offsetof(kernels::LossScaleState, inv_scale_f32)),
                                  reinterpret_cast<int32_t*>(base + offsetof(kernels::LossScaleState, found_inf)));
}

void loss_scale_update(Tensor& scaler_state, const kernels::LossScaleRule& rule) {
  const Device d = OpChecks("loss_scale_update").exact("scaler_state", scaler_state, DType::U8, kScalerStateBytes).device();
  detail::ops_on(d).loss_scale_update(scaler_state_of(scaler_state), rule);
}

}  // namespace engine::tt
