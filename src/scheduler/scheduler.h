// Scheduler: places vGPU requests on a ClusterState it owns.
//
// Pure: no I/O, threads or clocks. Decisions are cached per (node, request shape) and keyed on the
// node's version, so a decision costs one cache probe per node plus a re-evaluation of the nodes
// that changed since that shape was last seen. Not thread-safe; one owner calls it.
//
// Error contract of Place/Schedule: kInvalidArgument (bad request, never fits by construction),
// kNotFound (unknown pool), kUnavailable (no room now; may fit later or through preemption),
// kResourceExhausted (tenant quota would be exceeded).
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "scheduler/cluster_state.h"
#include "scheduler/fragmentation.h"

namespace tf::sched {

struct PreemptionPlan {
  Placement placement;               // where the request goes once the victims are gone
  std::vector<std::string> victims;  // request ids to evict, lowest QoS first
  // Of the victims, the suspendable ones (Request::suspendable): ExecutePreemption suspends them
  // instead of releasing them.
  std::vector<std::string> suspended;
};

// One node of a pool as Place ranks it for a request (RankNodes).
struct NodeFit {
  NodeId node = -1;
  std::string name;
  bool fits = false;
  double score = 0;  // the placement mode's score when it fits: higher is preferred
  std::string why_not;  // when it does not fit: what is missing, for people
};

struct SchedulerOptions {
  // Distinct request shapes whose per-node decisions are cached (24 bytes per node each). The
  // openb default trace has 151 shapes (host CPU and memory included).
  int cache_shapes = 256;
  // FragAware: fragmentation deltas are compared in buckets of this many milli-GPU (0 = exact);
  // among equal deltas the node with the least idle GPU (weight per milli-GPU) and host CPU
  // fraction left wins.
  double frag_aware_quantum_milli = 0;
  double frag_aware_leftover_weight = 1.0;
  double frag_aware_cpu_weight = 0;
  // FragAware: weigh workload shapes by GPU demand instead of by count.
  bool frag_aware_demand_weighted = false;
  // FragAware: measure with NodeStrandedGpu (true) or FGD's NodeFragmentation (false).
  bool frag_aware_stranded_measure = true;
  // FragAware: weight of FGD's measure blended into the stranded measure (0..1).
  double frag_aware_fgd_blend = 0.5;
  // BestFit: weight of host-CPU leftover fraction against GPU leftover fraction.
  double best_fit_cpu_weight = 1.0;
  // Ties between equally scored nodes: 0 = lowest node index; otherwise a uniformly random pick
  // among the tied nodes from a PRNG with this seed (what kube-scheduler's selectHost does).
  uint64_t tie_break_seed = 0;
  // BestFit and FGD references: score nodes as kube-scheduler score plugins do, an integer
  // 0..100, so near-equal scores tie (FGD: 100 x sigmoid(-delta / 1000); BestFit: 100 x (1 -
  // mean leftover fraction)). The published FGD/BestFit numbers come from such a simulator.
  bool k8s_integer_scores = false;
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerOptions options = {});

  Status AddPool(const PoolSpec& pool) { return state_.AddPool(pool); }
  Status AddNode(const NodeSpec& node) { return state_.AddNode(node); }
  // Releases everything on the node (quota usage too) and returns the displaced requests.
  StatusOr<std::vector<Request>> FailNode(std::string_view name);
  // Cordons (false) or uncordons (true) a node; cordoned nodes keep their allocations.
  Status SetSchedulable(std::string_view name, bool schedulable);

  // The shape mix that FGD and FragAware measure fragmentation against. Until one is set they
  // measure against the request being placed.
  void SetWorkloadMix(WorkloadMix mix);
  void SetTenantQuota(const std::string& tenant, TenantQuota quota);

  // Decides without changing anything. Uses the pool's placement mode unless `mode_override`.
  StatusOr<Placement> Place(const Request& r) const;
  StatusOr<Placement> Place(const Request& r, PlacementMode mode) const;
  // Every node of the request's pool (or only `r.node`), whether the request fits there and the
  // score Place compares, in node order. Quotas are not checked (they do not depend on the node).
  // Nothing changes. Errors: as Place for the request itself (bad request, unknown pool).
  StatusOr<std::vector<NodeFit>> RankNodes(const Request& r) const;
  // Place then commit.
  StatusOr<Placement> Schedule(const Request& r);
  Status Commit(const Request& r, const Placement& p);
  StatusOr<Request> Release(std::string_view request_id);
  // Suspend / resume a placed allocation (ClusterState::Suspend, ClusterState::Resume). Tenant
  // quotas keep counting a suspended allocation, so resuming never exceeds one.
  Status Suspend(std::string_view request_id) { return state_.Suspend(request_id); }
  Status Resume(std::string_view request_id) { return state_.Resume(request_id); }
  // An allocation stored as suspended (ClusterState::CommitSuspended), counted in its tenant's use.
  Status CommitSuspended(const Request& r, const Placement& p);

  // For a request that does not fit: the fewest strictly-lower-QoS allocations on one node whose
  // eviction makes it fit, verified by re-placing the request on the node with them removed.
  // Suspended allocations take no room and are never victims.
  // kUnavailable when no such set exists (preemption would be futile).
  StatusOr<PreemptionPlan> PlanPreemption(const Request& r) const;
  // Executes a plan from PlanPreemption: evicts the victims (suspends the plan's `suspended` ones)
  // and commits the placement. Returns the evicted requests, the suspended ones not among them.
  StatusOr<std::vector<Request>> ExecutePreemption(const Request& r, const PreemptionPlan& plan);

  const ClusterState& state() const { return state_; }
  const TenantQuota* quota(const std::string& tenant) const;
  struct TenantUsage {
    MilliTflops compute = 0;
    int64_t vram_mib = 0;
    int gpus = 0;
  };
  TenantUsage usage(const std::string& tenant) const;

  // Cluster-wide expected fragmentation (milli-GPU) under the workload mix, and idle milli-GPU.
  double ClusterFragmentation() const;
  int64_t ClusterIdleMilli() const;

 private:
  struct Evaluation {
    bool fits = false;
    double score = 0;
    uint64_t gpus = 0;
  };
  struct CacheEntry {
    uint32_t version = 0;
    uint32_t generation = 0;
    double score = 0;  // -infinity: does not fit
    uint64_t gpus = 0;
  };
  struct ShapeKey {
    int pool;
    int mode;
    MilliTflops tflops;
    int64_t percent_milli;
    int64_t vram;
    int count;
    int64_t cpu;
    int64_t mem;
    uint64_t models;
    bool operator==(const ShapeKey&) const = default;
  };
  struct ShapeKeyHash {
    size_t operator()(const ShapeKey& k) const;
  };

  Evaluation Evaluate(const NodeState& n, const Request& r, uint64_t model_mask, PlacementMode mode,
                      NodeId id) const;
  double Measure(const FragView& v, const WorkloadMix& mix, bool ours) const;
  double FragBefore(NodeId id, const NodeState& n, const WorkloadMix& mix, bool ours) const;
  int CacheSlot(const ShapeKey& key) const;
  Status CheckQuota(const Request& r, const Placement& p) const;
  void Account(const Request& r, const Placement& p, int sign);
  StatusOr<PlacementMode> ModeFor(const Request& r, int* pool) const;
  StatusOr<Placement> PlaceIn(const Request& r, int pool, PlacementMode mode) const;
  // Why nothing in the pool fits, after "has no room": that nothing ever could, or that the
  // vGPU slots are what is missing; empty otherwise. Computed on a refusal only.
  std::string NoRoomDetail(const Request& r, int pool, uint64_t mm) const;

  SchedulerOptions options_;
  ClusterState state_;
  WorkloadMix mix_;
  WorkloadMix demand_mix_;
  std::unordered_map<std::string, TenantQuota> quotas_;
  std::unordered_map<std::string, TenantUsage> usage_;

  // Decision cache: slot-major [slot][node]. Mutable: Place is logically const.
  mutable std::vector<CacheEntry> cache_;
  mutable std::vector<uint32_t> slot_generation_;
  mutable std::unordered_map<ShapeKey, int, ShapeKeyHash> slot_of_;
  mutable std::vector<ShapeKey> key_of_slot_;
  mutable int next_victim_slot_ = 0;
  mutable size_t cache_nodes_ = 0;
  mutable uint64_t rng_state_ = 0;
  uint32_t mix_generation_ = 1;
  // Per-node fragmentation before placement, for FGD (index 0) and FragAware (index 1).
  mutable std::vector<uint32_t> frag_version_[2];
  mutable std::vector<uint32_t> frag_generation_[2];
  mutable std::vector<double> frag_value_[2];
};

}  // namespace tf::sched
