#include "common/gpu_catalog.h"

#include <algorithm>
#include <charconv>
#include <cmath>

namespace tf {
namespace {

// Built-in models. TFLOPS are FP16 dense tensor throughput from NVIDIA's datasheets and
// architecture whitepapers (sparsity figures halved where only those are quoted).
// RTX 4090: 165.2 is the Ada whitepaper's FP16 tensor TFLOPS with FP16 accumulate (dense); with
// FP32 accumulate GeForce parts run at half rate (82.6). We use 165.2 so that a TFLOPS request
// means the same peak on every catalog entry; override it if your workloads accumulate in FP32.
// RTX 5090: 209.5, Blackwell GeForce whitepaper, FP16 tensor dense with FP16 accumulate.
struct BuiltinModel {
  const char* name;
  double tflops;
  int64_t vram_mib;
  int sm_count;
  // Space-separated lower-case tokens; each must appear in the device name's tokens.
  // Several rules per model are separated by '|'.
  const char* rules;
};

constexpr BuiltinModel kBuiltins[] = {
    {"V100-SXM2-32GB", 125.0, 32 * 1024, 80, "v100 32gb|v100m32"},
    {"V100-SXM2-16GB", 125.0, 16 * 1024, 80, "v100|v100m16"},
    {"T4", 65.0, 16 * 1024, 40, "t4"},
    {"A10", 125.0, 24 * 1024, 72, "a10"},
    {"A100-80GB", 312.0, 80 * 1024, 108, "a100 80gb|a100 sxm4 80gb|a100-80gb"},
    {"A100-40GB", 312.0, 40 * 1024, 108, "a100"},
    {"L4", 121.0, 24 * 1024, 58, "l4"},
    {"L40S", 362.0, 48 * 1024, 142, "l40s"},
    {"H100-PCIe", 756.0, 80 * 1024, 114, "h100 pcie"},
    {"H100-SXM", 989.4, 80 * 1024, 132, "h100"},
    {"H200", 989.4, 141 * 1024, 132, "h200"},
    {"B200", 2250.0, 180 * 1024, 148, "b200"},
    {"RTX-4090", 165.2, 24 * 1024, 128, "4090"},
    {"RTX-5090", 209.5, 32 * 1024, 170, "5090"},
};

char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }
bool IsAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

std::string ToLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = Lower(c);
  return out;
}

// Splits on anything that is not a letter or digit, lower-cased.
std::vector<std::string> Tokens(std::string_view s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (IsAlnum(c)) {
      cur.push_back(Lower(c));
    } else if (!cur.empty()) {
      out.push_back(std::move(cur));
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> SplitWs(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    size_t j = i;
    while (j < s.size() && s[j] != ' ' && s[j] != '\t') ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

bool ParseDouble(std::string_view s, double* out) {
  const char* end = s.data() + s.size();
  auto r = std::from_chars(s.data(), end, *out);
  return r.ec == std::errc() && r.ptr == end && std::isfinite(*out);
}

bool ParseInt(std::string_view s, int64_t* out) {
  const char* end = s.data() + s.size();
  auto r = std::from_chars(s.data(), end, *out);
  return r.ec == std::errc() && r.ptr == end;
}

}  // namespace

GpuCatalog::GpuCatalog() {
  for (const BuiltinModel& m : kBuiltins) {
    builtin_.push_back(GpuModelSpec{m.name, m.tflops, m.vram_mib, m.sm_count});
  }
  // Canonical names first so that "A100-40GB" finds exactly that model, then the rules in
  // table order (the table lists specific variants before their generic fallback).
  for (size_t i = 0; i < builtin_.size(); ++i) {
    rules_.push_back(Rule{Tokens(builtin_[i].name), i});
  }
  for (size_t i = 0; i < std::size(kBuiltins); ++i) {
    std::string_view rules = kBuiltins[i].rules;
    while (!rules.empty()) {
      size_t bar = rules.find('|');
      std::string_view one = rules.substr(0, bar);
      rules_.push_back(Rule{Tokens(one), i});
      rules = bar == std::string_view::npos ? std::string_view() : rules.substr(bar + 1);
    }
  }
}

const GpuModelSpec* GpuCatalog::MatchBuiltin(std::string_view device_name) const {
  std::vector<std::string> name_tokens = Tokens(device_name);
  if (name_tokens.empty()) return nullptr;
  for (const Rule& rule : rules_) {
    bool all = std::all_of(rule.tokens.begin(), rule.tokens.end(), [&](const std::string& t) {
      return std::find(name_tokens.begin(), name_tokens.end(), t) != name_tokens.end();
    });
    if (all) return &builtin_[rule.model_index];
  }
  return nullptr;
}

StatusOr<GpuModelSpec> GpuCatalog::Lookup(std::string_view device_name) const {
  std::string lower = ToLower(device_name);
  for (const Override& o : overrides_) {
    if (lower.find(o.substring) != std::string::npos) return o.spec;
  }
  if (const GpuModelSpec* spec = MatchBuiltin(device_name)) return *spec;
  return NotFound("no GPU catalog entry matches device name '" + std::string(device_name) +
                  "'; add an override line '<name substring> <fp16 tflops> [vram_mib]'");
}

Status GpuCatalog::LoadOverrides(std::string_view text) {
  std::vector<Override> parsed;
  int line_no = 0;
  while (!text.empty()) {
    ++line_no;
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    size_t hash = line.find('#');
    if (hash != std::string_view::npos) line = line.substr(0, hash);
    line = Trim(line);
    if (line.empty()) continue;
    std::string where = "gpu catalog override line " + std::to_string(line_no) + ": ";
    std::vector<std::string_view> f = SplitWs(line);
    if (f.size() < 2 || f.size() > 3) {
      return InvalidArgument(where + "expected 'name_substring tflops [vram_mib]', got '" +
                             std::string(line) + "'");
    }
    double tflops = 0;
    if (!ParseDouble(f[1], &tflops) || tflops <= 0) {
      return InvalidArgument(where + "tflops must be a positive number, got '" + std::string(f[1]) + "'");
    }
    Override o;
    o.substring = ToLower(f[0]);
    o.spec.name = std::string(f[0]);
    o.spec.fp16_tflops = tflops;
    if (const GpuModelSpec* base = MatchBuiltin(f[0])) {
      o.spec.vram_mib = base->vram_mib;
      o.spec.sm_count = base->sm_count;
    }
    if (f.size() == 3) {
      int64_t vram = 0;
      if (!ParseInt(f[2], &vram) || vram <= 0) {
        return InvalidArgument(where + "vram_mib must be a positive integer, got '" +
                               std::string(f[2]) + "'");
      }
      o.spec.vram_mib = vram;
    }
    auto same = std::find_if(parsed.begin(), parsed.end(),
                             [&](const Override& p) { return p.substring == o.substring; });
    if (same != parsed.end()) {
      *same = std::move(o);
    } else {
      parsed.push_back(std::move(o));
    }
  }
  for (Override& o : parsed) {
    auto same = std::find_if(overrides_.begin(), overrides_.end(),
                             [&](const Override& p) { return p.substring == o.substring; });
    if (same != overrides_.end()) {
      *same = std::move(o);
    } else {
      overrides_.push_back(std::move(o));
    }
  }
  std::stable_sort(overrides_.begin(), overrides_.end(), [](const Override& a, const Override& b) {
    return a.substring.size() > b.substring.size();
  });
  return Status::Ok();
}

StatusOr<double> ShareFromTflops(double tflops, double capacity_tflops) {
  if (!std::isfinite(capacity_tflops) || capacity_tflops <= 0) {
    return InvalidArgument("GPU capacity must be a positive number of TFLOPS, got " +
                           std::to_string(capacity_tflops));
  }
  if (!std::isfinite(tflops) || tflops <= 0) {
    return InvalidArgument("tflops request must be positive, got " + std::to_string(tflops));
  }
  if (tflops > capacity_tflops) {
    return InvalidArgument("tflops request " + std::to_string(tflops) +
                           " exceeds the GPU's capacity of " + std::to_string(capacity_tflops) +
                           " TFLOPS");
  }
  return tflops / capacity_tflops;
}

}  // namespace tf
