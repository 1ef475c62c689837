// Private to io/: what a checkpoint file is, for the files that write, parse and check
// one (the layout is docs/checkpoint-format.md): the magic and user block, the limits
// every reader enforces, the root attributes, and the one-line errors naming the file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/io/checkpoint.h"

#ifndef ENGINE_VERSION
#define ENGINE_VERSION "0.0.0-dev"  // standalone builds; CMake defines the real one
#endif

// float16 tensors hold raw IEEE half bits in host order and are written as little-endian
// halves without conversion.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "checkpoint layer assumes a little-endian host");

namespace engine {
namespace checkpoint_internal {

constexpr std::size_t kUserBlockBytes = 512;
constexpr char kMagic[] = "ENGINE-CHECKPOINT\n";
constexpr std::size_t kMagicBytes = sizeof(kMagic) - 1;
constexpr char kHdf5Signature[] = "\x89HDF\r\n\x1a\n";
constexpr char kFormatName[] = "engine-checkpoint";
constexpr int kMaxRank = 8;
constexpr uint64_t kMaxElements = uint64_t(1) << 31;
constexpr int kMaxNesting = 16;
// Growth step the core driver asks for when a loaded (read-only, fixed-size) image is
// opened; it never grows, so any value does.
constexpr std::size_t kCoreIncrement = std::size_t(4) << 20;
// Tensor data of at least kAlignThreshold bytes starts on a kDataAlignment boundary in
// the file (the user block is a multiple of it too), and the loader's file buffer is
// kBufferAlignment-aligned (io/aligned_bytes.h), so loaded tensors can point into the
// buffer (the alignment the CPU kernels need) instead of being copied out of it.
constexpr uint64_t kDataAlignment = 64;
constexpr uint64_t kAlignThreshold = 64;
static_assert(kUserBlockBytes % kDataAlignment == 0, "the user block must keep data aligned");

inline const char* const kRootAttributes[] = {"format",      "format_version", "engine_version",
                                              "created_utc", "saved_on",       "config"};

[[noreturn]] inline void fail(const std::string& path, const std::string& msg) {
  throw CheckpointError(path + ": " + msg);
}

inline std::string corrupt(const std::string& detail) {
  return "checksum mismatch (file is corrupt): " + detail;
}

}  // namespace checkpoint_internal
}  // namespace engine
