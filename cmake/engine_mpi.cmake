# Distributed training (docs/distributed.md): the core sources of engine/core/collective/ always,
# and the MPI collective when CMake finds MPI (Open MPI: libopenmpi-dev). Without MPI
# the engine builds and runs in one process, and says so here.
#   include(engine_mpi) after add_library(engine ...)
option(ENGINE_MPI "Build the MPI collective when MPI is found" ON)

set(ENGINE_COLLECTIVE_DIR ${CMAKE_CURRENT_LIST_DIR}/../engine/core/collective)
target_sources(engine PRIVATE
  ${ENGINE_COLLECTIVE_DIR}/collective.cpp
  ${ENGINE_COLLECTIVE_DIR}/batch_chunks.cpp
  ${ENGINE_COLLECTIVE_DIR}/parameter_shards.cpp)

set(ENGINE_WITH_MPI OFF)
if(ENGINE_MPI)
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND)
    set(ENGINE_WITH_MPI ON)
  endif()
endif()

if(ENGINE_WITH_MPI)
  target_sources(engine PRIVATE ${ENGINE_COLLECTIVE_DIR}/mpi_collective.cpp)
  # Private: no public header includes mpi.h; a static libengine.a carries the link
  # dependency to its users through the exported target.
  target_link_libraries(engine PRIVATE MPI::MPI_CXX)
  target_compile_definitions(engine PRIVATE ENGINE_WITH_MPI=1)
  find_program(ENGINE_MPIEXEC NAMES mpirun mpiexec HINTS ${MPIEXEC_EXECUTABLE})
  message(STATUS "engine: MPI ${MPI_CXX_VERSION} found: data-parallel runs under mpirun/srun (mpirun: ${ENGINE_MPIEXEC})")
else()
  target_sources(engine PRIVATE ${ENGINE_COLLECTIVE_DIR}/no_mpi.cpp)
  message(STATUS "engine: MPI not found (or ENGINE_MPI=OFF): one process only; multi-rank launches are refused")
endif()
include(engine_nccl)  # cmake/engine_nccl.cmake: the NCCL collective when CUDA and nccl.h are found
