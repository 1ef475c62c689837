// A UTC time as text, in the few forms the engine writes (one helper).
#pragma once
#include <chrono>
#include <ctime>
#include <string>

namespace engine {

enum class UtcFormat {
  Iso8601,   // 2026-12-01T23:58:00Z: checkpoint metadata (created_utc)
  Readable,  // 2026-12-01 23:58:00 UTC: messages and the report
  Compact,   // 20261201T235800Z: in file names
};

// `when` (to the second; a run's clock is its Env's wall_now()) as text.
inline std::string utc_text(std::chrono::system_clock::time_point when, UtcFormat format) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(when);
  std::tm utc{};
  if (!gmtime_r(&seconds, &utc)) return "?";
  const char* pattern = format == UtcFormat::Iso8601    ? "%Y-%m-%dT%H:%M:%SZ"
                        : format == UtcFormat::Readable ? "%Y-%m-%d %H:%M:%S UTC"
                                                        : "%Y%m%dT%H%M%SZ";
  char text[40];
  return std::strftime(text, sizeof text, pattern, &utc) ? text : "?";
}

// The system's time now, for what is no part of a run (the report's "Generated").
inline std::string utc_now(UtcFormat format) { return utc_text(std::chrono::system_clock::now(), format); }

}  // namespace engine
