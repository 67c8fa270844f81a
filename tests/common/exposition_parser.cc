#include "exposition_parser.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <sstream>

namespace tf::testing {
namespace {

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':'; }
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }

bool ValidMetricName(const std::string& n) {
  if (n.empty() || !IsNameStart(n[0])) return false;
  for (char c : n)
    if (!IsNameChar(c)) return false;
  return true;
}

bool ValidLabelName(const std::string& n) {
  if (n.empty() || n[0] == ':' || !IsNameStart(n[0]) || n.rfind("__", 0) == 0) return false;
  for (char c : n)
    if (!IsNameChar(c) || c == ':') return false;
  return true;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool ParseValue(const std::string& v, double* out) {
  if (v == "+Inf" || v == "Inf") { *out = std::numeric_limits<double>::infinity(); return true; }
  if (v == "-Inf") { *out = -std::numeric_limits<double>::infinity(); return true; }
  if (v == "NaN") { *out = std::nan(""); return true; }
  if (v.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(v.c_str(), &end);
  return end == v.c_str() + v.size();
}

// The family a sample belongs to: its own name, or the histogram whose suffix it carries.
std::string FamilyOf(const std::string& sample, const std::map<std::string, ParsedFamily>& families) {
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    if (!EndsWith(sample, suffix)) continue;
    std::string base = sample.substr(0, sample.size() - std::string(suffix).size());
    auto it = families.find(base);
    if (it != families.end() && it->second.type == "histogram") return base;
  }
  return sample;
}

// Parses `{a="x",b="y"}` from position i (at '{'); leaves i after '}'.
std::string ParseLabels(const std::string& line, size_t& i, std::map<std::string, std::string>* labels) {
  ++i;
  while (true) {
    if (i < line.size() && line[i] == '}') { ++i; return ""; }
    size_t start = i;
    while (i < line.size() && IsNameChar(line[i])) ++i;
    std::string name = line.substr(start, i - start);
    if (!ValidLabelName(name)) return "bad label name '" + name + "'";
    if (i + 1 >= line.size() || line[i] != '=' || line[i + 1] != '"') return "label " + name + " lacks =\"";
    i += 2;
    std::string value;
    bool closed = false;
    while (i < line.size()) {
      char c = line[i++];
      if (c == '"') { closed = true; break; }
      if (c == '\\') {
        if (i >= line.size()) return "label " + name + ": dangling backslash";
        char e = line[i++];
        if (e == '\\') value += '\\';
        else if (e == '"') value += '"';
        else if (e == 'n') value += '\n';
        else return "label " + name + ": invalid escape \\" + std::string(1, e);
      } else {
        value += c;
      }
    }
    if (!closed) return "label " + name + ": unterminated value";
    if (!labels->emplace(name, value).second) return "label " + name + " repeated";
    if (i < line.size() && line[i] == ',') { ++i; continue; }
    if (i < line.size() && line[i] == '}') { ++i; return ""; }
    return "expected , or } after label " + name;
  }
}

std::string CheckConventions(const std::string& name, const ParsedFamily& f) {
  if (f.help.empty()) return "family " + name + " has no HELP";
  if (f.type.empty()) return "family " + name + " has no TYPE";
  if (f.type == "counter" && !EndsWith(name, "_total")) return "counter " + name + " does not end in _total";
  if (f.type != "counter" && EndsWith(name, "_total")) return f.type + " " + name + " ends in _total";
  for (const char* unit : {"_mib", "_percent", "_ms", "_milliseconds", "_kib", "_gib"})
    if (EndsWith(name, unit)) return name + ": use base units (bytes, seconds, ratio), not " + std::string(unit + 1);
  for (const ParsedSample& s : f.samples)
    for (const auto& [k, v] : s.labels)
      for (const char* unit : {"_bytes", "_mib", "_seconds", "_percent", "_tflops"})
        if (EndsWith(k, unit)) return name + ": label " + k + " carries a unit";
  if (f.type != "histogram") return "";
  // Per label set (without le): buckets non-decreasing, +Inf last and equal to _count; _sum present.
  std::map<std::map<std::string, std::string>, std::vector<std::pair<double, double>>> buckets;
  std::map<std::map<std::string, std::string>, double> counts;
  std::set<std::map<std::string, std::string>> sums;
  for (const ParsedSample& s : f.samples) {
    std::map<std::string, std::string> key = s.labels;
    if (s.name == name + "_bucket") {
      auto le = key.find("le");
      if (le == key.end()) return name + "_bucket without le";
      double edge = 0;
      if (!ParseValue(le->second, &edge)) return name + "_bucket: bad le '" + le->second + "'";
      key.erase(le);
      buckets[key].push_back({edge, s.value});
    } else if (s.name == name + "_count") {
      counts[key] = s.value;
    } else if (s.name == name + "_sum") {
      sums.insert(key);
    } else {
      return "histogram " + name + " has sample " + s.name;
    }
  }
  if (buckets.empty()) return "histogram " + name + " has no buckets";
  for (const auto& [key, b] : buckets) {
    for (size_t i = 1; i < b.size(); ++i) {
      if (!(b[i].first > b[i - 1].first)) return name + ": le edges not ascending";
      if (b[i].second < b[i - 1].second) return name + ": buckets not cumulative";
    }
    if (!std::isinf(b.back().first)) return name + ": last bucket is not +Inf";
    auto c = counts.find(key);
    if (c == counts.end() || c->second != b.back().second) return name + ": +Inf bucket differs from _count";
    if (!sums.count(key)) return name + ": no _sum";
  }
  return "";
}

}  // namespace

double ParsedExposition::Value(const std::string& name, const std::map<std::string, std::string>& labels) const {
  double found = std::nan("");
  int matches = 0;
  for (const auto& [fname, f] : families) {
    for (const ParsedSample& s : f.samples) {
      if (s.name != name) continue;
      bool all = true;
      for (const auto& [k, v] : labels) {
        auto it = s.labels.find(k);
        if (it == s.labels.end() || it->second != v) all = false;
      }
      if (all) { found = s.value; ++matches; }
    }
  }
  return matches == 1 ? found : std::nan("");
}

std::string ParseExposition(const std::string& text, ParsedExposition* out) {
  std::istringstream in(text);
  std::string line;
  int number = 0;
  std::string current;  // the family whose samples are being read
  std::set<std::string> closed;  // families whose samples ended (another family followed)
  std::set<std::string> helped, typed;
  std::set<std::pair<std::string, std::map<std::string, std::string>>> series;
  auto fail = [&](const std::string& why) { return "line " + std::to_string(number) + ": " + why + ": " + line; };
  auto enter = [&](const std::string& family) -> bool {
    if (family == current) return true;
    if (closed.count(family)) return false;
    if (!current.empty()) closed.insert(current);
    current = family;
    return true;
  };
  if (!text.empty() && text.back() != '\n') return "the exposition does not end with a newline";
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    if (line[0] == '#') {
      std::istringstream l(line);
      std::string hash, kind, name;
      l >> hash >> kind >> name;
      if (hash != "#" || (kind != "HELP" && kind != "TYPE")) continue;  // a comment
      if (!ValidMetricName(name)) return fail("bad metric name");
      if (!enter(name)) return fail(name + " appears again after other families");
      ParsedFamily& f = out->families[name];
      std::string rest;
      std::getline(l, rest);
      if (!rest.empty() && rest[0] == ' ') rest.erase(0, 1);
      if (kind == "HELP") {
        if (!helped.insert(name).second) return fail("second HELP for " + name);
        for (size_t i = 0; i < rest.size(); ++i)
          if (rest[i] == '\\' && (i + 1 >= rest.size() || (rest[i + 1] != '\\' && rest[i + 1] != 'n')))
            return fail("invalid escape in HELP");
          else if (rest[i] == '\\') ++i;
        f.help = rest;
      } else {
        if (!typed.insert(name).second) return fail("second TYPE for " + name);
        if (!f.samples.empty()) return fail("TYPE after samples of " + name);
        if (rest != "counter" && rest != "gauge" && rest != "histogram" && rest != "summary" && rest != "untyped")
          return fail("unknown type '" + rest + "'");
        f.type = rest;
      }
      continue;
    }
    size_t i = 0;
    while (i < line.size() && IsNameChar(line[i])) ++i;
    ParsedSample s;
    s.name = line.substr(0, i);
    if (!ValidMetricName(s.name)) return fail("bad metric name");
    if (i < line.size() && line[i] == '{') {
      std::string err = ParseLabels(line, i, &s.labels);
      if (!err.empty()) return fail(err);
    }
    if (i >= line.size() || line[i] != ' ') return fail("expected a space before the value");
    std::istringstream rest(line.substr(i + 1));
    std::string value, timestamp, extra;
    rest >> value >> timestamp >> extra;
    if (!extra.empty()) return fail("trailing text");
    if (!ParseValue(value, &s.value)) return fail("bad value '" + value + "'");
    const std::string family = FamilyOf(s.name, out->families);
    if (!out->families.count(family)) return fail("sample before the TYPE of its family");
    if (!enter(family)) return fail(family + " appears again after other families");
    if (!series.insert({s.name, s.labels}).second) return fail("repeated series");
    out->families[family].samples.push_back(std::move(s));
  }
  for (const auto& [name, f] : out->families) {
    std::string err = CheckConventions(name, f);
    if (!err.empty()) return err;
  }
  return "";
}

}  // namespace tf::testing
