// W ranks as threads of one process, exchanging through an in-process Collective: the
// tests' stand-in for mpirun (tests/mpi/test_world_size.cpp, tests/gpu/test_cuda_behaviour.cpp).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/collective.h"

namespace test_support {

// The meeting point of W threads: each allgather is two barriers (all have written
// their piece; all have read everything), so a slot is never overwritten while read.
// A rank that fails aborts the group, so the others throw instead of waiting forever.
class ThreadGroup {
 public:
  explicit ThreadGroup(int world) : world_(world), slots_(static_cast<std::size_t>(world)) {}
  int world() const { return world_; }

  void allgather(int rank, const void* send, std::size_t bytes, void* recv) {
    {
      std::lock_guard<std::mutex> lock(m_);
      const auto* p = static_cast<const uint8_t*>(send);
      slots_[rank].assign(p, p + bytes);
    }
    barrier();
    for (int r = 0; r < world_; ++r) {
      if (slots_[r].size() != bytes) {
        abort();
        throw std::logic_error("allgather: rank " + std::to_string(r) + " gave " +
                               std::to_string(slots_[r].size()) + " bytes, rank " + std::to_string(rank) +
                               " " + std::to_string(bytes));
      }
      if (bytes) std::memcpy(static_cast<uint8_t*>(recv) + r * bytes, slots_[r].data(), bytes);
    }
    barrier();
  }
  void broadcast(int rank, void* data, std::size_t bytes, int root) {
    std::vector<uint8_t> all(bytes * world_);
    allgather(rank, data, bytes, all.data());
    if (bytes) std::memcpy(data, all.data() + root * bytes, bytes);
  }
  void abort() {
    std::lock_guard<std::mutex> lock(m_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  void barrier() {
    std::unique_lock<std::mutex> lock(m_);
    if (aborted_) throw std::runtime_error("another rank failed");
    const uint64_t gen = generation_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    if (generation_ == gen) throw std::runtime_error("another rank failed");
  }

  int world_;
  std::mutex m_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::vector<std::vector<uint8_t>> slots_;
};

class ThreadCollective final : public engine::Collective {
 public:
  ThreadCollective(ThreadGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.world(); }
  std::string name() const override { return "threads"; }
  void allgather(const void* send, std::size_t bytes, void* recv) override {
    g_.allgather(rank_, send, bytes, recv);
  }
  void broadcast(void* data, std::size_t bytes, int root) override { g_.broadcast(rank_, data, bytes, root); }

 private:
  ThreadGroup& g_;
  int rank_;
};

// Runs body(rank, collective) on W threads; rethrows the first failure.
inline void run_ranks(int world, const std::function<void(int, engine::Collective&)>& body) {
  ThreadGroup group(world);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      ThreadCollective c(group, r);
      try {
        body(r, c);
      } catch (...) {
        errors[r] = std::current_exception();
        group.abort();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace test_support
