#include "engine/layers.h"

#include <cmath>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

#include "engine/batch_chunks.h"
#include "engine/parameter_shards.h"
#include "kernels/batchnorm_math.h"
#include "kernels/chunk_tree.h"
#include "kernels/cuda/settings.h"
#include "kernels/cuda_runtime.h"
#include "nn/dispatch.h"

namespace engine {

using namespace kernels;

namespace {
Parameter make_param(const std::string& name, const Shape& shape) {
  return Parameter{name, Tensor::zeros(shape), Tensor::zeros(shape)};
}
void move_param(Parameter& p, Device d) {
  if (p.value.device() == d) return;
  p.value = p.value.to(d);
  p.grad = p.grad.to(d);
}
void expect_rank(const Tensor& x, int rank, const std::string& layer) {
  if (x.rank() != rank)
    throw std::invalid_argument(layer + ": expected a rank-" + std::to_string(rank) +
                                " input, got " + shape_str(x.shape()));
}

// Every layer computes by the fixed chunks of the global batch (kernels/chunk_ops.inc),
// block by block (BatchChunks::Block: a whole subtree of the chunk tree, at most the 8
// chunks one op call takes), and completes its cross-sample sums from the block sums
// (BatchChunks::complete: over the ranks, and over the blocks of this rank): on the CPU
// always, on the GPU when the trainer gives a batch plan and cuda.batch_chunks is on
// (docs/distributed.md, "GPU ranks"). With cuda.batch_chunks off the CUDA path runs the
// whole-batch ops: one process only.

// The plan of the n samples a layer was given: the trainer's, or the whole batch in one
// process (8 chunks: one block) made in `own`.
const BatchChunks& plan_for(const BatchChunks* plan, int64_t n, const std::string& layer,
                            std::optional<BatchChunks>& own) {
  if (!plan) return own.emplace(n);
  if (plan->local_count() != n)
    throw std::logic_error(layer + ": given " + std::to_string(n) + " samples, the batch plan gives this rank " +
                           std::to_string(plan->local_count()));
  return *plan;
}

// Block sums, one vector of n values per block, reused from step to step (per thread:
// simulated ranks are threads of one process). With one block and nothing to complete
// the op writes the result directly, and this is not used.
template <class T>
T* block_parts(std::size_t count) {
  thread_local std::vector<T> parts;
  if (parts.size() < count) parts.resize(count);
  return parts.data();
}

void store_rounded(const double* v, std::size_t n, float* out) {
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(v[i]);
}

void require_one_process(const BatchChunks* plan, Device d, const std::string& layer) {
  if (plan && plan->distributed() && d.is_cuda() && !kernels::cuda::batch_chunks())
    throw std::invalid_argument(layer + ": cuda.batch_chunks=false computes whole batches, which needs one "
                                "process; this run has " + std::to_string(plan->world_size()) +
                                " ranks (set cuda.batch_chunks=true)");
}

// Whether a CUDA layer computes by chunks: a batch plan is given and the switch is on.
bool cuda_by_chunks(const BatchChunks* plan) { return plan && kernels::cuda::batch_chunks(); }

// A few values in device memory (per-channel sums and factors), freed stream-ordered.
template <class T>
struct DeviceValues {
  explicit DeviceValues(std::size_t n) : n(n), p(static_cast<T*>(cuda::alloc(sizeof(T) * (n ? n : 1)))) {}
  ~DeviceValues() { cuda::free(p); }
  DeviceValues(const DeviceValues&) = delete;
  DeviceValues& operator=(const DeviceValues&) = delete;
  std::vector<T> to_host() const {
    std::vector<T> v(n);
    cuda::copy(v.data(), p, sizeof(T) * n, cuda::CopyKind::DeviceToHost);
    return v;
  }
  std::size_t n;
  T* p;
};
template <class T>
std::vector<T> device_to_host(const T* p, std::size_t n) {
  std::vector<T> v(n);
  cuda::copy(v.data(), p, sizeof(T) * n, cuda::CopyKind::DeviceToHost);
  return v;
}
template <class T>
void host_to_device(T* p, const std::vector<T>& v) {
  cuda::copy(p, v.data(), sizeof(T) * v.size(), cuda::CopyKind::HostToDevice);
}

// The bias gradient of a CUDA chunked backward: the device block sums (double, n per
// block) completed on the host, rounded to float into the device bias gradient.
void finish_bias_grad_cuda(const BatchChunks& plan, const DeviceValues<double>& db_parts, std::size_t n,
                           float* bias_grad) {
  std::vector<double> v = db_parts.to_host();
  plan.complete(v.data(), static_cast<int64_t>(n), v.data());
  std::vector<float> f(n);
  store_rounded(v.data(), n, f.data());
  host_to_device(bias_grad, f);
}

// The weight gradient's block sums land in `grad` directly when there is one block and
// nothing to complete, otherwise in a parts buffer that complete() then sums into grad;
// or, when the plan defers gradients (the trainer's one pass after backward), in the
// deferred parts, left for that pass.
struct WeightGradParts {
  WeightGradParts(const BatchChunks& plan, Tensor& grad) : plan(plan), grad(grad), n(grad.numel()) {
    if (!plan.needs_completion()) {
      base = grad.f32();
      return;
    }
    const std::size_t blocks = plan.blocks().size();
    if (GradientParts* deferred = plan.deferred_gradients()) {
      base = deferred->floats(grad, blocks);
    } else if (grad.device().is_cpu()) {
      base = block_parts<float>(blocks * static_cast<std::size_t>(n));
    } else {
      device = std::make_unique<DeviceValues<float>>(blocks * static_cast<std::size_t>(n));
      base = device->p;
    }
  }
  float* part(std::size_t block) {
    return plan.needs_completion() ? base + block * static_cast<std::size_t>(n) : base;
  }
  void complete() {
    if (!plan.needs_completion() || plan.deferred_gradients()) return;
    if (device) plan.complete_device(base, n, grad.f32());
    else plan.complete(base, n, grad.f32());
  }
  const BatchChunks& plan;
  Tensor& grad;
  int64_t n;
  float* base = nullptr;
  std::unique_ptr<DeviceValues<float>> device;
};

// Per-channel sums of batch norm, block by block: `sums(block, out)` writes one block's
// `per_block` values; the result is the completed tree (host memory).
template <class F>
std::vector<double> bn_block_sums(const BatchChunks& plan, std::size_t per_block, F sums) {
  const std::size_t blocks = plan.blocks().size();
  std::vector<double> parts(blocks * per_block);
  for (std::size_t i = 0; i < blocks; ++i) sums(plan.blocks()[i], parts.data() + i * per_block);
  plan.complete(parts.data(), static_cast<int64_t>(per_block), parts.data());
  parts.resize(per_block);
  return parts;
}
template <class F>
std::vector<double> bn_block_sums_cuda(const BatchChunks& plan, std::size_t per_block, F sums) {
  const std::size_t blocks = plan.blocks().size();
  DeviceValues<double> parts(blocks * per_block);
  for (std::size_t i = 0; i < blocks; ++i) sums(plan.blocks()[i], parts.p + i * per_block);
  std::vector<double> v = parts.to_host();
  plan.complete(v.data(), static_cast<int64_t>(per_block), v.data());
  v.resize(per_block);
  return v;
}

BatchNormShape block_shape(const BatchNormShape& s, const BatchChunks::Block& b) { return {b.count, s.c, s.hw}; }
int64_t bn_sample(const BatchNormShape& s) { return static_cast<int64_t>(s.c) * s.hw; }

// Synchronised batch norm on the GPU by chunks. With one block in one process the fused
// op; otherwise the same steps with the per-channel sums (c values) completed on the
// host in between. The fused op finishes on the host with the same functions
// (kernels/cuda/chunk_ops.cu), so both give the same bits.
void bn_forward_train_cuda(const BatchChunks& plan, const BatchNormShape& s, const float* x, const float* gamma,
                           const float* beta, float eps, float momentum, float* running_mean, float* running_var,
                           float* save_mean, float* save_invstd, float* y) {
  if (!plan.needs_completion()) {
    const BatchChunks::Block& b = plan.blocks()[0];
    cuda::batchnorm_forward_train_chunks(s, b.chunks, b.bounds.data(), x, gamma, beta, eps, momentum,
                                         running_mean, running_var, save_mean, save_invstd, y);
    return;
  }
  const std::size_t c = static_cast<std::size_t>(s.c);
  if (c == 0) return;
  const double m = static_cast<double>(plan.global_batch()) * s.hw;
  DeviceValues<float> dvec(3 * c);  // mean, scale, shift
  const std::vector<double> sum = bn_block_sums_cuda(plan, c, [&](const BatchChunks::Block& b, double* out) {
    cuda::batchnorm_chunk_sums(block_shape(s, b), b.chunks, b.bounds.data(), x + b.begin * bn_sample(s), out);
  });
  std::vector<float> mean_f(c);
  for (std::size_t i = 0; i < c; ++i) mean_f[i] = static_cast<float>(bn_mean(sum[i], m));
  host_to_device(dvec.p, mean_f);
  const std::vector<double> sq = bn_block_sums_cuda(plan, c, [&](const BatchChunks::Block& b, double* out) {
    cuda::batchnorm_chunk_centered_squares(block_shape(s, b), b.chunks, b.bounds.data(), x + b.begin * bn_sample(s),
                                           dvec.p, out);
  });
  const std::vector<float> g = device_to_host(gamma, c), bt = device_to_host(beta, c);
  std::vector<float> rm = device_to_host(running_mean, c), rv = device_to_host(running_var, c);
  std::vector<float> scale_shift(2 * c), smean(c), sinv(c);
  for (std::size_t i = 0; i < c; ++i) {
    const BnForwardFactors f = bn_forward_finish(sum[i], sq[i], m, g[i], bt[i], eps, momentum, rm[i], rv[i]);
    scale_shift[i] = f.scale;
    scale_shift[c + i] = f.shift;
    smean[i] = f.save_mean;
    sinv[i] = f.save_invstd;
  }
  host_to_device(running_mean, rm);
  host_to_device(running_var, rv);
  host_to_device(save_mean, smean);
  host_to_device(save_invstd, sinv);
  host_to_device(dvec.p + c, scale_shift);
  cuda::batchnorm_scale_shift(s, x, dvec.p + c, dvec.p + 2 * c, y);
}

void bn_backward_cuda(const BatchChunks& plan, const BatchNormShape& s, const float* x, const float* dy,
                      const float* gamma, const float* save_mean, const float* save_invstd, float* dx,
                      float* dgamma, float* dbeta) {
  if (!plan.needs_completion()) {
    const BatchChunks::Block& b = plan.blocks()[0];
    cuda::batchnorm_backward_chunks(s, b.chunks, b.bounds.data(), x, dy, gamma, save_mean, save_invstd, dx,
                                    dgamma, dbeta);
    return;
  }
  const std::size_t c = static_cast<std::size_t>(s.c);
  if (c == 0) return;
  const double m = static_cast<double>(plan.global_batch()) * s.hw;
  // [sum(dy) | sum(dy * (x - mean))], completed in one exchange.
  const std::vector<double> sums = bn_block_sums_cuda(plan, 2 * c, [&](const BatchChunks::Block& b, double* out) {
    const int64_t off = b.begin * bn_sample(s);
    cuda::batchnorm_backward_chunk_sums(block_shape(s, b), b.chunks, b.bounds.data(), x + off, dy + off, save_mean,
                                        out, out + c);
  });
  const std::vector<float> g = device_to_host(gamma, c), inv = device_to_host(save_invstd, c);
  std::vector<float> v(5 * c);  // k, mean_dy, proj, dgamma, dbeta
  for (std::size_t i = 0; i < c; ++i) {
    const BnBackwardFactors f = bn_backward_finish(sums[i], sums[c + i], m, g[i], inv[i]);
    v[i] = f.k;
    v[c + i] = f.mean_dy;
    v[2 * c + i] = f.proj;
    v[3 * c + i] = f.dgamma;
    v[4 * c + i] = f.dbeta;
  }
  DeviceValues<float> dvec(5 * c);
  host_to_device(dvec.p, v);
  cuda::copy(dgamma, dvec.p + 3 * c, sizeof(float) * c, cuda::CopyKind::DeviceToDevice);
  cuda::copy(dbeta, dvec.p + 4 * c, sizeof(float) * c, cuda::CopyKind::DeviceToDevice);
  cuda::batchnorm_backward_apply(s, x, dy, save_mean, dvec.p, dvec.p + c, dvec.p + 2 * c, dx);
}

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

// The chunked forward of a conv or linear layer, block by block (a sample's outputs do
// not depend on the block: each chunk's GEMMs start at its first sample).
template <class Shape, class Op>
void forward_blocks(const BatchChunks& plan, const Shape& s, const float* x, float* y, Op op) {
  for (const BatchChunks::Block& b : plan.blocks())
    op(block_shape(s, b), b.chunks, b.bounds.data(), x + b.begin * in_sample(s), y + b.begin * out_sample(s));
}

// The chunked backward of a conv or linear layer: dx per block, the weight and bias
// gradients from the block sums completed over the blocks and the ranks. `op(shape,
// chunks, bounds, x, dy, dx, dw, db)` is the backend's chunked backward.
template <class Shape, class Op>
void backward_blocks(const BatchChunks& plan, const Shape& s, int out, const float* x, const float* dy, float* dx,
                     Tensor& weight_grad, Tensor& bias_grad, Op op) {
  WeightGradParts dw(plan, weight_grad);
  const std::size_t blocks = plan.blocks().size(), n_out = static_cast<std::size_t>(out);
  const bool cpu = weight_grad.device().is_cpu();
  GradientParts* deferred = plan.needs_completion() ? plan.deferred_gradients() : nullptr;
  std::vector<double> db_host(cpu && !deferred ? blocks * n_out : 0);
  double* db_parts = deferred ? deferred->doubles(bias_grad, blocks) : db_host.data();
  std::optional<DeviceValues<double>> db_device;
  if (!cpu) db_device.emplace(blocks * n_out);
  for (std::size_t i = 0; i < blocks; ++i) {
    const BatchChunks::Block& b = plan.blocks()[i];
    double* db = (cpu ? db_parts : db_device->p) + i * n_out;
    op(block_shape(s, b), b.chunks, b.bounds.data(), x + b.begin * in_sample(s), dy + b.begin * out_sample(s),
       dx ? dx + b.begin * in_sample(s) : nullptr, dw.part(i), db);
  }
  dw.complete();
  if (deferred) return;  // the trainer's pass after backward completes both
  if (cpu) {
    plan.complete(db_host.data(), out, db_host.data());
    store_rounded(db_host.data(), n_out, bias_grad.f32());
  } else {
    finish_bias_grad_cuda(plan, *db_device, n_out, bias_grad.f32());
  }
}

}  // namespace

// ---- Conv2d -------------------------------------------------------------------
Conv2d::Conv2d(const std::string& name, int in_channels, int out_channels, int kernel, int pad)
    : Layer(name), in_(in_channels), out_(out_channels), kernel_(kernel), pad_(pad),
      weight_(make_param(name + ".weight", {out_channels, in_channels, kernel, kernel})),
      bias_(make_param(name + ".bias", {out_channels})) {}

void Conv2d::reset_parameters(Rng& rng) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_ * kernel_ * kernel_));
  init_uniform(weight_.value, bound, rng);
  init_uniform(bias_.value, bound, rng);
}

void Conv2d::to(Device d) {
  move_param(weight_, d);
  move_param(bias_, d);
}

Tensor Conv2d::forward(const Tensor& x, Mode, Rng&) {
  expect_rank(x, 4, name_);
  const Device d = weight_.value.device();
  ConvShape s{static_cast<int>(x.dim(0)), in_, static_cast<int>(x.dim(2)), static_cast<int>(x.dim(3)),
              out_, kernel_, kernel_, pad_};
  ensure(y_, {s.n, s.k, s.out_h(), s.out_w()}, d);
  x_ = x;
  require_one_process(batch_chunks_, d, name_);
  std::optional<BatchChunks> whole;
  const float* w = weight_.value.f32();
  const float* b = bias_.value.f32();
  if (d.is_cpu()) {  // fp32 (on the CPU the fp16 op is the fp32 op)
    forward_blocks(plan_for(batch_chunks_, s.n, name_, whole), s, x.f32(), y_.f32(),
                   [&](const ConvShape& bs, int chunks, const int* bounds, const float* bx, float* by) {
                     cpu::conv2d_forward_chunks(bs, chunks, bounds, bx, w, b, by);
                   });
  } else if (cuda_by_chunks(batch_chunks_)) {
    const bool f16 = precision_ == Precision::Fp16;
    forward_blocks(plan_for(batch_chunks_, s.n, name_, whole), s, x.f32(), y_.f32(),
                   [&](const ConvShape& bs, int chunks, const int* bounds, const float* bx, float* by) {
                     if (f16) cuda::conv2d_forward_chunks_f16(bs, chunks, bounds, bx, w, b, by);
                     else cuda::conv2d_forward_chunks(bs, chunks, bounds, bx, w, b, by);
                   });
  } else if (precision_ == Precision::Fp16) {
    cuda::conv2d_forward_f16(s, x.f32(), weight_.value.f32(), bias_.value.f32(), y_.f32());
  } else {
    cuda::conv2d_forward(s, x.f32(), weight_.value.f32(), bias_.value.f32(), y_.f32());
  }
  return y_;
}

Tensor Conv2d::backward(const Tensor& dy, InputGrad need) {
  const Device d = weight_.value.device();
  ConvShape s{static_cast<int>(x_.dim(0)), in_, static_cast<int>(x_.dim(2)), static_cast<int>(x_.dim(3)),
              out_, kernel_, kernel_, pad_};
  float* dx = nullptr;
  if (need == InputGrad::Needed) dx = ensure(dx_, x_.shape(), d).f32();
  require_one_process(batch_chunks_, d, name_);
  std::optional<BatchChunks> whole;
  const float* w = weight_.value.f32();
  if (d.is_cpu()) {
    backward_blocks(plan_for(batch_chunks_, s.n, name_, whole), s, out_, x_.f32(), dy.f32(), dx, weight_.grad,
                    bias_.grad,
                    [&](const ConvShape& bs, int chunks, const int* bounds, const float* bx, const float* bdy,
                        float* bdx, float* dw, double* db) {
                      cpu::conv2d_backward_chunks(bs, chunks, bounds, bx, w, bdy, bdx, dw, db);
                    });
  } else if (cuda_by_chunks(batch_chunks_)) {
    const bool f16 = precision_ == Precision::Fp16;
    backward_blocks(plan_for(batch_chunks_, s.n, name_, whole), s, out_, x_.f32(), dy.f32(), dx, weight_.grad,
                    bias_.grad,
                    [&](const ConvShape& bs, int chunks, const int* bounds, const float* bx, const float* bdy,
                        float* bdx, float* dw, double* db) {
                      if (f16) cuda::conv2d_backward_chunks_f16(bs, chunks, bounds, bx, w, bdy, bdx, dw, db);
                      else cuda::conv2d_backward_chunks(bs, chunks, bounds, bx, w, bdy, bdx, dw, db);
                    });
  } else if (precision_ == Precision::Fp16) {
    cuda::conv2d_backward_f16(s, x_.f32(), weight_.value.f32(), dy.f32(), dx, weight_.grad.f32(),
                              bias_.grad.f32());
  } else {
    cuda::conv2d_backward(s, x_.f32(), weight_.value.f32(), dy.f32(), dx, weight_.grad.f32(),
                          bias_.grad.f32());
  }
  return need == InputGrad::Needed ? dx_ : Tensor();
}

// ---- BatchNorm2d --------------------------------------------------------------
BatchNorm2d::BatchNorm2d(const std::string& name, int channels, float eps, float momentum)
    : Layer(name), channels_(channels), eps_(eps), momentum_(momentum),
      weight_(make_param(name + ".weight", {channels})), bias_(make_param(name + ".bias", {channels})),
      running_mean_(Tensor::zeros({channels})), running_var_(Tensor::zeros({channels})) {
  weight_.value.copy_from(Tensor::from_vector({channels}, std::vector<float>(channels, 1.0f)));
  running_var_.copy_from(weight_.value);
}

void BatchNorm2d::to(Device d) {
  move_param(weight_, d);
  move_param(bias_, d);
  if (running_mean_.device() != d) {
    running_mean_ = running_mean_.to(d);
    running_var_ = running_var_.to(d);
  }
}

void BatchNorm2d::buffers(StateDict& out) const {
  out.tensors["running_mean"] = running_mean_;
  out.tensors["running_var"] = running_var_;
  out.scalars["num_batches_tracked"] = num_batches_tracked_;
}

void BatchNorm2d::load_buffers(const StateDict& in) {
  running_mean_.copy_from(in.get_tensor("running_mean"));
  running_var_.copy_from(in.get_tensor("running_var"));
  num_batches_tracked_ = in.get_int("num_batches_tracked");
}

Tensor BatchNorm2d::forward(const Tensor& x, Mode mode, Rng&) {
  expect_rank(x, 4, name_);
  const Device d = weight_.value.device();
  BatchNormShape s{static_cast<int>(x.dim(0)), channels_, static_cast<int>(x.dim(2) * x.dim(3))};
  ensure(y_, x.shape(), d);
  if (mode == Mode::Train) {
    x_ = x;
    ensure(save_mean_, {channels_}, d);
    ensure(save_invstd_, {channels_}, d);
    require_one_process(batch_chunks_, d, name_);
    if (d.is_cpu())
      forward_train_chunks(x);
    else if (cuda_by_chunks(batch_chunks_))
      bn_forward_train_cuda(*batch_chunks_, s, x.f32(),
                            weight_.value.f32(), bias_.value.f32(), eps_, momentum_, running_mean_.f32(),
                            running_var_.f32(), save_mean_.f32(), save_invstd_.f32(), y_.f32());
    else
      cuda::batchnorm_forward_train(s, x.f32(), weight_.value.f32(), bias_.value.f32(), eps_, momentum_,
                                    running_mean_.f32(), running_var_.f32(), save_mean_.f32(),
                                    save_invstd_.f32(), y_.f32());
    ++num_batches_tracked_;
  } else {
    ENGINE_DISPATCH(d, batchnorm_forward_eval, s, x.f32(), weight_.value.f32(), bias_.value.f32(),
                    running_mean_.f32(), running_var_.f32(), eps_, y_.f32());
  }
  return y_;
}

Tensor BatchNorm2d::backward(const Tensor& dy, InputGrad) {
  const Device d = weight_.value.device();
  BatchNormShape s{static_cast<int>(x_.dim(0)), channels_, static_cast<int>(x_.dim(2) * x_.dim(3))};
  Tensor dx = dy;  // in place: batchnorm_backward allows dx == dy
  require_one_process(batch_chunks_, d, name_);
  if (d.is_cpu())
    backward_chunks(dy, dx);
  else if (cuda_by_chunks(batch_chunks_))
    bn_backward_cuda(*batch_chunks_, s, x_.f32(), dy.f32(),
                     weight_.value.f32(), save_mean_.f32(), save_invstd_.f32(), dx.f32(), weight_.grad.f32(),
                     bias_.grad.f32());
  else
    cuda::batchnorm_backward(s, x_.f32(), dy.f32(), weight_.value.f32(), save_mean_.f32(),
                             save_invstd_.f32(), dx.f32(), weight_.grad.f32(), bias_.grad.f32());
  return dx;
}

// Synchronised batch norm on the CPU: the statistics of the whole global batch, each
// sum the fixed tree over its chunks. In one process the fused op; across ranks the
// same steps with the sums completed in between (the same bits: kernels/batchnorm_math.h).
void BatchNorm2d::forward_train_chunks(const Tensor& x) {
  BatchNormShape s{static_cast<int>(x.dim(0)), channels_, static_cast<int>(x.dim(2) * x.dim(3))};
  std::optional<BatchChunks> whole;
  const BatchChunks& plan = plan_for(batch_chunks_, s.n, name_, whole);
  if (!plan.needs_completion()) {
    const BatchChunks::Block& b = plan.blocks()[0];
    cpu::batchnorm_forward_train_chunks(s, b.chunks, b.bounds.data(), x.f32(), weight_.value.f32(),
                                        bias_.value.f32(), eps_, momentum_, running_mean_.f32(),
                                        running_var_.f32(), save_mean_.f32(), save_invstd_.f32(), y_.f32());
    return;
  }
  const double m = static_cast<double>(plan.global_batch()) * s.hw;
  const std::size_t c_n = static_cast<std::size_t>(channels_);
  const std::vector<double> sum = bn_block_sums(plan, c_n, [&](const BatchChunks::Block& b, double* out) {
    cpu::batchnorm_chunk_sums(block_shape(s, b), b.chunks, b.bounds.data(), x.f32() + b.begin * bn_sample(s), out);
  });
  std::vector<float> mean_f(c_n), scale(c_n), shift(c_n);
  for (std::size_t c = 0; c < c_n; ++c) mean_f[c] = static_cast<float>(bn_mean(sum[c], m));
  // Centred second pass: no catastrophic cancellation for large means.
  const std::vector<double> sq = bn_block_sums(plan, c_n, [&](const BatchChunks::Block& b, double* out) {
    cpu::batchnorm_chunk_centered_squares(block_shape(s, b), b.chunks, b.bounds.data(),
                                          x.f32() + b.begin * bn_sample(s), mean_f.data(), out);
  });
  for (std::size_t c = 0; c < c_n; ++c) {
    const BnForwardFactors f = bn_forward_finish(sum[c], sq[c], m, weight_.value.f32()[c], bias_.value.f32()[c],
                                                 eps_, momentum_, running_mean_.f32()[c], running_var_.f32()[c]);
    scale[c] = f.scale;
    shift[c] = f.shift;
    save_mean_.f32()[c] = f.save_mean;
    save_invstd_.f32()[c] = f.save_invstd;
  }
  cpu::batchnorm_scale_shift(s, x.f32(), scale.data(), shift.data(), y_.f32());
}

// The backward of synchronised batch norm: sums over the global batch by the tree.
void BatchNorm2d::backward_chunks(const Tensor& dy, Tensor& dx) {
  BatchNormShape s{static_cast<int>(x_.dim(0)), channels_, static_cast<int>(x_.dim(2) * x_.dim(3))};
  std::optional<BatchChunks> whole;
  const BatchChunks& plan = plan_for(batch_chunks_, s.n, name_, whole);
  if (!plan.needs_completion()) {
    const BatchChunks::Block& b = plan.blocks()[0];
    cpu::batchnorm_backward_chunks(s, b.chunks, b.bounds.data(), x_.f32(), dy.f32(), weight_.value.f32(),
                                   save_mean_.f32(), save_invstd_.f32(), dx.f32(), weight_.grad.f32(),
                                   bias_.grad.f32());
    return;
  }
  const double m = static_cast<double>(plan.global_batch()) * s.hw;
  const std::size_t c_n = static_cast<std::size_t>(channels_);
  // [sum(dy) | sum(dy * (x - mean))], completed in one exchange.
  const std::vector<double> sums = bn_block_sums(plan, 2 * c_n, [&](const BatchChunks::Block& b, double* out) {
    const int64_t off = b.begin * bn_sample(s);
    cpu::batchnorm_backward_chunk_sums(block_shape(s, b), b.chunks, b.bounds.data(), x_.f32() + off,
                                       dy.f32() + off, save_mean_.f32(), out, out + c_n);
  });
  std::vector<float> k(c_n), mean_dy(c_n), proj(c_n);
  for (std::size_t c = 0; c < c_n; ++c) {
    const BnBackwardFactors f =
        bn_backward_finish(sums[c], sums[c_n + c], m, weight_.value.f32()[c], save_invstd_.f32()[c]);
    k[c] = f.k;
    mean_dy[c] = f.mean_dy;
    proj[c] = f.proj;
    weight_.grad.f32()[c] = f.dgamma;
    bias_.grad.f32()[c] = f.dbeta;
  }
  cpu::batchnorm_backward_apply(s, x_.f32(), dy.f32(), save_mean_.f32(), k.data(), mean_dy.data(),
                                proj.data(), dx.f32());
}

// ---- ReLU ---------------------------------------------------------------------
Tensor ReLU::forward(const Tensor& x, Mode, Rng&) {
  if (in_place_ == InPlace::Yes)
    y_ = x;
  else
    ensure(y_, x.shape(), x.device());
  ENGINE_DISPATCH(x.device(), relu_forward, x.numel(), x.f32(), y_.f32());
  return y_;
}

Tensor ReLU::backward(const Tensor& dy, InputGrad) {
  if (in_place_ == InPlace::Yes)
    dx_ = dy;
  else
    ensure(dx_, dy.shape(), dy.device());
  ENGINE_DISPATCH(dy.device(), relu_backward, dy.numel(), y_.f32(), dy.f32(), dx_.f32());
  return dx_;
}

// ---- MaxPool2x2 ---------------------------------------------------------------
Tensor MaxPool2x2::forward(const Tensor& x, Mode, Rng&) {
  expect_rank(x, 4, name_);
  if (x.dim(2) % 2 || x.dim(3) % 2)
    throw std::invalid_argument(name_ + ": input height and width must be even, got " +
                                shape_str(x.shape()));
  in_shape_ = x.shape();
  PoolShape s{static_cast<int>(x.dim(0)), static_cast<int>(x.dim(1)), static_cast<int>(x.dim(2)),
              static_cast<int>(x.dim(3))};
  const Shape out{x.dim(0), x.dim(1), x.dim(2) / 2, x.dim(3) / 2};
  ensure(y_, out, x.device());
  ensure(argmax_, out, x.device(), DType::I32);
  ENGINE_DISPATCH(x.device(), maxpool2x2_forward, s, x.f32(), y_.f32(), argmax_.i32());
  return y_;
}

Tensor MaxPool2x2::backward(const Tensor& dy, InputGrad) {
  PoolShape s{static_cast<int>(in_shape_[0]), static_cast<int>(in_shape_[1]),
              static_cast<int>(in_shape_[2]), static_cast<int>(in_shape_[3])};
  ensure(dx_, in_shape_, dy.device());
  ENGINE_DISPATCH(dy.device(), maxpool2x2_backward, s, dy.f32(), argmax_.i32(), dx_.f32());
  return dx_;
}

// ---- Flatten ------------------------------------------------------------------
Tensor Flatten::forward(const Tensor& x, Mode, Rng&) {
  in_shape_ = x.shape();
  // Per-sample size from the shape, not numel / N: a rank may hold no sample of a batch.
  int64_t features = 1;
  for (int d = 1; d < x.rank(); ++d) features *= x.dim(d);
  return x.reshape({x.dim(0), features});
}

Tensor Flatten::backward(const Tensor& dy, InputGrad) { return dy.reshape(in_shape_); }

// ---- Dropout ------------------------------------------------------------------
Tensor Dropout::forward(const Tensor& x, Mode mode, Rng& rng) {
  last_mode_ = mode;
  if (mode == Mode::Eval || p_ == 0.0f) return x;
  ensure(y_, x.shape(), x.device());
  ensure(keep_, x.shape(), x.device(), DType::U8);
  // The draws belong to the global batch: element i of sample j takes the output at
  // first + j * per_sample + i, whichever rank computes sample j.
  const int64_t n = x.rank() > 0 ? x.dim(0) : 0;
  uint64_t per_sample = 1;
  for (int d = 1; d < x.rank(); ++d) per_sample *= static_cast<uint64_t>(x.dim(d));
  std::optional<BatchChunks> whole;
  const BatchChunks& plan = plan_for(batch_chunks_, n, name_, whole);
  require_one_process(batch_chunks_, x.device(), name_);
  const uint64_t first = rng.take(RngStream::Dropout, static_cast<uint64_t>(plan.global_batch()) * per_sample);
  ENGINE_DISPATCH(x.device(), dropout_forward, x.numel(), x.f32(), p_, rng.stream(RngStream::Dropout),
                  first + static_cast<uint64_t>(plan.local_begin()) * per_sample, y_.f32(), keep_.u8());
  return y_;
}

Tensor Dropout::backward(const Tensor& dy, InputGrad) {
  if (last_mode_ == Mode::Eval || p_ == 0.0f) return dy;
  ensure(dx_, dy.shape(), dy.device());
  ENGINE_DISPATCH(dy.device(), dropout_backward, dy.numel(), dy.f32(), keep_.u8(), p_, dx_.f32());
  return dx_;
}

// ---- Linear -------------------------------------------------------------------
Linear::Linear(const std::string& name, int in_features, int out_features)
    : Layer(name), in_(in_features), out_(out_features),
      weight_(make_param(name + ".weight", {out_features, in_features})),
      bias_(make_param(name + ".bias", {out_features})) {}

void Linear::reset_parameters(Rng& rng) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_));
  init_uniform(weight_.value, bound, rng);
  init_uniform(bias_.value, bound, rng);
}

void Linear::to(Device d) {
  move_param(weight_, d);
  move_param(bias_, d);
}

Tensor Linear::forward(const Tensor& x, Mode, Rng&) {
  expect_rank(x, 2, name_);
  if (x.dim(1) != in_)
    throw std::invalid_argument(name_ + ": expected " + std::to_string(in_) + " features, got " +
                                shape_str(x.shape()));
  const Device d = weight_.value.device();
  LinearShape s{static_cast<int>(x.dim(0)), in_, out_};
  ensure(y_, {s.n, out_}, d);
  x_ = x;
  require_one_process(batch_chunks_, d, name_);
  std::optional<BatchChunks> whole;
  const float* w = weight_.value.f32();
  const float* b = bias_.value.f32();
  if (d.is_cpu()) {  // fp32 (on the CPU the fp16 op is the fp32 op)
    forward_blocks(plan_for(batch_chunks_, s.n, name_, whole), s, x.f32(), y_.f32(),
                   [&](const LinearShape& bs, int chunks, const int* bounds, const float* bx, float* by) {
                     cpu::linear_forward_chunks(bs, chunks, bounds, bx, w, b, by);
                   });
  } else if (cuda_by_chunks(batch_chunks_)) {
    const bool f16 = precision_ == Precision::Fp16;
    forward_blocks(plan_for(batch_chunks_, s.n, name_, whole), s, x.f32(), y_.f32(),
                   [&](const LinearShape& bs, int chunks, const int* bounds, const float* bx, float* by) {
                     if (f16) cuda::linear_forward_chunks_f16(bs, chunks, bounds, bx, w, b, by);
                     else cuda::linear_forward_chunks(bs, chunks, bounds, bx, w, b, by);
                   });
  } else if (precision_ == Precision::Fp16) {
    cuda::linear_forward_f16(s, x.f32(), weight_.value.f32(), bias_.value.f32(), y_.f32());
  } else {
    cuda::linear_forward(s, x.f32(), weight_.value.f32(), bias_.value.f32(), y_.f32());
  }
  return y_;
}

Tensor Linear::backward(const Tensor& dy, InputGrad need) {
  const Device d = weight_.value.device();
  LinearShape s{static_cast<int>(x_.dim(0)), in_, out_};
  float* dx = nullptr;
  if (need == InputGrad::Needed) dx = ensure(dx_, x_.shape(), d).f32();
  require_one_process(batch_chunks_, d, name_);
  std::optional<BatchChunks> whole;
  const float* w = weight_.value.f32();
  if (d.is_cpu()) {
    backward_blocks(plan_for(batch_chunks_, s.n, name_, whole), s, out_, x_.f32(), dy.f32(), dx, weight_.grad,
                    bias_.grad,
                    [&](const LinearShape& bs, int chunks, const int* bounds, const float* bx, const float* bdy,
                        float* bdx, float* dw, double* db) {
                      cpu::linear_backward_chunks(bs, chunks, bounds, bx, w, bdy, bdx, dw, db);
                    });
  } else if (cuda_by_chunks(batch_chunks_)) {
    const bool f16 = precision_ == Precision::Fp16;
    backward_blocks(plan_for(batch_chunks_, s.n, name_, whole), s, out_, x_.f32(), dy.f32(), dx, weight_.grad,
                    bias_.grad,
                    [&](const LinearShape& bs, int chunks, const int* bounds, const float* bx, const float* bdy,
                        float* bdx, float* dw, double* db) {
                      if (f16) cuda::linear_backward_chunks_f16(bs, chunks, bounds, bx, w, bdy, bdx, dw, db);
                      else cuda::linear_backward_chunks(bs, chunks, bounds, bx, w, bdy, bdx, dw, db);
                    });
  } else if (precision_ == Precision::Fp16) {
    cuda::linear_backward_f16(s, x_.f32(), weight_.value.f32(), dy.f32(), dx, weight_.grad.f32(),
                              bias_.grad.f32());
  } else {
    cuda::linear_backward(s, x_.f32(), weight_.value.f32(), dy.f32(), dx, weight_.grad.f32(),
                          bias_.grad.f32());
  }
  return need == InputGrad::Needed ? dx_ : Tensor();
}

}  // namespace engine
