// Runs the HDF5 parse of a checkpoint (io/hdf5_walk.h) in a separate parser process, so
// that a file crafted to crash, hang or corrupt libhdf5 takes down only that process.
// The parser is forked on first use, from the calling thread, and kept for later loads
// (one IPC round trip each); it is replaced after it refuses a file, crashes or runs
// out of time. It never touches CUDA, OpenMP or the caller's files. See docs/security.md.
#pragma once
#include <cstddef>
#include <cstdint>
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

// What the parser process does with an image. The engine's parser walks it
// (hdf5_walk::walk) and encodes the manifest (manifest::encode); another can be installed
// with use_parser (the tests' fault-injecting parser, tests/support/sandbox_faults.h).
class ImageParser {
 public:
  virtual ~ImageParser() = default;
  // In the caller, once per request (under the sandbox's lock): a value that travels
  // with the request to parse() in the parser process.
  virtual uint32_t next_request_tag() { return 0; }
  // In the caller: the wall-clock watchdog of a request, given the default for its size.
  virtual double wall_limit_seconds(double default_seconds) const { return default_seconds; }
  // In the parser process, confined (no files, no processes, signals only to itself):
  // the encoded manifest of the image; throws hdf5_walk::Refusal or hdf5_walk::NeedsData.
  virtual std::string parse(unsigned char* image, std::size_t image_size, ImageContent content,
                            uint32_t tag) const;
};

// Installs `parser` (nullptr: the engine's own) for the parses that follow; a running
// parser process, forked with the previous one, is replaced. `parser` must outlive its use.
void use_parser(ImageParser* parser);

// How the parser process is confined: its seccomp filter is installed where the kernel
// allows (not under qemu-user, for one). Starts the parser if none runs and waits for it
// to say. ENGINE_PARSER_SECCOMP=require makes every parse without the filter fail.
struct Confinement {
  bool known = false;         // the parser started and said
  int seccomp_errno = 0;      // 0: the filter is installed; else why not (prctl's errno)
  bool required = false;      // ENGINE_PARSER_SECCOMP=require
  std::string start_error;    // why the parser could not be started (known == false)
  std::string policy_error;   // ENGINE_PARSER_SECCOMP holds another value (every parse fails)
};
Confinement confinement();

// The parser process's id, or -1 when none runs.
int parser_pid();

}  // namespace engine::hdf5_sandbox
