// FNV-1a, 64 bits (Fowler, Noll, Vo): a quick hash of short text. Not a checksum of
// data and not cryptographic; the engine uses it for names and identities that it only
// compares (a run's identity, recovery.h; the memory tier's file name, memory_tier.h).
#pragma once
#include <cstdint>
#include <string>

namespace engine {

inline uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace engine
