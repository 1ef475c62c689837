// Serving what was trained (docs/export.md): a checkpoint's model as an ONNX inference
// graph or as a safetensors file of PyTorch's state_dict, each carrying the same metadata
// and its own self-test: fixed probe inputs drawn from the run's Philox generator, the
// engine's logits for them, and per logit a tolerance derived from the summation order.
//
//   engine::export_checkpoint("runs/mnist/best.h5", engine::ExportFormat::Onnx, "model.onnx");
//   engine::verify_export("model.onnx");  // throws ExportError when the file computes otherwise
#pragma once
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>

#include "engine/core/state.h"
#include "engine/nn/model.h"

namespace engine {

enum class ExportFormat { Onnx, Safetensors };
const char* to_string(ExportFormat f);  // "onnx", "safetensors"
// "onnx" or "safetensors"; throws std::invalid_argument naming the choices otherwise.
ExportFormat parse_export_format(const std::string& text);

// One line, starting with the path of the file concerned.
struct ExportError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The ONNX opset of the exported graphs.
inline constexpr int64_t kExportOnnxOpset = 13;
// Probes per export, and the Philox subsequence they are drawn from (after the run's
// init = 1, shuffle = 2 and dropout = 3 streams of engine/core/rng.h).
inline constexpr int kExportProbes = 8;
inline constexpr uint64_t kExportProbeSubsequence = 4;

struct ExportOptions {
  // Where the test set is for the recorded test accuracy; empty: the checkpoint's data.dir.
  std::string data_dir;
};

struct ExportSummary {
  std::string path;
  ExportFormat format = ExportFormat::Onnx;
  std::string model;
  uint64_t bytes = 0;
  int64_t parameters = 0;
  double test_accuracy = 0;  // of the checkpoint on its test set, as `engine eval` reports it
  int64_t test_count = 0;
  double max_tolerance = 0;  // the largest per-logit tolerance of the probes
  std::map<std::string, std::string> metadata;
};

// Loads the checkpoint (from any device, onto the CPU), builds its model (model.name
// of the stored config: fashion_cnn, mlp), evaluates it on its test set, computes the
// probes' logits and tolerances, and writes `out_path` atomically. Throws
// CheckpointError (the checkpoint), ExportError (an unknown or unexportable model, a
// refused graph) or CheckpointWriteError (the disk), each one line.
ExportSummary export_checkpoint(const std::string& checkpoint_path, ExportFormat format, const std::string& out_path,
                                const ExportOptions& options = {});

struct ExportCheck {
  std::string path;
  ExportFormat format = ExportFormat::Onnx;
  std::string model;
  int probes = 0;
  int classes = 0;
  double max_abs_diff = 0;       // |engine's logit now - stored logit|, the largest
  double worst_fraction = 0;     // the largest |diff| / tolerance (<= 1 when sound)
  double min_tolerance = 0, max_tolerance = 0;
  std::map<std::string, std::string> metadata;
};

// Reads an export (the format from its bytes), rebuilds the model it describes (the ONNX
// graph node by node as engine layers; the safetensors state into the registry's model),
// runs the probes through the engine's CPU kernels and compares the logits with the
// stored ones within tolerances recomputed from the file's weights. Throws ExportError,
// one line naming the file, on a file that cannot be read or a logit beyond its tolerance.
ExportCheck verify_export(const std::string& path);

// model.init_from: the tensors of a safetensors file as `model`'s state (PyTorch's names;
// float32 tensors, int64 0-d tensors as the int64 scalars num_batches_tracked), checked
// strictly against model.state(). Throws ExportError naming the file and every missing,
// unexpected or mismatched key.
StateDict load_safetensors_state(const std::string& path, const Model& model);

}  // namespace engine
