#include "kernels/cpu/scratch.h"

#include <memory>

namespace engine::kernels::cpu {

float* thread_scratch(Scratch slot, std::size_t floats) {
  struct Buffer {
    std::unique_ptr<float[]> data;
    std::size_t size = 0;
  };
  thread_local Buffer buffers[static_cast<int>(Scratch::kCount)];
  Buffer& b = buffers[static_cast<int>(slot)];
  if (b.size < floats) {
    b.data.reset(new float[floats]);
    b.size = floats;
  }
  return b.data.get();
}

}  // namespace engine::kernels::cpu
