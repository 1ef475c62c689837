// The op facade's preconditions (engine/core/dispatch.h, OpChecks): a tt:: call with a
// tensor of the wrong size, dtype or device, or a shape an op cannot take, is refused
// before any kernel runs, in one line that names the op, the layer and the tensor, and
// leaves its outputs untouched. And the op tables (kernels/op_table.h) hold the list.
#include <doctest/doctest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "core/tensor_ops.h"
#include "kernels/op_table.h"
#include "support/error_text.h"

using namespace engine;
using test_support::error_of;

namespace {

Tensor filled(const Shape& shape, float v, DType dtype = DType::F32) {
  Tensor t = Tensor::zeros(shape, dtype);
  if (dtype == DType::F32)
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = v;
  return t;
}

bool one_line(const std::string& s) { return s.find('\n') == std::string::npos; }

}  // namespace

TEST_CASE("a conv weight of the wrong size is refused, naming the op, the layer and the tensor") {
  const std::string layer = "conv1";
  const tt::BatchCompute how{nullptr, Precision::Fp32, layer};
  const tt::ConvShape s{2, 1, 6, 6, 4, 3, 3, 1};  // weights 4*1*3*3 = 36
  const Tensor x = filled({2, 1, 6, 6}, 1.0f), b = filled({4}, 0.0f);
  Tensor y = filled({2, 4, 6, 6}, 7.0f);
  const Tensor w_short = filled({4, 1, 2, 3}, 0.5f);  // 24 elements
  const std::string e = error_of([&] { tt::conv2d_forward(how, s, x, w_short, b, y); });
  CHECK(e == "tt::conv2d_forward (conv1): w is float32[24] on cpu, the op needs float32[36] on cpu");
  CHECK(y.f32()[0] == 7.0f);  // nothing ran

  // The same call with every tensor right runs.
  const Tensor w = filled({4, 1, 3, 3}, 0.5f);
  CHECK(error_of([&] { tt::conv2d_forward(how, s, x, w, b, y); }) == "NO ERROR");
  CHECK(y.f32()[0] != 7.0f);

  // A bias is optional; a bias of the wrong length is not.
  CHECK(error_of([&] { tt::conv2d_forward(how, s, x, w, Tensor(), y); }) == "NO ERROR");
  const Tensor b_long = filled({5}, 0.0f);
  CHECK(error_of([&] { tt::conv2d_forward(how, s, x, w, b_long, y); }) ==
        "tt::conv2d_forward (conv1): b is float32[5] on cpu, the op needs float32[4] on cpu");
  // An output too small for the batch.
  Tensor y_small = filled({1, 4, 6, 6}, 0.0f);
  CHECK(error_of([&] { tt::conv2d_forward(how, s, x, w, b, y_small); }) ==
        "tt::conv2d_forward (conv1): y is float32[144] on cpu, the op needs float32[288] on cpu");
  // A kernel larger than the padded input.
  const tt::ConvShape too_big{2, 1, 2, 2, 4, 5, 5, 0};
  const std::string e2 = error_of([&] { tt::conv2d_forward(how, too_big, x, w, b, y); });
  CHECK(e2.rfind("tt::conv2d_forward (conv1): needs ", 0) == 0);
  CHECK(one_line(e2));
}

TEST_CASE("a missing tensor, a wrong dtype and an odd pooling shape are refused in one line") {
  const std::string layer = "fc1";
  const tt::BatchCompute how{nullptr, Precision::Fp32, layer};
  const tt::LinearShape s{3, 5, 2};
  const Tensor w = filled({2, 5}, 0.1f), b = filled({2}, 0.0f);
  Tensor y = filled({3, 2}, 0.0f);
  CHECK(error_of([&] { tt::linear_forward(how, s, Tensor(), w, b, y); }) ==
        "tt::linear_forward (fc1): x is missing (no tensor)");

  const Tensor x_int = filled({3, 5}, 0.0f, DType::I32);
  CHECK(error_of([&] { tt::linear_forward(how, s, x_int, w, b, y); }) ==
        "tt::linear_forward (fc1): x is int32[15] on cpu, the op needs float32[15] on cpu");

  // Backward: the weight gradient is checked as the weight is; dx only when wanted.
  const Tensor x = filled({3, 5}, 1.0f), dy = filled({3, 2}, 1.0f);
  Tensor dw = filled({2, 5}, 0.0f), db = filled({2}, 0.0f), dx_wrong = filled({3, 4}, 0.0f);
  CHECK(error_of([&] { tt::linear_backward(how, s, x, w, dy, &dx_wrong, dw, db); }) ==
        "tt::linear_backward (fc1): dx is float32[12] on cpu, the op needs float32[15] on cpu");
  CHECK(error_of([&] { tt::linear_backward(how, s, x, w, dy, nullptr, dw, db); }) == "NO ERROR");

  const tt::PoolShape odd{1, 1, 5, 4};
  const Tensor px = filled({1, 1, 5, 4}, 1.0f);
  Tensor py = filled({1, 1, 2, 2}, 0.0f), arg = filled({1, 1, 2, 2}, 0.0f, DType::I32);
  CHECK(error_of([&] { tt::maxpool2x2_forward(odd, px, py, arg); }) == "tt::maxpool2x2_forward: needs H and W even");

  Tensor relu_out = filled({7}, 0.0f);
  const Tensor relu_in = filled({8}, 1.0f);
  CHECK(error_of([&] { tt::relu_forward(relu_in, relu_out); }) ==
        "tt::relu_forward: y is float32[7] on cpu, the op needs float32[8] on cpu");
}

TEST_CASE("ops over a range of a tensor need the range inside it") {
  const Tensor logits = filled({4, 3}, 0.0f), labels = filled({4}, 0.0f, DType::I32);
  Tensor loss = filled({10}, 0.0f), correct = filled({10}, 0.0f);
  // The range starts at a per-step value; the check reads the value the upload sent.
  StepValues at8, at6, at0;
  at8.scalars.sample_first = 8;
  at6.scalars.sample_first = 6;
  for (StepValues* v : {&at8, &at6, &at0}) v->upload(Device::cpu());
  CHECK(error_of([&] { tt::cross_entropy(logits, labels, 4, at8.loss_scale(), nullptr, loss, correct, at8.sample_first()); }) ==
        "tt::cross_entropy: sample_loss is float32[10] on cpu, the op needs float32[at least 12] on cpu");
  CHECK(error_of([&] { tt::cross_entropy(logits, labels, 4, at6.loss_scale(), nullptr, loss, correct, at6.sample_first()); }) == "NO ERROR");
  const Tensor short_labels = filled({3}, 0.0f, DType::I32);
  CHECK(error_of([&] { tt::cross_entropy(logits, short_labels, 4, at0.loss_scale(), nullptr, loss, correct, at0.sample_first()); }) ==
        "tt::cross_entropy: labels is int32[3] on cpu, the op needs int32[at least 4] on cpu");
  // A per-step value that is not there is refused before the kernel runs.
  Tensor dlogits = filled({4, 3}, 0.0f);
  CHECK(error_of([&] { tt::cross_entropy(logits, labels, 4, DeviceValue<float>{}, &dlogits, loss, correct, at0.sample_first()); }) ==
        "tt::cross_entropy: grad_scale is missing (no value in device memory)");
  CHECK(error_of([&] { tt::cross_entropy(logits, labels, 4, at0.loss_scale(), nullptr, loss, correct, DeviceValue<int64_t>{}); }) ==
        "tt::cross_entropy: first is missing (no value in device memory)");

  const Tensor x = filled({10}, 1.0f);
  CHECK(error_of([&] { tt::reduce_sum(x, 4, 7); }) ==
        "tt::reduce_sum: x is float32[10] on cpu, the op needs float32[at least 11] on cpu");
  CHECK(tt::reduce_sum(x, 4, 6) == 6.0);

  // The loss scaler's state is one kernels::LossScaleState, as bytes.
  Tensor grad = filled({5}, 1.0f), short_state = filled({8}, 0.0f, DType::U8);
  const std::string need = std::to_string(sizeof(kernels::LossScaleState));
  CHECK(error_of([&] { tt::unscale_check(grad, short_state); }) ==
        "tt::unscale_check: scaler_state is uint8[8] on cpu, the op needs uint8[" + need + "] on cpu");
  CHECK(error_of([&] { tt::loss_scale_update(short_state, kernels::LossScaleRule{}); }) ==
        "tt::loss_scale_update: scaler_state is uint8[8] on cpu, the op needs uint8[" + need + "] on cpu");
}

TEST_CASE("batch norm checks its per-channel tensors against the shape") {
  const std::string layer = "bn1";
  const tt::BatchCompute how{nullptr, Precision::Fp32, layer};
  const tt::BatchNormShape s{2, 3, 4};
  const Tensor x = filled({2, 3, 2, 2}, 1.0f), gamma = filled({3}, 1.0f), beta = filled({3}, 0.0f);
  Tensor rm = filled({3}, 0.0f), rv = filled({3}, 1.0f), sm = filled({3}, 0.0f), si = filled({3}, 0.0f);
  Tensor y = filled({2, 3, 2, 2}, 0.0f);
  const Tensor gamma_short = filled({2}, 1.0f);
  CHECK(error_of([&] { tt::batchnorm_forward_train(how, s, x, gamma_short, beta, 1e-5f, 0.1f, rm, rv, sm, si, y); }) ==
        "tt::batchnorm_forward_train (bn1): gamma is float32[2] on cpu, the op needs float32[3] on cpu");
  CHECK(rv.f32()[0] == 1.0f);  // the running statistics are untouched
  CHECK(error_of([&] { tt::batchnorm_forward_train(how, s, x, gamma, beta, 1e-5f, 0.1f, rm, rv, sm, si, y); }) ==
        "NO ERROR");
  CHECK(error_of([&] { tt::batchnorm_forward_eval(s, x, gamma, beta, rm, rv, 1e-5f, si); }) ==
        "tt::batchnorm_forward_eval: y is float32[3] on cpu, the op needs float32[24] on cpu");
}

TEST_CASE("tensors on two devices are refused") {
  if (cuda_device_count() == 0) {
    MESSAGE("no CUDA GPU: the device check is exercised on a GPU machine only");
    return;
  }
  const Tensor x = filled({8}, 1.0f);
  Tensor y = Tensor::zeros({8}, DType::F32, Device::cuda());
  CHECK(error_of([&] { tt::relu_forward(x, y); }) ==
        "tt::relu_forward: y is float32[8] on cuda:0, the op needs float32[8] on cpu");
}

TEST_CASE("the op tables hold every op of the list, once") {
  using namespace engine::kernels;
  std::set<std::string> names;
  for (const OpInfo& op : kOps) names.insert(op.name);
  CHECK(names.size() == kOpCount);
  // An entry per op, after the name and the supports function.
  CHECK(kOpCount == (sizeof(OpTable) - sizeof(const char*)) / sizeof(void (*)()) - 1);
  CHECK(std::string(cpu_ops().backend) == "cpu");
  CHECK(std::string(cuda_ops().backend) == "cuda");
  // The CPU's table says which ops it lacks rather than running something else.
  for (const OpInfo& op : kOps) {
    CAPTURE(op.name);
    CHECK((op.backends != OpBackends::Every) == (std::strncmp(op.name, "tree_sum_parts", 14) == 0));
    // Every backend runs every op it has in fp32; only the AnyPrecision ops take fp16 or bf16.
    const OpId id = static_cast<OpId>(&op - kOps);
    CHECK(cpu_op_supports(id, engine::Precision::Fp32) == (op.backends == OpBackends::Every));
    CHECK(cuda_op_supports(id, engine::Precision::Fp32));
    CHECK(cuda_op_supports(id, engine::Precision::Fp16) == (op.precisions == OpPrecisions::AnyPrecision));
    CHECK_FALSE(cpu_op_supports(id, engine::Precision::Bf16));
  }
  float out[2] = {0, 0};
  const float parts[2] = {1, 2};
  CHECK(error_of([&] { cpu_ops().tree_sum_parts(1, 2, parts, out); }) ==
        "kernels: tree_sum_parts has no CPU backend (it is CUDA only)");
  // The CPU's table runs the CPU's op.
  const float x[3] = {-1.0f, 2.0f, -0.0f};
  float y[3];
  cpu_ops().relu_forward(3, x, y);
  CHECK(y[0] == 0.0f);
  CHECK(y[1] == 2.0f);
}
