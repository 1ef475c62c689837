// The state as a safetensors file of PyTorch's state_dict (export_safetensors.h), and
// model.init_from's reading of one (load_safetensors_state, engine/train/export.h).
#include "train/export_safetensors.h"

#include <variant>
#include <vector>

#include "engine/train/export.h"

namespace engine {
namespace export_internal {

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

}  // namespace export_internal

// ---- model.init_from --------------------------------------------------------------------------

StateDict load_safetensors_state(const std::string& path, const Model& model) {
  StateDict given;
  try {
    given = export_internal::state_from_safetensors(read_safetensors_file(path), path);
  } catch (const SafetensorsError& e) {
    throw ExportError(e.what());
  }
  const StateReport r = compare_state(model.state(), given);
  if (!r.clean())
    throw ExportError(path + ": does not match model " + model.name() + " (model.init_from, strict): " + r.summary());
  return given;
}

}  // namespace engine
