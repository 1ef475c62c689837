#include "kernels/cpu/blas.h"

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

}  // namespace engine::kernels::cpu
