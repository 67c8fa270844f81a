// VgpuQuotaRegionSeam: where the node agent will own the per-GPU shared quota regions that the
// limiter (src/limiter/core, another branch) accounts VRAM and compute in. The agent calls
// AttachGpu for each discovered GPU at start and DetachAll at shutdown. Until the region code
// lands, UnattachedQuotaRegions records the calls and creates nothing.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "hypervisor/gpu_source.h"

namespace tf::hypervisor {

class VgpuQuotaRegionSeam {
 public:
  virtual ~VgpuQuotaRegionSeam() = default;
  // Creates (or reopens, after an agent restart) the quota region of one physical GPU.
  virtual Status AttachGpu(const DiscoveredGpu& gpu) = 0;
  virtual void DetachAll() = 0;
};

class UnattachedQuotaRegions : public VgpuQuotaRegionSeam {
 public:
  Status AttachGpu(const DiscoveredGpu& gpu) override {
    attached_.push_back(gpu.uuid);
    return Status::Ok();
  }
  void DetachAll() override { attached_.clear(); }
  const std::vector<std::string>& attached() const { return attached_; }

 private:
  std::vector<std::string> attached_;
};

}  // namespace tf::hypervisor
