// Writing an export (engine/train/export.h): export_checkpoint and the format names. Its
// parts, each in its own file: export_steps (the model as a chain of steps),
// export_error_bounds (the probes' tolerances), export_base64, export_onnx and
// export_safetensors (the two formats); export_verify.cpp checks a file.
#include "engine/train/export.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "engine/core/build_info.h"
#include "engine/io/checkpoint.h"
#include "engine/io/dataset.h"
#include "engine/kernels/philox.h"
#include "engine/train/config.h"
#include "engine/train/inference.h"
#include "engine/train/model_factory.h"
#include "io/atomic_file.h"
#include "io/crc32.h"
#include "kernels/elementwise.h"
#include "train/export_base64.h"
#include "train/export_common.h"
#include "train/export_error_bounds.h"
#include "train/export_onnx.h"
#include "train/export_safetensors.h"
#include "train/export_steps.h"

namespace engine {

const char* to_string(ExportFormat f) { return f == ExportFormat::Onnx ? "onnx" : "safetensors"; }

ExportFormat parse_export_format(const std::string& text) {
  if (text == "onnx") return ExportFormat::Onnx;
  if (text == "safetensors") return ExportFormat::Safetensors;
  throw std::invalid_argument("unknown export format '" + text + "' (onnx, safetensors)");
}

using namespace export_internal;

namespace {

constexpr const char* kExportFormatVersion = "1";

// ---- probes -------------------------------------------------------------------------------

// The probe images: pixel bytes from the run's Philox generator (seed, subsequence
// kExportProbeSubsequence), value j = probe * pixels + i, its top 8 bits, normalised as
// the trainer normalises (kernels/elementwise.h), so they are valid model inputs.
std::vector<float> probe_inputs(uint64_t seed, const ImageShape& shape, double mean, double std, int probes) {
  const PhiloxStream stream{seed, kExportProbeSubsequence};
  const int64_t numel = shape.numel();
  std::vector<float> x(static_cast<size_t>(probes * numel));
  const float inv_std = 1.0f / static_cast<float>(std);
  for (int64_t j = 0; j < probes * numel; ++j) {
    const auto byte = static_cast<uint8_t>(philox_at(stream, static_cast<uint64_t>(j)) >> 24);
    x[static_cast<size_t>(j)] = kernels::normalize_pixel(byte, static_cast<float>(mean), inv_std);
  }
  return x;
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

}  // namespace

// ---- export --------------------------------------------------------------------------------

ExportSummary export_checkpoint(const std::string& ckpt_path, ExportFormat format, const std::string& out_path,
                                const ExportOptions& options) {
  // The file's own CRC-32 (zlib's), so a consumer can tell which file it came from.
  const std::string ckpt_bytes = read_all(ckpt_path);
  const uint32_t ckpt_crc = crc32_update(0, reinterpret_cast<const unsigned char*>(ckpt_bytes.data()), ckpt_bytes.size());
  const Checkpoint ckpt = load_checkpoint(ckpt_path, Device::cpu());
  Config cfg;
  try {
    cfg = config_from_json(nlohmann::json::parse(ckpt.config_json), ckpt_path + " (stored config)");
  } catch (const nlohmann::json::exception&) {
    throw CheckpointError(ckpt_path + ": the stored config is not valid JSON");
  }
  std::unique_ptr<Model> model;
  try {
    model = make_model(cfg);
  } catch (const std::exception& e) {
    throw ExportError(ckpt_path + ": " + e.what());
  }
  const StateDict& given = ckpt.group("model");
  const StateReport r = compare_state(model->state(), given);
  if (!r.clean())
    throw ExportError(ckpt_path + ": model state does not match model " + model->name() + ": " + r.summary());
  model->load_state(given);
  std::vector<Step> steps;
  try {
    steps = describe(*model);
  } catch (const ExportError& e) {
    throw ExportError(ckpt_path + ": " + e.what());
  }
  const StateDict state = model->state();

  // The run's test accuracy: the checkpoint on its test set, as `engine eval` computes it.
  const Classifier clf(ckpt_path, Device::cpu(), make_model);
  DataConfig data = cfg.data;
  if (!options.data_dir.empty()) data.dir = options.data_dir;
  const std::unique_ptr<Dataset> dataset = make_dataset(data, Device::cpu());
  const SplitData& test = dataset->get(Split::Test);
  const EvalResult tested = score_logits(clf.predict(test.images.u8(), test.count, Scores::Logits), test.labels.u8());

  const ImageShape shape = model->input_shape();
  const int classes = model->num_classes();
  const std::vector<float> inputs = probe_inputs(cfg.seed, shape, cfg.data.mean, cfg.data.std, kExportProbes);
  const std::vector<float> logits = run_probes(*model, shape, inputs, kExportProbes);
  const std::vector<float> tol = probe_tolerances(steps, state, shape, inputs, kExportProbes);

  std::map<std::string, std::string> m;
  m["format"] = kExportFormatTag;
  m["format_version"] = kExportFormatVersion;
  m["engine_version"] = build_info().engine_version;
  m["model"] = model->name();
  m["input_shape"] = nlohmann::json({shape.channels, shape.height, shape.width}).dump();
  m["classes"] = std::to_string(classes);
  m["source_checkpoint"] = ckpt_path;
  m["source_crc32"] = hex32(ckpt_crc);
  m["source_saved_on"] = ckpt.meta.saved_on;
  m["epoch"] = std::to_string(ckpt.group("trainer").get_int("epoch"));
  m["global_step"] = std::to_string(ckpt.group("trainer").get_int("global_step"));
  m["config_crc32"] = hex32(crc32_update(0, reinterpret_cast<const unsigned char*>(ckpt.config_json.data()),
                                         ckpt.config_json.size()));
  m["seed"] = std::to_string(cfg.seed);
  m["test_accuracy"] = number_text(tested.accuracy);
  m["test_count"] = std::to_string(tested.count);
  m["input_mean"] = number_text(cfg.data.mean);
  m["input_std"] = number_text(cfg.data.std);
  m["input_normalization"] = "x = (pixel / 255 - input_mean) / input_std, pixels 0..255, float32 [N, " +
                             std::to_string(shape.channels) + ", " + std::to_string(shape.height) + ", " +
                             std::to_string(shape.width) + "]";
  m["probe_count"] = std::to_string(kExportProbes);
  m["probe_source"] = "philox4x32-10 (seed, subsequence " + std::to_string(kExportProbeSubsequence) +
                      "), value probe * pixels + i, top 8 bits as the pixel, normalised";
  m["probe_inputs"] = base64_floats(inputs);
  m["probe_logits"] = base64_floats(logits);
  m["probe_tolerance"] = base64_floats(tol);
  m["probe_encoding"] = "base64 of little-endian float32, row-major: inputs [probes, C, H, W], logits and "
                        "tolerance [probes, classes]; pass when |logit - probe_logits| <= probe_tolerance";

  std::string bytes;
  if (format == ExportFormat::Safetensors) {
    SafetensorsContent content = to_safetensors(state);
    content.metadata = m;
    bytes = encode_safetensors(content);
  } else {
    OnnxGraph g = to_onnx(*model, steps, state);
    g.metadata = m;
    try {
      bytes = encode_onnx(g);
    } catch (const OnnxError& e) {
      throw ExportError(out_path + ": " + e.what());
    }
  }
  write_file_atomically(Env::posix(), out_path, bytes);

  ExportSummary s;
  s.path = out_path;
  s.format = format;
  s.model = model->name();
  s.bytes = bytes.size();
  s.parameters = model->parameter_count();
  s.test_accuracy = tested.accuracy;
  s.test_count = tested.count;
  s.max_tolerance = *std::max_element(tol.begin(), tol.end());
  s.metadata = std::move(m);
  return s;
}

}  // namespace engine
