#include "nvml_probe.h"

#include <dlfcn.h>

#include <cstdio>

namespace tf::gpu {
namespace {

// Layouts and constants from NVML's public API (nvml.h, NVML 12+).
using NvmlReturn = int;
using NvmlDevice = void*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr unsigned kUuidBuffer = 96;

struct NvmlMemoryV1 {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct NvmlMemoryV2 {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};
// NVML_STRUCT_VERSION(Memory, 2)
constexpr unsigned kNvmlMemoryV2Version = static_cast<unsigned>(sizeof(NvmlMemoryV2)) | (2u << 24);

template <typename Fn>
Fn Sym(void* lib, const char* name) {
  return reinterpret_cast<Fn>(dlsym(lib, name));
}

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", NVML's spelling of a UUID.
std::string FormatUuid(const unsigned char b[16]) {
  char text[64];
  std::snprintf(text, sizeof(text),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  return text;
}

}  // namespace

NvmlProbe::~NvmlProbe() {
  if (initialized_) {
    auto shutdown = Sym<NvmlReturn (*)()>(lib_, "nvmlShutdown");
    if (shutdown != nullptr) shutdown();
  }
  // The library stays loaded: NVML may keep threads that outlive nvmlShutdown.
}

bool NvmlProbe::Open(const unsigned char uuid[16]) {
  lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib_ == nullptr) {
    error_ = std::string("dlopen libnvidia-ml.so.1: ") + dlerror();
    return false;
  }
  auto init = Sym<NvmlReturn (*)()>(lib_, "nvmlInit_v2");
  auto count = Sym<NvmlReturn (*)(unsigned*)>(lib_, "nvmlDeviceGetCount_v2");
  auto by_index = Sym<NvmlReturn (*)(unsigned, NvmlDevice*)>(lib_, "nvmlDeviceGetHandleByIndex_v2");
  auto get_uuid = Sym<NvmlReturn (*)(NvmlDevice, char*, unsigned)>(lib_, "nvmlDeviceGetUUID");
  if (init == nullptr || count == nullptr || by_index == nullptr || get_uuid == nullptr) {
    error_ = "NVML lacks nvmlInit_v2/nvmlDeviceGetCount_v2/nvmlDeviceGetHandleByIndex_v2/nvmlDeviceGetUUID";
    return false;
  }
  if (NvmlReturn rc = init(); rc != kNvmlSuccess) {
    error_ = "nvmlInit_v2 returned " + std::to_string(rc);
    return false;
  }
  initialized_ = true;
  unsigned n = 0;
  if (count(&n) != kNvmlSuccess) {
    error_ = "nvmlDeviceGetCount_v2 failed";
    return false;
  }
  const std::string want = FormatUuid(uuid);
  for (unsigned i = 0; i < n; ++i) {
    NvmlDevice device = nullptr;
    char text[kUuidBuffer] = {};
    if (by_index(i, &device) != kNvmlSuccess || get_uuid(device, text, kUuidBuffer) != kNvmlSuccess) continue;
    if (want == text) {
      device_ = device;
      return true;
    }
  }
  error_ = "no NVML device with UUID " + want;
  return false;
}

bool NvmlProbe::MemoryV1(NvmlMemory* out) {
  auto fn = Sym<NvmlReturn (*)(NvmlDevice, NvmlMemoryV1*)>(lib_, "nvmlDeviceGetMemoryInfo");
  NvmlMemoryV1 mem{};
  if (fn == nullptr || device_ == nullptr || fn(device_, &mem) != kNvmlSuccess) return false;
  *out = NvmlMemory{mem.total, mem.free, mem.used, 0};
  return true;
}

bool NvmlProbe::MemoryV2(NvmlMemory* out) {
  auto fn = Sym<NvmlReturn (*)(NvmlDevice, NvmlMemoryV2*)>(lib_, "nvmlDeviceGetMemoryInfo_v2");
  NvmlMemoryV2 mem{};
  mem.version = kNvmlMemoryV2Version;
  if (fn == nullptr || device_ == nullptr || fn(device_, &mem) != kNvmlSuccess) return false;
  *out = NvmlMemory{mem.total, mem.free, mem.used, mem.reserved};
  return true;
}

std::string NvmlProbe::MemoryInfoLibrary() const {
  void* fn = lib_ != nullptr ? dlsym(lib_, "nvmlDeviceGetMemoryInfo") : nullptr;
  Dl_info info{};
  if (fn == nullptr || dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  return info.dli_fname;
}

}  // namespace tf::gpu
