#include "kernels/cpu/blas.h"

#include <memory>
#include <mutex>

// Weak: present with OpenBLAS, null with another BLAS (which is then trusted to be
// single-threaded or configured by its own environment variables).
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace engine::kernels::cpu {

void blas_single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (openblas_set_num_threads) openblas_set_num_threads(1);
  });
}

float* thread_scratch(int slot, std::size_t floats) {
  struct Buffer {
    std::unique_ptr<float[]> data;
    std::size_t size = 0;
  };
  thread_local Buffer buffers[4];
  Buffer& b = buffers[slot];
  if (b.size < floats) {
    b.data.reset(new float[floats]);
    b.size = floats;
  }
  return b.data.get();
}

}  // namespace engine::kernels::cpu
