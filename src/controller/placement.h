// PlacementEngine: the controller's adapter over the placement library (src/scheduler). It keeps a
// tf::sched::Scheduler that mirrors the controller's in-memory view (pools with their placement
// mode and TFLOPS oversell ratio, nodes, GPUs, allocations, tenant quotas), asks it where a request
// goes (and, for a request that does not fit, which lower-QoS allocations to preempt), and is told
// what the controller committed. It does no I/O: the controller commits the decision to the store
// (compare-and-swap on GPU revisions) and only then calls Commit/Release here.
//
// The mirror is rebuilt from a ClusterSnapshot whenever the controller's topology changes (Reset);
// allocations and releases are applied incrementally. GPU usage that no known allocation explains
// (another writer's commit seen through a re-read) is reserved as an unpreemptible residual, so
// the engine never offers capacity the store says is taken.
//
// Thread safety: none; the controller calls it under its own mutex.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "controller/model.h"
#include "scheduler/scheduler.h"

namespace tf::controller {

// What the engine mirrors; pointers into the controller's maps, valid during Reset only.
struct ClusterSnapshot {
  std::vector<const Pool*> pools;
  std::vector<const Node*> nodes;
  std::vector<const Gpu*> gpus;
  std::vector<const Allocation*> allocations;
  std::vector<const TenantQuota*> quotas;
};

struct PlacementRequest {
  std::string id;         // the allocation id it will get
  std::string pool;
  std::string tenant;     // empty: no quota applies
  // Compute comes in as the API gave it (TFLOPS, validated); the engine converts it to
  // milli-TFLOPS once (ToMilliTflops).
  double tflops = 0;      // per vGPU; or
  double percent = 0;     // per vGPU, percent of the chosen GPU (exactly one of the two is > 0)
  int64_t vram_mib = 0;   // per vGPU
  int gpu_count = 1;      // all on one node
  Qos qos = Qos::kMedium;
  std::string gpu_model;  // empty: any model; otherwise a case-insensitive substring of it
  // The ceiling per vGPU in the request's unit (0 = the request). Placement counts the request
  // only; a TFLOPS limit restricts it to GPUs whose physical capacity can host the limit.
  double tflops_limit = 0;
  double percent_limit = 0;
  std::string node;       // empty: any node of the pool; else only this one
  bool tiering = false;   // its VRAM can leave the GPU: preempted, it is suspended, not released
};

struct PlacementDecision {
  std::string node;
  std::vector<std::string> gpu_uuids;  // gpu_count distinct GPUs of `node`
  MilliTflops milli_tflops_per_gpu = 0;  // what is reserved on each (percent requests resolved)
  std::vector<std::string> victims;    // allocation ids to release in the same commit (QoS)
  std::vector<std::string> suspended;  // of the victims, those to suspend instead (tiering)
};

class PlacementEngine {
 public:
  explicit PlacementEngine(sched::SchedulerOptions options = {});

  // Rebuilds the mirror. Problems with single objects (a GPU of unknown capacity, an allocation
  // that no longer fits) are logged and skipped, never fatal.
  void Reset(const ClusterSnapshot& snapshot);
  // Incremental topology changes that need no rebuild: a new pool, a node registered for the
  // first time (nothing allocated on it; `gpus` are its GPUs). An error leaves the mirror as it
  // was; the caller then rebuilds it.
  Status AddPool(const Pool& pool);
  Status AddNode(const Node& node, std::vector<const Gpu*> gpus);

  // kInvalidArgument (bad request), kOutOfMemory (no room, and no preemption would make room),
  // kResourceExhausted (tenant quota); kOutOfMemory too when no GPU of the pool is big enough for
  // the TFLOPS limit even when empty (the message says so). With `allow_preemption`, a request that does not fit may
  // come back with victims: the fewest strictly-lower-QoS allocations on one node whose release
  // makes it fit (never a futile set).
  StatusOr<PlacementDecision> Place(const PlacementRequest& request, bool allow_preemption) const;

  // Every node of the request's pool: whether the request fits there now (without preemption or
  // quotas) and the placement mode's score (higher preferred), or why it does not fit. Errors: as
  // Place for the request itself.
  StatusOr<std::vector<sched::NodeFit>> RankNodes(const PlacementRequest& request) const;

  // The decision was committed to the store: release its victims and take the capacity.
  // REQUIRES `decision` came from Place(request) with no change in between.
  Status Commit(const PlacementRequest& request, const PlacementDecision& decision);
  // An allocation is gone (released by request, preempted elsewhere, or its node was lost).
  void Release(const Allocation& allocation);
  // A suspended allocation counts again on its GPUs: kFailedPrecondition (nothing changes) while
  // they lack the room. Suspend undoes it (a resume the store then refused).
  Status Resume(const Allocation& allocation);
  void Suspend(const Allocation& allocation);

 private:
  struct GpuRef {
    std::string node;
    int index = 0;  // position within the scheduler's node
  };
  StatusOr<sched::Request> ToSchedRequest(const PlacementRequest& r) const;
  Status RestrictToGpusThatHost(const PlacementRequest& in, sched::Request* r) const;

  const sched::SchedulerOptions options_;
  std::unique_ptr<sched::Scheduler> scheduler_;
  std::map<std::string, GpuRef> gpu_refs_;                       // by GPU uuid
  std::map<std::string, std::vector<std::string>> node_gpus_;    // node -> uuid by position
};

std::unique_ptr<PlacementEngine> MakeSchedulerPlacement(sched::SchedulerOptions options = {});

// The tier budgets that bound a GPU's VRAM expansion (sched::GpuSchedulableCapacity): its host
// tier budget and its share of its node's disk tier; `node` null: not reported.
sched::TierBudgets GpuTierBudgets(const Gpu& gpu, const Node* node, size_t node_gpus);
// The VRAM placement counts on `gpu` (MiB): physical, plus its pool's expansion as far as the
// node's tier budgets allow. `pool` null: no expansion. `node_gpus`: the GPUs of its node.
int64_t SchedulableVramMib(const Gpu& gpu, const Pool* pool, const Node* node, size_t node_gpus);
// What placement may count on `gpu` in `pool` when no tier budget bounds the VRAM expansion: its
// physical TFLOPS x the pool's oversell ratio, its VRAM plus the pool's full expansion. Budgets
// change with the node's free memory and disk; this changes only with the GPU or the pool.
sched::SchedulableCapacity UnboundedSchedulableCapacity(const Gpu& gpu, const Pool& pool);

}  // namespace tf::controller
