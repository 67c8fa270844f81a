// GpuSource: where the node agent learns about this machine's GPUs. Production reads NVML
// (NvmlGpuSource, nvml_gpu_source.h); tests use FakeGpuSource.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tf::hypervisor {

struct DiscoveredGpu {
  int index = 0;
  std::string uuid;            // "GPU-xxxxxxxx-..."
  std::string name;            // as the driver reports it: "NVIDIA H100 80GB HBM3"
  int64_t memory_total_mib = 0;
  int multiprocessor_count = 0;  // 0 when the driver does not say (then the catalog's)
  int numa_node = -1;            // -1 when unknown
  int nvlink_active_links = 0;
};

struct GpuUtilization {
  std::string uuid;
  double gpu_percent = 0;       // share of time a kernel ran, over the driver's sample period
  int64_t memory_used_mib = 0;
};

class GpuSource {
 public:
  virtual ~GpuSource() = default;
  // The GPUs of this machine. kUnavailable (with the reason) when there is no driver or no GPU.
  virtual StatusOr<std::vector<DiscoveredGpu>> Discover() = 0;
  // One utilization sample per GPU.
  virtual StatusOr<std::vector<GpuUtilization>> Sample() = 0;
};

class FakeGpuSource : public GpuSource {
 public:
  explicit FakeGpuSource(std::vector<DiscoveredGpu> gpus) : gpus_(std::move(gpus)) {}
  StatusOr<std::vector<DiscoveredGpu>> Discover() override { return gpus_; }
  StatusOr<std::vector<GpuUtilization>> Sample() override {
    std::vector<GpuUtilization> out;
    for (const DiscoveredGpu& g : gpus_) out.push_back({g.uuid, utilization_percent, 0});
    return out;
  }
  double utilization_percent = 0;

 private:
  std::vector<DiscoveredGpu> gpus_;
};

}  // namespace tf::hypervisor
