# Finds cuDNN (CMake has no module for it) and provides the imported target CUDNN::cudnn.
# Searches CUDNN_ROOT, then the CUDA toolkit's library directory, then the system.
# Installed with the engine package so that engineConfig.cmake can find it again.
#   CUDNN_FOUND, CUDNN_LIBRARY, CUDNN_INCLUDE_DIR
include(FindPackageHandleStandardArgs)

set(_cudnn_hints ${CUDNN_ROOT} $ENV{CUDNN_ROOT})
if(CUDAToolkit_LIBRARY_DIR)
  list(APPEND _cudnn_hints ${CUDAToolkit_LIBRARY_DIR}/..)
endif()
list(APPEND _cudnn_hints /usr/local/cuda)

find_library(CUDNN_LIBRARY NAMES cudnn
  HINTS ${_cudnn_hints} PATH_SUFFIXES lib64 lib lib/x64)
find_path(CUDNN_INCLUDE_DIR NAMES cudnn.h
  HINTS ${_cudnn_hints} PATH_SUFFIXES include)
unset(_cudnn_hints)

find_package_handle_standard_args(CUDNN REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR)
mark_as_advanced(CUDNN_LIBRARY CUDNN_INCLUDE_DIR)

if(CUDNN_FOUND AND NOT TARGET CUDNN::cudnn)
  add_library(CUDNN::cudnn UNKNOWN IMPORTED)
  set_target_properties(CUDNN::cudnn PROPERTIES
    IMPORTED_LOCATION "${CUDNN_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
endif()
