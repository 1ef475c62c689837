// Private to the export (engine/train/export*.cpp): what writing an export (export.cpp)
// and checking one (export_verify.cpp) share: the format tag, numbers as the metadata
// writes them, and a whole file read.
#pragma once
#include <cstring>
#include <sstream>
#include <string>

#include "engine/io/env.h"
#include "engine/train/export.h"
#include "io/read_file.h"

namespace engine {
namespace export_internal {

constexpr const char* kExportFormatTag = "engine-export";

inline std::string number_text(double v) {
  std::ostringstream o;
  o.precision(17);
  o << v;
  return o.str();
}

inline std::string read_all(const std::string& path) {
  std::string bytes;
  if (const int err = read_whole_file(Env::posix(), path, bytes); err != 0)
    throw ExportError(path + ": cannot read (" + std::strerror(err) + ")");
  return bytes;
}

}  // namespace export_internal
}  // namespace engine
