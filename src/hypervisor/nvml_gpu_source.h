// NvmlGpuSource: GPU discovery and utilization through NVML, loaded at run time with
// dlopen("libnvidia-ml.so.1") so that the agent starts (with zero GPUs) on machines without the
// NVIDIA driver. The few NVML types and entry points it uses are declared here by hand (nvml.h is
// not a build dependency); they follow NVML's stable C ABI.
#pragma once

#include "hypervisor/gpu_source.h"

namespace tf::hypervisor {

class NvmlGpuSource : public GpuSource {
 public:
  // `library` is the soname or path to load.
  explicit NvmlGpuSource(std::string library = "libnvidia-ml.so.1");
  ~NvmlGpuSource() override;

  StatusOr<std::vector<DiscoveredGpu>> Discover() override;
  StatusOr<std::vector<GpuUtilization>> Sample() override;

 private:
  Status Load();

  struct Api;
  const std::string library_;
  void* handle_ = nullptr;
  Api* api_ = nullptr;
  bool initialized_ = false;
  Status load_status_;
};

}  // namespace tf::hypervisor
