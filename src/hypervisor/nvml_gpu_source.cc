#include "hypervisor/nvml_gpu_source.h"

#include <dlfcn.h>

namespace tf::hypervisor {
namespace {

// NVML's C ABI, the subset used here (see NVML API reference).
using nvmlReturn_t = int;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlMemory_t {
  unsigned long long total, free, used;  // bytes
};
struct nvmlUtilization_t {
  unsigned int gpu, memory;  // percent
};
struct nvmlDeviceAttributes_t {
  unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount,
      sharedEncoderCount, sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount,
      computeInstanceSliceCount;
  unsigned long long memorySizeMB;
};
constexpr unsigned kNvmlNvlinkMaxLinks = 18;
constexpr unsigned kNvmlBufferSize = 96;

}  // namespace

struct NvmlGpuSource::Api {
  nvmlReturn_t (*Init)();
  nvmlReturn_t (*Shutdown)();
  const char* (*ErrorString)(nvmlReturn_t);
  nvmlReturn_t (*GetCount)(unsigned*);
  nvmlReturn_t (*GetHandleByIndex)(unsigned, nvmlDevice_t*);
  nvmlReturn_t (*GetName)(nvmlDevice_t, char*, unsigned);
  nvmlReturn_t (*GetUUID)(nvmlDevice_t, char*, unsigned);
  nvmlReturn_t (*GetMemoryInfo)(nvmlDevice_t, nvmlMemory_t*);
  nvmlReturn_t (*GetUtilizationRates)(nvmlDevice_t, nvmlUtilization_t*);
  // Optional: absent from older drivers.
  nvmlReturn_t (*GetAttributes)(nvmlDevice_t, nvmlDeviceAttributes_t*);
  nvmlReturn_t (*GetNumaNodeId)(nvmlDevice_t, unsigned*);
  nvmlReturn_t (*GetNvLinkState)(nvmlDevice_t, unsigned, int*);

  std::string Error(const char* what, nvmlReturn_t r) const {
    return std::string(what) + ": " + (ErrorString ? ErrorString(r) : "NVML error") + " (" +
           std::to_string(r) + ")";
  }
};

NvmlGpuSource::NvmlGpuSource(std::string library) : library_(std::move(library)) {
  load_status_ = Load();
}

NvmlGpuSource::~NvmlGpuSource() {
  if (initialized_) api_->Shutdown();
  delete api_;
  if (handle_) dlclose(handle_);
}

Status NvmlGpuSource::Load() {
  handle_ = dlopen(library_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* err = dlerror();
    return Unavailable("no NVIDIA driver: cannot load " + library_ + " (" + (err ? err : "?") +
                       "); serving zero GPUs");
  }
  api_ = new Api{};
  auto sym = [&](const char* name) { return dlsym(handle_, name); };
  auto bind = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(sym(name));
    return fn != nullptr;
  };
  bool ok = bind(api_->Init, "nvmlInit_v2") && bind(api_->Shutdown, "nvmlShutdown") &&
            bind(api_->GetCount, "nvmlDeviceGetCount_v2") &&
            bind(api_->GetHandleByIndex, "nvmlDeviceGetHandleByIndex_v2") &&
            bind(api_->GetName, "nvmlDeviceGetName") && bind(api_->GetUUID, "nvmlDeviceGetUUID") &&
            bind(api_->GetMemoryInfo, "nvmlDeviceGetMemoryInfo") &&
            bind(api_->GetUtilizationRates, "nvmlDeviceGetUtilizationRates");
  bind(api_->ErrorString, "nvmlErrorString");
  bind(api_->GetAttributes, "nvmlDeviceGetAttributes_v2");
  bind(api_->GetNumaNodeId, "nvmlDeviceGetNumaNodeId");
  bind(api_->GetNvLinkState, "nvmlDeviceGetNvLinkState");
  if (!ok) return Unavailable(library_ + " lacks a required NVML entry point; serving zero GPUs");
  nvmlReturn_t r = api_->Init();
  if (r != NVML_SUCCESS) return Unavailable(api_->Error("nvmlInit_v2", r) + "; serving zero GPUs");
  initialized_ = true;
  return Status::Ok();
}

StatusOr<std::vector<DiscoveredGpu>> NvmlGpuSource::Discover() {
  if (!load_status_.ok()) return load_status_;
  unsigned count = 0;
  nvmlReturn_t r = api_->GetCount(&count);
  if (r != NVML_SUCCESS) return Unavailable(api_->Error("nvmlDeviceGetCount_v2", r));
  std::vector<DiscoveredGpu> out;
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t dev = nullptr;
    r = api_->GetHandleByIndex(i, &dev);
    if (r != NVML_SUCCESS) return Unavailable(api_->Error("nvmlDeviceGetHandleByIndex_v2", r));
    DiscoveredGpu g;
    g.index = static_cast<int>(i);
    char buf[kNvmlBufferSize] = {};
    if ((r = api_->GetName(dev, buf, sizeof buf)) != NVML_SUCCESS)
      return Unavailable(api_->Error("nvmlDeviceGetName", r));
    g.name = buf;
    char uuid[kNvmlBufferSize] = {};
    if ((r = api_->GetUUID(dev, uuid, sizeof uuid)) != NVML_SUCCESS)
      return Unavailable(api_->Error("nvmlDeviceGetUUID", r));
    g.uuid = uuid;
    nvmlMemory_t mem{};
    if ((r = api_->GetMemoryInfo(dev, &mem)) != NVML_SUCCESS)
      return Unavailable(api_->Error("nvmlDeviceGetMemoryInfo", r));
    g.memory_total_mib = static_cast<int64_t>(mem.total >> 20);
    nvmlDeviceAttributes_t attr{};
    if (api_->GetAttributes && api_->GetAttributes(dev, &attr) == NVML_SUCCESS)
      g.multiprocessor_count = static_cast<int>(attr.multiprocessorCount);
    unsigned numa = 0;
    if (api_->GetNumaNodeId && api_->GetNumaNodeId(dev, &numa) == NVML_SUCCESS)
      g.numa_node = static_cast<int>(numa);
    if (api_->GetNvLinkState) {
      for (unsigned link = 0; link < kNvmlNvlinkMaxLinks; ++link) {
        int active = 0;
        if (api_->GetNvLinkState(dev, link, &active) != NVML_SUCCESS) break;
        if (active) ++g.nvlink_active_links;
      }
    }
    out.push_back(std::move(g));
  }
  return out;
}

StatusOr<std::vector<GpuUtilization>> NvmlGpuSource::Sample() {
  if (!load_status_.ok()) return load_status_;
  unsigned count = 0;
  nvmlReturn_t r = api_->GetCount(&count);
  if (r != NVML_SUCCESS) return Unavailable(api_->Error("nvmlDeviceGetCount_v2", r));
  std::vector<GpuUtilization> out;
  for (unsigned i = 0; i < count; ++i) {
    nvmlDevice_t dev = nullptr;
    if (api_->GetHandleByIndex(i, &dev) != NVML_SUCCESS) continue;
    char uuid[kNvmlBufferSize] = {};
    if (api_->GetUUID(dev, uuid, sizeof uuid) != NVML_SUCCESS) continue;
    GpuUtilization u{uuid, 0, 0};
    nvmlUtilization_t util{};
    if (api_->GetUtilizationRates(dev, &util) == NVML_SUCCESS) u.gpu_percent = util.gpu;
    nvmlMemory_t mem{};
    if (api_->GetMemoryInfo(dev, &mem) == NVML_SUCCESS)
      u.memory_used_mib = static_cast<int64_t>(mem.used >> 20);
    out.push_back(std::move(u));
  }
  return out;
}

}  // namespace tf::hypervisor
