// Private to io/: the byte buffer files are read into and images built in.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

namespace engine {
namespace checkpoint_internal {

constexpr std::size_t kBufferAlignment = 64;

// A byte buffer that is never zero-filled: every byte is written before it is read
// (file reads, HDF5 images, the sealed header), and 5 MB of memset per save or load
// is measurable. 64-byte aligned, so that tensors can live inside a loaded file.
class Bytes {
 public:
  Bytes() = default;
  explicit Bytes(std::size_t n) { resize(n); }
  Bytes(Bytes&& o) noexcept : data_(std::move(o.data_)), size_(o.size_), capacity_(o.capacity_) {
    o.size_ = o.capacity_ = 0;
  }
  Bytes& operator=(Bytes&& o) noexcept {
    data_ = std::move(o.data_);
    size_ = o.size_;
    capacity_ = o.capacity_;
    o.size_ = o.capacity_ = 0;
    return *this;
  }
  unsigned char* data() { return data_.get(); }
  const unsigned char* data() const { return data_.get(); }
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return capacity_; }
  unsigned char* begin() { return data_.get(); }
  // Keeps the first min(size, n) bytes; new bytes are uninitialised.
  void resize(std::size_t n) {
    if (n > capacity_) {
      void* p = std::aligned_alloc(kBufferAlignment, (n + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment);
      if (!p) throw std::bad_alloc();
      std::unique_ptr<unsigned char[], FreeDeleter> bigger(static_cast<unsigned char*>(p));
      if (size_) std::memcpy(bigger.get(), data_.get(), size_);
      data_ = std::move(bigger);
      capacity_ = n;
    }
    size_ = n;
  }

 private:
  struct FreeDeleter {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  std::unique_ptr<unsigned char[], FreeDeleter> data_;
  std::size_t size_ = 0, capacity_ = 0;
};

}  // namespace checkpoint_internal
}  // namespace engine
