#include "engine/train/trainer.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "engine/core/batch_chunks.h"
#include "engine/core/build_info.h"
#include "core/step_values.h"
#include "engine/train/export.h"
#include "train/run_protocol.h"
#include "train/save_verification.h"
#include "train/step_graphs.h"
#include "train/time_budget.h"
#include "train/trainer_common.h"

// The Trainer's construction and its state: the state groups, snapshot() and restore().
// The step and evaluation are in trainer_step.cpp, fit() and its loop in run_loop.cpp.

namespace engine {

namespace {
// CUDA ranks are opt-in until tools/gpu-check.sh (stage ranks) has run them on a GPU.
bool cuda_ranks_enabled() {
  const char* v = std::getenv("ENGINE_CUDA_RANKS");
  return v && std::string(v) == "1";
}
// The partial-epoch loss buffer (trainer/epoch_sample_loss) has one entry per training
// image. At an epoch boundary it holds nothing (the next epoch starts by zeroing it), so
// a training set of another size is accepted there: the saved buffer is replaced by an
// empty one of the live size. Mid-epoch it is left as it is, and refused.
void accept_resized_buffer_at_epoch_boundary(std::map<std::string, StateDict>& groups,
                                             const Tensor& live_buffer) {
  auto g = groups.find("trainer");
  if (g == groups.end()) return;
  auto buf = g->second.tensors.find("epoch_sample_loss");
  auto step = g->second.scalars.find("step_in_epoch");
  if (buf == g->second.tensors.end() || step == g->second.scalars.end() ||
      !std::holds_alternative<int64_t>(step->second))
    return;
  if (std::get<int64_t>(step->second) != 0 || buf->second.shape() == live_buffer.shape() ||
      buf->second.dtype() != live_buffer.dtype())
    return;
  buf->second = Tensor::zeros(live_buffer.shape(), live_buffer.dtype());
}

// Says why a mid-epoch checkpoint's loss buffer of another size cannot be taken over.
void explain_resized_buffer_mid_epoch(StateReport& report, const std::map<std::string, StateDict>& groups) {
  for (std::string& m : report.mismatched) {
    if (m.rfind("trainer/epoch_sample_loss:", 0) != 0) continue;
    int64_t step = -1;
    try {
      step = groups.at("trainer").get_int("step_in_epoch");
    } catch (const std::exception&) {
      continue;
    }
    m += " (the checkpoint stopped mid-epoch, after step " + std::to_string(step) +
         ", and its position in the shuffled epoch depends on the training set's size: "
         "data.train_limit and data.val_split can change only at an epoch boundary)";
  }
}

}  // namespace

const char* checkpoint_kind_name(CheckpointKind k) {
  switch (k) {
    case CheckpointKind::Last: return "last";
    case CheckpointKind::Best: return "best";
    case CheckpointKind::Milestone: return "milestone";
    case CheckpointKind::MidEpoch: return "mid-epoch";
    case CheckpointKind::KeepBest: return "keep-best";
  }
  return "?";
}

// ---- the trainer's own state groups ----------------------------------------------

class Trainer::CounterState : public Stateful {
 public:
  explicit CounterState(Trainer& t) : t_(t) {}
  StateDict state() const override {
    StateDict d;
    d.scalars["epoch"] = t_.epoch_;
    d.scalars["global_step"] = t_.global_step_;
    d.scalars["step_in_epoch"] = t_.step_in_epoch_;
    d.scalars["epoch_shuffle_offset"] = static_cast<int64_t>(t_.epoch_shuffle_offset_);
    d.scalars["best_metric"] = t_.best_metric_;
    d.scalars["best_epoch"] = t_.best_epoch_;
    d.scalars["epochs_without_improvement"] = t_.epochs_without_improvement_;
    d.scalars["monitor"] = std::string(to_string(t_.cfg_.train.early_stopping.monitor));
    d.scalars["epoch_elapsed_seconds"] = t_.epoch_elapsed_seconds();
    d.scalars["step_digest"] = digest_hex(t_.step_digest());
    d.tensors["epoch_sample_loss"] = t_.epoch_sample_loss_;
    return d;
  }
  void load_state(const StateDict& in) override {
    if (in.get_string("monitor") != to_string(t_.cfg_.train.early_stopping.monitor))
      throw std::runtime_error("checkpoint monitors '" + in.get_string("monitor") +
                               "' but the config monitors '" +
                               to_string(t_.cfg_.train.early_stopping.monitor) + "'");
    t_.epoch_ = in.get_int("epoch");
    t_.global_step_ = in.get_int("global_step");
    t_.step_in_epoch_ = in.get_int("step_in_epoch");
    t_.epoch_shuffle_offset_ = static_cast<uint64_t>(in.get_int("epoch_shuffle_offset"));
    t_.best_metric_ = in.get_real("best_metric");
    t_.best_epoch_ = in.get_int("best_epoch");
    t_.epochs_without_improvement_ = in.get_int("epochs_without_improvement");
    t_.epoch_elapsed_before_ = in.get_real("epoch_elapsed_seconds");
    t_.epoch_sample_loss_.copy_from(in.get_tensor("epoch_sample_loss"));
    const std::optional<uint64_t> digest = parse_digest_hex(in.get_string("step_digest"));
    if (!digest) throw std::runtime_error("trainer/step_digest is not 16 hexadecimal digits");
    t_.restored_digest_ = std::make_pair(t_.global_step_, *digest);
    t_.last_digest_.reset();
    // Steps of the state replaced: their rows are passed over, their records dropped.
    t_.digest_rows_read_ += static_cast<int64_t>(t_.digest_host_.size());
    t_.digest_host_.clear();
    t_.pending_digests_.clear();
  }

 private:
  Trainer& t_;
};

class Trainer::MetricsState : public Stateful {
 public:
  explicit MetricsState(Trainer& t) : t_(t) {}
  StateDict state() const override {
    StateDict d;
    auto series = [&](const char* key, double EpochMetrics::*field) {
      std::vector<double> v;
      for (const EpochMetrics& m : t_.history_) v.push_back(m.*field);
      d.scalars[key] = v;
    };
    std::vector<double> epochs;
    for (const EpochMetrics& m : t_.history_) epochs.push_back(static_cast<double>(m.epoch));
    d.scalars["epoch"] = epochs;
    for (const EpochMetricField& f : epoch_metric_fields()) series(f.name, f.member);
    return d;
  }
  void load_state(const StateDict& in) override {
    const auto& epochs = in.get_series("epoch");
    std::vector<EpochMetrics> h(epochs.size());
    auto fill = [&](const char* key, double EpochMetrics::*field) {
      const auto& v = in.get_series(key);
      if (v.size() != h.size())
        throw std::runtime_error(std::string("metrics/") + key + " has " +
                                 std::to_string(v.size()) + " entries, metrics/epoch has " +
                                 std::to_string(h.size()));
      for (std::size_t i = 0; i < h.size(); ++i) h[i].*field = v[i];
    };
    for (std::size_t i = 0; i < h.size(); ++i) h[i].epoch = static_cast<int64_t>(epochs[i]);
    for (const EpochMetricField& f : epoch_metric_fields()) fill(f.name, f.member);
    t_.history_ = std::move(h);
  }

 private:
  Trainer& t_;
};

// ---- construction ------------------------------------------------------------------

Trainer::Trainer(Config cfg, Device device, std::unique_ptr<Model> model, TrainerOptions options)
    : cfg_(std::move(cfg)), config_json_(config_to_json(cfg_).dump()), device_(device),
      env_(env_or_posix(options.env)), observer_(options.observer ? options.observer : &silent_),
      data_(std::move(options.data)), rng_(cfg_.seed), model_(std::move(model)) {
  // cfg.cuda.deterministic is process-wide: the host applies
  // it (apply_process_settings, engine/train/process_settings.h), not each Trainer.
  if (!model_) throw std::invalid_argument("Trainer: no model given");
  (void)cpu_kernels_in_use();  // ENGINE_CPU_KERNELS that this CPU cannot run: refused here, not mid-step
  if (options.collective) collective_ = options.collective;
  protocol_ = make_run_protocol(*collective_);
  require_world_size_fits(collective_->size(), cfg_.dist.chunks);
  if (collective_->size() > 1) {
    if (device_.is_cuda() && !cuda_ranks_enabled())
      throw std::invalid_argument("data-parallel training on " + std::to_string(collective_->size()) +
                                  " ranks runs on the CPU only for now (device " + device_.str() +
                                  ": CUDA ranks are opt-in until the GPU work makes them the default; ENGINE_CUDA_RANKS=1 "
                                  "turns them on, tools/gpu-check.sh stage ranks checks them)");
    if (device_.is_cuda() && !cfg_.cuda.batch_chunks)
      throw std::invalid_argument("data-parallel training on CUDA ranks needs cuda.batch_chunks=true (the "
                                  "whole-batch CUDA ops compute in one process only)");
    if (!model_->set_batch_chunks(nullptr))
      throw std::invalid_argument("model " + model_->name() +
                                  " does not support data-parallel training (Model::set_batch_chunks)");
  }
  if (!data_) data_ = make_dataset(cfg_.data, device_);
  if (data_->device() != device_)
    throw std::invalid_argument("Trainer: the dataset holds its splits on " + data_->device().str() +
                                ", the trainer runs on " + device_.str());
  if (model_->input_shape() != data_->sample_shape() || model_->num_classes() != data_->num_classes())
    throw std::invalid_argument("model " + model_->name() + " takes " + model_->input_shape().str() +
                                " images in " + std::to_string(model_->num_classes()) +
                                " classes, the dataset has " + data_->sample_shape().str() + " in " +
                                std::to_string(data_->num_classes()) + " (key model.name)");
  // Fail fast on missing or corrupt data, before any training.
  if (options.splits == SplitsNeeded::All) data_->get(Split::Train);
  else data_->get(Split::Test);
  // The random initialisation runs either way, so the RNG's init stream is where a fresh
  // run leaves it; model.init_from then replaces the weights (fine-tuning, weights only).
  model_->reset_parameters(rng_);
  if (cfg_.model.init_from) {
    model_->load_state(load_safetensors_state(*cfg_.model.init_from, *model_));
    observer_->on_message("model initialised from " + *cfg_.model.init_from + " (model.init_from)");
  }
  model_->to(device_);
  // fp16, bf16: conv and linear math on 16-bit inputs with fp32 accumulation (CUDA only;
  // the CPU backend is fp32 and keeps the loss scaler's state unchanged).
  model_->set_precision(compute_precision());
  const OptimizerConfig& o = cfg_.optimizer;
  optimizer_ = std::make_unique<AdamOptimizer>(to_string(o.name), model_->parameters(), o.lr, o.beta1,
                                               o.beta2, o.eps, o.weight_decay);
  scheduler_ = std::make_unique<LrScheduler>(to_string(cfg_.scheduler.name), o.lr, cfg_.effective_t_max(),
                                             cfg_.scheduler.eta_min);
  const LossScaleConfig& ls = cfg_.precision.loss_scale;
  // Only fp16 scales the loss; bf16 (fp32's exponent range) runs without, as fp32 does.
  scaler_ = std::make_unique<LossScaler>(scales_loss(cfg_.precision.mode), ls.init, ls.growth_factor,
                                         ls.backoff_factor, ls.growth_interval);
  scaler_->set_active(device_.is_cuda());
  if (scaler_->enabled() && device_.is_cpu())
    observer_->on_message(
        "precision.mode fp16 needs the CUDA backend: training in fp32 on the CPU, "
        "loss-scaler state kept unchanged");
  if (cfg_.precision.mode == Precision::Bf16 && device_.is_cpu())
    observer_->on_message("precision.mode bf16 needs the CUDA backend: training in fp32 on the CPU");
  if (device_.is_cpu()) {
    // The CPU step completes the weight and bias gradients in one pass after backward
    // (when there is more than one block of chunks), and on several ranks each rank
    // owns a shard of the parameters and moments (ZeRO-1; CUDA ranks are refused above).
    std::vector<int64_t> sizes;
    for (Parameter* p : model_->parameters()) {
      sizes.push_back(p->value.numel());
      param_values_.push_back(&p->value);
      param_grads_.push_back(&p->grad);
    }
    shards_ = std::make_unique<ParameterShards>(std::move(sizes), collective_);
  }
  counter_state_ = std::make_unique<CounterState>(*this);
  metrics_state_ = std::make_unique<MetricsState>(*this);
  best_metric_ = lower_is_better(cfg_.train.early_stopping.monitor)
                     ? std::numeric_limits<double>::infinity()
                     : -std::numeric_limits<double>::infinity();
  epoch_sample_loss_ = Tensor::zeros({options.splits == SplitsNeeded::All ? data_->get(Split::Train).count : 0},
                                     DType::F32, device_);
}

Trainer::~Trainer() = default;

std::vector<std::pair<std::string, Stateful*>> Trainer::builtin_components() {
  return {{"model", model_.get()},         {"optimizer", optimizer_.get()},
          {"scheduler", scheduler_.get()}, {"scaler", scaler_.get()},
          {"rng", &rng_},                  {"trainer", counter_state_.get()},
          {"metrics", metrics_state_.get()}};
}

std::vector<std::pair<std::string, Stateful*>> Trainer::components() {
  std::vector<std::pair<std::string, Stateful*>> all = builtin_components();
  all.insert(all.end(), host_groups_.begin(), host_groups_.end());
  return all;
}

void Trainer::add_state_group(const std::string& name, Stateful* component) {
  if (!component) throw std::invalid_argument("state group '" + name + "': no component given");
  const bool valid_name =
      !name.empty() && name != "." && name != ".." &&
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") ==
          std::string::npos;
  if (!valid_name)
    throw std::invalid_argument("state group name '" + name + "' is not valid (letters, digits, '_', '-', '.')");
  for (const auto& [existing, c] : components())
    if (existing == name) throw std::invalid_argument("state group '" + name + "' is already registered");
  host_groups_.emplace_back(name, component);
}

Precision Trainer::compute_precision() const { return engine::compute_precision(cfg_.precision.mode, device_); }

Shape Trainer::batch_shape(int64_t n) const {
  const ImageShape s = data_->sample_shape();
  return {n, s.channels, s.height, s.width};
}


// ---- checkpoints ---------------------------------------------------------------------

Checkpoint Trainer::snapshot() const {
  Checkpoint c;
  c.meta.saved_on = device_.str();
  c.config_json = config_json_;
  for (auto& [name, comp] : const_cast<Trainer*>(this)->components()) c.groups[name] = comp->state();
  return c;
}

namespace {
// The dist.chunks a checkpoint was trained with: its stored config's (8, the default,
// for checkpoints written before the key existed); nullopt when it has no config.
std::optional<int64_t> stored_dist_chunks(const Checkpoint& ckpt) {
  if (ckpt.config_json.empty()) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(ckpt.config_json, nullptr, false);
  if (!j.is_object()) return std::nullopt;
  const auto dist = j.find("dist");
  if (dist == j.end() || !dist->is_object() || !dist->contains("chunks")) return kTreeChunks;
  const nlohmann::json& c = (*dist)["chunks"];
  return c.is_number_integer() ? std::optional<int64_t>(c.get<int64_t>()) : std::nullopt;
}
}  // namespace

StateReport Trainer::restore(const Checkpoint& ckpt, LoadMode mode, RestoreObserver* observer) {
  StateReport report;
  // The chunks fix the order of every cross-sample sum: a run resumed with others would
  // go on with other bits.
  if (const std::optional<int64_t> chunks = stored_dist_chunks(ckpt);
      mode == LoadMode::Strict && chunks && *chunks != cfg_.dist.chunks)
    throw std::runtime_error("the checkpoint was trained with dist.chunks = " + std::to_string(*chunks) +
                             ", this config has " + std::to_string(cfg_.dist.chunks) +
                             " (the chunks fix the order of every sum; resume with --set dist.chunks=" +
                             std::to_string(*chunks) + ")");
  auto comps = components();
  std::map<std::string, StateDict> groups = ckpt.groups;  // shares the tensors
  accept_resized_buffer_at_epoch_boundary(groups, epoch_sample_loss_);
  std::vector<StateDict> expected;
  for (auto& [name, comp] : comps) {
    expected.push_back(comp->state());
    auto it = groups.find(name);
    if (it == groups.end() && expected.back().empty()) report.missing.push_back(name + "/");
    report.merge(compare_state(expected.back(), it == groups.end() ? StateDict{} : it->second), name);
  }
  explain_resized_buffer_mid_epoch(report, groups);
  for (auto& [name, group] : groups) {
    bool known = false;
    for (auto& c : comps) known = known || c.first == name;
    if (!known) report.unexpected.push_back(name + "/");
  }
  if (mode == LoadMode::Strict && !report.clean())
    throw std::runtime_error("checkpoint does not match this model and config: " + report.summary());
  // Keep a deep copy to roll back to, so a failure halfway never leaves a half-loaded state.
  std::vector<StateDict> backup;
  for (const StateDict& e : expected) {
    StateDict b = e;
    for (auto& [k, t] : b.tensors) t = t.clone();
    backup.push_back(std::move(b));
  }
  // Every component touched is rolled back on failure, the one that threw included: it
  // may have changed part of its state before throwing.
  std::size_t touched = 0;
  drop_step_graphs();  // a load may replace the tensors they point into
  try {
    for (std::size_t i = 0; i < comps.size(); ++i) {
      auto it = groups.find(comps[i].first);
      const StateDict given = it == groups.end() ? StateDict{} : it->second;
      touched = i + 1;
      comps[i].second->load_state(merge_matching(expected[i], given));
      if (observer) observer->after_group(comps[i].first);
    }
  } catch (...) {
    for (std::size_t i = 0; i < touched; ++i) comps[i].second->load_state(backup[i]);
    throw;
  }
  scaler_->set_active(device_.is_cuda());
  permutation_offset_.reset();  // the rng may have changed: derive the permutation again
  return report;
}

StateReport Trainer::resume_from(const std::string& path, LoadMode mode) {
  Checkpoint ckpt = load_checkpoint(path, &env_);
  try {
    return restore(ckpt, mode);
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(path + ": " + e.what());
  }
}


int64_t Trainer::state_bytes() const {
  int64_t bytes = 0;
  for (auto& [name, comp] : const_cast<Trainer*>(this)->components()) {
    if (comp == optimizer_.get()) {
      bytes += optimizer_->state_bytes();
      continue;
    }
    for (const auto& [key, t] : comp->state().tensors) bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}


void Trainer::save_checkpoint(const std::string& path) {
  const Checkpoint state = snapshot();
  engine::save_checkpoint(path, state, &env_);
  if (cfg_.checkpoint.verify) verify_saved_checkpoint(path, state, *model_, env_);
}

}  // namespace engine
