// Prometheus text exposition (format 0.0.4) for the controller's and the node agent's /metrics.
//
// One writer for every family, so the rules of the format hold everywhere: each family's HELP and
// TYPE lines come once, before its samples; HELP text and label values are escaped (backslash,
// double quote, newline); values are printed exactly (17 significant digits, +Inf/-Inf/NaN).
// Histograms get cumulative `_bucket{le=...}` lines ending at +Inf, then `_sum` and `_count`.
//
// Not thread-safe: one Exposition per scrape.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tf::prom {

using Label = std::pair<std::string_view, std::string_view>;
using Labels = std::initializer_list<Label>;

enum class Type { kCounter, kGauge, kHistogram };

// Escapes a label value or HELP text: `\` -> `\\`, newline -> `\n`, and (label values only) `"` -> `\"`.
std::string EscapeLabelValue(std::string_view v);
std::string EscapeHelp(std::string_view v);
// A sample value: integers without exponent where exact, else 17 significant digits; "+Inf", "-Inf", "NaN".
std::string FormatValue(double v);

class Exposition {
 public:
  // Starts family `name` (HELP and TYPE lines). REQUIRES: each name once per exposition, and its
  // samples right after it (the exposition parser in the tests checks both).
  void Family(std::string_view name, Type type, std::string_view help);
  // One sample of the current family (for counters and gauges the family's own name).
  void Sample(std::string_view name, Labels labels, double value);
  void Sample(std::string_view name, const std::vector<Label>& labels, double value);
  // A histogram sample set: `upper_edges` ascending (seconds, without +Inf), `cumulative[i]` the
  // observations <= upper_edges[i]; `count` the total (the +Inf bucket), `sum` their sum.
  void Histogram(std::string_view name, Labels labels, const std::vector<double>& upper_edges,
                 const std::vector<uint64_t>& cumulative, double sum, uint64_t count);

  // Appends already-rendered exposition text (another component's families).
  void Append(std::string_view text) { out_ += text; }
  std::string Take() { return std::move(out_); }

 private:
  void WriteSample(std::string_view name, const Label* begin, const Label* end, std::string_view extra_name,
                   std::string_view extra_value, std::string_view value);
  std::string out_;
};

}  // namespace tf::prom
