#include "hypervisor/vgpu_metrics.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "controller/model.h"
#include "hypervisor/quota_regions.h"
#include "limiter/core/gpu_region.h"

namespace tf::hypervisor {
namespace {

using prom::Type;

struct Family {
  const char* name;
  Type type;
  const char* help;
  double (*value)(const limiter::VgpuInfo& v);
};

const Family kFamilies[] = {
    {"tf_vgpu_compute_request_ratio", Type::kGauge,
     "Compute request of the vGPU (guaranteed under contention), fraction of the GPU (0-1).",
     [](const limiter::VgpuInfo& v) { return v.compute_share_ppm / 1e6; }},
    {"tf_vgpu_compute_limit_ratio", Type::kGauge,
     "Compute limit of the vGPU (the ceiling it may burst to), fraction of the GPU (0-1).",
     [](const limiter::VgpuInfo& v) { return std::max(v.compute_limit_ppm, v.compute_share_ppm) / 1e6; }},
    {"tf_vgpu_busy_seconds_total", Type::kCounter,
     "GPU-busy seconds charged to the vGPU; rate() of it is the vGPU's current use of the GPU.",
     [](const limiter::VgpuInfo& v) { return v.busy_ns_total / 1e9; }},
    {"tf_vgpu_throttled_seconds_total", Type::kCounter,
     "Seconds the vGPU's processes were held back by the compute limiter.",
     [](const limiter::VgpuInfo& v) { return v.throttled_ns_total / 1e9; }},
    {"tf_vgpu_held_turn_seconds_total", Type::kCounter,
     "Of the throttled seconds (shared mode), those spent waiting for another vGPU's turn.",
     [](const limiter::VgpuInfo& v) { return v.held_turn_ns_total / 1e9; }},
    {"tf_vgpu_held_limit_seconds_total", Type::kCounter,
     "Of the throttled seconds (shared mode), those spent at the vGPU's compute limit.",
     [](const limiter::VgpuInfo& v) { return v.held_limit_ns_total / 1e9; }},
    {"tf_vgpu_held_others_seconds_total", Type::kCounter,
     "Of the throttled seconds (shared mode), those spent over the request while another vGPU was owed its own "
     "or a higher-QoS vGPU borrowed.",
     [](const limiter::VgpuInfo& v) { return v.held_others_ns_total / 1e9; }},
    {"tf_vgpu_vram_used_bytes", Type::kGauge, "VRAM the vGPU's processes hold, bytes.",
     [](const limiter::VgpuInfo& v) { return static_cast<double>(v.vram_used_bytes); }},
    {"tf_vgpu_vram_limit_bytes", Type::kGauge, "VRAM ceiling of the vGPU, bytes.",
     [](const limiter::VgpuInfo& v) { return static_cast<double>(v.vram_limit_bytes); }},
    // What tenants see as CUDA out-of-memory errors at their ceiling (tfusion smi's OOMS).
    {"tf_vgpu_vram_refusals_total", Type::kCounter,
     "VRAM allocations refused because they would take the vGPU past its ceiling (out of memory).",
     [](const limiter::VgpuInfo& v) { return static_cast<double>(v.oom_total); }},
};

// VRAM tiering, summed over the vGPU's live processes.
struct TierFamily {
  const char* name;
  Type type;
  const char* help;
  double (*value)(const limiter::ProcessInfo& p);
};

const TierFamily kTierFamilies[] = {
    {"tf_vgpu_tier_movable_bytes", Type::kGauge, "VRAM of the vGPU that tiering can move (resident or not), bytes.",
     [](const limiter::ProcessInfo& p) { return static_cast<double>(p.movable_bytes); }},
    {"tf_vgpu_tier_host_bytes", Type::kGauge, "VRAM of the vGPU swapped out to host memory, bytes.",
     [](const limiter::ProcessInfo& p) { return static_cast<double>(p.host_bytes); }},
    {"tf_vgpu_tier_fixed_bytes", Type::kGauge, "VRAM of the vGPU that cannot move (exported pools and VMM handles, memory exported with legacy IPC, arrays, graph memory the driver holds), bytes.",
     [](const limiter::ProcessInfo& p) { return static_cast<double>(p.fixed_bytes); }},
    {"tf_vgpu_tier_swapped_processes", Type::kGauge, "Processes of the vGPU swapped out now.",
     [](const limiter::ProcessInfo& p) {
       return p.tier_state == limiter::kTierSwapped || p.tier_state == limiter::kTierOnDisk ? 1.0 : 0.0;
     }},
    {"tf_vgpu_swap_outs", Type::kGauge, "Swap-outs completed by the vGPU's live processes.",
     [](const limiter::ProcessInfo& p) { return static_cast<double>(p.swaps_out); }},
    {"tf_vgpu_swap_ins", Type::kGauge, "Swap-ins (resumes) completed by the vGPU's live processes.",
     [](const limiter::ProcessInfo& p) { return static_cast<double>(p.swaps_in); }},
    {"tf_vgpu_last_swap_out_seconds", Type::kGauge, "Duration of the last swap-out of the vGPU's processes (the longest).",
     [](const limiter::ProcessInfo& p) { return p.last_out_us / 1e6; }},
    {"tf_vgpu_last_resume_seconds", Type::kGauge, "Duration of the last resume of the vGPU's processes (the longest).",
     [](const limiter::ProcessInfo& p) { return p.last_in_us / 1e6; }},
};

struct GpuFamily {
  const char* name;
  Type type;
  const char* help;
  double (*value)(const limiter::RegionSnapshot& s);
};

const GpuFamily kGpuFamilies[] = {
    {"tf_gpu_swap_outs_total", Type::kCounter, "VRAM swap-outs on the GPU.",
     [](const limiter::RegionSnapshot& s) { return static_cast<double>(s.swaps_out_total); }},
    {"tf_gpu_swap_ins_total", Type::kCounter, "VRAM swap-ins (resumes) on the GPU.",
     [](const limiter::RegionSnapshot& s) { return static_cast<double>(s.swaps_in_total); }},
    {"tf_gpu_swap_out_bytes_total", Type::kCounter, "Bytes moved from the GPU to the host tier.",
     [](const limiter::RegionSnapshot& s) { return static_cast<double>(s.bytes_out_total); }},
    {"tf_gpu_swap_in_bytes_total", Type::kCounter, "Bytes moved from the host tier back to the GPU.",
     [](const limiter::RegionSnapshot& s) { return static_cast<double>(s.bytes_in_total); }},
    {"tf_gpu_swap_failures_total", Type::kCounter, "Swap-outs abandoned and resumes failed on the GPU.",
     [](const limiter::RegionSnapshot& s) { return static_cast<double>(s.swap_failures_total); }},
    {"tf_gpu_host_tier_used_bytes", Type::kGauge, "Host memory held by the GPU's swapped tenants, bytes.",
     [](const limiter::RegionSnapshot& s) { return static_cast<double>(s.host_tier_used_bytes); }},
    {"tf_gpu_host_tier_budget_bytes", Type::kGauge, "Host memory the GPU's swapped tenants may hold, bytes.",
     [](const limiter::RegionSnapshot& s) { return static_cast<double>(s.host_tier_budget_bytes); }},
};

}  // namespace

const char* QosLabel(uint32_t qos) {
  return qos <= limiter::kMaxQos ? controller::QosName(static_cast<controller::Qos>(qos)) : "unknown";
}

std::vector<std::unique_ptr<limiter::RegionSnapshot>> SnapshotRegions(const std::string& dir) {
  std::vector<std::unique_ptr<limiter::RegionSnapshot>> snapshots;
  for (const std::string& file : RegionFiles(dir)) {
    limiter::GpuRegion region;
    if (limiter::GpuRegion::Attach(file.c_str(), &region) != limiter::RegionError::kOk) continue;
    auto snap = std::make_unique<limiter::RegionSnapshot>();
    region.Snapshot(snap.get());
    MakePrintable(snap.get());
    snapshots.push_back(std::move(snap));
  }
  return snapshots;
}

void MakePrintable(limiter::RegionSnapshot* snap) {
  auto clean = [](char* text, size_t size) {
    for (size_t i = 0; i < size && text[i] != '\0'; ++i) {
      const unsigned char c = static_cast<unsigned char>(text[i]);
      if (c < 0x20 || c >= 0x7f) text[i] = '?';
    }
  };
  clean(snap->gpu_uuid, sizeof(snap->gpu_uuid));
  clean(snap->gpu_name, sizeof(snap->gpu_name));
  for (uint32_t i = 0; i < snap->vgpu_count; ++i) clean(snap->vgpus[i].id, sizeof(snap->vgpus[i].id));
}

void WriteVgpuMetrics(prom::Exposition* out, const std::string& dir, const std::string& node) {
  const std::vector<std::unique_ptr<limiter::RegionSnapshot>> snapshots = SnapshotRegions(dir);
  prom::Exposition& o = *out;
  for (const Family& f : kFamilies) {
    o.Family(f.name, f.type, f.help);
    for (const auto& snap : snapshots) {
      for (uint32_t i = 0; i < snap->vgpu_count; ++i) {
        const limiter::VgpuInfo& v = snap->vgpus[i];
        o.Sample(f.name, {{"node", node}, {"gpu", snap->gpu_uuid}, {"vgpu", v.id}, {"qos", QosLabel(v.qos)}},
                 f.value(v));
      }
    }
  }
  for (const TierFamily& f : kTierFamilies) {
    const bool max = std::string(f.name).find("last_") != std::string::npos;
    o.Family(f.name, f.type, f.help);
    for (const auto& snap : snapshots) {
      for (uint32_t i = 0; i < snap->vgpu_count; ++i) {
        const limiter::VgpuInfo& v = snap->vgpus[i];
        if (!v.tier_enabled) continue;
        double total = 0;
        for (uint32_t k = 0; k < snap->process_count; ++k) {
          const limiter::ProcessInfo& p = snap->processes[k];
          if (p.vgpu_index != v.index) continue;
          total = max ? std::max(total, f.value(p)) : total + f.value(p);
        }
        o.Sample(f.name, {{"node", node}, {"gpu", snap->gpu_uuid}, {"vgpu", v.id}, {"qos", QosLabel(v.qos)}}, total);
      }
    }
  }
  for (const GpuFamily& f : kGpuFamilies) {
    o.Family(f.name, f.type, f.help);
    for (const auto& snap : snapshots) o.Sample(f.name, {{"node", node}, {"gpu", snap->gpu_uuid}}, f.value(*snap));
  }
}

}  // namespace tf::hypervisor
