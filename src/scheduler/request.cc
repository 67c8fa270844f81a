#include <cmath>

#include "scheduler/types.h"

namespace tf::sched {

std::string_view QosName(Qos q) {
  switch (q) {
    case Qos::kLow: return "low";
    case Qos::kMedium: return "medium";
    case Qos::kHigh: return "high";
    case Qos::kCritical: return "critical";
  }
  return "?";
}

StatusOr<Qos> ParseQos(std::string_view s) {
  for (Qos q : {Qos::kLow, Qos::kMedium, Qos::kHigh, Qos::kCritical}) {
    if (s == QosName(q)) return q;
  }
  return InvalidArgument("unknown qos '" + std::string(s) + "' (low, medium, high, critical)");
}

std::string_view PlacementModeName(PlacementMode m) {
  switch (m) {
    case PlacementMode::kCompactFirst: return "CompactFirst";
    case PlacementMode::kLowLoadFirst: return "LowLoadFirst";
    case PlacementMode::kNodeCompactGpuLowLoad: return "NodeCompactGPULowLoad";
    case PlacementMode::kBestFit: return "BestFit";
    case PlacementMode::kFgd: return "FGD";
    case PlacementMode::kFragAware: return "FragAware";
  }
  return "?";
}

StatusOr<PlacementMode> ParsePlacementMode(std::string_view s) {
  for (PlacementMode m :
       {PlacementMode::kCompactFirst, PlacementMode::kLowLoadFirst,
        PlacementMode::kNodeCompactGpuLowLoad, PlacementMode::kBestFit, PlacementMode::kFgd,
        PlacementMode::kFragAware}) {
    std::string_view name = PlacementModeName(m);
    if (s.size() == name.size()) {
      bool eq = true;
      for (size_t i = 0; i < s.size(); ++i) {
        char a = s[i], b = name[i];
        if (a >= 'A' && a <= 'Z') a = static_cast<char>(a - 'A' + 'a');
        if (b >= 'A' && b <= 'Z') b = static_cast<char>(b - 'A' + 'a');
        eq = eq && a == b;
      }
      if (eq) return m;
    }
  }
  return InvalidArgument("unknown placement mode '" + std::string(s) +
                         "' (CompactFirst, LowLoadFirst, NodeCompactGPULowLoad, BestFit, FGD, "
                         "FragAware)");
}

MilliTflops ToMilliTflops(double tflops) { return static_cast<MilliTflops>(std::llround(tflops * 1000.0)); }
double ToTflops(MilliTflops m) { return static_cast<double>(m) / 1000.0; }

Status ValidateRequest(const Request& r) {
  auto bad = [&](const std::string& what) {
    return InvalidArgument("request '" + r.id + "': " + what);
  };
  if (r.id.empty()) return InvalidArgument("request id must not be empty");
  if (r.gpu_count < 0 || r.gpu_count > 64) return bad("gpu_count must be 0..64");
  auto finite_nonneg = [](double v) { return std::isfinite(v) && v >= 0; };
  if (!finite_nonneg(r.tflops_request) || !finite_nonneg(r.tflops_limit) ||
      !finite_nonneg(r.compute_percent_request) || !finite_nonneg(r.compute_percent_limit)) {
    return bad("compute values must be finite and non-negative");
  }
  if (r.vram_request_mib < 0 || r.vram_limit_mib < 0) return bad("VRAM must be non-negative");
  if (r.cpu_milli < 0 || r.memory_mib < 0) return bad("host CPU and memory must be non-negative");
  if (r.gpu_count == 0) {
    if (r.tflops_request > 0 || r.compute_percent_request > 0 || r.vram_request_mib > 0) {
      return bad("a workload with gpu_count=0 cannot request compute or VRAM");
    }
    if (r.cpu_milli == 0) return bad("a CPU-only workload (gpu_count=0) must request cpu");
    if (r.remote) return bad("a CPU-only workload cannot be remote");
    return Status::Ok();
  }
  bool by_tflops = r.tflops_request > 0;
  bool by_percent = r.compute_percent_request > 0;
  if (by_tflops == by_percent) {
    return bad("set exactly one of tflops request or compute percent request");
  }
  if (by_tflops && r.compute_percent_limit > 0) return bad("percent limit given with a TFLOPS request");
  if (by_percent && r.tflops_limit > 0) return bad("TFLOPS limit given with a percent request");
  if (by_tflops && r.tflops_request < 0.001) return bad("tflops request below 0.001 TFLOPS");
  if (r.tflops_limit > 0 && r.tflops_limit < r.tflops_request) {
    return bad("tflops limit is below the request");
  }
  if (by_percent && r.compute_percent_request > 100) return bad("compute percent must be in (0, 100]");
  if (r.compute_percent_limit > 100) return bad("compute percent limit must be at most 100");
  if (r.compute_percent_limit > 0 && r.compute_percent_limit < r.compute_percent_request) {
    return bad("compute percent limit is below the request");
  }
  if (r.vram_limit_mib > 0 && r.vram_limit_mib < r.vram_request_mib) {
    return bad("VRAM limit is below the request");
  }
  if (r.remote && (r.cpu_milli > 0 || r.memory_mib > 0)) {
    return bad("a remote workload cannot request host CPU or memory on the GPU node");
  }
  for (const std::string& m : r.gpu_models) {
    if (m.empty()) return bad("empty GPU model in the allow list");
  }
  return Status::Ok();
}

}  // namespace tf::sched
