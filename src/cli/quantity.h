// Parsing of the quantities users type on the command line: VRAM sizes ("8GiB", "512MiB",
// "1.5G", "8192" = MiB) and compute shares ("200" TFLOPS, "30" percent). Every error names the
// flag and the value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace tf::cli {

// Bytes for a size with a binary unit: B, KiB/K, MiB/M, GiB/G, TiB/T (case-insensitive, an
// optional space). A bare number means MiB. Must be > 0 and fit in 64 bits.
StatusOr<uint64_t> ParseVramSize(std::string_view flag, std::string_view text);

// A finite number > 0 (optionally <= max).
StatusOr<double> ParsePositive(std::string_view flag, std::string_view text, double max = 0);

// A quota limit: "0" or "none" is no limit (0); anything else as ParsePositive.
StatusOr<double> ParseLimit(std::string_view flag, std::string_view text);
// A VRAM quota in MiB: "0" or "none" is no limit (0); anything else as ParseVramSize, rounded up
// to whole MiB.
StatusOr<uint64_t> ParseVramLimitMib(std::string_view flag, std::string_view text);
// A whole number in [0, max].
StatusOr<uint64_t> ParseCount(std::string_view flag, std::string_view text, uint64_t max);

// Milliseconds for a duration: a number with ms, s, m or h ("500ms", "10s", "5m"); a bare number
// means seconds. "0" and "never" give 0. At most 30 days.
StatusOr<uint64_t> ParseDurationMs(std::string_view flag, std::string_view text);

// "79.6 GiB", "512 MiB".
std::string FormatBytes(uint64_t bytes);

}  // namespace tf::cli
