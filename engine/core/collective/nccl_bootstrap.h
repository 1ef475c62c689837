// The host side of starting NCCL, in every build (no NCCL header: tests run it on the
// CPU): agreeing on the communicator's id over the bootstrap collective, and choosing
// this rank's GPU.
#pragma once
#include <array>
#include <cstddef>
#include <functional>

#include "engine/core/collective.h"

namespace engine::dist {

// NCCL_UNIQUE_ID_BYTES (nccl.h; nccl_collective.cpp checks that they agree).
constexpr std::size_t kNcclIdBytes = 128;
using NcclId = std::array<char, kNcclIdBytes>;

// Rank 0 of `bootstrap` calls make_id (ncclGetUniqueId) and the bootstrap broadcasts
// the id: every rank returns rank 0's, and no other rank calls make_id.
NcclId agree_nccl_id(Collective& bootstrap, const std::function<NcclId()>& make_id);

// The GPU of a rank: its local rank (one rank per GPU: NCCL refuses two ranks on one).
// Throws std::runtime_error naming the rank when the machine has too few GPUs.
int nccl_device_for(int rank, int local_rank, int device_count);

}  // namespace engine::dist
