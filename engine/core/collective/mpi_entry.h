// The MPI side of engine/core/collective: engine/core/collective/mpi_collective.cpp where CMake found MPI,
// engine/core/collective/no_mpi.cpp otherwise (cmake/engine_mpi.cmake picks one).
#pragma once
#include <memory>

#include "engine/core/collective.h"

namespace engine::dist {

// Initialises MPI (once per process) and returns the collective over MPI_COMM_WORLD;
// MPI_Finalize runs at exit. Every collective call is watched by options.timeout_s.
std::unique_ptr<Collective> make_mpi_collective(const LaunchInfo& launch, const CollectiveOptions& options);

}  // namespace engine::dist
