// The layer interface: forward caches what backward needs; backward returns the
// gradient of the input and writes the parameters' gradients. Each layer names its
// parameters and buffers like the equivalent PyTorch module, so state_dict keys match.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "engine/core/rng.h"
#include "engine/core/state.h"
#include "engine/core/tensor.h"

namespace engine {

class BatchChunks;

enum class Mode { Train, Eval };
// Whether backward must produce the input gradient (the first layer's is not needed).
enum class InputGrad { Needed, NotNeeded };

struct Parameter {
  std::string name;  // full PyTorch-style name, e.g. "conv1.weight"
  Tensor value;
  Tensor grad;
};

class Layer {
 public:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  virtual ~Layer() = default;
  const std::string& name() const { return name_; }

  virtual Tensor forward(const Tensor& x, Mode mode, Rng& rng) = 0;
  virtual Tensor backward(const Tensor& dy, InputGrad need) = 0;
  virtual std::vector<Parameter*> parameters() { return {}; }
  // Non-parameter state (BatchNorm running statistics), keys without the layer prefix.
  virtual void buffers(StateDict&) const {}
  virtual void load_buffers(const StateDict&) {}
  // Moves parameters and buffers to `device` (workspaces are re-created lazily).
  virtual void to(Device device);
  // Frees the activation and gradient buffers kept between forward and backward
  // (re-created on the next forward): lowers the peak while checkpoints are written.
  virtual void release_workspaces() {}
  // The host's part of a training forward whose device work a CUDA graph replays
  // (engine/train/step_graphs.h): BatchNorm's batch count.
  virtual void replayed_train_forward() {}
  // The chunks of the global batch this process computes (engine/core/batch_chunks.h), for
  // the next forward and backward; null: the input is the whole batch, in one process.
  void set_batch_chunks(const BatchChunks* chunks) { batch_chunks_ = chunks; }

 protected:
  // Makes `t` a buffer of this shape, dtype and device, and returns it: kept as it is,
  // a prefix view of its storage when a smaller shape fits there, else a new allocation.
  static Tensor& ensure(Tensor& t, const Shape& shape, Device device, DType dtype = DType::F32);
  std::string name_;
  const BatchChunks* batch_chunks_ = nullptr;
};

// Initialises a parameter uniformly in [-bound, bound] from the RNG's init stream
// (PyTorch's default: kaiming_uniform(a=sqrt(5)) gives bound = 1/sqrt(fan_in)).
void init_uniform(Tensor& t, float bound, Rng& rng);

}  // namespace engine
