#include "engine/train/export.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/core/build_info.h"
#include "engine/io/checkpoint.h"
#include "engine/io/dataset.h"
#include "engine/kernels/philox.h"
#include "engine/nn/models/registry.h"
#include "engine/train/config.h"
#include "engine/train/inference.h"
#include "engine/train/model_factory.h"
#include "io/atomic_file.h"
#include "io/crc32.h"
#include "io/onnx_file.h"
#include "io/read_file.h"
#include "io/safetensors.h"
#include "kernels/elementwise.h"

namespace engine {

const char* to_string(ExportFormat f) { return f == ExportFormat::Onnx ? "onnx" : "safetensors"; }

ExportFormat parse_export_format(const std::string& text) {
  if (text == "onnx") return ExportFormat::Onnx;
  if (text == "safetensors") return ExportFormat::Safetensors;
  throw std::invalid_argument("unknown export format '" + text + "' (onnx, safetensors)");
}

namespace {

constexpr const char* kInputName = "input";
constexpr const char* kOutputName = "logits";
constexpr const char* kExportFormatTag = "engine-export";
constexpr const char* kExportFormatVersion = "1";

// ---- the model as a chain of inference steps ------------------------------------------

// What an exported graph is made of: the inference view of the engine's layers (Dropout
// is the identity at inference and leaves no step).
struct Step {
  enum class Kind { Conv, BatchNorm, MaxPool2x2, Relu, Flatten, Linear };
  Kind kind = Kind::Relu;
  std::string name;  // the layer's name: its parameters are "<name>.weight", ...
  int in = 0, out = 0, kernel = 0, pad = 0;
  float eps = 0;
};

std::vector<Step> describe(const Model& model) {
  const auto* seq = dynamic_cast<const SequentialModel*>(&model);
  if (!seq) throw ExportError("model " + model.name() + " is not a chain of layers; only those export");
  std::vector<Step> steps;
  for (const Layer* layer : seq->layers()) {
    Step s;
    s.name = layer->name();
    if (const auto* c = dynamic_cast<const Conv2d*>(layer)) {
      s.kind = Step::Kind::Conv, s.in = c->in_channels(), s.out = c->out_channels(), s.kernel = c->kernel(),
      s.pad = c->pad();
    } else if (const auto* b = dynamic_cast<const BatchNorm2d*>(layer)) {
      s.kind = Step::Kind::BatchNorm, s.in = s.out = b->channels(), s.eps = b->eps();
    } else if (dynamic_cast<const MaxPool2x2*>(layer)) {
      s.kind = Step::Kind::MaxPool2x2;
    } else if (dynamic_cast<const ReLU*>(layer)) {
      s.kind = Step::Kind::Relu;
    } else if (dynamic_cast<const Flatten*>(layer)) {
      s.kind = Step::Kind::Flatten;
    } else if (const auto* l = dynamic_cast<const Linear*>(layer)) {
      s.kind = Step::Kind::Linear, s.in = l->in_features(), s.out = l->out_features();
    } else if (dynamic_cast<const Dropout*>(layer)) {
      continue;
    } else {
      throw ExportError("model " + model.name() + ": layer " + layer->name() + " has no export");
    }
    steps.push_back(s);
  }
  return steps;
}

// A model rebuilt from steps (what an ONNX file describes), run by the engine's layers.
class LayerChain : public SequentialModel {
 public:
  LayerChain(std::string name, ImageShape input, int classes, std::vector<Step> steps)
      : name_(std::move(name)), input_(input), classes_(classes), steps_(std::move(steps)) {
    std::vector<Layer*> chain;
    for (const Step& s : steps_) {
      switch (s.kind) {
        case Step::Kind::Conv: owned_.push_back(std::make_unique<Conv2d>(s.name, s.in, s.out, s.kernel, s.pad)); break;
        case Step::Kind::BatchNorm: owned_.push_back(std::make_unique<BatchNorm2d>(s.name, s.in, s.eps)); break;
        case Step::Kind::MaxPool2x2: owned_.push_back(std::make_unique<MaxPool2x2>(s.name)); break;
        case Step::Kind::Relu: owned_.push_back(std::make_unique<ReLU>(s.name)); break;
        case Step::Kind::Flatten: owned_.push_back(std::make_unique<Flatten>(s.name)); break;
        case Step::Kind::Linear: owned_.push_back(std::make_unique<Linear>(s.name, s.in, s.out)); break;
      }
      chain.push_back(owned_.back().get());
    }
    set_layers(chain);
  }
  std::string name() const override { return name_; }
  ImageShape input_shape() const override { return input_; }
  int num_classes() const override { return classes_; }
  void reset_parameters(Rng&) override {}  // the parameters come from the file
  void set_precision(Precision) override {}
  std::unique_ptr<Model> new_instance() const override {
    return std::make_unique<LayerChain>(name_, input_, classes_, steps_);
  }

 private:
  std::string name_;
  ImageShape input_;
  int classes_;
  std::vector<Step> steps_;
  std::vector<std::unique_ptr<Layer>> owned_;
};

// ---- the tolerance ----------------------------------------------------------------------
//
// Any float32 evaluation of the graph, whatever its summation order, lies within a bound
// of the exact (real-number) value. For a dot product of K terms plus a bias computed in
// any order (with or without FMA), |fl(s) - s| <= gamma(K+1) * (sum |w||x| + |b|), with
// gamma(n) = n u / (1 - n u), u = 2^-24 (Higham, "Accuracy and Stability of Numerical
// Algorithms", 3.1). An input already off by e adds sum |w| e. Batch norm in any of its
// forms (scale and shift computed separately, or folded into the convolution's weights
// and bias by a runtime) adds at most kBatchNormUlps u relative to its terms; max pool
// and ReLU pass the bound through unchanged. The bound is carried through the graph in
// double precision next to the exact values, per probe and per logit. Two evaluations
// (the engine's and a consumer's) then differ by at most twice it: the tolerance.
constexpr double kUnitRoundoff = 1.0 / 16777216.0;  // 2^-24
// sqrt, the division by it, the product with gamma, the subtraction of the mean, the
// product and the shift: six roundings, two more for a runtime that folds the scale into
// the convolution's weights and bias, each at most u relative.
constexpr double kBatchNormUlps = 8;

double gamma_n(int64_t n) {
  const double nu = static_cast<double>(n) * kUnitRoundoff;
  return nu / (1 - nu);
}

// Activations of one probe: exact values (double) and their error bounds.
struct Bounded {
  std::vector<double> value, err;
  int64_t c = 0, h = 0, w = 0;  // c features when h = w = 1
};

std::vector<double> host_doubles(const Tensor& t) {
  const std::vector<float> f = t.to_vector();
  return std::vector<double>(f.begin(), f.end());
}

Bounded bound_step(const Step& s, const Bounded& in, const StateDict& state) {
  Bounded out;
  switch (s.kind) {
    case Step::Kind::Conv: {
      const std::vector<double> w = host_doubles(state.get_tensor(s.name + ".weight"));
      const std::vector<double> b = host_doubles(state.get_tensor(s.name + ".bias"));
      const int64_t k = s.kernel, H = in.h, W = in.w;
      const int64_t oh = H + 2 * s.pad - k + 1, ow = W + 2 * s.pad - k + 1;
      out.c = s.out, out.h = oh, out.w = ow;
      out.value.assign(static_cast<size_t>(out.c * oh * ow), 0);
      out.err.assign(out.value.size(), 0);
      const double g = gamma_n(static_cast<int64_t>(s.in) * k * k + 1);
      for (int64_t o = 0; o < out.c; ++o)
        for (int64_t y = 0; y < oh; ++y)
          for (int64_t x = 0; x < ow; ++x) {
            double sum = b[static_cast<size_t>(o)], mag = std::fabs(sum), prop = 0;
            for (int64_t c = 0; c < s.in; ++c)
              for (int64_t ky = 0; ky < k; ++ky) {
                const int64_t iy = y + ky - s.pad;
                if (iy < 0 || iy >= H) continue;
                for (int64_t kx = 0; kx < k; ++kx) {
                  const int64_t ix = x + kx - s.pad;
                  if (ix < 0 || ix >= W) continue;
                  const double wv = w[static_cast<size_t>(((o * s.in + c) * k + ky) * k + kx)];
                  const size_t i = static_cast<size_t>((c * H + iy) * W + ix);
                  sum += wv * in.value[i];
                  mag += std::fabs(wv) * (std::fabs(in.value[i]) + in.err[i]);
                  prop += std::fabs(wv) * in.err[i];
                }
              }
            const size_t j = static_cast<size_t>((o * oh + y) * ow + x);
            out.value[j] = sum;
            out.err[j] = prop + g * mag;
          }
      return out;
    }
    case Step::Kind::BatchNorm: {
      const std::vector<double> gamma = host_doubles(state.get_tensor(s.name + ".weight"));
      const std::vector<double> beta = host_doubles(state.get_tensor(s.name + ".bias"));
      const std::vector<double> mean = host_doubles(state.get_tensor(s.name + ".running_mean"));
      const std::vector<double> var = host_doubles(state.get_tensor(s.name + ".running_var"));
      out = in;
      const int64_t plane = in.h * in.w;
      for (int64_t c = 0; c < in.c; ++c) {
        const size_t ci = static_cast<size_t>(c);
        const double scale = gamma[ci] / std::sqrt(var[ci] + static_cast<double>(static_cast<float>(s.eps)));
        for (int64_t i = 0; i < plane; ++i) {
          const size_t j = static_cast<size_t>(c * plane + i);
          const double y = in.value[j];
          out.value[j] = (y - mean[ci]) * scale + beta[ci];
          out.err[j] = std::fabs(scale) * in.err[j] +
                       kBatchNormUlps * kUnitRoundoff *
                           (std::fabs(scale) * (std::fabs(y) + in.err[j] + std::fabs(mean[ci])) + std::fabs(beta[ci]));
        }
      }
      return out;
    }
    case Step::Kind::MaxPool2x2: {
      out.c = in.c, out.h = in.h / 2, out.w = in.w / 2;
      out.value.resize(static_cast<size_t>(out.c * out.h * out.w));
      out.err.resize(out.value.size());
      for (int64_t c = 0; c < out.c; ++c)
        for (int64_t y = 0; y < out.h; ++y)
          for (int64_t x = 0; x < out.w; ++x) {
            double v = -INFINITY, e = 0;
            for (int64_t dy = 0; dy < 2; ++dy)
              for (int64_t dx = 0; dx < 2; ++dx) {
                const size_t i = static_cast<size_t>((c * in.h + 2 * y + dy) * in.w + 2 * x + dx);
                v = std::max(v, in.value[i]);
                e = std::max(e, in.err[i]);
              }
            const size_t j = static_cast<size_t>((c * out.h + y) * out.w + x);
            out.value[j] = v;
            out.err[j] = e;  // max is 1-Lipschitz in the largest input error
          }
      return out;
    }
    case Step::Kind::Relu:
      out = in;
      for (double& v : out.value) v = std::max(v, 0.0);
      return out;
    case Step::Kind::Flatten:
      out = in;
      out.c = in.c * in.h * in.w, out.h = out.w = 1;
      return out;
    case Step::Kind::Linear: {
      const std::vector<double> w = host_doubles(state.get_tensor(s.name + ".weight"));
      const std::vector<double> b = host_doubles(state.get_tensor(s.name + ".bias"));
      if (in.c * in.h * in.w != s.in) throw ExportError("layer " + s.name + ": input size mismatch");
      out.c = s.out, out.h = out.w = 1;
      out.value.resize(static_cast<size_t>(s.out));
      out.err.resize(static_cast<size_t>(s.out));
      const double g = gamma_n(static_cast<int64_t>(s.in) + 1);
      for (int64_t o = 0; o < s.out; ++o) {
        double sum = b[static_cast<size_t>(o)], mag = std::fabs(sum), prop = 0;
        for (int64_t i = 0; i < s.in; ++i) {
          const double wv = w[static_cast<size_t>(o * s.in + i)];
          const size_t ii = static_cast<size_t>(i);
          sum += wv * in.value[ii];
          mag += std::fabs(wv) * (std::fabs(in.value[ii]) + in.err[ii]);
          prop += std::fabs(wv) * in.err[ii];
        }
        out.value[static_cast<size_t>(o)] = sum;
        out.err[static_cast<size_t>(o)] = prop + g * mag;
      }
      return out;
    }
  }
  throw std::logic_error("bound_step: unknown step");
}

// Per probe and logit: the tolerance between two float32 evaluations (twice the bound).
std::vector<float> probe_tolerances(const std::vector<Step>& steps, const StateDict& state, const ImageShape& shape,
                                    const std::vector<float>& inputs, int probes) {
  std::vector<float> tol;
  const int64_t numel = shape.numel();
  for (int p = 0; p < probes; ++p) {
    Bounded a;
    a.c = shape.channels, a.h = shape.height, a.w = shape.width;
    a.value.assign(inputs.begin() + p * numel, inputs.begin() + (p + 1) * numel);
    a.err.assign(static_cast<size_t>(numel), 0.0);  // the stored float32 input is exact
    for (const Step& s : steps) a = bound_step(s, a, state);
    for (const double e : a.err) {
      // Rounded up to float32, so the stored tolerance is never below the bound.
      float t = static_cast<float>(2 * e);
      if (static_cast<double>(t) < 2 * e) t = std::nextafter(t, INFINITY);
      tol.push_back(t);
    }
  }
  return tol;
}

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

std::vector<float> run_probes(Model& model, const ImageShape& shape, const std::vector<float>& inputs, int probes) {
  const Tensor x = Tensor::from_vector({probes, shape.channels, shape.height, shape.width}, inputs);
  Rng unused(0);  // eval mode draws nothing
  return model.forward(x, Mode::Eval, unused).to_vector();
}

// ---- metadata text ----------------------------------------------------------------------

const char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64_floats(const std::vector<float>& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());  // little-endian float32
  const size_t n = v.size() * sizeof(float);
  std::string out;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t chunk = static_cast<uint32_t>(p[i]) << 16;
    if (i + 1 < n) chunk |= static_cast<uint32_t>(p[i + 1]) << 8;
    if (i + 2 < n) chunk |= p[i + 2];
    out += kBase64[(chunk >> 18) & 63];
    out += kBase64[(chunk >> 12) & 63];
    out += i + 1 < n ? kBase64[(chunk >> 6) & 63] : '=';
    out += i + 2 < n ? kBase64[chunk & 63] : '=';
  }
  return out;
}

// Exactly `count` float32 values, or an ExportError naming the key.
std::vector<float> floats_from_base64(const std::string& text, size_t count, const std::string& origin,
                                      const std::string& key) {
  const auto fail = [&] {
    return ExportError(origin + ": metadata " + key + " is not base64 of " + std::to_string(count) + " float32 values");
  };
  if (text.size() % 4 != 0 || text.size() / 4 * 3 < count * 4 || text.size() / 4 * 3 > count * 4 + 2) throw fail();
  std::vector<unsigned char> bytes;
  bytes.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t chunk = 0;
    int pads = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      const char* at = c ? std::strchr(kBase64, c) : nullptr;
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        ++pads;
        chunk <<= 6;
        continue;
      }
      if (!at || pads) throw fail();
      chunk = (chunk << 6) | static_cast<uint32_t>(at - kBase64);
    }
    bytes.push_back(static_cast<unsigned char>(chunk >> 16));
    if (pads < 2) bytes.push_back(static_cast<unsigned char>(chunk >> 8));
    if (pads < 1) bytes.push_back(static_cast<unsigned char>(chunk));
  }
  if (bytes.size() != count * 4) throw fail();
  std::vector<float> v(count);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

std::string number_text(double v) {
  std::ostringstream o;
  o.precision(17);
  o << v;
  return o.str();
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

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

// ---- the state with PyTorch's names --------------------------------------------------------

SafetensorsContent to_safetensors(const StateDict& state) {
  SafetensorsContent c;
  for (const auto& [name, t] : state.tensors) {
    if (t.dtype() != DType::F32) throw ExportError("tensor " + name + " is not float32");
    const std::vector<float> v = t.to_vector();
    c.tensors[name] = safe_tensor_f32(t.shape(), v.data());
  }
  for (const auto& [name, s] : state.scalars) {
    // PyTorch keeps BatchNorm's num_batches_tracked as a 0-d int64 tensor.
    if (!std::holds_alternative<int64_t>(s)) throw ExportError("state entry " + name + " is not an int64 counter");
    c.tensors[name] = safe_tensor_i64_scalar(std::get<int64_t>(s));
  }
  return c;
}

StateDict state_from_safetensors(const SafetensorsContent& c, const std::string& origin) {
  StateDict d;
  for (const auto& [name, t] : c.tensors) {
    if (t.dtype == SafeDType::I64) {
      if (!t.shape.empty())
        throw ExportError(origin + ": tensor " + name + " is int64 of shape other than [] (only 0-d counters are)");
      d.scalars[name] = t.scalar_i64();
    } else {
      d.tensors[name] = Tensor::from_vector(t.shape, t.floats());
    }
  }
  return d;
}

// ---- ONNX: steps to nodes and back ----------------------------------------------------------

OnnxAttribute ints_attr(const std::string& name, std::vector<int64_t> v) {
  return {name, OnnxAttribute::Kind::Ints, std::move(v), 0};
}
OnnxAttribute int_attr(const std::string& name, int64_t v) { return {name, OnnxAttribute::Kind::Int, {v}, 0}; }

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

// The attribute's ints, or `fallback` when absent; refuses another kind.
std::vector<int64_t> attr_ints(const OnnxNode& n, const std::string& name, std::vector<int64_t> fallback,
                               const std::string& origin) {
  const OnnxAttribute* a = n.attribute(name);
  if (!a) return fallback;
  if (a->kind == OnnxAttribute::Kind::Float) throw ExportError(origin + ": node " + n.name + ": " + name + " is a float");
  return a->ints;
}

// The graph of an ONNX file as steps and a state, for the graphs the export writes: a
// chain from the input to the output of the six ops with the attributes it uses.
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

// The shapes through the chain: refuses a graph whose layers do not fit together
// before any layer runs.
// `max_elements` bounds every activation (per probe), so that a small file cannot make
// the engine allocate or compute without bound.
void check_chain(const std::vector<Step>& steps, const ImageShape& input, int classes, int64_t max_elements,
                 const std::string& origin) {
  int64_t c = input.channels, h = input.height, w = input.width;
  bool flat = false;
  for (const Step& s : steps) {
    if (c * h * w > max_elements)
      throw ExportError(origin + ": layer " + s.name + " takes " + std::to_string(c * h * w) +
                        " values per image, more than this file's size allows");
    const auto bad = [&](const std::string& why) { return ExportError(origin + ": layer " + s.name + ": " + why); };
    switch (s.kind) {
      case Step::Kind::Conv:
        if (flat || c != s.in) throw bad("takes " + std::to_string(s.in) + " channels, gets " + std::to_string(c));
        c = s.out, h = h + 2 * s.pad - s.kernel + 1, w = w + 2 * s.pad - s.kernel + 1;
        if (h <= 0 || w <= 0) throw bad("kernel larger than its input");
        break;
      case Step::Kind::BatchNorm:
        if (flat || c != s.in) throw bad("normalises " + std::to_string(s.in) + " channels, gets " + std::to_string(c));
        break;
      case Step::Kind::MaxPool2x2:
        if (flat || h % 2 || w % 2) throw bad("needs an even height and width");
        h /= 2, w /= 2;
        break;
      case Step::Kind::Relu: break;
      case Step::Kind::Flatten:
        c = c * h * w, h = w = 1, flat = true;
        break;
      case Step::Kind::Linear:
        if (!flat || c != s.in) throw bad("takes " + std::to_string(s.in) + " features, gets " + std::to_string(c * h * w));
        c = s.out;
        break;
    }
  }
  if (!flat || c != classes) throw ExportError(origin + ": the graph does not end in " + std::to_string(classes) + " logits");
}

std::string read_all(const std::string& path) {
  std::string bytes;
  if (const int err = read_whole_file(Env::posix(), path, bytes); err != 0)
    throw ExportError(path + ": cannot read (" + std::strerror(err) + ")");
  return bytes;
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

// ---- model.init_from --------------------------------------------------------------------------

StateDict load_safetensors_state(const std::string& path, const Model& model) {
  StateDict given;
  try {
    given = state_from_safetensors(read_safetensors_file(path), path);
  } catch (const SafetensorsError& e) {
    throw ExportError(e.what());
  }
  const StateReport r = compare_state(model.state(), given);
  if (!r.clean())
    throw ExportError(path + ": does not match model " + model.name() + " (model.init_from, strict): " + r.summary());
  return given;
}

}  // namespace engine
