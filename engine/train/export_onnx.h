// Private to the export (engine/train/export*.cpp): the chain of steps as an ONNX graph,
// and the graphs the export writes read back as steps.
#pragma once
#include <string>
#include <vector>

#include "engine/core/state.h"
#include "engine/nn/model.h"
#include "io/onnx_file.h"
#include "train/export_steps.h"

namespace engine {
namespace export_internal {

// The inference graph of `model` (its `steps`, their parameters from `state`).
OnnxGraph to_onnx(const Model& model, const std::vector<Step>& steps, const StateDict& state);

// The graph of an ONNX file as steps and a state, for the graphs the export writes: a
// chain from the input to the output of the six ops with the attributes it uses.
// The initializers go into `state`; throws ExportError, naming `origin`, for any other graph.
std::vector<Step> from_onnx(const OnnxGraph& g, StateDict& state, const std::string& origin);

}  // namespace export_internal
}  // namespace engine
