// The model interface the trainer, the checkpoint verification and the inference API
// work with: a classifier of images of one shape into a fixed number of classes,
// trained by forward/backward over its parameters, whose whole state is a StateDict
// (the checkpoint's "model" group). Models live in models/ (above engine/) and reach
// the trainer through the caller (see engine/nn/models/registry.h).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/image_shape.h"
#include "engine/nn/layers.h"
#include "engine/nn/module.h"
#include "engine/core/state.h"

namespace engine {

class Model : public Stateful {
 public:
  Model() = default;
  // Layers point into their model: a model is never copied (new_instance() makes another).
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // The registry name ("fashion_cnn", "mlp"): what config's model.name says.
  virtual std::string name() const = 0;
  virtual ImageShape input_shape() const = 0;
  virtual int num_classes() const = 0;

  // Draws the initial parameters from the RNG's init stream (the trainer calls this
  // once, so the seed decides the initial weights).
  virtual void reset_parameters(Rng& rng) = 0;
  virtual void to(Device device) = 0;
  virtual Device device() const = 0;
  // Fp16, Bf16: mixed-precision convolutions/GEMMs on CUDA where the model has them;
  // fp32 everywhere on the CPU. Default Fp32.
  virtual void set_precision(Precision p) = 0;
  // Frees activation and gradient buffers (re-created by the next forward).
  virtual void release_workspaces() = 0;

  // x: [N, C, H, W] float on the model's device -> logits [N, num_classes()].
  // Layers keep what backward needs, so one instance serves one thread at a time.
  virtual Tensor forward(const Tensor& x, Mode mode, Rng& rng) = 0;
  // dlogits: gradient of the loss w.r.t. the logits of the last Train forward; every
  // parameter's .grad receives its gradient.
  virtual void backward(const Tensor& dlogits) = 0;
  virtual std::vector<Parameter*> parameters() = 0;
  int64_t parameter_count();
  // Data-parallel training (engine/core/batch_chunks.h): the next forward/backward computes
  // only this rank's chunks of the global batch and completes every cross-sample sum
  // with the other ranks. Null: the input is the whole batch. Returns whether the model
  // supports it (the default does not; the trainer then runs it in one process only).
  virtual bool set_batch_chunks(const BatchChunks*) { return false; }
  // The host's part of a training forward and backward whose device work a CUDA graph
  // replays (engine/train/step_graphs.h), for a model that supports_step_graphs() (the
  // default does not; the trainer then runs its steps eagerly).
  virtual bool supports_step_graphs() const { return false; }
  virtual void replayed_train_step() {}

  // A new instance of the same architecture and settings (input shape, classes,
  // dropout...), on the CPU in fp32, with parameters not yet initialised: what a
  // checkpoint's model state is loaded into to check or serve it.
  virtual std::unique_ptr<Model> new_instance() const = 0;
};

// A model that is a chain of layers: forward runs them in order, backward in reverse,
// state() is every layer's parameters and buffers under PyTorch's state_dict names.
// Subclasses construct the layers, list them with set_layers(), and implement
// reset_parameters, set_precision, the shapes and new_instance.
class SequentialModel : public Model {
 public:
  void to(Device device) override;
  Device device() const override { return device_; }
  void release_workspaces() override;
  Tensor forward(const Tensor& x, Mode mode, Rng& rng) override;
  void backward(const Tensor& dlogits) override;
  std::vector<Parameter*> parameters() override;
  bool set_batch_chunks(const BatchChunks* chunks) override;
  bool supports_step_graphs() const override { return true; }
  void replayed_train_step() override;
  StateDict state() const override;
  void load_state(const StateDict& in) override;
  // The layers in forward order (what an exporter walks: engine/train/export.h).
  const std::vector<Layer*>& layers() const { return layers_; }

 protected:
  SequentialModel() = default;
  // Layers in forward order; they must outlive the model (members of the subclass).
  void set_layers(std::vector<Layer*> layers) { layers_ = std::move(layers); }

 private:
  Device device_ = Device::cpu();
  std::vector<Layer*> layers_;
};

}  // namespace engine
