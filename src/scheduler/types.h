// Vocabulary of the placement library: cluster specs, vGPU requests and placement decisions.
//
// Units: compute in TFLOPS (FP16 dense tensor) or percent of one GPU; VRAM and host memory in MiB;
// host CPU in milli-cores. Internally compute is held as integer milli-TFLOPS so that fit checks
// are exact.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tf::sched {

enum class Qos : uint8_t { kLow = 0, kMedium = 1, kHigh = 2, kCritical = 3 };

enum class PlacementMode : uint8_t {
  kCompactFirst,           // pack: most-loaded node and GPU that fit
  kLowLoadFirst,           // spread: least-loaded node and GPU
  kNodeCompactGpuLowLoad,  // TensorFusion default: most-loaded node, least-loaded GPU in it
  kBestFit,                // reference: least leftover GPU (then CPU) after placement
  kFgd,                    // reference: fragmentation gradient descent (Weng et al., ATC'23)
  kFragAware,              // ours: blended FGD + stranded-GPU delta, packing tie-break
};

std::string_view QosName(Qos q);
StatusOr<Qos> ParseQos(std::string_view s);
std::string_view PlacementModeName(PlacementMode m);
StatusOr<PlacementMode> ParsePlacementMode(std::string_view s);

// Milli-TFLOPS, the integer unit of compute inside the scheduler.
using MilliTflops = int64_t;
MilliTflops ToMilliTflops(double tflops);
double ToTflops(MilliTflops m);

struct GpuSpec {
  std::string model;         // catalog model name, e.g. "A100-80GB"
  double tflops = 0;         // FP16 dense capacity
  int64_t vram_mib = 0;
  int numa_node = 0;
  uint64_t nvlink_peers = 0; // bit i set: NVLink to GPU i of the same node
  // What the node's VRAM tiering can hold for this GPU (TierBudgets): host memory, and its share
  // of the node's disk tier, MiB; -1: not reported (the pool's expansion counts in full).
  int64_t host_tier_budget_mib = -1;
  int64_t disk_tier_budget_mib = -1;
};

// REQUIRES 1..64 GPUs per node (bit masks), or 0 for a CPU-only node.
struct NodeSpec {
  std::string name;
  std::string pool;
  std::vector<GpuSpec> gpus;
  int64_t cpu_milli = 0;   // host CPU available to local tenants; 0 = not tracked
  int64_t memory_mib = 0;  // host memory available to local tenants; 0 = not tracked
};

struct PoolSpec {
  std::string name;
  double tflops_oversell_ratio = 1.0;  // >= 1; 2.0 lets requests sum to twice physical TFLOPS
  PlacementMode mode = PlacementMode::kNodeCompactGpuLowLoad;
  // VRAM requests may add up to physical VRAM x (100 + host + disk) / 100: the part beyond the
  // physical is held in host memory and on disk by VRAM tiering (idle tenants swapped out).
  int vram_expand_to_host_percent = 0;  // 0..400
  int vram_expand_to_disk_percent = 0;  // 0..400
};

// One workload's request for vGPUs: gpu_count slices of identical size on one node.
// Exactly one of tflops_request / compute_percent_request is set (> 0) for GPU workloads.
// gpu_count == 0 is a CPU-only workload (cpu_milli > 0, no compute or VRAM).
struct Request {
  std::string id;
  std::string tenant;
  std::string pool;
  double tflops_request = 0;           // per GPU
  double tflops_limit = 0;             // per GPU; 0 = same as request
  double compute_percent_request = 0;  // per GPU, (0, 100]
  double compute_percent_limit = 0;
  int64_t vram_request_mib = 0;        // per GPU; what scheduling counts
  int64_t vram_limit_mib = 0;          // per GPU; may exceed the request; 0 = same as request
  int gpu_count = 1;
  std::vector<std::string> gpu_models; // allow list; empty = any
  Qos qos = Qos::kMedium;
  bool remote = false;                 // remote vGPU: host CPU/memory are not taken on the GPU node
  int64_t cpu_milli = 0;               // host CPU on the GPU node (local only)
  int64_t memory_mib = 0;              // host memory on the GPU node (local only)
  std::string node;                    // empty: any node of the pool; else only this node
  // Its VRAM can leave the GPU (VRAM tiering): preempting it suspends it (kept on its GPUs, not
  // counted) instead of evicting it; it resumes there when the room comes back.
  bool suspendable = false;
};

// Checks a request on its own (not against a cluster). Every rule has its own message.
Status ValidateRequest(const Request& r);

using NodeId = int32_t;

struct Placement {
  std::string request_id;
  NodeId node = -1;
  std::string node_name;
  std::vector<int> gpus;              // GPU indices within the node
  MilliTflops compute_per_gpu = 0;    // what was reserved on each of those GPUs
  int64_t vram_per_gpu_mib = 0;
};

struct TenantQuota {
  double max_tflops = 0;     // 0 = unlimited
  int64_t max_vram_mib = 0;  // 0 = unlimited
  int max_gpus = 0;          // vGPU count; 0 = unlimited
};

}  // namespace tf::sched
