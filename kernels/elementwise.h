// Per-element math shared by the CPU and CUDA backends (one definition each).
#pragma once
#include <cmath>
#include <cstdint>

#include "engine/kernels/hd.h"
#include "engine/kernels/philox.h"
#include "kernels/det_math.h"

namespace engine::kernels {

ENGINE_HD float relu(float x) { return x > 0.0f ? x : 0.0f; }
// Gradient through ReLU from its output: positive output means the input was positive.
ENGINE_HD float relu_grad(float y, float dy) { return y > 0.0f ? dy : 0.0f; }

// Dropout keep decision for element `i`: keep when its uniform draw is >= p.
ENGINE_HD bool dropout_keep(PhiloxStream s, uint64_t offset, uint64_t i, float p) {
  return philox_uniform(philox_at(s, offset + i)) >= p;
}
// The predicted class of a row of logits: the first maximum (a later class wins only
// when strictly greater; a NaN never wins), as the reference's cross-entropy counts it.
ENGINE_HD int argmax_first(const float* z, int classes) {
  int arg = 0;
  for (int k = 1; k < classes; ++k)
    if (z[k] > z[arg]) arg = k;
  return arg;
}

// Softmax of one row of logits: e^(z_k - z_max) / sum, in double around the first
// maximum. `exp` is the backend's double exponential: det::exp on the CPU (the same
// bits on every CPU), the GPU's own on CUDA.
template <class Exp>
ENGINE_HD void softmax_row(const float* z, int classes, float* probs, Exp exp) {
  const double zmax = z[argmax_first(z, classes)];
  double sum = 0;
  for (int k = 0; k < classes; ++k) sum += exp(static_cast<double>(z[k]) - zmax);
  for (int k = 0; k < classes; ++k) probs[k] = static_cast<float>(exp(static_cast<double>(z[k]) - zmax) / sum);
}

// Inverted dropout: kept values are scaled by 1/(1-p) so eval needs no rescale.
ENGINE_HD float dropout_scale(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }

enum class WeightDecayMode : int { Decoupled = 0, L2 = 1 };  // AdamW, Adam

struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  WeightDecayMode decay = WeightDecayMode::Decoupled;
};

// Per-step factors computed once per tensor on the host in double and rounded to
// float, as PyTorch does with its Python-float hyper-parameters (1 - 0.999 computed in
// float32 would be off by 1e-5 relative):
//   step_size = lr / (1 - b1^t), bias_correction2_sqrt = sqrt(1 - b2^t),
//   decay_factor = 1 - lr*wd, one_minus_beta1 = 1 - b1, one_minus_beta2 = 1 - b2.
struct AdamStepFactors {
  float step_size;
  float bias_correction2_sqrt;
  float decay_factor;
  float one_minus_beta1;
  float one_minus_beta2;
};

// The constants of Adam's per-step factors.
struct AdamFactorInputs {
  double beta1 = 0.9, beta2 = 0.999, weight_decay = 0.0;
};

// The factors of step t (1 for the first), in double as PyTorch computes them for a
// CPU step count, each rounded to float once; beta^t by the engine's own power, so the
// host and the GPU (no contraction: -ffp-contract=off, -fmad=false) get the same bits.
ENGINE_HD AdamStepFactors adam_factors_at(double lr, const AdamFactorInputs& in, int64_t t) {
  AdamStepFactors f;
  f.step_size = static_cast<float>(lr / (1.0 - det::pow_int(in.beta1, t)));
  f.bias_correction2_sqrt = static_cast<float>(::sqrt(1.0 - det::pow_int(in.beta2, t)));
  f.decay_factor = static_cast<float>(1.0 - lr * in.weight_decay);
  f.one_minus_beta1 = static_cast<float>(1.0 - in.beta1);
  f.one_minus_beta2 = static_cast<float>(1.0 - in.beta2);
  return f;
}

// One element of Adam/AdamW, in PyTorch's order of operations:
//   AdamW: p *= 1 - lr*wd;  Adam: g += wd*p
//   m = lerp(m, g, 1-b1);  v = b2*v + (1-b2)*g*g
//   p -= step_size * m / (sqrt(v)/sqrt(1-b2^t) + eps)
ENGINE_HD void adam_element(float& p, float g, float& m, float& v, const AdamHyper& h,
                            AdamStepFactors f) {
  if (h.weight_decay != 0.0f) {
    if (h.decay == WeightDecayMode::Decoupled)
      p = p * f.decay_factor;
    else
      g = g + h.weight_decay * p;
  }
  m = m + f.one_minus_beta1 * (g - m);  // torch's m.lerp_(g, 1-b1) for weights < 0.5
  v = v * h.beta2 + f.one_minus_beta2 * g * g;
  const float denom = sqrtf(v) / f.bias_correction2_sqrt + h.eps;
  p = p - f.step_size * (m / denom);
}

// Loss-scaler: unscale one gradient element; report whether it is inf or NaN.
ENGINE_HD bool unscale_element(float& g, float inv_scale) {
  g = g * inv_scale;
  return !(g - g == 0.0f);  // inf - inf and NaN - NaN are NaN
}

// The loss scaler's evolving state (engine/nn/scaler.h), in device memory when the scaler
// runs on a GPU, so that no step reads anything back to the host.
struct LossScaleState {
  double scale = 1.0;
  int64_t growth_tracker = 0;
  float scale_f32 = 1.0f;      // the loss's multiplier: scale rounded to float
  float inv_scale_f32 = 1.0f;  // the gradients' unscale factor: 1/scale rounded to float
  int32_t found_inf = 0;       // set by unscale_check, cleared by the update
  int32_t unused = 0;
};
struct LossScaleRule {
  double growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};
// The two factors the step uses, from the scale (GradScaler rounds 1/scale to float).
ENGINE_HD void loss_scale_factors(LossScaleState& s) {
  s.scale_f32 = static_cast<float>(s.scale);
  s.inv_scale_f32 = static_cast<float>(1.0 / s.scale);
}
// GradScaler's update after a step: an inf or NaN gradient (the step was skipped) backs
// the scale off and resets the tracker; otherwise the tracker counts up, and at
// growth_interval the scale grows, unless that makes it infinite. Clears found_inf.
ENGINE_HD void loss_scale_update_rule(LossScaleState& s, const LossScaleRule& r) {
  if (s.found_inf) {
    s.scale *= r.backoff_factor;
    s.growth_tracker = 0;
  } else if (++s.growth_tracker == r.growth_interval) {
    const double grown = s.scale * r.growth_factor;
    if (grown - grown == 0.0) s.scale = grown;  // finite
    s.growth_tracker = 0;
  }
  loss_scale_factors(s);
  s.found_inf = 0;
}

// Normalised pixel from a uint8 image byte.
ENGINE_HD float normalize_pixel(uint8_t byte, float mean, float inv_std) {
  return (static_cast<float>(byte) * (1.0f / 255.0f) - mean) * inv_std;
}

}  // namespace engine::kernels
