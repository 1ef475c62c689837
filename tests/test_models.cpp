// The trainer trains models, not one model: the registry builds fashion_cnn and mlp,
// shapes are checked against the dataset, and a second model (the MLP) trains,
// checkpoints, resumes bit-exactly and evaluates through the same trainer and file
// format, on Fashion-MNIST and on a dataset of another shape.
#include <doctest/doctest.h>

#include <functional>
#include <memory>
#include <set>

#include "run_dir_util.h"
#include "cli_util.h"
#include "engine/io/checkpoint.h"
#include "engine/nn/models/fashion_cnn.h"
#include "engine/nn/models/mlp.h"
#include "engine/nn/models/registry.h"
#include "engine/train/model_factory.h"
#include "engine/train/trainer.h"
#include "synthetic_data.h"

using namespace engine;
using namespace test_util;

namespace {

// 512 Fashion-MNIST training images in batches of 64: 8 steps per epoch.
Config fashion_config(const std::string& model) {
  Config c;
  c.device = "cpu";
  c.model.name = model;
  c.data.dir = data_dir();
  c.data.train_limit = 512;
  c.data.val_split = 256;
  c.data.test_limit = 256;
  c.data.batch_size = 64;
  c.checkpoint.every_n_epochs = std::nullopt;
  return c;
}

// The synthetic 2x4x4 dataset in batches of 16: 6 steps per epoch.
Config synthetic_config() {
  Config c = synthetic_mlp_config();
  c.optimizer.lr = 1e-2;
  return c;
}

std::unique_ptr<Trainer> fashion_trainer(const Config& c) {
  return std::make_unique<Trainer>(c, Device::cpu(), make_model(c));
}

std::unique_ptr<Trainer> synthetic_trainer(const Config& c) {
  TrainerOptions options;
  options.data = std::make_unique<SyntheticDataset>();
  return std::make_unique<Trainer>(
      c, Device::cpu(), make_model_for(c.model, SyntheticDataset::kShape, SyntheticDataset::kClasses),
      std::move(options));
}

void expect_identical(const std::string& a, const std::string& b) {
  const CheckpointDiff d = diff_checkpoints(a, b);
  INFO(d.report);
  CHECK(d.identical);
}

// Two epochs straight (fit) against: one epoch, save, a new Trainer, resume, fit; and
// against: three steps, save, a new Trainer, resume, the rest by train_epoch().
// Returns the straight run's test result.
EvalResult check_resume_bit_exact(Config base, const std::function<std::unique_ptr<Trainer>(const Config&)>& make,
                                  const std::string& name) {
  base.train.epochs = 2;
  Config ca = base;
  ca.checkpoint.dir = fresh_dir(name + "_straight");
  const FitResult ra = test_util::fit_in_run_dir(*make(ca));
  REQUIRE(ra.epochs_done == 2);
  REQUIRE(ra.test);

  Config cb = base;
  cb.checkpoint.dir = fresh_dir(name + "_by_epoch");
  const std::string after_one = cb.checkpoint.dir + "/after_epoch_1.h5";
  {
    auto b = make(cb);
    const EpochMetrics m = b->train_epoch();
    CHECK(m.epoch == 1);
    b->save_checkpoint(after_one);
  }
  auto b = make(cb);
  CHECK(b->resume_from(after_one, LoadMode::Strict).clean());
  CHECK(b->epochs_done() == 1);
  const FitResult rb = test_util::fit_in_run_dir(*b);
  expect_identical(ca.checkpoint.dir + "/last.h5", cb.checkpoint.dir + "/last.h5");
  REQUIRE(rb.test);
  CHECK(rb.test->loss == ra.test->loss);
  CHECK(rb.test->confusion == ra.test->confusion);

  Config cc = base;
  cc.checkpoint.dir = fresh_dir(name + "_by_step");
  const std::string mid = cc.checkpoint.dir + "/mid.h5";
  {
    auto c = make(cc);
    for (int i = 1; i <= 3; ++i) {
      const StepResult s = c->train_step();
      CHECK(s.global_step == i);
      CHECK(s.epoch == 1);
      CHECK_FALSE(s.epoch_end);
    }
    c->save_checkpoint(mid);
  }
  auto c = make(cc);
  CHECK(c->resume_from(mid, LoadMode::Strict).clean());
  CHECK(c->step_in_epoch() == 3);
  CHECK(c->train_epoch().epoch == 1);
  CHECK(c->train_epoch().epoch == 2);
  CHECK_THROWS_AS(c->train_step(), std::logic_error);
  c->save_checkpoint(cc.checkpoint.dir + "/end.h5");
  expect_identical(ca.checkpoint.dir + "/last.h5", cc.checkpoint.dir + "/end.h5");
  const EvalResult e = c->evaluate(Split::Test);
  CHECK(e.loss == ra.test->loss);
  CHECK(e.confusion == ra.test->confusion);
  return *ra.test;
}

}  // namespace

TEST_CASE("registry: fashion_cnn and mlp by name, each checked against the data's shape") {
  const std::vector<std::string> names = model_names();
  CHECK(std::set<std::string>(names.begin(), names.end()) == std::set<std::string>{"fashion_cnn", "mlp"});
  Config c;
  std::unique_ptr<Model> cnn = make_model(c);
  CHECK(cnn->name() == "fashion_cnn");
  CHECK(cnn->parameter_count() == 421834);
  CHECK(cnn->input_shape() == ImageShape{1, 28, 28});
  c.model.name = "mlp";
  std::unique_ptr<Model> mlp = make_model(c);
  CHECK(mlp->name() == "mlp");
  CHECK(mlp->num_classes() == 10);
  CHECK(mlp->parameter_count() == 784 * 128 + 128 + 128 * 10 + 10);
  const StateDict s = mlp->state();
  CHECK(s.tensors.size() == 4);
  CHECK(s.get_tensor("fc1.weight").shape() == Shape{128, 784});
  CHECK(s.get_tensor("fc2.weight").shape() == Shape{10, 128});
  CHECK(mlp->new_instance()->state().get_tensor("fc1.bias").shape() == Shape{128});

  ModelConfig other;
  other.name = "fashion_cnn";
  CHECK_THROWS_AS(make_model_for(other, ImageShape{3, 32, 32}, 10), std::invalid_argument);
  other.name = "resnet";
  CHECK_THROWS_WITH_AS(make_model_for(other, ImageShape{1, 28, 28}, 10), doctest::Contains("unknown model 'resnet'"),
                       std::invalid_argument);
  // A model that does not fit the dataset is refused before anything is loaded.
  TrainerOptions synthetic;
  synthetic.data = std::make_unique<SyntheticDataset>();
  CHECK_THROWS_WITH_AS(Trainer(synthetic_config(), Device::cpu(), std::make_unique<Mlp>(ImageShape{1, 28, 28}, 8, 10, 0.0f),
                               std::move(synthetic)),
                       doctest::Contains("the dataset has 2x4x4 in 3"), std::invalid_argument);
}

TEST_CASE("an MLP of another shape learns a dataset of its own through the same trainer") {
  Config c = synthetic_config();
  c.train.epochs = 4;
  c.checkpoint.dir = fresh_dir("models_synthetic_fit");
  auto t = synthetic_trainer(c);
  CHECK(t->model().input_shape() == ImageShape{2, 4, 4});
  const FitResult r = test_util::fit_in_run_dir(*t);
  REQUIRE(r.test);
  CHECK(r.test->count == 48);
  CHECK(r.test->confusion.size() == 3);
  CHECK(r.test->accuracy > 0.9);
  CHECK(t->history().back().val_acc > 0.9);
  // The checkpoint is the ordinary format: verify passes, the model group is the MLP's.
  CHECK(run("verify \"" + c.checkpoint.dir + "/last.h5\"").exit_code == 0);
  const Checkpoint ck = load_checkpoint(c.checkpoint.dir + "/best.h5");
  CHECK(ck.group("model").get_tensor("fc1.weight").shape() == Shape{128, 32});
}

TEST_CASE("MLP on a dataset of another shape: resume after an epoch or mid-epoch is bit-exact") {
  const EvalResult test = check_resume_bit_exact(synthetic_config(), synthetic_trainer, "models_synthetic");
  CHECK(test.accuracy > 0.6);
}

TEST_CASE("MLP on Fashion-MNIST: resume after an epoch or mid-epoch is bit-exact, and it evaluates") {
  if (!dataset_available()) return;
  const EvalResult test = check_resume_bit_exact(fashion_config("mlp"), fashion_trainer, "models_fashion_mlp");
  CHECK(test.count == 256);
  CHECK(test.accuracy > 0.5);
}

TEST_CASE("CLI: engine train/eval/inspect take the MLP by model.name with no special case") {
  if (!dataset_available()) return;
  const std::string dir = fresh_dir("models_cli_mlp");
  RunResult r = run(small_run(dir) + " --set model.name=mlp --set train.epochs=2");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("training mlp (101770 parameters)") != std::string::npos);
  r = run("eval \"" + dir + "/best.h5\" --device cpu --limit 256 --data-dir \"" + data_dir() + "\"");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("test: loss") != std::string::npos);
  r = run("inspect \"" + dir + "/last.h5\"");
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("fc1.weight") != std::string::npos);
  // A CNN run into the MLP's run directory: another run's checkpoint, neither resumed
  // nor overwritten (docs/recovery.md), naming what differs.
  r = run(small_run(dir) + " --set train.epochs=3");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("another run's checkpoint (model.name \"mlp\" there, \"fashion_cnn\" here)") != std::string::npos);
  // Resuming the MLP's checkpoint as a CNN on purpose: the strict load names the keys.
  r = run("resume \"" + dir + "/last.h5\" --device cpu --set model.name=fashion_cnn --set train.epochs=3");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("conv1.weight") != std::string::npos);
}

namespace {
Tensor random_tensor(const Shape& shape, uint32_t seed) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  uint32_t s = seed;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(s >> 8) / 16777216.0f - 0.5f;
  }
  return Tensor::from_vector(shape, v);
}

Tensor first_samples(const Tensor& t, int64_t n) {
  Shape shape = t.shape();
  const int64_t per_sample = t.numel() / shape[0];
  shape[0] = n;
  std::vector<float> all = t.to_vector();
  all.resize(static_cast<std::size_t>(n * per_sample));
  return Tensor::from_vector(shape, all);
}
}  // namespace

// The epoch's last batch is smaller: each layer runs it in the buffers of the full
// batch (Layer::ensure keeps the storage), so the peak does not hold both; the bits are
// those of a model that never saw the full batch.
TEST_CASE("a smaller batch runs in the full batch's buffers, with the bits of a fresh model") {
  FashionCnn reused(0.0f), fresh(0.0f);
  Rng rng_reused(7), rng_fresh(7);
  reused.reset_parameters(rng_reused);
  fresh.reset_parameters(rng_fresh);
  const Tensor x_full = random_tensor({16, 1, 28, 28}, 1), x_small = first_samples(x_full, 11);
  const Tensor dy_full = random_tensor({16, 10}, 2), dy_small = first_samples(dy_full, 11);

  const Tensor logits_full = reused.forward(x_full, Mode::Train, rng_reused);
  const void* const full_buffer = logits_full.raw();
  const std::size_t full_bytes = logits_full.storage_bytes();
  const std::vector<float> full_values = logits_full.to_vector();  // the buffer is reused below
  reused.backward(dy_full);
  const Tensor logits_reused = reused.forward(x_small, Mode::Train, rng_reused);
  reused.backward(dy_small);
  CHECK(logits_reused.shape() == Shape{11, 10});
  CHECK(logits_reused.raw() == full_buffer);
  CHECK(logits_reused.storage_bytes() == full_bytes);

  const Tensor logits_fresh = fresh.forward(x_small, Mode::Train, rng_fresh);
  fresh.backward(dy_small);
  CHECK(logits_reused.to_vector() == logits_fresh.to_vector());
  const auto pr = reused.parameters(), pf = fresh.parameters();
  REQUIRE(pr.size() == pf.size());
  for (std::size_t i = 0; i < pr.size(); ++i) {
    INFO(pr[i]->name);
    CHECK(pr[i]->grad.to_vector() == pf[i]->grad.to_vector());
  }

  // Growing again allocates; a full batch after the small one fits the kept storage.
  const Tensor logits_again = reused.forward(x_full, Mode::Train, rng_reused);
  CHECK(logits_again.raw() == full_buffer);
  CHECK(logits_again.to_vector() == full_values);
  CHECK_THROWS_AS(logits_full.prefix_view({17, 10}), std::invalid_argument);
}

namespace {
// The CNN in PyTorch's module order (ReLU, then pooling), from the same layer classes.
class TorchOrderCnn : public SequentialModel {
 public:
  explicit TorchOrderCnn(float dropout) : dropout_("dropout", dropout) {
    set_layers({&conv1_, &bn1_, &relu1_, &pool1_, &conv2_, &bn2_, &relu2_, &pool2_, &flatten_, &fc1_, &relu3_,
                &dropout_, &fc2_});
  }
  std::string name() const override { return "torch_order_cnn"; }
  ImageShape input_shape() const override { return {1, 28, 28}; }
  int num_classes() const override { return 10; }
  void reset_parameters(Rng&) override {}
  void set_precision(Precision) override {}
  std::unique_ptr<Model> new_instance() const override { return nullptr; }

 private:
  Conv2d conv1_{"conv1", 1, 32, 3, 1};
  BatchNorm2d bn1_{"bn1", 32};
  ReLU relu1_{"relu1", InPlace::Yes};
  MaxPool2x2 pool1_{"pool1"};
  Conv2d conv2_{"conv2", 32, 64, 3, 1};
  BatchNorm2d bn2_{"bn2", 64};
  ReLU relu2_{"relu2", InPlace::Yes};
  MaxPool2x2 pool2_{"pool2"};
  Flatten flatten_{"flatten"};
  Linear fc1_{"fc1", 64 * 7 * 7, 128};
  ReLU relu3_{"relu3", InPlace::Yes};
  Dropout dropout_;
  Linear fc2_{"fc2", 128, 10};
};
}  // namespace

// FashionCnn pools before its ReLUs (a quarter of the ReLU work); the bits must be those
// of PyTorch's order: logits, every gradient and the BatchNorm statistics, over two steps
// in which about half of the pooling windows after BatchNorm hold no positive value.
TEST_CASE("fashion_cnn pools before ReLU with the bits of ReLU before pooling") {
  FashionCnn ours(0.25f);
  TorchOrderCnn torch_order(0.25f);
  Rng init(11);
  ours.reset_parameters(init);
  torch_order.load_state(ours.state());
  Rng rng_ours(5), rng_torch(5);
  for (uint32_t step = 0; step < 2; ++step) {
    const Tensor x = random_tensor({16, 1, 28, 28}, 100 + step), dy = random_tensor({16, 10}, 200 + step);
    const Tensor a = ours.forward(x, Mode::Train, rng_ours), b = torch_order.forward(x, Mode::Train, rng_torch);
    CHECK(a.to_vector() == b.to_vector());
    ours.backward(dy);
    torch_order.backward(dy);
    const auto pa = ours.parameters(), pb = torch_order.parameters();
    REQUIRE(pa.size() == pb.size());
    for (std::size_t i = 0; i < pa.size(); ++i) {
      INFO(pa[i]->name);
      CHECK(pa[i]->grad.to_vector() == pb[i]->grad.to_vector());
    }
  }
  const StateDict sa = ours.state(), sb = torch_order.state();
  for (const char* key : {"bn1.running_mean", "bn1.running_var", "bn2.running_mean", "bn2.running_var"}) {
    INFO(key);
    CHECK(sa.get_tensor(key).to_vector() == sb.get_tensor(key).to_vector());
  }
  CHECK(ours.forward(random_tensor({4, 1, 28, 28}, 300), Mode::Eval, rng_ours).to_vector() ==
        torch_order.forward(random_tensor({4, 1, 28, 28}, 300), Mode::Eval, rng_torch).to_vector());
}

// In place, MaxPool2x2 writes its input gradient over its forward input: the same values
// as into a buffer of its own, in the input's storage.
TEST_CASE("MaxPool2x2 in place: the input gradient over the forward input, the same bits") {
  MaxPool2x2 in_place("pool", InPlace::Yes), separate("pool");
  Rng rng(1);
  const Tensor x = random_tensor({3, 4, 6, 8}, 21), dy = random_tensor({3, 4, 3, 4}, 22);
  const Tensor x_copy = x.clone();
  CHECK(in_place.forward(x, Mode::Train, rng).to_vector() == separate.forward(x_copy, Mode::Train, rng).to_vector());
  const Tensor dx_separate = separate.backward(dy, InputGrad::Needed);
  const Tensor dx_in_place = in_place.backward(dy, InputGrad::Needed);
  CHECK(dx_in_place.raw() == x.raw());
  CHECK(dx_separate.raw() != x_copy.raw());
  CHECK(dx_in_place.to_vector() == dx_separate.to_vector());
  // An evaluation forward keeps nothing to overwrite.
  in_place.forward(x, Mode::Eval, rng);
  CHECK_THROWS_AS(in_place.backward(dy, InputGrad::Needed), std::logic_error);
}
