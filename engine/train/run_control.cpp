#include "engine/train/run_control.h"

#include <cctype>
#include <cstdlib>
#include <vector>

namespace engine {

static_assert(std::atomic<bool>::is_always_lock_free,
              "RunControl is used from signal handlers: its flags must be lock-free");

namespace {

// A non-negative decimal number filling the whole string ("90", "1.5"; no exponent).
std::optional<double> number(const std::string& s) {
  int digits = 0, points = 0;
  for (char c : s) {
    if (std::isdigit(static_cast<unsigned char>(c))) ++digits;
    else if (c == '.') ++points;
    else return std::nullopt;
  }
  if (digits == 0 || points > 1) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return v;
}

// Whole non-negative integer of at most 9 digits.
std::optional<long> integer(const std::string& s) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  return std::strtol(s.c_str(), nullptr, 10);
}

}  // namespace

std::optional<double> parse_duration_seconds(const std::string& text) {
  std::optional<double> seconds;
  if (text.find(':') != std::string::npos) {
    std::string rest = text;
    long days = 0;
    if (const auto dash = rest.find('-'); dash != std::string::npos) {
      const auto d = integer(rest.substr(0, dash));
      if (!d) return std::nullopt;
      days = *d;
      rest = rest.substr(dash + 1);
    }
    std::vector<long> parts;
    std::size_t start = 0;
    while (true) {
      const auto colon = rest.find(':', start);
      const auto p = integer(rest.substr(start, colon == std::string::npos ? std::string::npos : colon - start));
      if (!p) return std::nullopt;
      parts.push_back(*p);
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
    if (parts.size() < 2 || parts.size() > 3) return std::nullopt;
    // MM:SS (minutes may exceed 59, as Slurm allows) or HH:MM:SS.
    if (parts.back() >= 60 || (parts.size() == 3 && parts[1] >= 60)) return std::nullopt;
    if (parts.size() == 2) parts.insert(parts.begin(), 0);
    seconds = ((days * 24.0 + parts[0]) * 60.0 + parts[1]) * 60.0 + parts[2];
  } else {
    double unit = 1;
    std::string num = text;
    if (!num.empty()) {
      switch (num.back()) {
        case 's': unit = 1; num.pop_back(); break;
        case 'm': unit = 60; num.pop_back(); break;
        case 'h': unit = 3600; num.pop_back(); break;
        case 'd': unit = 86400; num.pop_back(); break;
        default: break;
      }
    }
    const auto v = number(num);
    if (!v) return std::nullopt;
    seconds = *v * unit;
  }
  if (!(*seconds > 0)) return std::nullopt;
  return seconds;
}

}  // namespace engine
