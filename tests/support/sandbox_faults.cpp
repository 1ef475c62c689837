#include "support/sandbox_faults.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "io/hdf5_sandbox.h"

namespace engine::hdf5_sandbox::testing {
namespace {

// The engine's parser, preceded on a tagged request by the fault the tag names. The tag
// is taken in the caller (one request only) and acted on in the parser process.
class FaultInjectingParser : public ImageParser {
 public:
  std::atomic<uint32_t> next_fault{0};
  std::atomic<double> wall_limit{0};

  uint32_t next_request_tag() override { return next_fault.exchange(0); }
  double wall_limit_seconds(double default_seconds) const override {
    const double w = wall_limit.load();
    return w > 0 ? w : default_seconds;
  }
  std::string parse(unsigned char* image, std::size_t size, ImageContent content,
                    uint32_t tag) const override {
    switch (static_cast<Fault>(tag)) {
      case Fault::None: break;
      case Fault::Crash: ::raise(SIGSEGV); break;
      case Fault::Spin: {
        volatile uint64_t x = 0;
        for (;;) x = x + 1;
      }
      case Fault::Stall: ::pause(); break;
      case Fault::Allocate: {
        std::vector<void*> held;
        for (;;) held.push_back(::operator new(std::size_t(64) << 20));  // bad_alloc at the limit
      }
      case Fault::Garbage: {
        (void)ImageParser::parse(image, size, content, 0);
        return std::string(64, '\x7f');
      }
    }
    return ImageParser::parse(image, size, content, 0);
  }
};

FaultInjectingParser& installed() {
  static FaultInjectingParser* parser = [] {
    static FaultInjectingParser p;
    use_parser(&p);
    return &p;
  }();
  return *parser;
}

}  // namespace

void inject_next(Fault fault) { installed().next_fault = static_cast<uint32_t>(fault); }
void set_wall_limit(double seconds) { installed().wall_limit = seconds; }
int parser_pid() { return hdf5_sandbox::parser_pid(); }

}  // namespace engine::hdf5_sandbox::testing
