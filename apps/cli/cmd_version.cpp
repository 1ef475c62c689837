// `engine version` and `engine --version`.
#include <iostream>

#include "cli/commands.h"
#include "engine/core/build_info.h"
#include "engine/core/collective.h"
#include "engine/io/checkpoint.h"

namespace engine::cli {

std::string version_text() {
  std::string out = to_string(build_info());
  out += "mpi: " + (mpi_built() ? mpi_library_version() : std::string("not built (one process only)")) + "\n";
  if (!nccl_built()) {
    out += "nccl: not built (CUDA ranks exchange through MPI)\n";
  } else {
    const std::string v = nccl_version();  // opened at run time: may be missing here
    out += "nccl: " + (v.empty() ? std::string("built, but libnccl.so.2 does not load here") : v) + "\n";
  }
  out += "checkpoint parser: " + checkpoint_parser_confinement().summary + "\n";
  return out;
}

int cmd_version() {
  std::cout << version_text();
  return 0;
}

}  // namespace engine::cli
