#include "core/tensor_ops.h"

#include <optional>
#include <stdexcept>
#include <vector>

#include "core/batch_plan.h"
#include "core/dispatch.h"
#include "engine/core/parameter_shards.h"

namespace engine::tt {

using detail::by_chunks;
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
      db_parts_ = Tensor::empty({db.numel()}, DType::F64, d);
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
    return (db_deferred_ ? db_deferred_ : db_parts_.f64()) + block * static_cast<std::size_t>(db_.numel());
  }
  // The gradients complete (the bias's double tree rounded to float), unless deferred.
  void complete() {
    if (db_deferred_) return;
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
// Each picks one of four paths: the CPU by chunks (fp16 is fp32 there), CUDA by chunks
// in fp32 or fp16, CUDA whole-batch in fp32 or fp16. The backends' ops of one layer
// kind, by path:
namespace {

template <class Shape>
struct LayerOps {
  using ForwardChunks = void (*)(const Shape&, int, const int*, const float*, const float*, const float*, float*);
  using BackwardChunks = void (*)(const Shape&, int, const int*, const float*, const float*, const float*, float*,
                                  float*, double*);
  using Forward = void (*)(const Shape&, const float*, const float*, const float*, float*);
  using Backward = void (*)(const Shape&, const float*, const float*, const float*, float*, float*, float*);
  ForwardChunks cpu_forward, cuda_forward, cuda_forward_f16;
  BackwardChunks cpu_backward, cuda_backward, cuda_backward_f16;
  Forward cuda_whole_forward, cuda_whole_forward_f16;
  Backward cuda_whole_backward, cuda_whole_backward_f16;
};

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;
const LayerOps<ConvShape> kConv{
    cpu::conv2d_forward_chunks,  cuda::conv2d_forward_chunks,  cuda::conv2d_forward_chunks_f16,
    cpu::conv2d_backward_chunks, cuda::conv2d_backward_chunks, cuda::conv2d_backward_chunks_f16,
    cuda::conv2d_forward,        cuda::conv2d_forward_f16,     cuda::conv2d_backward,
    cuda::conv2d_backward_f16};
const LayerOps<LinearShape> kLinear{
    cpu::linear_forward_chunks,  cuda::linear_forward_chunks,  cuda::linear_forward_chunks_f16,
    cpu::linear_backward_chunks, cuda::linear_backward_chunks, cuda::linear_backward_chunks_f16,
    cuda::linear_forward,        cuda::linear_forward_f16,     cuda::linear_backward,
    cuda::linear_backward_f16};

template <class Shape>
void layer_forward(const LayerOps<Shape>& ops, const BatchCompute& how, const Shape& s, const Tensor& x,
                   const Tensor& w, const Tensor& b, Tensor& y) {
  const Device d = w.device();
  const bool f16 = how.precision == Precision::Fp16;
  if (by_chunks(how, d)) {
    const auto op = d.is_cpu() ? ops.cpu_forward : f16 ? ops.cuda_forward_f16 : ops.cuda_forward;
    std::optional<BatchChunks> whole;
    forward_blocks(plan_for(how, s.n, whole), s, x.f32(), y.f32(),
                   [&](const Shape& bs, int chunks, const int* bounds, const float* bx, float* by) {
                     op(bs, chunks, bounds, bx, w.f32(), b.f32(), by);
                   });
  } else {
    (f16 ? ops.cuda_whole_forward_f16 : ops.cuda_whole_forward)(s, x.f32(), w.f32(), b.f32(), y.f32());
  }
}

template <class Shape>
void layer_backward(const LayerOps<Shape>& ops, const BatchCompute& how, const Shape& s, const Tensor& x,
                    const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw, Tensor& db) {
  const Device d = w.device();
  const bool f16 = how.precision == Precision::Fp16;
  if (by_chunks(how, d)) {
    const auto op = d.is_cpu() ? ops.cpu_backward : f16 ? ops.cuda_backward_f16 : ops.cuda_backward;
    std::optional<BatchChunks> whole;
    backward_blocks(plan_for(how, s.n, whole), s, x.f32(), dy.f32(), data_or_null(dx), dw, db,
                    [&](const Shape& bs, int chunks, const int* bounds, const float* bx, const float* bdy,
                        float* bdx, float* pdw, double* pdb) {
                      op(bs, chunks, bounds, bx, w.f32(), bdy, bdx, pdw, pdb);
                    });
  } else {
    (f16 ? ops.cuda_whole_backward_f16 : ops.cuda_whole_backward)(s, x.f32(), w.f32(), dy.f32(), data_or_null(dx),
                                                                  dw.f32(), db.f32());
  }
}

}  // namespace

void conv2d_forward(const BatchCompute& how, const ConvShape& s, const Tensor& x, const Tensor& w,
                    const Tensor& b, Tensor& y) {
  layer_forward(kConv, how, s, x, w, b, y);
}

void conv2d_backward(const BatchCompute& how, const ConvShape& s, const Tensor& x, const Tensor& w,
                     const Tensor& dy, Tensor* dx, Tensor& dw, Tensor& db) {
  layer_backward(kConv, how, s, x, w, dy, dx, dw, db);
}

void linear_forward(const BatchCompute& how, const LinearShape& s, const Tensor& x, const Tensor& w,
                    const Tensor& b, Tensor& y) {
  layer_forward(kLinear, how, s, x, w, b, y);
}

void linear_backward(const BatchCompute& how, const LinearShape& s, const Tensor& x, const Tensor& w,
                     const Tensor& dy, Tensor* dx, Tensor& dw, Tensor& db) {
  layer_backward(kLinear, how, s, x, w, dy, dx, dw, db);
}

// ---- Element-wise, pooling, dropout --------------------------------------------------------

void relu_forward(const Tensor& x, Tensor& y) {
  ENGINE_DISPATCH(x.device(), relu_forward, x.numel(), x.f32(), y.f32());
}

void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  ENGINE_DISPATCH(dy.device(), relu_backward, dy.numel(), y.f32(), dy.f32(), dx.f32());
}

void maxpool2x2_forward(const PoolShape& s, const Tensor& x, Tensor& y, Tensor& argmax) {
  ENGINE_DISPATCH(x.device(), maxpool2x2_forward, s, x.f32(), y.f32(), argmax.i32());
}

void maxpool2x2_backward(const PoolShape& s, const Tensor& dy, const Tensor& argmax, Tensor& dx) {
  ENGINE_DISPATCH(dy.device(), maxpool2x2_backward, s, dy.f32(), argmax.i32(), dx.f32());
}

void dropout_forward(const BatchCompute& how, const Tensor& x, float p, Rng& rng, Tensor& y, Tensor& keep) {
  const int64_t n = x.rank() > 0 ? x.dim(0) : 0;
  uint64_t per_sample = 1;
  for (int d = 1; d < x.rank(); ++d) per_sample *= static_cast<uint64_t>(x.dim(d));
  std::optional<BatchChunks> whole;
  const BatchChunks& plan = plan_for(how, n, whole);
  by_chunks(how, x.device());  // refuses whole-batch CUDA over several ranks
  const uint64_t first = rng.take(RngStream::Dropout, static_cast<uint64_t>(plan.global_batch()) * per_sample);
  ENGINE_DISPATCH(x.device(), dropout_forward, x.numel(), x.f32(), p, rng.stream(RngStream::Dropout),
                  first + static_cast<uint64_t>(plan.local_begin()) * per_sample, y.f32(), keep.u8());
}

void dropout_backward(const Tensor& dy, const Tensor& keep, float p, Tensor& dx) {
  ENGINE_DISPATCH(dy.device(), dropout_backward, dy.numel(), dy.f32(), keep.u8(), p, dx.f32());
}

// ---- Loss, sums, data, optimizer -----------------------------------------------------------

void cross_entropy(const Tensor& logits, const Tensor& labels, int batch_total, float grad_scale, Tensor* dlogits,
                   Tensor& sample_loss, int64_t loss_first, Tensor& sample_correct, int64_t correct_first) {
  const int n = static_cast<int>(logits.dim(0)), classes = static_cast<int>(logits.dim(1));
  ENGINE_DISPATCH(logits.device(), cross_entropy, n, batch_total, classes, logits.f32(), labels.i32(),
                  grad_scale, data_or_null(dlogits), sample_loss.f32() + loss_first,
                  sample_correct.f32() + correct_first);
}

void softmax(const Tensor& logits, Tensor& probs) {
  const int n = static_cast<int>(logits.dim(0)), classes = static_cast<int>(logits.dim(1));
  ENGINE_DISPATCH(logits.device(), softmax, n, classes, logits.f32(), probs.f32());
}

double reduce_sum(const Tensor& x, int64_t first, int64_t n) {
  return ENGINE_DISPATCH(x.device(), reduce_sum, n, x.f32() + first);
}

void gather_batch(const Tensor& images, const Tensor& labels, const Tensor& indices, int64_t first, int n,
                  float mean, float std, Tensor& x, Tensor& labels_out) {
  int64_t pixels = 1;  // per sample, from x's shape: n may be 0
  for (int d = 1; d < x.rank(); ++d) pixels *= x.dim(d);
  ENGINE_DISPATCH(x.device(), gather_batch, n, static_cast<int>(pixels), images.u8(), labels.u8(), indices.i32() + first, mean, std,
                  x.f32(), labels_out.i32());
}

void adam_update(Tensor& param, const Tensor& grad, int64_t first, int64_t n, Tensor& exp_avg,
                 Tensor& exp_avg_sq, const kernels::AdamHyper& h, const kernels::AdamStepFactors& f) {
  ENGINE_DISPATCH(param.device(), adam_update, n, param.f32() + first, grad.f32() + first, exp_avg.f32(),
                  exp_avg_sq.f32(), h, f);
}

void unscale_check(Tensor& grad, float inv_scale, Tensor& found_inf) {
  ENGINE_DISPATCH(grad.device(), unscale_check, grad.numel(), grad.f32(), inv_scale, found_inf.i32());
}

}  // namespace engine::tt
