#include "engine/train/inference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <stdexcept>
#include <type_traits>

#include "engine/io/checkpoint.h"
#include "core/graph_capture.h"
#include "core/tensor_ops.h"

namespace engine {

// One model instance, taken from the pool for the length of a call.
class Classifier::Lease {
 public:
  explicit Lease(const Classifier& c) : c_(c), model_(c.acquire()) {}
  ~Lease() { c_.give_back(std::move(model_)); }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  Model& model() { return *model_; }

 private:
  const Classifier& c_;
  std::unique_ptr<Model> model_;
};

std::unique_lock<std::mutex> Classifier::gpu_work_lock() const {
  if (device_.is_cpu()) return {};
  return std::unique_lock<std::mutex>(graph_capture_mutex());
}

Classifier::Classifier(const std::string& path, Device device, const ModelFactory& factory)
    : device_(device) {
  const std::unique_lock<std::mutex> capture_lock = gpu_work_lock();  // the model's upload
  const Checkpoint ckpt = load_checkpoint(path);
  try {
    cfg_ = config_from_json(nlohmann::json::parse(ckpt.config_json), path + " (stored config)");
  } catch (const nlohmann::json::exception&) {
    throw CheckpointError(path + ": the stored config is not valid JSON");
  }
  try {
    prototype_ = factory(cfg_);
  } catch (const std::exception& e) {
    throw CheckpointError(path + ": " + e.what());
  }
  if (!prototype_) throw CheckpointError(path + ": the model factory built no model for '" + cfg_.model.name + "'");
  input_ = prototype_->input_shape();
  classes_ = prototype_->num_classes();
  // The trainer's rule, so a classifier computes what the trainer's evaluation does.
  precision_ = compute_precision(cfg_.precision.mode, device_);
  prototype_->to(device_);
  prototype_->set_precision(precision_);
  const StateDict& given = ckpt.group("model");
  const StateReport r = compare_state(prototype_->state(), given);
  if (!r.clean())
    throw CheckpointError(path + ": model state does not match model " + prototype_->name() + ": " + r.summary());
  prototype_->load_state(given);
  state_ = prototype_->state();
  max_instances_ = device_.is_cpu() ? std::numeric_limits<size_t>::max() : 1;
}

Classifier::~Classifier() {
  // The instances' GPU memory is freed on the stream (core/graph_capture.h).
  const std::unique_lock<std::mutex> capture_lock = gpu_work_lock();
  idle_.clear();
  state_ = StateDict();
  prototype_.reset();
}

std::unique_ptr<Model> Classifier::acquire() const {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_cv_.wait(lock, [&] { return !idle_.empty() || instances_ < max_instances_; });
  if (!idle_.empty()) {
    std::unique_ptr<Model> m = std::move(idle_.back());
    idle_.pop_back();
    return m;
  }
  ++instances_;
  lock.unlock();
  try {
    // new_instance() and state() only read the prototype, which no call runs.
    std::unique_ptr<Model> m = prototype_->new_instance();
    m->to(device_);
    m->set_precision(precision_);
    m->load_state(state_);
    return m;
  } catch (...) {
    lock.lock();
    --instances_;
    idle_cv_.notify_one();
    throw;
  }
}

void Classifier::give_back(std::unique_ptr<Model> m) const {
  m->release_workspaces();  // an idle instance holds its parameters only
  std::lock_guard<std::mutex> lock(mutex_);
  idle_.push_back(std::move(m));
  idle_cv_.notify_one();
}

template <typename Pixel>
Predictions Classifier::run(const Pixel* images, int64_t n, Scores scores) const {
  if (n < 0) throw std::invalid_argument("Classifier: negative image count " + std::to_string(n));
  if (n > 0 && !images) throw std::invalid_argument("Classifier: no images given");
  Predictions p;
  p.count = n;
  p.classes = classes_;
  p.labels.resize(static_cast<size_t>(n));
  if (scores != Scores::None) p.scores.resize(static_cast<size_t>(n) * classes_);
  if (n == 0) return p;

  // On a GPU, not while the training step of another thread is being captured into a
  // CUDA graph: this call's work would be recorded into it (core/graph_capture.h).
  const std::unique_lock<std::mutex> capture_lock = gpu_work_lock();
  Lease lease(*this);
  Model& model = lease.model();
  const int64_t pixels = input_.numel();
  const int batch = cfg_.data.batch_size;
  Rng unused(0);  // eval mode draws nothing
  StepValues first;  // the gather's first sample: 0, each batch its own images
  for (int64_t start = 0; start < n; start += batch) {
    const int b = static_cast<int>(std::min<int64_t>(batch, n - start));
    const Pixel* src = images + start * pixels;
    Tensor x = Tensor::empty({b, input_.channels, input_.height, input_.width}, DType::F32, device_);
    if constexpr (std::is_same_v<Pixel, uint8_t>) {
      // The training kernel normalises, so the model sees the bits the trainer fed it.
      Tensor raw = Tensor::empty({b, pixels}, DType::U8);
      std::memcpy(raw.u8(), src, static_cast<size_t>(b * pixels));
      Tensor idx = Tensor::empty({b}, DType::I32);
      std::iota(idx.i32(), idx.i32() + b, 0);
      Tensor no_labels = Tensor::zeros({b}, DType::U8, device_);
      Tensor labels_out = Tensor::empty({b}, DType::I32, device_);
      if (device_.is_cuda()) raw = raw.to(device_), idx = idx.to(device_);
      if (!first.uploaded()) first.upload(device_);
      tt::gather_batch(raw, no_labels, idx, first.sample_first(), b, static_cast<float>(cfg_.data.mean),
                       static_cast<float>(cfg_.data.std), x, labels_out);
    } else {
      Tensor host = Tensor::empty({b, input_.channels, input_.height, input_.width}, DType::F32);
      std::memcpy(host.f32(), src, static_cast<size_t>(b * pixels) * sizeof(float));
      x = device_.is_cpu() ? host : host.to(device_);
    }
    const Tensor logits = model.forward(x, Mode::Eval, unused);
    const std::vector<float> z = logits.to_vector();
    for (int i = 0; i < b; ++i)
      p.labels[static_cast<size_t>(start + i)] = kernels::argmax_first(z.data() + static_cast<size_t>(i) * classes_, classes_);
    float* out = p.scores.empty() ? nullptr : p.scores.data() + static_cast<size_t>(start) * classes_;
    if (scores == Scores::Logits) std::copy(z.begin(), z.end(), out);
    if (scores == Scores::Probabilities) {
      Tensor probs = Tensor::empty(logits.shape(), DType::F32, logits.device());
      tt::softmax(logits, probs);
      const std::vector<float> host = probs.to_vector();
      std::copy(host.begin(), host.end(), out);
    }
  }
  return p;
}

Predictions Classifier::predict(const uint8_t* images, int64_t n, Scores scores) const {
  return run(images, n, scores);
}
Predictions Classifier::predict(const float* images, int64_t n, Scores scores) const {
  return run(images, n, scores);
}
std::vector<int32_t> Classifier::classify(const uint8_t* images, int64_t n) const {
  return run(images, n, Scores::None).labels;
}
std::vector<int32_t> Classifier::classify(const float* images, int64_t n) const {
  return run(images, n, Scores::None).labels;
}

EvalResult score_logits(const Predictions& p, const uint8_t* labels) {
  if (p.count > 0 && p.scores.size() != static_cast<std::size_t>(p.count) * p.classes)
    throw std::invalid_argument("score_logits: the predictions hold no logits (predict with Scores::Logits)");
  EvalResult r;
  r.count = p.count;
  r.confusion.assign(static_cast<std::size_t>(p.classes), std::vector<int64_t>(static_cast<std::size_t>(p.classes), 0));
  if (p.count == 0) return r;
  Tensor truth = Tensor::empty({p.count}, DType::I32);
  for (int64_t i = 0; i < p.count; ++i) {
    if (labels[i] >= p.classes)
      throw std::invalid_argument("score_logits: label " + std::to_string(labels[i]) + " of sample " +
                                  std::to_string(i) + " is not one of the " + std::to_string(p.classes) + " classes");
    truth.i32()[i] = labels[i];
    ++r.confusion[labels[i]][static_cast<std::size_t>(p.labels[static_cast<std::size_t>(i)])];
  }
  // The trainer's loss (one definition), on the host.
  const Tensor logits = Tensor::from_vector({p.count, p.classes}, p.scores);
  Tensor loss = Tensor::empty({p.count}), correct = Tensor::empty({p.count});
  StepValues values;  // sample_first 0, loss_scale 1 (unread)
  values.upload(Device::cpu());
  tt::cross_entropy(logits, truth, static_cast<int>(p.count), values.loss_scale(), nullptr, loss, correct,
                    values.sample_first());
  r.loss = tt::reduce_sum(loss, 0, p.count) / static_cast<double>(p.count);
  r.accuracy = tt::reduce_sum(correct, 0, p.count) / static_cast<double>(p.count);
  return r;
}

}  // namespace engine
