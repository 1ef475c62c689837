// Per-channel batch-norm arithmetic between the sums and the element-wise passes, in
// one place: the fused one-process ops (cpu::batchnorm_forward_train,
// cpu::batchnorm_backward) and BatchNorm2d's data-parallel path (sums completed
// over the ranks in between) call these, so both give the same bits.
#pragma once
#include <cmath>

#include "engine/kernels/hd.h"

namespace engine::kernels {

// The mean from the tree sum of x over m elements (double, and rounded for the centred pass).
inline double bn_mean(double sum, double m) { return sum / m; }

// The running statistics after a training batch of m elements with mean `mean` and
// centred sum of squares `sq`: the unbiased variance (PyTorch's convention), blended
// by `momentum`. The one definition, for every backend and path (the reference keeps
// its own, written out, on purpose).
ENGINE_HD void bn_update_running(double mean, double sq, double m, float momentum, float& running_mean,
                                 float& running_var) {
  const double unbiased = m > 1 ? sq / (m - 1) : sq / m;
  const double mom = momentum;
  running_mean = static_cast<float>((1.0 - mom) * running_mean + mom * mean);
  running_var = static_cast<float>((1.0 - mom) * running_var + mom * unbiased);
}

struct BnForwardFactors {
  float scale, shift;         // y = x * scale + shift
  float save_mean, save_invstd;
};

// From the tree sums of x and of (x - mean_f)^2: the normalisation factors, the saved
// statistics, and the running statistics updated (unbiased variance) in place.
inline BnForwardFactors bn_forward_finish(double sum, double sq, double m, float gamma, float beta, float eps,
                                          float momentum, float& running_mean, float& running_var) {
  const double mean = sum / m;
  const double var = sq / m;  // biased: used to normalise
  const double invstd = 1.0 / std::sqrt(var + eps);
  BnForwardFactors f;
  f.scale = static_cast<float>(invstd * gamma);
  f.shift = static_cast<float>(beta - mean * invstd * gamma);
  bn_update_running(mean, sq, m, momentum, running_mean, running_var);
  f.save_mean = static_cast<float>(mean);
  f.save_invstd = static_cast<float>(invstd);
  return f;
}

struct BnBackwardFactors {
  float k, mean_dy, proj;  // dx = k * (dy - mean_dy - (x - mean) * proj)
  float dgamma, dbeta;
};

// From the tree sums of dy and of dy * (x - mean) over m elements.
inline BnBackwardFactors bn_backward_finish(double sum_dy, double sum_dy_xc, double m, float gamma, float invstd) {
  const double sum_dy_xhat = sum_dy_xc * invstd;
  BnBackwardFactors f;
  f.k = gamma * invstd;
  f.mean_dy = static_cast<float>(sum_dy / m);
  f.proj = static_cast<float>(sum_dy_xhat / m * invstd);  // per unit of (x - mean)
  f.dgamma = static_cast<float>(sum_dy_xhat);
  f.dbeta = static_cast<float>(sum_dy);
  return f;
}

}  // namespace engine::kernels
