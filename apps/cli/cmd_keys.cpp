// `engine keys`.
#include <iostream>

#include "cli/commands.h"
#include "engine/train/config.h"

namespace engine::cli {

int cmd_keys() {
  std::string section = "-";
  for (const ConfigKeyInfo& k : config_keys()) {
    const auto dot = k.dotted.find('.');
    const std::string s = dot == std::string::npos ? "" : k.dotted.substr(0, dot);
    if (s != section) {
      std::cout << (section == "-" ? "" : "\n") << "### " << (s.empty() ? "Top level" : "`" + s + "`")
                << "\n\n| Key | Type | Default | Valid | Meaning |\n|---|---|---|---|---|\n";
      section = s;
    }
    std::cout << to_markdown_row(k) << "\n";
  }
  return 0;
}

}  // namespace engine::cli
