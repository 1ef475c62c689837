// The sharded gradient exchange and optimizer of CPU ranks (ZeRO stage 1,
// include/engine/core/parameter_shards.h), with ranks simulated by threads: the reduce-scatter
// gives each rank exactly the tree sums that BatchChunks::complete gives (so the bits of
// one process), the allgathers return every shard, and a rank holds about 1/W of the
// optimizer's moments while it trains, the whole moments after.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/core/batch_chunks.h"
#include "engine/core/collective.h"
#include "engine/nn/models/registry.h"
#include "engine/core/parameter_shards.h"
#include "engine/train/trainer.h"
#include "engine/core/rng.h"
#include "engine/nn/model.h"
#include "support/thread_collective.h"
#include "synthetic_data.h"

namespace {

using namespace engine;
using test_support::run_ranks;

// Values whose sums depend on the order they are added in: large and small, both signs.
float value_at(uint32_t block, uint32_t param, uint32_t element) {
  uint32_t h = block * 2654435761u ^ (param + 1) * 40503u ^ (element + 7) * 2246822519u;
  h ^= h >> 13;
  h *= 3266489917u;
  h ^= h >> 16;
  const float mag = (h & 1u) ? 1e7f : 1e-2f;
  return (static_cast<float>(h % 20001u) / 10000.0f - 1.0f) * mag;
}

// A layout with a parameter smaller than a shard, parameters cut by shard bounds, one
// that is complete already (batch norm's) and one of double block sums (a bias).
const std::vector<int64_t> kSizes = {5, 37, 3, 64, 11};
constexpr std::size_t kComplete = 2, kWide = 4;

// This rank's block sums of every element of parameter `param`, block by block.
template <class T>
std::vector<T> block_sums(const BatchChunks& plan, std::size_t param) {
  std::vector<T> v;
  for (const BatchChunks::Block& b : plan.blocks())
    for (int64_t e = 0; e < kSizes[param]; ++e)
      v.push_back(static_cast<T>(value_at(static_cast<uint32_t>(b.first_chunk), static_cast<uint32_t>(param),
                                          static_cast<uint32_t>(e))));
  return v;
}

TEST_CASE("reduce_scatter completes each rank's shard to the bits of BatchChunks::complete") {
  for (int chunks : {8, 16}) {
    for (int world = 1; world <= 8; ++world) {
      CAPTURE(chunks);
      CAPTURE(world);
      run_ranks(world, [&](int rank, Collective& comm) {
        BatchChunks plan(40, &comm, chunks);
        ParameterShards shards(kSizes, &comm);
        GradientParts parts;
        std::vector<Tensor> grads;
        for (int64_t n : kSizes) grads.push_back(Tensor::from_vector({n}, std::vector<float>(n, -5.0f)));
        std::vector<Tensor*> grad_ptrs;
        for (Tensor& g : grads) grad_ptrs.push_back(&g);
        std::vector<std::vector<float>> want(kSizes.size());
        for (std::size_t p = 0; p < kSizes.size(); ++p) {
          if (p == kComplete) continue;
          const std::size_t n = static_cast<std::size_t>(kSizes[p]);
          if (p == kWide) {
            const std::vector<double> sums = block_sums<double>(plan, p);
            std::memcpy(parts.doubles(grads[p], plan.blocks().size()), sums.data(), sums.size() * sizeof(double));
            std::vector<double> whole(n);
            plan.complete(sums.data(), kSizes[p], whole.data());
            for (double d : whole) want[p].push_back(static_cast<float>(d));
          } else {
            const std::vector<float> sums = block_sums<float>(plan, p);
            std::memcpy(parts.floats(grads[p], plan.blocks().size()), sums.data(), sums.size() * sizeof(float));
            want[p].resize(n);
            plan.complete(sums.data(), kSizes[p], want[p].data());
          }
        }
        shards.reduce_scatter(plan, parts, grad_ptrs);
        int64_t owned = 0;
        std::vector<std::vector<bool>> in_shard(kSizes.size());
        for (std::size_t p = 0; p < kSizes.size(); ++p) in_shard[p].assign(static_cast<std::size_t>(kSizes[p]), false);
        for (const ParameterShards::Segment& s : shards.segments()) {
          owned += s.count;
          for (int64_t e = s.offset; e < s.offset + s.count; ++e) in_shard[s.index][static_cast<std::size_t>(e)] = true;
        }
        CHECK(owned == shards.shard_size(rank));
        for (std::size_t p = 0; p < kSizes.size(); ++p)
          for (int64_t e = 0; e < kSizes[p]; ++e) {
            const float got = grads[p].f32()[e];
            const std::size_t i = static_cast<std::size_t>(e);
            if (p != kComplete && in_shard[p][i]) CHECK(got == want[p][i]);
            else CHECK(got == -5.0f);  // outside the shard, or complete already: untouched
          }
      });
    }
  }
}

TEST_CASE("the allgathers return every rank's shard to every rank") {
  for (int world : {1, 2, 3, 5, 8}) {
    CAPTURE(world);
    run_ranks(world, [&](int rank, Collective& comm) {
      ParameterShards shards(kSizes, &comm);
      CHECK(shards.total() == 120);
      // Each rank writes its rank number into its shard only.
      std::vector<Tensor> values;
      for (int64_t n : kSizes) values.push_back(Tensor::from_vector({n}, std::vector<float>(n, -1.0f)));
      std::vector<Tensor*> ptrs;
      for (Tensor& v : values) ptrs.push_back(&v);
      for (const ParameterShards::Segment& s : shards.segments())
        for (int64_t e = s.offset; e < s.offset + s.count; ++e) values[s.index].f32()[e] = static_cast<float>(rank);
      shards.allgather(ptrs);
      std::vector<float> mine(static_cast<std::size_t>(shards.shard_size(rank)), static_cast<float>(rank) + 0.5f);
      const std::vector<float> flat = shards.gather(mine.data());
      REQUIRE(flat.size() == 120);
      int64_t at = 0;
      for (std::size_t p = 0; p < kSizes.size(); ++p)
        for (int64_t e = 0; e < kSizes[p]; ++e, ++at) {
          // The owner of flat element `at`: the rank r with begin(r) <= at < begin(r + 1).
          int r = 0;
          while (shards.shard_begin(r + 1) <= at) ++r;
          CHECK(values[p].f32()[e] == static_cast<float>(r));
          CHECK(flat[static_cast<std::size_t>(at)] == static_cast<float>(r) + 0.5f);
        }
    });
  }
}

// Records the optimizer's moment bytes at every step's end (inside train_step, before
// it gathers the moments again).
class MomentProbe : public TrainerObserver {
 public:
  void on_step_end(int64_t) override { seen.push_back(trainer->optimizer_moment_bytes()); }
  Trainer* trainer = nullptr;
  std::vector<int64_t> seen;
};

std::unique_ptr<Trainer> mlp_trainer(Collective* comm, TrainerObserver* observer) {
  Config c = test_util::synthetic_mlp_config();
  c.seed = 3;
  c.train.epochs = 2;
  auto model = make_model_for(c.model, test_util::SyntheticDataset::kShape, test_util::SyntheticDataset::kClasses);
  TrainerOptions options;
  options.observer = observer;
  options.data = std::make_unique<test_util::SyntheticDataset>(64, 16, 16);
  options.collective = comm;
  return std::make_unique<Trainer>(c, Device::cpu(), std::move(model), std::move(options));
}

// The two ways the op facade completes a conv or linear gradient (core/tensor_ops.cpp):
// in the op (BatchChunks::complete, what CUDA and a model used outside the trainer get),
// or deferred to the trainer's one pass (GradientParts, ParameterShards::reduce_scatter).
// Both add the same block sums by the same tree, so every gradient has the same bits.
TEST_CASE("gradients completed in the op equal those deferred to reduce_scatter, bit for bit") {
  const int n = 40;
  ModelConfig mc;
  mc.name = "fashion_cnn";
  const ImageShape shape{1, 28, 28};
  Tensor x = Tensor::empty({n, 1, 28, 28}), dlogits = Tensor::empty({n, 10});
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = value_at(1, 0, static_cast<uint32_t>(i)) * 1e-7f;
  for (int64_t i = 0; i < dlogits.numel(); ++i) dlogits.f32()[i] = value_at(2, 0, static_cast<uint32_t>(i)) * 1e-9f;
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    run_ranks(world, [&](int, Collective& comm) {
      BatchChunks plan(n, &comm, 16);  // more than one block: the grads need completing
      const Tensor local_x = x.reshape({n, 784});
      Tensor mine = Tensor::empty({plan.local_count(), 1, 28, 28}), dmine = Tensor::empty({plan.local_count(), 10});
      std::memcpy(mine.f32(), local_x.f32() + plan.local_begin() * 784, mine.nbytes());
      std::memcpy(dmine.f32(), dlogits.f32() + plan.local_begin() * 10, dmine.nbytes());
      std::vector<Tensor> grads[2];
      for (int deferred = 0; deferred < 2; ++deferred) {
        auto model = make_model_for(mc, shape, 10);
        Rng rng(7);
        model->reset_parameters(rng);
        GradientParts parts;
        if (deferred) plan.defer_gradients(&parts);
        REQUIRE(model->set_batch_chunks(&plan));
        model->forward(mine, Mode::Train, rng);
        model->backward(dmine);
        model->set_batch_chunks(nullptr);
        plan.defer_gradients(nullptr);
        std::vector<Tensor*> g;
        std::vector<int64_t> sizes;
        for (Parameter* p : model->parameters()) {
          g.push_back(&p->grad);
          sizes.push_back(p->grad.numel());
        }
        if (deferred) {
          REQUIRE(parts.find(*g.front()) != nullptr);  // the conv1 weight's block sums waited
          ParameterShards shards(sizes, &comm);
          shards.reduce_scatter(plan, parts, g);
          std::vector<Tensor*> values;
          for (Parameter* p : model->parameters()) values.push_back(&p->grad);
          shards.allgather(values);  // every rank's shard of the gradients, to compare whole
        }
        for (Tensor* t : g) grads[deferred].push_back(t->clone());
      }
      REQUIRE(grads[0].size() == grads[1].size());
      for (std::size_t i = 0; i < grads[0].size(); ++i) {
        CAPTURE(i);
        CHECK(std::memcmp(grads[0][i].raw(), grads[1][i].raw(), grads[0][i].nbytes()) == 0);
      }
    });
  }
}

TEST_CASE("a rank holds its shard of the optimizer's moments while it trains, the whole moments after") {
  auto one = mlp_trainer(nullptr, nullptr);
  const int64_t whole = one->optimizer_moment_bytes();
  REQUIRE(whole > 0);
  for (int world : {2, 4}) {
    CAPTURE(world);
    std::vector<int64_t> during(static_cast<std::size_t>(world)), after(static_cast<std::size_t>(world));
    run_ranks(world, [&](int rank, Collective& comm) {
      MomentProbe probe;
      auto t = mlp_trainer(&comm, &probe);
      probe.trainer = t.get();
      t->train_step();
      t->train_step();
      REQUIRE(probe.seen.size() == 2);
      CHECK(probe.seen[0] == probe.seen[1]);
      during[rank] = probe.seen[0];
      after[rank] = t->optimizer_moment_bytes();
      CHECK(t->state_bytes() == one->state_bytes());
    });
    int64_t sum = 0;
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      sum += during[r];
      // 1/W of the flat vector, give or take one element of each moment.
      CHECK(during[r] <= whole / world + 8);
      CHECK(during[r] >= whole / world - 8);
      CHECK(after[r] == whole);
    }
    CHECK(sum == whole);
  }
}

}  // namespace
