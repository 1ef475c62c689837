#include "engine/nn/config_sections.h"

#include "io/config_keys.h"

namespace engine {

const char* to_string(OptimizerName v) { return v == OptimizerName::AdamW ? "adamw" : "adam"; }
const char* to_string(SchedulerName v) { return v == SchedulerName::Cosine ? "cosine" : "constant"; }

Precision compute_precision(Precision mode, const Device& device) {
  return device.is_cuda() ? mode : Precision::Fp32;
}

bool scales_loss(Precision mode) { return mode == Precision::Fp16; }

namespace {
bool positive(double v) { return v > 0; }
bool non_negative(double v) { return v >= 0; }
}  // namespace

const ConfigSection<ModelConfig>& model_config_keys() {
  using S = ModelConfig;
  static const ConfigSection<S> keys = {
      // The models are known to the registry: the CLI checks with require_choice against model_names().
      nonempty_string_key("name", &S::name, "`fashion_cnn`, `mlp`",
          R"doc(The network architecture (`engine/nn/models/registry.h`): `fashion_cnn`, the CNN of `engine/nn/models/fashion_cnn.h`; `mlp`, flatten → Linear(784, 128) → ReLU → dropout → Linear(128, 10) (`engine/nn/models/mlp.h`). The list is the registry's (`model_names()`); the CLI checks the name against it, and a program embedding the library may pass models of its own.)doc"),
      real_key("dropout", &S::dropout, [](double v) { return v >= 0 && v < 1; }, "must be in [0, 1)", "[0, 1)",
          R"doc(Dropout probability in the network. `0` disables dropout.)doc"),
      {"init_from", "string, nullable", "a path",
       R"doc(A safetensors file of the same model (written by `engine export --format safetensors`, or PyTorch's `safetensors.torch.save_file` of the reference module's `state_dict()`) whose weights a fresh run starts from instead of the random initialisation: fine-tuning, weights only, with a fresh optimizer, scheduler and counters. The file must hold exactly the model's state (every parameter and BatchNorm buffer, PyTorch's names, float32, `num_batches_tracked` int64); missing or unexpected tensors are refused as a strict load reports them. A run that resumes from its `last.h5` takes its weights from there. `null`: the random initialisation ([export.md](export.md)).)doc",
       [](const ConfigReader& r, const std::string& dotted, S& s) {
         const nlohmann::json* v = r.find(dotted);
         if (!v) return;
         if (v->is_null()) {
           s.init_from.reset();
           return;
         }
         std::string path;
         r.nonempty_string(dotted, path);
         s.init_from = path;
       },
       [](const S& s) { return s.init_from ? nlohmann::json(*s.init_from) : nlohmann::json(nullptr); }},
  };
  return keys;
}

const ConfigSection<OptimizerConfig>& optimizer_config_keys() {
  using S = OptimizerConfig;
  static const ConfigSection<S> keys = {
      choice_key("name", &S::name, {OptimizerName::AdamW, OptimizerName::Adam}, "`adamw`, `adam`",
          R"doc(`adamw` applies decoupled weight decay: the weights shrink by `lr · weight_decay`, independent of the gradient. `adam` adds `weight_decay · w` to the gradient (L2 regularisation), as PyTorch's `Adam` does.)doc"),
      real_key("lr", &S::lr, positive, "must be > 0", "> 0",
          R"doc(Base learning rate. The scheduler starts from this value.)doc"),
      {"betas", "array of 2 reals", "each in [0, 1)",
       R"doc(`[beta1, beta2]`: decay rates of the first- and second-moment estimates.)doc",
       [](const ConfigReader& r, const std::string& dotted, S& s) {
         const nlohmann::json* betas = r.find(dotted);
         if (!betas) return;
         if (!betas->is_array() || betas->size() != 2)
           r.fail(dotted, "must be an array of 2 numbers [beta1, beta2], got " + describe_json(*betas));
         double* targets[2] = {&s.beta1, &s.beta2};
         for (size_t i = 0; i < 2; ++i) {
           const std::string key = dotted + "[" + std::to_string(i) + "]";
           const double b = r.real_value(key, (*betas)[i]);
           if (!(b >= 0 && b < 1)) r.fail(key, "must be in [0, 1), got " + short_json((*betas)[i]));
           *targets[i] = b;
         }
       },
       [](const S& s) { return nlohmann::json::array({s.beta1, s.beta2}); }},
      real_key("eps", &S::eps, positive, "must be > 0", "> 0",
          R"doc(Added to the denominator for numerical stability.)doc"),
      real_key("weight_decay", &S::weight_decay, non_negative, "must be >= 0", "≥ 0",
          R"doc(Weight decay coefficient (see `optimizer.name`).)doc"),
  };
  return keys;
}

const ConfigSection<SchedulerConfig>& scheduler_config_keys() {
  using S = SchedulerConfig;
  static const ConfigSection<S> keys = {
      choice_key("name", &S::name, {SchedulerName::Cosine, SchedulerName::Constant}, "`cosine`, `constant`",
          R"doc(`cosine` follows the closed form of PyTorch's `CosineAnnealingLR`: `lr(e) = eta_min + (lr − eta_min) · (1 + cos(π · e / t_max)) / 2`. `constant` keeps `optimizer.lr` throughout.)doc"),
      nullable_integer_key("t_max", &S::t_max, 1, "≥ 1",
          R"doc(Half-period of the cosine in epochs. `null` means `train.epochs`, so the rate reaches `eta_min` at the end of training.)doc"),
      real_key("eta_min", &S::eta_min, non_negative, "must be >= 0", "≥ 0",
          R"doc(The lowest learning rate of the cosine.)doc"),
  };
  return keys;
}

const ConfigSection<PrecisionConfig>& precision_config_keys() {
  using S = PrecisionConfig;
  using L = LossScaleConfig;
  static const ConfigSection<L> loss_scale = {
      real_key("init", &L::init, positive, "must be > 0", "> 0, finite",
          R"doc(Initial loss scale.)doc"),
      real_key("growth_factor", &L::growth_factor, [](double v) { return v > 1; }, "must be > 1", "> 1",
          R"doc(The scale is multiplied by this after `growth_interval` consecutive steps without overflow.)doc"),
      real_key("backoff_factor", &L::backoff_factor, [](double v) { return v > 0 && v < 1; },
               "must be in (0, 1)", "(0, 1)",
          R"doc(The scale is multiplied by this when a step's gradients overflow. That step is skipped.)doc"),
      integer_key("growth_interval", &L::growth_interval, 1, kConfigInt64Max, "≥ 1",
          R"doc(Number of consecutive overflow-free steps before the scale grows.)doc"),
  };
  static const ConfigSection<S> keys = [] {
    ConfigSection<S> k = {
        choice_key("mode", &S::mode, {Precision::Fp32, Precision::Fp16, Precision::Bf16},
          "`fp32`, `fp16`, `bf16`",
          R"doc(`fp16` trains with half-precision activations and dynamic loss scaling, and keeps fp32 master weights. `bf16` runs the convolutions and linear layers on bfloat16 inputs with fp32 accumulation, also with fp32 master weights, and without loss scaling: bfloat16 has fp32's exponent range (the `loss_scale` keys are not used; the scale stays 1). **Both need the CUDA backend.** On the CPU the engine runs in fp32. The loss scaler's saved state is then kept unchanged, so a checkpoint can move between a CPU run and a GPU run.)doc"),
    };
    nest(k, "loss_scale", &S::loss_scale, loss_scale);
    return k;
  }();
  return keys;
}

}  // namespace engine
