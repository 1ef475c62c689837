#include "engine/io/config.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
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

// ---------------------------------------------------------------------------------------
// The keys: one row each, in the order they are read (the first bad key is the one
// reported) and documented (docs/config.md, whose key tables a test checks against
// config_keys()). A row names the key, says how its value is read and checked, and
// where it lives in Config; the reader, the writer (config_to_json, hence the list of
// accepted keys: default_config_json is the schema) and the documentation's type,
// default and range all come from it.

namespace {

struct ConfigKey {
  const char* dotted;
  const char* type;   // as docs/config.md states it
  const char* range;  // likewise ("" when there is nothing to say)
  std::function<void(const Reader&, Config&)> read;
  std::function<json(const Config&)> write;
};

// `field` is a generic lambda [](auto& c) -> auto& { return c.section.key; }: the same
// accessor serves the reader (Config&) and the writer (const Config&).
template <class F>
ConfigKey integer_key(const char* dotted, F field, int64_t lo, int64_t hi, const char* range) {
  return {dotted, "integer", range, [=](const Reader& r, Config& c) { r.integer(dotted, field(c), lo, hi); },
          [=](const Config& c) { return json(field(c)); }};
}

template <class F>
ConfigKey nullable_integer_key(const char* dotted, F field, int64_t lo, const char* range) {
  return {dotted, "integer, nullable", range,
          [=](const Reader& r, Config& c) { r.optional_integer(dotted, field(c), lo, kInt64Max); },
          [=](const Config& c) { return nullable(field(c)); }};
}

// A real with a condition on its value (`holds`), reported as `condition`.
template <class F, class P>
ConfigKey real_key(const char* dotted, F field, P holds, const char* condition, const char* range) {
  return {dotted, "real", range,
          [=](const Reader& r, Config& c) {
            r.real(dotted, field(c));
            r.require(dotted, holds(field(c)), condition);
          },
          [=](const Config& c) { return json(field(c)); }};
}

template <class F>
ConfigKey any_real_key(const char* dotted, F field, const char* range) {
  return {dotted, "real", range, [=](const Reader& r, Config& c) { r.real(dotted, field(c)); },
          [=](const Config& c) { return json(field(c)); }};
}

template <class F>
ConfigKey nonempty_string_key(const char* dotted, F field, const char* range) {
  return {dotted, "string", range, [=](const Reader& r, Config& c) { r.nonempty_string(dotted, field(c)); },
          [=](const Config& c) { return json(field(c)); }};
}

template <class F>
ConfigKey boolean_key(const char* dotted, F field) {
  return {dotted, "boolean", "", [=](const Reader& r, Config& c) { r.boolean(dotted, field(c)); },
          [=](const Config& c) { return json(field(c)); }};
}

template <class Enum, class F>
ConfigKey choice_key(const char* dotted, F field, std::initializer_list<Enum> choices, const char* range) {
  const std::vector<Enum> all(choices);
  return {dotted, "string", range, [=](const Reader& r, Config& c) { r.choice(dotted, field(c), all); },
          [=](const Config& c) { return json(to_string(field(c))); }};
}

#define ENGINE_FIELD(path) [](auto& c) -> auto& { return c.path; }

const std::vector<ConfigKey>& keys() {
  static const std::vector<ConfigKey> table = {
      {"seed", "integer", "0 … 2^63−1",
       [](const Reader& r, Config& c) {
         int64_t seed = 0;
         if (r.integer("seed", seed, 0, kInt64Max)) c.seed = static_cast<uint64_t>(seed);
       },
       [](const Config& c) { return json(c.seed); }},
      {"device", "string", "`auto`, `cpu`, `cuda`, `cuda:N`",
       [](const Reader& r, Config& c) {
         if (r.string("device", c.device) && !valid_device(c.device))
           r.fail("device", "must be one of auto, cpu, cuda, cuda:N (N a device index), got " +
                                short_dump(*r.find("device")));
       },
       [](const Config& c) { return json(c.device); }},

      nonempty_string_key("data.dir", ENGINE_FIELD(data.dir), "non-empty"),
      integer_key("data.batch_size", ENGINE_FIELD(data.batch_size), 1, 65536, "1 … 65536"),
      integer_key("data.val_split", ENGINE_FIELD(data.val_split), 0, INT_MAX,
                  "≥ 0, and less than the number of training images"),
      nullable_integer_key("data.train_limit", ENGINE_FIELD(data.train_limit), 1, "≥ 1"),
      nullable_integer_key("data.test_limit", ENGINE_FIELD(data.test_limit), 1, "≥ 1"),
      any_real_key("data.mean", ENGINE_FIELD(data.mean), "finite"),
      real_key("data.std", ENGINE_FIELD(data.std), [](double v) { return v > 0; }, "must be > 0", "> 0"),

      // The models are a layer above this one: require_choice against model_names().
      nonempty_string_key("model.name", ENGINE_FIELD(model.name), "`fashion_cnn`, `mlp`"),
      real_key("model.dropout", ENGINE_FIELD(model.dropout), [](double v) { return v >= 0 && v < 1; },
               "must be in [0, 1)", "[0, 1)"),

      choice_key("optimizer.name", ENGINE_FIELD(optimizer.name), {OptimizerName::AdamW, OptimizerName::Adam},
                 "`adamw`, `adam`"),
      real_key("optimizer.lr", ENGINE_FIELD(optimizer.lr), [](double v) { return v > 0; }, "must be > 0", "> 0"),
      {"optimizer.betas", "array of 2 reals", "each in [0, 1)",
       [](const Reader& r, Config& c) {
         const json* betas = r.find("optimizer.betas");
         if (!betas) return;
         if (!betas->is_array() || betas->size() != 2)
           r.fail("optimizer.betas", "must be an array of 2 numbers [beta1, beta2], got " + describe(*betas));
         double* targets[2] = {&c.optimizer.beta1, &c.optimizer.beta2};
         for (size_t i = 0; i < 2; ++i) {
           const std::string key = "optimizer.betas[" + std::to_string(i) + "]";
           const double b = r.real_value(key, (*betas)[i]);
           if (!(b >= 0 && b < 1)) r.fail(key, "must be in [0, 1), got " + short_dump((*betas)[i]));
           *targets[i] = b;
         }
       },
       [](const Config& c) { return json::array({c.optimizer.beta1, c.optimizer.beta2}); }},
      real_key("optimizer.eps", ENGINE_FIELD(optimizer.eps), [](double v) { return v > 0; }, "must be > 0", "> 0"),
      real_key("optimizer.weight_decay", ENGINE_FIELD(optimizer.weight_decay), [](double v) { return v >= 0; },
               "must be >= 0", "≥ 0"),

      choice_key("scheduler.name", ENGINE_FIELD(scheduler.name), {SchedulerName::Cosine, SchedulerName::Constant},
                 "`cosine`, `constant`"),
      nullable_integer_key("scheduler.t_max", ENGINE_FIELD(scheduler.t_max), 1, "≥ 1"),
      real_key("scheduler.eta_min", ENGINE_FIELD(scheduler.eta_min), [](double v) { return v >= 0; },
               "must be >= 0", "≥ 0"),

      choice_key("precision.mode", ENGINE_FIELD(precision.mode), {PrecisionMode::Fp32, PrecisionMode::Fp16},
                 "`fp32`, `fp16`"),
      real_key("precision.loss_scale.init", ENGINE_FIELD(precision.loss_scale.init),
               [](double v) { return v > 0; }, "must be > 0", "> 0, finite"),
      real_key("precision.loss_scale.growth_factor", ENGINE_FIELD(precision.loss_scale.growth_factor),
               [](double v) { return v > 1; }, "must be > 1", "> 1"),
      real_key("precision.loss_scale.backoff_factor", ENGINE_FIELD(precision.loss_scale.backoff_factor),
               [](double v) { return v > 0 && v < 1; }, "must be in (0, 1)", "(0, 1)"),
      integer_key("precision.loss_scale.growth_interval", ENGINE_FIELD(precision.loss_scale.growth_interval), 1,
                  kInt64Max, "≥ 1"),

      integer_key("train.epochs", ENGINE_FIELD(train.epochs), 1, kInt64Max, "≥ 1"),
      choice_key("train.early_stopping.monitor", ENGINE_FIELD(train.early_stopping.monitor),
                 {MonitorMetric::ValLoss, MonitorMetric::ValAcc}, "`val_loss`, `val_acc`"),
      integer_key("train.early_stopping.patience", ENGINE_FIELD(train.early_stopping.patience), 0, kInt64Max, "≥ 0"),
      real_key("train.early_stopping.min_delta", ENGINE_FIELD(train.early_stopping.min_delta),
               [](double v) { return v >= 0; }, "must be >= 0", "≥ 0"),

      nonempty_string_key("checkpoint.dir", ENGINE_FIELD(checkpoint.dir), "non-empty"),
      integer_key("checkpoint.keep_last", ENGINE_FIELD(checkpoint.keep_last), 1, kInt64Max, "≥ 1"),
      nullable_integer_key("checkpoint.every_n_epochs", ENGINE_FIELD(checkpoint.every_n_epochs), 1, "≥ 1"),
      nullable_integer_key("checkpoint.every_n_steps", ENGINE_FIELD(checkpoint.every_n_steps), 1, "≥ 1"),
      {"checkpoint.keep_epochs", "array of integers", "each ≥ 1",
       [](const Reader& r, Config& c) {
         const json* keep = r.find("checkpoint.keep_epochs");
         if (!keep) return;
         if (!keep->is_array())
           r.fail("checkpoint.keep_epochs", "must be an array of epoch numbers, got " + describe(*keep));
         c.checkpoint.keep_epochs.clear();
         for (size_t i = 0; i < keep->size(); ++i)
           c.checkpoint.keep_epochs.push_back(
               r.integer_value("checkpoint.keep_epochs[" + std::to_string(i) + "]", (*keep)[i], 1, kInt64Max));
       },
       [](const Config& c) { return json(c.checkpoint.keep_epochs); }},
      boolean_key("checkpoint.verify", ENGINE_FIELD(checkpoint.verify)),
      boolean_key("checkpoint.async", ENGINE_FIELD(checkpoint.async)),
      choice_key("checkpoint.on_error", ENGINE_FIELD(checkpoint.on_error),
                 {SaveErrorPolicy::Stop, SaveErrorPolicy::Continue}, "`stop`, `continue`"),

      boolean_key("logging.tensorboard", ENGINE_FIELD(logging.tensorboard)),

      boolean_key("cuda.deterministic", ENGINE_FIELD(cuda.deterministic)),
      boolean_key("cuda.batch_chunks", ENGINE_FIELD(cuda.batch_chunks)),

      choice_key("dist.backend", ENGINE_FIELD(dist.backend), {DistBackend::Auto, DistBackend::Mpi, DistBackend::Nccl},
                 "`auto`, `mpi`, `nccl`"),
      real_key("dist.timeout_s", ENGINE_FIELD(dist.timeout_s), [](double v) { return v > 0; }, "must be > 0", "> 0"),
      {"dist.chunks", "integer", "a power of two, 1 … 1024",
       [](const Reader& r, Config& c) {
         r.integer("dist.chunks", c.dist.chunks, 1, kMaxTreeChunks);
         r.require("dist.chunks", (c.dist.chunks & (c.dist.chunks - 1)) == 0, "must be a power of two");
       },
       [](const Config& c) { return json(c.dist.chunks); }},
  };
  return table;
}

#undef ENGINE_FIELD

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

}  // namespace

Config config_from_json(const json& j, const std::string& origin) {
  const Reader r(j, origin);
  if (!j.is_object()) r.fail("config must be a JSON object, got " + describe(j));
  r.check_structure(j, default_config_json(), "");
  Config c;
  for (const ConfigKey& k : keys()) k.read(r, c);
  return c;
}

std::vector<ConfigKeyInfo> config_keys() {
  const Config defaults;
  std::vector<ConfigKeyInfo> out;
  for (const ConfigKey& k : keys()) out.push_back({k.dotted, k.type, k.range, k.write(defaults).dump()});
  return out;
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
  json j = json::object();
  for (const ConfigKey& k : keys()) set_dotted(j, k.dotted, k.write(c));
  return j;
}

json default_config_json() { return config_to_json(Config{}); }

}  // namespace engine
