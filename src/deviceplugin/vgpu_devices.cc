#include "deviceplugin/vgpu_devices.h"

#include <algorithm>
#include <charconv>
#include <optional>

namespace tf::deviceplugin {
namespace {

constexpr std::string_view kSlotSeparator = "::";

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

// An ID as it may appear in a message: bounded and printable, since it comes from the caller.
std::string Quoted(const std::string& id) {
  std::string out = "'";
  for (char c : id.substr(0, 80)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return out + (id.size() > 80 ? "...'" : "'");
}

}  // namespace

std::string DeviceId(const std::string& gpu_uuid, int slot) {
  return gpu_uuid + std::string(kSlotSeparator) + std::to_string(slot);
}

Status VgpuDeviceTable::Discovered(const std::vector<hypervisor::DiscoveredGpu>& gpus, bool* changed) {
  if (changed) *changed = false;
  for (const auto& g : gpus) {
    std::string longest = DeviceId(g.uuid, devices_per_gpu_ - 1);
    if (g.uuid.empty() || longest.size() > kMaxDeviceIdLength) {
      return InvalidArgument("GPU " + Quoted(g.uuid) + ": its device IDs (" + longest + ") would exceed the " +
                             std::to_string(kMaxDeviceIdLength) + " characters the kubelet accepts");
    }
  }
  std::set<std::string> listed;
  bool any = false;
  for (const auto& g : gpus) {
    listed.insert(g.uuid);
    auto it = by_uuid_.find(g.uuid);
    if (it == by_uuid_.end()) {
      by_uuid_[g.uuid] = gpus_.size();
      gpus_.push_back({g.uuid, g.numa_node, true});
      any = true;
      continue;
    }
    Gpu& known = gpus_[it->second];
    if (!known.healthy || known.numa_node != g.numa_node) any = true;
    known.healthy = true;
    known.numa_node = g.numa_node;
  }
  for (Gpu& known : gpus_) {
    if (listed.count(known.uuid) == 0 && known.healthy) {
      known.healthy = false;
      any = true;
    }
  }
  if (changed) *changed = any;
  return Status::Ok();
}

bool VgpuDeviceTable::Present(const std::set<std::string>& present_uuids) {
  bool any = false;
  for (Gpu& known : gpus_) {
    bool healthy = present_uuids.count(known.uuid) > 0;
    if (healthy != known.healthy) any = true;
    known.healthy = healthy;
  }
  return any;
}

std::vector<VgpuDevice> VgpuDeviceTable::Devices() const {
  std::vector<VgpuDevice> out;
  out.reserve(gpus_.size() * static_cast<size_t>(devices_per_gpu_));
  for (const Gpu& g : gpus_) {
    for (int slot = 0; slot < devices_per_gpu_; ++slot) {
      out.push_back({DeviceId(g.uuid, slot), g.uuid, slot, g.healthy, g.numa_node});
    }
  }
  return out;
}

StatusOr<std::pair<size_t, int>> VgpuDeviceTable::Lookup(const std::string& id) const {
  size_t sep = id.rfind(kSlotSeparator);
  if (sep != std::string::npos) {
    auto gpu = by_uuid_.find(id.substr(0, sep));
    const char* first = id.data() + sep + kSlotSeparator.size();
    const char* last = id.data() + id.size();
    int slot = -1;
    auto [end, ec] = std::from_chars(first, last, slot);
    if (gpu != by_uuid_.end() && ec == std::errc() && end == last && first != last && slot >= 0 &&
        slot < devices_per_gpu_ && id == DeviceId(gpu->first, slot)) {
      return std::pair<size_t, int>(gpu->second, slot);
    }
  }
  return InvalidArgument("unknown device ID " + Quoted(id) + ": this plugin's devices are <GPU UUID>::<slot>, slot 0-" +
                         std::to_string(devices_per_gpu_ - 1) + ", on the GPUs " +
                         [&] {
                           std::vector<std::string> uuids;
                           for (const Gpu& g : gpus_) uuids.push_back(g.uuid);
                           return uuids.empty() ? std::string("(none found)") : Join(uuids);
                         }());
}

StatusOr<ContainerBinding> VgpuDeviceTable::Bind(const std::vector<std::string>& ids,
                                                 const RegionMount& regions) const {
  if (ids.empty()) return InvalidArgument("a container request names no device");
  std::set<std::string> seen;
  std::vector<size_t> gpu_order;  // GPUs in the order the request first names them
  for (const std::string& id : ids) {
    auto where = Lookup(id);
    if (!where.ok()) return where.status();
    if (!seen.insert(id).second) return InvalidArgument("device ID " + Quoted(id) + " is named twice");
    const Gpu& g = gpus_[where->first];
    if (!g.healthy) {
      return FailedPrecondition("device " + Quoted(id) + " is unhealthy: GPU " + g.uuid +
                                " is not reported by the NVIDIA driver any more");
    }
    if (std::find(gpu_order.begin(), gpu_order.end(), where->first) == gpu_order.end())
      gpu_order.push_back(where->first);
  }
  std::vector<std::string> uuids;
  for (size_t i : gpu_order) uuids.push_back(gpus_[i].uuid);
  ContainerBinding b;
  // The NVIDIA container runtime makes exactly these GPUs visible; CUDA then numbers them from 0.
  b.envs["NVIDIA_VISIBLE_DEVICES"] = Join(uuids);
  b.envs["CUDA_VISIBLE_DEVICES"] = Join(uuids);
  b.envs["TFUSION_DEVICE_IDS"] = Join(ids);
  if (uuids.size() == 1) {
    // One GPU: the region the limiter attaches to (one vGPU is a slice of one GPU).
    b.envs["TFUSION_GPU_UUID"] = uuids[0];
    b.envs["TFUSION_REGION"] = regions.container_dir + "/gpu-" + uuids[0] + ".region";
  }
  // Read-write: the limiter in the container records its process and VRAM in the region.
  b.mounts.push_back({regions.container_dir, regions.host_dir, false});
  return b;
}

StatusOr<std::vector<std::string>> VgpuDeviceTable::Prefer(const std::vector<std::string>& available,
                                                           const std::vector<std::string>& must_include,
                                                           int size) const {
  // Free slots per GPU, and whether each available ID was taken.
  std::map<size_t, std::set<int>> free;
  std::set<std::string> available_set;
  for (const std::string& id : available) {
    auto where = Lookup(id);
    if (!where.ok()) return where.status();
    if (!available_set.insert(id).second) return InvalidArgument("device ID " + Quoted(id) + " is available twice");
    free[where->first].insert(where->second);
  }
  if (size < 1 || static_cast<size_t>(size) > available.size()) {
    return InvalidArgument("allocation size " + std::to_string(size) + " is not between 1 and the " +
                           std::to_string(available.size()) + " available devices");
  }
  if (must_include.size() > static_cast<size_t>(size)) {
    return InvalidArgument(std::to_string(must_include.size()) + " devices must be included in an allocation of " +
                           std::to_string(size));
  }
  std::vector<std::string> chosen;
  std::set<size_t> used_gpus;
  for (const std::string& id : must_include) {
    if (available_set.count(id) == 0) return InvalidArgument("device ID " + Quoted(id) + " must be included but is not available");
    auto where = Lookup(id);
    if (!free[where->first].erase(where->second)) return InvalidArgument("device ID " + Quoted(id) + " must be included twice");
    chosen.push_back(id);
    used_gpus.insert(where->first);
  }
  auto take = [&](size_t gpu) {
    auto& slots = free[gpu];
    while (!slots.empty() && chosen.size() < static_cast<size_t>(size)) {
      chosen.push_back(DeviceId(gpus_[gpu].uuid, *slots.begin()));
      slots.erase(slots.begin());
    }
  };
  for (size_t gpu : used_gpus) take(gpu);
  while (chosen.size() < static_cast<size_t>(size)) {
    const size_t rest = static_cast<size_t>(size) - chosen.size();
    // Tightest GPU that holds the rest whole; else the one with the most free slots. Ties: the
    // GPU discovered first.
    std::optional<size_t> best;
    for (const auto& [gpu, slots] : free) {
      if (slots.empty()) continue;
      if (!best) {
        best = gpu;
        continue;
      }
      const size_t have = slots.size(), best_have = free[*best].size();
      const bool fits = have >= rest, best_fits = best_have >= rest;
      if (fits != best_fits ? fits : fits ? have < best_have : have > best_have) best = gpu;
    }
    take(*best);  // exists: size <= available
  }
  return chosen;
}

}  // namespace tf::deviceplugin
