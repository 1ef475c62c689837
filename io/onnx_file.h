// Private to the engine: ONNX files, built and read with the ONNX project's own library
// (Debian's libonnx-dev: the generated protobuf classes, the checker and shape inference),
// never by a hand-written encoder. This layer knows no model: it serialises a plain
// description of an inference graph (nodes, float initializers, one input, one output,
// string metadata), which the export (engine/train/export.h) builds from a model and
// maps back to the engine's layers. No protobuf or ONNX type appears in this header.
#pragma once
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace engine {

// One line, starting with the file's path (or the origin given).
struct OnnxError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct OnnxAttribute {
  enum class Kind { Int, Ints, Float };
  std::string name;
  Kind kind = Kind::Int;
  std::vector<int64_t> ints;  // Int: one value
  float f = 0;
};

struct OnnxNode {
  std::string op_type;  // "Conv", "BatchNormalization", "MaxPool", "Relu", "Flatten", "Gemm"
  std::string name;
  std::vector<std::string> inputs, outputs;
  std::vector<OnnxAttribute> attributes;

  // The attribute `name`, or null.
  const OnnxAttribute* attribute(const std::string& name) const;
};

struct OnnxInitializer {
  std::string name;
  std::vector<int64_t> dims;
  std::vector<float> values;  // float32, row-major
};

struct OnnxGraph {
  int64_t opset = 13;
  std::string producer_version;
  std::string graph_name;
  std::string input_name, output_name;
  // Dimension 0 of input and output is the batch: a named, dynamic dimension ("batch").
  std::vector<int64_t> input_dims, output_dims;  // dims after the batch
  std::vector<OnnxNode> nodes;                     // in topological order
  std::vector<OnnxInitializer> initializers;
  std::map<std::string, std::string> metadata;     // ModelProto.metadata_props
};

// Whether this build has ONNX support (libonnx found at configure time).
bool onnx_supported();

// The serialised ModelProto, after the ONNX checker and strict shape inference have
// accepted it (they throw OnnxError naming what is wrong).
std::string encode_onnx(const OnnxGraph& graph);

// Parses and checks `n` bytes (checker, shape inference), then converts: float32
// initializers only (raw_data or float_data, sizes checked against dims), one input,
// one output, attributes of the kinds above. `origin` starts every error message.
OnnxGraph decode_onnx(const unsigned char* data, std::size_t n, const std::string& origin);

OnnxGraph read_onnx_file(const std::string& path);

}  // namespace engine
