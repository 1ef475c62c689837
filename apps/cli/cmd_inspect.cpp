// `engine inspect CKPT.h5`.
#include <iostream>

#include "cli/commands.h"
#include "engine/io/checkpoint.h"
#include "engine/io/memory_tier.h"

namespace engine::cli {

void inspect_options(CLI::App* inspect, Commands& c) {
  inspect->add_option("CKPT.h5", c.inspect_path, "the checkpoint, or a memory tier's slot file")->required()->type_name("");
}

int cmd_inspect(const std::string& path) {
  // A memory tier's slot file (docs/recovery.md, "The memory tier"): its slots.
  if (memory_tier::is_slot_file(path)) {
    std::cout << memory_tier::describe(memory_tier::read(path, "", memory_tier::Read::States));
    return 0;
  }
  std::cout << inspect_checkpoint(path);
  return 0;
}

}  // namespace engine::cli
