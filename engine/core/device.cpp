#include "engine/core/device.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <unordered_map>

#include "core/device_upload.h"
#include "core/graph_capture.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cuda_runtime.h"

namespace engine {

namespace gpu = kernels::cuda;

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    const std::string idx = text.substr(5);
    if (!idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos)
      return cuda(std::stoi(idx));
  }
  throw std::invalid_argument("unknown device '" + text + "' (expected cpu, cuda or cuda:N)");
}

std::string Device::str() const {
  return is_cpu() ? "cpu" : "cuda:" + std::to_string(index);
}

bool cuda_built() { return gpu::built(); }
int cuda_device_count() { return gpu::built() ? gpu::device_count() : 0; }

int cpu_threads() { return kernels::cpu::cpu_threads(); }
void set_cpu_threads(int threads) { kernels::cpu::set_cpu_threads(threads); }

namespace {

// Why `d` (a CUDA device) cannot be used here, or "" when it can. The count is asked once:
// it is the driver's answer for the process, and every allocation passes here.
std::string cuda_unusable_reason(Device d, const std::string& name) {
  if (!cuda_built()) return "device '" + name + "' requested but this engine was built without CUDA";
  static const int count = cuda_device_count();
  if (count == 0) return "device '" + name + "' requested but no CUDA GPU is available";
  if (d.index < 0 || d.index >= count)
    return "device '" + name + "' requested but only " + std::to_string(count) + " GPU(s) exist";
  return "";
}

// A Device::cuda() built by hand (not through resolve_device) meets the same plain
// reason before any CUDA call, instead of the runtime's error code.
void require_usable(Device d) {
  if (!d.is_cuda()) return;
  const std::string reason = cuda_unusable_reason(d, d.str());
  if (!reason.empty()) throw std::runtime_error(reason);
}

}  // namespace

Device resolve_device(const std::string& name) {
  if (name == "auto") return cuda_device_count() > 0 ? Device::cuda(0) : Device::cpu();
  const Device d = Device::parse(name);
  if (d.is_cuda()) {
    const std::string reason = cuda_unusable_reason(d, name);
    if (!reason.empty()) throw std::runtime_error(reason);
  }
  return d;
}

namespace {
struct ActivityCounters {
  std::atomic<uint64_t> allocations{0}, host_to_device{0}, device_to_host{0}, synchronizations{0};
  std::atomic<uint64_t> graph_captures{0}, graph_launches{0};
};
ActivityCounters g_activity;
void count(std::atomic<uint64_t>& c) { c.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

DeviceActivity device_activity() {
  DeviceActivity a;
  a.allocations = g_activity.allocations.load(std::memory_order_relaxed);
  a.host_to_device = g_activity.host_to_device.load(std::memory_order_relaxed);
  a.device_to_host = g_activity.device_to_host.load(std::memory_order_relaxed);
  a.synchronizations = g_activity.synchronizations.load(std::memory_order_relaxed);
  a.graph_captures = g_activity.graph_captures.load(std::memory_order_relaxed);
  a.graph_launches = g_activity.graph_launches.load(std::memory_order_relaxed);
  return a;
}

void note_graph_captured() { count(g_activity.graph_captures); }
void note_graph_launched() { count(g_activity.graph_launches); }

namespace {
// Every live GPU buffer's allocation number, for the graphs (core/graph_capture.h). GPU
// allocations are few (none in a training step), so one lock costs nothing measurable.
struct LiveDeviceBuffers {
  std::mutex mutex;
  std::unordered_map<const void*, uint64_t> number;
  uint64_t next = 0;
  uint64_t mark = 0;  // buffers numbered below it are marked
};
LiveDeviceBuffers& live_device_buffers() {
  static auto* b = new LiveDeviceBuffers();  // leaked: tensors may be freed by static destructors
  return *b;
}
std::atomic<uint64_t> g_marked_frees{0};
thread_local uint64_t t_device_allocations = 0;
}  // namespace

void mark_live_device_buffers() {
  LiveDeviceBuffers& b = live_device_buffers();
  const std::lock_guard<std::mutex> lock(b.mutex);
  b.mark = b.next;
}

uint64_t marked_device_buffer_frees() { return g_marked_frees.load(std::memory_order_acquire); }

uint64_t thread_device_allocations() { return t_device_allocations; }

std::mutex& graph_capture_mutex() {
  static auto* m = new std::mutex();  // leaked: a Classifier may be destroyed at exit
  return *m;
}

void* device_alloc(Device d, std::size_t bytes) {
  count(g_activity.allocations);
  if (d.is_cuda()) {
    require_usable(d);
    gpu::set_device(d.index);
    void* p = gpu::alloc(bytes);
    ++t_device_allocations;
    if (p) {
      LiveDeviceBuffers& b = live_device_buffers();
      const std::lock_guard<std::mutex> lock(b.mutex);
      b.number[p] = b.next++;
    }
    return p;
  }
  // 64-byte alignment for vector loads in the CPU kernels.
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) throw std::bad_alloc();
  return p;
}

void device_free(Device d, void* p) {
  if (d.is_cuda()) {
    if (p) {
      LiveDeviceBuffers& b = live_device_buffers();
      const std::lock_guard<std::mutex> lock(b.mutex);
      auto it = b.number.find(p);
      if (it != b.number.end()) {
        if (it->second < b.mark) g_marked_frees.fetch_add(1, std::memory_order_acq_rel);
        b.number.erase(it);
      }
    }
    gpu::free(p);
  }
  else
    std::free(p);
}

void device_copy(Device dst_dev, void* dst, Device src_dev, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  require_usable(dst_dev);
  require_usable(src_dev);
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    std::memcpy(dst, src, bytes);
  } else if (dst_dev.is_cuda() && src_dev.is_cpu()) {
    count(g_activity.host_to_device);
    gpu::copy(dst, src, bytes, gpu::CopyKind::HostToDevice);
  } else if (dst_dev.is_cpu() && src_dev.is_cuda()) {
    count(g_activity.device_to_host);
    gpu::copy(dst, src, bytes, gpu::CopyKind::DeviceToHost);
  } else {
    gpu::copy(dst, src, bytes, gpu::CopyKind::DeviceToDevice);
  }
}

namespace detail {

void* alloc_upload_staging(Device d, std::size_t bytes) {
  if (!d.is_cuda()) return ::operator new(bytes ? bytes : 1);
  require_usable(d);
  gpu::set_device(d.index);
  return gpu::alloc_pinned_host(bytes);
}

void free_upload_staging(Device d, void* p) {
  if (d.is_cuda())
    gpu::free_pinned_host(p);
  else
    ::operator delete(p);
}

kernels::cuda::StreamMark upload_async(Device d, void* dst, const void* staging, std::size_t bytes) {
  if (!d.is_cuda()) {
    std::memcpy(dst, staging, bytes);
    return nullptr;
  }
  count(g_activity.host_to_device);
  gpu::copy_from_pinned_host_async(dst, staging, bytes);
  return gpu::mark_stream();
}

void wait_for_upload(const kernels::cuda::StreamMark& mark) { gpu::wait_for(mark); }

}  // namespace detail

void device_memset_zero(Device d, void* p, std::size_t bytes) {
  require_usable(d);
  if (d.is_cuda())
    gpu::memset_zero(p, bytes);
  else
    std::memset(p, 0, bytes);
}

void device_synchronize(Device d) {
  require_usable(d);
  if (d.is_cuda()) {
    count(g_activity.synchronizations);
    gpu::synchronize();
  }
}

}  // namespace engine
