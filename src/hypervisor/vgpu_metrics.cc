#include "hypervisor/vgpu_metrics.h"

#include <algorithm>
#include <memory>
#include <sstream>
#include <vector>

#include "controller/model.h"
#include "hypervisor/quota_regions.h"
#include "limiter/core/gpu_region.h"

namespace tf::hypervisor {
namespace {

struct Family {
  const char* name;
  const char* type;
  const char* help;
  double (*value)(const limiter::VgpuInfo& v);
};

const Family kFamilies[] = {
    {"tf_vgpu_compute_request_percent", "gauge",
     "Compute request of the vGPU (guaranteed under contention), percent of the GPU.",
     [](const limiter::VgpuInfo& v) { return v.compute_share_ppm / 10'000.0; }},
    {"tf_vgpu_compute_limit_percent", "gauge",
     "Compute limit of the vGPU (the ceiling it may burst to), percent of the GPU.",
     [](const limiter::VgpuInfo& v) { return std::max(v.compute_limit_ppm, v.compute_share_ppm) / 10'000.0; }},
    {"tf_vgpu_busy_seconds_total", "counter",
     "GPU-busy seconds charged to the vGPU; rate() of it is the vGPU's current use of the GPU.",
     [](const limiter::VgpuInfo& v) { return v.busy_ns_total / 1e9; }},
    {"tf_vgpu_throttled_seconds_total", "counter",
     "Seconds the vGPU's processes were held back by the compute limiter.",
     [](const limiter::VgpuInfo& v) { return v.throttled_ns_total / 1e9; }},
    {"tf_vgpu_vram_used_bytes", "gauge", "VRAM the vGPU's processes hold, bytes.",
     [](const limiter::VgpuInfo& v) { return static_cast<double>(v.vram_used_bytes); }},
    {"tf_vgpu_vram_limit_bytes", "gauge", "VRAM ceiling of the vGPU, bytes.",
     [](const limiter::VgpuInfo& v) { return static_cast<double>(v.vram_limit_bytes); }},
};

const char* QosLabel(uint32_t qos) {
  return qos <= limiter::kMaxQos ? controller::QosName(static_cast<controller::Qos>(qos)) : "unknown";
}

}  // namespace

std::vector<std::unique_ptr<limiter::RegionSnapshot>> SnapshotRegions(const std::string& dir) {
  std::vector<std::unique_ptr<limiter::RegionSnapshot>> snapshots;
  for (const std::string& file : RegionFiles(dir)) {
    limiter::GpuRegion region;
    if (limiter::GpuRegion::Attach(file.c_str(), &region) != limiter::RegionError::kOk) continue;
    auto snap = std::make_unique<limiter::RegionSnapshot>();
    region.Snapshot(snap.get());
    snapshots.push_back(std::move(snap));
  }
  return snapshots;
}

std::string VgpuMetricsText(const std::string& dir) {
  const std::vector<std::unique_ptr<limiter::RegionSnapshot>> snapshots = SnapshotRegions(dir);
  std::ostringstream o;
  o.precision(15);
  for (const Family& f : kFamilies) {
    o << "# HELP " << f.name << " " << f.help << "\n# TYPE " << f.name << " " << f.type << "\n";
    for (const auto& snap : snapshots) {
      for (uint32_t i = 0; i < snap->vgpu_count; ++i) {
        const limiter::VgpuInfo& v = snap->vgpus[i];
        o << f.name << "{gpu=\"" << snap->gpu_uuid << "\",vgpu=\"" << v.id << "\",qos=\"" << QosLabel(v.qos)
          << "\"} " << f.value(v) << "\n";
      }
    }
  }
  return o.str();
}

}  // namespace tf::hypervisor
