// Golden dropout masks (docs/architecture.md, "Determinism"): the masks a real training
// run draws, compared with masks computed straight from the documented keying by a
// Philox4x32-10 written here from its definition (Salmon et al. 2011), not the engine's.
// Other dropout tests compare two runs of the engine (ranks against one process, resumed
// against straight, cpu:: against ref::), so a mistake both share cancels out: a dropout
// counter restarted at each epoch passed all of them. This one pins the definition.
//
// The keying: at a training step, element e of sample s (its row in the global batch) of
// a dropout layer whose input has F elements per sample is kept when
//   uniform(value (samples_before * F + s * F + e) of the seed's "dropout" stream) >= p,
// where samples_before counts every sample trained in earlier steps of the run, over all
// epochs, the stream is cuRAND's subsequence 3 of Philox4x32-10 keyed by the seed, and
// uniform(u) = (u >> 8) * 2^-24. Kept values are scaled by 1 / (1 - p).
#pragma once
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/nn/layers.h"
#include "engine/nn/model.h"
#include "engine/train/trainer.h"
#include "synthetic_data.h"

namespace golden_dropout {

// ---- The reference, from the definition --------------------------------------------

inline uint32_t mulhi(uint32_t a, uint32_t b) { return static_cast<uint32_t>((uint64_t{a} * b) >> 32); }

// Philox4x32 with 10 rounds: the round function and the Weyl key schedule as the paper
// gives them, with its constants M0 = 0xD2511F53, M1 = 0xCD9E8D57, W0 = 0x9E3779B9,
// W1 = 0xBB67AE85.
inline void philox4x32_10_reference(uint32_t ctr[4], uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint32_t x0 = ctr[0], x1 = ctr[1], x2 = ctr[2], x3 = ctr[3];
    ctr[0] = mulhi(0xCD9E8D57u, x2) ^ x1 ^ k0;
    ctr[1] = 0xCD9E8D57u * x2;
    ctr[2] = mulhi(0xD2511F53u, x0) ^ x3 ^ k1;
    ctr[3] = 0xD2511F53u * x0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

// Value `index` of cuRAND's sequence for curand_init(seed, subsequence, 0): block index/4
// in counter words 0-1, the subsequence in words 2-3, the seed as the key.
inline uint32_t stream_value(uint64_t seed, uint64_t subsequence, uint64_t index) {
  uint32_t ctr[4] = {static_cast<uint32_t>(index >> 2), static_cast<uint32_t>(index >> 34),
                     static_cast<uint32_t>(subsequence), static_cast<uint32_t>(subsequence >> 32)};
  philox4x32_10_reference(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return ctr[index & 3];
}

constexpr uint64_t kDropoutSubsequence = 3;  // "init" 1, "shuffle" 2, "dropout" 3

inline bool reference_keep(uint64_t seed, int64_t samples_before, int64_t sample, int64_t features,
                           int64_t element, float p) {
  const uint64_t index = static_cast<uint64_t>(samples_before * features + sample * features + element);
  const float u = static_cast<float>(stream_value(seed, kDropoutSubsequence, index) >> 8) * (1.0f / 16777216.0f);
  return u >= p;
}

// ---- The engine's masks, as a run draws them -----------------------------------------

// Records its input on every training forward and passes it on unchanged.
class Tap : public engine::Layer {
 public:
  using Layer::Layer;
  engine::Tensor forward(const engine::Tensor& x, engine::Mode mode, engine::Rng&) override {
    if (mode == engine::Mode::Train) seen.push_back(x.to_vector());
    return x;
  }
  engine::Tensor backward(const engine::Tensor& dy, engine::InputGrad) override { return dy; }
  std::vector<std::vector<float>> seen;
};

// The mlp with taps around its dropout, which sits before the ReLU here so that its
// input is never exactly zero: flatten fc1 tap dropout tap relu fc2. The mask is where
// the dropout's output is not zero.
class TappedMlp : public engine::SequentialModel {
 public:
  TappedMlp(engine::ImageShape input, int hidden, int classes, float p)
      : input_(input), hidden_(hidden), classes_(classes), p_(p),
        fc1_("fc1", static_cast<int>(input.numel()), hidden), dropout_("dropout", p), fc2_("fc2", hidden, classes) {
    set_layers({&flatten_, &fc1_, &before_, &dropout_, &after_, &relu_, &fc2_});
  }
  std::string name() const override { return "mlp"; }
  engine::ImageShape input_shape() const override { return input_; }
  int num_classes() const override { return classes_; }
  void reset_parameters(engine::Rng& rng) override {
    fc1_.reset_parameters(rng);
    fc2_.reset_parameters(rng);
  }
  void set_precision(engine::Precision) override {}
  std::unique_ptr<engine::Model> new_instance() const override {
    return std::make_unique<TappedMlp>(input_, hidden_, classes_, p_);
  }
  int hidden() const { return hidden_; }
  Tap before_{"before"}, after_{"after"};

 private:
  engine::ImageShape input_;
  int hidden_, classes_;
  float p_;
  engine::Flatten flatten_{"flatten"};
  engine::Linear fc1_;
  engine::Dropout dropout_;
  engine::ReLU relu_{"relu"};
  engine::Linear fc2_;
};

// Trains `epochs` epochs of the synthetic data set on `device` step by step and checks
// every step's mask against the reference. Returns the masks, per step.
inline std::vector<std::vector<uint8_t>> check_run(engine::Device device, int epochs) {
  using namespace engine;
  Config c = test_util::synthetic_mlp_config();
  c.seed = 20261205;
  c.model.dropout = 0.3;
  c.train.epochs = epochs;
  c.data.batch_size = 20;  // 96 training images: 4 full batches and a ragged one of 16
  const float p = static_cast<float>(c.model.dropout);
  auto model = std::make_unique<TappedMlp>(test_util::SyntheticDataset::kShape, 24, test_util::SyntheticDataset::kClasses, p);
  TappedMlp* tapped = model.get();
  TrainerOptions options;
  options.data = std::make_unique<test_util::SyntheticDataset>(96, 48, 48, device);
  Trainer trainer(c, device, std::move(model), std::move(options));
  const int64_t features = tapped->hidden();
  const float scale = 1.0f / (1.0f - p);
  std::vector<std::vector<uint8_t>> masks;
  int64_t samples_before = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    for (int step = 0; step < 5; ++step) {
      tapped->before_.seen.clear();
      tapped->after_.seen.clear();
      trainer.train_step();
      REQUIRE(tapped->before_.seen.size() == 1);
      REQUIRE(tapped->after_.seen.size() == 1);
      const std::vector<float>& x = tapped->before_.seen[0];
      const std::vector<float>& y = tapped->after_.seen[0];
      const int64_t batch = static_cast<int64_t>(x.size()) / features;
      REQUIRE(batch == (step < 4 ? 20 : 16));
      std::vector<uint8_t> mask(x.size());
      int64_t wrong = 0, first_wrong = -1;
      for (int64_t s = 0; s < batch; ++s) {
        for (int64_t e = 0; e < features; ++e) {
          const std::size_t i = static_cast<std::size_t>(s * features + e);
          REQUIRE(x[i] != 0.0f);
          mask[i] = y[i] != 0.0f;
          if (mask[i]) REQUIRE(y[i] == x[i] * scale);
          if (mask[i] != reference_keep(c.seed, samples_before, s, features, e, p)) {
            if (first_wrong < 0) first_wrong = static_cast<int64_t>(i);
            ++wrong;
          }
        }
      }
      CAPTURE(epoch);
      CAPTURE(step);
      CAPTURE(samples_before);
      CAPTURE(first_wrong);
      CHECK(wrong == 0);
      masks.push_back(std::move(mask));
      samples_before += batch;
    }
  }
  return masks;
}

}  // namespace golden_dropout
