// What the GPU test binaries share: the skip where no GPU is present, and device arrays.
#pragma once
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cuda_runtime.h"

namespace gpu_test {

namespace gpu = engine::kernels::cuda;

// Runs during static initialisation, before doctest's main: a test binary without a
// GPU has nothing to test, and exit code 77 tells CTest so.
struct SkipWithoutGpu {
  SkipWithoutGpu() {
    if (!(gpu::built() && gpu::device_count() > 0)) {
      std::printf("no CUDA GPU: skipping\n");
      std::fflush(stdout);
      std::exit(77);
    }
  }
};
static const SkipWithoutGpu skip_without_gpu;

// Device memory for tests: zero-filled on creation, or a copy of a host vector.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t count)
      : count_(count), ptr_(static_cast<T*>(gpu::alloc((count ? count : 1) * sizeof(T)))) {
    gpu::memset_zero(ptr_, count_ * sizeof(T));
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() { gpu::free(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() { return ptr_; }
  const T* get() const { return ptr_; }
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == count_);
    gpu::copy(ptr_, host.data(), count_ * sizeof(T), gpu::CopyKind::HostToDevice);
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    gpu::copy(host.data(), ptr_, count_ * sizeof(T), gpu::CopyKind::DeviceToHost);
    return host;
  }
  // Fills with a byte pattern that no op would produce, so "not written" shows up.
  void poison() {
    std::vector<T> junk(count_);
    std::memset(junk.data(), 0x7f, count_ * sizeof(T));
    upload(junk);
  }

 private:
  std::size_t count_;
  T* ptr_;
};

}  // namespace gpu_test
