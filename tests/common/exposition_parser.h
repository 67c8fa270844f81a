// A strict reader of the Prometheus text exposition format (0.0.4) for tests: it parses what
// /metrics serves and checks the format's rules and the naming conventions this project follows
// (docs/operations.md, "Metrics"), so a malformed or badly named family fails a unit test rather
// than a scrape.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace tf::testing {

struct ParsedSample {
  std::string name;                           // with its suffix (_bucket, _sum, _count)
  std::map<std::string, std::string> labels;  // unescaped values
  double value = 0;
};

struct ParsedFamily {
  std::string type;  // counter, gauge, histogram
  std::string help;
  std::vector<ParsedSample> samples;
};

struct ParsedExposition {
  std::map<std::string, ParsedFamily> families;
  // The value of the one sample of `name` whose labels include `labels`; NaN when none or several.
  double Value(const std::string& name, const std::map<std::string, std::string>& labels = {}) const;
};

// Parses `text`. Returns "" and fills `out`, or a message naming the first broken line and rule:
// syntax (names, label escapes, values), HELP and TYPE once per family and before its samples, a
// family's samples together, no repeated series, every family typed and described; conventions:
// counters and only counters end in `_total`, no `_mib`/`_percent`/`_ms` units (base units:
// bytes, seconds, ratios), histograms only as `_bucket` (with `le`, cumulative, ending at +Inf =
// `_count`), `_sum`, `_count`.
std::string ParseExposition(const std::string& text, ParsedExposition* out);

}  // namespace tf::testing
