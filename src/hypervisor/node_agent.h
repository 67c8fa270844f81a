// NodeAgent: the controller-facing half of `tfusion hypervisor`. It discovers this machine's GPUs
// (GpuSource), sizes each from the GPU catalog (FP16 TFLOPS by model name), creates each GPU's
// shared quota region (QuotaRegions), registers the node with the controller, then heartbeats with
// utilization samples and keeps the regions' vGPUs equal to the allocations the controller placed
// on this node (SyncAllocations). When the controller takes an allocation back (preemption,
// lost node, or a release while in use), the processes still running on its vGPU are stopped
// (VgpuStopper: SIGTERM, SIGKILL after stop_grace_ms) and, for an eviction, the controller is told
// once they are gone. A machine without GPUs or driver registers with zero GPUs and says why.
//
// Thread safety: Start/HeartbeatOnce from one thread; MetricsText from any thread.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/gpu_catalog.h"
#include "controller/clock.h"
#include "controller/http_client.h"
#include "hypervisor/gpu_source.h"
#include "hypervisor/process_checkpoint.h"
#include "hypervisor/quota_regions.h"
#include "hypervisor/tier_event_log.h"
#include "hypervisor/vgpu_stopper.h"

namespace tf::hypervisor {

struct NodeAgentOptions {
  std::string controller_url = "http://127.0.0.1:9300";  // or several replicas' URLs, comma-separated
  std::string token;
  std::string node_name;  // empty: this machine's hostname
  std::string pool;       // empty: the controller's default pool
  std::string address;    // informational, e.g. this agent's metrics address
  std::string catalog_overrides;  // GpuCatalog::LoadOverrides text
  int64_t stop_grace_ms = 10'000;  // SIGTERM -> SIGKILL for processes of a taken-back vGPU
  std::string worker_address;      // HOST:PORT of this node's `tfusion worker`, registered; may be empty
  // Where the agent keeps its node credential (made at first start, mode 0600): the controller
  // binds the node name to it at enrollment and refuses another agent claiming the name. Empty:
  // a credential for this process only (it cannot re-register after a restart).
  std::string credential_file;
  // For https:// controller URLs: the CA file the controller's certificate must chain to; empty:
  // $TFUSION_CA_FILE, else the system's trust store (controller::HttpClient).
  std::string ca_file;
  // VRAM tiering's room on this node, reported with registration and heartbeats so that a pool's
  // VRAM expansion is bounded by it (docs/tiering.md). host_tier_budget_bytes >= 0 is set as the
  // host tier budget of every GPU's region (-1: each keeps its own, by default the GPU's VRAM at
  // most half the machine's memory); disk_tier_dir is the folder of the node's disk tier (empty:
  // none, so no disk expansion here).
  int64_t host_tier_budget_bytes = -1;
  std::string disk_tier_dir;
  // The real driver, for scale to zero (the checkpoint API); empty: $TFUSION_REAL_LIBCUDA, else
  // libcuda.so.1. Loaded at the first checkpoint or restore.
  std::string libcuda_path;
};

// What the node agent reports of VRAM tiering's room: per GPU uuid its region's host tier budget,
// and the disk tier's free space plus what the tier holds there now (so that swapped copies going
// to disk do not shrink it), in MiB, rounded down to whole GiB so that the figure only moves when
// the disk really fills. 0 without a disk tier folder.
struct TierBudgetReport {
  std::map<std::string, int64_t> host_mib;
  int64_t disk_mib = 0;
};

struct AgentGpu {
  DiscoveredGpu device;
  std::string model;   // catalog name, or the driver's name when the catalog lacks it
  double tflops = 0;   // 0 when the model is unknown (the GPU then takes no compute requests)
  GpuUtilization last_sample;
};

class NodeAgent {
 public:
  // `source`, `regions` and `clock` must outlive the agent.
  NodeAgent(NodeAgentOptions options, GpuSource* source, QuotaRegions* regions,
            const controller::Clock* clock);

  // Discovers GPUs and attaches their regions (never fails for lack of GPUs), then registers.
  // Returns the registration error (the controller unreachable, a bad token); Start may be
  // called again.
  Status Start();  // counted in tf_node_registrations_total{result}, tf_node_registered
  // Samples utilization and sends one heartbeat; re-registers when the controller no longer
  // knows this node (e.g. a new leader whose store lost it).
  Status HeartbeatOnce();
  // Reads this node's allocations and evictions from the controller, syncs the quota regions'
  // vGPUs and takes one step of stopping the processes of vGPUs whose allocation was taken back.
  Status SyncAllocations();  // counted in tf_node_syncs_total{result}

  std::vector<AgentGpu> gpus() const;
  // Why there are no GPUs ("no NVIDIA driver: ..."), empty when discovery worked.
  const std::string& discovery_message() const { return discovery_message_; }
  const std::string& node_name() const { return options_.node_name; }
  std::string MetricsText() const;
  TierBudgetReport TierBudgets() const;

 private:
  Status SyncAllocationsOnce();
  Status Discover();
  Status Register();

  NodeAgentOptions options_;
  std::string credential_;  // see NodeAgentOptions::credential_file
  GpuSource* const source_;
  QuotaRegions* const regions_;
  const controller::Clock* const clock_;
  GpuCatalog catalog_;
  controller::ReplicaClient client_;
  VgpuStopper stopper_;
  // Allocation ids whose vGPU this agent has seen wanted (or is stopping): a vGPU that disappears
  // from the controller's list after being seen was taken back, and its processes are stopped.
  std::set<std::string> known_;
  // Allocations it followed that were taken back -> until when (clock ms) a worker session bound
  // to one is still stopped as released.
  std::map<std::string, int64_t> released_;
  static constexpr int64_t kRememberReleasedMs = 10 * 60 * 1000;
  // Allocations a lingering vGPU names that this agent never followed (it restarted, or they went
  // longer than kRememberReleasedMs ago): asked of the controller, and again after this long when
  // it still has them (or could not answer) -> when (clock ms).
  std::map<std::string, int64_t> ask_again_;
  static constexpr int64_t kAskAgainMs = 10 * 1000;
  bool GoneAtController(const std::string& allocation, int64_t now_ms);
  struct Stopping {
    std::string reason;      // why it is being stopped
    std::string allocation;  // whose vGPU it is (a worker session's: the allocation it is bound to)
  };
  std::map<std::string, Stopping> stop_reason_;  // by vGPU id
  bool discovered_ = false;
  std::string discovery_message_;

  // Restorer and checkpointer of the allocations' vGPUs (scale to zero), started with discovery.
  std::unique_ptr<ZeroRestorer> zero_keeper_;
  // One log line per swap-out, swap-in and move to disk of any process of the regions' vGPUs.
  std::unique_ptr<TierEventLog> tier_log_;
  mutable std::mutex mu_;  // guards gpus_ and the counters
  std::vector<AgentGpu> gpus_;
  bool registered_ = false;  // the controller accepted the last registration
  std::map<std::string, uint64_t> registrations_;  // by result: ok, refused, failed
  uint64_t heartbeats_ok_ = 0;
  uint64_t heartbeats_failed_ = 0;
  uint64_t syncs_ok_ = 0;
  uint64_t syncs_failed_ = 0;
  size_t vgpus_ = 0;  // vGPUs in this node's regions after the last sync
  size_t vgpus_stopping_ = 0;
  uint64_t sigterm_total_ = 0;
  uint64_t sigkill_total_ = 0;
  std::map<std::string, uint64_t> stopped_by_reason_;  // vGPUs whose processes were stopped
  int64_t last_heartbeat_ms_ = 0;
};

}  // namespace tf::hypervisor
