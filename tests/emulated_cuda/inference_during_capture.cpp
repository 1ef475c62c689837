// TEST ONLY, built in the emulated-CUDA build (tests/emulated_cuda/build.sh): a Classifier
// on the GPU called from another thread while the trainer captures its step's CUDA graph
// (docs/embedding.md allows calls from any thread). All GPU work goes to one stream, so
// a call that ran into a capture would be recorded into the training graph and its
// waits would end the capture; the emulated device refuses any GPU call of another
// thread during a capture, and holds each capture open for
// ENGINE_EMULATED_CUDA_CAPTURE_HOLD_MS so that the calls meet it.
//
//   inference_during_capture CONFIG DATA_DIR CHECKPOINT
// Trains 2 epochs of a small set with cuda.graphs=true while a second thread classifies
// 64 images with CHECKPOINT on the GPU, over and over; then the same 2 epochs with
// cuda.graphs=false and no second thread. Passes (exit 0) when every call succeeded with
// the logits of the first call, bit for bit, some calls ran while the graphs trained, and
// both runs end with the same model, optimizer and scaler state, bit for bit.
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/train/config.h"
#include "engine/train/inference.h"
#include "engine/train/model_factory.h"
#include "engine/train/process_settings.h"
#include "engine/train/trainer.h"

namespace {

engine::Checkpoint train(const std::string& config_path, const std::string& data_dir, bool graphs) {
  nlohmann::json j = nlohmann::json::parse(std::ifstream(config_path));
  for (const std::string& kv : {"data.dir=" + data_dir, std::string("data.train_limit=1000"),
                                std::string("data.val_split=64"), std::string("data.test_limit=64"),
                                std::string("data.batch_size=64"), std::string("train.epochs=2"),
                                std::string("cuda.batch_chunks=false"),
                                std::string("cuda.graphs=") + (graphs ? "true" : "false")})
    engine::apply_override(j, kv);
  const engine::Config cfg = engine::config_from_json(j, config_path);
  engine::apply_process_settings(cfg);
  engine::Trainer trainer(cfg, engine::Device::cuda(0), engine::make_model(cfg));
  trainer.train_epoch();
  trainer.train_epoch();
  return trainer.snapshot();
}

bool same_bits(const engine::Tensor& a, const engine::Tensor& b) {
  const engine::Tensor ha = a.to(engine::Device::cpu()), hb = b.to(engine::Device::cpu());
  return ha.dtype() == hb.dtype() && ha.shape() == hb.shape() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: inference_during_capture CONFIG DATA_DIR CHECKPOINT\n");
    return 2;
  }
  const std::string config = argv[1], data_dir = argv[2], checkpoint = argv[3];
  try {
    const engine::Classifier clf(checkpoint, engine::Device::cuda(0), engine::make_model);
    std::vector<uint8_t> images(64 * 28 * 28);
    uint32_t x = 12345;
    for (uint8_t& p : images) p = static_cast<uint8_t>((x = x * 1664525u + 1013904223u) >> 24);
    const std::vector<float> first = clf.predict(images.data(), 64, engine::Scores::Logits).scores;

    std::atomic<bool> training{true};
    std::atomic<int64_t> calls{0}, wrong{0};
    std::mutex error_mutex;
    std::string error;
    std::thread inference([&] {
      try {
        while (training.load()) {
          const std::vector<float> s = clf.predict(images.data(), 64, engine::Scores::Logits).scores;
          if (s.size() != first.size() || std::memcmp(s.data(), first.data(), s.size() * sizeof(float)) != 0)
            ++wrong;
          ++calls;
        }
      } catch (const std::exception& e) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        error = e.what();
      }
    });
    engine::Checkpoint on;
    try {
      on = train(config, data_dir, true);
    } catch (...) {
      training = false;
      inference.join();
      throw;
    }
    training = false;
    inference.join();
    std::printf("graphs on: %lld classifier calls from another thread while training, %lld with other logits\n",
                static_cast<long long>(calls.load()), static_cast<long long>(wrong.load()));
    int failures = 0;
    if (!error.empty()) {
      std::printf("FAIL: a classifier call failed while the trainer captured its graphs: %s\n", error.c_str());
      ++failures;
    }
    if (wrong.load() != 0 || calls.load() < 2) {
      std::printf("FAIL: %lld calls, %lld of them with logits other than the first call's\n",
                  static_cast<long long>(calls.load()), static_cast<long long>(wrong.load()));
      ++failures;
    }
    const engine::Checkpoint off = train(config, data_dir, false);
    int64_t compared = 0;
    for (const char* group : {"model", "optimizer", "scaler"}) {
      const engine::StateDict& a = on.group(group);
      const engine::StateDict& b = off.group(group);
      for (const auto& [key, t] : b.tensors) {
        ++compared;
        auto it = a.tensors.find(key);
        if (it == a.tensors.end() || !same_bits(it->second, t)) {
          std::printf("FAIL: %s/%s differs between graphs on (with inference) and graphs off\n", group, key.c_str());
          ++failures;
        }
      }
      for (const auto& [key, v] : b.scalars) {
        ++compared;
        auto it = a.scalars.find(key);
        if (it == a.scalars.end() || !(it->second == v)) {
          std::printf("FAIL: %s/%s differs between graphs on (with inference) and graphs off\n", group, key.c_str());
          ++failures;
        }
      }
    }
    std::printf("graphs on (with inference) against graphs off: %lld entries of model, optimizer and scaler compared\n",
                static_cast<long long>(compared));
    if (failures) return 1;
    std::printf("inference_during_capture: passed\n");
    return 0;
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
