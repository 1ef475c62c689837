// The fixed chunks of a batch (docs/distributed.md): every cross-sample sum is the tree
// over them, so the bits do not depend on who computes which chunk. Stated once here for
// the kernels (kernels/chunk_tree.h), the batch plan (engine/core/batch_chunks.h) and the
// config (dist.chunks).
#pragma once

namespace engine {

// The default number of chunks of a batch (dist.chunks), and the most chunks one call
// of a chunked op takes (its per-chunk partials live in fixed arrays): a rank with more
// chunks, or with an unaligned range, calls the op once per block.
inline constexpr int kTreeChunks = 8;
// The largest dist.chunks accepted (ranks per job; a power of two).
inline constexpr int kMaxTreeChunks = 1024;

}  // namespace engine
