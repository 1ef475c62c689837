// A host-to-host copy for data the copying thread will not read again: the training
// thread's copy of the state into the checkpoint snapshot buffer, which only the writer
// thread reads afterwards.
#pragma once
#include <cstddef>
#include <cstdint>

namespace engine::kernels::cpu {

// memcpy's result, with non-temporal (streaming) stores on x86-64 for large copies: the
// destination lines are written without first being read into this core's cache (no
// read-for-ownership), and the copy does not evict the training thread's working set.
// On this project's 2-core VM a 5 MB copy into a cold buffer takes about 0.45 ms instead
// of 0.7 ms. Ends with a store fence, so the bytes are visible to another thread as soon
// as the handoff (a mutex) publishes them. Elsewhere, and below kStreamingMinBytes, it is
// memcpy. dst and src must not overlap.
void copy_bypassing_cache(void* dst, const void* src, std::size_t bytes);

// copy_bypassing_cache that also returns the digest of what it copied: the sum of
// kernels/step_digest.h's terms of its 32-bit words, the first at index `first_word` (a
// last partial word counts as if padded with zero bytes). One pass over the data, on
// the caller's OpenMP threads; the sum is exact, so the threads do not change it. The
// memory tier (engine/io/memory_tier.h) seals each slot with it.
uint64_t copy_and_digest(void* dst, const void* src, std::size_t bytes, uint64_t first_word);
// The same digest without copying (kernels/step_digest.h's definition): for reading a slot back.
uint64_t digest_bytes(const void* data, std::size_t bytes, uint64_t first_word);

// Below this a copy stays in cache: streaming stores would only add the fence.
inline constexpr std::size_t kStreamingMinBytes = 64 * 1024;

}  // namespace engine::kernels::cpu
