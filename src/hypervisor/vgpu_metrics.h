// Prometheus metrics of the vGPUs in this machine's per-GPU quota regions: what each was given
// (compute request and limit, VRAM limit) and what it did (GPU-busy and throttled seconds, VRAM
// used). Read from the regions themselves, so vGPUs that `tfusion run` made without a controller
// are included.
//
// Thread safety: any thread; each call attaches to the region files on its own.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/prometheus_text.h"
#include "limiter/core/gpu_region.h"

namespace tf::hypervisor {

// A snapshot of every region file in `dir` that can be attached (the others are skipped), its
// text made printable (MakePrintable).
std::vector<std::unique_ptr<limiter::RegionSnapshot>> SnapshotRegions(const std::string& dir);

// Replaces every byte outside printable ASCII in the snapshot's GPU UUID, GPU name and vGPU ids
// with '?'. The region is shared memory tenants can write: raw, such text would be invalid UTF-8 in
// JSON (a heartbeat that cannot be encoded) and Prometheus labels (a refused scrape), or terminal
// escapes in `tfusion smi`.
void MakePrintable(limiter::RegionSnapshot* snap);

// The families of every region file in `dir` that can be attached (the others are skipped), one
// sample per vGPU with labels node, gpu, vgpu and qos: tf_vgpu_compute_request_ratio and
// tf_vgpu_compute_limit_ratio (gauges, fraction of the GPU), tf_vgpu_busy_seconds_total (counter:
// GPU-busy time charged to the vGPU; its rate is the current use), tf_vgpu_throttled_seconds_total
// (counter: time its processes were held back) and, of it, tf_vgpu_held_turn_seconds_total,
// tf_vgpu_held_limit_seconds_total and tf_vgpu_held_others_seconds_total (counters: held waiting
// for another vGPU's turn, at its limit, over its request for others), tf_vgpu_vram_used_bytes and
// tf_vgpu_vram_limit_bytes (gauges), tf_vgpu_vram_refusals_total (counter: allocations refused at
// the VRAM ceiling); the tiering families per vGPU with tiering, and per GPU.
void WriteVgpuMetrics(prom::Exposition* out, const std::string& dir, const std::string& node);

// "low", "medium", "high", "critical" for a region QoS value; "unknown" beyond.
const char* QosLabel(uint32_t qos);

}  // namespace tf::hypervisor
