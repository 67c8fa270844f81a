// Controller: the control plane's state machine over pools, nodes, GPUs, workloads and
// allocations. Durable state lives in a Store; this class holds an in-memory copy (with each
// object's store revision) that it rebuilds from the store when it becomes leader (Rebuild).
//
// Allocation: the PlacementEngine picks GPUs from the in-memory view; the decision is committed in
// one store transaction that compares every chosen GPU's revision (and the leader fence) and
// writes the GPUs' new usage together with the allocation. Only after the commit succeeds is the
// allocation acknowledged, so an acknowledged allocation survives a crash, and two replicas can
// never both take the same capacity: the second commit fails its compare.
//
// Node liveness: heartbeat times are kept in memory only. A node silent for heartbeat_timeout_ms
// is marked lost (persisted; its GPUs stop taking new allocations); lost for lost_grace_ms more,
// its allocations are released. A replica that takes over gives every node a fresh timeout.
//
// Thread safety: every public method may be called concurrently; one mutex serializes them.
#pragma once

#include <map>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "controller/clock.h"
#include "controller/model.h"
#include "controller/placement.h"
#include "controller/store.h"

namespace tf::controller {

struct ControllerConfig {
  int64_t heartbeat_timeout_ms = 15'000;
  int64_t lost_grace_ms = 60'000;
  std::string default_pool = "default";  // created by Rebuild when missing
};

struct GpuReport {  // what a node agent reports for one GPU at registration
  std::string uuid;
  std::string model;
  int index = 0;
  int numa_node = -1;
  double tflops = 0;
  int64_t vram_mib = 0;
};

struct NodeRegistration {
  std::string name;
  std::string pool;
  std::string address;
  std::vector<GpuReport> gpus;
};

struct GpuSample {  // one heartbeat sample for one GPU
  std::string uuid;
  double utilization_percent = 0;
  int64_t memory_used_mib = 0;
};

struct AllocationRequest {
  std::string workload;  // optional; when set, unset fields come from the workload
  std::string pool;
  double tflops = 0;
  int64_t vram_mib = 0;
  int gpu_count = 0;
  std::string qos;
  std::string gpu_model;
};

struct GpuStatus {  // a GPU with its latest heartbeat sample
  Gpu gpu;
  double utilization_percent = 0;
  int64_t memory_used_mib = 0;
  int64_t sampled_ms = 0;
};

struct NodeStatus {
  Node node;
  int64_t last_heartbeat_ms = 0;
};

// Counters exported at /metrics.
struct ControllerCounters {
  uint64_t allocations_granted = 0;
  uint64_t allocations_refused = 0;  // no capacity
  uint64_t allocations_released = 0;
  uint64_t allocations_released_lost_node = 0;
  uint64_t commit_conflicts = 0;  // CAS failures (another writer, or lost leadership)
  uint64_t nodes_marked_lost = 0;
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
  std::vector<Pool> ListPools() const;
  StatusOr<Pool> GetPool(const std::string& name) const;
  Status DeletePool(const std::string& name);  // kFailedPrecondition while nodes use it

  StatusOr<Node> RegisterNode(const NodeRegistration& reg);
  Status Heartbeat(const std::string& node, const std::vector<GpuSample>& samples);
  std::vector<NodeStatus> ListNodes() const;
  StatusOr<NodeStatus> GetNode(const std::string& name) const;
  std::vector<GpuStatus> ListGpus(const std::string& pool_filter) const;

  StatusOr<Workload> CreateWorkload(const Workload& w);
  std::vector<Workload> ListWorkloads() const;
  StatusOr<Workload> GetWorkload(const std::string& name) const;
  Status DeleteWorkload(const std::string& name);

  // kInvalidArgument (bad request), kNotFound (pool or workload), kOutOfMemory (no capacity),
  // kAborted (conflicting writers, retry), kUnavailable (not the leader, or the store is down).
  StatusOr<Allocation> Allocate(const AllocationRequest& req);
  Status Release(const std::string& allocation_id);
  std::vector<Allocation> ListAllocations() const;
  StatusOr<Allocation> GetAllocation(const std::string& id) const;

  // Marks silent nodes lost and releases allocations of nodes lost past the grace period.
  // Called periodically by the server (and directly by tests with a FakeClock).
  void Tick();

  ControllerCounters counters() const;
  // Prometheus text exposition of the state and counters.
  std::string MetricsText() const;

 private:
  template <typename T>
  struct Versioned {
    T value;
    int64_t revision = 0;
  };

  Status CheckServingLocked() const;
  StatusOr<int64_t> CommitLocked(std::vector<Compare> compares, const std::vector<Write>& writes);
  Status ReleaseLocked(const std::string& id, bool lost_node);
  Status ReloadGpusLocked(const std::vector<std::string>& uuids);
  Status EnsurePoolLocked(const std::string& name);
  void IndexPoolLocked(const std::string& pool);
  std::string NewAllocationIdLocked();

  Store* const store_;
  const Clock* const clock_;
  std::unique_ptr<PlacementEngine> placement_;
  LeaderElection* const election_;
  const ControllerConfig config_;

  mutable std::mutex mu_;
  bool serving_ = false;
  std::map<std::string, Versioned<Pool>> pools_;
  std::map<std::string, Versioned<Node>> nodes_;
  std::map<std::string, Versioned<Gpu>> gpus_;
  std::map<std::string, Versioned<Workload>> workloads_;
  std::map<std::string, Versioned<Allocation>> allocations_;
  std::unordered_map<std::string, int64_t> last_heartbeat_ms_;        // by node
  std::unordered_map<std::string, GpuSample> samples_;                // by GPU uuid
  std::unordered_map<std::string, int64_t> sampled_ms_;               // by GPU uuid
  std::unordered_map<std::string, std::vector<const Gpu*>> pool_gpus_;  // by pool, node-grouped
  ControllerCounters counters_;
  std::mt19937_64 rng_;
};

// Maps a Status to the HTTP status the API answers with.
int HttpStatusFor(const Status& s);

}  // namespace tf::controller
