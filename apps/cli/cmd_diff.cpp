// `engine diff A.h5 B.h5`.
#include <iostream>

#include "cli/commands.h"
#include "engine/io/checkpoint.h"

namespace engine::cli {

void diff_options(CLI::App* diff, Commands& c) {
  diff->add_option("A.h5", c.diff_a, "the first checkpoint")->required()->type_name("");
  diff->add_option("B.h5", c.diff_b, "the second checkpoint")->required()->type_name("");
  diff->footer("Exit status: 0 identical, 1 different (or an error).");
}

int cmd_diff(const std::string& a, const std::string& b) {
  const CheckpointDiff d = diff_checkpoints(a, b);
  std::cout << d.report;
  std::cout << (d.identical ? "identical\n" : "different\n");
  return d.identical ? 0 : 1;
}

}  // namespace engine::cli
