#include "k8s/pod_request.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include <nlohmann/json.hpp>

#include "controller/kube_api.h"

namespace tf::k8s {
namespace {

using json = nlohmann::json;

constexpr int64_t kMaxVramMib = int64_t{16} << 20;  // 16 TiB per GPU, the controller's bound
constexpr double kMaxTflops = 1e6;
constexpr int kMaxGpuCount = 64;

// The keys a pod may write (without the domain).
const std::set<std::string, std::less<>> kSupported = {
    "tflops-request", "tflops-limit", "compute-percent-request", "compute-percent-limit",
    "vram-request",   "vram-limit",   "qos",                     "gpupool",
    "is-local-gpu",   "gpu-count",    "gpu-model",               "workload-profile",
    "isolation",      "vendor"};

std::string Key(std::string_view name) { return std::string(kDomain) + std::string(name); }

Status Bad(std::string_view name, const std::string& value, const std::string& what) {
  return InvalidArgument(Key(name) + ": \"" + value + "\" " + what);
}

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// A plain decimal number ("10", "2.5"); nullopt for anything else (units, spaces, hex, inf).
bool ParseDecimal(std::string_view text, double* out) {
  if (text.empty() || text.size() > 32) return false;
  int dots = 0, digits = 0;
  for (char c : text) {
    if (c == '.') ++dots;
    else if (c >= '0' && c <= '9') ++digits;
    else return false;
  }
  if (dots > 1 || digits == 0) return false;
  *out = std::strtod(std::string(text).c_str(), nullptr);
  return std::isfinite(*out);
}

bool NameChars(std::string_view s, size_t max, bool space) {
  if (s.empty() || s.size() > max) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == ':' || c == '-' || (space && c == ' ');
    if (!ok) return false;
  }
  return true;
}

const std::string* Find(const Annotations& a, std::string_view name) {
  auto it = a.find(Key(name));
  return it == a.end() ? nullptr : &it->second;
}

StatusOr<double> Tflops(std::string_view name, const std::string& v) {
  double d = 0;
  if (!ParseDecimal(v, &d)) return Bad(name, v, "is not a number of TFLOPS (expected e.g. 10)");
  // The controller counts compute in thousandths of a TFLOPS: less would be admitted and then
  // refused by every node.
  if (d < 0.001 || d > kMaxTflops) return Bad(name, v, "is out of range (expected at least 0.001 TFLOPS, e.g. 10)");
  return d;
}

StatusOr<double> Percent(std::string_view name, const std::string& v) {
  double d = 0;
  if (!ParseDecimal(v, &d) || d <= 0 || d > 100)
    return Bad(name, v, "is not a percent of one GPU (expected a number above 0 and at most 100, e.g. 25)");
  return d;
}

StatusOr<int64_t> VramMib(std::string_view name, const std::string& v) {
  StatusOr<uint64_t> bytes = ParseQuantityBytes(v);
  if (!bytes.ok()) return Bad(name, v, "is not a quantity (expected e.g. 8Gi)");
  const uint64_t mib = (*bytes + (uint64_t{1} << 20) - 1) >> 20;
  if (mib > static_cast<uint64_t>(kMaxVramMib)) return Bad(name, v, "is more than 16Ti, the most one GPU may have");
  return static_cast<int64_t>(mib);
}

}  // namespace

StatusOr<uint64_t> ParseQuantityBytes(std::string_view text) {
  StatusOr<double> v = controller::ParseKubeQuantity(std::string(text));
  if (!v.ok()) return v.status();
  const long double bytes = std::ceil(static_cast<long double>(*v));
  if (!(bytes >= 1) || bytes > 9223372036854775808.0L) return InvalidArgument("out of range");
  return static_cast<uint64_t>(bytes);
}

StatusOr<std::string> WorkloadProfileOf(const Annotations& annotations) {
  const std::string* v = Find(annotations, "workload-profile");
  if (!v) return std::string();
  if (!NameChars(*v, 128, false))
    return Bad("workload-profile", *v, "is not a workload name (expected 1-128 characters of A-Z a-z 0-9 . _ : -)");
  return *v;
}

StatusOr<PodGpuRequest> ParsePodAnnotations(const Annotations& annotations, const WorkloadDefaults* profile) {
  for (const auto& [key, value] : annotations) {
    if (key.rfind(kDomain, 0) != 0) continue;
    const std::string name = key.substr(sizeof(kDomain) - 1);
    if (key == kRequestAnnotation || key == kAllocationAnnotation || key == kGpuIdsAnnotation ||
        key == kWorkerAnnotation || key == kTicketAnnotation) {
      return InvalidArgument(key + " is written by TensorFusion, not by the pod: remove it");
    }
    if (!kSupported.count(name)) {
      std::string list;
      for (const auto& s : kSupported) list += (list.empty() ? "" : ", ") + s;
      return InvalidArgument(key + " is not supported here (supported under " + kDomain + ": " + list + ")");
    }
  }
  PodGpuRequest r;
  StatusOr<std::string> profile_name = WorkloadProfileOf(annotations);
  if (!profile_name.ok()) return profile_name.status();
  r.workload_profile = *profile_name;
  if (profile) {
    r.tflops = profile->tflops;
    r.tflops_limit = profile->tflops_limit;
    r.vram_mib = profile->vram_mib;
    r.gpu_count = profile->gpu_count > 0 ? profile->gpu_count : 1;
    r.pool = profile->pool;
  }
  const std::string* tflops = Find(annotations, "tflops-request");
  const std::string* percent = Find(annotations, "compute-percent-request");
  const std::string* tflops_limit = Find(annotations, "tflops-limit");
  const std::string* percent_limit = Find(annotations, "compute-percent-limit");
  if (tflops && percent)
    return InvalidArgument("give " + Key("tflops-request") + " or " + Key("compute-percent-request") + ", not both");
  if (tflops) {
    StatusOr<double> t = Tflops("tflops-request", *tflops);
    if (!t.ok()) return t.status();
    r.tflops = *t;
    r.tflops_limit = 0;
  }
  if (percent) {
    StatusOr<double> p = Percent("compute-percent-request", *percent);
    if (!p.ok()) return p.status();
    r.percent = *p;
    r.tflops = r.tflops_limit = 0;  // the pod's unit wins over the profile's
  }
  if (tflops_limit) {
    if (r.tflops <= 0)
      return InvalidArgument(Key("tflops-limit") + " needs " + Key("tflops-request") + " (a limit is in its request's unit)");
    StatusOr<double> t = Tflops("tflops-limit", *tflops_limit);
    if (!t.ok()) return t.status();
    if (*t < r.tflops)
      return Bad("tflops-limit", *tflops_limit, "is below the request of " + Num(r.tflops) +
                                                    " TFLOPS (the limit is the ceiling: give at least the request)");
    r.tflops_limit = *t;
  }
  if (percent_limit) {
    if (r.percent <= 0)
      return InvalidArgument(Key("compute-percent-limit") + " needs " + Key("compute-percent-request") +
                             " (a limit is in its request's unit)");
    StatusOr<double> p = Percent("compute-percent-limit", *percent_limit);
    if (!p.ok()) return p.status();
    if (*p < r.percent)
      return Bad("compute-percent-limit", *percent_limit, "is below the request of " + Num(r.percent) +
                                                              "% (the limit is the ceiling: give at least the request)");
    r.percent_limit = *p;
  }
  if (const std::string* v = Find(annotations, "vram-request")) {
    StatusOr<int64_t> m = VramMib("vram-request", *v);
    if (!m.ok()) return m.status();
    r.vram_mib = *m;
  }
  if (const std::string* v = Find(annotations, "vram-limit")) {
    StatusOr<int64_t> m = VramMib("vram-limit", *v);
    if (!m.ok()) return m.status();
    if (r.vram_mib == 0) r.vram_mib = *m;  // a limit alone is the size
    if (*m < r.vram_mib)
      return Bad("vram-limit", *v, "is below the request of " + std::to_string(r.vram_mib) +
                                       " MiB (the limit is the ceiling: give at least the request)");
    if (*m > r.vram_mib)
      return Bad("vram-limit", *v, "is above the request of " + std::to_string(r.vram_mib) +
                                       " MiB: VRAM beyond the request is not supported (give the same value, or leave it out)");
  }
  const std::string* qos = Find(annotations, "qos");
  if (qos) {
    if (*qos != "low" && *qos != "medium" && *qos != "high" && *qos != "critical")
      return Bad("qos", *qos, "is not a QoS level (expected low, medium, high or critical)");
    r.qos = *qos;
  } else if (profile && !profile->qos.empty()) {
    r.qos = profile->qos;
  } else {
    // As TensorFusion does: a request whose limits equal its requests (given explicitly) is
    // Guaranteed, so high; everything else gets medium.
    const bool compute_equal = (tflops_limit && r.tflops_limit == r.tflops) || (percent_limit && r.percent_limit == r.percent);
    r.qos = compute_equal && Find(annotations, "vram-limit") ? "high" : "medium";
  }
  if (const std::string* v = Find(annotations, "gpupool")) {
    if (!NameChars(*v, 128, false))
      return Bad("gpupool", *v, "is not a pool name (expected 1-128 characters of A-Z a-z 0-9 . _ : -)");
    r.pool = *v;
  }
  if (const std::string* v = Find(annotations, "is-local-gpu")) {
    if (*v != "true" && *v != "false") return Bad("is-local-gpu", *v, "is not a boolean (expected true or false)");
    r.local = *v == "true";
  }
  if (const std::string* v = Find(annotations, "gpu-count")) {
    double d = 0;
    if (!ParseDecimal(*v, &d) || v->find('.') != std::string::npos || d < 1 || d > kMaxGpuCount)
      return Bad("gpu-count", *v, "is out of range (expected a whole number from 1 to 64)");
    r.gpu_count = static_cast<int>(d);
  }
  if (const std::string* v = Find(annotations, "gpu-model")) {
    if (!NameChars(*v, 64, true))
      return Bad("gpu-model", *v, "is not a GPU model (expected part of a model name, e.g. H100 or A100)");
    r.gpu_model = *v;
  }
  if (const std::string* v = Find(annotations, "isolation"); v && *v != "soft")
    return Bad("isolation", *v, "is not supported here (expected soft: the limiter in the pod's processes)");
  if (const std::string* v = Find(annotations, "vendor"); v && *v != "NVIDIA" && *v != "nvidia")
    return Bad("vendor", *v, "is not supported here (expected NVIDIA)");
  if (r.tflops <= 0 && r.percent <= 0)
    return InvalidArgument("give " + Key("tflops-request") + " (e.g. \"10\") or " + Key("compute-percent-request") +
                           " (e.g. \"25\")");
  if (r.vram_mib <= 0) return InvalidArgument("give " + Key("vram-request") + " (e.g. 8Gi)");
  if (r.gpu_count > 1)
    return Bad("gpu-count", std::to_string(r.gpu_count),
               "asks for more than one GPU per pod, which is not supported yet (expected 1)");
  TF_RETURN_IF_ERROR(ValidatePodRequest(r));
  return r;
}

Status ValidatePodRequest(const PodGpuRequest& r) {
  if ((r.tflops > 0) == (r.percent > 0)) return InvalidArgument("exactly one of tflops and percent must be above 0");
  if (r.tflops > kMaxTflops || r.tflops_limit > kMaxTflops) return InvalidArgument("tflops out of range");
  if (r.tflops_limit != 0 && (r.tflops <= 0 || r.tflops_limit < r.tflops))
    return InvalidArgument("tflops_limit must be at least tflops");
  if (r.percent > 100 || r.percent_limit > 100 || r.percent < 0 || r.percent_limit < 0)
    return InvalidArgument("percent must be in (0, 100]");
  if (r.percent_limit != 0 && (r.percent <= 0 || r.percent_limit < r.percent))
    return InvalidArgument("percent_limit must be at least percent");
  if (r.vram_mib <= 0 || r.vram_mib > kMaxVramMib) return InvalidArgument("vram_mib must be 1..16 TiB in MiB");
  if (r.gpu_count != 1) return InvalidArgument("gpu_count must be 1");
  if (r.qos != "low" && r.qos != "medium" && r.qos != "high" && r.qos != "critical")
    return InvalidArgument("qos must be low, medium, high or critical");
  if (!r.pool.empty() && !NameChars(r.pool, 128, false)) return InvalidArgument("bad pool name");
  if (!r.gpu_model.empty() && !NameChars(r.gpu_model, 64, true)) return InvalidArgument("bad gpu_model");
  if (!r.workload_profile.empty() && !NameChars(r.workload_profile, 128, false))
    return InvalidArgument("bad workload_profile");
  return Status::Ok();
}

std::string PodRequestToJson(const PodGpuRequest& r) {
  json j{{"vram_mib", r.vram_mib}, {"gpu_count", r.gpu_count}, {"qos", r.qos}, {"local", r.local}};
  if (r.tflops > 0) j["tflops"] = r.tflops;
  if (r.tflops_limit > 0) j["tflops_limit"] = r.tflops_limit;
  if (r.percent > 0) j["percent"] = r.percent;
  if (r.percent_limit > 0) j["percent_limit"] = r.percent_limit;
  if (!r.pool.empty()) j["pool"] = r.pool;
  if (!r.gpu_model.empty()) j["gpu_model"] = r.gpu_model;
  if (!r.workload_profile.empty()) j["workload_profile"] = r.workload_profile;
  return j.dump();
}

StatusOr<PodGpuRequest> PodRequestFromJson(std::string_view text) {
  const std::string where = std::string(kRequestAnnotation) + ": ";
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument(where + "not a JSON object");
  PodGpuRequest r;
  static const std::set<std::string> kKnown = {"tflops", "tflops_limit", "percent", "percent_limit", "vram_mib",
                                               "gpu_count", "qos", "local", "pool", "gpu_model", "workload_profile"};
  for (const auto& [k, v] : j.items()) {
    if (!kKnown.count(k)) return InvalidArgument(where + "unknown field '" + k + "'");
    const bool number = k == "tflops" || k == "tflops_limit" || k == "percent" || k == "percent_limit";
    const bool integer = k == "vram_mib" || k == "gpu_count";
    if (number && !v.is_number()) return InvalidArgument(where + "'" + k + "' must be a number");
    if (integer && !v.is_number_integer()) return InvalidArgument(where + "'" + k + "' must be a whole number");
    if (k == "local" && !v.is_boolean()) return InvalidArgument(where + "'local' must be true or false");
    if (!number && !integer && k != "local" && !v.is_string()) return InvalidArgument(where + "'" + k + "' must be a string");
  }
  r.tflops = j.value("tflops", 0.0);
  r.tflops_limit = j.value("tflops_limit", 0.0);
  r.percent = j.value("percent", 0.0);
  r.percent_limit = j.value("percent_limit", 0.0);
  r.vram_mib = j.value("vram_mib", int64_t{0});
  if (j.value("gpu_count", int64_t{1}) != 1) return InvalidArgument(where + "gpu_count must be 1");
  r.gpu_count = 1;
  r.qos = j.value("qos", std::string("medium"));
  r.local = j.value("local", true);
  r.pool = j.value("pool", std::string());
  r.gpu_model = j.value("gpu_model", std::string());
  r.workload_profile = j.value("workload_profile", std::string());
  if (Status s = ValidatePodRequest(r); !s.ok()) return InvalidArgument(where + s.message());
  return r;
}

}  // namespace tf::k8s
