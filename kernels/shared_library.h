// Shared libraries opened with dlopen on first use instead of linked (cuBLAS: the
// kernels' CUDA backend; NCCL: the core's collective), so a program runs without them
// until it needs them. One place for what every such library does: open the first file
// that loads, resolve each symbol with its declared type, load once per process.
#pragma once
#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace engine::kernels {

// The first of `files` that dlopen loads (RTLD_NOW | RTLD_LOCAL), or nullptr with `why`
// holding each file's dlerror ("; "-separated). The handle is never closed: objects the
// library made may be destroyed as late as exit.
inline void* open_shared_library(const std::vector<std::string>& files, std::string& why) {
  why.clear();
  for (const std::string& f : files) {
    if (void* handle = dlopen(f.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
    const char* e = dlerror();  // the message once, then null
    why += (why.empty() ? "" : "; ") + (files.size() > 1 ? f + ": " : std::string()) + (e ? e : "unknown error");
  }
  return nullptr;
}

// fn = the library's `symbol`, as fn's own (declared) type; throws std::runtime_error
// with `missing` and the symbol's name when the library has none.
template <class Fn>
void resolve_symbol(void* handle, const char* symbol, Fn& fn, const std::string& missing) {
  void* p = dlsym(handle, symbol);
  if (!p) throw std::runtime_error(missing + symbol);
  fn = reinterpret_cast<Fn>(p);
}

// The library `open` returns, opened once per process for each Library type; a failed
// open (it throws) is retried, and reported again, on the next call. Once loaded, a
// call is one atomic load (the CUDA ops call it for every cuBLAS call), no lock.
template <class Library>
const Library& load_once(Library (*open)()) {
  static std::mutex mutex;
  static Library lib;
  static std::atomic<bool> loaded{false};
  if (loaded.load(std::memory_order_acquire)) return lib;
  const std::lock_guard<std::mutex> lock(mutex);
  if (!loaded.load(std::memory_order_relaxed)) {
    lib = open();
    loaded.store(true, std::memory_order_release);
  }
  return lib;
}

}  // namespace engine::kernels
