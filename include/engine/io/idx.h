// Reader for the IDX format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/),
// gzip-compressed or plain. Every error is a DataError whose one-line message names the file.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/core/errors.h"  // DataError

namespace engine {

struct IdxImages {
  int64_t count = 0;
  int rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  // count*rows*cols bytes, image-major then row-major
};

// Magic 0x00000803 (unsigned bytes, 3 dimensions). Headers claiming more than 10^8 images
// or sides outside 1..4096 are rejected before anything is allocated.
IdxImages read_idx_images(const std::string& path);
// Magic 0x00000801 (unsigned bytes, 1 dimension). Labels must be class indices 0..9.
std::vector<uint8_t> read_idx_labels(const std::string& path);

struct FashionMnist {
  IdxImages train_images;
  std::vector<uint8_t> train_labels;
  IdxImages test_images;
  std::vector<uint8_t> test_labels;
};

// Reads train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
// t10k-labels-idx1-ubyte from `dir`, each plain or with a .gz suffix. Any consistent counts
// are accepted (each image file matches its label file, train and test share a size).
FashionMnist load_fashion_mnist(const std::string& dir);

// One half of the dataset: the 60000 training images ("train-*") or the 10000 test
// images ("t10k-*"), so a caller can hold only what it needs. Checks that all four
// files exist first, like load_fashion_mnist.
enum class FashionPart { Train, Test };
struct IdxPair {
  IdxImages images;
  std::vector<uint8_t> labels;
};
IdxPair load_fashion_mnist_part(const std::string& dir, FashionPart part);

}  // namespace engine
