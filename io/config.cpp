#include "engine/config.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

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

const std::vector<std::string>& all_schema_paths() {
  static const std::vector<std::string> paths = [] {
    std::vector<std::string> p;
    collect_paths(default_config_json(), "", p);
    return p;
  }();
  return paths;
}

bool is_schema_path(const std::string& dotted) {
  const auto& paths = all_schema_paths();
  return std::find(paths.begin(), paths.end(), dotted) != paths.end();
}

// The closest valid key to `dotted` (whose last component is the unknown name, placed under
// `parent`), or "" when nothing is close. Two ways to be close: the whole dotted path is a
// near miss ("optimizer.lrr", "trian.epochs"), or the last component is a near miss of some
// key anywhere ("lr" written at the top level instead of under "optimizer"). On a tie a key
// under the same parent wins, since that is where the user was writing.
std::string closest_key(const std::string& dotted, const std::string& parent) {
  const std::string name = leaf_of(dotted);
  std::string best;
  size_t best_score = std::numeric_limits<size_t>::max();
  bool best_is_sibling = false;
  for (const auto& path : all_schema_paths()) {
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
                                const std::string& level_name) {
  std::string msg = "unknown key '" + dotted + "'";
  const std::string suggestion = closest_key(dotted, parent_of(dotted));
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

// ---------------------------------------------------------------------------------------
// Reading validated values out of the user's JSON

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

enum class Nullable { No, Yes };

class Reader {
 public:
  Reader(const json& root, std::string origin) : root_(root), origin_(std::move(origin)) {}

  [[noreturn]] void fail(const std::string& message) const {
    throw ConfigError(one_line(origin_ + ": " + message));
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    fail("key '" + key + "' " + what);
  }

  // Walks the user's JSON against the schema: unknown keys and sections that are not
  // objects are rejected here, so the typed readers below only see known keys.
  void check_structure(const json& node, const json& schema, const std::string& prefix) const {
    for (const auto& [key, value] : node.items()) {
      const std::string dotted = prefix.empty() ? key : prefix + "." + key;
      const auto it = schema.find(key);
      if (it == schema.end()) {
        // A literal "optimizer.lr" key: files nest their keys, only --set uses dots.
        const auto dot = key.find('.');
        if (dot != std::string::npos && is_schema_path(dotted))
          fail("unknown key '" + dotted + "' (config files nest keys: write \"" +
               key.substr(0, dot) + "\": {\"" + key.substr(dot + 1) + "\": ...})");
        fail(unknown_key_message(dotted, schema, prefix));
      }
      if (it->is_object()) {
        if (!value.is_object()) fail(dotted, "must be an object, got " + describe(value));
        check_structure(value, *it, dotted);
      }
    }
  }

  // The value at a dotted key, or nullptr when the user left it out.
  const json* find(const std::string& dotted) const {
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

  // Integer keys require JSON integers: 3.0 is rejected rather than silently truncated.
  bool integer(const std::string& key, int64_t& out, int64_t lo, int64_t hi) const {
    const json* v = find(key);
    if (!v) return false;
    out = integer_value(key, *v, lo, hi);
    return true;
  }

  bool integer(const std::string& key, int& out, int lo, int hi) const {
    int64_t wide = out;
    const bool present = integer(key, wide, lo, hi);
    out = static_cast<int>(wide);
    return present;
  }

  bool optional_integer(const std::string& key, std::optional<int64_t>& out, int64_t lo,
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

  int64_t integer_value(const std::string& key, const json& v, int64_t lo, int64_t hi,
                        Nullable nullable = Nullable::No) const {
    if (!v.is_number_integer())
      fail(key, std::string("must be an integer") + (nullable == Nullable::Yes ? " or null" : "") +
                    ", got " + describe(v));
    // Values beyond int64 arrive as unsigned; they are out of every range we accept.
    const bool too_big =
        v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX);
    const int64_t x = too_big ? INT64_MAX : v.get<int64_t>();
    if (too_big || x < lo || x > hi) {
      // An upper bound that is only the type's limit is worth mentioning only when it was hit.
      const bool type_limit = hi == kInt64Max || hi == INT_MAX;
      const std::string range =
          (type_limit && !too_big && x < lo)
              ? "must be >= " + std::to_string(lo)
              : "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
      fail(key, range + ", got " + short_dump(v));
    }
    return x;
  }

  // Real keys accept JSON integers and floats; non-finite values are never meaningful here.
  bool real(const std::string& key, double& out) const {
    const json* v = find(key);
    if (!v) return false;
    out = real_value(key, *v);
    return true;
  }

  double real_value(const std::string& key, const json& v) const {
    if (!v.is_number()) fail(key, "must be a number, got " + describe(v));
    const double x = v.get<double>();
    if (!std::isfinite(x)) fail(key, "must be a finite number, got " + short_dump(v));
    return x;
  }

  // Range checks run on the parsed value; defaults always pass, so a failure means the
  // user's value, which is quoted as written.
  void require(const std::string& key, bool ok, const std::string& condition) const {
    if (ok) return;
    const json* v = find(key);
    fail(key, condition + ", got " + (v ? short_dump(*v) : std::string("the default")));
  }

  bool string(const std::string& key, std::string& out) const {
    const json* v = find(key);
    if (!v) return false;
    if (!v->is_string()) fail(key, "must be a string, got " + describe(*v));
    out = v->get<std::string>();
    return true;
  }

  bool nonempty_string(const std::string& key, std::string& out) const {
    if (!string(key, out)) return false;
    if (out.empty()) fail(key, "must be a non-empty string");
    return true;
  }

  // A fixed choice: the string as written in JSON, turned into its enum here, so
  // nothing past the config compares strings.
  template <typename Enum>
  bool choice(const std::string& key, Enum& out, std::initializer_list<Enum> choices) const {
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
    fail(key, "must be one of " + names + ", got " + short_dump(*find(key)));
  }

  bool boolean(const std::string& key, bool& out) const {
    const json* v = find(key);
    if (!v) return false;
    if (!v->is_boolean()) fail(key, "must be a boolean (true or false), got " + describe(*v));
    out = v->get<bool>();
    return true;
  }

 private:
  const json& root_;
  std::string origin_;
};

// "auto", "cpu", "cuda", or "cuda:N" with N a decimal device index.
bool valid_device(const std::string& d) {
  if (d == "auto" || d == "cpu" || d == "cuda") return true;
  const std::string prefix = "cuda:";
  if (d.compare(0, prefix.size(), prefix) != 0) return false;
  const std::string index = d.substr(prefix.size());
  // Nine digits always fit in an int, which is what device indices are.
  if (index.empty() || index.size() > 9) return false;
  return std::all_of(index.begin(), index.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

json nullable(const std::optional<int64_t>& v) { return v ? json(*v) : json(nullptr); }

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

// ---------------------------------------------------------------------------------------

const char* to_string(OptimizerName v) { return v == OptimizerName::AdamW ? "adamw" : "adam"; }
const char* to_string(SchedulerName v) { return v == SchedulerName::Cosine ? "cosine" : "constant"; }
const char* to_string(PrecisionMode v) { return v == PrecisionMode::Fp32 ? "fp32" : "fp16"; }
const char* to_string(MonitorMetric v) { return v == MonitorMetric::ValLoss ? "val_loss" : "val_acc"; }
const char* to_string(SaveErrorPolicy v) { return v == SaveErrorPolicy::Stop ? "stop" : "continue"; }
const char* to_string(DistBackend v) {
  switch (v) {
    case DistBackend::Auto: return "auto";
    case DistBackend::Mpi: return "mpi";
    case DistBackend::Nccl: return "nccl";
  }
  return "auto";
}

Config config_from_json(const json& j, const std::string& origin) {
  const Reader r(j, origin);
  if (!j.is_object()) r.fail("config must be a JSON object, got " + describe(j));
  r.check_structure(j, default_config_json(), "");

  Config c;
  int64_t seed = 0;
  if (r.integer("seed", seed, 0, kInt64Max)) c.seed = static_cast<uint64_t>(seed);
  if (r.string("device", c.device) && !valid_device(c.device))
    r.fail("device", "must be one of auto, cpu, cuda, cuda:N (N a device index), got " +
                         short_dump(*r.find("device")));

  DataConfig& d = c.data;
  r.nonempty_string("data.dir", d.dir);
  r.integer("data.batch_size", d.batch_size, 1, 65536);
  r.integer("data.val_split", d.val_split, 0, INT_MAX);
  r.optional_integer("data.train_limit", d.train_limit, 1, kInt64Max);
  r.optional_integer("data.test_limit", d.test_limit, 1, kInt64Max);
  r.real("data.mean", d.mean);
  r.real("data.std", d.std);
  r.require("data.std", d.std > 0, "must be > 0");

  // The models are a layer above this one: require_choice against model_names().
  r.nonempty_string("model.name", c.model.name);
  r.real("model.dropout", c.model.dropout);
  r.require("model.dropout", c.model.dropout >= 0 && c.model.dropout < 1, "must be in [0, 1)");

  OptimizerConfig& o = c.optimizer;
  r.choice("optimizer.name", o.name, {OptimizerName::AdamW, OptimizerName::Adam});
  r.real("optimizer.lr", o.lr);
  r.require("optimizer.lr", o.lr > 0, "must be > 0");
  if (const json* betas = r.find("optimizer.betas")) {
    if (!betas->is_array() || betas->size() != 2)
      r.fail("optimizer.betas", "must be an array of 2 numbers [beta1, beta2], got " +
                                    describe(*betas));
    double* targets[2] = {&o.beta1, &o.beta2};
    for (size_t i = 0; i < 2; ++i) {
      const std::string key = "optimizer.betas[" + std::to_string(i) + "]";
      const double b = r.real_value(key, (*betas)[i]);
      if (!(b >= 0 && b < 1)) r.fail(key, "must be in [0, 1), got " + short_dump((*betas)[i]));
      *targets[i] = b;
    }
  }
  r.real("optimizer.eps", o.eps);
  r.require("optimizer.eps", o.eps > 0, "must be > 0");
  r.real("optimizer.weight_decay", o.weight_decay);
  r.require("optimizer.weight_decay", o.weight_decay >= 0, "must be >= 0");

  SchedulerConfig& s = c.scheduler;
  r.choice("scheduler.name", s.name, {SchedulerName::Cosine, SchedulerName::Constant});
  r.optional_integer("scheduler.t_max", s.t_max, 1, kInt64Max);
  r.real("scheduler.eta_min", s.eta_min);
  r.require("scheduler.eta_min", s.eta_min >= 0, "must be >= 0");

  PrecisionConfig& p = c.precision;
  r.choice("precision.mode", p.mode, {PrecisionMode::Fp32, PrecisionMode::Fp16});
  LossScaleConfig& ls = p.loss_scale;
  r.real("precision.loss_scale.init", ls.init);
  r.require("precision.loss_scale.init", ls.init > 0, "must be > 0");
  r.real("precision.loss_scale.growth_factor", ls.growth_factor);
  r.require("precision.loss_scale.growth_factor", ls.growth_factor > 1, "must be > 1");
  r.real("precision.loss_scale.backoff_factor", ls.backoff_factor);
  r.require("precision.loss_scale.backoff_factor", ls.backoff_factor > 0 && ls.backoff_factor < 1,
            "must be in (0, 1)");
  r.integer("precision.loss_scale.growth_interval", ls.growth_interval, 1, kInt64Max);

  TrainConfig& t = c.train;
  r.integer("train.epochs", t.epochs, 1, kInt64Max);
  r.choice("train.early_stopping.monitor", t.early_stopping.monitor,
           {MonitorMetric::ValLoss, MonitorMetric::ValAcc});
  r.integer("train.early_stopping.patience", t.early_stopping.patience, 0, kInt64Max);
  r.real("train.early_stopping.min_delta", t.early_stopping.min_delta);
  r.require("train.early_stopping.min_delta", t.early_stopping.min_delta >= 0, "must be >= 0");

  CheckpointConfig& ck = c.checkpoint;
  r.nonempty_string("checkpoint.dir", ck.dir);
  r.integer("checkpoint.keep_last", ck.keep_last, 1, kInt64Max);
  r.optional_integer("checkpoint.every_n_epochs", ck.every_n_epochs, 1, kInt64Max);
  r.optional_integer("checkpoint.every_n_steps", ck.every_n_steps, 1, kInt64Max);
  if (const json* keep = r.find("checkpoint.keep_epochs")) {
    if (!keep->is_array())
      r.fail("checkpoint.keep_epochs", "must be an array of epoch numbers, got " + describe(*keep));
    ck.keep_epochs.clear();
    for (size_t i = 0; i < keep->size(); ++i)
      ck.keep_epochs.push_back(r.integer_value("checkpoint.keep_epochs[" + std::to_string(i) + "]",
                                               (*keep)[i], 1, kInt64Max));
  }
  r.boolean("checkpoint.verify", ck.verify);
  r.boolean("checkpoint.async", ck.async);
  r.choice("checkpoint.on_error", ck.on_error, {SaveErrorPolicy::Stop, SaveErrorPolicy::Continue});

  r.boolean("logging.tensorboard", c.logging.tensorboard);

  r.boolean("cuda.deterministic", c.cuda.deterministic);
  r.boolean("cuda.batch_chunks", c.cuda.batch_chunks);

  r.choice("dist.backend", c.dist.backend, {DistBackend::Auto, DistBackend::Mpi, DistBackend::Nccl});
  r.real("dist.timeout_s", c.dist.timeout_s);
  r.require("dist.timeout_s", c.dist.timeout_s > 0, "must be > 0");
  return c;
}

Config load_config(const std::string& path) {
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
  return config_from_json(j, path);
}

void apply_override(json& j, const std::string& assignment) {
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
  const json schema = default_config_json();
  const json* level = &schema;
  std::string level_name;
  for (const auto& part : parts) {
    if (!level->is_object() || level->find(part) == level->end())
      throw ConfigError(one_line("--set: " + unknown_key_message(key, *level, level_name)));
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
    // stored as JSON in every checkpoint (found by tests/fuzz/fuzz_config).
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
  // array or a scalar, which would leave here as a crash (found by tests/fuzz/fuzz_config).
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
                             short_dump(json(value))));
}

json config_to_json(const Config& c) {
  json j;
  j["seed"] = c.seed;
  j["device"] = c.device;
  j["data"] = {
      {"dir", c.data.dir},
      {"batch_size", c.data.batch_size},
      {"val_split", c.data.val_split},
      {"train_limit", nullable(c.data.train_limit)},
      {"test_limit", nullable(c.data.test_limit)},
      {"mean", c.data.mean},
      {"std", c.data.std},
  };
  j["model"] = {{"name", c.model.name}, {"dropout", c.model.dropout}};
  j["optimizer"] = {
      {"name", to_string(c.optimizer.name)},
      {"lr", c.optimizer.lr},
      {"betas", json::array({c.optimizer.beta1, c.optimizer.beta2})},
      {"eps", c.optimizer.eps},
      {"weight_decay", c.optimizer.weight_decay},
  };
  j["scheduler"] = {
      {"name", to_string(c.scheduler.name)},
      {"t_max", nullable(c.scheduler.t_max)},
      {"eta_min", c.scheduler.eta_min},
  };
  const LossScaleConfig& ls = c.precision.loss_scale;
  j["precision"] = {
      {"mode", to_string(c.precision.mode)},
      {"loss_scale",
       {
           {"init", ls.init},
           {"growth_factor", ls.growth_factor},
           {"backoff_factor", ls.backoff_factor},
           {"growth_interval", ls.growth_interval},
       }},
  };
  j["train"] = {
      {"epochs", c.train.epochs},
      {"early_stopping",
       {
           {"monitor", to_string(c.train.early_stopping.monitor)},
           {"patience", c.train.early_stopping.patience},
           {"min_delta", c.train.early_stopping.min_delta},
       }},
  };
  j["checkpoint"] = {
      {"dir", c.checkpoint.dir},
      {"keep_last", c.checkpoint.keep_last},
      {"every_n_epochs", nullable(c.checkpoint.every_n_epochs)},
      {"every_n_steps", nullable(c.checkpoint.every_n_steps)},
      {"keep_epochs", json(c.checkpoint.keep_epochs)},
      {"verify", c.checkpoint.verify},
      {"async", c.checkpoint.async},
      {"on_error", to_string(c.checkpoint.on_error)},
  };
  j["logging"] = {{"tensorboard", c.logging.tensorboard}};
  j["cuda"] = {{"deterministic", c.cuda.deterministic}, {"batch_chunks", c.cuda.batch_chunks}};
  j["dist"] = {{"backend", to_string(c.dist.backend)}, {"timeout_s", c.dist.timeout_s}};
  return j;
}

json default_config_json() { return config_to_json(Config{}); }

}  // namespace engine
