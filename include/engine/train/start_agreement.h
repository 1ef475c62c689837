// Before a data-parallel job trains, its ranks check that they are about to run the same
// thing: the same resolved config, the same build, the same data and, on resume, the same
// checkpoint (docs/distributed.md "Faults"). Ranks that differ would not fail: they would
// train on, silently, into a model no single process would give.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "engine/core/collective.h"
#include "engine/train/config.h"
#include "engine/io/dataset.h"
#include "engine/io/env.h"

namespace engine {

// Every rank throws it, with the same message, when the ranks differ (the CLI: exit 2).
class StartMismatchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct StartAgreement {
  int64_t data_bytes = 0;   // image and label bytes of the three splits, hashed in memory
  double test_load_ms = 0;  // reading the test split early (once: it is kept for the test)
  double hash_ms = 0;       // this rank's hashing (config, build, data, checkpoint file)
  double exchange_ms = 0;   // the allgather, including the wait for the last rank to arrive
};

// Compares across `comm`'s ranks, in one allgather of four 64-bit hashes when they agree:
//  - the config: config_to_json(cfg) without data.dir and checkpoint.dir (paths may differ
//    from node to node; what they hold is compared below);
//  - the build: engine version, compiler, MPI library, CUDA backend on or off;
//  - the data: the bytes of every split of `data` as loaded (the test split is loaded
//    now rather than after training, so nothing is read twice);
//  - the checkpoint to resume from: the bytes of `checkpoint_path` ("" when starting fresh).
// On a difference every rank throws StartMismatchError naming what differs, and for the
// config the keys with both values, and which ranks differ from rank 0. With one rank it
// returns at once, hashing nothing. The checkpoint is read, and the times taken, through
// `env` (null: Env::posix()).
StartAgreement agree_on_start(Collective& comm, const Config& cfg, Dataset& data,
                              const std::string& checkpoint_path, Env* env = nullptr);

}  // namespace engine
