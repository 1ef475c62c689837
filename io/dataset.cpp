#include "engine/io/dataset.h"

#include <algorithm>

#include "engine/io/idx.h"

namespace engine {

const char* split_name(Split s) {
  switch (s) {
    case Split::Train: return "train";
    case Split::Val: return "val";
    case Split::Test: return "test";
  }
  return "?";
}

namespace {
SplitData make_split(const IdxPair& raw, int64_t first, int64_t count, Device device) {
  const int64_t pixels = static_cast<int64_t>(raw.images.rows) * raw.images.cols;
  SplitData s;
  s.count = count;
  Tensor img = Tensor::empty({count, pixels}, DType::U8);
  Tensor lab = Tensor::empty({count}, DType::U8);
  std::copy_n(raw.images.pixels.data() + first * pixels, count * pixels, img.u8());
  std::copy_n(raw.labels.data() + first, count, lab.u8());
  s.images = device.is_cpu() ? img : img.to(device);
  s.labels = device.is_cpu() ? lab : lab.to(device);
  return s;
}

void expect_shape(const IdxPair& raw, const std::string& dir, const ImageShape& shape) {
  if (raw.images.rows != shape.height || raw.images.cols != shape.width)
    throw DataError(dir + ": expected " + std::to_string(shape.height) + "x" + std::to_string(shape.width) +
                    " images, found " + std::to_string(raw.images.rows) + "x" +
                    std::to_string(raw.images.cols) + " (key data.dir)");
}
}  // namespace

void FashionMnistDataset::load_training_file() {
  const IdxPair raw = load_fashion_mnist_part(cfg_.dir, FashionPart::Train);
  expect_shape(raw, cfg_.dir, kSampleShape);
  const int64_t total = raw.images.count;
  if (cfg_.val_split >= total)
    throw DataError("data.val_split (" + std::to_string(cfg_.val_split) +
                    ") must be smaller than the " + std::to_string(total) + " training images");
  const int64_t train_total = total - cfg_.val_split;
  const int64_t train_n = cfg_.train_limit ? std::min(*cfg_.train_limit, train_total) : train_total;
  if (!train_) train_ = make_split(raw, 0, train_n, device_);
  if (!val_) val_ = make_split(raw, train_total, cfg_.val_split, device_);
}

const SplitData& FashionMnistDataset::get(Split s) {
  switch (s) {
    case Split::Train:
      if (!train_) load_training_file();
      return *train_;
    case Split::Val:
      if (!val_) load_training_file();
      return *val_;
    case Split::Test:
    default:
      if (!test_) {
        const IdxPair raw = load_fashion_mnist_part(cfg_.dir, FashionPart::Test);
        expect_shape(raw, cfg_.dir, kSampleShape);
        const int64_t n = cfg_.test_limit ? std::min(*cfg_.test_limit, raw.images.count) : raw.images.count;
        test_ = make_split(raw, 0, n, device_);
      }
      return *test_;
  }
}

void FashionMnistDataset::release(Split s) {
  switch (s) {
    case Split::Train: train_.reset(); break;
    case Split::Val: val_.reset(); break;
    case Split::Test: test_.reset(); break;
  }
}

std::vector<std::string> FashionMnistDataset::class_names() const {
  // Zalando's label descriptions (github.com/zalandoresearch/fashion-mnist), in label order.
  return {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
          "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
}

std::unique_ptr<Dataset> make_dataset(const DataConfig& cfg, Device device) {
  return std::make_unique<FashionMnistDataset>(cfg, device);
}

}  // namespace engine
