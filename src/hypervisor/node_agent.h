// NodeAgent: the controller-facing half of `tfusion hypervisor`. It discovers this machine's GPUs
// (GpuSource), sizes each from the GPU catalog (FP16 TFLOPS by model name), creates each GPU's
// shared quota region (QuotaRegions), registers the node with the controller, then heartbeats with
// utilization samples and keeps the regions' vGPUs equal to the allocations the controller placed
// on this node (SyncAllocations). A machine without GPUs or driver registers with zero GPUs and
// says why.
//
// Thread safety: Start/HeartbeatOnce from one thread; MetricsText from any thread.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/gpu_catalog.h"
#include "controller/clock.h"
#include "controller/http_client.h"
#include "hypervisor/gpu_source.h"
#include "hypervisor/quota_regions.h"

namespace tf::hypervisor {

struct NodeAgentOptions {
  std::string controller_url = "http://127.0.0.1:9300";
  std::string token;
  std::string node_name;  // empty: this machine's hostname
  std::string pool;       // empty: the controller's default pool
  std::string address;    // informational, e.g. this agent's metrics address
  std::string catalog_overrides;  // GpuCatalog::LoadOverrides text
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
  Status Start();
  // Samples utilization and sends one heartbeat; re-registers when the controller no longer
  // knows this node (e.g. a new leader whose store lost it).
  Status HeartbeatOnce();
  // Reads this node's allocations from the controller and syncs the quota regions' vGPUs.
  Status SyncAllocations();

  std::vector<AgentGpu> gpus() const;
  // Why there are no GPUs ("no NVIDIA driver: ..."), empty when discovery worked.
  const std::string& discovery_message() const { return discovery_message_; }
  const std::string& node_name() const { return options_.node_name; }
  std::string MetricsText() const;

 private:
  Status Discover();
  Status Register();

  NodeAgentOptions options_;
  GpuSource* const source_;
  QuotaRegions* const regions_;
  const controller::Clock* const clock_;
  GpuCatalog catalog_;
  controller::HttpClient client_;
  bool discovered_ = false;
  std::string discovery_message_;

  mutable std::mutex mu_;  // guards gpus_ and the counters
  std::vector<AgentGpu> gpus_;
  uint64_t heartbeats_ok_ = 0;
  uint64_t heartbeats_failed_ = 0;
  size_t vgpus_ = 0;  // vGPUs in this node's regions after the last sync
  int64_t last_heartbeat_ms_ = 0;
};

}  // namespace tf::hypervisor
