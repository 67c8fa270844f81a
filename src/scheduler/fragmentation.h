// Expected GPU fragmentation of a node under a workload mix (the measure behind FGD,
// Weng et al., USENIX ATC'23, re-implemented from the paper's description).
//
// For one workload shape s, the fragment of node n is the idle GPU compute that s cannot use:
// all of the node's idle GPU when s cannot be hosted there at all (host CPU/memory short, model not
// allowed, too few GPUs with room), otherwise the idle compute of the GPUs with less room than s
// needs per GPU. The expected fragment is the mix-weighted sum over shapes. Units: milli-GPU (1000
// = one whole GPU's schedulable compute).
#pragma once

#include <cstdint>
#include <vector>

#include "scheduler/cluster_state.h"

namespace tf::sched {

struct WorkloadShape {
  double weight = 1;       // relative frequency; normalised by WorkloadMix
  int gpu_count = 1;       // 0 = CPU-only
  int64_t gpu_milli = 1000;  // per GPU, 1..1000
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
  uint64_t model_mask = ~uint64_t{0};
};

class WorkloadMix {
 public:
  // Merges equal shapes, normalises weights to sum 1 and sorts by gpu_milli (the order that
  // NodeFragmentation walks). Shapes with weight <= 0 are dropped.
  explicit WorkloadMix(std::vector<WorkloadShape> shapes = {});
  const std::vector<WorkloadShape>& shapes() const { return shapes_; }
  bool empty() const { return shapes_.empty(); }
  // Reweights each shape by its GPU demand (weight x gpu_count x gpu_milli), renormalised; used by
  // the FragAware policy, which cares about idle GPU the demand cannot use, not pod counts.
  WorkloadMix DemandWeighted() const;

 private:
  std::vector<WorkloadShape> shapes_;
};

// A node reduced to what fragmentation depends on. Frees in milli-GPU.
struct FragView {
  int gpus = 0;
  int64_t free_milli[64] = {};
  int model_id[64] = {};
  int64_t cpu_free = INT64_MAX;  // INT64_MAX when the node does not track CPU
  int64_t mem_free = INT64_MAX;
};

FragView MakeFragView(const NodeState& n);
// Expected fragment of the node in milli-GPU. O(G log G + shapes).
double NodeFragmentation(const FragView& v, const WorkloadMix& mix);
// FragAware's measure, a capacity-aware generalisation of the one above: for each shape, the idle
// GPU that a stream of copies of that shape could not consume, given how many copies fit the
// node's GPUs (sum over GPUs of floor(free / per-GPU need)) and how many its host CPU and memory
// allow. Unlike NodeFragmentation it sees the remainder left on a partly used GPU and idle GPUs
// stranded by host CPU running out. O(G x distinct per-GPU sizes + shapes).
double NodeStrandedGpu(const FragView& v, const WorkloadMix& mix);
// Sum of idle milli-GPU of the view.
int64_t IdleMilli(const FragView& v);

}  // namespace tf::sched
