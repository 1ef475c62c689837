// Writes a small checkpoint for the fuzz corpus: every required group, every scalar kind,
// every tensor dtype, a nested key and a series, a few KB in all, so the checkpoint
// fuzzer runs fast on a file with the structure of a real one.
// Usage: fuzz_make_seed OUT.h5
#include <cstdint>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "engine/io/checkpoint.h"

using namespace engine;

namespace {

Tensor filled(const Shape& shape, DType dtype, uint8_t byte) {
  Tensor t = Tensor::empty(shape, dtype);
  std::memset(t.raw(), byte, t.nbytes());
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_make_seed OUT.h5\n";
    return 2;
  }
  Checkpoint c;
  c.meta.saved_on = "cpu";
  c.config_json = R"({"seed": 0})";
  StateDict& model = c.groups["model"];
  model.tensors["conv1.weight"] = filled({2, 1, 3, 3}, DType::F32, 0x3e);
  model.tensors["conv1.bias"] = filled({2}, DType::F32, 0x3f);
  model.tensors["half"] = filled({4}, DType::F16, 0x3c);
  model.tensors["scalar"] = filled({}, DType::F32, 0x40);
  model.scalars["bn1.num_batches_tracked"] = int64_t{938};
  StateDict& opt = c.groups["optimizer"];
  opt.scalars["name"] = std::string("adamw");
  opt.scalars["lr"] = 1e-3;
  opt.tensors["exp_avg/conv1.bias"] = filled({2}, DType::F32, 0);
  opt.scalars["step/conv1.bias"] = int64_t{12};
  c.groups["scheduler"].scalars["last_epoch"] = int64_t{3};
  c.groups["scaler"].scalars["scale"] = 65536.0;
  StateDict& rng = c.groups["rng"];
  rng.scalars["algorithm"] = std::string("philox4x32-10");
  rng.tensors["state"] = filled({8}, DType::U8, 7);
  StateDict& trainer = c.groups["trainer"];
  trainer.scalars["epoch"] = int64_t{3};
  trainer.tensors["order"] = filled({6}, DType::I32, 1);
  c.groups["metrics"].scalars["train_loss"] = std::vector<double>{0.9, 0.5, 0.4};
  try {
    save_checkpoint(argv[1], c);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
