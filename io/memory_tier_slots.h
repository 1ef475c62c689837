// The memory tier's slot file as bytes (docs/recovery.md, "The memory tier"): the file
// header, each slot's seal, and how a state lies in a slot's payload. Private to io/:
// memory_tier.cpp keeps the file, memory_tier_payload.cpp encodes and decodes a state.
#pragma once

#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/io/checkpoint.h"

namespace engine::memory_tier::slots {

constexpr char kMagic[16] = {'E', 'N', 'G', 'I', 'N', 'E', ' ', 'M', 'E', 'M', 'T', 'I', 'E', 'R', '\n', '\0'};
constexpr uint64_t kSealed = 0x44454C4145534C53ull;  // "SLSEALED" read as little-endian text
constexpr uint64_t kHeaderBytes = 4096;               // the file header's page
constexpr uint64_t kSealBytes = 4096;                 // each slot's seal page; its payload follows
constexpr uint64_t kAlign = 64;                       // every tensor of a payload starts at a multiple

struct FileHeader {
  char magic[16];
  uint32_t layout_version;
  uint32_t header_bytes;
  uint64_t slot_bytes;  // each slot, its seal page included
  uint64_t slot_offset[2];
  uint32_t owner_uid;
  uint32_t run_dir_bytes;
  char run_dir[3968];
  uint32_t crc;  // zlib crc32 of every byte above
};
static_assert(sizeof(FileHeader) <= kHeaderBytes, "the header fits its page");

struct SlotSeal {
  uint64_t sealed;  // kSealed once the slot is complete; 0 while it is written
  uint64_t sequence;
  int64_t global_step;
  uint64_t index_bytes;    // the JSON index at the start of the payload
  uint64_t payload_bytes;  // the index, padding, and the tensors
  uint64_t digest;         // kernels/step_digest.h's terms of the payload's words, from word 0
  uint32_t crc;            // zlib crc32 of the fields from `sequence` to `digest`
  uint32_t unused;
};

// kernels/step_digest.h's digest of `bytes` (a multiple of 4) of the payload from byte
// `at`, its first word at index at / 4: the CPU backend's digest_words op.
uint64_t digest_at(const unsigned char* payload, uint64_t at, uint64_t bytes);

inline uint32_t crc_of(const void* p, std::size_t n) {
  return static_cast<uint32_t>(::crc32(0L, static_cast<const Bytef*>(p), static_cast<uInt>(n)));
}
inline uint32_t header_crc(const FileHeader& h) { return crc_of(&h, offsetof(FileHeader, crc)); }
inline uint32_t seal_crc(const SlotSeal& s) {
  return crc_of(&s.sequence, offsetof(SlotSeal, crc) - offsetof(SlotSeal, sequence));
}

// The seal as a reader may trust it, or why not.
std::string check_seal(const SlotSeal& s, uint64_t slot_bytes);

// The index of a state: everything but the tensors' bytes, and where each of those lies.
struct Placed {
  const Tensor* tensor;
  uint64_t offset;       // in the payload
  bool by_step_digest;   // checked by the state's step digest, not the seal's
};
struct Layout {
  std::string index;  // JSON text
  uint64_t payload_bytes = 0;
  std::vector<Placed> tensors;
};

// The index and the tensors' places of a state (its tensors on the CPU).
Layout layout_of(const Checkpoint& c);

// The state a payload holds, its index checked against the payload (a crafted index
// cannot make it allocate more than the slot holds). Throws on a malformed index.
Checkpoint state_of(const unsigned char* payload, const SlotSeal& seal);

// The digest the seal records, recomputed: every byte of the payload but the tensors
// the index says the step digest checks (each up to its next word boundary). Sets
// `by_step_digest` when there are such tensors. Throws when the index does not parse.
uint64_t seal_digest_of(const unsigned char* payload, const SlotSeal& seal, bool& by_step_digest);

}  // namespace engine::memory_tier::slots
