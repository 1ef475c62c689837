// The library's error types that are not tied to one header's API. Every error the
// library throws carries one line of text naming the file or key at fault:
//   ConfigError (engine/io/config_table.h)   a config value, its key and where it came from;
//   CheckpointError (engine/io/checkpoint.h)  a checkpoint file, its path first;
//   DataError (here)                   a dataset file or directory (key data.dir);
//   std::invalid_argument              API misuse.
#pragma once
#include <stdexcept>

namespace engine {

// A dataset that cannot be read: missing directory or file (with the install hint),
// bad magic, truncated or inconsistent IDX files. Thrown by Dataset::get() and the
// IDX readers (engine/io/idx.h); Trainer's constructor loads the data, so it throws it too.
struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace engine
