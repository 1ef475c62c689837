// A recording backend (kernels/op_table.h, use_cpu_ops): a table generated from the op
// list that logs every op with its arguments and runs the CPU's op. With it, a CPU
// training step of the Fashion-MNIST CNN is written down op by op, and this test holds
// what the step costs and what changes from one step to the next:
//  * the ops a step launches, in order (docs/architecture.md, "A training step");
//  * the device work besides the ops (engine::device_activity: allocations, copies);
//  * the arguments that differ between two consecutive steps: each is a value that a
//    replayed CUDA graph would freeze, so each must reach the device by another way.
// Recording changes no bit: a traced trainer's state equals an untraced one's.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "run_dir_util.h"
#include "engine/core/device.h"
#include "engine/train/model_factory.h"
#include "engine/train/trainer.h"
#include "kernels/op_table.h"
#include "support/op_call.h"

using namespace engine;
using namespace engine::kernels;

namespace {

// ---- The recording table --------------------------------------------------------------------

using test_support::OpCall;

std::vector<OpCall>* g_log = nullptr;

namespace recording {
#define ENGINE_TRACE_UNPACK(...) __VA_ARGS__
#define ENGINE_OP(name, batch, precision, backends, ret, params, args)                       \
  ret name params {                                                                          \
    if (g_log)                                                                               \
      g_log->push_back(test_support::describe_call(#name, #args, ENGINE_TRACE_UNPACK args)); \
    return builtin_cpu_ops().name args;                                                      \
  }
#include "kernels/op_list.inc"
#undef ENGINE_OP
#undef ENGINE_TRACE_UNPACK
}  // namespace recording

const OpTable kRecording{
    "recording",
    &cpu_op_supports,
#define ENGINE_OP(name, batch, precision, backends, ret, params, args) &recording::name,
#include "kernels/op_list.inc"
#undef ENGINE_OP
};

// Stands the recording table in front of the CPU's for its lifetime.
class Recorder {
 public:
  Recorder() { previous_ = use_cpu_ops(&kRecording); }
  ~Recorder() {
    use_cpu_ops(previous_);
    g_log = nullptr;
  }
  // The ops of one call of `f`, and the device work it asked for.
  template <class F>
  std::vector<OpCall> record_calls(F f, DeviceActivity* activity) {
    std::vector<OpCall> log;
    const DeviceActivity before = device_activity();
    g_log = &log;
    f();
    g_log = nullptr;
    const DeviceActivity after = device_activity();
    activity->allocations = after.allocations - before.allocations;
    activity->host_to_device = after.host_to_device - before.host_to_device;
    activity->device_to_host = after.device_to_host - before.device_to_host;
    activity->synchronizations = after.synchronizations - before.synchronizations;
    return log;
  }

 private:
  const OpTable* previous_ = nullptr;
};

// "a b c": a list as one string, so that a failed check shows both sides.
template <class List>
std::string joined(const List& list) {
  std::string out;
  for (const std::string& s : list) out += (out.empty() ? "" : " ") + s;
  return out;
}

std::string op_names(const std::vector<OpCall>& calls) {
  std::vector<std::string> out;
  for (const OpCall& c : calls) out.push_back(c.op);
  return joined(out);
}


// The ops of one mid-epoch CPU training step of fashion_cnn, forward then backward then
// the optimizer: conv1 bn1 pool relu conv2 bn2 pool relu fc1 relu dropout fc2, the
// loss, the backward in reverse, one AdamW update per parameter tensor, and the sum of
// the batch's losses, which train_step() returns (read on the host: on a GPU, a wait
// for the step; fit() does not read it, and reads the epoch's losses for its progress
// at most every 200 ms).
const std::vector<std::string> kStepOps = {
    "gather_batch",
    "conv2d_forward", "batchnorm_forward_train", "maxpool2x2_forward", "relu_forward",
    "conv2d_forward", "batchnorm_forward_train", "maxpool2x2_forward", "relu_forward",
    "linear_forward", "relu_forward", "dropout_forward", "linear_forward",
    "cross_entropy",
    // each conv/linear backward: its bias gradient's double sum rounded to float
    "linear_backward_chunks", "round_to_float", "dropout_backward", "relu_backward", "linear_backward_chunks",
    "round_to_float", "relu_backward", "maxpool2x2_backward", "batchnorm_backward", "conv2d_backward_chunks",
    "round_to_float", "relu_backward", "maxpool2x2_backward", "batchnorm_backward", "conv2d_backward_chunks",
    "round_to_float",
    "adam_update", "adam_update", "adam_update", "adam_update", "adam_update", "adam_update",
    "adam_update", "adam_update", "adam_update", "adam_update", "adam_update", "adam_update",
    // the step digests: the updates' sums, the batch norms' statistics' and the losses'
    // digests into the ring (train.step_digests)
    "step_digest_finish",
    "reduce_sum"};  // the step's mean loss, which train_step() returns

}  // namespace

TEST_CASE("a CPU training step, op by op: what it launches and what changes between steps") {
  if (!test_util::dataset_available()) {
    MESSAGE("Fashion-MNIST not found: skipped");
    return;
  }
  // 512 training images in batches of 64: 8 steps an epoch; nothing is written (train_step).
  const Config c = test_util::small_run_config("cpu", "runs/unused");
  Trainer traced(c, Device::cpu(), make_model(c));
  Trainer plain(c, Device::cpu(), make_model(c));
  // The first step sizes every buffer; steps 2 and 3 are the steady state.
  traced.train_step();
  plain.train_step();

  Recorder recorder;
  DeviceActivity a2, a3;
  StepResult r2, r3;
  const std::vector<OpCall> step2 = recorder.record_calls([&] { r2 = traced.train_step(); }, &a2);
  const std::vector<OpCall> step3 = recorder.record_calls([&] { r3 = traced.train_step(); }, &a3);

  SUBCASE("the ops of a step") {
    CHECK(op_names(step2) == joined(kStepOps));
    CHECK(op_names(step3) == joined(kStepOps));
    MESSAGE("a CPU step launches " << step2.size() << " ops");
  }

  SUBCASE("the device work besides the ops") {
    // On the CPU nothing crosses to a device, and every buffer of the step is reused:
    // the step allocates nothing (the bias gradients' block sums included).
    CHECK(a2.host_to_device == 0);
    CHECK(a2.device_to_host == 0);
    CHECK(a2.synchronizations == 0);
    CHECK(a2.allocations == 0);
    CHECK(a3.allocations == 0);
      }

  SUBCASE("the arguments that change from one step to the next") {
    REQUIRE(step2.size() == step3.size());
    std::set<std::string> changed;
    for (std::size_t i = 0; i < step2.size(); ++i) {
      const OpCall &a = step2[i], &b = step3[i];
      REQUIRE(a.names == b.names);
      for (std::size_t j = 0; j < a.values.size(); ++j)
        if (a.values[j] != b.values[j]) changed.insert(a.op + "." + a.names[j]);
    }
    // Every per-step value (the batch's place in the epoch's order, the dropout counter,
    // the loss scale, Adam's factors) reaches the kernels through the step's one upload
    // (engine/core/step_values.h), so no argument of the step's ops changes: a CUDA graph
    // of the step replays it as it is. What changes is the sum that train_step() reads
    // back afterwards (the batch's losses, outside the step). A buffer allocated afresh
    // each step would show here as a changed pointer.
    const std::set<std::string> expected = {"reduce_sum.x"};
    CHECK(joined(changed) == joined(expected));
  }

  SUBCASE("recording changes no bit") {
    const StepResult p2 = plain.train_step(), p3 = plain.train_step();
    CHECK(p2.loss == r2.loss);
    CHECK(p3.loss == r3.loss);
    const auto a = traced.model().parameters(), b = plain.model().parameters();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i]->value.to_vector() == b[i]->value.to_vector());
  }
}

TEST_CASE("the recording table is the op list, forwarding to the CPU's ops") {
  Recorder recorder;
  DeviceActivity activity;
  const float x[4] = {-1.0f, 0.5f, -0.0f, 3.0f};
  float y[4] = {};
  const std::vector<OpCall> calls = recorder.record_calls([&] { cpu_ops().relu_forward(4, x, y); }, &activity);
  REQUIRE(calls.size() == 1);
  CHECK(calls[0].op == "relu_forward");
  CHECK(calls[0].names == std::vector<std::string>{"n", "x", "y"});
  CHECK(calls[0].values[0] == "4");
  CHECK(calls[0].values[1] == test_support::hex(x));
  CHECK(y[1] == 0.5f);
  CHECK(y[3] == 3.0f);
  CHECK(std::string(cpu_ops().backend) == "recording");
}
