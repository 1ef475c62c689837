// `engine inspect CKPT.h5`.
#include <iostream>

#include "cli/commands.h"
#include "engine/io/checkpoint.h"

namespace engine::cli {

void inspect_options(CLI::App* inspect, Commands& c) {
  inspect->add_option("CKPT.h5", c.inspect_path, "the checkpoint")->required()->type_name("");
}

int cmd_inspect(const std::string& path) {
  std::cout << inspect_checkpoint(path);
  return 0;
}

}  // namespace engine::cli
