// Runs the HDF5 parse of a checkpoint (io/hdf5_walk.h) in a separate parser process, so
// that a file crafted to crash, hang or corrupt libhdf5 takes down only that process.
// The parser is forked on first use, from the calling thread, and kept for later loads
// (one IPC round trip each); it is replaced after it refuses a file, crashes or runs
// out of time. It never touches CUDA, OpenMP or the caller's files. See docs/security.md.
#pragma once
#include <cstddef>
#include <stdexcept>
#include <string>

#include "io/checkpoint_manifest.h"
#include "io/hdf5_walk.h"

namespace engine::hdf5_sandbox {

enum class Outcome {
  Parsed,      // `manifest` is set (still to be checked against the file by the caller)
  Refused,     // `message` says why (one line, without the file's path)
  NeedsData,   // the image held only the metadata and a dataset's bytes are needed
  Failed,      // the parser crashed, ran out of time or memory, or replied nonsense
};

struct Reply {
  Outcome outcome = Outcome::Refused;
  manifest::Manifest manifest;
  std::string message;
};

using ImageContent = hdf5_walk::ImageContent;

// The file of `image_size` bytes whose first `sent` bytes are `image`; with
// MetadataOnly the parser sees zeros past them. Blocks until the parser replies. A
// parser that crashes, exceeds its time or memory, or sends a malformed reply gives
// Refused with a message saying so. Thread-safe (one parse at a time).
Reply parse(const unsigned char* image, std::size_t sent, std::size_t image_size, ImageContent content);

// Starts the parser now if none runs (a failure is reported by the next parse).
void prepare();

// The first half of parse(): hands the image to the parser and returns at once, so the
// caller can do other work while it parses; finish() waits for the reply. Every
// start() must be followed by finish() on the same thread.
void start(const unsigned char* image, std::size_t sent, std::size_t image_size, ImageContent content);
Reply finish();

// For tests only: makes the parser misbehave on the next parse, to test that the loader
// survives it. Crash: SIGSEGV; Spin: a busy loop (stopped by the CPU limit); Stall: a
// blocked wait (stopped by the wall-clock watchdog); Garbage: a malformed reply.
namespace testing {
enum class Fault { None, Crash, Spin, Stall, Garbage, Allocate };
void inject_next(Fault fault);
// Wall-clock watchdog in seconds for the next parses (0 restores the default).
void set_wall_limit(double seconds);
// The parser's process id, or -1 when none runs.
int parser_pid();
}  // namespace testing

}  // namespace engine::hdf5_sandbox
