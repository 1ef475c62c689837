#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "engine/train/config.h"
#include "engine/nn/models/registry.h"
#include "io/config_keys.h"
#include "scratch_dir.h"

using engine::Config;
using engine::ConfigError;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// CTest sets ENGINE_SOURCE_DIR; run by hand, the test looks upwards from the working directory.
fs::path source_dir() { return test_util::source_dir(); }

fs::path temp_dir() { return test_util::scratch_root("test_config"); }

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The message of the ConfigError that f throws, or a marker that none was thrown.
template <typename F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError thrown>";
}

std::string parse_error(const json& j) {
  return config_error([&] { engine::config_from_json(j, "configs/x.json"); });
}

// Builds {..} with one dotted key set (the value is JSON text), then parses it.
std::string error_for(const std::string& key, const std::string& value) {
  json j = json::object();
  engine::apply_override(j, key + "=" + value);
  return parse_error(j);
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Field by field, doubles compared bit for bit.
void check_same(const Config& a, const Config& b) {
  CHECK(a.seed == b.seed);
  CHECK(a.device == b.device);
  CHECK(a.data.dir == b.data.dir);
  CHECK(a.data.batch_size == b.data.batch_size);
  CHECK(a.data.val_split == b.data.val_split);
  CHECK(a.data.train_limit == b.data.train_limit);
  CHECK(a.data.test_limit == b.data.test_limit);
  CHECK(same_bits(a.data.mean, b.data.mean));
  CHECK(same_bits(a.data.std, b.data.std));
  CHECK(a.model.name == b.model.name);
  CHECK(same_bits(a.model.dropout, b.model.dropout));
  CHECK(a.optimizer.name == b.optimizer.name);
  CHECK(same_bits(a.optimizer.lr, b.optimizer.lr));
  CHECK(same_bits(a.optimizer.beta1, b.optimizer.beta1));
  CHECK(same_bits(a.optimizer.beta2, b.optimizer.beta2));
  CHECK(same_bits(a.optimizer.eps, b.optimizer.eps));
  CHECK(same_bits(a.optimizer.weight_decay, b.optimizer.weight_decay));
  CHECK(a.scheduler.name == b.scheduler.name);
  CHECK(a.scheduler.t_max == b.scheduler.t_max);
  CHECK(same_bits(a.scheduler.eta_min, b.scheduler.eta_min));
  CHECK(a.precision.mode == b.precision.mode);
  CHECK(same_bits(a.precision.loss_scale.init, b.precision.loss_scale.init));
  CHECK(same_bits(a.precision.loss_scale.growth_factor, b.precision.loss_scale.growth_factor));
  CHECK(same_bits(a.precision.loss_scale.backoff_factor, b.precision.loss_scale.backoff_factor));
  CHECK(a.precision.loss_scale.growth_interval == b.precision.loss_scale.growth_interval);
  CHECK(a.train.epochs == b.train.epochs);
  CHECK(a.train.early_stopping.monitor == b.train.early_stopping.monitor);
  CHECK(a.train.early_stopping.patience == b.train.early_stopping.patience);
  CHECK(same_bits(a.train.early_stopping.min_delta, b.train.early_stopping.min_delta));
  CHECK(a.checkpoint.dir == b.checkpoint.dir);
  CHECK(a.checkpoint.keep_last == b.checkpoint.keep_last);
  CHECK(a.checkpoint.every_n_epochs == b.checkpoint.every_n_epochs);
  CHECK(a.checkpoint.every_n_steps == b.checkpoint.every_n_steps);
  CHECK(a.checkpoint.keep_epochs == b.checkpoint.keep_epochs);
  CHECK(a.checkpoint.verify == b.checkpoint.verify);
  CHECK(a.checkpoint.on_error == b.checkpoint.on_error);
  CHECK(a.cuda.deterministic == b.cuda.deterministic);
  CHECK(a.cuda.batch_chunks == b.cuda.batch_chunks);
  CHECK(a.dist.backend == b.dist.backend);
  CHECK(same_bits(a.dist.timeout_s, b.dist.timeout_s));
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

}  // namespace

TEST_CASE("the shipped configs/mnist.json parses to the defaults and lists every key") {
  const fs::path path = source_dir() / "configs" / "mnist.json";
  INFO("config file: " << path.string());
  REQUIRE(fs::exists(path));
  check_same(engine::load_config(path.string()), Config{});

  std::ifstream in(path);
  const json raw = json::parse(in);
  // Same keys and the same values as the schema: nothing missing, nothing extra.
  CHECK(raw == engine::default_config_json());
}

TEST_CASE("defaults") {
  const Config c = engine::config_from_json(json::object(), "x");
  check_same(c, Config{});
  CHECK(c.data.batch_size == 128);
  CHECK(c.optimizer.beta2 == 0.999);
  CHECK(c.checkpoint.every_n_epochs == 5);
  CHECK(c.checkpoint.on_error == engine::SaveErrorPolicy::Stop);
  CHECK_FALSE(c.scheduler.t_max.has_value());
  CHECK(c.effective_t_max() == 15);

  // A partial section keeps the defaults of the keys it leaves out.
  const Config partial = engine::config_from_json(json::parse(R"({"optimizer": {"lr": 0.5}})"), "x");
  CHECK(partial.optimizer.lr == 0.5);
  CHECK(partial.optimizer.name == engine::OptimizerName::AdamW);
  CHECK(partial.optimizer.weight_decay == 0.01);
}

TEST_CASE("fixed choices: the JSON strings become enums and go back as the same strings") {
  const Config c = engine::config_from_json(
      json::parse(R"({"optimizer": {"name": "adam"}, "scheduler": {"name": "constant"},
                      "precision": {"mode": "fp16"}, "train": {"early_stopping": {"monitor": "val_acc"}},
                      "checkpoint": {"on_error": "continue"}})"),
      "x");
  CHECK(c.optimizer.name == engine::OptimizerName::Adam);
  CHECK(c.scheduler.name == engine::SchedulerName::Constant);
  CHECK(c.precision.mode == engine::Precision::Fp16);
  CHECK(c.train.early_stopping.monitor == engine::MonitorMetric::ValAcc);
  CHECK(c.checkpoint.on_error == engine::SaveErrorPolicy::Continue);
  const json j = engine::config_to_json(c);
  CHECK(j["optimizer"]["name"] == "adam");
  CHECK(j["scheduler"]["name"] == "constant");
  CHECK(j["precision"]["mode"] == "fp16");
  CHECK(j["train"]["early_stopping"]["monitor"] == "val_acc");
  CHECK(j["checkpoint"]["on_error"] == "continue");
  const json d = engine::default_config_json();
  CHECK(d["optimizer"]["name"] == "adamw");
  CHECK(d["scheduler"]["name"] == "cosine");
  CHECK(d["precision"]["mode"] == "fp32");
  CHECK(d["train"]["early_stopping"]["monitor"] == "val_loss");
  CHECK(d["checkpoint"]["on_error"] == "stop");
}

TEST_CASE("precision.mode bf16: parsed from JSON and --set, written back as \"bf16\", round-trips") {
  const Config c = engine::config_from_json(json::parse(R"({"precision": {"mode": "bf16"}})"), "x");
  CHECK(c.precision.mode == engine::Precision::Bf16);
  CHECK(std::string(engine::to_string(c.precision.mode)) == "bf16");
  const json j = engine::config_to_json(c);
  CHECK(j["precision"]["mode"] == "bf16");
  check_same(engine::config_from_json(j, "x"), c);
  check_same(engine::config_from_json(json::parse(j.dump()), "x"), c);

  json set = json::object();
  engine::apply_override(set, "precision.mode=bf16");
  CHECK(engine::config_from_json(set, "x").precision.mode == engine::Precision::Bf16);
  // The mode names are case-sensitive, as every fixed choice.
  CHECK(error_for("precision.mode", "\"BF16\"") ==
        "configs/x.json: key 'precision.mode' must be one of fp32, fp16, bf16, got \"BF16\"");
}

TEST_CASE("config_to_json emits every key, null for unset optionals") {
  const json j = engine::config_to_json(Config{});
  CHECK(j["data"]["train_limit"].is_null());
  CHECK(j["data"]["test_limit"].is_null());
  CHECK(j["scheduler"]["t_max"].is_null());
  CHECK(j["checkpoint"]["every_n_steps"].is_null());
  CHECK(j["checkpoint"]["every_n_epochs"] == 5);
  CHECK(j["optimizer"]["betas"] == json::array({0.9, 0.999}));
  CHECK(j["checkpoint"]["keep_epochs"] == json::array());
  CHECK(j["precision"]["loss_scale"]["growth_interval"] == 2000);
  CHECK(j["cuda"]["deterministic"] == true);
  CHECK(j["cuda"]["batch_chunks"] == false);
  CHECK(j["dist"]["backend"] == "auto");
  CHECK(j["dist"]["timeout_s"] == 300.0);
  CHECK(j == engine::default_config_json());
}

TEST_CASE("round trip through JSON is exact") {
  Config c;
  c.seed = std::numeric_limits<int64_t>::max();
  c.device = "cuda:1";
  c.data.dir = "/data/fm";
  c.data.batch_size = 65536;
  c.data.val_split = 0;
  c.data.train_limit = 1000;
  c.data.test_limit = 1;
  c.data.mean = 0.1 + 0.2;  // not the double nearest 0.3
  c.data.std = 1.0 / 3.0;
  c.model.dropout = 0.0;
  c.optimizer.name = engine::OptimizerName::Adam;
  c.optimizer.lr = std::nextafter(1e-3, 1.0);
  c.optimizer.beta1 = 0.0;
  c.optimizer.beta2 = std::nextafter(1.0, 0.0);
  c.optimizer.eps = 5e-324;  // smallest subnormal
  c.optimizer.weight_decay = 1.7976931348623157e308;
  c.scheduler.name = engine::SchedulerName::Constant;
  c.scheduler.t_max = 7;
  c.scheduler.eta_min = 1e-7;
  c.precision.mode = engine::Precision::Fp16;
  c.precision.loss_scale.init = 3.0;
  c.precision.loss_scale.growth_factor = 1.0000000000000002;
  c.precision.loss_scale.backoff_factor = 0.125;
  c.precision.loss_scale.growth_interval = 1;
  c.train.epochs = 1;
  c.train.early_stopping.monitor = engine::MonitorMetric::ValAcc;
  c.train.early_stopping.patience = 0;
  c.train.early_stopping.min_delta = 0.0;
  c.checkpoint.dir = "runs/x y";
  c.checkpoint.keep_last = 1;
  c.checkpoint.every_n_epochs.reset();
  c.checkpoint.every_n_steps = 250;
  c.checkpoint.keep_epochs = {3, 7, 10};
  c.checkpoint.verify = false;
  c.checkpoint.on_error = engine::SaveErrorPolicy::Continue;
  c.cuda.deterministic = false;
  c.cuda.batch_chunks = true;
  c.dist.backend = engine::DistBackend::Nccl;
  c.dist.timeout_s = 12.5;

  SUBCASE("in memory") { check_same(engine::config_from_json(engine::config_to_json(c), "x"), c); }
  SUBCASE("through text") {
    const std::string text = engine::config_to_json(c).dump(2);
    check_same(engine::config_from_json(json::parse(text), "x"), c);
  }
  SUBCASE("through a file") {
    const fs::path path = temp_dir() / "roundtrip.json";
    write_file(path, engine::config_to_json(c).dump());
    check_same(engine::load_config(path.string()), c);
  }
}

TEST_CASE("unknown keys name the closest valid key") {
  SUBCASE("typo inside a section") {
    CHECK(parse_error(json::parse(R"({"optimizer": {"lrr": 0.1}})")) ==
          "configs/x.json: unknown key 'optimizer.lrr' (did you mean 'optimizer.lr'?)");
  }
  SUBCASE("typo of a nested key") {
    const std::string msg = parse_error(json::parse(R"({"train": {"epoch": 3}})"));
    CHECK(msg == "configs/x.json: unknown key 'train.epoch' (did you mean 'train.epochs'?)");
  }
  SUBCASE("key placed at the wrong level") {
    const std::string msg = parse_error(json::parse(R"({"lr": 0.1})"));
    CHECK(msg == "configs/x.json: unknown key 'lr' (did you mean 'optimizer.lr'?)");
    const std::string msg2 = parse_error(json::parse(R"({"data": {"epochs": 3}})"));
    CHECK(msg2 == "configs/x.json: unknown key 'data.epochs' (did you mean 'train.epochs'?)");
  }
  SUBCASE("misspelled section") {
    const std::string msg = parse_error(json::parse(R"({"optimiser": {"lr": 0.1}})"));
    CHECK(msg == "configs/x.json: unknown key 'optimiser' (did you mean 'optimizer'?)");
  }
  SUBCASE("deep key") {
    const std::string msg =
        parse_error(json::parse(R"({"precision": {"loss_scale": {"growth_intervall": 5}}})"));
    CHECK(msg == "configs/x.json: unknown key 'precision.loss_scale.growth_intervall' (did you "
                 "mean 'precision.loss_scale.growth_interval'?)");
  }
  SUBCASE("nothing close lists the valid keys") {
    const std::string msg = parse_error(json::parse(R"({"checkpoint": {"qqqqqqqq": 1}})"));
    INFO(msg);
    CHECK(contains(msg, "unknown key 'checkpoint.qqqqqqqq'"));
    CHECK(contains(msg, "valid keys in 'checkpoint'"));
    CHECK(contains(msg, "keep_last"));
  }
  SUBCASE("dotted key written literally in a file") {
    const std::string msg = parse_error(json::parse(R"({"optimizer.lr": 0.1})"));
    INFO(msg);
    CHECK(contains(msg, "unknown key 'optimizer.lr'"));
    CHECK(contains(msg, "nest"));
  }
}

TEST_CASE("type errors name the key and what was found") {
  CHECK(error_for("data.batch_size", "\"12\"") ==
        "configs/x.json: key 'data.batch_size' must be an integer, got string \"12\"");
  CHECK(error_for("data.batch_size", "3.0") ==
        "configs/x.json: key 'data.batch_size' must be an integer, got number 3.0");
  CHECK(error_for("train.epochs", "2.5") ==
        "configs/x.json: key 'train.epochs' must be an integer, got number 2.5");
  CHECK(error_for("seed", "true") == "configs/x.json: key 'seed' must be an integer, got boolean true");
  CHECK(error_for("optimizer.lr", "\"fast\"") ==
        "configs/x.json: key 'optimizer.lr' must be a number, got string \"fast\"");
  CHECK(error_for("optimizer.lr", "null") ==
        "configs/x.json: key 'optimizer.lr' must be a number, got null");
  CHECK(error_for("checkpoint.verify", "1") ==
        "configs/x.json: key 'checkpoint.verify' must be a boolean (true or false), got number 1");
  CHECK(error_for("cuda.deterministic", "\"true\"") ==
        "configs/x.json: key 'cuda.deterministic' must be a boolean (true or false), got string \"true\"");
  CHECK(error_for("model.name", "3") == "configs/x.json: key 'model.name' must be a string, got number 3");
  CHECK(error_for("data.dir", "\"\"") == "configs/x.json: key 'data.dir' must be a non-empty string");
  CHECK(contains(error_for("data.train_limit", "\"all\""),
                 "key 'data.train_limit' must be an integer or null, got string \"all\""));
  CHECK(parse_error(json::parse(R"({"data": 5})")) ==
        "configs/x.json: key 'data' must be an object, got number 5");
  CHECK(parse_error(json::parse(R"([1, 2])")) ==
        "configs/x.json: config must be a JSON object, got array [1,2]");
}

TEST_CASE("reals accept JSON integers") {
  json j = json::object();
  engine::apply_override(j, "optimizer.lr=1");
  engine::apply_override(j, "scheduler.eta_min=0");
  const Config c = engine::config_from_json(j, "x");
  CHECK(c.optimizer.lr == 1.0);
  CHECK(c.scheduler.eta_min == 0.0);
}

TEST_CASE("range errors name the key and the offending value") {
  CHECK(error_for("optimizer.lr", "-0.001") == "configs/x.json: key 'optimizer.lr' must be > 0, got -0.001");

  struct Case {
    const char* key;
    const char* value;
    const char* expected;
  };
  const Case cases[] = {
      {"seed", "-1", "must be >= 0, got -1"},
      {"seed", "9223372036854775808", "must be in [0, 9223372036854775807], got 9223372036854775808"},
      {"device", "\"gpu\"", "must be one of auto, cpu, cuda, cuda:N"},
      {"device", "\"cuda:\"", "got \"cuda:\""},
      {"device", "\"cuda:x\"", "got \"cuda:x\""},
      {"device", "\"CPU\"", "got \"CPU\""},
      {"data.batch_size", "0", "must be in [1, 65536], got 0"},
      {"data.batch_size", "65537", "must be in [1, 65536], got 65537"},
      {"data.val_split", "-1", "must be >= 0, got -1"},
      {"data.val_split", "4294967296", "must be in [0, 2147483647], got 4294967296"},
      {"data.train_limit", "0", "must be >= 1, got 0"},
      {"data.test_limit", "-5", "must be >= 1, got -5"},
      {"data.std", "0", "must be > 0, got 0"},
      {"data.std", "-0.5", "must be > 0, got -0.5"},
      {"model.dropout", "1", "must be in [0, 1), got 1"},
      {"model.dropout", "-0.1", "must be in [0, 1), got -0.1"},
      {"optimizer.name", "\"sgd\"", "must be one of adamw, adam, got \"sgd\""},
      {"optimizer.lr", "0", "must be > 0, got 0"},
      {"optimizer.betas", "[0.9]", "must be an array of 2 numbers [beta1, beta2], got array [0.9]"},
      {"optimizer.betas", "0.9", "must be an array of 2 numbers"},
      {"optimizer.betas", "[0.9, 1.0]", "key 'optimizer.betas[1]' must be in [0, 1), got 1.0"},
      {"optimizer.betas", "[-0.1, 0.9]", "key 'optimizer.betas[0]' must be in [0, 1), got -0.1"},
      {"optimizer.betas", "[0.9, \"a\"]", "key 'optimizer.betas[1]' must be a number"},
      {"optimizer.eps", "0", "must be > 0, got 0"},
      {"optimizer.weight_decay", "-1e-05", "must be >= 0, got -1e-05"},
      {"scheduler.name", "\"step\"", "must be one of cosine, constant, got \"step\""},
      {"scheduler.t_max", "0", "must be >= 1, got 0"},
      {"scheduler.eta_min", "-1", "must be >= 0, got -1"},
      {"precision.mode", "\"fp8\"", "must be one of fp32, fp16, bf16, got \"fp8\""},
      {"precision.loss_scale.init", "0", "must be > 0, got 0"},
      {"precision.loss_scale.growth_factor", "1", "must be > 1, got 1"},
      {"precision.loss_scale.backoff_factor", "1", "must be in (0, 1), got 1"},
      {"precision.loss_scale.backoff_factor", "0", "must be in (0, 1), got 0"},
      {"precision.loss_scale.growth_interval", "0", "must be >= 1, got 0"},
      {"train.epochs", "0", "must be >= 1, got 0"},
      {"train.early_stopping.monitor", "\"loss\"", "must be one of val_loss, val_acc, got \"loss\""},
      {"train.early_stopping.patience", "-1", "must be >= 0, got -1"},
      {"train.early_stopping.min_delta", "-0.1", "must be >= 0, got -0.1"},
      {"checkpoint.keep_last", "0", "must be >= 1, got 0"},
      {"checkpoint.every_n_epochs", "0", "must be >= 1, got 0"},
      {"checkpoint.every_n_steps", "0", "must be >= 1, got 0"},
      {"checkpoint.keep_epochs", "5", "must be an array of epoch numbers, got number 5"},
      {"checkpoint.keep_epochs", "[1, 0]", "key 'checkpoint.keep_epochs[1]' must be >= 1, got 0"},
      {"checkpoint.keep_epochs", "[1, 2.0]", "key 'checkpoint.keep_epochs[1]' must be an integer"},
      {"checkpoint.on_error", "\"ignore\"", "must be one of stop, continue, got \"ignore\""},
  };
  for (const Case& c : cases) {
    const std::string msg = error_for(c.key, c.value);
    INFO(c.key << " = " << c.value << " -> " << msg);
    CHECK(contains(msg, "configs/x.json: key '" + std::string(c.key)));
    CHECK(contains(msg, c.expected));
    CHECK(msg.find('\n') == std::string::npos);
  }
}

TEST_CASE("model.name: the config layer takes any name, the registry's list decides (the CLI's check)") {
  json j = json::object();
  engine::apply_override(j, "model.name=resnet");
  const Config c = engine::config_from_json(j, "configs/x.json");  // a host may bring its own model
  CHECK(c.model.name == "resnet");
  std::string msg;
  try {
    engine::require_choice("configs/x.json", "model.name", c.model.name, engine::model_names());
  } catch (const ConfigError& e) {
    msg = e.what();
  }
  CHECK(msg == "configs/x.json: key 'model.name' must be one of fashion_cnn, mlp, got \"resnet\"");
  for (const std::string& name : engine::model_names())
    CHECK_NOTHROW(engine::require_choice("x", "model.name", name, engine::model_names()));
}

TEST_CASE("non-finite numbers are rejected") {
  json j = json::object();
  j["precision"]["loss_scale"]["init"] = std::numeric_limits<double>::infinity();
  CHECK(contains(parse_error(j), "key 'precision.loss_scale.init' must be a finite number"));
  j = json::object();
  j["data"]["mean"] = std::nan("");
  CHECK(contains(parse_error(j), "key 'data.mean' must be a finite number"));

  json k = json::object();
  CHECK(contains(config_error([&] { engine::apply_override(k, "optimizer.lr=1e999"); }),
                 "--set: value for 'optimizer.lr' is not usable: number overflow"));

  // A config file whose top level is not an object: a nested --set must be refused, not
  // thrown past as json::type_error (found by tests/fuzz/fuzz_config.cpp).
  for (const char* text : {"[]", "[1, 2]", "5", "\"cpu\"", "true"}) {
    json top = json::parse(text);
    CHECK(contains(config_error([&] { engine::apply_override(top, "train.epochs=1"); }),
                   "--set: cannot set 'train.epochs': the config is not a JSON object"));
    json flat = json::parse(text);
    CHECK(contains(config_error([&] { engine::apply_override(flat, "seed=1"); }),
                   "--set: cannot set 'seed': the config is not a JSON object"));
  }

  const fs::path path = temp_dir() / "overflow.json";
  write_file(path, R"({"optimizer": {"lr": 1e999}})");
  CHECK(contains(config_error([&] { engine::load_config(path.string()); }),
                 path.string() + ": invalid JSON: number overflow"));
}

TEST_CASE("boundary values that are valid") {
  json j = json::object();
  for (const char* set : {"seed=9223372036854775807", "device=cuda:3", "data.batch_size=1",
                          "data.batch_size=65536", "data.val_split=0", "data.train_limit=1",
                          "model.dropout=0", "optimizer.betas=[0, 0.9999]",
                          "optimizer.weight_decay=0", "scheduler.t_max=1",
                          "precision.loss_scale.backoff_factor=0.999",
                          "train.early_stopping.patience=0", "checkpoint.keep_epochs=[]",
                          "data.mean=-3"})
    engine::apply_override(j, set);
  const Config c = engine::config_from_json(j, "x");
  CHECK(c.seed == 9223372036854775807ull);
  CHECK(c.device == "cuda:3");
  CHECK(c.data.batch_size == 65536);
  CHECK(c.optimizer.beta1 == 0.0);
  CHECK(c.optimizer.beta2 == 0.9999);
  CHECK(c.data.mean == -3.0);

  for (const char* device : {"auto", "cpu", "cuda", "cuda:0", "cuda:12"}) {
    json d = json::object();
    d["device"] = device;
    CHECK(engine::config_from_json(d, "x").device == device);
  }
}

TEST_CASE("nullable keys accept null") {
  json j = json::object();
  for (const char* set : {"data.train_limit=null", "data.test_limit=null", "scheduler.t_max=null",
                          "checkpoint.every_n_epochs=null", "checkpoint.every_n_steps=null"})
    engine::apply_override(j, set);
  const Config c = engine::config_from_json(j, "x");
  CHECK_FALSE(c.data.train_limit);
  CHECK_FALSE(c.data.test_limit);
  CHECK_FALSE(c.scheduler.t_max);
  CHECK_FALSE(c.checkpoint.every_n_epochs);  // default 5, turned off
  CHECK_FALSE(c.checkpoint.every_n_steps);
}

TEST_CASE("load_config reports files it cannot read and malformed JSON") {
  const fs::path dir = temp_dir();
  SUBCASE("missing file") {
    const std::string path = (dir / "does_not_exist.json").string();
    CHECK(config_error([&] { engine::load_config(path); }) == path + ": cannot open config file");
  }
  SUBCASE("malformed JSON") {
    const std::string path = (dir / "bad.json").string();
    write_file(path, "{\n  \"seed\": 1,\n  \"device\": \"cpu\"\n  \"data\": {}\n}\n");
    const std::string msg = config_error([&] { engine::load_config(path); });
    INFO(msg);
    CHECK(contains(msg, path + ": invalid JSON at line 4 column"));
    CHECK(msg.find('\n') == std::string::npos);
  }
  SUBCASE("empty file") {
    const std::string path = (dir / "empty.json").string();
    write_file(path, "");
    CHECK(contains(config_error([&] { engine::load_config(path); }), path + ": invalid JSON at line 1"));
  }
  SUBCASE("validation errors name the file") {
    const std::string path = (dir / "lr.json").string();
    write_file(path, R"({"optimizer": {"lrr": 0.1}})");
    CHECK(config_error([&] { engine::load_config(path); }) ==
          path + ": unknown key 'optimizer.lrr' (did you mean 'optimizer.lr'?)");
  }
}

TEST_CASE("overrides") {
  json j = engine::default_config_json();

  SUBCASE("integers stay integers and reals are reals") {
    engine::apply_override(j, "train.epochs=3");
    engine::apply_override(j, "optimizer.lr=1e-4");
    CHECK(j["train"]["epochs"].is_number_integer());
    const Config c = engine::config_from_json(j, "x");
    CHECK(c.train.epochs == 3);
    CHECK(c.optimizer.lr == 1e-4);
  }
  SUBCASE("arrays") {
    engine::apply_override(j, "optimizer.betas=[0.8,0.99]");
    engine::apply_override(j, "checkpoint.keep_epochs=[2, 4]");
    const Config c = engine::config_from_json(j, "x");
    CHECK(c.optimizer.beta1 == 0.8);
    CHECK(c.optimizer.beta2 == 0.99);
    CHECK(c.checkpoint.keep_epochs == std::vector<int64_t>{2, 4});
  }
  SUBCASE("plain and quoted strings") {
    engine::apply_override(j, "device=cpu");
    engine::apply_override(j, "optimizer.name=\"adam\"");
    engine::apply_override(j, "data.dir=/tmp/a=b");  // only the first '=' separates
    engine::apply_override(j, "checkpoint.dir=");    // an empty value is the empty string
    CHECK(j["device"] == "cpu");
    CHECK(j["optimizer"]["name"] == "adam");
    CHECK(j["data"]["dir"] == "/tmp/a=b");
    CHECK(j["checkpoint"]["dir"] == "");
  }
  SUBCASE("booleans and null") {
    engine::apply_override(j, "checkpoint.verify=false");
    engine::apply_override(j, "data.train_limit=100");
    engine::apply_override(j, "data.train_limit=null");
    engine::apply_override(j, "checkpoint.every_n_epochs=null");
    const Config c = engine::config_from_json(j, "x");
    CHECK_FALSE(c.checkpoint.verify);
    CHECK_FALSE(c.data.train_limit);
    CHECK_FALSE(c.checkpoint.every_n_epochs);
  }
  SUBCASE("a value of the wrong type is caught by validation") {
    engine::apply_override(j, "data.batch_size=\"12\"");
    CHECK(contains(parse_error(j), "key 'data.batch_size' must be an integer, got string \"12\""));
  }
  SUBCASE("intermediate objects are created") {
    json empty;
    engine::apply_override(empty, "precision.loss_scale.init=1024");
    CHECK(empty == json::parse(R"({"precision": {"loss_scale": {"init": 1024}}})"));
    CHECK(engine::config_from_json(empty, "x").precision.loss_scale.init == 1024.0);
  }
  SUBCASE("whole sections can be replaced") {
    engine::apply_override(j, "cuda={\"deterministic\": false}");
    CHECK_FALSE(engine::config_from_json(j, "x").cuda.deterministic);
  }
  SUBCASE("unknown keys") {
    CHECK(config_error([&] { engine::apply_override(j, "train.epoch=3"); }) ==
          "--set: unknown key 'train.epoch' (did you mean 'train.epochs'?)");
    CHECK(config_error([&] { engine::apply_override(j, "epochs=3"); }) ==
          "--set: unknown key 'epochs' (did you mean 'train.epochs'?)");
    CHECK(config_error([&] { engine::apply_override(j, "trian.epochs=3"); }) ==
          "--set: unknown key 'trian.epochs' (did you mean 'train.epochs'?)");
    CHECK(config_error([&] { engine::apply_override(j, "optimizer.lr.x=3"); }) ==
          "--set: unknown key 'optimizer.lr.x' (did you mean 'optimizer.lr'?)");
    const std::string far = config_error([&] { engine::apply_override(j, "data.qqqqqqqqq=1"); });
    INFO(far);
    CHECK(contains(far, "--set: unknown key 'data.qqqqqqqqq' (valid keys in 'data': "));
    CHECK(j == engine::default_config_json());  // nothing was changed
  }
  SUBCASE("malformed assignments") {
    CHECK(config_error([&] { engine::apply_override(j, "train.epochs"); }) ==
          "--set: expected key=value, got 'train.epochs'");
    CHECK(contains(config_error([&] { engine::apply_override(j, "=3"); }), "--set: missing key"));
  }
  SUBCASE("a value that is not valid UTF-8 is refused with the key, not a JSON exception") {
    // config/ in tests/fuzz/regressions.tar.xz: the unquoted value became a string that could not be
    // dumped, and the type_error escaped config_from_json while it described the value.
    CHECK(config_error([&] { engine::apply_override(j, "device=a\xff"); }) ==
          "--set: value for 'device' is not valid UTF-8");
    CHECK(config_error([&] { engine::apply_override(j, "data.dir=/tmp/\xc3"); }) ==
          "--set: value for 'data.dir' is not valid UTF-8");
    CHECK(j == engine::default_config_json());
    // A JSON string that parsed is valid UTF-8; one set directly is described, not thrown.
    json raw = json::object();
    raw["device"] = std::string("cu\xff");
    CHECK(contains(parse_error(raw), "key 'device' must be one of auto, cpu, cuda, cuda:N"));
  }
  SUBCASE("a section that is not an object in the user's JSON") {
    json bad = json::parse(R"({"train": 5})");
    CHECK(contains(config_error([&] { engine::apply_override(bad, "train.epochs=3"); }),
                   "'train' in the config is not an object"));
  }
}

// docs/config.md's key tables are generated from the config's own table (`engine keys`
// prints them): every key documented once, in table order, each row exactly as
// to_markdown_row gives it (type, default, valid range, meaning); no row for a key that
// does not exist.
TEST_CASE("docs/config.md's key rows are the key table's rows, in its order") {
  std::ifstream in(source_dir() / "docs" / "config.md");
  REQUIRE(in);
  std::vector<std::string> documented;
  std::string line;
  while (std::getline(in, line)) {
    // Key rows: "| `key` | type | ..." with a dotted key of lower-case words; not the
    // --set examples or the table of sections.
    if (line.rfind("| `", 0) != 0) continue;
    const auto close = line.find('`', 3);
    const std::string key = line.substr(3, close - 3);
    if (key.rfind("--set", 0) == 0 || line.compare(close, 4, "` | ") != 0) continue;
    if (std::count(line.begin(), line.end(), '|') < 6) continue;
    documented.push_back(line);
  }
  std::vector<std::string> generated;
  for (const engine::ConfigKeyInfo& k : engine::config_keys()) generated.push_back(engine::to_markdown_row(k));
  CHECK(documented.size() == generated.size());
  for (size_t i = 0; i < std::min(documented.size(), generated.size()); ++i) {
    CAPTURE(i);
    CHECK_MESSAGE(documented[i] == generated[i], "row of `engine keys` (update docs/config.md from it)");
  }
}

// Each layer declares the sections it reads (engine/io/config_table.h); the root is those
// sections nested under their names, after seed and device, and nothing else.
TEST_CASE("the config table is each layer's sections nested under their names") {
  std::vector<std::string> expected = {"seed", "device"};
  auto add = [&](const std::string& prefix, const auto& section) {
    for (const auto& k : section) expected.push_back(prefix + "." + k.name);
  };
  add("data", engine::data_config_keys());
  add("model", engine::model_config_keys());
  add("optimizer", engine::optimizer_config_keys());
  add("scheduler", engine::scheduler_config_keys());
  add("precision", engine::precision_config_keys());
  add("train", engine::train_config_keys());
  add("checkpoint", engine::checkpoint_config_keys());
  add("logging", engine::logging_config_keys());
  add("cuda", engine::cuda_config_keys());
  add("dist", engine::dist_config_keys());
  std::vector<std::string> got;
  for (const engine::ConfigKeyInfo& k : engine::config_keys()) got.push_back(k.dotted);
  CHECK(got == expected);

  SUBCASE("a section reads and writes on its own, with the same checks and messages") {
    const engine::DataConfig d =
        engine::read_config(engine::data_config_keys(), json::parse(R"({"batch_size": 7, "train_limit": null})"), "x");
    CHECK(d.batch_size == 7);
    CHECK_FALSE(d.train_limit.has_value());
    CHECK(engine::write_config(engine::data_config_keys(), d)["batch_size"] == 7);
    CHECK(config_error([] { engine::read_config(engine::data_config_keys(), json::parse(R"({"batchsize": 7})"), "x"); }) ==
          "x: unknown key 'batchsize' (did you mean 'batch_size'?)");
    CHECK(config_error([] { engine::read_config(engine::precision_config_keys(),
                                                json::parse(R"({"loss_scale": {"init": 0}})"), "x"); }) ==
          "x: key 'loss_scale.init' must be > 0, got 0");
  }
}
