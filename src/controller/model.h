// The controller's objects as stored (JSON values under the keys below) and as served by the API.
// Units: compute in FP16 dense milli-TFLOPS (int64; the API and the JSON show TFLOPS as decimal
// numbers, converted by ToMilliTflops / ToTflops), shares of a GPU in parts per million, memory in
// MiB, times in milliseconds since the epoch of the controller's Clock.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace tf::controller {

// Key layout in the Store. Names are validated (ValidateName) so they never contain '/'.
inline constexpr char kPoolPrefix[] = "/tf/pools/";
inline constexpr char kNodePrefix[] = "/tf/nodes/";
inline constexpr char kGpuPrefix[] = "/tf/gpus/";
inline constexpr char kWorkloadPrefix[] = "/tf/workloads/";
inline constexpr char kAllocationPrefix[] = "/tf/allocations/";
inline constexpr char kQuotaPrefix[] = "/tf/quotas/";
inline constexpr char kEvictionPrefix[] = "/tf/evictions/";
inline constexpr char kTokenPrefix[] = "/tf/tokens/";

// Compute inside the controller: integer milli-TFLOPS, so usage is an exact sum of allocations.
using MilliTflops = int64_t;
// TFLOPS to milli-TFLOPS, rounded to the nearest milli-TFLOPS (halves away from zero). Inputs are
// range-checked before they are stored; for safety beyond that, NaN gives 0 and values past
// +-1e15 TFLOPS saturate there.
MilliTflops ToMilliTflops(double tflops);
// Milli-TFLOPS as TFLOPS (exact for every value below 2^53).
double ToTflops(MilliTflops m);

enum class Qos { kLow, kMedium, kHigh, kCritical };
const char* QosName(Qos q);
StatusOr<Qos> ParseQos(const std::string& s);

struct Pool {
  std::string name;
  int64_t created_ms = 0;
  // How the scheduler places in this pool (docs/scheduler.md): CompactFirst, LowLoadFirst,
  // NodeCompactGPULowLoad (default), BestFit, FGD, FragAware.
  std::string placement_mode = "NodeCompactGPULowLoad";
  double tflops_oversell_ratio = 1.0;  // >= 1: vGPU TFLOPS may sum to this times the physical
  // VRAM oversubscription (TensorFusion's vramExpandToHostMem / vramExpandToHostDisk): vGPU VRAM
  // may sum to physical x (100 + host + disk) / 100 per GPU; allocations in such a pool get VRAM
  // tiering, so idle tenants give the physical VRAM back. 0..400 each.
  int vram_expand_to_host_percent = 0;
  int vram_expand_to_disk_percent = 0;
};

// Per-tenant ceilings on what its live allocations hold (requests, summed over vGPUs); 0 = no limit.
struct TenantQuota {
  std::string tenant;
  MilliTflops max_milli_tflops = 0;
  int64_t max_vram_mib = 0;
  int max_gpus = 0;  // vGPUs
  std::string max_qos;  // the highest QoS its allocations may ask for ("" = any): QoS decides who preempts whom
};

enum class NodeState { kReady, kLost };

struct Node {
  std::string name;
  std::string pool;
  std::string address;  // where the agent can be reached ("10.0.0.5:9400"), informational
  // HOST:PORT of the node's `tfusion worker` (remote vGPUs), empty when it runs none: where
  // `tfusion run --controller` on another machine runs a command placed on this node.
  std::string worker_address;
  NodeState state = NodeState::kReady;
  int64_t registered_ms = 0;
  int64_t lost_since_ms = 0;  // when it was marked lost; 0 while ready
  // SHA-256 (hex) of the credential of the agent that enrolled the node; empty: none yet. Stored,
  // never shown by the API.
  std::string credential_sha256;
  // Free space of the disk tier folder its agent was given (plus what the tier holds there), MiB,
  // shared evenly by its GPUs (DiskTierShareMib); 0: no disk tier; -1: not reported (an older
  // agent): the pool's disk expansion counts in full.
  int64_t disk_tier_budget_mib = -1;
  // Cordoned by an operator (tfusion node cordon): the node keeps its allocations and running
  // work but takes no new placements, preemption included, until uncordoned. Its agent's
  // re-registration keeps it; only uncordon (or removing the node) clears it.
  bool cordoned = false;
  int64_t cordoned_ms = 0;  // when it was cordoned; 0 while not
};

struct Gpu {
  std::string uuid;
  std::string node;
  std::string pool;
  std::string model;
  int index = 0;
  int numa_node = -1;
  MilliTflops milli_tflops = 0;       // capacity
  int64_t vram_mib = 0;               // capacity
  MilliTflops used_milli_tflops = 0;  // the exact sum over the allocations on this GPU
  int64_t used_vram_mib = 0;
  bool schedulable = true;  // false while its node is lost
  // Host memory the swapped VRAM of this GPU's tenants may hold (the node's host tier budget),
  // MiB; -1: not reported (an older agent): the pool's host expansion counts in full.
  int64_t host_tier_budget_mib = -1;
  // What vGPUs of the node that are no allocation's hold of this GPU (a local `tfusion run`
  // without --controller, a worker session without an allocation), as its node agent reports it:
  // guaranteed compute and VRAM limits. Placement counts it as used; 0 when none (or an older agent).
  MilliTflops unpooled_milli_tflops = 0;
  int64_t unpooled_vram_mib = 0;
};

// One GPU's share of its node's disk tier: the node's budget / its GPU count; -1 stays -1.
int64_t DiskTierShareMib(int64_t node_disk_tier_budget_mib, size_t node_gpus);
// A tier budget an agent reports (host_tier_budget_mib, disk_tier_budget_mib): 0 to 2^40 MiB.
Status ValidateTierBudget(const std::string& what, int64_t mib);

struct Workload {
  std::string name;
  std::string pool;
  MilliTflops milli_tflops = 0;  // per vGPU: the request (guaranteed under contention)
  int64_t vram_mib = 0;    // per vGPU
  int gpu_count = 1;
  Qos qos = Qos::kMedium;
  MilliTflops milli_tflops_limit = 0;  // per vGPU: the ceiling it may burst to; 0 = the request
  // Tier idle overrides its allocations inherit (see Allocation); unset: the QoS defaults.
  std::optional<int64_t> idle_swap_ms;
  std::optional<int64_t> idle_disk_ms;
  std::optional<int64_t> idle_zero_ms;
};

// One vGPU: a slice of one physical GPU. Compute has a request (what placement counts and what is
// guaranteed under contention) and a limit (the ceiling it may burst to when the GPU is idle).
// Records written before limits existed read back with limit = request.
struct Vgpu {
  std::string gpu_uuid;
  MilliTflops milli_tflops = 0;  // the request
  int64_t vram_mib = 0;
  int gpu_index = 0;           // the GPU's index on its node
  uint64_t share_ppm = 0;      // the request / the GPU's physical TFLOPS, in millionths
  MilliTflops milli_tflops_limit = 0;  // the limit, >= the request, <= the GPU's physical TFLOPS
  uint64_t limit_ppm = 0;      // the limit / the GPU's physical TFLOPS, in millionths
};

struct Allocation {
  std::string id;
  std::string workload;  // may be empty
  std::string pool;
  std::string node;
  Qos qos = Qos::kMedium;
  std::vector<Vgpu> vgpus;
  int64_t created_ms = 0;
  std::string tenant;  // may be empty (no quota)
  std::string request_id;  // the client's idempotency key; may be empty
  bool tiering = false;    // its pool oversubscribes VRAM: its vGPUs get VRAM tiering
  // Freeze and thaw requests made through the API (counters): the node agent passes each new one
  // to the vGPUs' processes (docs/tiering.md).
  uint32_t freeze_requests = 0;
  uint32_t thaw_requests = 0;
  // Of the freeze requests, those at level "zero" (scale to zero: after the swap-out, the node
  // agent checkpoints the processes with the driver). Counted in freeze_requests too.
  uint32_t zero_requests = 0;
  // Tier idle overrides (docs/tiering.md): how long its vGPUs stay idle before they are swapped
  // to host memory, and before swapped copies move on to the disk tier, in ms; 0 = never. Unset:
  // the QoS default. The node agent writes them into the vGPUs' regions.
  std::optional<int64_t> idle_swap_ms;
  std::optional<int64_t> idle_disk_ms;
  // Scale to zero after this long idle (the swapped processes are checkpointed by the node agent);
  // 0 or unset: never. Longer than the effective idle_swap_ms (ValidateIdleZero).
  std::optional<int64_t> idle_zero_ms;
  // A lease (tfusion run): the holder renews it every so often; once lease_expires_ms passes
  // without a renewal the controller releases the allocation. 0: no lease.
  int64_t lease_ms = 0;
  int64_t lease_expires_ms = 0;
  // Preempted by a higher QoS while its VRAM can leave the GPU (tiering): it keeps its node and
  // GPUs, its compute and VRAM stop counting on them (Gpu::used_* leave it out), the node agent
  // holds its vGPU swapped out, and the controller resumes it when its GPUs have room again.
  bool suspended = false;
  std::string suspended_by;  // the allocation that took its room
  int64_t suspended_ms = 0;
};

// An allocation the controller took back while its tenant may still be running on it: preempted
// for a higher-QoS request, or released because its node was lost. Written in the same store
// transaction that deletes the allocation; the node agent of its node stops the processes still
// using its vGPUs and reports that (state stopping -> stopped). Kept for `tfusion ps` until
// ControllerConfig::eviction_retention_ms has passed.
enum class EvictionState { kStopping, kStopped };
const char* EvictionStateName(EvictionState s);

struct Eviction {
  Allocation allocation;      // as it was when taken back
  std::string reason;         // "preempted" or "node-lost"
  std::string preempted_by;   // the allocation that took the room (reason "preempted")
  int64_t evicted_ms = 0;
  EvictionState state = EvictionState::kStopping;
  int64_t stopped_ms = 0;     // when the node agent reported its processes gone
  int processes_stopped = 0;  // tenant processes the node agent had to signal
};

// Who an API token speaks for. admin: everything. tenant: its own allocations (within its quota),
// and reads of pools, GPUs, nodes and its own evictions. node: one node's registration,
// heartbeats, allocation and eviction lists and eviction reports.
enum class Role { kAdmin, kTenant, kNode };
const char* RoleName(Role r);
StatusOr<Role> ParseRole(const std::string& s);

// An API token as stored: the secret only as its SHA-256. The token a client presents is
// "tft_<id>_<secret>"; the bootstrap token of `tfusion up` / `--token` is an admin token outside
// this table.
struct ApiToken {
  std::string id;           // 16 hex digits
  Role role = Role::kTenant;
  std::string tenant;       // role tenant: whose allocations
  std::string node;         // role node: which node
  std::string description;  // free text, at most 200 characters
  std::string secret_sha256;
  int64_t created_ms = 0;
};

// JSON (de)serialization; the same shape is stored and served.
nlohmann::json ToJson(const Pool& p);
nlohmann::json ToJson(const Node& n);
nlohmann::json ToJson(const Gpu& g);
nlohmann::json ToJson(const Workload& w);
nlohmann::json ToJson(const Allocation& a);
nlohmann::json ToJson(const TenantQuota& q);
nlohmann::json ToJson(const Eviction& e);
nlohmann::json ToJson(const ApiToken& t);  // with secret_sha256 (callers serving it drop it)
// Parse a stored value; kInternal when the store holds something unreadable.
StatusOr<Pool> PoolFromJson(const std::string& text);
StatusOr<Node> NodeFromJson(const std::string& text);
StatusOr<Gpu> GpuFromJson(const std::string& text);
StatusOr<Workload> WorkloadFromJson(const std::string& text);
StatusOr<Allocation> AllocationFromJson(const std::string& text);
StatusOr<TenantQuota> TenantQuotaFromJson(const std::string& text);
StatusOr<Eviction> EvictionFromJson(const std::string& text);
StatusOr<ApiToken> ApiTokenFromJson(const std::string& text);

// The longest tier idle override: 30 days, as `tfusion run --idle-swap` accepts.
inline constexpr int64_t kMaxTierIdleMs = 30LL * 24 * 3'600'000;
// A tier idle override `field` (idle_swap_ms or idle_disk_ms): 0 (never) to kMaxTierIdleMs.
Status ValidateTierIdle(const char* field, int64_t ms);
// An idle zero timeout `zero_ms` (0: never) against the swap timeout in effect with it
// (`swap_ms`, 0 = never): a process is checkpointed only once swapped, so it must be longer than
// a swap timeout that is not never. `zero_field` and `swap_what` name them in the message.
Status ValidateIdleZero(const std::string& zero_field, int64_t zero_ms, const std::string& swap_what, int64_t swap_ms);
// The idle timeouts an allocation's vGPUs get: its override, else its QoS default (ms, 0 = never).
int64_t EffectiveIdleSwapMs(const std::optional<int64_t>& override_ms, Qos qos);
// A tier idle timeout as `tfusion ps` and `tfusion smi -p` show it: "never" (0), "500ms", "30s",
// "10m", "2h".
std::string TierIdleText(int64_t ms);

// Names of pools, nodes, workloads and GPU UUIDs: 1-128 characters of [A-Za-z0-9._:-].
Status ValidateName(const std::string& what, const std::string& name);
// A worker address "HOST:PORT": HOST a name or IPv4 address ([A-Za-z0-9.-], 1-253 characters)
// or a bracketed IPv6 address, PORT 1-65535.
Status ValidateWorkerAddress(const std::string& address);
// Free text a node reports (its metrics address, a GPU's model name) that tables and terminals
// print: printable ASCII only (a node token could otherwise write escape sequences into an
// operator's terminal), at most `max_bytes`.
Status ValidateText(const std::string& what, const std::string& text, size_t max_bytes);

}  // namespace tf::controller
