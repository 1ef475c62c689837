// A small in-memory dataset for trainer tests that need no files: 2x4x4 images in 3
// classes; class k brightens quadrant k of the first channel, over deterministic noise.
#pragma once
#include <algorithm>
#include <cstdint>
#include <optional>

#include "engine/train/config.h"
#include "engine/io/dataset.h"

namespace test_util {

class SyntheticDataset : public engine::Dataset {
 public:
  static constexpr engine::ImageShape kShape{2, 4, 4};
  static constexpr int kClasses = 3;

  explicit SyntheticDataset(int64_t train = 96, int64_t val = 48, int64_t test = 48,
                            engine::Device device = engine::Device::cpu())
      : counts_{train, val, test}, device_(device) {}

  engine::ImageShape sample_shape() const override { return kShape; }
  int num_classes() const override { return kClasses; }
  engine::Device device() const override { return device_; }
  const engine::SplitData& get(engine::Split s) override {
    auto& slot = splits_[static_cast<int>(s)];
    if (!slot) slot = make(counts_[static_cast<int>(s)], 1000u * (static_cast<uint32_t>(s) + 1));
    return *slot;
  }
  void release(engine::Split s) override { splits_[static_cast<int>(s)].reset(); }

 private:
  engine::SplitData make(int64_t count, uint32_t seed) const {
    const int64_t pixels = kShape.numel();
    engine::SplitData d;
    d.count = count;
    engine::Tensor images = engine::Tensor::empty({count, pixels}, engine::DType::U8);
    engine::Tensor labels = engine::Tensor::empty({count}, engine::DType::U8);
    uint32_t state = seed;
    auto next = [&state] { return state = state * 1664525u + 1013904223u; };
    for (int64_t i = 0; i < count; ++i) {
      const int label = static_cast<int>(next() >> 16) % kClasses;
      labels.u8()[i] = static_cast<uint8_t>(label);
      for (int64_t p = 0; p < pixels; ++p) {
        const int row = static_cast<int>(p / kShape.width % kShape.height), col = static_cast<int>(p % kShape.width);
        const bool lit = p < kShape.height * kShape.width && (row / 2) * 2 + col / 2 == label;
        images.u8()[i * pixels + p] = static_cast<uint8_t>((next() >> 24) % 96 + (lit ? 150 : 0));
      }
    }
    d.images = device_.is_cpu() ? images : images.to(device_);
    d.labels = device_.is_cpu() ? labels : labels.to(device_);
    return d;
  }
  int64_t counts_[3];
  engine::Device device_;
  std::optional<engine::SplitData> splits_[3];
};

// What the trainer tests run on this dataset: the MLP on the CPU in batches of 16 (6
// steps per epoch of the default 96 training images), no milestone checkpoints.
inline engine::Config synthetic_mlp_config() {
  engine::Config c;
  c.device = "cpu";
  c.model.name = "mlp";
  c.data.batch_size = 16;
  c.data.mean = 0.35;
  c.data.std = 0.25;
  c.checkpoint.every_n_epochs = std::nullopt;
  return c;
}

}  // namespace test_util
