// The config sections the nn layer reads: model, optimizer, scheduler and precision
// (docs/config.md). How sections make up the config: engine/io/config_table.h.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "engine/core/device.h"
#include "engine/core/tensor.h"
#include "engine/io/config_table.h"

namespace engine {

// The fixed choices, as the code uses them. JSON files, --set and checkpoints spell them
// as to_string() does; the config reader turns the strings into these, the writer back.
enum class OptimizerName { AdamW, Adam };        // "adamw" (decoupled weight decay) | "adam" (L2)
enum class SchedulerName { Cosine, Constant };   // "cosine" | "constant"

const char* to_string(OptimizerName v);
const char* to_string(SchedulerName v);

struct ModelConfig {
  // A name the model factory knows: the CLI checks it against the registry
  // (engine/nn/models/registry.h, model_names()) with require_choice; a host may bring more.
  std::string name = "fashion_cnn";
  double dropout = 0.25;
  // A safetensors file of the same model (`engine export --format safetensors`) whose
  // weights a fresh run starts from instead of the random initialisation (fine-tuning:
  // weights only, fresh optimizer). Null: none.
  std::optional<std::string> init_from;
};

struct OptimizerConfig {
  OptimizerName name = OptimizerName::AdamW;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

struct SchedulerConfig {
  SchedulerName name = SchedulerName::Cosine;
  std::optional<int64_t> t_max;  // null = train.epochs
  double eta_min = 0.0;
};

struct LossScaleConfig {
  double init = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

struct PrecisionConfig {
  Precision mode = Precision::Fp32;
  LossScaleConfig loss_scale;
};

// The one precision rule: the arithmetic of the conv and linear ops for precision.mode on
// `device`. fp16 and bf16 are CUDA only; the CPU backend is fp32 whatever the mode. Every
// model instance that must compute the trained model's bits (training, verification,
// evaluation, a Classifier) is set to this.
Precision compute_precision(Precision mode, const Device& device);
// Whether precision.mode scales the loss (dynamic loss scaling, engine/nn/scaler.h): fp16
// only. bf16 has fp32's exponent range, so its gradients need no scaling.
bool scales_loss(Precision mode);

const ConfigSection<ModelConfig>& model_config_keys();
const ConfigSection<OptimizerConfig>& optimizer_config_keys();
const ConfigSection<SchedulerConfig>& scheduler_config_keys();
const ConfigSection<PrecisionConfig>& precision_config_keys();

}  // namespace engine
