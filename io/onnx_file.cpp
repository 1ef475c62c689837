#include "io/onnx_file.h"

#include <cerrno>
#include <cstring>

#include "engine/io/env.h"
#include "io/read_file.h"

#if ENGINE_WITH_ONNX
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>
#endif

namespace engine {

const OnnxAttribute* OnnxNode::attribute(const std::string& n) const {
  for (const OnnxAttribute& a : attributes)
    if (a.name == n) return &a;
  return nullptr;
}

namespace {

constexpr uint64_t kMaxElements = uint64_t{1} << 31;  // as the checkpoint loader (docs/security.md)
constexpr int kMaxRank = 8;

}  // namespace

#if ENGINE_WITH_ONNX

bool onnx_supported() { return true; }

namespace {

std::string first_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s.size() > 400 ? s.substr(0, 397) + "..." : s;
}

// The batch: dimension 0 of the input and the output, dynamic.
constexpr const char* kBatchDim = "batch";

void set_tensor_type(onnx::ValueInfoProto* v, const std::string& name, const std::vector<int64_t>& dims) {
  v->set_name(name);
  onnx::TypeProto_Tensor* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  onnx::TensorShapeProto* shape = t->mutable_shape();
  shape->add_dim()->set_dim_param(kBatchDim);
  for (const int64_t d : dims) shape->add_dim()->set_dim_value(d);
}

// The checker, then shape inference with node-level errors thrown.
void check(onnx::ModelProto& model) {
  onnx::checker::check_model(model);
  onnx::shape_inference::InferShapes(model, onnx::OpSchemaRegistry::Instance(),
                                     onnx::ShapeInferenceOptions(/*check_type=*/true, /*error_mode=*/1));
}

std::vector<int64_t> value_dims(const onnx::ValueInfoProto& v, const std::string& what, const std::string& origin) {
  if (!v.type().has_tensor_type() || v.type().tensor_type().elem_type() != onnx::TensorProto::FLOAT)
    throw OnnxError(origin + ": graph " + what + " '" + v.name() + "' is not a float32 tensor");
  const onnx::TensorShapeProto& s = v.type().tensor_type().shape();
  if (s.dim_size() < 1 || s.dim_size() > kMaxRank)
    throw OnnxError(origin + ": graph " + what + " '" + v.name() + "' has rank " + std::to_string(s.dim_size()));
  std::vector<int64_t> dims;
  for (int i = 1; i < s.dim_size(); ++i) {
    if (!s.dim(i).has_dim_value() || s.dim(i).dim_value() <= 0)
      throw OnnxError(origin + ": graph " + what + " '" + v.name() + "' dimension " + std::to_string(i) +
                      " is not a fixed positive size");
    dims.push_back(s.dim(i).dim_value());
  }
  return dims;
}

}  // namespace

std::string encode_onnx(const OnnxGraph& g) {
  onnx::ModelProto model;
  model.set_ir_version(onnx::IR_VERSION);
  model.set_producer_name("engine");
  model.set_producer_version(g.producer_version);
  onnx::OperatorSetIdProto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(g.opset);
  for (const auto& [key, value] : g.metadata) {
    onnx::StringStringEntryProto* p = model.add_metadata_props();
    p->set_key(key);
    p->set_value(value);
  }
  onnx::GraphProto* graph = model.mutable_graph();
  graph->set_name(g.graph_name);
  set_tensor_type(graph->add_input(), g.input_name, g.input_dims);
  set_tensor_type(graph->add_output(), g.output_name, g.output_dims);
  for (const OnnxInitializer& init : g.initializers) {
    onnx::TensorProto* t = graph->add_initializer();
    t->set_name(init.name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (const int64_t d : init.dims) t->add_dims(d);
    // raw_data is little-endian by the format's definition, as the host's floats are.
    t->set_raw_data(std::string(reinterpret_cast<const char*>(init.values.data()), init.values.size() * sizeof(float)));
  }
  for (const OnnxNode& n : g.nodes) {
    onnx::NodeProto* node = graph->add_node();
    node->set_op_type(n.op_type);
    node->set_name(n.name);
    for (const std::string& i : n.inputs) node->add_input(i);
    for (const std::string& o : n.outputs) node->add_output(o);
    for (const OnnxAttribute& a : n.attributes) {
      onnx::AttributeProto* attr = node->add_attribute();
      attr->set_name(a.name);
      switch (a.kind) {
        case OnnxAttribute::Kind::Int:
          attr->set_type(onnx::AttributeProto::INT);
          attr->set_i(a.ints.at(0));
          break;
        case OnnxAttribute::Kind::Ints:
          attr->set_type(onnx::AttributeProto::INTS);
          for (const int64_t v : a.ints) attr->add_ints(v);
          break;
        case OnnxAttribute::Kind::Float:
          attr->set_type(onnx::AttributeProto::FLOAT);
          attr->set_f(a.f);
          break;
      }
    }
  }
  try {
    check(model);
  } catch (const std::exception& e) {
    throw OnnxError("the ONNX checker refuses the exported graph: " + first_line(e.what()));
  }
  std::string out;
  if (!model.SerializeToString(&out)) throw OnnxError("the ONNX model could not be serialised");
  return out;
}

OnnxGraph decode_onnx(const unsigned char* data, std::size_t n, const std::string& origin) {
  const auto fail = [&](const std::string& why) { return OnnxError(origin + ": " + why); };
  if (n > static_cast<std::size_t>(INT32_MAX)) throw fail("larger than 2 GiB, the limit of a protobuf message");
  onnx::ModelProto model;
  if (!model.ParseFromArray(data, static_cast<int>(n)))
    throw fail("not an ONNX model (the protobuf message does not parse: truncated or damaged)");
  try {
    check(model);
  } catch (const std::exception& e) {
    throw fail("the ONNX checker refuses it: " + first_line(e.what()));
  }
  OnnxGraph g;
  for (const onnx::OperatorSetIdProto& o : model.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") g.opset = o.version();
  g.producer_version = model.producer_version();
  for (const onnx::StringStringEntryProto& p : model.metadata_props()) g.metadata[p.key()] = p.value();
  const onnx::GraphProto& graph = model.graph();
  g.graph_name = graph.name();
  if (graph.output_size() != 1) throw fail("the graph has " + std::to_string(graph.output_size()) + " outputs, not 1");
  // Initializers may also be listed as graph inputs (IR < 4 style); the data input is the other one.
  std::vector<const onnx::ValueInfoProto*> inputs;
  for (const onnx::ValueInfoProto& v : graph.input()) {
    bool is_initializer = false;
    for (const onnx::TensorProto& t : graph.initializer()) is_initializer |= t.name() == v.name();
    if (!is_initializer) inputs.push_back(&v);
  }
  if (inputs.size() != 1) throw fail("the graph has " + std::to_string(inputs.size()) + " data inputs, not 1");
  g.input_name = inputs[0]->name();
  g.input_dims = value_dims(*inputs[0], "input", origin);
  g.output_name = graph.output(0).name();
  g.output_dims = value_dims(graph.output(0), "output", origin);
  for (const onnx::TensorProto& t : graph.initializer()) {
    const std::string what = "initializer '" + first_line(t.name()) + "'";
    if (t.data_type() != onnx::TensorProto::FLOAT) throw fail(what + " is not float32");
    if (t.data_location() == onnx::TensorProto::EXTERNAL || t.external_data_size() > 0)
      throw fail(what + " keeps its data in an external file (an export is self-contained)");
    if (t.dims_size() > kMaxRank) throw fail(what + " has rank " + std::to_string(t.dims_size()));
    OnnxInitializer init;
    init.name = t.name();
    uint64_t numel = 1;
    for (const int64_t d : t.dims()) {
      if (d < 0 || (d != 0 && numel > kMaxElements / static_cast<uint64_t>(d)))
        throw fail(what + " has a negative dimension or more than 2^31 elements");
      numel *= static_cast<uint64_t>(d);
      init.dims.push_back(d);
    }
    if (t.has_raw_data()) {
      if (t.raw_data().size() != numel * sizeof(float) || t.float_data_size() != 0)
        throw fail(what + " holds " + std::to_string(t.raw_data().size()) + " bytes, its dims need " +
                   std::to_string(numel * sizeof(float)));
      init.values.resize(numel);
      std::memcpy(init.values.data(), t.raw_data().data(), t.raw_data().size());
    } else {
      if (static_cast<uint64_t>(t.float_data_size()) != numel)
        throw fail(what + " holds " + std::to_string(t.float_data_size()) + " values, its dims need " +
                   std::to_string(numel));
      init.values.assign(t.float_data().begin(), t.float_data().end());
    }
    g.initializers.push_back(std::move(init));
  }
  for (const onnx::NodeProto& n : graph.node()) {
    OnnxNode node;
    node.op_type = n.op_type();
    node.name = n.name();
    if (!n.domain().empty() && n.domain() != "ai.onnx")
      throw fail("node '" + first_line(n.name()) + "' is of domain '" + first_line(n.domain()) + "'");
    node.inputs.assign(n.input().begin(), n.input().end());
    node.outputs.assign(n.output().begin(), n.output().end());
    for (const onnx::AttributeProto& a : n.attribute()) {
      OnnxAttribute attr;
      attr.name = a.name();
      if (a.type() == onnx::AttributeProto::INT) {
        attr.kind = OnnxAttribute::Kind::Int;
        attr.ints = {a.i()};
      } else if (a.type() == onnx::AttributeProto::INTS) {
        attr.kind = OnnxAttribute::Kind::Ints;
        attr.ints.assign(a.ints().begin(), a.ints().end());
      } else if (a.type() == onnx::AttributeProto::FLOAT) {
        attr.kind = OnnxAttribute::Kind::Float;
        attr.f = a.f();
      } else {
        throw fail("node '" + first_line(n.name()) + "' attribute '" + first_line(a.name()) +
                   "' is of a kind the engine does not read");
      }
      node.attributes.push_back(std::move(attr));
    }
    g.nodes.push_back(std::move(node));
  }
  return g;
}

#else  // built without libonnx

bool onnx_supported() { return false; }

std::string encode_onnx(const OnnxGraph&) {
  throw OnnxError("this engine was built without ONNX support (install libonnx-dev and reconfigure)");
}

OnnxGraph decode_onnx(const unsigned char*, std::size_t, const std::string& origin) {
  throw OnnxError(origin + ": this engine was built without ONNX support (install libonnx-dev and reconfigure)");
}

#endif

OnnxGraph read_onnx_file(const std::string& path) {
  Env& env = Env::posix();
  FileInfo info;
  if (env.stat(path, info) != 0) throw OnnxError(path + ": " + std::strerror(errno));
  if (info.kind != FileKind::Regular) throw OnnxError(path + ": not a regular file");
  std::string bytes;
  if (const int err = read_whole_file(env, path, bytes); err != 0)
    throw OnnxError(path + ": cannot read (" + std::strerror(err) + ")");
  return decode_onnx(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), path);
}

}  // namespace engine
