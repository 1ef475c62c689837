// The Fashion-MNIST splits as uint8 tensors on the training device (47 MB in all),
// gathered and normalised into float batches by the gather_batch kernel.
#pragma once
#include <cstdint>
#include <string>

#include "engine/tensor.h"
#include "io/config.h"

namespace engine {

enum class Split { Train, Val, Test };
const char* split_name(Split s);

struct SplitData {
  Tensor images;  // uint8 [count, 784]
  Tensor labels;  // uint8 [count]
  int64_t count = 0;
};

struct Datasets {
  SplitData train, val, test;
  int pixels = 28 * 28;
  const SplitData& get(Split s) const;
};

// Which splits a command needs (evaluation needs only the test set).
enum class SplitsNeeded { All, TestOnly };

// Reads the IDX files from cfg.dir. The validation split is the last `val_split`
// images of the 60000 training images (fixed, whatever the seed); train_limit and
// test_limit keep the first N images of their splits.
Datasets load_datasets(const DataConfig& cfg, Device device, SplitsNeeded needed = SplitsNeeded::All);

}  // namespace engine
