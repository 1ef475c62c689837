// The values that change from one training step to the next, in device memory. A
// kernel of the step reads each of them at a fixed address rather than take it as an
// argument, so the launches of every step are the same, argument for argument: what a
// CUDA graph of the step replays. The host writes the next step's values and sends
// them all with one copy (upload); tests/test_op_trace.cpp checks that no other
// argument of a step changes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/core/tensor.h"
#include "kernels/elementwise.h"

namespace engine {

class StepValues {
 public:
  // One step's scalars, as the host sets them.
  struct Scalars {
    int64_t sample_first = 0;      // this process's first sample, in the epoch's order
    uint64_t dropout_counter = 0;  // the Dropout stream's counter at the step's start
    double lr = 0.0;               // the optimizer's learning rate (for factors made on the device)
    // The loss's scale without a loss scaler: 1 (a scaler keeps its own on the device).
    float loss_scale = 1.0f;
  };
  Scalars scalars;
  std::vector<kernels::AdamStepFactors> adam;  // one per optimizer tensor

  StepValues() = default;
  ~StepValues();
  StepValues(const StepValues&) = delete;
  StepValues& operator=(const StepValues&) = delete;

  // Sends scalars and adam to `device` in one copy, queued behind the work already
  // queued there and not waited for. The block is allocated by the first upload, and
  // again only when adam grows or the device changes: in between, every value keeps
  // its address. On a GPU the copy reads one of kStaging page-locked buffers, so an
  // upload waits only when the GPU is kStaging uploads behind: the host runs at most
  // that many steps ahead.
  void upload(Device device);
  bool uploaded() const { return block_.defined(); }

  // Where the last upload put each value (logic_error before any upload).
  DeviceValue<int64_t> sample_first() const { return at<int64_t>(offsetof(Scalars, sample_first)); }
  DeviceValue<uint64_t> dropout_counter() const { return at<uint64_t>(offsetof(Scalars, dropout_counter)); }
  DeviceValue<float> loss_scale() const { return at<float>(offsetof(Scalars, loss_scale)); }
  DeviceValue<double> lr() const { return at<double>(offsetof(Scalars, lr)); }
  DeviceValue<kernels::AdamStepFactors> adam_factors(std::size_t i) const;

  static constexpr int kStaging = 3;

 private:
  template <class T>
  DeviceValue<T> at(std::size_t offset) const;
  void release_staging();

  Tensor block_;                     // the bytes, on the device
  std::vector<unsigned char> sent_;  // the bytes, as the last upload sent them
  struct Staging {
    void* host = nullptr;
    std::shared_ptr<void> copied;  // a mark after the copy that reads `host`
  };
  Staging staging_[kStaging];
  std::size_t next_ = 0;
  std::size_t adam_capacity_ = 0;
  std::size_t staging_bytes_ = 0;
};

}  // namespace engine
