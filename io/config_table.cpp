#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "io/config_keys.h"

namespace engine {
namespace {

using nlohmann::json;

// ---------------------------------------------------------------------------------------
// Key suggestions

size_t levenshtein(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      const size_t subst = diag + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, subst});
      diag = up;
    }
  }
  return row[b.size()];
}

// How many edits still count as "probably a typo" for a name of this length: one edit for
// short names such as "lr", growing slowly so that long names tolerate a transposition.
size_t typo_budget(const std::string& name) { return std::max<size_t>(1, (name.size() + 2) / 3); }

std::string leaf_of(const std::string& dotted) {
  const auto dot = dotted.rfind('.');
  return dot == std::string::npos ? dotted : dotted.substr(dot + 1);
}

std::string parent_of(const std::string& dotted) {
  const auto dot = dotted.rfind('.');
  return dot == std::string::npos ? std::string() : dotted.substr(0, dot);
}

// Every dotted path of the schema, sections included, in schema order.
void collect_paths(const json& schema, const std::string& prefix, std::vector<std::string>& out) {
  for (const auto& [key, value] : schema.items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    out.push_back(path);
    if (value.is_object()) collect_paths(value, path, out);
  }
}

std::vector<std::string> schema_paths(const json& schema) {
  std::vector<std::string> p;
  collect_paths(schema, "", p);
  return p;
}

bool is_schema_path(const std::string& dotted, const json& schema) {
  const auto paths = schema_paths(schema);
  return std::find(paths.begin(), paths.end(), dotted) != paths.end();
}

// The closest valid key to `dotted` (whose last component is the unknown name, placed under
// `parent`), or "" when nothing is close. Two ways to be close: the whole dotted path is a
// near miss ("optimizer.lrr", "trian.epochs"), or the last component is a near miss of some
// key anywhere ("lr" written at the top level instead of under "optimizer"). On a tie a key
// under the same parent wins, since that is where the user was writing.
std::string closest_key(const std::string& dotted, const std::string& parent, const json& schema) {
  const std::string name = leaf_of(dotted);
  std::string best;
  size_t best_score = std::numeric_limits<size_t>::max();
  bool best_is_sibling = false;
  for (const auto& path : schema_paths(schema)) {
    size_t score = std::numeric_limits<size_t>::max();
    const size_t whole = levenshtein(dotted, path);
    if (whole <= typo_budget(dotted)) score = whole;
    const size_t leaf = levenshtein(name, leaf_of(path));
    if (leaf <= typo_budget(name)) score = std::min(score, leaf);
    if (score == std::numeric_limits<size_t>::max()) continue;
    const bool sibling = parent_of(path) == parent;
    if (score < best_score || (score == best_score && sibling && !best_is_sibling)) {
      best = path;
      best_score = score;
      best_is_sibling = sibling;
    }
  }
  return best;
}

std::string join_keys(const json& level) {
  std::string out;
  for (const auto& [key, value] : level.items()) {
    if (!out.empty()) out += ", ";
    out += key;
  }
  return out;
}

// "unknown key 'x' (did you mean 'y'?)", or the keys valid at `level` (named `level_name`,
// "" for the top) when nothing is close.
std::string unknown_key_message(const std::string& dotted, const json& level,
                                const std::string& level_name, const json& schema) {
  std::string msg = "unknown key '" + dotted + "'";
  const std::string suggestion = closest_key(dotted, parent_of(dotted), schema);
  if (!suggestion.empty()) return msg + " (did you mean '" + suggestion + "'?)";
  if (level.is_object() && !level.empty())
    return msg + " (valid keys" + (level_name.empty() ? "" : " in '" + level_name + "'") + ": " +
           join_keys(level) + ")";
  return msg;
}

// ---------------------------------------------------------------------------------------
// Describing values in messages

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  return s;
}

std::string short_dump(const json& v) {
  // Replace, not throw, on invalid UTF-8: a message must never fail to be built.
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  constexpr size_t kMax = 60;
  if (s.size() > kMax) s = s.substr(0, kMax) + "...";
  return s;
}

// "string \"12\"", "number 3.0", "boolean true", "null", "array [1,2]".
std::string describe(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean " + short_dump(v);
    case json::value_t::string: return "string " + short_dump(v);
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return "number " + short_dump(v);
    case json::value_t::array: return "array " + short_dump(v);
    case json::value_t::object: return "object " + short_dump(v);
    default: return short_dump(v);
  }
}

// "[json.exception.out_of_range.406] number overflow ..." without the bracketed id.
std::string strip_exception_id(const std::string& what) {
  const auto id_end = what.find("] ");
  return id_end == std::string::npos ? what : what.substr(id_end + 2);
}

// nlohmann reports "[json.exception.parse_error.101] parse error at line 3, column 5:
// syntax error ..."; keep the position and the explanation, drop the exception id.
std::string describe_parse_error(const json::parse_error& e) {
  const std::string what = e.what();
  const auto at = what.find("at line ");
  const auto colon = at == std::string::npos ? at : what.find(": ", at);
  long line = 0, column = 0;
  if (colon != std::string::npos &&
      std::sscanf(what.c_str() + at, "at line %ld, column %ld", &line, &column) == 2)
    return "invalid JSON at line " + std::to_string(line) + " column " + std::to_string(column) +
           ": " + what.substr(colon + 2);
  // Some parse errors carry no position in their text; the byte offset still locates them.
  return "invalid JSON at byte " + std::to_string(e.byte) + ": " + strip_exception_id(what);
}

}  // namespace

std::string describe_json(const json& v) { return describe(v); }
std::string short_json(const json& v) { return short_dump(v); }

// ---------------------------------------------------------------------------------------
// ConfigReader

void ConfigReader::fail(const std::string& message) const {
  throw ConfigError(one_line(origin_ + ": " + message));
}

void ConfigReader::fail(const std::string& key, const std::string& what) const {
  fail("key '" + key + "' " + what);
}

void ConfigReader::check_structure(const json& schema) const { check_level(root_, schema, "", schema); }

// Walks the user's JSON against one level of the schema.
void ConfigReader::check_level(const json& node, const json& level, const std::string& prefix,
                               const json& schema) const {
  for (const auto& [key, value] : node.items()) {
    const std::string dotted = prefix.empty() ? key : prefix + "." + key;
    const auto it = level.find(key);
    if (it == level.end()) {
      // A literal "optimizer.lr" key: files nest their keys, only --set uses dots.
      const auto dot = key.find('.');
      if (dot != std::string::npos && is_schema_path(dotted, schema))
        fail("unknown key '" + dotted + "' (config files nest keys: write \"" + key.substr(0, dot) +
             "\": {\"" + key.substr(dot + 1) + "\": ...})");
      fail(unknown_key_message(dotted, level, prefix, schema));
    }
    if (it->is_object()) {
      if (!value.is_object()) fail(dotted, "must be an object, got " + describe(value));
      check_level(value, *it, dotted, schema);
    }
  }
}

const json* ConfigReader::find(const std::string& dotted) const {
  const json* node = &root_;
  std::string::size_type start = 0;
  while (true) {
    const auto dot = dotted.find('.', start);
    const std::string part = dotted.substr(start, dot == std::string::npos ? dot : dot - start);
    if (!node->is_object()) return nullptr;
    const auto it = node->find(part);
    if (it == node->end()) return nullptr;
    node = &*it;
    if (dot == std::string::npos) return node;
    start = dot + 1;
  }
}

bool ConfigReader::integer(const std::string& key, int64_t& out, int64_t lo, int64_t hi) const {
  const json* v = find(key);
  if (!v) return false;
  out = integer_value(key, *v, lo, hi);
  return true;
}

bool ConfigReader::integer(const std::string& key, int& out, int64_t lo, int64_t hi) const {
  int64_t wide = out;
  const bool present = integer(key, wide, std::max<int64_t>(lo, INT_MIN), std::min<int64_t>(hi, INT_MAX));
  out = static_cast<int>(wide);
  return present;
}

bool ConfigReader::optional_integer(const std::string& key, std::optional<int64_t>& out, int64_t lo,
                                    int64_t hi) const {
  const json* v = find(key);
  if (!v) return false;
  if (v->is_null()) {
    out.reset();
  } else {
    out = integer_value(key, *v, lo, hi, Nullable::Yes);
  }
  return true;
}

int64_t ConfigReader::integer_value(const std::string& key, const json& v, int64_t lo, int64_t hi,
                                    Nullable nullable) const {
  if (!v.is_number_integer())
    fail(key, std::string("must be an integer") + (nullable == Nullable::Yes ? " or null" : "") + ", got " +
                  describe(v));
  // Values beyond int64 arrive as unsigned; they are out of every range we accept.
  const bool too_big = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX);
  const int64_t x = too_big ? INT64_MAX : v.get<int64_t>();
  if (too_big || x < lo || x > hi) {
    // An upper bound that is only the type's limit is worth mentioning only when it was hit.
    const bool type_limit = hi == kConfigInt64Max || hi == INT_MAX;
    const std::string range = (type_limit && !too_big && x < lo)
                                  ? "must be >= " + std::to_string(lo)
                                  : "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    fail(key, range + ", got " + short_dump(v));
  }
  return x;
}

bool ConfigReader::real(const std::string& key, double& out) const {
  const json* v = find(key);
  if (!v) return false;
  out = real_value(key, *v);
  return true;
}

double ConfigReader::real_value(const std::string& key, const json& v) const {
  if (!v.is_number()) fail(key, "must be a number, got " + describe(v));
  const double x = v.get<double>();
  if (!std::isfinite(x)) fail(key, "must be a finite number, got " + short_dump(v));
  return x;
}

void ConfigReader::require(const std::string& key, bool ok, const std::string& condition) const {
  if (ok) return;
  const json* v = find(key);
  fail(key, condition + ", got " + (v ? short_dump(*v) : std::string("the default")));
}

bool ConfigReader::string(const std::string& key, std::string& out) const {
  const json* v = find(key);
  if (!v) return false;
  if (!v->is_string()) fail(key, "must be a string, got " + describe(*v));
  out = v->get<std::string>();
  return true;
}

bool ConfigReader::nonempty_string(const std::string& key, std::string& out) const {
  if (!string(key, out)) return false;
  if (out.empty()) fail(key, "must be a non-empty string");
  return true;
}

bool ConfigReader::boolean(const std::string& key, bool& out) const {
  const json* v = find(key);
  if (!v) return false;
  if (!v->is_boolean()) fail(key, "must be a boolean (true or false), got " + describe(*v));
  out = v->get<bool>();
  return true;
}

// ---------------------------------------------------------------------------------------
// The table as a whole

// j[a][b][c] = v for the dotted key "a.b.c".
void set_dotted(json& j, const std::string& dotted, json v) {
  json* node = &j;
  std::string::size_type start = 0;
  for (auto dot = dotted.find('.'); dot != std::string::npos; dot = dotted.find('.', start)) {
    node = &(*node)[dotted.substr(start, dot - start)];
    start = dot + 1;
  }
  (*node)[dotted.substr(start)] = std::move(v);
}

json read_config_json(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError(path + ": cannot open config file (it is a directory)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open config file");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw ConfigError(path + ": cannot read config file");
  const std::string text = buffer.str();
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw ConfigError(one_line(path + ": " + describe_parse_error(e)));
  } catch (const json::exception& e) {
    // e.g. out_of_range 406 for 1e999, which has no position in the message.
    throw ConfigError(one_line(path + ": invalid JSON: " + strip_exception_id(e.what())));
  }
  return j;
}

void apply_config_override(json& j, const std::string& assignment, const json& schema) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos)
    throw ConfigError(one_line("--set: expected key=value, got '" + assignment + "'"));
  const std::string key = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  if (key.empty()) throw ConfigError(one_line("--set: missing key before '=' in '" + assignment + "'"));

  // Find the key in the schema, one component at a time, so the error can list the
  // keys valid at the level where the path went wrong.
  std::vector<std::string> parts;
  for (std::string::size_type start = 0;;) {
    const auto dot = key.find('.', start);
    parts.push_back(key.substr(start, dot == std::string::npos ? dot : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  const json* level = &schema;
  std::string level_name;
  for (const auto& part : parts) {
    if (!level->is_object() || level->find(part) == level->end())
      throw ConfigError(one_line("--set: " + unknown_key_message(key, *level, level_name, schema)));
    level = &(*level)[part];
    level_name = level_name.empty() ? part : level_name + "." + part;
  }

  // The value is JSON when it parses as JSON; otherwise it is the literal string, so that
  // `--set device=cpu` needs no shell-escaped quotes.
  json value;
  try {
    value = json::parse(text);
  } catch (const json::parse_error&) {
    // The literal string, which must be UTF-8 like any JSON text: the resolved config is
    // stored as JSON in every checkpoint (found by tests/fuzz/fuzz_config.cpp).
    try {
      (void)json(text).dump();
    } catch (const json::type_error&) {
      throw ConfigError(one_line("--set: value for '" + key + "' is not valid UTF-8"));
    }
    value = text;
  } catch (const json::exception& e) {
    // Valid JSON syntax that cannot be held, such as 1e999: a plain string would hide it.
    throw ConfigError(one_line("--set: value for '" + key + "' is not usable: " +
                               strip_exception_id(e.what())));
  }

  if (j.is_null()) j = json::object();
  // Checked before every step down: operator[] with a key throws json::type_error on an
  // array or a scalar, which would leave here as a crash (found by tests/fuzz/fuzz_config.cpp).
  if (!j.is_object())
    throw ConfigError(one_line("--set: cannot set '" + key + "': the config is not a JSON object (got " +
                               describe(j) + ")"));
  json* node = &j;
  std::string walked;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    walked = walked.empty() ? parts[i] : walked + "." + parts[i];
    json& child = (*node)[parts[i]];
    if (child.is_null()) child = json::object();
    if (!child.is_object())
      throw ConfigError(one_line("--set: cannot set '" + key + "': '" + walked +
                                 "' in the config is not an object (got " + describe(child) + ")"));
    node = &child;
  }
  (*node)[parts.back()] = std::move(value);
}

void require_choice(const std::string& origin, const std::string& key, const std::string& value,
                    const std::vector<std::string>& choices) {
  if (std::find(choices.begin(), choices.end(), value) != choices.end()) return;
  std::string list;
  for (const std::string& c : choices) list += (list.empty() ? "" : ", ") + c;
  throw ConfigError(one_line(origin + ": key '" + key + "' must be one of " + list + ", got " +
                             short_json(json(value))));
}

std::string to_markdown_row(const ConfigKeyInfo& k) {
  return "| `" + k.dotted + "` | " + k.type + " | `" + k.default_json + "` | " + k.range + " | " + k.doc + " |";
}

}  // namespace engine
