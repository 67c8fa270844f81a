#include "cli/quantity.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace tf::cli {
namespace {

std::string Lower(std::string_view s) {
  std::string out;
  for (char c : s) out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  return out;
}

Status Bad(std::string_view flag, std::string_view text, const char* why) {
  return InvalidArgument(std::string(flag) + " " + std::string(text) + ": " + why);
}

}  // namespace

StatusOr<double> ParsePositive(std::string_view flag, std::string_view text, double max) {
  std::string s(text);
  char* end = nullptr;
  // Decimal only: strtod would also take hex ("0x32" as 50), "inf" and "nan".
  if (s.find_first_not_of("0123456789.eE+-") != std::string::npos) return Bad(flag, text, "not a number");
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end == s.c_str() || *end != '\0') return Bad(flag, text, "not a number");
  if (!std::isfinite(v)) return Bad(flag, text, "too large");
  if (v <= 0) return Bad(flag, text, "must be greater than zero");
  if (max > 0 && v > max) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "must be at most %g", max);
    return Bad(flag, text, buf);
  }
  return v;
}

StatusOr<double> ParseLimit(std::string_view flag, std::string_view text) {
  if (text == "0" || text == "none") return 0.0;
  return ParsePositive(flag, text);
}

StatusOr<uint64_t> ParseVramLimitMib(std::string_view flag, std::string_view text) {
  if (text == "0" || text == "none") return uint64_t{0};
  StatusOr<uint64_t> bytes = ParseVramSize(flag, text);
  if (!bytes.ok()) return bytes.status();
  return (*bytes + (1ull << 20) - 1) >> 20;
}

StatusOr<uint64_t> ParseCount(std::string_view flag, std::string_view text, uint64_t max) {
  std::string s(text);
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return Bad(flag, text, "not a whole number");
  if (s.size() > 12 || std::stoull(s) > max) return Bad(flag, text, ("must be at most " + std::to_string(max)).c_str());
  return std::stoull(s);
}

StatusOr<uint64_t> ParseVramSize(std::string_view flag, std::string_view text) {
  std::string s(text);
  char* end = nullptr;
  // The number part decimal only (strtod would also take hex, "inf" and "nan").
  const size_t number = s.find_first_not_of("0123456789.eE+-");
  const bool hex = s.size() > 1 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
  if (number == 0 || hex) return Bad(flag, text, "not a size (examples: 8GiB, 512MiB)");
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end == s.c_str()) return Bad(flag, text, "not a size (examples: 8GiB, 512MiB)");
  std::string unit = Lower(std::string_view(end));
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  double mult;
  if (unit.empty() || unit == "mib" || unit == "m" || unit == "mi") mult = 1024.0 * 1024;
  else if (unit == "gib" || unit == "g" || unit == "gi") mult = 1024.0 * 1024 * 1024;
  else if (unit == "kib" || unit == "k" || unit == "ki") mult = 1024.0;
  else if (unit == "tib" || unit == "t" || unit == "ti") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "b") mult = 1;
  else return Bad(flag, text, "unknown unit (use B, KiB, MiB, GiB or TiB)");
  if (!std::isfinite(v) || v <= 0) return Bad(flag, text, "must be greater than zero");
  double bytes = v * mult;
  if (bytes >= 1.8e19) return Bad(flag, text, "too large");
  if (bytes < 1) return Bad(flag, text, "smaller than one byte");
  return static_cast<uint64_t>(bytes);
}

std::string FormatBytes(uint64_t bytes) {
  char buf[32];
  if (bytes >= (1ull << 30)) {
    std::snprintf(buf, sizeof(buf), "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
  } else {
    std::snprintf(buf, sizeof(buf), "%llu MiB", static_cast<unsigned long long>(bytes >> 20));
  }
  return buf;
}

StatusOr<uint64_t> ParseDurationMs(std::string_view flag, std::string_view text) {
  const std::string shown(text);
  if (text == "0" || text == "never") return uint64_t{0};
  size_t digits = 0;
  while (digits < text.size() && ((text[digits] >= '0' && text[digits] <= '9') || text[digits] == '.')) ++digits;
  std::string_view unit = text.substr(digits);
  double scale = 0;
  if (unit.empty() || unit == "s") scale = 1000;
  else if (unit == "ms") scale = 1;
  else if (unit == "m") scale = 60'000;
  else if (unit == "h") scale = 3'600'000;
  auto bad = [&] {
    return InvalidArgument(std::string(flag) + " " + shown +
                           ": give a duration such as 500ms, 10s, 5m or 1h (0 or never: off)");
  };
  if (digits == 0 || scale == 0) return bad();
  auto n = ParsePositive(flag, text.substr(0, digits));
  if (!n.ok()) return bad();
  double ms = *n * scale;
  if (ms > 30.0 * 24 * 3'600'000) return InvalidArgument(std::string(flag) + " " + shown + ": at most 30 days");
  if (ms < 1) return InvalidArgument(std::string(flag) + " " + shown + ": at least 1ms (0 or never: off)");
  return static_cast<uint64_t>(ms);
}

}  // namespace tf::cli
