// libFuzzer harness: the config parser with `--set` overrides (include/engine/train/config.h),
// along the path `engine train CONFIG --set K=V ...` takes.
// The input is split at NUL bytes: the first piece is the JSON text of the config file,
// each further piece one --set assignment. Expected: a valid Config, or a ConfigError
// whose message is one line. A config that validates must also survive its own round
// trip: config_to_json of it validates again to the same JSON.
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/train/config.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile file;
  std::vector<std::string> pieces(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) pieces.emplace_back();
    else pieces.back().push_back(static_cast<char>(data[i]));
  }
  const std::string& path = file.write(reinterpret_cast<const uint8_t*>(pieces[0].data()), pieces[0].size());
  try {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(pieces[0]);
    } catch (const nlohmann::json::exception&) {
      // The CLI lets the config module word a parse error: it must refuse the file.
      engine::load_config(path);
      std::cerr << "load_config accepted text that nlohmann::json::parse refused\n";
      std::abort();
    }
    for (size_t i = 1; i < pieces.size(); ++i) engine::apply_override(j, pieces[i]);
    const engine::Config c = engine::config_from_json(j, path);
    const nlohmann::json resolved = engine::config_to_json(c);
    const nlohmann::json again = engine::config_to_json(engine::config_from_json(resolved, "resolved"));
    if (again != resolved) {
      std::cerr << "resolved config changes on a round trip:\n" << resolved.dump() << "\n" << again.dump() << "\n";
      std::abort();
    }
  } catch (const engine::ConfigError& e) {
    fuzz::require_one_line(e.what(), "");
  }
  return 0;
}
