// Private to io/: numbers as the checkpoint tools and messages print them.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace engine {
namespace checkpoint_internal {

inline std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

// Shortest text that reads back as the same double.
inline std::string fmt_double(double v) {
  char buf[40];
  for (int prec = 15; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v || std::isnan(v)) break;
  }
  return buf;
}

inline std::string fmt_short(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace checkpoint_internal
}  // namespace engine
