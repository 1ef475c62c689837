// The config's key rows and how they are read and written (include/engine/io/config_table.h
// says who declares which section). A section's .cpp builds its rows with the helpers
// below, one line per key; the root (engine/train/config.cpp) nests the sections under
// their names with nest() and reads, writes and documents them with read_config,
// write_config and key_infos. The parsing, the messages and the key suggestions are here
// once, for every section.
#pragma once
#include <climits>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/io/config_table.h"

namespace engine {

constexpr int64_t kConfigInt64Max = std::numeric_limits<int64_t>::max();

// "string \"12\"", "number 3.0", "boolean true", "null", "array [1,2]".
std::string describe_json(const nlohmann::json& v);
// The value as JSON text, cut at 60 characters, for messages.
std::string short_json(const nlohmann::json& v);

// Typed, validated reads of the user's JSON by dotted key. Each returns false when the
// user left the key out (the default stays) and throws a one-line ConfigError naming the
// origin and the key otherwise.
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& root, std::string origin) : root_(root), origin_(std::move(origin)) {}

  [[noreturn]] void fail(const std::string& message) const;
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;

  // The value at a dotted key, or nullptr when the user left it out.
  const nlohmann::json* find(const std::string& dotted) const;

  // Integer keys require JSON integers: 3.0 is rejected rather than silently truncated.
  bool integer(const std::string& key, int64_t& out, int64_t lo, int64_t hi) const;
  bool integer(const std::string& key, int& out, int64_t lo, int64_t hi) const;
  bool optional_integer(const std::string& key, std::optional<int64_t>& out, int64_t lo, int64_t hi) const;
  enum class Nullable { No, Yes };
  int64_t integer_value(const std::string& key, const nlohmann::json& v, int64_t lo, int64_t hi,
                        Nullable nullable = Nullable::No) const;
  // Real keys accept JSON integers and floats; non-finite values are never meaningful here.
  bool real(const std::string& key, double& out) const;
  double real_value(const std::string& key, const nlohmann::json& v) const;
  // Range checks run on the parsed value; defaults always pass, so a failure means the
  // user's value, which is quoted as written.
  void require(const std::string& key, bool ok, const std::string& condition) const;
  bool string(const std::string& key, std::string& out) const;
  bool nonempty_string(const std::string& key, std::string& out) const;
  bool boolean(const std::string& key, bool& out) const;

  // A fixed choice: the string as written in JSON, turned into its enum here (through
  // the enum's to_string), so nothing past the config compares strings.
  template <typename Enum>
  bool choice(const std::string& key, Enum& out, const std::vector<Enum>& choices) const {
    std::string text;
    if (!string(key, text)) return false;
    std::string names;
    for (const Enum c : choices) {
      if (text == to_string(c)) {
        out = c;
        return true;
      }
      names += (names.empty() ? "" : ", ") + std::string(to_string(c));
    }
    fail(key, "must be one of " + names + ", got " + short_json(*find(key)));
  }

  // Rejects keys `schema` (the defaults as JSON) does not have, and sections that are not
  // objects, naming the closest valid key; the typed reads then only see known keys.
  void check_structure(const nlohmann::json& schema) const;

 private:
  void check_level(const nlohmann::json& node, const nlohmann::json& level, const std::string& prefix,
                   const nlohmann::json& schema) const;

  const nlohmann::json& root_;
  std::string origin_;
};

// One key of a section: its name within the section ("lr", "loss_scale.init"), the type,
// range and meaning as docs/config.md states them, and how it is read (under its full
// dotted name, for messages) and written.
template <class Section>
struct ConfigKey {
  std::string name;
  std::string type;
  std::string range;  // "" when there is nothing to say
  std::string doc;    // the Meaning cell of docs/config.md's row (markdown, one line)
  std::function<void(const ConfigReader&, const std::string& dotted, Section&)> read;
  std::function<nlohmann::json(const Section&)> write;
};

// ---- Rows, one helper per kind of key ----------------------------------------------------

template <class S, class Int>
ConfigKey<S> integer_key(const char* name, Int S::*field, int64_t lo, int64_t hi, const char* range, const char* doc) {
  return {name, "integer", range, doc,
          [=](const ConfigReader& r, const std::string& dotted, S& s) { r.integer(dotted, s.*field, lo, hi); },
          [=](const S& s) { return nlohmann::json(s.*field); }};
}

template <class S>
ConfigKey<S> nullable_integer_key(const char* name, std::optional<int64_t> S::*field, int64_t lo,
                                  const char* range, const char* doc) {
  return {name, "integer, nullable", range, doc,
          [=](const ConfigReader& r, const std::string& dotted, S& s) {
            r.optional_integer(dotted, s.*field, lo, kConfigInt64Max);
          },
          [=](const S& s) { return s.*field ? nlohmann::json(*(s.*field)) : nlohmann::json(nullptr); }};
}

// A real with a condition on its value (`holds`), reported as `condition`.
template <class S, class P>
ConfigKey<S> real_key(const char* name, double S::*field, P holds, const char* condition, const char* range, const char* doc) {
  return {name, "real", range, doc,
          [=](const ConfigReader& r, const std::string& dotted, S& s) {
            r.real(dotted, s.*field);
            r.require(dotted, holds(s.*field), condition);
          },
          [=](const S& s) { return nlohmann::json(s.*field); }};
}

template <class S>
ConfigKey<S> any_real_key(const char* name, double S::*field, const char* range, const char* doc) {
  return {name, "real", range, doc,
          [=](const ConfigReader& r, const std::string& dotted, S& s) { r.real(dotted, s.*field); },
          [=](const S& s) { return nlohmann::json(s.*field); }};
}

template <class S>
ConfigKey<S> nonempty_string_key(const char* name, std::string S::*field, const char* range, const char* doc) {
  return {name, "string", range, doc,
          [=](const ConfigReader& r, const std::string& dotted, S& s) { r.nonempty_string(dotted, s.*field); },
          [=](const S& s) { return nlohmann::json(s.*field); }};
}

template <class S>
ConfigKey<S> boolean_key(const char* name, bool S::*field, const char* doc) {
  return {name, "boolean", "", doc,
          [=](const ConfigReader& r, const std::string& dotted, S& s) { r.boolean(dotted, s.*field); },
          [=](const S& s) { return nlohmann::json(s.*field); }};
}

template <class S, class Enum>
ConfigKey<S> choice_key(const char* name, Enum S::*field, std::initializer_list<Enum> choices, const char* range, const char* doc) {
  const std::vector<Enum> all(choices);
  return {name, "string", range, doc,
          [=](const ConfigReader& r, const std::string& dotted, S& s) { r.choice(dotted, s.*field, all); },
          [=](const S& s) { return nlohmann::json(to_string(s.*field)); }};
}

// ---- Sections inside sections ------------------------------------------------------------

// Appends `section`'s keys to `out` under `prefix` ("optimizer" + "lr" = "optimizer.lr"),
// reading and writing the member `field` of the enclosing struct.
template <class Outer, class S>
void nest(std::vector<ConfigKey<Outer>>& out, const std::string& prefix, S Outer::*field,
          const std::vector<ConfigKey<S>>& section) {
  for (const ConfigKey<S>& k : section)
    out.push_back({prefix + "." + k.name, k.type, k.range, k.doc,
                   [field, read = k.read](const ConfigReader& r, const std::string& dotted, Outer& o) {
                     read(r, dotted, o.*field);
                   },
                   [field, write = k.write](const Outer& o) { return write(o.*field); }});
}

// ---- The whole table -----------------------------------------------------------------------

// j[a][b][c] = v for the dotted key "a.b.c".
void set_dotted(nlohmann::json& j, const std::string& dotted, nlohmann::json v);

template <class Root>
nlohmann::json write_config(const std::vector<ConfigKey<Root>>& keys, const Root& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const ConfigKey<Root>& k : keys) set_dotted(j, k.name, k.write(c));
  return j;
}

// Keys are read in table order, so the first bad key is the one reported.
template <class Root>
Root read_config(const std::vector<ConfigKey<Root>>& keys, const nlohmann::json& j, const std::string& origin) {
  const ConfigReader r(j, origin);
  if (!j.is_object()) r.fail("config must be a JSON object, got " + describe_json(j));
  r.check_structure(write_config(keys, Root{}));
  Root c;
  for (const ConfigKey<Root>& k : keys) k.read(r, k.name, c);
  return c;
}

template <class Root>
std::vector<ConfigKeyInfo> key_infos(const std::vector<ConfigKey<Root>>& keys) {
  const Root defaults{};
  std::vector<ConfigKeyInfo> out;
  for (const ConfigKey<Root>& k : keys) out.push_back({k.name, k.type, k.range, k.doc, k.write(defaults).dump()});
  return out;
}

// The JSON text of a config file, or a ConfigError naming `path` and the line and
// column of a syntax error.
nlohmann::json read_config_json(const std::string& path);

// "dotted.key=value" applied to `j`, checked against `schema` (the defaults as JSON).
// The value is JSON when it parses as JSON, else the literal string.
void apply_config_override(nlohmann::json& j, const std::string& assignment, const nlohmann::json& schema);

}  // namespace engine
