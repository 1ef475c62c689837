#include "engine/dataset.h"

#include <algorithm>
#include <stdexcept>

#include "io/idx.h"

namespace engine {

const char* split_name(Split s) {
  switch (s) {
    case Split::Train: return "train";
    case Split::Val: return "val";
    case Split::Test: return "test";
  }
  return "?";
}

const SplitData& Datasets::get(Split s) const {
  switch (s) {
    case Split::Train: return train;
    case Split::Val: return val;
    default: return test;
  }
}

namespace {
SplitData make_split(const IdxImages& images, const std::vector<uint8_t>& labels, int64_t first,
                     int64_t count, Device device) {
  const int64_t pixels = static_cast<int64_t>(images.rows) * images.cols;
  SplitData s;
  s.count = count;
  Tensor img = Tensor::empty({count, pixels}, DType::U8);
  Tensor lab = Tensor::empty({count}, DType::U8);
  std::copy_n(images.pixels.data() + first * pixels, count * pixels, img.u8());
  std::copy_n(labels.data() + first, count, lab.u8());
  s.images = device.is_cpu() ? img : img.to(device);
  s.labels = device.is_cpu() ? lab : lab.to(device);
  return s;
}
}  // namespace

Datasets load_datasets(const DataConfig& cfg, Device device, SplitsNeeded needed) {
  FashionMnist raw = load_fashion_mnist(cfg.dir);
  if (raw.train_images.rows != 28 || raw.train_images.cols != 28 || raw.test_images.rows != 28 ||
      raw.test_images.cols != 28)
    throw DataError(cfg.dir + ": expected 28x28 images (key data.dir)");
  Datasets d;
  const int64_t total = raw.train_images.count;
  if (cfg.val_split >= total)
    throw DataError("data.val_split (" + std::to_string(cfg.val_split) +
                    ") must be smaller than the " + std::to_string(total) + " training images");
  if (needed == SplitsNeeded::All) {
    const int64_t train_total = total - cfg.val_split;
    const int64_t train_n = cfg.train_limit ? std::min(*cfg.train_limit, train_total) : train_total;
    d.train = make_split(raw.train_images, raw.train_labels, 0, train_n, device);
    d.val = make_split(raw.train_images, raw.train_labels, train_total, cfg.val_split, device);
  }
  const int64_t test_n =
      cfg.test_limit ? std::min(*cfg.test_limit, raw.test_images.count) : raw.test_images.count;
  d.test = make_split(raw.test_images, raw.test_labels, 0, test_n, device);
  return d;
}

}  // namespace engine
