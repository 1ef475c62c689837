// What an epoch and an evaluation measure: plain data, below the trainer, so that the
// writers of metrics.jsonl and TensorBoard (engine/run/) and the report take them from here.
#pragma once
#include <cstdint>
#include <vector>

namespace engine {

struct EpochMetrics {
  int64_t epoch = 0;  // 1-based
  double train_loss = 0, val_loss = 0, val_acc = 0, lr = 0, loss_scale = 1, epoch_seconds = 0;
};

// The per-epoch metrics, described once. The history's checkpoint group `metrics`, the
// lines of metrics.jsonl, the TensorBoard tags and the report take their fields from this
// table, in this order, after the 1-based `epoch` (an integer, first everywhere).
struct EpochMetricField {
  const char* name;              // key in metrics.jsonl and in the `metrics` group; TensorBoard tag
  double EpochMetrics::*member;
  const char* description;       // one line, for reports and docs
};
const std::vector<EpochMetricField>& epoch_metric_fields();

struct EvalResult {
  double loss = 0;      // mean cross-entropy
  double accuracy = 0;  // in [0, 1]
  int64_t count = 0;
  std::vector<std::vector<int64_t>> confusion;  // [true][predicted], classes x classes
};

}  // namespace engine
