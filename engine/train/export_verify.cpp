// Checking an export (verify_export, engine/train/export.h): the file read back, the
// model it describes rebuilt, the probes run through the engine and compared with the
// stored logits within tolerances recomputed from the file's own weights.
#include "engine/train/export.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>

#include "engine/nn/models/registry.h"
#include "io/onnx_file.h"
#include "io/safetensors.h"
#include "train/export_base64.h"
#include "train/export_common.h"
#include "train/export_error_bounds.h"
#include "train/export_onnx.h"
#include "train/export_safetensors.h"
#include "train/export_steps.h"

namespace engine {

using namespace export_internal;

namespace {

const std::string& meta(const std::map<std::string, std::string>& m, const std::string& key, const std::string& origin) {
  const auto it = m.find(key);
  if (it == m.end()) throw ExportError(origin + ": metadata " + key + " is missing (not an engine export?)");
  return it->second;
}

int64_t meta_int(const std::map<std::string, std::string>& m, const std::string& key, const std::string& origin,
                 int64_t lo, int64_t hi) {
  const std::string& text = meta(m, key, origin);
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used == text.size() && v >= lo && v <= hi) return v;
  } catch (const std::exception&) {
  }
  throw ExportError(origin + ": metadata " + key + " is '" + text.substr(0, 40) + "', not a whole number in [" +
                    std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

}  // namespace

// ---- verify --------------------------------------------------------------------------------

ExportCheck verify_export(const std::string& path) {
  const std::string bytes = read_all(path);
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  // safetensors begins with its header's length, then '{'; a protobuf message cannot
  // (its first byte is a field tag, never 8 bytes before a '{' for a ModelProto).
  const bool safetensors = bytes.size() >= 9 && bytes[8] == '{';
  ExportCheck check;
  check.path = path;
  check.format = safetensors ? ExportFormat::Safetensors : ExportFormat::Onnx;
  std::unique_ptr<Model> model;
  StateDict state;
  std::vector<Step> steps;
  ImageShape shape;
  int classes = 0;
  try {
    if (safetensors) {
      const SafetensorsContent c = decode_safetensors(data, bytes.size(), path);
      check.metadata = c.metadata;
      state = state_from_safetensors(c, path);
    } else {
      const OnnxGraph g = decode_onnx(data, bytes.size(), path);
      check.metadata = g.metadata;
      shape = ImageShape{static_cast<int>(g.input_dims.size() == 3 ? g.input_dims[0] : 0),
                         static_cast<int>(g.input_dims.size() == 3 ? g.input_dims[1] : 0),
                         static_cast<int>(g.input_dims.size() == 3 ? g.input_dims[2] : 0)};
      if (g.input_dims.size() != 3 || g.output_dims.size() != 1)
        throw ExportError(path + ": the graph's input is not [batch, C, H, W] or its output not [batch, classes]");
      steps = from_onnx(g, state, path);
      classes = static_cast<int>(g.output_dims[0]);
    }
  } catch (const SafetensorsError& e) {
    throw ExportError(e.what());
  } catch (const OnnxError& e) {
    throw ExportError(e.what());
  }
  const auto& m = check.metadata;
  if (meta(m, "format", path) != kExportFormatTag)
    throw ExportError(path + ": metadata format is '" + m.at("format").substr(0, 40) + "', not " + kExportFormatTag);
  check.model = meta(m, "model", path);
  const int64_t meta_classes = meta_int(m, "classes", path, 1, 1 << 20);
  ImageShape meta_shape;
  try {
    const nlohmann::json j = nlohmann::json::parse(meta(m, "input_shape", path));
    meta_shape = ImageShape{j.at(0).get<int>(), j.at(1).get<int>(), j.at(2).get<int>()};
    if (j.size() != 3 || meta_shape.channels <= 0 || meta_shape.height <= 0 || meta_shape.width <= 0 ||
        meta_shape.numel() > (1 << 24))
      throw std::invalid_argument("");
  } catch (const std::exception&) {
    throw ExportError(path + ": metadata input_shape is not [C, H, W]");
  }
  if (safetensors) {
    shape = meta_shape;
    classes = static_cast<int>(meta_classes);
    // Each registered model has at least a weight per input value and per class: a
    // shape the file's tensors cannot hold is refused before a model is built for it.
    int64_t stored = 0;
    for (const auto& [name, t] : state.tensors) stored += t.numel();
    if (shape.numel() + classes > stored + (int64_t{1} << 20))
      throw ExportError(path + ": metadata input_shape " + shape.str() + " and classes " + std::to_string(classes) +
                        " are larger than the file's tensors allow");
    ModelConfig mc;
    mc.name = check.model;
    try {
      model = make_model_for(mc, shape, classes);
    } catch (const std::exception& e) {
      throw ExportError(path + ": " + e.what());
    }
    const StateReport r = compare_state(model->state(), state);
    if (!r.clean()) throw ExportError(path + ": does not match model " + model->name() + ": " + r.summary());
    model->load_state(state);
    steps = describe(*model);
  } else {
    if (shape != meta_shape || classes != meta_classes)
      throw ExportError(path + ": the graph takes " + shape.str() + " to " + std::to_string(classes) +
                        ", the metadata says " + meta_shape.str() + " to " + std::to_string(meta_classes));
    check_chain(steps, shape, classes, std::max<int64_t>(int64_t{1} << 22, 16 * static_cast<int64_t>(bytes.size())),
                path);
    model = std::make_unique<LayerChain>(check.model, shape, classes, steps);
    const StateReport r = compare_state(model->state(), state);
    if (!r.clean()) throw ExportError(path + ": the graph's initializers do not fit its nodes: " + r.summary());
    model->load_state(state);
  }

  const int probes = static_cast<int>(meta_int(m, "probe_count", path, 1, 1024));
  const size_t n_in = static_cast<size_t>(probes * shape.numel());
  const size_t n_out = static_cast<size_t>(probes) * static_cast<size_t>(classes);
  const std::vector<float> inputs = floats_from_base64(meta(m, "probe_inputs", path), n_in, path, "probe_inputs");
  const std::vector<float> stored = floats_from_base64(meta(m, "probe_logits", path), n_out, path, "probe_logits");
  const std::vector<float> stored_tol =
      floats_from_base64(meta(m, "probe_tolerance", path), n_out, path, "probe_tolerance");
  for (const float v : inputs)
    if (!std::isfinite(v)) throw ExportError(path + ": metadata probe_inputs holds a value that is not finite");
  // The tolerance is recomputed from the file's own weights: a file cannot widen it.
  const std::vector<float> tol = probe_tolerances(steps, state, shape, inputs, probes);
  const std::vector<float> now = run_probes(*model, shape, inputs, probes);
  check.probes = probes;
  check.classes = classes;
  check.min_tolerance = *std::min_element(tol.begin(), tol.end());
  check.max_tolerance = *std::max_element(tol.begin(), tol.end());
  for (size_t i = 0; i < n_out; ++i) {
    const double diff = std::fabs(static_cast<double>(now[i]) - static_cast<double>(stored[i]));
    const double fraction = diff / static_cast<double>(tol[i]);
    if (!(diff <= static_cast<double>(tol[i])))  // NaN fails too
      throw ExportError(path + ": probe " + std::to_string(i / static_cast<size_t>(classes)) + " logit " +
                        std::to_string(i % static_cast<size_t>(classes)) + ": the engine computes " +
                        number_text(now[i]) + ", the file records " + number_text(stored[i]) + " (|diff| " +
                        number_text(diff) + " > tolerance " + number_text(tol[i]) +
                        "): the file does not compute what was exported");
    check.max_abs_diff = std::max(check.max_abs_diff, diff);
    check.worst_fraction = std::max(check.worst_fraction, fraction);
    if (stored_tol[i] < tol[i] * 0.999f || stored_tol[i] > tol[i] * 1.001f)
      throw ExportError(path + ": metadata probe_tolerance " + std::to_string(i) + " is " + number_text(stored_tol[i]) +
                        ", the file's weights give " + number_text(tol[i]));
  }
  return check;
}

}  // namespace engine
