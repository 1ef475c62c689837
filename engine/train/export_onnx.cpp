// The export's ONNX graphs (export_onnx.h): steps to nodes, and nodes back to steps.
#include "train/export_onnx.h"

#include <cstdint>
#include <map>

#include "engine/core/build_info.h"
#include "engine/train/export.h"

namespace engine {
namespace export_internal {

namespace {

constexpr const char* kInputName = "input";
constexpr const char* kOutputName = "logits";

OnnxAttribute ints_attr(const std::string& name, std::vector<int64_t> v) {
  return {name, OnnxAttribute::Kind::Ints, std::move(v), 0};
}
OnnxAttribute int_attr(const std::string& name, int64_t v) { return {name, OnnxAttribute::Kind::Int, {v}, 0}; }

// The attribute's ints, or `fallback` when absent; refuses another kind.
std::vector<int64_t> attr_ints(const OnnxNode& n, const std::string& name, std::vector<int64_t> fallback,
                               const std::string& origin) {
  const OnnxAttribute* a = n.attribute(name);
  if (!a) return fallback;
  if (a->kind == OnnxAttribute::Kind::Float) throw ExportError(origin + ": node " + n.name + ": " + name + " is a float");
  return a->ints;
}

}  // namespace

OnnxGraph to_onnx(const Model& model, const std::vector<Step>& steps, const StateDict& state) {
  OnnxGraph g;
  g.opset = kExportOnnxOpset;
  g.producer_version = build_info().engine_version;
  g.graph_name = model.name();
  g.input_name = kInputName;
  g.output_name = kOutputName;
  const ImageShape in = model.input_shape();
  g.input_dims = {in.channels, in.height, in.width};
  g.output_dims = {model.num_classes()};
  const auto add_init = [&](const std::string& name) {
    const Tensor& t = state.get_tensor(name);
    g.initializers.push_back({name, t.shape(), t.to_vector()});
    return name;
  };
  std::string prev = kInputName;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    OnnxNode n;
    n.name = s.name;
    n.inputs = {prev};
    n.outputs = {i + 1 == steps.size() ? std::string(kOutputName) : s.name};
    switch (s.kind) {
      case Step::Kind::Conv:
        n.op_type = "Conv";
        n.inputs.push_back(add_init(s.name + ".weight"));
        n.inputs.push_back(add_init(s.name + ".bias"));
        n.attributes = {ints_attr("kernel_shape", {s.kernel, s.kernel}), ints_attr("pads", {s.pad, s.pad, s.pad, s.pad}),
                        ints_attr("strides", {1, 1}), ints_attr("dilations", {1, 1}), int_attr("group", 1)};
        break;
      case Step::Kind::BatchNorm:
        n.op_type = "BatchNormalization";
        for (const char* p : {".weight", ".bias", ".running_mean", ".running_var"}) n.inputs.push_back(add_init(s.name + p));
        n.attributes = {{"epsilon", OnnxAttribute::Kind::Float, {}, s.eps}};
        break;
      case Step::Kind::MaxPool2x2:
        n.op_type = "MaxPool";
        n.attributes = {ints_attr("kernel_shape", {2, 2}), ints_attr("strides", {2, 2})};
        break;
      case Step::Kind::Relu: n.op_type = "Relu"; break;
      case Step::Kind::Flatten:
        n.op_type = "Flatten";
        n.attributes = {int_attr("axis", 1)};
        break;
      case Step::Kind::Linear:
        n.op_type = "Gemm";
        n.inputs.push_back(add_init(s.name + ".weight"));
        n.inputs.push_back(add_init(s.name + ".bias"));
        n.attributes = {int_attr("transB", 1)};
        break;
    }
    g.nodes.push_back(std::move(n));
    prev = g.nodes.back().outputs[0];
  }
  return g;
}

std::vector<Step> from_onnx(const OnnxGraph& g, StateDict& state, const std::string& origin) {
  std::map<std::string, const OnnxInitializer*> inits;
  for (const OnnxInitializer& i : g.initializers) inits[i.name] = &i;
  std::vector<Step> steps;
  std::string prev = g.input_name;
  const auto unsupported = [&](const OnnxNode& n, const std::string& why) {
    return ExportError(origin + ": node " + n.name + " (" + n.op_type + "): " + why +
                       "; the engine runs the graphs it exports");
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const OnnxNode& n = g.nodes[i];
    if (n.inputs.empty() || n.inputs[0] != prev || n.outputs.size() != 1)
      throw unsupported(n, "not a chain from the graph's input");
    Step s;
    s.name = n.name.empty() ? "node" + std::to_string(i) : n.name;
    const auto param = [&](size_t input, const std::string& role, const std::vector<int64_t>& dims) {
      if (n.inputs.size() <= input) throw unsupported(n, "input " + role + " missing");
      const auto it = inits.find(n.inputs[input]);
      if (it == inits.end()) throw unsupported(n, "input " + role + " is not an initializer");
      if (!dims.empty() && it->second->dims != dims)
        throw unsupported(n, "initializer " + it->second->name + " has dims " + shape_str(it->second->dims) +
                                 ", expected " + shape_str(dims));
      state.tensors[s.name + "." + role] = Tensor::from_vector(it->second->dims, it->second->values);
      return it->second->dims;
    };
    if (n.op_type == "Conv") {
      if (n.inputs.size() != 3) throw unsupported(n, "needs a bias input");
      const std::vector<int64_t> wd = param(1, "weight", {});
      if (wd.size() != 4 || wd[2] != wd[3] || wd[0] <= 0 || wd[1] <= 0 || wd[2] <= 0 || wd[0] > (1 << 20) ||
          wd[1] > (1 << 20) || wd[2] > 64)
        throw unsupported(n, "weight dims " + shape_str(wd) + " are not [out, in, k, k]");
      s.kind = Step::Kind::Conv, s.out = static_cast<int>(wd[0]), s.in = static_cast<int>(wd[1]),
      s.kernel = static_cast<int>(wd[2]);
      param(2, "bias", {wd[0]});
      const std::vector<int64_t> pads = attr_ints(n, "pads", {0, 0, 0, 0}, origin);
      if (pads.size() != 4 || pads[0] != pads[1] || pads[0] != pads[2] || pads[0] != pads[3] || pads[0] < 0 ||
          pads[0] >= s.kernel)
        throw unsupported(n, "pads are not equal on all sides");
      s.pad = static_cast<int>(pads[0]);
      if (attr_ints(n, "strides", {1, 1}, origin) != std::vector<int64_t>{1, 1} ||
          attr_ints(n, "dilations", {1, 1}, origin) != std::vector<int64_t>{1, 1} ||
          attr_ints(n, "group", {1}, origin) != std::vector<int64_t>{1} ||
          attr_ints(n, "kernel_shape", {wd[2], wd[3]}, origin) != std::vector<int64_t>{wd[2], wd[3]} || n.attribute("auto_pad"))
        throw unsupported(n, "strides, dilations, groups or auto_pad other than the engine's");
    } else if (n.op_type == "BatchNormalization") {
      if (n.inputs.size() != 5 || n.outputs.size() != 1) throw unsupported(n, "needs scale, bias, mean and var");
      const std::vector<int64_t> cd = param(1, "weight", {});
      if (cd.size() != 1 || cd[0] <= 0 || cd[0] > (1 << 20)) throw unsupported(n, "scale is not [channels]");
      param(2, "bias", cd), param(3, "running_mean", cd), param(4, "running_var", cd);
      state.scalars[s.name + ".num_batches_tracked"] = int64_t{0};
      s.kind = Step::Kind::BatchNorm, s.in = s.out = static_cast<int>(cd[0]);
      const OnnxAttribute* eps = n.attribute("epsilon");
      s.eps = eps && eps->kind == OnnxAttribute::Kind::Float ? eps->f : 1e-5f;
      if (!(s.eps > 0)) throw unsupported(n, "epsilon is not positive");
    } else if (n.op_type == "MaxPool") {
      if (attr_ints(n, "kernel_shape", {}, origin) != std::vector<int64_t>{2, 2} ||
          attr_ints(n, "strides", {1, 1}, origin) != std::vector<int64_t>{2, 2} ||
          attr_ints(n, "pads", {0, 0, 0, 0}, origin) != std::vector<int64_t>{0, 0, 0, 0} ||
          attr_ints(n, "dilations", {1, 1}, origin) != std::vector<int64_t>{1, 1} ||
          attr_ints(n, "ceil_mode", {0}, origin) != std::vector<int64_t>{0} || n.attribute("auto_pad") ||
          n.attribute("storage_order"))
        throw unsupported(n, "not a 2x2 pooling of stride 2");
      s.kind = Step::Kind::MaxPool2x2;
    } else if (n.op_type == "Relu") {
      s.kind = Step::Kind::Relu;
    } else if (n.op_type == "Flatten") {
      if (attr_ints(n, "axis", {1}, origin) != std::vector<int64_t>{1}) throw unsupported(n, "axis is not 1");
      s.kind = Step::Kind::Flatten;
    } else if (n.op_type == "Gemm") {
      if (n.inputs.size() != 3) throw unsupported(n, "needs a bias input");
      if (attr_ints(n, "transB", {0}, origin) != std::vector<int64_t>{1} ||
          attr_ints(n, "transA", {0}, origin) != std::vector<int64_t>{0} ||
          (n.attribute("alpha") && n.attribute("alpha")->f != 1.0f) || (n.attribute("beta") && n.attribute("beta")->f != 1.0f))
        throw unsupported(n, "not x W^T + b");
      const std::vector<int64_t> wd = param(1, "weight", {});
      if (wd.size() != 2 || wd[0] <= 0 || wd[1] <= 0 || wd[0] > (1 << 24) || wd[1] > (1 << 24))
        throw unsupported(n, "weight is not [out, in]");
      param(2, "bias", {wd[0]});
      s.kind = Step::Kind::Linear, s.out = static_cast<int>(wd[0]), s.in = static_cast<int>(wd[1]);
    } else {
      throw unsupported(n, "an op the engine does not export");
    }
    steps.push_back(s);
    prev = n.outputs[0];
  }
  if (prev != g.output_name) throw ExportError(origin + ": the node chain does not end at the graph's output");
  return steps;
}

}  // namespace export_internal
}  // namespace engine
