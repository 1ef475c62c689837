// Private to io/: two jobs on two threads when a second one may be had.
#pragma once
#include <omp.h>

#include <functional>

namespace engine {
namespace checkpoint_internal {

// Runs `first` on the calling thread and `second` on a second OpenMP thread when one may
// be had, else one after the other, `first` first (OMP_NUM_THREADS=1, or a region nested
// where only one thread is granted). Neither may throw. Reading with checksumming, and
// walking with reading, go side by side this way.
inline void side_by_side(const std::function<void()>& first, const std::function<void()>& second) {
  if (omp_get_max_threads() < 2) {
    first();
    second();
    return;
  }
#pragma omp parallel num_threads(2)
  {
    for (int task = omp_get_thread_num(); task < 2; task += omp_get_num_threads()) (task == 0 ? first : second)();
  }
}

}  // namespace checkpoint_internal
}  // namespace engine
