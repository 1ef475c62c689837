# NCCL for CUDA ranks (docs/distributed.md, "GPU ranks"): the NCCL collective is compiled
# when the CUDA backend is built and nccl.h is found (the CUDA toolkit's include folder
# first). It opens libnccl.so.2 with dlopen at run time, so nothing links against NCCL
# and a binary runs without it (dist.backend=nccl then says what to install).
#   include(engine_nccl) from cmake/engine_mpi.cmake, after add_library(engine ...)
option(ENGINE_NCCL "Build the NCCL collective when CUDA and nccl.h are found" ON)

target_sources(engine PRIVATE
  ${ENGINE_COLLECTIVE_DIR}/nccl_bootstrap.cpp
  ${ENGINE_COLLECTIVE_DIR}/nccl_staging.cpp)

set(ENGINE_WITH_NCCL OFF)
if(ENGINE_NCCL AND ENGINE_WITH_CUDA)
  find_path(ENGINE_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  if(ENGINE_NCCL_INCLUDE_DIR)
    set(ENGINE_WITH_NCCL ON)
  endif()
endif()

if(ENGINE_WITH_NCCL)
  file(STRINGS ${ENGINE_NCCL_INCLUDE_DIR}/nccl.h _nccl_version_lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  set(_nccl_version "")
  foreach(line IN LISTS _nccl_version_lines)
    string(REGEX REPLACE "^#define NCCL_[A-Z]+ +([0-9]+).*" "\\1" part "${line}")
    string(APPEND _nccl_version ".${part}")
  endforeach()
  string(SUBSTRING "${_nccl_version}" 1 -1 _nccl_version)
  target_sources(engine PRIVATE ${ENGINE_COLLECTIVE_DIR}/nccl_collective.cpp)
  set_source_files_properties(${ENGINE_COLLECTIVE_DIR}/nccl_collective.cpp PROPERTIES
    INCLUDE_DIRECTORIES "${ENGINE_NCCL_INCLUDE_DIR};${CUDAToolkit_INCLUDE_DIRS}")
  target_link_libraries(engine PRIVATE ${CMAKE_DL_LIBS})
  message(STATUS "engine: NCCL ${_nccl_version} header found (${ENGINE_NCCL_INCLUDE_DIR}): dist.backend=nccl "
    "for CUDA ranks; libnccl.so.2 is opened at run time (dlopen), not linked")
else()
  target_sources(engine PRIVATE ${ENGINE_COLLECTIVE_DIR}/nccl_none.cpp)
  message(STATUS "engine: NCCL not built (needs the CUDA backend and nccl.h, or ENGINE_NCCL=OFF): CUDA ranks "
    "exchange through host memory (dist.backend=mpi)")
endif()
