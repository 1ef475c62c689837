// What the config's key table is made of, and what a layer needs to declare its section
// of it (docs/config.md). Each layer declares the sections it reads, beside their structs:
//   io     data                                   engine/io/config_sections.h
//   nn     model, optimizer, scheduler, precision engine/nn/config_sections.h
//   train  seed, device, train, checkpoint, logging, cuda, dist, and the whole Config
//                                                 engine/train/config_sections.h, config.h
// A section is a list of keys (ConfigKey, io/config_keys.h): the name, the documented
// type and range, how the value is read and checked, and how it is written. The reader,
// the writer, the list of accepted keys and docs/config.md's key tables all come from
// those rows; nothing else names a key.
#pragma once
#include <stdexcept>
#include <string>
#include <vector>

namespace engine {

// Errors in a config carry one line naming the file (or "--set") and the dotted key.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One row of a section's key table (defined in io/config_keys.h, for the layers' .cpp files).
template <class Section>
struct ConfigKey;
template <class Section>
using ConfigSection = std::vector<ConfigKey<Section>>;

// One entry per config key, in file order, as docs/config.md's key tables state them:
// the dotted name, the type ("integer, nullable", ...), the accepted range and the
// meaning in the documentation's words, and the default value as JSON text.
struct ConfigKeyInfo {
  std::string dotted, type, range, doc, default_json;
};

// The key's row of docs/config.md's tables: "| `key` | type | `default` | range | meaning |".
// `engine keys` prints every row, and test_config checks the documentation against them.
std::string to_markdown_row(const ConfigKeyInfo& k);

// Throws the ConfigError a fixed choice gives ("<origin>: key 'model.name' must be one
// of fashion_cnn, mlp, got \"x\"") unless `value` is one of `choices`: for choices a
// section cannot know itself, such as model.name against the model registry.
void require_choice(const std::string& origin, const std::string& key, const std::string& value,
                    const std::vector<std::string>& choices);

}  // namespace engine
