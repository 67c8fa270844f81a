// Loader for the openb GPU-cluster trace (Alibaba clusterdata, cluster-trace-gpu-v2023; Weng et
// al., "Beware of Fragmentation", USENIX ATC'23). Maps trace rows onto scheduler specs.
//
// Units in the simulator: every GPU gets a capacity of 1000 "TFLOPS", so a pod's gpu_milli is its
// TFLOPS request and the scheduler's exact integer accounting equals the trace's milli-GPU.
#pragma once

#include <string>
#include <vector>

#include "scheduler/fragmentation.h"
#include "scheduler/scheduler.h"
#include "scheduler/types.h"

namespace tf::sim {

struct TraceNode {
  std::string name;
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
  int gpus = 0;
  std::string model;
};

struct TracePod {
  std::string name;
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
  int num_gpu = 0;
  int64_t gpu_milli = 0;               // per GPU
  std::vector<std::string> gpu_spec;   // allowed models; empty = any
  std::string qos;                     // LS, BE, Burstable, Guaranteed
  int64_t creation_time = 0, deletion_time = 0;  // seconds
  int64_t gpu_demand() const { return static_cast<int64_t>(num_gpu) * gpu_milli; }
};

StatusOr<std::vector<TraceNode>> LoadNodes(const std::string& path);
StatusOr<std::vector<TracePod>> LoadPods(const std::string& path);

constexpr double kSimGpuTflops = 1000.0;
constexpr int64_t kSimGpuVramMib = 1 << 20;  // VRAM is not in the trace: never the constraint

// One pool "openb" with the given mode holding the GPU nodes (gpus > 0), cycled up to
// `replicate_to` nodes when that is larger; the scheduler's workload mix is the pods' (MixOf).
Status BuildCluster(const std::vector<TraceNode>& nodes, const std::vector<TracePod>& pods,
                    sched::PlacementMode mode, sched::Scheduler* s, int replicate_to = 0);
sched::Request ToRequest(const TracePod& p, const std::string& id);
sched::Qos ToQos(const std::string& trace_qos);
// The trace's shape distribution (one weight per pod), what FGD measures fragmentation against.
sched::WorkloadMix MixOf(const std::vector<TracePod>& pods, const sched::ClusterState& state);

}  // namespace tf::sim
