// Builds without MPI: the single-process collective only (engine/core/collective/collective.cpp
// refuses a multi-rank launch before reaching here).
#include <stdexcept>

#include "core/collective/mpi_entry.h"

namespace engine {

bool mpi_built() { return false; }
std::string mpi_library_version() { return ""; }

namespace dist {
std::unique_ptr<Collective> make_mpi_collective(const LaunchInfo&, const CollectiveOptions&) {
  throw std::runtime_error("this engine was built without MPI (install libopenmpi-dev and reconfigure)");
}
}  // namespace dist

}  // namespace engine
