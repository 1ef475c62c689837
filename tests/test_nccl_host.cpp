// The host logic of GPU ranks (docs/distributed.md, "GPU ranks"), runnable without a
// GPU or NCCL: dist.backend resolution, the NCCL id agreed over a bootstrap collective,
// the choice of GPU per rank, and the messages when NCCL is missing or cannot load.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/collective/nccl_bootstrap.h"
#include "engine/core/collective.h"
#include "engine/train/dist_backend.h"

using engine::Device;
using engine::DistBackend;

namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Ranks run one after another, rank 0 first: a broadcast from rank 0 stores its bytes,
// the later ranks read them. Enough for agree_nccl_id, which only broadcasts.
struct SequentialWorld {
  std::vector<char> root_bytes;
  int broadcasts = 0;
};
class SequentialCollective final : public engine::Collective {
 public:
  SequentialCollective(SequentialWorld& w, int rank, int size) : w_(w), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "sequential"; }
  void allgather(const void*, std::size_t, void*) override { throw std::logic_error("not used"); }
  void broadcast(void* data, std::size_t bytes, int root) override {
    REQUIRE(root == 0);
    ++w_.broadcasts;
    if (rank_ == 0) w_.root_bytes.assign(static_cast<char*>(data), static_cast<char*>(data) + bytes);
    else std::memcpy(data, w_.root_bytes.data(), bytes);
  }

 private:
  SequentialWorld& w_;
  int rank_, size_;
};

}  // namespace

TEST_CASE("dist.backend: auto picks NCCL only for CUDA ranks in a build with NCCL") {
  const Device cpu = Device::cpu(), gpu = Device::cuda(0);
  CHECK(engine::resolve_dist_backend(DistBackend::Auto, gpu, 4, true) == DistBackend::Nccl);
  CHECK(engine::resolve_dist_backend(DistBackend::Auto, gpu, 4, false) == DistBackend::Mpi);
  CHECK(engine::resolve_dist_backend(DistBackend::Auto, gpu, 1, true) == DistBackend::Mpi);  // nothing to exchange
  CHECK(engine::resolve_dist_backend(DistBackend::Auto, cpu, 4, true) == DistBackend::Mpi);
  CHECK(engine::resolve_dist_backend(DistBackend::Mpi, gpu, 4, true) == DistBackend::Mpi);
  CHECK(engine::resolve_dist_backend(DistBackend::Nccl, gpu, 1, true) == DistBackend::Nccl);  // 1-rank communicator
  CHECK(message_of([&] { engine::resolve_dist_backend(DistBackend::Nccl, cpu, 2, true); }) ==
        "dist.backend=nccl needs CUDA ranks, this run is on cpu (use dist.backend=mpi or auto)");
  CHECK(message_of([&] { engine::resolve_dist_backend(DistBackend::Nccl, gpu, 2, false); }) ==
        "dist.backend=nccl: this engine was built without NCCL (use dist.backend=mpi or auto)");
  // A plain CPU process: the single-process collective, no NCCL, no MPI.
  const engine::LaunchInfo none;
  CHECK(engine::make_run_collective(DistBackend::Auto, cpu, none)->name() == "single");
  CHECK_THROWS_AS(engine::make_run_collective(DistBackend::Nccl, cpu, none), std::invalid_argument);
}

TEST_CASE("the NCCL id is made on rank 0 only and broadcast to every rank") {
  SequentialWorld world;
  int made = 0;
  std::vector<engine::dist::NcclId> ids;
  for (int r = 0; r < 4; ++r) {
    SequentialCollective c(world, r, 4);
    ids.push_back(engine::dist::agree_nccl_id(c, [&] {
      ++made;
      engine::dist::NcclId id{};
      for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 37 + 11);
      return id;
    }));
  }
  CHECK(made == 1);
  CHECK(world.broadcasts == 4);
  for (const auto& id : ids) CHECK(id == ids[0]);
  CHECK(ids[0][1] == static_cast<char>(48));
}

TEST_CASE("a rank uses the GPU of its local rank, and too few GPUs are refused with the rank named") {
  CHECK(engine::dist::nccl_device_for(5, 1, 2) == 1);
  CHECK(message_of([] { engine::dist::nccl_device_for(3, 2, 2); }) ==
        "rank 3 is local rank 2 on its machine, which has 2 GPU(s): NCCL needs one GPU per rank, so start at most 2 "
        "ranks per machine (or use dist.backend=mpi)");
  CHECK(message_of([] { engine::dist::nccl_device_for(0, 0, 0); }) ==
        "rank 0: dist.backend=nccl needs a GPU, and this machine has none");
}

TEST_CASE("NCCL that is not built or cannot load is refused with what to do") {
  if (!engine::nccl_built()) {
    CHECK(engine::nccl_version().empty());
    CHECK(message_of([] { engine::make_nccl_collective(std::make_unique<engine::SingleProcessCollective>(), 0); })
              .find("built without NCCL") != std::string::npos);
    return;
  }
  ::setenv("ENGINE_NCCL_LIBRARY", "/nonexistent/libnccl-missing.so.2", 1);
  CHECK(engine::nccl_version().empty());
  const std::string m =
      message_of([] { engine::make_nccl_collective(std::make_unique<engine::SingleProcessCollective>(), 0); });
  CHECK(m.find("cannot load the NCCL library /nonexistent/libnccl-missing.so.2") != std::string::npos);
  CHECK(m.find("LD_LIBRARY_PATH") != std::string::npos);
  CHECK(m.find("dist.backend=mpi") != std::string::npos);
  ::unsetenv("ENGINE_NCCL_LIBRARY");
  // Where libnccl.so.2 loads (no GPU needed for its version): "X.Y.Z (headers X.Y.Z)".
  const std::string v = engine::nccl_version();
  MESSAGE("libnccl.so.2 here: " << (v.empty() ? "not loadable" : v));
  if (!v.empty()) CHECK(v.find(" (headers ") != std::string::npos);
}
