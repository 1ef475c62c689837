# Test `layer_walls` (cmake -P): the layers' include walls hold (docs/architecture.md).
#   1. For every layer L and every public header H: `#include "engine/H"` preprocesses
#      through L's include view exactly when H belongs to L or a layer below it. So a
#      header that includes one above its own layer fails here too.
#   2. A real build of a core-layer file that includes engine/train/trainer.h fails with
#      "engine/train/trainer.h: No such file or directory", and its control (the same target
#      settings, lower headers only) builds.
# Arguments: -DTABLE=<views>/table.cmake -DCXX=<compiler> -DBUILD_DIR=<build> -DCMAKE_COMMAND_BIN=<cmake>
foreach(v TABLE CXX BUILD_DIR CMAKE_COMMAND_BIN)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_walls.cmake: -D${v}=... missing")
  endif()
endforeach()
include(${TABLE})  # ENGINE_WALL_LAYERS, ENGINE_WALL_HEADERS_<layer>, ENGINE_WALL_VIEWS

set(failures 0)
set(checked 0)
set(probe ${BUILD_DIR}/layer_walls_probe.cpp)
foreach(view_layer IN LISTS ENGINE_WALL_LAYERS)
  set(visible ON)  # headers of layers up to and including view_layer are visible
  foreach(header_layer IN LISTS ENGINE_WALL_LAYERS)
    foreach(h IN LISTS ENGINE_WALL_HEADERS_${header_layer})
      file(WRITE ${probe} "#include \"engine/${h}\"\n")
      execute_process(COMMAND ${CXX} -std=c++17 -E -o /dev/null -I${ENGINE_WALL_VIEWS}/${view_layer} ${probe}
        RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
      math(EXPR checked "${checked} + 1")
      if(visible AND NOT rc EQUAL 0)
        message(SEND_ERROR "layer ${view_layer} cannot include engine/${h} (layer ${header_layer}, at or below it):\n${err}")
        math(EXPR failures "${failures} + 1")
      elseif(NOT visible AND rc EQUAL 0)
        message(SEND_ERROR "layer ${view_layer} can include engine/${h} of the higher layer ${header_layer}")
        math(EXPR failures "${failures} + 1")
      elseif(NOT visible AND NOT err MATCHES "engine/[a-z_/]+\\.h: No such file or directory")
        message(SEND_ERROR "engine/${h} through layer ${view_layer}: expected a missing-header error, got:\n${err}")
        math(EXPR failures "${failures} + 1")
      endif()
    endforeach()
    if(header_layer STREQUAL view_layer)
      set(visible OFF)
    endif()
  endforeach()
endforeach()
file(REMOVE ${probe})
message(STATUS "include matrix: ${checked} (layer, header) pairs checked")

execute_process(COMMAND ${CMAKE_COMMAND_BIN} --build ${BUILD_DIR} --target engine_wall_probe_control
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(SEND_ERROR "the control probe (core layer, lower headers only) does not build:\n${out}")
  math(EXPR failures "${failures} + 1")
endif()
execute_process(COMMAND ${CMAKE_COMMAND_BIN} --build ${BUILD_DIR} --target engine_wall_probe_up
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(SEND_ERROR "a core-layer file including engine/train/trainer.h built: the wall is gone")
  math(EXPR failures "${failures} + 1")
elseif(NOT out MATCHES "core_includes_trainer.cpp:[0-9]+:[0-9]+: fatal error: engine/train/trainer.h: No such file or directory")
  message(SEND_ERROR "the up-include probe failed, but not at the wall:\n${out}")
  math(EXPR failures "${failures} + 1")
else()
  string(REGEX MATCH "[^\n]*fatal error: engine/train/trainer.h[^\n]*" line "${out}")
  message(STATUS "up-include refused as expected: ${line}")
endif()
if(failures GREATER 0)
  message(FATAL_ERROR "${failures} wall check(s) failed")
endif()
