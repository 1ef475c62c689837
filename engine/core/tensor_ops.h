// The op facade, as dlib's tt:: over cpu:: and cuda::: one entry point per op, taking
// tensors. It picks the backend from the tensors' device (kernels/ops.h: cpu or cuda;
// the reference is the tests'), and for the ops that reduce over the batch the way the
// batch is computed: by the fixed chunks of a batch plan (engine/core/batch_chunks.h), or
// whole on CUDA with cuda.batch_chunks off (one process only). Layers, the optimizer,
// the scaler and the trainer call only this; none of them allocates device memory or
// reads a backend switch. Every op's contract is that of kernels/op_list.inc.
#pragma once
#include <cstdint>
#include <string>

#include "engine/core/batch_chunks.h"
#include "engine/core/rng.h"
#include "core/step_values.h"
#include "engine/core/tensor.h"
#include "kernels/ops.h"

namespace engine::tt {

using kernels::BatchNormShape;
using kernels::ConvShape;
using kernels::LinearShape;
using kernels::PoolShape;

// How a layer computes its batch: the chunks of the global batch this process computes
// (null: all of them, in one process), the arithmetic of the conv and linear ops, and
// the layer's name for the errors.
struct BatchCompute {
  const BatchChunks* plan = nullptr;
  Precision precision = Precision::Fp32;
  const std::string& layer;
};

// Convolution and linear layers. The weight and bias gradients are complete on return
// (over the blocks of this process and over the ranks), unless the plan defers them
// (BatchChunks::defer_gradients): then their block sums wait in the GradientParts for
// the trainer's one pass after backward. dx null: not needed.
void conv2d_forward(const BatchCompute& how, const ConvShape& s, const Tensor& x, const Tensor& w,
                    const Tensor& b, Tensor& y);
void conv2d_backward(const BatchCompute& how, const ConvShape& s, const Tensor& x, const Tensor& w,
                     const Tensor& dy, Tensor* dx, Tensor& dw, Tensor& db);
void linear_forward(const BatchCompute& how, const LinearShape& s, const Tensor& x, const Tensor& w,
                    const Tensor& b, Tensor& y);
void linear_backward(const BatchCompute& how, const LinearShape& s, const Tensor& x, const Tensor& w,
                     const Tensor& dy, Tensor* dx, Tensor& dw, Tensor& db);

// Batch norm in training mode: the statistics of the whole global batch (core/batchnorm_ops.cpp,
// one driver for every device and world size). dx may be dy.
void batchnorm_forward_train(const BatchCompute& how, const BatchNormShape& s, const Tensor& x,
                             const Tensor& gamma, const Tensor& beta, float eps, float momentum,
                             Tensor& running_mean, Tensor& running_var, Tensor& save_mean,
                             Tensor& save_invstd, Tensor& y);
void batchnorm_backward(const BatchCompute& how, const BatchNormShape& s, const Tensor& x, const Tensor& dy,
                        const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd, Tensor& dx,
                        Tensor& dgamma, Tensor& dbeta);
void batchnorm_forward_eval(const BatchNormShape& s, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                            const Tensor& running_mean, const Tensor& running_var, float eps, Tensor& y);

// Element-wise and pooling (in place allowed where kernels/op_list.inc allows it).
void relu_forward(const Tensor& x, Tensor& y);
void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx);
void maxpool2x2_forward(const PoolShape& s, const Tensor& x, Tensor& y, Tensor& argmax);
void maxpool2x2_backward(const PoolShape& s, const Tensor& dy, const Tensor& argmax, Tensor& dx);

// Dropout draws belong to the global batch: element i of sample j takes the generator's
// output at first + j * per_sample + i, whichever rank computes sample j; `rng`
// advances by the whole global batch's draws.
void dropout_forward(const BatchCompute& how, const Tensor& x, float p, Rng& rng, Tensor& y, Tensor& keep);
void dropout_backward(const Tensor& dy, const Tensor& keep, float p, Tensor& dx);

// The loss: per-sample cross-entropy of logits' rows (this process's samples of a batch
// of batch_total) into sample_loss and sample_correct from element `first`; dlogits
// (null: not wanted, and grad_scale unread) receives the gradient of the batch-mean loss
// times grad_scale. first and grad_scale are per-step values (StepValues).
void cross_entropy(const Tensor& logits, const Tensor& labels, int batch_total, DeviceValue<float> grad_scale,
                   Tensor* dlogits, Tensor& sample_loss, Tensor& sample_correct, DeviceValue<int64_t> first);

// probs = the row-wise softmax of logits ([n, classes], on one device).
void softmax(const Tensor& logits, Tensor& probs);

// Sum of x[first, first + n) in the fixed order, in double, on the host.
double reduce_sum(const Tensor& x, int64_t first, int64_t n);

// x, labels_out = the n samples images[indices[first + i]] normalised, and their labels;
// first is a per-step value (StepValues).
void gather_batch(const Tensor& images, const Tensor& labels, const Tensor& indices, DeviceValue<int64_t> first,
                  int n, float mean, float std, Tensor& x, Tensor& labels_out);

// One Adam/AdamW step over param[first, first + n) with the moments of that range; f,
// the step's factors, is in device memory (StepValues, or adam_prepare_step's output);
// skip (null ptr: never): no update when it is not 0. With `digests` (bytes: uint64 sums,
// three per slot), sums 3*digest_slot .. +2 receive the step digests of the range's
// param, exp_avg and exp_avg_sq after the step (kernels/step_digest.h; param index
// first + i), added to what they hold.
void adam_update(Tensor& param, const Tensor& grad, int64_t first, int64_t n, Tensor& exp_avg,
                 Tensor& exp_avg_sq, const kernels::AdamHyper& h, DeviceValue<kernels::AdamStepFactors> f,
                 DeviceValue<int32_t> skip = {}, Tensor* digests = nullptr, int64_t digest_slot = 0);

// Step digests (kernels/step_digest.h): sums (bytes: uint64 sums) [slot] += the digest
// of x's float32 elements [first, first + n), each at its index in x.
void digest(const Tensor& x, int64_t first, int64_t n, Tensor& sums, int64_t slot);

// The end of a step's digests (train.step_digests), one launch: ring row *next %
// capacity (bytes: uint64 rows of sums.numel()/8 + ranges + 1 words) receives the sums
// (then zeroed), the digest of each range (bytes: kernels::DigestRange[n_ranges]) and of
// loss[*loss_first, *loss_first + loss_count); *next (bytes: one int64) += 1.
void step_digest_finish(Tensor& sums, int n_ranges, const Tensor& ranges, const Tensor& loss,
                        DeviceValue<int64_t> loss_first, int loss_count, Tensor& ring, Tensor& next, int capacity);

// Adam's step counts and factors on the device: unless *skip, each of the `count` step
// counts in `steps` (bytes: int64[count]) counts up and factors (bytes:
// AdamStepFactors[count]) receives that step's factors with learning rate *lr.
void adam_prepare_step(int count, DeviceValue<double> lr, const kernels::AdamFactorInputs& in,
                       DeviceValue<int32_t> skip, Tensor& steps, Tensor& factors);

// The loss scaler's state on a device (bytes: one kernels::LossScaleState).
// unscale_check: grad *= its inv_scale_f32, its found_inf set to 1 on inf or NaN.
// loss_scale_update: the GradScaler update of the state, found_inf cleared.
void unscale_check(Tensor& grad, Tensor& scaler_state);
void loss_scale_update(Tensor& scaler_state, const kernels::LossScaleRule& rule);

}  // namespace engine::tt
