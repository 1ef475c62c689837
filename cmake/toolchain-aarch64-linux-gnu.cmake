# Cross-compiling the engine for 64-bit Arm Linux (aarch64) on an x86-64 Debian host
# (docs/packaging.md, "aarch64"): Debian's cross compiler (crossbuild-essential-arm64) and
# the arm64 builds of HDF5 and zlib unpacked into a folder (ENGINE_AARCH64_SYSROOT).
#   cmake -S . -B build-arm64 --toolchain cmake/toolchain-aarch64-linux-gnu.cmake \
#         -DENGINE_AARCH64_SYSROOT=/path/to/sysroot -DENGINE_CUDA=OFF -DENGINE_MPI=OFF
# A native build on an aarch64 machine needs no toolchain file.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(ENGINE_AARCH64_TRIPLE aarch64-linux-gnu CACHE STRING "Prefix of the cross compiler's programs")
set(CMAKE_C_COMPILER ${ENGINE_AARCH64_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${ENGINE_AARCH64_TRIPLE}-g++)

# Where the arm64 libraries are: the cross compiler's own (Debian: /usr/aarch64-linux-gnu)
# and, optionally, a folder the arm64 .deb packages were unpacked into (dpkg-deb -x).
set(ENGINE_AARCH64_SYSROOT "" CACHE PATH "Folder holding the arm64 libraries (usr/lib/aarch64-linux-gnu, usr/include)")
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES ENGINE_AARCH64_SYSROOT ENGINE_AARCH64_TRIPLE)
set(CMAKE_FIND_ROOT_PATH /usr/${ENGINE_AARCH64_TRIPLE})
if(ENGINE_AARCH64_SYSROOT)
  list(PREPEND CMAKE_FIND_ROOT_PATH ${ENGINE_AARCH64_SYSROOT})
  # The linker resolves the libraries HDF5 itself needs (curl, ssl, ...) in the same folder.
  string(APPEND CMAKE_EXE_LINKER_FLAGS_INIT
    " -Wl,-rpath-link,${ENGINE_AARCH64_SYSROOT}/usr/lib/aarch64-linux-gnu"
    " -Wl,-rpath-link,${ENGINE_AARCH64_SYSROOT}/lib/aarch64-linux-gnu")
  string(APPEND CMAKE_SHARED_LINKER_FLAGS_INIT
    " -Wl,-rpath-link,${ENGINE_AARCH64_SYSROOT}/usr/lib/aarch64-linux-gnu"
    " -Wl,-rpath-link,${ENGINE_AARCH64_SYSROOT}/lib/aarch64-linux-gnu")
endif()
# Programs (h5cc among them) are the host's; libraries and headers the target's only.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
# Header-only packages (nlohmann_json, CLI11) are architecture-independent: the host's do.
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# The host's h5cc would report the host's HDF5: a wrapper that always fails makes
# FindHDF5 look for the target's by its files instead.
set(HDF5_C_COMPILER_EXECUTABLE /bin/false CACHE FILEPATH "No HDF5 compiler wrapper when cross-compiling")
set(HDF5_NO_FIND_PACKAGE_CONFIG_FILE ON)
# Emulated runs (tests, try_run): qemu-aarch64 where it is installed.
find_program(ENGINE_QEMU_AARCH64 qemu-aarch64)
if(ENGINE_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${ENGINE_QEMU_AARCH64} -L /usr/${ENGINE_AARCH64_TRIPLE})
endif()
