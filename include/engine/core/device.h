// Where a tensor lives. The CUDA backend is optional; asking for it in a CPU-only
// build, or on a machine without a GPU, is reported with a clear error.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace engine {

enum class DeviceType { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  // "cpu", "cuda", "cuda:N"; throws std::invalid_argument otherwise.
  static Device parse(const std::string& text);
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;  // "cpu", "cuda:0"
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// A value of type T in device memory, and the device it is on: what an op reads when its
// kernel runs rather than take as an argument (a per-step value, engine/core/step_values.h;
// the loss scale). `value`: what the host last sent or knew of it, for the op's
// preconditions and host-side arithmetic.
template <class T>
struct DeviceValue {
  const T* ptr = nullptr;
  Device device;
  T value{};
};

// True when this build has the CUDA backend compiled in.
bool cuda_built();
// Number of usable GPUs (0 without CUDA or without a driver/GPU).
int cuda_device_count();
// Resolves a config/CLI device name: "auto" -> cuda:0 when a GPU exists, else cpu.
// Throws std::runtime_error when "cuda" is asked for and cannot be had.
Device resolve_device(const std::string& name);

// The CPU backend's threads for work started from the calling thread (OMP_NUM_THREADS
// at start). Every count gives the same bits, so a caller may change it between steps.
int cpu_threads();
void set_cpu_threads(int threads);

// Raw memory on a device; used by Tensor.
void* device_alloc(Device d, std::size_t bytes);
void device_free(Device d, void* p);
// Copies between any two devices (host<->device, device<->device).
void device_copy(Device dst_dev, void* dst, Device src_dev, const void* src, std::size_t bytes);
void device_memset_zero(Device d, void* p, std::size_t bytes);
// Waits for all queued work on the device (no-op on the CPU).
void device_synchronize(Device d);

// What the engine has asked of the devices since the process started, through the
// calls above: for profiling, and for tests that count what a training step costs.
// A copy from a GPU to the host waits for the GPU, as device_synchronize does.
struct DeviceActivity {
  uint64_t allocations = 0;       // device_alloc, on any device
  uint64_t host_to_device = 0;    // device_copy from the CPU to a GPU
  uint64_t device_to_host = 0;    // device_copy from a GPU to the CPU
  uint64_t synchronizations = 0;  // device_synchronize of a GPU
  uint64_t graph_captures = 0;    // training steps captured as CUDA graphs (cuda.graphs)
  uint64_t graph_launches = 0;    // launches of those graphs: the steps replayed, and each capture's first run
};
DeviceActivity device_activity();

}  // namespace engine
