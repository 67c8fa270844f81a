// VgpuDeviceTable: the virtual devices the kubelet device plugin advertises, N per physical GPU,
// their health, and what a container that is given some of them gets.
//
// A device is one slot of one GPU, named "<GPU UUID>::<slot>" (slot 0..N-1), the form NVIDIA's
// plugin uses for shared GPUs. The kubelet counts them as an extended resource
// (tensor-fusion.ai/vgpu by default), so a node with 2 GPUs and 16 devices per GPU has 32, and a
// container asking for k of them is given k slots. The slots bind the container to their GPU(s):
// the GPU is made visible to it and the per-GPU shared quota regions are mounted into it, so the
// limiter inside it can attach to its vGPU there (docs/kubernetes.md, "Device plugin"). The
// quota itself (the vGPU's VRAM and compute) is not decided here.
//
// Thread safety: none; DevicePluginService guards its table with its own mutex.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "hypervisor/gpu_source.h"

namespace tf::deviceplugin {

inline constexpr const char* kHealthy = "Healthy";
inline constexpr const char* kUnhealthy = "Unhealthy";
// The kubelet's limit on a device ID.
inline constexpr size_t kMaxDeviceIdLength = 63;
inline constexpr int kMaxDevicesPerGpu = 1000;

struct VgpuDevice {
  std::string id;  // "<GPU UUID>::<slot>"
  std::string gpu_uuid;
  int slot = 0;
  bool healthy = true;
  int numa_node = -1;  // -1: unknown (no topology is reported)
};

// "<GPU UUID>::<slot>".
std::string DeviceId(const std::string& gpu_uuid, int slot);

// Where a container finds the quota regions: the host folder the node agent keeps them in (the
// kubelet mounts host paths) and the path they get inside the container.
struct RegionMount {
  std::string host_dir;
  std::string container_dir;
};

// What Allocate gives one container.
struct ContainerBinding {
  std::map<std::string, std::string> envs;
  struct Mount {
    std::string container_path;
    std::string host_path;
    bool read_only = false;
  };
  std::vector<Mount> mounts;
};

class VgpuDeviceTable {
 public:
  // REQUIRES: 1 <= devices_per_gpu <= kMaxDevicesPerGpu.
  explicit VgpuDeviceTable(int devices_per_gpu) : devices_per_gpu_(devices_per_gpu) {}

  // A full discovery of this machine's GPUs: GPUs seen for the first time get their slots
  // (healthy); known GPUs become healthy when listed and unhealthy when not. A GPU's slots are
  // never removed (the kubelet would lose track of containers using them), only marked.
  // kInvalidArgument (and nothing changes) when a GPU's UUID makes a device ID longer than the
  // kubelet accepts. *changed (may be null) says whether the device list changed.
  Status Discovered(const std::vector<hypervisor::DiscoveredGpu>& gpus, bool* changed = nullptr);
  // Presence only (when a full discovery fails, e.g. because one GPU is lost): known GPUs in
  // `present` are healthy, the others unhealthy. Returns whether anything changed.
  bool Present(const std::set<std::string>& present_uuids);

  std::vector<VgpuDevice> Devices() const;  // GPUs in discovery order, slots ascending
  size_t gpu_count() const { return gpus_.size(); }
  int devices_per_gpu() const { return devices_per_gpu_; }

  // The binding for a container given `ids`. kInvalidArgument naming the first offending ID for
  // an empty list, an unknown or repeated ID; kFailedPrecondition for an unhealthy one.
  StatusOr<ContainerBinding> Bind(const std::vector<std::string>& ids, const RegionMount& regions) const;

  // Which `size` of `available` to give a container that must get `must_include`: the slots of
  // as few GPUs as possible, preferring the GPU that `must_include` already uses, then the GPU
  // whose free slots fit the rest most tightly (packing keeps whole GPUs free for large
  // requests), then the GPU with the most free slots; lowest slots first.
  // kInvalidArgument for unknown or repeated IDs, must_include outside available, or a size
  // below must_include's count or above available's.
  StatusOr<std::vector<std::string>> Prefer(const std::vector<std::string>& available,
                                            const std::vector<std::string>& must_include, int size) const;

 private:
  struct Gpu {
    std::string uuid;
    int numa_node = -1;
    bool healthy = true;
  };
  // The GPU index and slot of a device ID, or kInvalidArgument.
  StatusOr<std::pair<size_t, int>> Lookup(const std::string& id) const;

  const int devices_per_gpu_;
  std::vector<Gpu> gpus_;                  // in the order first discovered
  std::map<std::string, size_t> by_uuid_;  // uuid -> index in gpus_
};

}  // namespace tf::deviceplugin
