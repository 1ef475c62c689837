// Batch norm's ops in the facade: one driver for the synchronised batch norm on every
// device and at every world size, and the CUDA whole-batch op beside it.
//
// The driver computes the statistics of the whole global batch, each a per-channel sum
// that is the fixed tree over the batch's chunks. The backend sums each block of this
// process's chunks (BatchChunks::Block); `complete` turns the block sums into the sums
// of the global batch: the tree over the blocks and the ranks (BatchChunks::complete),
// which is the identity for one block in one process. Between the sums, the per-channel
// arithmetic runs on the host with kernels/batchnorm_math.h, so every device and world
// size takes the same steps. With nothing to complete, the backend's fused op does the
// same steps in one pass over memory per channel, with the same bits.
#include <functional>
#include <optional>

#include "core/batch_plan.h"
#include "core/dispatch.h"
#include "core/tensor_ops.h"
#include "kernels/batchnorm_math.h"

namespace engine::tt {

using detail::by_chunks;
using detail::on_host;
using detail::plan_for;
using detail::store;

namespace {

BatchNormShape block_shape(const BatchNormShape& s, const BatchChunks::Block& b) { return {b.count, s.c, s.hw}; }
int64_t per_sample(const BatchNormShape& s) { return static_cast<int64_t>(s.c) * s.hw; }

// Block sums -> global-batch sums, in place in the first n of `parts` (blocks x n).
using Complete = std::function<void(double* parts, int64_t n)>;

Complete complete_over(const BatchChunks& plan) {
  return [&plan](double* parts, int64_t n) { plan.complete(parts, n, parts); };
}

// The driver's one kind of step: `per_block` sums of every block of this process
// (`block_sums(block, shape, offset, out)` runs the backend's op on device memory),
// completed, on the host.
template <class F>
Tensor channel_sums(const BatchChunks& plan, const BatchNormShape& s, Device d, int64_t per_block,
                    const Complete& complete, F block_sums) {
  const auto& blocks = plan.blocks();
  Tensor parts = Tensor::empty({static_cast<int64_t>(blocks.size()), per_block}, DType::F64, d);
  for (std::size_t i = 0; i < blocks.size(); ++i)
    block_sums(blocks[i], block_shape(s, blocks[i]), blocks[i].begin * per_sample(s), parts.f64() + i * per_block);
  Tensor host = on_host(parts);
  complete(host.f64(), per_block);
  return host;
}

Tensor host_floats(int64_t n) { return Tensor::empty({n}, DType::F32); }
Tensor on_device(const Tensor& host, Device d) { return d.is_cpu() ? host : host.to(d); }

void forward_train_steps(const BatchNormShape& s, const BatchChunks& plan, const Complete& complete, const Tensor& x,
                         const Tensor& gamma, const Tensor& beta, float eps, float momentum, Tensor& running_mean,
                         Tensor& running_var, Tensor& save_mean, Tensor& save_invstd, Tensor& y) {
  const Device d = x.device();
  const int64_t c = s.c;
  if (c == 0) return;
  const double m = static_cast<double>(plan.global_batch()) * s.hw;
  const Tensor sum = channel_sums(plan, s, d, c, complete,
                                  [&](const BatchChunks::Block& b, const BatchNormShape& bs, int64_t off, double* out) {
                                    ENGINE_DISPATCH(d, batchnorm_chunk_sums, bs, b.chunks, b.bounds.data(),
                                                    x.f32() + off, out);
                                  });
  Tensor mean = host_floats(c);
  for (int64_t i = 0; i < c; ++i) mean.f32()[i] = static_cast<float>(kernels::bn_mean(sum.f64()[i], m));
  const Tensor mean_on_device = on_device(mean, d);
  // Centred second pass: no catastrophic cancellation for large means.
  const Tensor sq = channel_sums(plan, s, d, c, complete,
                                 [&](const BatchChunks::Block& b, const BatchNormShape& bs, int64_t off, double* out) {
                                   ENGINE_DISPATCH(d, batchnorm_chunk_centered_squares, bs, b.chunks,
                                                   b.bounds.data(), x.f32() + off, mean_on_device.f32(), out);
                                 });
  const Tensor g = on_host(gamma), bt = on_host(beta);
  Tensor rm = on_host(running_mean), rv = on_host(running_var);
  Tensor smean = on_host(save_mean), sinv = on_host(save_invstd);
  Tensor scale_shift = host_floats(2 * c);
  for (int64_t i = 0; i < c; ++i) {
    const kernels::BnForwardFactors f = kernels::bn_forward_finish(sum.f64()[i], sq.f64()[i], m, g.f32()[i],
                                                                   bt.f32()[i], eps, momentum, rm.f32()[i],
                                                                   rv.f32()[i]);
    scale_shift.f32()[i] = f.scale;
    scale_shift.f32()[c + i] = f.shift;
    smean.f32()[i] = f.save_mean;
    sinv.f32()[i] = f.save_invstd;
  }
  store(running_mean, rm);
  store(running_var, rv);
  store(save_mean, smean);
  store(save_invstd, sinv);
  const Tensor factors = on_device(scale_shift, d);
  ENGINE_DISPATCH(d, batchnorm_scale_shift, s, x.f32(), factors.f32(), factors.f32() + c, y.f32());
}

void backward_steps(const BatchNormShape& s, const BatchChunks& plan, const Complete& complete, const Tensor& x,
                    const Tensor& dy, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                    Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const Device d = x.device();
  const int64_t c = s.c;
  if (c == 0) return;
  const double m = static_cast<double>(plan.global_batch()) * s.hw;
  // [sum(dy) | sum(dy * (x - mean))], completed in one exchange.
  const Tensor sums = channel_sums(plan, s, d, 2 * c, complete,
                                   [&](const BatchChunks::Block& b, const BatchNormShape& bs, int64_t off, double* out) {
                                     ENGINE_DISPATCH(d, batchnorm_backward_chunk_sums, bs, b.chunks, b.bounds.data(),
                                                     x.f32() + off, dy.f32() + off, save_mean.f32(), out, out + c);
                                   });
  const Tensor g = on_host(gamma), inv = on_host(save_invstd);
  Tensor factors = host_floats(5 * c);  // k, mean_dy, proj, dgamma, dbeta
  float* v = factors.f32();
  for (int64_t i = 0; i < c; ++i) {
    const kernels::BnBackwardFactors f =
        kernels::bn_backward_finish(sums.f64()[i], sums.f64()[c + i], m, g.f32()[i], inv.f32()[i]);
    v[i] = f.k;
    v[c + i] = f.mean_dy;
    v[2 * c + i] = f.proj;
    v[3 * c + i] = f.dgamma;
    v[4 * c + i] = f.dbeta;
  }
  const Tensor on_d = on_device(factors, d);
  device_copy(d, dgamma.raw(), d, on_d.f32() + 3 * c, sizeof(float) * static_cast<std::size_t>(c));
  device_copy(d, dbeta.raw(), d, on_d.f32() + 4 * c, sizeof(float) * static_cast<std::size_t>(c));
  ENGINE_DISPATCH(d, batchnorm_backward_apply, s, x.f32(), dy.f32(), save_mean.f32(), on_d.f32(), on_d.f32() + c,
                  on_d.f32() + 2 * c, dx.f32());
}

}  // namespace

void batchnorm_forward_train(const BatchCompute& how, const BatchNormShape& s, const Tensor& x,
                             const Tensor& gamma, const Tensor& beta, float eps, float momentum,
                             Tensor& running_mean, Tensor& running_var, Tensor& save_mean,
                             Tensor& save_invstd, Tensor& y) {
  const Device d = x.device();
  if (!by_chunks(how, d)) {
    kernels::cuda::batchnorm_forward_train(s, x.f32(), gamma.f32(), beta.f32(), eps, momentum, running_mean.f32(),
                                           running_var.f32(), save_mean.f32(), save_invstd.f32(), y.f32());
    return;
  }
  std::optional<BatchChunks> whole;
  const BatchChunks& plan = plan_for(how, s.n, whole);
  if (!plan.needs_completion()) {
    const BatchChunks::Block& b = plan.blocks()[0];
    ENGINE_DISPATCH(d, batchnorm_forward_train_chunks, s, b.chunks, b.bounds.data(), x.f32(), gamma.f32(),
                    beta.f32(), eps, momentum, running_mean.f32(), running_var.f32(), save_mean.f32(),
                    save_invstd.f32(), y.f32());
    return;
  }
  forward_train_steps(s, plan, complete_over(plan), x, gamma, beta, eps, momentum, running_mean, running_var,
                      save_mean, save_invstd, y);
}

void batchnorm_backward(const BatchCompute& how, const BatchNormShape& s, const Tensor& x, const Tensor& dy,
                        const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd, Tensor& dx,
                        Tensor& dgamma, Tensor& dbeta) {
  const Device d = x.device();
  if (!by_chunks(how, d)) {
    kernels::cuda::batchnorm_backward(s, x.f32(), dy.f32(), gamma.f32(), save_mean.f32(), save_invstd.f32(),
                                      dx.f32(), dgamma.f32(), dbeta.f32());
    return;
  }
  std::optional<BatchChunks> whole;
  const BatchChunks& plan = plan_for(how, s.n, whole);
  if (!plan.needs_completion()) {
    const BatchChunks::Block& b = plan.blocks()[0];
    ENGINE_DISPATCH(d, batchnorm_backward_chunks, s, b.chunks, b.bounds.data(), x.f32(), dy.f32(), gamma.f32(),
                    save_mean.f32(), save_invstd.f32(), dx.f32(), dgamma.f32(), dbeta.f32());
    return;
  }
  backward_steps(s, plan, complete_over(plan), x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
}

void batchnorm_forward_eval(const BatchNormShape& s, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                            const Tensor& running_mean, const Tensor& running_var, float eps, Tensor& y) {
  ENGINE_DISPATCH(x.device(), batchnorm_forward_eval, s, x.f32(), gamma.f32(), beta.f32(), running_mean.f32(),
                  running_var.f32(), eps, y.f32());
}

}  // namespace engine::tt
