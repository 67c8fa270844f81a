// Controller: the control plane's state machine over pools, nodes, GPUs, workloads and
// allocations. Durable state lives in a Store; this class holds an in-memory copy (with each
// object's store revision) that it rebuilds from the store when it becomes leader (Rebuild).
//
// Allocation: the PlacementEngine (the scheduler library, src/scheduler) picks GPUs from the
// in-memory view, in the pool's placement mode, within the tenant's quota; a request that does not
// fit may preempt strictly-lower-QoS allocations (the fewest, never a futile set). The decision is
// committed in one store transaction that compares every chosen GPU's revision, every victim's
// revision (and the leader fence) and writes the GPUs' new usage, the victims' deletion and the
// allocation together. Only after the commit succeeds is the
// allocation acknowledged, so an acknowledged allocation survives a crash, and two replicas can
// never both take the same capacity: the second commit fails its compare.
//
// Node liveness: heartbeat times are kept in memory only. A node silent for heartbeat_timeout_ms
// is marked lost (persisted; its GPUs stop taking new allocations); lost for lost_grace_ms more,
// its allocations are released. A replica that takes over gives every node a fresh timeout.
//
// Thread safety: every public method may be called concurrently; one mutex serializes decisions.
// Store transactions are staged under it and waited for after it is released (group commit), so
// a later caller may see (not be acknowledged on) state whose fsync is still in flight.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "controller/clock.h"
#include "controller/latency_histogram.h"
#include "controller/model.h"
#include "controller/placement.h"
#include "controller/store.h"

namespace tf::controller {

struct ControllerConfig {
  int64_t heartbeat_timeout_ms = 15'000;
  int64_t lost_grace_ms = 60'000;
  std::string default_pool = "default";  // created by Rebuild when missing
  int64_t eviction_retention_ms = 3'600'000;  // evictions are listed this long, then forgotten
};

struct GpuReport {  // what a node agent reports for one GPU at registration
  std::string uuid;
  std::string model;
  int index = 0;
  int numa_node = -1;
  double tflops = 0;
  int64_t vram_mib = 0;
  int64_t host_tier_budget_mib = -1;  // its host tier budget; -1: not reported (Gpu)
};

struct NodeRegistration {
  std::string name;
  std::string pool;
  std::string address;
  std::vector<GpuReport> gpus;
  std::string worker_address;  // empty or HOST:PORT (ValidateWorkerAddress)
  // The agent's node credential (a secret it keeps across restarts). The first registration that
  // presents one enrolls it; later registrations and heartbeats must present the same.
  std::string credential;
  int64_t disk_tier_budget_mib = -1;  // its disk tier (Node); -1: not reported
};

struct GpuSample {  // one heartbeat sample for one GPU
  std::string uuid;
  double utilization_percent = 0;
  int64_t memory_used_mib = 0;
  int64_t host_tier_budget_mib = -1;  // as now configured; -1: not reported (unchanged)
  // Of the GPU, what vGPUs that are no allocation's are guaranteed (parts per million of its
  // compute) and may hold (VRAM limits, MiB); -1: not reported (unchanged). Gpu::unpooled_*.
  int64_t unpooled_share_ppm = -1;
  int64_t unpooled_vram_mib = -1;
};

// One process of a vGPU: its pid in the PID namespace it attached from, and the VRAM it holds.
struct VgpuProcess {
  int64_t pid = 0;
  int64_t vram_bytes = 0;
};
inline constexpr size_t kMaxReportedProcesses = 256;  // per vGPU and heartbeat

// One heartbeat sample of one allocation's vGPU on one GPU: the counters the node's quota region
// keeps (GPU-busy time charged to it, time its processes were held back), since the vGPU was made.
struct VgpuUseSample {
  std::string allocation;
  std::string gpu_uuid;
  int64_t busy_ns_total = 0;
  int64_t throttled_ns_total = 0;
  std::string tier_state;     // VRAM tiering: resident, swapped, on disk, ...; empty: not reported
  int64_t swapped_bytes = 0;  // of its processes, in host memory or on disk
  std::vector<VgpuProcess> processes;  // its live processes, as the node's quota region lists them
  // The tier idle timeouts its region holds (what the node applied), ms, 0 = never; -1: not reported.
  int64_t applied_idle_swap_ms = -1;
  int64_t applied_idle_disk_ms = -1;
  int64_t applied_idle_zero_ms = -1;
  int64_t held_turn_ns_total = -1;  // of throttled_ns_total, waiting for other vGPUs' turns; -1: not reported
};

// What `tfusion top` shows per vGPU: its compute use over the last heartbeat interval (percent of
// the GPU; negative until two samples have arrived) and its time held back so far.
struct VgpuUse {
  double use_percent = -1;
  double throttled_seconds = 0;
  double turn_seconds = -1;  // of throttled_seconds, waiting for other vGPUs' turns; -1: not reported
  int64_t sampled_ms = 0;
  std::string tier_state;  // as last reported (empty: none)
  int64_t swapped_bytes = 0;
  std::vector<VgpuProcess> processes;
  int64_t applied_idle_swap_ms = -1;  // as last reported; -1: none
  int64_t applied_idle_disk_ms = -1;
  int64_t applied_idle_zero_ms = -1;
};

struct AllocationRequest {
  std::string workload;  // optional; when set, unset fields come from the workload
  std::string pool;
  double tflops = 0;
  int64_t vram_mib = 0;
  int gpu_count = 0;
  std::string qos;
  std::string gpu_model;
  std::string tenant;    // quotas apply per tenant; empty: none
  double percent = 0;    // percent of one GPU per vGPU, instead of tflops
  bool allow_preemption = true;  // may evict strictly-lower-QoS allocations to fit
  // The compute limit (ceiling) per vGPU, in the request's unit; 0 = the request. It must be at
  // least the request and at most the chosen GPU's capacity (percent: at most 100).
  double tflops_limit = 0;
  double percent_limit = 0;
  // Idempotency key ([A-Za-z0-9._:-], 1-128): a retry with the same key and tenant returns the
  // allocation the first attempt made (while it lives) instead of making another.
  std::string request_id;
  // A lease of this many ms (5 s to 1 h; 0: none), renewed with RenewLease.
  int64_t lease_ms = 0;
  // Empty: any node of the pool. Else the vGPUs go on this node or nowhere (the Kubernetes
  // scheduler extender binds a pod to the node it chose).
  std::string node;
  // Tier idle overrides (Allocation::idle_swap_ms); unset: the workload's, else the QoS default.
  std::optional<int64_t> idle_swap_ms;
  std::optional<int64_t> idle_disk_ms;
  std::optional<int64_t> idle_zero_ms;
};

// A change of an allocation's tier idle overrides (PATCH): per field, absent = unchanged, an
// empty value = back to the QoS default, else the new timeout in ms (0 = never).
struct TierIdleChange {
  std::optional<std::optional<int64_t>> idle_swap_ms;
  std::optional<std::optional<int64_t>> idle_disk_ms;
  std::optional<std::optional<int64_t>> idle_zero_ms;
};

struct GpuStatus {  // a GPU with its latest heartbeat sample
  Gpu gpu;
  double utilization_percent = 0;
  int64_t memory_used_mib = 0;
  int64_t sampled_ms = 0;
  int64_t schedulable_vram_mib = 0;  // what placement counts (SchedulableVramMib)
};

struct NodeStatus {
  Node node;
  int64_t last_heartbeat_ms = 0;
  size_t allocations = 0;  // live allocations on it, suspended ones included (a drain waits for 0)
};

// Outcome of one placement attempt (POST /v1/allocations that reached the scheduler), the
// `result` label of tf_controller_placements_total: placed; placed after preempting lower-QoS
// allocations; refused for lack of room; refused by the tenant's quota; refused as invalid for
// the pool (an unknown GPU model, a limit no GPU of the pool can host, ...).
enum class PlacementResult { kPlaced, kPlacedPreempting, kNoCapacity, kQuota, kInvalid };
inline constexpr PlacementResult kPlacementResults[] = {PlacementResult::kPlaced, PlacementResult::kPlacedPreempting,
                                                        PlacementResult::kNoCapacity, PlacementResult::kQuota,
                                                        PlacementResult::kInvalid};
const char* PlacementResultName(PlacementResult r);
// The result of a refused placement, from the refusal's status code.
PlacementResult PlacementResultOf(const Status& refusal);

// Counters exported at /metrics.
struct ControllerCounters {
  // Placement attempts by pool and result (existing pools only: requests naming an unknown pool
  // are refused before they reach the scheduler, so outside input cannot add label values).
  std::map<std::pair<std::string, PlacementResult>, uint64_t> placements;
  uint64_t allocations_released = 0;  // by request (DELETE)
  uint64_t allocations_released_lost_node = 0;
  uint64_t allocations_lease_expired = 0;  // their holder stopped renewing (killed, cut off)
  uint64_t allocations_preempted = 0;
  uint64_t allocations_suspended = 0;  // preempted with tiering: kept, swapped out
  uint64_t allocations_resumed = 0;    // suspended ones that counted again
  uint64_t commit_conflicts = 0;  // CAS failures (another writer, or lost leadership)
  uint64_t nodes_marked_lost = 0;
  uint64_t evictions_stopped = 0;  // evictions whose processes the node agent reported gone
};

// Where the controller's write calls spend their time (exported at /metrics as
// tf_controller_call_stage_seconds{stage=...}; bench/controller prints them).
struct CallStageTimes {
  LatencyHistogram lock_wait;     // allocate/release: waiting for the controller's mutex
  LatencyHistogram locked;        // allocate/release: under it (placement, staging the commit)
  LatencyHistogram durable_wait;  // every write call: mutex released, waiting for its batch's commit
};

class Controller {
 public:
  // `store`, `clock` and `election` (may be null: always leader) must outlive the Controller.
  Controller(Store* store, const Clock* clock, std::unique_ptr<PlacementEngine> placement,
             LeaderElection* election, ControllerConfig config = {});

  // Replaces the in-memory state with the store's. Call on start and on becoming leader.
  Status Rebuild();
  // Whether this replica may serve (it leads and has rebuilt its state since it started leading).
  bool Serving() const;
  // Drops the in-memory state (on losing leadership): Serving() is false until the next Rebuild.
  void StopServing();

  StatusOr<Pool> CreatePool(const std::string& name);
  // `spec.placement_mode` (docs/scheduler.md; empty: the default) and tflops_oversell_ratio >= 1.
  StatusOr<Pool> CreatePool(const Pool& spec);
  StatusOr<Pool> UpdatePool(const Pool& spec);  // replaces the mode and the oversell ratio
  // Changes only what is given; the rest keeps its value (PATCH).
  StatusOr<Pool> PatchPool(const std::string& name, const std::optional<std::string>& placement_mode,
                           const std::optional<int>& vram_expand_to_host_percent,
                           const std::optional<int>& vram_expand_to_disk_percent,
                           const std::optional<double>& tflops_oversell_ratio);
  std::vector<Pool> ListPools() const;
  StatusOr<Pool> GetPool(const std::string& name) const;
  Status DeletePool(const std::string& name);  // kFailedPrecondition while nodes use it

  // A refusal is logged once per node and reason (its agent retries every few seconds), again
  // when the reason changes, and forgotten once the node registers.
  StatusOr<Node> RegisterNode(const NodeRegistration& reg);
  // `vgpus`: use of the node's allocations' vGPUs; samples of allocations not on this node are
  // ignored (one released meanwhile), counters that go back start the interval again.
  // `disk_tier_budget_mib` >= 0 and GPU samples' host_tier_budget_mib >= 0 that differ from what
  // is stored are stored (the pool's schedulable VRAM on the node follows).
  Status Heartbeat(const std::string& node, const std::vector<GpuSample>& samples,
                   const std::vector<VgpuUseSample>& vgpus = {}, const std::string& credential = "",
                   int64_t disk_tier_budget_mib = -1);
  // Cordons a node (`cordoned`: it keeps its allocations, takes no new ones, preemption included)
  // or uncordons it; stored with the node, so it outlasts agent re-registrations and controller
  // restarts. Idempotent (an unchanged node is not written). kNotFound for an unknown node.
  StatusOr<Node> SetNodeCordoned(const std::string& name, bool cordoned);
  // Removes a node and its GPUs: kFailedPrecondition while allocations are on it. Its agent may
  // then enroll again (with any credential).
  Status DeregisterNode(const std::string& name);
  // The last use reported for `allocation` on `gpu_uuid`; kNotFound when none was.
  StatusOr<VgpuUse> GetVgpuUse(const std::string& allocation, const std::string& gpu_uuid) const;
  std::vector<NodeStatus> ListNodes() const;
  StatusOr<NodeStatus> GetNode(const std::string& name) const;
  std::vector<GpuStatus> ListGpus(const std::string& pool_filter) const;

  StatusOr<Workload> CreateWorkload(const Workload& w);
  std::vector<Workload> ListWorkloads() const;
  StatusOr<Workload> GetWorkload(const std::string& name) const;
  Status DeleteWorkload(const std::string& name);

  // API tokens (docs/controller.md, "Roles"). CreateToken validates the spec (a tenant token names
  // its tenant, a node token its node), stores only the SHA-256 of a fresh 256-bit secret and
  // returns the record and the token to hand out, "tft_<id>_<secret>", shown this once.
  StatusOr<std::pair<ApiToken, std::string>> CreateToken(ApiToken spec);
  std::vector<ApiToken> ListTokens() const;
  Status RevokeToken(const std::string& id);
  // A freeze (swap the allocation's vGPUs out to host memory) or thaw request through the API: counted
  // on the allocation, carried out by its node's agent. kFailedPrecondition for an allocation
  // without VRAM tiering. `zero` (a freeze only): scale to zero, the agent then also checkpoints the
  // swapped processes with the driver (counted in zero_requests as well).
  StatusOr<Allocation> RequestTier(const std::string& allocation, bool freeze, bool zero = false);
  // Changes the allocation's tier idle overrides; its node's agent applies them at its next sync.
  // kInvalidArgument for a value out of range or no change given, kFailedPrecondition for an
  // allocation without VRAM tiering.
  StatusOr<Allocation> SetTierIdle(const std::string& allocation, const TierIdleChange& change);
  // Extends the allocation's lease by its lease_ms from now. kFailedPrecondition without a lease.
  StatusOr<Allocation> RenewLease(const std::string& allocation);
  // The stored token a presented one matches; kUnauthenticated when none (unknown, revoked, wrong
  // secret, or not of our shape).
  StatusOr<ApiToken> Authenticate(const std::string& presented) const;

  // Tenant quotas (0 = unlimited). A quota below current use refuses new allocations only.
  StatusOr<TenantQuota> SetTenantQuota(const TenantQuota& q);
  // Removes a tenant's quota: its allocations stay; new ones are no longer limited. kNotFound.
  Status DeleteTenantQuota(const std::string& tenant);
  std::vector<TenantQuota> ListTenantQuotas() const;

  // kInvalidArgument (bad request), kNotFound (pool or workload), kOutOfMemory (no capacity),
  // kResourceExhausted (tenant quota), kAborted (conflicting writers, retry), kUnavailable (not
  // the leader, or the store is down). `preempted` (may be null) receives the allocations that
  // were released to make room, in the same store transaction.
  StatusOr<Allocation> Allocate(const AllocationRequest& req,
                                std::vector<Allocation>* preempted = nullptr, bool* replayed = nullptr);
  Status Release(const std::string& allocation_id);
  std::vector<Allocation> ListAllocations() const;
  std::vector<Allocation> ListAllocationsOnNode(const std::string& node) const;
  StatusOr<Allocation> GetAllocation(const std::string& id) const;

  // Allocations taken back (preempted, or released with their lost node) within the retention
  // period; `node` empty: all nodes.
  std::vector<Eviction> ListEvictions(const std::string& node) const;
  StatusOr<Eviction> GetEviction(const std::string& id) const;
  // The node agent reports that no process uses the evicted allocation's vGPUs any more, after
  // it signalled `processes` of them (>= 0). Idempotent; kNotFound for an unknown id.
  StatusOr<Eviction> MarkEvictionStopped(const std::string& id, int processes);

  // Marks silent nodes lost, releases allocations of nodes lost past the grace period and forgets
  // evictions older than the retention period.
  // Called periodically by the server (and directly by tests with a FakeClock).
  void Tick();

  ControllerCounters counters() const;
  CallStageTimes& stage_times() { return stage_times_; }
  // Prometheus families of the state and counters (controller_metrics.cc; names and labels in
  // docs/operations.md, "Metrics").
  void WriteMetrics(prom::Exposition* out) const;
  std::string MetricsText() const;

 private:
  template <typename T>
  struct Versioned {
    T value;
    int64_t revision = 0;
  };

  // Runs `body` (which takes mu_ and may stage store transactions through CommitLocked) and then,
  // with mu_ released, waits until what it staged is durable: concurrent callers share one
  // fsync (group commit) and nobody is acknowledged before their writes are on disk.
  template <typename F>
  auto Durably(F&& body) -> decltype(body());
  Status CheckServingLocked() const;
  StatusOr<int64_t> CommitLocked(std::vector<Compare> compares, const std::vector<Write>& writes);
  // Reads an allocation, lets `change` modify it (or refuse with its status) and commits it.
  StatusOr<Allocation> UpdateAllocation(const std::string& id, const std::function<Status(Allocation&)>& change);
  // eviction_reason: nullptr for a plain release; else the allocation is recorded as evicted
  // ("node-lost", "lease-expired") so its node's agent stops what still runs on it.
  Status ReleaseLocked(const std::string& id, const char* eviction_reason);
  void PruneEvictionsLocked(int64_t now_ms);
  Status ReloadGpusLocked(const std::vector<std::string>& uuids);
  Status EnsurePoolLocked(const std::string& name);
  void EnsurePlacementLocked();
  void EraseAllocationLocked(std::map<std::string, Versioned<Allocation>>::iterator it);
  // Resumes the suspended allocations of `node` whose GPUs have room again, highest QoS first,
  // each in its own store transaction.
  void ResumeSuspendedLocked(const std::string& node);
  std::string NewAllocationIdLocked();

  Store* const store_;
  const Clock* const clock_;
  std::unique_ptr<PlacementEngine> placement_;
  LeaderElection* const election_;
  const ControllerConfig config_;

  mutable std::mutex mu_;
  bool serving_ = false;
  // The closed spans [from, to) in which this replica did not serve or its store's writes failed:
  // holders could not renew their leases then, so a lease runs out that much later. Sorted,
  // overlapping ones merged, at most 64 (the oldest dropped: behind every lease window that
  // matters). The open ones are kept apart: not serving since (from its start, unknown, on) ...
  std::vector<std::pair<int64_t, int64_t>> unserved_;
  bool not_serving_ = true;
  int64_t not_serving_since_ms_ = INT64_MIN;
  // Writes failing (a batch that did not reach the disk, a store that refused a transaction):
  // since when, counted from the last write that did reach it (a renewal after that one may have
  // been lost); 0 = they succeed. Closed into unserved_ by the next durable write.
  int64_t write_failing_since_ms_ = 0;
  std::atomic<int64_t> last_durable_ok_ms_{0};
  std::atomic<bool> write_failing_{false};  // write_failing_since_ms_ != 0, read without mu_
  void NoteUnservedLocked(int64_t now_ms);
  void AddUnservedSpanLocked(int64_t from_ms, int64_t to_ms);
  void NoteWriteFailedLocked();
  void NoteWriteDurable();
  int64_t UnservedMsLocked(int64_t from_ms, int64_t now_ms) const;
  std::map<std::string, Versioned<Pool>> pools_;
  std::map<std::string, Versioned<Node>> nodes_;
  std::map<std::string, Versioned<Gpu>> gpus_;
  std::map<std::string, Versioned<Workload>> workloads_;
  std::map<std::string, Versioned<Allocation>> allocations_;
  // Allocation ids by node: the agents' per-node sync reads this every second.
  std::unordered_map<std::string, std::set<std::string>> allocations_by_node_;
  std::unordered_map<std::string, std::string> allocation_by_request_;  // request_id -> allocation id
  std::set<std::string> suspended_;  // ids of suspended allocations (Allocation::suspended)
  std::map<std::string, Versioned<TenantQuota>> quotas_;
  std::map<std::string, Versioned<ApiToken>> tokens_;  // by id
  std::map<std::string, Versioned<Eviction>> evictions_;  // by allocation id
  bool placement_dirty_ = true;  // the engine's mirror must be rebuilt before the next Place
  std::unordered_map<std::string, int64_t> last_heartbeat_ms_;        // by node
  // Nodes whose last registration was refused -> why (logged once: RegisterNode), at most
  // kMaxRefusedRegistrations of them.
  std::map<std::string, std::string> refused_registrations_;
  static constexpr size_t kMaxRefusedRegistrations = 1024;
  std::unordered_map<std::string, GpuSample> samples_;                // by GPU uuid
  std::unordered_map<std::string, int64_t> sampled_ms_;               // by GPU uuid
  double MaxGpuTflopsLocked() const;  // the bound of a TFLOPS request (catalog or pool)
  // Stores tier budgets a heartbeat reports that differ from the stored ones (Heartbeat).
  Status UpdateTierBudgetsLocked(const std::string& node, const std::vector<GpuSample>& samples,
                                 int64_t disk_tier_budget_mib);
  std::map<std::string, size_t> GpusPerNodeLocked() const;
  size_t AllocationsOnNodeLocked(const std::string& node) const;
  // A refusal for lack of room, with why when the request would fit the pool's VRAM expansion but
  // the nodes' tier budgets bound it below the request.
  Status WithTierBudgetHintLocked(const Status& refusal, const PlacementRequest& request) const;
  struct VgpuCounters {
    int64_t busy_ns = 0, sampled_ms = 0;
    VgpuUse use;
  };
  std::unordered_map<std::string, VgpuCounters> vgpu_use_;           // by "allocation/gpu uuid"; goes with it
  ControllerCounters counters_;
  CallStageTimes stage_times_;
  std::mt19937_64 rng_;
};

// Maps a Status to the HTTP status the API answers with.
int HttpStatusFor(const Status& s);

}  // namespace tf::controller
