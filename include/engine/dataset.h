// The Fashion-MNIST splits as uint8 tensors on the training device (47 MB in all),
// gathered and normalised into float batches by the gather_batch kernel. Splits are
// read from disk when first asked for and can be released, so a process holds only
// what it uses (the test set is read after training, when the training set is freed).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "engine/tensor.h"
#include "engine/config.h"

namespace engine {

enum class Split { Train, Val, Test };
const char* split_name(Split s);

// Which splits a command needs up front (evaluation needs only the test set).
enum class SplitsNeeded { All, TestOnly };

struct SplitData {
  Tensor images;  // uint8 [count, 784]
  Tensor labels;  // uint8 [count]
  int64_t count = 0;
};

// The validation split is the last `val_split` images of the 60000 training images
// (fixed, whatever the seed); train_limit and test_limit keep the first N images of
// their splits.
class Datasets {
 public:
  Datasets() = default;
  Datasets(DataConfig cfg, Device device) : cfg_(std::move(cfg)), device_(device) {}

  const SplitData& get(Split s);  // loads on first use; throws DataError
  void release(Split s);
  int pixels() const { return 28 * 28; }

 private:
  void load_training_file();
  DataConfig cfg_;
  Device device_;
  std::optional<SplitData> train_, val_, test_;
};

}  // namespace engine
