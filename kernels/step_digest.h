// The step digest's arithmetic, shared by every backend (docs/checkpoint-format.md,
// "Step digests"): one 64-bit digest per tensor, a sum of one term per 32-bit word.
//
// Why a sum: integer addition modulo 2^64 is associative and commutative, so a digest
// is the same whatever splits the words (threads, a rank's shard, CUDA blocks) and in
// whatever order the parts are added. It is therefore the same at every thread count,
// world size, kernel path, CPU model and device whenever the tensor's bits are, with no
// fixed reduction order to keep. Each term mixes the word with its index, so moving a
// value changes the digest as changing it does.
//
// It detects accidental differences (a flipped bit, a different rounding, a value in
// the wrong place); it is not a cryptographic hash: whoever can rewrite a file can write
// a matching digest. `engine audit` replays to catch that.
#pragma once
#include <cstdint>

#include "engine/kernels/hd.h"

namespace engine::kernels {

inline constexpr uint32_t kDigestIndexMultiplier = 0x9E3779B1u;  // 2^32 / golden ratio, odd
inline constexpr uint32_t kDigestOffset = 0x6A09E667u;           // SHA-256's first IV word

// The term of 32-bit word `w` at index `i` of its tensor (the index in the whole
// tensor: a shard adds its offset): with a = w ^ (kDigestOffset + i *
// kDigestIndexMultiplier) modulo 2^32, the exact product a * (a | 1). That product is
// below 2^64 and grows with a, so distinct a give distinct terms: changing any one word
// always changes the digest. One 32x32->64 multiply, and a key that goes up by a
// constant from one index to the next: cheap enough to ride along the optimizer.
ENGINE_HD uint32_t digest_key(uint64_t i) { return kDigestOffset + static_cast<uint32_t>(i) * kDigestIndexMultiplier; }
ENGINE_HD uint64_t digest_term(uint64_t i, uint32_t w) {
  const uint32_t a = w ^ digest_key(i);
  return static_cast<uint64_t>(a) * static_cast<uint64_t>(a | 1u);
}

// The word of a float: its IEEE-754 bits.
ENGINE_HD uint32_t digest_word(float x) {
#ifdef __CUDA_ARCH__
  return static_cast<uint32_t>(__float_as_uint(x));
#else
  uint32_t w;
  __builtin_memcpy(&w, &x, sizeof w);
  return w;
#endif
}

// The sum of the terms of n words (index of words[0]: `first`), modulo 2^64: the
// definition, in index order. The CPU backend's fast path (kernels/cpu) adds the same
// terms eight at a time.
inline uint64_t digest_words(const uint32_t* words, int64_t n, uint64_t first) {
  uint64_t sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += digest_term(first + static_cast<uint64_t>(i), words[i]);
  return sum;
}
inline uint64_t digest_floats(const float* x, int64_t n, uint64_t first) {
  return digest_words(reinterpret_cast<const uint32_t*>(x), n, first);
}

// A tensor that step_digest_finish hashes whole (a batch norm's running statistics).
struct DigestRange {
  const float* data;
  int64_t n;
};

// SplitMix64's finaliser (Steele, Lea and Flood 2014): a bijection of 64-bit values.
ENGINE_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The step digest folds its parts in a fixed order: h = mix64(h ^ part), from kFoldStart.
inline constexpr uint64_t kFoldStart = 0x6A09E667F3BCC908ull;  // SHA-512's first IV word
ENGINE_HD uint64_t fold(uint64_t h, uint64_t part) { return mix64(h ^ part); }

}  // namespace engine::kernels
