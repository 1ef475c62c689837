// `engine verify-export FILE`.
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "engine/train/export.h"

namespace engine::cli {

void verify_export_options(CLI::App* c, Commands& cmds) {
  c->add_option("FILE", cmds.verify_export_path, "an .onnx or .safetensors file written by engine export")
      ->required()
      ->type_name("");
  c->footer("Exit status: 0 when every probe's logits are within their tolerances, 1 otherwise.");
}

int cmd_verify_export(const std::string& path) {
  const ExportCheck c = verify_export(path);
  std::ostringstream o;
  o << path << ": OK (" << to_string(c.format) << ", " << c.model << ", " << c.probes << " probes x " << c.classes
    << " logits within their tolerances: max |diff| " << std::setprecision(3) << c.max_abs_diff << ", at most "
    << std::fixed << std::setprecision(1) << 100 * c.worst_fraction << " % of a tolerance; tolerances "
    << std::scientific << std::setprecision(2) << c.min_tolerance << " to " << c.max_tolerance << ")\n";
  std::cout << o.str();
  return 0;
}

}  // namespace engine::cli
