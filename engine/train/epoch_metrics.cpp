#include "engine/train/epoch_metrics.h"

namespace engine {

const std::vector<EpochMetricField>& epoch_metric_fields() {
  static const std::vector<EpochMetricField> fields = {
      {"train_loss", &EpochMetrics::train_loss, "mean cross-entropy over the epoch's training images"},
      {"val_loss", &EpochMetrics::val_loss, "mean cross-entropy on the validation split after the epoch"},
      {"val_acc", &EpochMetrics::val_acc, "accuracy on the validation split after the epoch, in [0, 1]"},
      {"lr", &EpochMetrics::lr, "learning rate the epoch trained with"},
      {"loss_scale", &EpochMetrics::loss_scale, "loss scale at the epoch's end (1 without fp16 loss scaling)"},
      {"epoch_seconds", &EpochMetrics::epoch_seconds, "wall-clock seconds of the epoch's training steps"},
  };
  return fields;
}

}  // namespace engine
