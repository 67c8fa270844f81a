#include "common/prometheus_text.h"

#include <cmath>
#include <cstdio>

namespace tf::prom {
namespace {

std::string Escape(std::string_view v, bool quote) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '"' && quote) out += "\\\"";
    else out += c;
  }
  return out;
}

const char* TypeName(Type t) {
  switch (t) {
    case Type::kCounter: return "counter";
    case Type::kGauge: return "gauge";
    case Type::kHistogram: return "histogram";
  }
  return "untyped";
}

}  // namespace

std::string EscapeLabelValue(std::string_view v) { return Escape(v, true); }
std::string EscapeHelp(std::string_view v) { return Escape(v, false); }

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.17g", v);
  }
  return buf;
}

void Exposition::Family(std::string_view name, Type type, std::string_view help) {
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  out_ += EscapeHelp(help);
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += TypeName(type);
  out_ += '\n';
}

void Exposition::WriteSample(std::string_view name, const Label* begin, const Label* end,
                             std::string_view extra_name, std::string_view extra_value, std::string_view value) {
  out_ += name;
  if (begin != end || !extra_name.empty()) {
    out_ += '{';
    bool first = true;
    auto label = [&](std::string_view k, std::string_view v) {
      if (!first) out_ += ',';
      first = false;
      out_ += k;
      out_ += "=\"";
      out_ += EscapeLabelValue(v);
      out_ += '"';
    };
    for (const Label* l = begin; l != end; ++l) label(l->first, l->second);
    if (!extra_name.empty()) label(extra_name, extra_value);
    out_ += '}';
  }
  out_ += ' ';
  out_ += value;
  out_ += '\n';
}

void Exposition::Sample(std::string_view name, Labels labels, double value) {
  WriteSample(name, labels.begin(), labels.end(), {}, {}, FormatValue(value));
}

void Exposition::Sample(std::string_view name, const std::vector<Label>& labels, double value) {
  WriteSample(name, labels.data(), labels.data() + labels.size(), {}, {}, FormatValue(value));
}

void Exposition::Histogram(std::string_view name, Labels labels, const std::vector<double>& upper_edges,
                           const std::vector<uint64_t>& cumulative, double sum, uint64_t count) {
  const std::string bucket = std::string(name) + "_bucket";
  for (size_t i = 0; i < upper_edges.size() && i < cumulative.size(); ++i)
    WriteSample(bucket, labels.begin(), labels.end(), "le", FormatValue(upper_edges[i]),
                FormatValue(static_cast<double>(cumulative[i])));
  WriteSample(bucket, labels.begin(), labels.end(), "le", "+Inf", FormatValue(static_cast<double>(count)));
  WriteSample(std::string(name) + "_sum", labels.begin(), labels.end(), {}, {}, FormatValue(sum));
  WriteSample(std::string(name) + "_count", labels.begin(), labels.end(), {}, {},
              FormatValue(static_cast<double>(count)));
}

}  // namespace tf::prom
