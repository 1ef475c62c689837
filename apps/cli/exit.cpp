#include "cli/exit.h"

#include <iostream>

#include "engine/run/run_session.h"

namespace engine::cli {

void fail(const std::string& msg, int code) {
  std::cout << std::flush;
  std::cerr << "engine: " + RunSession::rank_tag() + msg + "\n" << std::flush;  // one write: ranks' lines do not mix
  RunSession::abort_job(code);
}

}  // namespace engine::cli
