// Private to the export (engine/train/export*.cpp): the error-bound analysis that gives
// each probe logit its tolerance.
#pragma once
#include <vector>

#include "engine/core/image_shape.h"
#include "engine/core/state.h"
#include "train/export_steps.h"

namespace engine {
namespace export_internal {

// Per probe and logit: the tolerance between two float32 evaluations (twice the bound).
// `inputs` are the probe images, row-major [probes, C, H, W]; `state` holds the steps' parameters.
std::vector<float> probe_tolerances(const std::vector<Step>& steps, const StateDict& state, const ImageShape& shape,
                                    const std::vector<float>& inputs, int probes);

}  // namespace export_internal
}  // namespace engine
