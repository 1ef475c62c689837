#include "kernels/cpu/scratch.h"

#include <new>

namespace engine::kernels::cpu {

float* thread_scratch(Scratch slot, std::size_t floats) {
  // 64-byte aligned: the GEMM's vector stores into a product written here (a row of C
  // starts a cache line when its length is a multiple of 16 floats) then never straddle
  // two lines. new float[] of a large size gave an address 16 bytes past a page (glibc's
  // mmap header), so every 64-byte store of conv1's forward product touched two lines.
  struct Buffer {
    float* data = nullptr;
    std::size_t size = 0;
    ~Buffer() { ::operator delete[](data, std::align_val_t(64)); }
  };
  thread_local Buffer buffers[static_cast<int>(Scratch::kCount)];
  Buffer& b = buffers[static_cast<int>(slot)];
  if (b.size < floats) {
    ::operator delete[](b.data, std::align_val_t(64));
    b.data = nullptr;
    b.data = static_cast<float*>(::operator new[](floats * sizeof(float), std::align_val_t(64)));
    b.size = floats;
  }
  return b.data;
}

}  // namespace engine::kernels::cpu
