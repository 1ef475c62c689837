// Inference: a trained checkpoint (e.g. best.h5) loaded once, classifying batches of
// images on the CPU or a GPU, from any number of threads at once.
//
//   engine::Classifier clf("runs/mnist/best.h5", engine::Device::cpu(), engine::make_model);
//   std::vector<int32_t> classes = clf.classify(pixels, n);  // uint8, n x 784 bytes
//
// The checkpoint's stored config names the model (model.name) and the normalisation
// (data.mean, data.std); the factory (engine::make_model of engine/train/model_factory.h,
// or a host's own) builds it.
//
// Threads: layers keep activations between forward and backward, so one model instance
// can serve one call at a time. The classifier keeps a pool of instances of the loaded
// model: on the CPU a call takes an idle instance or builds one (so N threads run N
// forwards in parallel, each instance ~ the parameters' size); on a GPU one instance
// serves the calls one after another (the CUDA backend shares one stream and its
// library handles). Either way results do not depend on the number of threads.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/train/model_factory.h"
#include "engine/core/device.h"
#include "engine/train/epoch_metrics.h"
#include "engine/core/image_shape.h"
#include "engine/nn/model.h"
#include "engine/core/state.h"

namespace engine {

enum class Scores { None, Logits, Probabilities };

struct Predictions;
// Loss, accuracy and confusion matrix of predictions made with Scores::Logits against
// the true labels ([count] class indices): the cross-entropy and the sums of the
// trainer's own evaluation (the same kernels, so a test set scored here and by the
// trainer on the CPU gives the same bits). Throws std::invalid_argument without logits
// or with a label out of range.
EvalResult score_logits(const Predictions& p, const uint8_t* labels);

struct Predictions {
  int64_t count = 0;
  int classes = 0;
  std::vector<int32_t> labels;  // [count] predicted class (argmax, the first maximum wins)
  std::vector<float> scores;    // [count, classes] row-major when asked for, else empty
};

class Classifier {
 public:
  // Loads and checks the checkpoint once; throws CheckpointError naming the file.
  Classifier(const std::string& checkpoint_path, Device device, const ModelFactory& factory);
  ~Classifier();
  Classifier(const Classifier&) = delete;
  Classifier& operator=(const Classifier&) = delete;

  const Config& config() const { return cfg_; }
  Device device() const { return device_; }
  ImageShape input_shape() const { return input_; }
  int num_classes() const { return classes_; }

  // `images`: n samples of input_shape().numel() values each, in host memory.
  // uint8: raw pixels 0..255, normalised as in training ((p/255 - mean) / std).
  // float: already normalised (the model's input as is).
  // Images go through the model in chunks of the config's data.batch_size, as in the
  // trainer's evaluation, so the logits are the bits `engine eval` computes.
  // Thread-safe.
  Predictions predict(const uint8_t* images, int64_t n, Scores scores = Scores::None) const;
  Predictions predict(const float* images, int64_t n, Scores scores = Scores::None) const;
  std::vector<int32_t> classify(const uint8_t* images, int64_t n) const;
  std::vector<int32_t> classify(const float* images, int64_t n) const;

 private:
  // On a GPU: the lock GPU work of a thread other than the training step's holds, so
  // that it never runs into the capture of a step's CUDA graph (empty on the CPU).
  std::unique_lock<std::mutex> gpu_work_lock() const;
  class Lease;
  std::unique_ptr<Model> acquire() const;
  void give_back(std::unique_ptr<Model> m) const;
  template <typename Pixel>
  Predictions run(const Pixel* images, int64_t n, Scores scores) const;

  Config cfg_;
  Device device_;
  ImageShape input_;
  int classes_ = 0;
  Precision precision_ = Precision::Fp32;
  // The loaded model on the device: never runs a call, only copied into new instances.
  std::unique_ptr<Model> prototype_;
  StateDict state_;  // prototype_'s state
  size_t max_instances_ = 1;

  mutable std::mutex mutex_;
  mutable std::condition_variable idle_cv_;
  mutable std::vector<std::unique_ptr<Model>> idle_;
  mutable size_t instances_ = 0;
};

}  // namespace engine
