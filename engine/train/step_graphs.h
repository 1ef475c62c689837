// CUDA graphs of the training step (cuda.graphs, docs/architecture.md "A training step").
// A step's launches are the same every step, argument for argument (its per-step values
// are read from device memory: core/step_values.h), so after one eager step of a batch
// size that allocated nothing, the next step of that size is captured once and every later
// one replays the capture: one launch instead of about 60. What the step does on the host
// besides launching (Philox counters taken, step counts, BatchNorm's batch count) is
// done again by hand at each replay, from what the capture did; what it does on the
// device that the host keeps a copy of (the loss scaler's state, the step counts kept on
// the device) is marked newer on the device at each replay, so a read after a replay
// reads the device.
//
// A graph reads every buffer at the address it had in the capture: the free of any GPU
// buffer alive at the capture (a buffer grown, freed and made again) drops every graph,
// as do a state load and the release of the workspaces (the trainer calls drop()).
// Buffers made after the capture (an evaluation's, a save's, another thread's) do not, so
// the graphs outlive evaluations and saves, and the last, smaller batch's graph is
// replayed from the second epoch on.
#pragma once
#include <array>
#include <map>
#include <set>

#include "engine/core/rng.h"
#include "engine/nn/optimizer.h"
#include "kernels/cuda_runtime.h"

namespace engine {

class StepGraphs {
 public:
  struct Graph {
    kernels::cuda::Graph graph;
    std::array<uint64_t, kRngStreamCount> draws{};  // what the step takes from each stream
    // Where the step counts Adam's steps: on the device with a loss scaler (the step may
    // be skipped there, and the scaler's state moves there too), else on the host.
    AdamOptimizer::StepCounts counts = AdamOptimizer::StepCounts::OnHost;
  };
  // The graph of a step of `local` samples, or null.
  const Graph* find(int local) const {
    auto it = graphs_.find(local);
    return it == graphs_.end() ? nullptr : &it->second;
  }
  // Whether an eager step of this size has run, allocating nothing, since the last drop.
  bool ready(int local) const { return ready_.count(local) != 0; }
  // An eager step of `local` samples ran; `allocated`: it allocated device memory.
  void eager_step_done(int local, bool allocated) {
    if (allocated)
      drop();
    else
      ready_.insert(local);
  }
  void add(int local, Graph g) { graphs_[local] = std::move(g); }
  void drop() {
    graphs_.clear();
    ready_.clear();
  }
  std::size_t size() const { return graphs_.size(); }
  // marked_device_buffer_frees() at the end of the last step (core/graph_capture.h).
  uint64_t frees_seen = 0;

 private:
  std::map<int, Graph> graphs_;
  std::set<int> ready_;
};

}  // namespace engine
