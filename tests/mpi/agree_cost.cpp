// What the per-step stop agreement costs (docs/distributed.md "Stops and preemption"):
// times Collective::agree_max on the vector Trainer exchanges after every step (five
// int64) on this process's collective, and prints the mean on rank 0.
//   mpirun -np N agree_cost [CALLS]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "engine/core/collective.h"

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 1000;
  auto comm = engine::make_process_collective(engine::detect_launch());
  std::vector<int64_t> flags(5, 0);
  for (int i = 0; i < 20; ++i) comm->agree_max(flags);  // warm-up: connections, buffers
  const auto t0 = std::chrono::steady_clock::now();
  int64_t seen = 0;
  for (int i = 0; i < calls; ++i) {
    flags[0] = i == calls - 1 && comm->rank() == comm->size() - 1;  // the last call agrees on a stop
    seen += comm->agree_max(flags)[0];
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  if (comm->rank() == 0)
    std::printf("agree_max of 5 int64 on %d ranks (%s): %.1f us per call over %d calls; agreed stops %lld\n",
                comm->size(), comm->name().c_str(), us / calls, calls, static_cast<long long>(seen));
  return seen == 1 ? 0 : 1;
}
