// The current UTC time as text, in the few forms the engine writes (one helper).
#pragma once
#include <ctime>
#include <string>

namespace engine {

enum class UtcFormat {
  Iso8601,   // 2026-12-01T23:58:00Z: checkpoint metadata (created_utc)
  Readable,  // 2026-12-01 23:58:00 UTC: messages and the report
  Compact,   // 20261201T235800Z: in file names
};

inline std::string utc_now(UtcFormat format) {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  if (!gmtime_r(&now, &utc)) return "?";
  const char* pattern = format == UtcFormat::Iso8601    ? "%Y-%m-%dT%H:%M:%SZ"
                        : format == UtcFormat::Readable ? "%Y-%m-%d %H:%M:%S UTC"
                                                        : "%Y%m%dT%H%M%SZ";
  char text[40];
  return std::strftime(text, sizeof text, pattern, &utc) ? text : "?";
}

}  // namespace engine
