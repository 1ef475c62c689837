# The engine's layers (docs/architecture.md), each its own CMake target, linked only
# downward, so an #include that runs back up fails to build:
#
#   kernels -> core -> io -> nn -> train [-> run] ; apps (apps/) on top, outside libengine.a
#
# Each layer is an OBJECT library compiled against its own include VIEW,
# <build>/layers/<layer>/, which CMake generates from the table below:
#   - engine/<layer>/  a link to include/engine/<layer>/, the public headers of that
#                      layer, for this layer and the layers below it, and no other;
#   - <prefix>/        a link to the folder of each private prefix of this layer and the
#                      layers below (kernels/, io/, nn/ ...).
# The source root and include/ are on no layer's include path, so a header of a higher
# layer is simply not there: "fatal error: engine/train/trainer.h: No such file or directory".
# Every prefix is served from exactly one root. libengine.a is all the layers' objects.
#
# Sources and public headers are globbed per layer folder: a new .cpp lands in the layer
# of its folder, a new public header in the layer of its include/engine/<layer>/ folder,
# with no CMake edit. A stray file directly under engine/ or include/engine/, or an
# unknown subfolder there, stops the configure.

set(ENGINE_LAYER_VIEWS ${PROJECT_BINARY_DIR}/layers)
set(_engine_view_layers "")    # the layers declared so far (their include/engine/<layer>/)
set(_engine_view_prefixes "")  # prefix=folder of the layers declared so far
set(ENGINE_LAYERS "")           # layer names, bottom first (those with sources)
set(_engine_all_layers "")      # and with those still empty
set(_engine_table "")           # for the test layer_walls
set(_engine_prev_layer "")

# engine_layer(NAME
#   SOURCES  glob patterns, relative to the source root
#   EXCLUDE  regular expressions of globbed files to leave out
#   PREFIXES prefix=folder ... (private headers: #include "prefix/x.h" is folder/x.h)
# Its public headers are include/engine/NAME/ (#include "engine/NAME/x.h").
macro(engine_layer name)
  cmake_parse_arguments(_L "" "" "SOURCES;EXCLUDE;PREFIXES" ${ARGN})
  list(APPEND _engine_view_layers ${name})
  list(APPEND _engine_view_prefixes ${_L_PREFIXES})
  file(GLOB_RECURSE _L_HEADERS RELATIVE ${PROJECT_SOURCE_DIR}/include/engine CONFIGURE_DEPENDS
    ${PROJECT_SOURCE_DIR}/include/engine/${name}/*.h)
  string(REPLACE ";" " " _hs "${_L_HEADERS}")
  string(APPEND _engine_table "set(ENGINE_WALL_HEADERS_${name} ${_hs})\n")
  list(APPEND _engine_all_layers ${name})
  _engine_make_view(${name})

  set(_srcs "")
  foreach(_pattern IN LISTS _L_SOURCES)
    file(GLOB _found CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${_pattern})
    list(APPEND _srcs ${_found})
  endforeach()
  foreach(_re IN LISTS _L_EXCLUDE)
    list(FILTER _srcs EXCLUDE REGEX "${_re}")
  endforeach()
  if(_srcs)
    add_library(engine_${name} OBJECT ${_srcs})
    target_include_directories(engine_${name} PRIVATE ${ENGINE_LAYER_VIEWS}/${name})
    engine_layer_settings(engine_${name})
    if(_engine_prev_layer)
      # Usage requirements (third-party libraries, definitions) flow up; the view does not.
      target_link_libraries(engine_${name} PUBLIC engine_${_engine_prev_layer})
    endif()
    list(APPEND ENGINE_LAYERS ${name})
    set(_engine_prev_layer ${name})
  endif()
endmacro()

function(_engine_make_view name)
  set(view ${ENGINE_LAYER_VIEWS}/${name})
  file(REMOVE_RECURSE ${view})  # removes the links, never what they point to
  file(MAKE_DIRECTORY ${view}/engine)
  foreach(layer IN LISTS _engine_view_layers)
    if(IS_DIRECTORY ${PROJECT_SOURCE_DIR}/include/engine/${layer})
      file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/engine/${layer} ${view}/engine/${layer} SYMBOLIC)
    endif()
  endforeach()
  _engine_link_prefixes(${view} "${_engine_view_prefixes}")
endfunction()

function(_engine_link_prefixes view prefixes)
  foreach(p IN LISTS prefixes)
    string(REPLACE "=" ";" p "${p}")
    list(GET p 0 prefix)
    list(GET p 1 folder)
    if(NOT IS_DIRECTORY ${PROJECT_SOURCE_DIR}/${folder})
      continue()  # a layer folder nobody has created yet
    endif()
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${folder} ${view}/${prefix} SYMBOLIC)
  endforeach()
endfunction()

# ---- The table: bottom layer first. ----------------------------------------------------

# Kernels work on raw pointers and know no Tensor: the op list, its three
# implementations, and the device runtime (memory, copies) the core types allocate through.
set(_kernel_sources kernels/op_table.cpp kernels/ref/*.cpp kernels/cpu/*.cpp)
# ENGINE_CUDA_EMULATION_SOURCE is for tests only (tests/emulated_cuda/, the emulated_cuda_*
# tests): a file under the source root that replaces kernels/no_cuda.cpp in a build
# without CUDA, e.g. an emulated CUDA device on host memory that traces what a CUDA step
# asks for. Empty by default: a normal build (with or without CUDA) never uses it.
set(ENGINE_CUDA_EMULATION_SOURCE "" CACHE FILEPATH
  "Test only: replaces kernels/no_cuda.cpp in a build without CUDA (empty: no_cuda.cpp)")
set(_kernel_no_cuda kernels/no_cuda.cpp)
if(ENGINE_CUDA_EMULATION_SOURCE AND NOT ENGINE_WITH_CUDA)
  file(RELATIVE_PATH _kernel_no_cuda ${PROJECT_SOURCE_DIR} ${ENGINE_CUDA_EMULATION_SOURCE})
  if(_kernel_no_cuda MATCHES "^\\.\\./" OR NOT EXISTS ${PROJECT_SOURCE_DIR}/${_kernel_no_cuda})
    message(FATAL_ERROR "ENGINE_CUDA_EMULATION_SOURCE: ${ENGINE_CUDA_EMULATION_SOURCE} is not a file under ${PROJECT_SOURCE_DIR}")
  endif()
  message(STATUS "engine: TEST BUILD, the CUDA runtime and ops are ${_kernel_no_cuda}")
elseif(ENGINE_CUDA_EMULATION_SOURCE)
  message(FATAL_ERROR "ENGINE_CUDA_EMULATION_SOURCE needs a build without CUDA (-DENGINE_CUDA=OFF)")
endif()
if(ENGINE_WITH_CUDA)
  list(APPEND _kernel_sources kernels/cuda/*.cu kernels/cuda/*.cpp)
else()
  list(APPEND _kernel_sources ${_kernel_no_cuda})
endif()
engine_layer(kernels
  SOURCES ${_kernel_sources}
  PREFIXES kernels=kernels)
# The generated stubs keep the parameter names of the op list.
set_source_files_properties(${_kernel_no_cuda} kernels/op_table.cpp PROPERTIES COMPILE_OPTIONS -Wno-unused-parameter)

# Core types: tensors on a device, the state interface, named random streams. engine/core/collective/
# (the Collective) belongs here too; its sources are chosen by cmake/engine_mpi.cmake
# (which implementation depends on whether MPI is found), so they are not globbed.
engine_layer(core
  SOURCES engine/core/*.cpp
  PREFIXES core=engine/core)

# Data and checkpoint I/O: the config, IDX files and datasets, the checkpoint format,
# atomic files, and the Env every file call and clock of a run goes through. Knows
# states, not models.
engine_layer(io
  SOURCES io/*.cpp
  PREFIXES io=io)

# Model and nn pieces: modules, layers, models and their registry, optimizer, scheduler,
# loss scaler.
engine_layer(nn
  SOURCES engine/nn/*.cpp models/*.cpp
  PREFIXES nn=engine/nn models=models)

# The trainer: the loop, evaluation, inference, run control, the time budget and the
# ranks' start agreement. The run lock and TensorBoard's writer live in the run layer.
engine_layer(train
  SOURCES engine/train/*.cpp
  PREFIXES train=engine/train)

# The run directory (engine/run/): what owns <run-dir>, above the trainer. Created once
# the folder holds sources.
engine_layer(run
  SOURCES engine/run/*.cpp
  PREFIXES run=engine/run)

# ---- Checks: every file is in exactly one layer. ----------------------------------------
file(GLOB _public RELATIVE ${PROJECT_SOURCE_DIR}/include/engine LIST_DIRECTORIES true CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/include/engine/*)
foreach(entry IN LISTS _public)
  if(NOT IS_DIRECTORY ${PROJECT_SOURCE_DIR}/include/engine/${entry} OR NOT entry IN_LIST _engine_all_layers)
    message(FATAL_ERROR "include/engine/${entry}: in no layer; a public header goes in "
      "include/engine/<layer>/ (${_engine_all_layers}; docs/architecture.md)")
  endif()
endforeach()
file(GLOB _stray CONFIGURE_DEPENDS LIST_DIRECTORIES false
  ${PROJECT_SOURCE_DIR}/engine/*.cpp ${PROJECT_SOURCE_DIR}/engine/*.h ${PROJECT_SOURCE_DIR}/engine/*.cu)
if(_stray)
  message(FATAL_ERROR "${_stray}: in no layer; move it into the engine/ subfolder of its "
    "layer (core, nn, train, run; docs/architecture.md)")
endif()
file(GLOB _subdirs LIST_DIRECTORIES true RELATIVE ${PROJECT_SOURCE_DIR}/engine ${PROJECT_SOURCE_DIR}/engine/*)
foreach(d IN LISTS _subdirs)
  if(IS_DIRECTORY ${PROJECT_SOURCE_DIR}/engine/${d} AND NOT d MATCHES "^(core|nn|train|run)$")
    message(FATAL_ERROR "engine/${d}/ is no layer folder (core, nn, train, run): "
      "add it to cmake/engine_layers.cmake or move its files")
  endif()
endforeach()

# ---- The views outside the library. ------------------------------------------------------
# Applications, tests and benchmarks see the public headers through engine::engine
# (include/) and the private prefixes of every layer through this view, which has no
# engine/ folder: one root per prefix for them too. `report/` is the report application.
set(ENGINE_INTERNAL_VIEW ${ENGINE_LAYER_VIEWS}/internal)
file(REMOVE_RECURSE ${ENGINE_INTERNAL_VIEW})
file(MAKE_DIRECTORY ${ENGINE_INTERNAL_VIEW})
_engine_link_prefixes(${ENGINE_INTERNAL_VIEW} "${_engine_view_prefixes};report=apps/report")

# The table for the test layer_walls (tests/layers/check_walls.cmake).
string(REPLACE ";" " " _ls "${_engine_all_layers}")
string(CONCAT _engine_table_text
  "set(ENGINE_WALL_LAYERS ${_ls})\n"
  "set(ENGINE_WALL_VIEWS \"${ENGINE_LAYER_VIEWS}\")\n" "${_engine_table}")
file(WRITE ${ENGINE_LAYER_VIEWS}/table.cmake "${_engine_table_text}")
