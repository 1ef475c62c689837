// Private to the parser sandbox (io/hdf5_sandbox*.cpp): what the caller
// (io/hdf5_sandbox.cpp) and the parser process (io/hdf5_sandbox_parser.cpp) say to each
// other over their socket pair, and the limits both sides compute.
#pragma once
#include <cstdint>

#include "io/hdf5_sandbox.h"

namespace engine::hdf5_sandbox {

constexpr uint64_t kRequestMagic = 0x5153455251484645;  // "EFHQREQS"
// CPU time a parse may take: the walk of a 5 MB checkpoint takes well under 10 ms.
constexpr double kCpuSeconds = 2.0;
constexpr double kCpuSecondsPerMiB = 0.05;

enum class Status : uint8_t { Parsed = 0, Refused = 1, NeedsData = 2, Failed = 3 };

// The parser's first message, once it is set up: whether its seccomp filter is in place.
constexpr uint64_t kGreetingMagic = 0x4f4c4c4548464645;  // "EFFHELLO"
struct Greeting {
  uint64_t magic;
  int32_t seccomp_errno;  // 0: the filter is installed; else prctl's errno
  int32_t reserved;
};

struct Request {
  uint64_t magic;
  uint64_t image_size;
  uint64_t sent;
  uint32_t content;
  uint32_t tag;  // ImageParser::next_request_tag()
};

// The installed parser (use_parser): in the caller under g_mutex, and in the parser
// process, which inherits it from the caller that forked it.
ImageParser& image_parser();

inline double cpu_limit_seconds(uint64_t sent) { return kCpuSeconds + kCpuSecondsPerMiB * double(sent >> 20); }

// The parser process's life, in the child forked by the caller with its end of the
// socket pair: answers requests until the socket closes or a file leaves it in doubt.
[[noreturn]] void serve(int sock);

}  // namespace engine::hdf5_sandbox
