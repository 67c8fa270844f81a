// ClusterState: pools > nodes > GPUs with their allocations and per-node aggregates.
//
// Pure data with exact integer accounting. Every mutation of a node bumps its version, which is
// what the scheduler's placement cache keys on. Not thread-safe: one owner mutates it (the
// controller's scheduling loop or the simulator).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "scheduler/types.h"

namespace tf::sched {

// The vGPUs one GPU can hold: its node's quota region has this many slots (limiter::kMaxVgpus).
// Placement counts every allocation placed on a GPU, suspended ones too (their vGPU stays), and
// puts no more there.
inline constexpr int kMaxVgpusPerGpu = 64;

struct GpuState {
  int model_id = 0;
  MilliTflops capacity = 0;      // physical
  MilliTflops schedulable = 0;   // physical x pool oversell ratio
  MilliTflops used = 0;          // sum of requests
  int64_t vram_capacity_mib = 0;
  int64_t vram_used_mib = 0;
  int numa_node = 0;
  uint64_t nvlink_peers = 0;
  int allocations = 0;   // counted allocations (not suspended)
  int vgpus = 0;         // every placed allocation, suspended or not: each holds a vGPU slot

  MilliTflops free_compute() const { return schedulable - used; }
  int64_t free_vram() const { return vram_capacity_mib - vram_used_mib; }
};

// What one GPU offers the requests of a pool: its physical TFLOPS x the pool's oversell ratio, and
// its physical VRAM + min(VRAM x vram_expand_to_host / 100, host tier budget) + min(VRAM x
// vram_expand_to_disk / 100, disk tier budget): the node's host memory and disk bound what the
// pool may expand into. A budget of -1 (not reported) bounds nothing. Placement counts requests
// against these; the controller's console and `tfusion pool ls` show them as the virtual capacity.
struct SchedulableCapacity {
  MilliTflops compute = 0;
  int64_t vram_mib = 0;
};
struct TierBudgets {
  int64_t host_mib = -1;  // the GPU's host tier budget
  int64_t disk_mib = -1;  // its share of the node's disk tier
};
SchedulableCapacity GpuSchedulableCapacity(double tflops, int64_t vram_mib, const PoolSpec& pool,
                                           TierBudgets budgets = {});

struct NodeState {
  std::string name;
  int pool = 0;
  bool schedulable = true;  // false once failed or removed
  int64_t cpu_capacity = 0, cpu_used = 0;  // capacity 0 = not tracked
  int64_t mem_capacity = 0, mem_used = 0;
  std::vector<GpuState> gpus;
  uint64_t model_mask = 0;  // bit model_id set when some GPU has that model
  uint32_t version = 1;
  // Aggregates, kept current by ClusterState.
  MilliTflops schedulable_sum = 0;
  MilliTflops used_sum = 0;
  MilliTflops max_free_compute = 0;
  int64_t max_free_vram = 0;
  std::vector<int> allocations;  // indices into ClusterState::allocation()

  bool TracksCpu() const { return cpu_capacity > 0; }
  bool TracksMem() const { return mem_capacity > 0; }
};

struct Allocation {
  Request request;
  Placement placement;
  bool live = false;
  uint64_t gpu_mask = 0;
  int64_t host_cpu = 0, host_mem = 0;  // what was taken on the node (0 for remote)
  // Preempted with its VRAM swapped out: still bound to its node and GPUs (and in the node's
  // list) but counted nowhere on them until it resumes. Tenant quotas still count it.
  bool suspended = false;
};

class ClusterState {
 public:
  Status AddPool(const PoolSpec& pool);
  // The pool must exist; GPU TFLOPS and VRAM must be positive; at most 64 GPUs.
  Status AddNode(const NodeSpec& node);
  // Marks the node unschedulable and releases everything on it; returns the requests that ran
  // there (for requeueing) in allocation order.
  StatusOr<std::vector<Request>> FailNode(std::string_view name);

  // Cordon (false) / uncordon (true); allocations stay.
  Status SetSchedulable(std::string_view name, bool schedulable);

  // Applies a placement computed for `request`. Re-checks capacity; kFailedPrecondition if it no
  // longer fits, kAlreadyExists if the id is live.
  Status Commit(const Request& request, const Placement& placement);
  // Frees an allocation (suspended or not). kNotFound for an unknown id.
  StatusOr<Request> Release(std::string_view request_id);
  // Suspends a live allocation: it keeps its placement but its compute, VRAM and host resources
  // stop counting. kNotFound; kFailedPrecondition when it is suspended already.
  Status Suspend(std::string_view request_id);
  // Counts a suspended allocation again on the same GPUs. kFailedPrecondition (nothing changes)
  // when they no longer have the room or the node is not schedulable; kNotFound.
  Status Resume(std::string_view request_id);
  // Records an allocation that is suspended already (a rebuild from stored state): placed but
  // not counted, so it is never refused for lack of room. Errors as Commit's, room aside.
  Status CommitSuspended(const Request& request, const Placement& placement);

  int PoolIndex(std::string_view name) const;   // -1 when absent
  NodeId NodeIndex(std::string_view name) const;  // -1 when absent
  // Model id for a model name, -1 when no GPU of that model was ever added.
  int ModelId(std::string_view model) const;
  uint64_t ModelMask(const std::vector<std::string>& models) const;  // ~0 when empty

  const std::vector<PoolSpec>& pools() const { return pools_; }
  const std::vector<NodeState>& nodes() const { return nodes_; }
  const NodeState& node(NodeId id) const { return nodes_[static_cast<size_t>(id)]; }
  const std::vector<NodeId>& pool_nodes(int pool) const { return pool_nodes_[static_cast<size_t>(pool)]; }
  const Allocation* FindAllocation(std::string_view request_id) const;
  const std::vector<Allocation>& allocations() const { return allocs_; }
  const std::vector<std::string>& model_names() const { return models_; }

  // Compute a request needs on one GPU of the node (percent requests scale with the GPU).
  static MilliTflops ComputeNeed(const Request& r, const GpuState& g);

  // Totals over schedulable nodes, for metrics and the simulator.
  MilliTflops TotalCapacity() const;
  MilliTflops TotalUsed() const;

 private:
  void Refresh(NodeState& n);
  void Apply(Allocation& a, int sign);
  // Commit's checks and bookkeeping; `count` false leaves the allocation suspended.
  Status Place(const Request& request, const Placement& p, bool count);

  std::vector<PoolSpec> pools_;
  std::vector<NodeState> nodes_;
  std::vector<std::vector<NodeId>> pool_nodes_;
  std::vector<std::string> models_;
  std::unordered_map<std::string, NodeId> node_by_name_;
  std::vector<Allocation> allocs_;
  std::vector<int> free_slots_;
  std::unordered_map<std::string, int> alloc_by_id_;
};

}  // namespace tf::sched
