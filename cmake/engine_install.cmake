# Install rules: `cmake --install build --prefix P` puts
#   P/lib/libengine.a, P/bin/engine, P/include/engine/... (public headers only),
#   P/lib/cmake/engine/{engineConfig,engineConfigVersion,engineTargets*}.cmake
#     (+ FindCUDNN.cmake when the CUDA backend was built),
#   P/lib/pkgconfig/engine.pc.
# Included from the top-level CMakeLists.txt after the engine and engine_cli targets.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(ENGINE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/engine)

install(TARGETS engine EXPORT engineTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS engine_cli
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The whole of include/engine/ is the public API; private headers live beside their
# sources and are never installed.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/engine
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")

install(EXPORT engineTargets
  NAMESPACE engine::
  FILE engineTargets.cmake
  DESTINATION ${ENGINE_CMAKE_DIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/engineConfig.cmake.in
  ${PROJECT_BINARY_DIR}/engineConfig.cmake
  INSTALL_DESTINATION ${ENGINE_CMAKE_DIR})
# 0.x: a minor version may change the API, so only the same major.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/engineConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/engineConfig.cmake
  ${PROJECT_BINARY_DIR}/engineConfigVersion.cmake
  DESTINATION ${ENGINE_CMAKE_DIR})
if(ENGINE_WITH_CUDA)
  install(FILES ${PROJECT_SOURCE_DIR}/cmake/FindCUDNN.cmake DESTINATION ${ENGINE_CMAKE_DIR})
endif()

# ---- engine.pc. The library is static, so every dependency goes into Requires/Libs
# (not the .private fields): `pkg-config --cflags --libs engine` is enough to link.
# Dependencies with a .pc file of their own are named in Requires; the rest by library
# name (-lfoo), never by this machine's paths. The CUDA libraries (no .pc files) are
# found on the linker's path, or where the variable cuda_ldflags says:
#   pkg-config --define-variable=cuda_ldflags=-L/usr/local/cuda/lib64 --libs engine
find_package(PkgConfig QUIET)
set(_pc_requires "")
set(_pc_libs "")
set(_pc_cflags "")
function(_engine_pc_dep module)  # ARGN: link items to use when `module` has no .pc file
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(_engine_pc_${module} QUIET ${module})
  endif()
  if(_engine_pc_${module}_FOUND)
    set(_pc_requires "${_pc_requires} ${module}" PARENT_SCOPE)
  else()
    # The libraries the Find module reported, by name: /x/libfoo.so -> -lfoo.
    set(flags "")
    foreach(lib IN LISTS ARGN)
      if(lib MATCHES "^-")
        list(APPEND flags "${lib}")
      elseif(lib MATCHES "/lib([^/]+)\\.(so|a)(\\.[0-9.]+)?$")
        list(APPEND flags "-l${CMAKE_MATCH_1}")
      elseif(NOT lib MATCHES "/")
        list(APPEND flags "-l${lib}")
      endif()
    endforeach()
    list(REMOVE_DUPLICATES flags)
    list(JOIN flags " " flags)
    set(_pc_libs "${_pc_libs} ${flags}" PARENT_SCOPE)
  endif()
endfunction()

_engine_pc_dep(nlohmann_json)
_engine_pc_dep(hdf5 ${HDF5_C_LIBRARIES})
_engine_pc_dep(zlib ${ZLIB_LIBRARIES})
if(ENGINE_WITH_ONNX)  # libonnx has no .pc file; protobuf has
  _engine_pc_dep(protobuf protobuf)
  string(APPEND _pc_libs " -lonnx -lonnx_proto")
endif()
if(ENGINE_WITH_MPI)  # cmake/engine_mpi.cmake
  _engine_pc_dep(ompi-cxx ${MPI_CXX_LIBRARIES})
endif()
if(NOT _pc_requires MATCHES "nlohmann_json")
  get_target_property(_json_inc nlohmann_json::nlohmann_json INTERFACE_INCLUDE_DIRECTORIES)
  foreach(dir IN LISTS _json_inc)
    string(APPEND _pc_cflags " -I${dir}")
  endforeach()
endif()
# OpenMP (libgomp) and threads; the CUDA runtime, cuBLAS and cuDNN have no .pc files.
foreach(flag IN LISTS OpenMP_CXX_FLAGS)
  string(APPEND _pc_libs " ${flag}")
endforeach()
if(ENGINE_WITH_CUDA)
  string(APPEND _pc_cflags " -DENGINE_WITH_CUDA=1")
  string(APPEND _pc_libs " \${cuda_ldflags} -lcudnn -lcudart_static -ldl -lrt")
  # Where this build found them, for the build's own checks (tests/embed/run.sh); not
  # installed.
  get_filename_component(_cudnn_dir "${CUDNN_LIBRARY}" DIRECTORY)
  set(_cuda_dirs ${CUDAToolkit_LIBRARY_DIR} ${_cudnn_dir})
  list(REMOVE_DUPLICATES _cuda_dirs)
  list(TRANSFORM _cuda_dirs PREPEND "-L")
  list(JOIN _cuda_dirs " " _cuda_ldflags)
  file(WRITE ${PROJECT_BINARY_DIR}/engine-pc-cuda-ldflags.txt "${_cuda_ldflags}\n")
endif()
string(APPEND _pc_libs " -pthread")
string(STRIP "${_pc_requires}" ENGINE_PC_REQUIRES)
set(ENGINE_PC_LIBS "${_pc_libs}")
set(ENGINE_PC_CFLAGS "${_pc_cflags}")
# ${pcfiledir} is P/<libdir>/pkgconfig: the prefix is found relative to it, so the
# installed tree can be moved.
file(RELATIVE_PATH ENGINE_PC_PREFIX_FROM_PCDIR
  /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" ENGINE_PC_PREFIX_FROM_PCDIR "${ENGINE_PC_PREFIX_FROM_PCDIR}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/engine.pc.in ${PROJECT_BINARY_DIR}/engine.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/engine.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
