// The embedding API (docs/embedding.md): inference from several threads, a host's own
// training loop, a host's own state in the checkpoint, checkpoints without a Trainer.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <set>
#include <thread>

#include "run_dir_util.h"
#include "cli_util.h"
#include "engine/io/checkpoint.h"
#include "engine/io/idx.h"
#include "engine/train/inference.h"
#include "engine/nn/models/registry.h"
#include "engine/train/model_factory.h"
#include "engine/train/trainer.h"
#include "kernels/ops.h"
#include "synthetic_data.h"

using namespace engine;
using namespace test_util;

namespace {

Config synthetic_config(const std::string& dir) {
  Config c = synthetic_mlp_config();
  c.train.epochs = 2;
  c.checkpoint.dir = dir;
  return c;
}

std::unique_ptr<Trainer> synthetic_trainer(const Config& c, TrainerObserver* observer = nullptr) {
  TrainerOptions options;
  options.observer = observer;
  options.data = std::make_unique<SyntheticDataset>();
  return std::make_unique<Trainer>(
      c, Device::cpu(), make_model_for(c.model, SyntheticDataset::kShape, SyntheticDataset::kClasses),
      std::move(options));
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A host's own state: a counter, a text, a tensor.
class HostState : public Stateful {
 public:
  int64_t batches_seen = 0;
  std::string cursor = "start";
  Tensor weights = Tensor::zeros({4});
  StateDict state() const override {
    StateDict d;
    d.scalars["batches_seen"] = batches_seen;
    d.scalars["cursor"] = cursor;
    d.tensors["weights"] = weights;
    return d;
  }
  void load_state(const StateDict& in) override {
    batches_seen = in.get_int("batches_seen");
    cursor = in.get_string("cursor");
    weights.copy_from(in.get_tensor("weights"));
  }
};

class CountingObserver : public TrainerObserver {
 public:
  std::vector<int64_t> steps;
  int epochs_begun = 0, epochs_ended = 0;
  void on_step_end(int64_t global_step) override { steps.push_back(global_step); }
  void on_epoch_begin(int64_t, int64_t, int64_t) override { ++epochs_begun; }
  void on_epoch_end(const EpochMetrics&) override { ++epochs_ended; }
};

}  // namespace

TEST_CASE("Classifier: 4 threads give the single-threaded bits and the trainer's evaluation") {
  if (!dataset_available()) return;
  Config c = small_run_config("cpu", fresh_dir("embedding_classifier"), 512, 1);
  c.data.test_limit = 512;
  Trainer trainer(c, Device::cpu(), make_model(c));
  const FitResult fit = test_util::fit_in_run_dir(trainer);
  REQUIRE(fit.test);

  const Classifier clf(c.checkpoint.dir + "/best.h5", Device::cpu(), make_model);
  CHECK(clf.input_shape() == ImageShape{1, 28, 28});
  CHECK(clf.num_classes() == 10);
  const IdxPair test = load_fashion_mnist_part(data_dir(), FashionPart::Test);
  const int64_t n = 512, pixels = 784;
  const uint8_t* images = test.images.pixels.data();

  const Predictions single = clf.predict(images, n, Scores::Logits);
  REQUIRE(single.labels.size() == static_cast<size_t>(n));
  REQUIRE(single.scores.size() == static_cast<size_t>(n * 10));
  std::vector<std::vector<int64_t>> confusion(10, std::vector<int64_t>(10, 0));
  for (int64_t i = 0; i < n; ++i) ++confusion[test.labels[i]][single.labels[i]];
  CHECK(confusion == fit.test->confusion);
  // score_logits (what `engine eval` prints) is the trainer's evaluation, bit for bit.
  const EvalResult scored = score_logits(single, test.labels.data());
  CHECK(scored.count == n);
  CHECK(scored.loss == fit.test->loss);
  CHECK(scored.accuracy == fit.test->accuracy);
  CHECK(scored.confusion == fit.test->confusion);
  CHECK_THROWS_AS(score_logits(clf.predict(images, 4), test.labels.data()), std::invalid_argument);
  const uint8_t bad_labels[2] = {3, 10};
  CHECK_THROWS_AS(score_logits(clf.predict(images, 2, Scores::Logits), bad_labels), std::invalid_argument);

  // Each thread classifies the whole set, then its own quarter (aligned to the batch
  // size, so the chunks are those of the single run), three times over.
  std::vector<Predictions> whole(4), quarter(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep) {
        whole[t] = clf.predict(images, n, Scores::Logits);
        quarter[t] = clf.predict(images + t * (n / 4) * pixels, n / 4, Scores::Logits);
      }
    });
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < 4; ++t) {
    CAPTURE(t);
    CHECK(whole[t].labels == single.labels);
    CHECK(same_bits(whole[t].scores, single.scores));
    const std::vector<float> slice(single.scores.begin() + t * (n / 4) * 10, single.scores.begin() + (t + 1) * (n / 4) * 10);
    CHECK(same_bits(quarter[t].scores, slice));
  }

  // Float input is the normalised image, exactly as the training kernel computes it.
  std::vector<float> normalised(static_cast<size_t>(n * pixels));
  const float mean = static_cast<float>(c.data.mean), inv_std = 1.0f / static_cast<float>(c.data.std);
  for (size_t i = 0; i < normalised.size(); ++i)
    normalised[i] = (static_cast<float>(images[i]) * (1.0f / 255.0f) - mean) * inv_std;
  CHECK(same_bits(clf.predict(normalised.data(), n, Scores::Logits).scores, single.scores));
  CHECK(clf.classify(normalised.data(), n) == single.labels);
  CHECK(clf.classify(images, n) == single.labels);

  const Predictions p = clf.predict(images, 3, Scores::Probabilities);
  // The probabilities are the softmax op of the logits (the reference's within one ulp).
  std::vector<float> softmax_ref(30);
  engine::kernels::ref::softmax(3, 10, single.scores.data(), softmax_ref.data());
  for (std::size_t i = 0; i < softmax_ref.size(); ++i)
    CHECK(std::fabs(p.scores[i] - softmax_ref[i]) <=
          std::nextafter(softmax_ref[i], std::numeric_limits<float>::infinity()) - softmax_ref[i]);
  for (int i = 0; i < 3; ++i) {
    double sum = 0;
    for (int k = 0; k < 10; ++k) sum += p.scores[i * 10 + k];
    CHECK(sum == doctest::Approx(1.0).epsilon(1e-5));
    CHECK(p.scores[i * 10 + p.labels[i]] >= p.scores[i * 10 + (p.labels[i] + 1) % 10]);
  }
  CHECK(clf.predict(images, 0).labels.empty());
  CHECK_THROWS_AS(Classifier(c.checkpoint.dir + "/missing.h5", Device::cpu(), make_model), CheckpointError);
}

TEST_CASE("own loop: train_step and train_epoch report each step and write no file") {
  const std::string dir = fresh_dir("embedding_steps") + "/run";
  CountingObserver obs;
  auto t = synthetic_trainer(synthetic_config(dir), &obs);
  StepResult s = t->train_step();
  CHECK(s.epoch == 1);
  CHECK(s.step_in_epoch == 1);
  CHECK(s.global_step == 1);
  CHECK(std::isfinite(s.loss));
  CHECK(s.loss > 0);
  while (!s.epoch_end) s = t->train_step();
  CHECK(s.global_step == 6);  // 96 images in batches of 16
  CHECK(s.epoch_end->epoch == 1);
  CHECK(t->history().size() == 1);
  const EpochMetrics m = t->train_epoch();
  CHECK(m.epoch == 2);
  CHECK(t->global_step() == 12);
  CHECK(obs.steps == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  CHECK(obs.epochs_begun == 2);
  CHECK(obs.epochs_ended == 2);
  CHECK_FALSE(t->early_stop_reached());
  CHECK_FALSE(std::filesystem::exists(dir));  // no checkpoint, no metrics.jsonl
  CHECK_THROWS_AS(t->train_epoch(), std::logic_error);

  // A trainer built to evaluate only refuses to train instead of writing out of bounds.
  const Config c = synthetic_config(dir);
  TrainerOptions test_only;
  test_only.splits = SplitsNeeded::TestOnly;
  test_only.data = std::make_unique<SyntheticDataset>();
  Trainer eval_only(c, Device::cpu(), make_model_for(c.model, SyntheticDataset::kShape, SyntheticDataset::kClasses),
                    std::move(test_only));
  CHECK(eval_only.evaluate(Split::Test).count == 48);
  CHECK_THROWS_AS(eval_only.train_step(), std::logic_error);
}

TEST_CASE("host state: add_state_group is saved, restored and reported like the built-in groups") {
  const std::string dir = fresh_dir("embedding_host_state");
  const std::string with_group = dir + "/with_group.h5", without_group = dir + "/without_group.h5";
  HostState saved;
  {
    auto t = synthetic_trainer(synthetic_config(dir));
    t->add_state_group("host_loop", &saved);
    t->train_step();
    saved.batches_seen = 7;
    saved.cursor = "shard-3:120";
    saved.weights = Tensor::from_vector({4}, {0.5f, -1.0f, 2.0f, 3.25f});
    t->save_checkpoint(with_group);
    auto plain = synthetic_trainer(synthetic_config(dir));
    plain->save_checkpoint(without_group);
  }
  const Checkpoint ck = load_checkpoint(with_group);
  CHECK(ck.group("host_loop").get_int("batches_seen") == 7);

  {  // restored exactly, strict report clean
    HostState h;
    auto t = synthetic_trainer(synthetic_config(dir));
    t->add_state_group("host_loop", &h);
    CHECK(t->resume_from(with_group, LoadMode::Strict).clean());
    CHECK(h.batches_seen == 7);
    CHECK(h.cursor == "shard-3:120");
    CHECK(h.weights.to_vector() == std::vector<float>{0.5f, -1.0f, 2.0f, 3.25f});
    CHECK(t->global_step() == 1);
  }
  {  // a trainer without the group: strict refuses the unexpected group, non-strict reports it
    auto t = synthetic_trainer(synthetic_config(dir));
    CHECK_THROWS_WITH_AS(t->resume_from(with_group, LoadMode::Strict), doctest::Contains("host_loop/"), CheckpointError);
    const StateReport r = t->resume_from(with_group, LoadMode::NonStrict);
    CHECK(r.unexpected == std::vector<std::string>{"host_loop/"});
    CHECK(t->global_step() == 1);
  }
  {  // a checkpoint without the group: strict refuses, non-strict leaves the host state as it is
    HostState h;
    h.batches_seen = 42;
    auto t = synthetic_trainer(synthetic_config(dir));
    t->add_state_group("host_loop", &h);
    CHECK_THROWS_WITH_AS(t->resume_from(without_group, LoadMode::Strict),
                         doctest::Contains("host_loop/batches_seen"), CheckpointError);
    const StateReport r = t->resume_from(without_group, LoadMode::NonStrict);
    CAPTURE(r.str());
    CHECK(std::set<std::string>(r.missing.begin(), r.missing.end()) ==
          std::set<std::string>{"host_loop/batches_seen", "host_loop/cursor", "host_loop/weights"});
    CHECK(r.unexpected.empty());
    CHECK(h.batches_seen == 42);
  }
  {  // names
    HostState h;
    auto t = synthetic_trainer(synthetic_config(dir));
    CHECK_THROWS_AS(t->add_state_group("model", &h), std::invalid_argument);
    CHECK_THROWS_AS(t->add_state_group("a/b", &h), std::invalid_argument);
    CHECK_THROWS_AS(t->add_state_group("", &h), std::invalid_argument);
    CHECK_THROWS_AS(t->add_state_group("host", nullptr), std::invalid_argument);
    t->add_state_group("host", &h);
    CHECK_THROWS_AS(t->add_state_group("host", &h), std::invalid_argument);
  }
}

TEST_CASE("checkpoints without a Trainer: write named tensors and scalars, read them back on a device") {
  const std::string dir = fresh_dir("embedding_no_trainer");
  Checkpoint c;
  c.meta.saved_on = "cpu";
  c.config_json = "{}";
  for (const std::string& g : checkpoint_required_groups()) c.groups[g];  // required, may be empty
  StateDict& e = c.groups["embeddings"];
  e.tensors["table"] = Tensor::from_vector({3, 2}, {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, -6.5f});
  e.scalars["dim"] = int64_t{2};
  e.scalars["temperature"] = 0.75;
  e.scalars["source"] = std::string("host");
  e.scalars["history"] = std::vector<double>{0.5, 0.25};
  save_checkpoint(dir + "/own.h5", c);

  const Checkpoint back = load_checkpoint(dir + "/own.h5", Device::cpu());
  const StateDict& g = back.group("embeddings");
  CHECK(g.get_tensor("table").shape() == Shape{3, 2});
  CHECK(g.get_tensor("table").to_vector() == std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, -6.5f});
  CHECK(g.get_int("dim") == 2);
  CHECK(g.get_real("temperature") == 0.75);
  CHECK(g.get_string("source") == "host");
  CHECK(g.get_series("history") == std::vector<double>{0.5, 0.25});
  CHECK(back.group("model").empty());
  CHECK_THROWS_WITH_AS(back.group("nope"), doctest::Contains("groups: embeddings, metrics, model"), CheckpointError);

  // to() copies: the copy's tensors are its own.
  Checkpoint copy = back.to(Device::cpu());
  copy.groups["embeddings"].tensors["table"].f32()[0] = 100.0f;
  CHECK(back.group("embeddings").get_tensor("table").to_vector()[0] == 1.0f);

  // A trainer's checkpoint read by name without a trainer.
  auto t = synthetic_trainer(synthetic_config(dir));
  t->train_step();
  t->save_checkpoint(dir + "/trained.h5");
  const Checkpoint trained = load_checkpoint(dir + "/trained.h5", Device::cpu());
  CHECK(trained.group("trainer").get_int("global_step") == 1);
  CHECK(trained.group("model").get_tensor("fc1.weight").shape() == Shape{128, 32});
  CHECK(trained.group("model").get_tensor("fc2.bias").to_vector() ==
        t->model().state().get_tensor("fc2.bias").to_vector());

  if (cuda_device_count() > 0) {
    const Checkpoint on_gpu = load_checkpoint(dir + "/own.h5", Device::cuda());
    CHECK(on_gpu.group("embeddings").get_tensor("table").device().is_cuda());
    CHECK(on_gpu.group("embeddings").get_tensor("table").to_vector()[5] == -6.5f);
  }
}
