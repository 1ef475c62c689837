// engine export / verify-export (docs/export.md): both formats for every registered model,
// the safetensors reader against headers that lie, the bad inputs of the issue (an
// unknown model, truncated files, a probe that does not match), a GPU checkpoint
// exported on the CPU, and model.init_from (the weights come back bit for bit, strictly).
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_util.h"
#include "engine/io/checkpoint.h"
#include "engine/train/config.h"
#include "engine/train/export.h"
#include "engine/train/model_factory.h"
#include "engine/train/trainer.h"
#include "io/onnx_file.h"
#include "io/safetensors.h"

using namespace test_util;
using namespace engine;
namespace fs = std::filesystem;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

bool one_line(const std::string& s) {
  return !s.empty() && s.find('\n') == s.size() - 1;
}

// A short run of `model` (a few hundred images, 1 epoch), once per test process.
std::string trained(const std::string& model) {
  static std::map<std::string, std::string> runs;
  if (runs.count(model)) return runs[model];
  const std::string dir = fresh_dir("export_run_" + model);
  const RunResult r = run("train \"" + source_dir() + "/configs/mnist.json\" --device cpu --run-dir \"" + dir +
                          "\" --set model.name=" + model + " --set train.epochs=1 --set data.train_limit=384" +
                          " --set data.val_split=128 --set data.test_limit=500 --set data.dir=\"" + data_dir() + "\"");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return runs[model] = dir + "/best.h5";
}

std::string accuracy_line(const std::string& output) {
  const auto at = output.find("test: ");
  return at == std::string::npos ? "" : output.substr(at, output.find('\n', at) - at);
}

SafetensorsContent small_content() {
  SafetensorsContent c;
  const std::vector<float> w = {1, 2, 3, 4, 5, 6};
  c.tensors["a.weight"] = safe_tensor_f32({2, 3}, w.data());
  c.tensors["a.num_batches_tracked"] = safe_tensor_i64_scalar(7);
  c.metadata["k"] = "v";
  return c;
}

// The file with its JSON header replaced by `header` (data kept).
std::string with_header(const std::string& file, const std::string& header) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[static_cast<size_t>(i)]);
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + file.substr(8 + n);
}

std::string decode_error(const std::string& bytes) {
  try {
    decode_safetensors(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), "f.safetensors");
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("safetensors: the writer's layout, a round trip, and every lie of a header refused in one line") {
  const std::string file = encode_safetensors(small_content());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[static_cast<size_t>(i)]);
  CHECK((8 + n) % 8 == 0);  // the data starts aligned
  CHECK(file.size() == 8 + n + 8 + 24);
  // The int64 counter (larger alignment) is written first.
  const nlohmann::json h = nlohmann::json::parse(file.substr(8, n));
  CHECK(h["a.num_batches_tracked"]["data_offsets"] == nlohmann::json::array({0, 8}));
  CHECK(h["a.weight"]["data_offsets"] == nlohmann::json::array({8, 32}));
  CHECK(h["__metadata__"]["k"] == "v");
  const SafetensorsContent back =
      decode_safetensors(reinterpret_cast<const unsigned char*>(file.data()), file.size(), "x");
  CHECK(back.tensors.at("a.weight").floats() == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(back.tensors.at("a.num_batches_tracked").scalar_i64() == 7);
  CHECK(back.metadata.at("k") == "v");

  const std::string w = R"("a.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]})";
  const std::string c = R"("a.num_batches_tracked":{"dtype":"I64","shape":[],"data_offsets":[0,8]})";
  struct Lie {
    const char* what;
    std::string bytes;
    const char* expected;
  };
  const std::vector<Lie> lies = {
      {"shorter than 8 bytes", file.substr(0, 5), "truncated"},
      {"truncated header", file.substr(0, 20), "truncated"},
      {"truncated data", file.substr(0, file.size() - 3), "bytes of data"},
      {"header length beyond the limit", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "exceeds"},
      {"offsets past the data", with_header(file, "{" + c + R"(,"a.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[8,40]}})"), "outside"},
      {"size unlike the shape", with_header(file, "{" + c + R"(,"a.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[8,32]}})"), "needs 16"},
      {"overlap", with_header(file, "{" + c + R"(,"a.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[4,28]}})"), "overlaps"},
      {"hole", with_header(file, R"({"a.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]}})"), "hole"},
      {"bytes after the last tensor", with_header(file, R"({"a.num_batches_tracked":{"dtype":"I64","shape":[],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})"), "after the last"},
      {"begin after end", with_header(file, "{" + c + R"(,"a.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[32,8]}})"), "outside"},
      {"overflowing shape", with_header(file, "{" + c + R"(,"a.weight":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[8,32]}})"), "not a whole number"},
      {"shape product past 2^31", with_header(file, "{" + c + R"(,"a.weight":{"dtype":"F32","shape":[65536,65536],"data_offsets":[8,32]}})"), "more than 2^31"},
      {"negative dimension", with_header(file, "{" + c + R"(,"a.weight":{"dtype":"F32","shape":[-2,3],"data_offsets":[8,32]}})"), "not a whole number"},
      {"unknown dtype", with_header(file, "{" + c + R"(,"a.weight":{"dtype":"BF16","shape":[2,3],"data_offsets":[8,32]}})"), "not supported"},
      {"a key twice", with_header(file, "{" + c + "," + w + "," + w + "}"), "twice"},
      {"metadata not strings", with_header(file, "{" + c + "," + w + R"(,"__metadata__":{"k":1}})"), "not a string"},
      {"not JSON", with_header(file, "{" + c + ","), "not valid JSON"},
      {"not an object", with_header(file, "[1,2]"), "does not start with '{'"},
  };
  for (const Lie& lie : lies) {
    const std::string e = decode_error(lie.bytes);
    INFO(std::string(lie.what) << ": " << e);
    CHECK(e.rfind("f.safetensors: ", 0) == 0);
    CHECK(e.find('\n') == std::string::npos);
    CHECK(e.find(lie.expected) != std::string::npos);
  }
}

TEST_CASE("export and verify-export: both formats, every registered model, metadata and probes") {
  if (!dataset_available()) return;
  for (const std::string model : {"fashion_cnn", "mlp"}) {
    CAPTURE(model);
    const std::string ckpt = trained(model);
    const std::string dir = fs::path(ckpt).parent_path().string();
    const RunResult eval = run("eval \"" + ckpt + "\" --device cpu");
    REQUIRE(eval.exit_code == 0);
    const Checkpoint ck = load_checkpoint(ckpt);
    for (const char* format : {"onnx", "safetensors"}) {
      CAPTURE(format);
      const std::string out = dir + "/model." + format;
      RunResult r = run("export \"" + ckpt + "\" --format " + format + " -o \"" + out + "\"");
      INFO(r.output);
      REQUIRE(r.exit_code == 0);
      CHECK(r.output.find("exported " + model) != std::string::npos);
      r = run("verify-export \"" + out + "\"");
      INFO(r.output);
      CHECK(r.exit_code == 0);
      CHECK(r.output.find(": OK (" + std::string(format) + ", " + model) != std::string::npos);

      const ExportCheck check = verify_export(out);
      CHECK(check.probes == kExportProbes);
      CHECK(check.classes == 10);
      // The engine computes the probes again with the same kernels in the same order.
      CHECK(check.max_abs_diff == 0);
      const auto& m = check.metadata;
      CHECK(m.at("model") == model);
      CHECK(m.at("source_checkpoint") == ckpt);
      CHECK(m.at("epoch") == std::to_string(ck.group("trainer").get_int("epoch")));
      CHECK(m.at("global_step") == std::to_string(ck.group("trainer").get_int("global_step")));
      CHECK(m.at("input_mean") == "0.28599999999999998");
      CHECK(m.at("test_count") == "500");
      for (const char* key : {"engine_version", "source_crc32", "config_crc32", "test_accuracy", "input_std",
                              "input_normalization", "probe_inputs", "probe_logits", "probe_tolerance"})
        CHECK(!m.at(key).empty());
      // The recorded accuracy is engine eval's.
      char pct[32];
      std::snprintf(pct, sizeof pct, "%.2f%%", 100 * std::stod(m.at("test_accuracy")));
      CHECK(accuracy_line(eval.output).find(pct) != std::string::npos);
    }
    // The ONNX graph: opset 13, BatchNormalization kept as a node, a dynamic batch.
    const OnnxGraph g = read_onnx_file(dir + "/model.onnx");
    CHECK(g.opset == kExportOnnxOpset);
    std::string ops;
    for (const OnnxNode& n : g.nodes) ops += n.op_type + " ";
    if (model == "fashion_cnn")
      CHECK(ops == "Conv BatchNormalization MaxPool Relu Conv BatchNormalization MaxPool Relu Flatten Gemm Relu Gemm ");
    else
      CHECK(ops == "Flatten Gemm Relu Gemm ");
    // Both files carry the same metadata.
    const SafetensorsContent st = read_safetensors_file(dir + "/model.safetensors");
    CHECK(st.metadata == g.metadata);
    // And the inference state with PyTorch's names: the checkpoint's model group.
    const StateDict& state = ck.group("model");
    CHECK(st.tensors.size() == state.tensors.size() + state.scalars.size());
    for (const auto& [name, t] : state.tensors) CHECK(st.tensors.at(name).floats() == t.to_vector());
  }
}

TEST_CASE("bad input: one line naming the file and a non-zero exit, no file left behind") {
  if (!dataset_available()) return;
  const std::string ckpt = trained("fashion_cnn");
  const std::string dir = fresh_dir("export_bad");
  const auto fails = [&](const std::string& args, const std::string& file, const std::string& part) {
    const RunResult r = run(args);
    INFO(args << "\n" << r.output);
    CHECK(r.exit_code == 1);
    CHECK(one_line(r.output));
    CHECK(r.output.find(file) != std::string::npos);
    CHECK(r.output.find(part) != std::string::npos);
  };

  // A checkpoint of a model the registry does not know.
  Checkpoint ck = load_checkpoint(ckpt);
  nlohmann::json cfg = nlohmann::json::parse(ck.config_json);
  cfg["model"]["name"] = "resnet18";
  ck.config_json = cfg.dump();
  const std::string unknown = dir + "/unknown.h5";
  save_checkpoint(unknown, ck);
  fails("export \"" + unknown + "\" --format onnx -o \"" + dir + "/u.onnx\"", unknown, "unknown model 'resnet18'");
  CHECK(!fs::exists(dir + "/u.onnx"));
  fails("export \"" + dir + "/missing.h5\" --format onnx -o \"" + dir + "/m.onnx\"", "missing.h5", "");
  // The output is written atomically: a directory in its place is refused, and kept.
  fs::create_directories(dir + "/adir");
  fails("export \"" + ckpt + "\" --format safetensors -o \"" + dir + "/adir\"", dir + "/adir", "");
  CHECK(fs::is_directory(dir + "/adir"));

  for (const std::string format : {"onnx", "safetensors"}) {
    CAPTURE(format);
    const std::string good = dir + "/good." + format;
    REQUIRE(run("export \"" + ckpt + "\" --format " + format + " -o \"" + good + "\"").exit_code == 0);
    const std::string bytes = read_bytes(good);
    // Truncated: anywhere in the file.
    for (const size_t keep : {size_t{0}, size_t{4}, bytes.size() / 3, bytes.size() - 1}) {
      const std::string cut = dir + "/cut." + format;
      write_bytes(cut, bytes.substr(0, keep));
      fails("verify-export \"" + cut + "\"", cut, "");
    }
  }

  // A safetensors header that lies about offsets.
  const std::string st = read_bytes(dir + "/good.safetensors");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(st[static_cast<size_t>(i)]);
  nlohmann::json header = nlohmann::json::parse(st.substr(8, n));
  header["fc2.bias"]["data_offsets"][1] = header["fc2.bias"]["data_offsets"][1].get<uint64_t>() + 4;
  write_bytes(dir + "/lie.safetensors", with_header(st, header.dump()));
  fails("verify-export \"" + dir + "/lie.safetensors\"", "lie.safetensors", "fc2.bias");

  // Probes that do not match: a weight changed in each format.
  SafetensorsContent c = read_safetensors_file(dir + "/good.safetensors");
  std::vector<float> bias = c.tensors.at("fc2.bias").floats();
  bias[3] += 0.5f;
  c.tensors["fc2.bias"] = safe_tensor_f32({10}, bias.data());
  write_bytes(dir + "/wrong.safetensors", encode_safetensors(c));
  fails("verify-export \"" + dir + "/wrong.safetensors\"", "wrong.safetensors", "logit 3");
  OnnxGraph g = read_onnx_file(dir + "/good.onnx");
  for (OnnxInitializer& init : g.initializers)
    if (init.name == "bn2.running_var")
      for (float& v : init.values) v *= 4;  // a runtime that mixed up variance and std would do worse
  write_bytes(dir + "/wrong.onnx", encode_onnx(g));
  fails("verify-export \"" + dir + "/wrong.onnx\"", "wrong.onnx", "the file does not compute what was exported");
  // A tolerance widened in the metadata does not help: it is recomputed from the weights.
  c = read_safetensors_file(dir + "/good.safetensors");
  c.metadata["probe_tolerance"] = c.metadata["probe_inputs"].substr(0, c.metadata["probe_tolerance"].size());
  write_bytes(dir + "/widened.safetensors", encode_safetensors(c));
  fails("verify-export \"" + dir + "/widened.safetensors\"", "widened.safetensors", "probe_tolerance");
  // A file that is no export at all.
  fails("verify-export \"" + ckpt + "\"", ckpt, "");
}

TEST_CASE("a checkpoint written on a GPU (tests/data fixture) exports and verifies on the CPU") {
  if (!dataset_available()) return;
  const std::string unpacked = fresh_dir("export_gpu_fixture");
  const std::string archive = source_dir() + "/tests/data/fixtures.tar.xz";
  REQUIRE(std::system(("tar -C \"" + unpacked + "\" -xJf \"" + archive + "\"").c_str()) == 0);
  const std::string ckpt = unpacked + "/checkpoint_v2_cuda_fp32_mid_epoch.h5";
  REQUIRE(load_checkpoint(ckpt).meta.saved_on.rfind("cuda", 0) == 0);
  for (const char* format : {"onnx", "safetensors"}) {
    const std::string out = unpacked + "/gpu." + format;
    RunResult r = run("export \"" + ckpt + "\" --format " + format + " -o \"" + out + "\" --data-dir \"" +
                      data_dir() + "\"");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    r = run("verify-export \"" + out + "\"");
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(verify_export(out).metadata.at("source_saved_on").rfind("cuda", 0) == 0);
  }
}

TEST_CASE("model.init_from: the exported weights come back bit for bit and evaluate the same; strict") {
  if (!dataset_available()) return;
  const std::string ckpt = trained("fashion_cnn");
  const std::string dir = fresh_dir("export_init_from");
  const std::string st = dir + "/best.safetensors";
  REQUIRE(run("export \"" + ckpt + "\" --format safetensors -o \"" + st + "\"").exit_code == 0);

  // A fresh trainer from the file: its model state is the checkpoint's, bit for bit, and
  // a checkpoint of it evaluates to the same accuracy.
  Config cfg = config_from_json(nlohmann::json::parse(load_checkpoint(ckpt).config_json), "stored");
  cfg.model.init_from = st;
  cfg.checkpoint.dir = dir;
  Trainer t(cfg, Device::cpu(), make_model(cfg));
  const StateDict now = t.model().state();
  const Checkpoint source = load_checkpoint(ckpt);
  const StateDict& was = source.group("model");
  CHECK(compare_state(was, now).clean());
  for (const auto& [name, tensor] : was.tensors) CHECK(now.get_tensor(name).to_vector() == tensor.to_vector());
  for (const auto& [name, s] : was.scalars) CHECK(now.get_int(name) == std::get<int64_t>(s));
  t.save_checkpoint(dir + "/start.h5");
  const RunResult a = run("eval \"" + ckpt + "\" --device cpu");
  const RunResult b = run("eval \"" + dir + "/start.h5\" --device cpu");
  REQUIRE(a.exit_code == 0);
  REQUIRE(b.exit_code == 0);
  CHECK(accuracy_line(a.output) == accuracy_line(b.output));
  CHECK(!accuracy_line(a.output).empty());

  // The CLI trains on from it; a file of another model is refused as the strict loader
  // reports it.
  const std::string run_dir = dir + "/tuned";
  RunResult r = run("train \"" + source_dir() + "/configs/mnist.json\" --device cpu --run-dir \"" + run_dir +
                    "\" --set model.init_from=\"" + st + "\" --set train.epochs=1 --set data.train_limit=128 " +
                    "--set data.val_split=64 --set data.test_limit=100 --set data.dir=\"" + data_dir() + "\"");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("model initialised from " + st) != std::string::npos);
  const std::string mlp_st = dir + "/mlp.safetensors";
  REQUIRE(run("export \"" + trained("mlp") + "\" --format safetensors -o \"" + mlp_st + "\"").exit_code == 0);
  r = run("train \"" + source_dir() + "/configs/mnist.json\" --device cpu --run-dir \"" + dir +
          "/refused\" --set model.init_from=\"" + mlp_st + "\" --set data.dir=\"" + data_dir() + "\"");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(one_line(r.output));
  CHECK(r.output.find(mlp_st + ": does not match model fashion_cnn (model.init_from, strict): ") != std::string::npos);
  CHECK(r.output.find("missing (bn1.bias,") != std::string::npos);
  CHECK(r.output.find("mismatched (fc1.weight") != std::string::npos);
}
