// Where the trainer's images come from. A Dataset holds three splits of uint8 images
// (one row of C*H*W bytes per sample) and uint8 labels on the training device, which
// the gather_batch kernel gathers and normalises into float batches. Fashion-MNIST is
// one implementation: its splits are read from disk when first asked for and can be
// released, so a process holds only what it uses (the test set is read after
// training, when the training set is freed).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/io/config_sections.h"
#include "engine/core/errors.h"  // DataError, which get() throws
#include "engine/core/image_shape.h"
#include "engine/core/tensor.h"

namespace engine {

enum class Split { Train, Val, Test };
const char* split_name(Split s);

// Which splits a command needs up front (evaluation needs only the test set).
enum class SplitsNeeded { All, TestOnly };

struct SplitData {
  Tensor images;  // uint8 [count, C*H*W] on the dataset's device
  Tensor labels;  // uint8 [count], class indices below num_classes()
  int64_t count = 0;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  // Known without loading anything.
  virtual ImageShape sample_shape() const = 0;
  virtual int num_classes() const = 0;
  // The name of each class index (what reports label their rows with), or empty when the
  // data has no names for its classes.
  virtual std::vector<std::string> class_names() const { return {}; }
  virtual Device device() const = 0;
  // Loads on first use (throws DataError naming the file or key); the reference stays
  // valid until release(s). get(s).count is the split's size.
  virtual const SplitData& get(Split s) = 0;
  virtual void release(Split s) = 0;
};

// Fashion-MNIST from the IDX files in cfg.dir: 1x28x28 images, 10 classes. The
// validation split is the last `val_split` images of the 60000 training images (fixed,
// whatever the seed); train_limit and test_limit keep the first N images of their splits.
class FashionMnistDataset : public Dataset {
 public:
  static constexpr ImageShape kSampleShape{1, 28, 28};
  static constexpr int kClasses = 10;

  FashionMnistDataset(DataConfig cfg, Device device) : cfg_(std::move(cfg)), device_(device) {}

  ImageShape sample_shape() const override { return kSampleShape; }
  int num_classes() const override { return kClasses; }
  // "T-shirt/top", "Trouser", ... "Ankle boot": the names of the dataset's labels 0..9.
  std::vector<std::string> class_names() const override;
  Device device() const override { return device_; }
  const SplitData& get(Split s) override;
  void release(Split s) override;

 private:
  void load_training_file();
  DataConfig cfg_;
  Device device_;
  std::optional<SplitData> train_, val_, test_;
};

// The dataset a config's data section describes (Fashion-MNIST, the only kind a config
// names today), its splits to be held on `device`.
std::unique_ptr<Dataset> make_dataset(const DataConfig& cfg, Device device);

}  // namespace engine
