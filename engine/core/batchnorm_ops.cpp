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
// same steps with the same bits. With completions, the CPU's forward takes the channels
// in groups of about 512 KiB, each group's steps and exchanges in turn, so that the
// passes between two exchanges find the group in cache (a whole layer's x is 6.4 MB at
// conv1 of a 2-rank step): more exchanges, of a few hundred bytes each. The backward
// takes the whole layer, as the fused op does: its sums go image by image over every
// channel, and one channel at a time read its planes one image apart.
#include <algorithm>
#include <functional>
#include <optional>
#include <vector>

#include "core/batch_plan.h"
#include "core/dispatch.h"
#include "core/tensor_ops.h"
#include "kernels/batchnorm_math.h"

namespace engine::tt {

using detail::by_chunks;
using detail::OpChecks;
using detail::on_host;
using detail::plan_for;
using detail::store;

namespace {

int64_t elements(const BatchNormShape& s) { return static_cast<int64_t>(s.n) * s.c * s.hw; }
bool valid(const BatchNormShape& s) { return s.n >= 0 && s.c >= 0 && s.hw >= 0 && s.all_channels(); }
constexpr const char* kValidText = "a non-negative shape over every channel";

BatchNormShape block_shape(const BatchNormShape& s, const BatchChunks::Block& b) { return {b.count, s.c, s.hw}; }
int64_t per_sample(const BatchNormShape& s) { return static_cast<int64_t>(s.c) * s.hw; }

// Block sums -> global-batch sums, in place in the first n of `parts` (blocks x n).
using Complete = std::function<void(double* parts, int64_t n)>;

Complete complete_over(const BatchChunks& plan) {
  return [&plan](double* parts, int64_t n) { plan.complete(parts, n, parts); };
}

// The channels one group of the steps takes. On the CPU with every rank on this host,
// each pass between two exchanges re-reads the group's part of x (and dy) from cache
// instead of memory. On CUDA, and across hosts (where each of the extra exchanges would
// cost a network round trip, more than the memory pass it saves), the group is the whole
// layer. Any grouping gives the same bits (every sum is per channel), but every rank
// must walk the same groups, one exchange each: the size follows from the global batch
// split evenly, never from this rank's share or its thread count.
int channels_per_group(Device d, const BatchChunks& plan, const BatchNormShape& s, int tensors) {
  if (d.is_cuda() || !plan.one_host()) return s.c;
  const int64_t world = plan.world_size();
  BatchNormShape even = s;
  even.n = static_cast<int>((plan.global_batch() + world - 1) / world);
  return kernels::cpu::batchnorm_channel_group(even, tensors);
}

// The driver's one kind of step: the sums of `width` values per block (columns
// `columns` of each block's row, those a group's channels fill), of every block of this
// process (`block_sums(block, shape, offset, row)` runs the backend's op on device
// memory, writing the group's columns of `row`), completed, on the host: out[j] is the
// global sum of column columns[j].
template <class F>
std::vector<double> group_sums(const BatchChunks& plan, const BatchNormShape& s, Tensor& parts,
                               const std::vector<int64_t>& columns, const Complete& complete, F block_sums) {
  const auto& blocks = plan.blocks();
  const int64_t width = parts.dim(1);
  for (std::size_t i = 0; i < blocks.size(); ++i)
    block_sums(blocks[i], block_shape(s, blocks[i]), blocks[i].begin * per_sample(s), parts.f64() + i * width);
  const Tensor host = on_host(parts);
  const std::size_t n = columns.size();
  std::vector<double> packed(blocks.size() * n);
  for (std::size_t i = 0; i < blocks.size(); ++i)
    for (std::size_t j = 0; j < n; ++j) packed[i * n + j] = host.f64()[static_cast<int64_t>(i) * width + columns[j]];
  complete(packed.data(), static_cast<int64_t>(n));
  packed.resize(n);
  return packed;
}

std::vector<int64_t> channel_columns(int c0, int c1, int64_t repeat_every, int repeats) {
  std::vector<int64_t> cols;
  for (int r = 0; r < repeats; ++r)
    for (int c = c0; c < c1; ++c) cols.push_back(r * repeat_every + c);
  return cols;
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
  const int64_t blocks = static_cast<int64_t>(plan.blocks().size());
  Tensor parts = Tensor::empty({blocks, c}, DType::F64, d);
  const Tensor g = on_host(gamma), bt = on_host(beta);
  Tensor rm = on_host(running_mean), rv = on_host(running_var);
  Tensor smean = on_host(save_mean), sinv = on_host(save_invstd);
  Tensor mean = host_floats(c), scale_shift = host_floats(2 * c);
  const int group = channels_per_group(d, plan, s, 1);
  for (int c0 = 0; c0 < s.c; c0 += group) {
    const int c1 = std::min(s.c, c0 + group);
    const std::vector<int64_t> columns = channel_columns(c0, c1, c, 1);
    auto in_group = [c0, c1](BatchNormShape bs) {
      bs.c_begin = c0;
      bs.c_end = c1;
      return bs;
    };
    const std::vector<double> sum =
        group_sums(plan, s, parts, columns, complete,
                   [&](const BatchChunks::Block& b, const BatchNormShape& bs, int64_t off, double* row) {
                     detail::ops_on(d).batchnorm_chunk_sums(in_group(bs), b.chunks, b.bounds.data(),
                                     x.f32() + off, row);
                   });
    for (int i = c0; i < c1; ++i) mean.f32()[i] = static_cast<float>(kernels::bn_mean(sum[i - c0], m));
    const Tensor mean_on_device = on_device(mean, d);
    // Centred second pass: no catastrophic cancellation for large means.
    const std::vector<double> sq =
        group_sums(plan, s, parts, columns, complete,
                   [&](const BatchChunks::Block& b, const BatchNormShape& bs, int64_t off, double* row) {
                     detail::ops_on(d).batchnorm_chunk_centered_squares(in_group(bs), b.chunks, b.bounds.data(),
                                     x.f32() + off, mean_on_device.f32(), row);
                   });
    for (int i = c0; i < c1; ++i) {
      const kernels::BnForwardFactors f = kernels::bn_forward_finish(
          sum[i - c0], sq[i - c0], m, g.f32()[i], bt.f32()[i], eps, momentum, rm.f32()[i], rv.f32()[i]);
      scale_shift.f32()[i] = f.scale;
      scale_shift.f32()[c + i] = f.shift;
      smean.f32()[i] = f.save_mean;
      sinv.f32()[i] = f.save_invstd;
    }
    const Tensor factors = on_device(scale_shift, d);
    detail::ops_on(d).batchnorm_scale_shift(in_group(s), x.f32(), factors.f32(), factors.f32() + c, y.f32());
  }
  store(running_mean, rm);
  store(running_var, rv);
  store(save_mean, smean);
  store(save_invstd, sinv);
}

void backward_steps(const BatchNormShape& s, const BatchChunks& plan, const Complete& complete, const Tensor& x,
                    const Tensor& dy, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd,
                    Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const Device d = x.device();
  const int64_t c = s.c;
  if (c == 0) return;
  const double m = static_cast<double>(plan.global_batch()) * s.hw;
  const int64_t blocks = static_cast<int64_t>(plan.blocks().size());
  // Each block's row: [sum(dy) | sum(dy * (x - mean))]; a group's columns of both halves
  // are completed in one exchange.
  Tensor parts = Tensor::empty({blocks, 2 * c}, DType::F64, d);
  const Tensor g = on_host(gamma), inv = on_host(save_invstd);
  Tensor factors = host_floats(5 * c);  // k, mean_dy, proj, dgamma, dbeta
  float* v = factors.f32();
  Tensor on_d;  // the factors where the op runs: after the last group, every channel's
  // The whole layer in one group, one exchange, on every device: the CPU's sums and dx
  // run image by image (a group of a few channels read each plane one image apart, and
  // a 2-rank epoch took about 1.2x the one-process one, which ran image by image).
  const int group = s.c;
  for (int c0 = 0; c0 < s.c; c0 += group) {
    const int c1 = std::min(s.c, c0 + group);
    const int64_t n = c1 - c0;
    auto in_group = [c0, c1](BatchNormShape bs) {
      bs.c_begin = c0;
      bs.c_end = c1;
      return bs;
    };
    const std::vector<double> sums =
        group_sums(plan, s, parts, channel_columns(c0, c1, c, 2), complete,
                   [&](const BatchChunks::Block& b, const BatchNormShape& bs, int64_t off, double* row) {
                     detail::ops_on(d).batchnorm_backward_chunk_sums(in_group(bs), b.chunks, b.bounds.data(),
                                     x.f32() + off, dy.f32() + off, save_mean.f32(), row, row + c);
                   });
    for (int i = c0; i < c1; ++i) {
      const kernels::BnBackwardFactors f =
          kernels::bn_backward_finish(sums[i - c0], sums[n + i - c0], m, g.f32()[i], inv.f32()[i]);
      v[i] = f.k;
      v[c + i] = f.mean_dy;
      v[2 * c + i] = f.proj;
      v[3 * c + i] = f.dgamma;
      v[4 * c + i] = f.dbeta;
    }
    on_d = on_device(factors, d);
    detail::ops_on(d).batchnorm_backward_apply(in_group(s), x.f32(), dy.f32(), save_mean.f32(), on_d.f32(),
                    on_d.f32() + c, on_d.f32() + 2 * c, dx.f32());
  }
  device_copy(d, dgamma.raw(), d, on_d.f32() + 3 * c, sizeof(float) * static_cast<std::size_t>(c));
  device_copy(d, dbeta.raw(), d, on_d.f32() + 4 * c, sizeof(float) * static_cast<std::size_t>(c));
}

}  // namespace

void batchnorm_forward_train(const BatchCompute& how, const BatchNormShape& s, const Tensor& x,
                             const Tensor& gamma, const Tensor& beta, float eps, float momentum,
                             Tensor& running_mean, Tensor& running_var, Tensor& save_mean,
                             Tensor& save_invstd, Tensor& y) {
  const Device d = OpChecks("batchnorm_forward_train", &how.layer)
                       .that(valid(s), kValidText)
                       .exact("x", x, DType::F32, elements(s))
                       .exact("gamma", gamma, DType::F32, s.c)
                       .exact("beta", beta, DType::F32, s.c)
                       .exact("running_mean", running_mean, DType::F32, s.c)
                       .exact("running_var", running_var, DType::F32, s.c)
                       .exact("save_mean", save_mean, DType::F32, s.c)
                       .exact("save_invstd", save_invstd, DType::F32, s.c)
                       .exact("y", y, DType::F32, elements(s))
                       .device();
  if (!by_chunks(how, d)) {
    detail::ops_on(d).batchnorm_forward_train(s, kernels::BatchSplit{}, x.f32(), gamma.f32(), beta.f32(), eps,
                                              momentum, running_mean.f32(), running_var.f32(), save_mean.f32(),
                                              save_invstd.f32(), y.f32());
    return;
  }
  std::optional<BatchChunks> whole;
  const BatchChunks& plan = plan_for(how, s.n, whole);
  if (!plan.needs_completion()) {
    const BatchChunks::Block& b = plan.blocks()[0];
    detail::ops_on(d).batchnorm_forward_train(s, kernels::BatchSplit{b.chunks, b.bounds.data()}, x.f32(), gamma.f32(),
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
  const Device d = OpChecks("batchnorm_backward", &how.layer)
                       .that(valid(s), kValidText)
                       .exact("x", x, DType::F32, elements(s))
                       .exact("dy", dy, DType::F32, elements(s))
                       .exact("gamma", gamma, DType::F32, s.c)
                       .exact("save_mean", save_mean, DType::F32, s.c)
                       .exact("save_invstd", save_invstd, DType::F32, s.c)
                       .exact("dx", dx, DType::F32, elements(s))
                       .exact("dgamma", dgamma, DType::F32, s.c)
                       .exact("dbeta", dbeta, DType::F32, s.c)
                       .device();
  if (!by_chunks(how, d)) {
    detail::ops_on(d).batchnorm_backward(s, kernels::BatchSplit{}, x.f32(), dy.f32(), gamma.f32(), save_mean.f32(),
                                         save_invstd.f32(), dx.f32(), dgamma.f32(), dbeta.f32());
    return;
  }
  std::optional<BatchChunks> whole;
  const BatchChunks& plan = plan_for(how, s.n, whole);
  if (!plan.needs_completion()) {
    const BatchChunks::Block& b = plan.blocks()[0];
    detail::ops_on(d).batchnorm_backward(s, kernels::BatchSplit{b.chunks, b.bounds.data()}, x.f32(), dy.f32(),
                                         gamma.f32(), save_mean.f32(), save_invstd.f32(), dx.f32(), dgamma.f32(),
                                         dbeta.f32());
    return;
  }
  backward_steps(s, plan, complete_over(plan), x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
}

void batchnorm_forward_eval(const BatchNormShape& s, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                            const Tensor& running_mean, const Tensor& running_var, float eps, Tensor& y) {
  const Device d = OpChecks("batchnorm_forward_eval")
                       .that(valid(s), kValidText)
                       .exact("x", x, DType::F32, elements(s))
                       .exact("gamma", gamma, DType::F32, s.c)
                       .exact("beta", beta, DType::F32, s.c)
                       .exact("running_mean", running_mean, DType::F32, s.c)
                       .exact("running_var", running_var, DType::F32, s.c)
                       .exact("y", y, DType::F32, elements(s))
                       .device();
  detail::ops_on(d).batchnorm_forward_eval(s, x.f32(), gamma.f32(), beta.f32(), running_mean.f32(),
                  running_var.f32(), eps, y.f32());
}

}  // namespace engine::tt
