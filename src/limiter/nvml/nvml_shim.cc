// libtfusion-nvml.so (SONAME libnvidia-ml.so.1): NVML as a vGPU tenant should see it.
//
// Every NVML entry point is a trampoline into the real libnvidia-ml.so.1 (nvml_trampolines.cc,
// generated from api/nvml-exports.txt), except the memory queries below, which report the vGPU's
// slice exactly as the limiter's cuMemGetInfo does: total = limit, free = min(limit - used, real
// free), used = total - free. The two agree to the byte, so nvidia-smi-style tools, PyTorch and
// vLLM see one set of numbers through NVML and CUDA.
//
// Guest rules (docs/nvml-shim.md): nothing here exits, throws, blocks or fails a call on its own
// account; the configuration (environment) is read once, in the load-time constructor, which
// only loads the real library and attaches the region (it calls no NVML function).
#include <dlfcn.h>
#include <strings.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "driver/guest_log.h"
#include "limiter/core/gpu_region.h"
#include "limiter/nvml/nvml_table.h"

#define TF_NVML_EXPORT extern "C" __attribute__((visibility("default")))

#ifndef TF_NVML_SHIM_VERSION
#define TF_NVML_SHIM_VERSION "0"
#endif

namespace tf::nvml {
namespace {

using limiter::GpuRegion;
using limiter::RegionError;
using limiter::RegionErrorDetail;

// One line, one write(2), prefixed "tfusion-nvml: ". Only from the constructor (once per cause).
void ShimLog(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void ShimLog(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tf::driver::GuestLogV("tfusion-nvml", fmt, ap);
  va_end(ap);
}

// Where the real NVML lives, tried in order when TFUSION_REAL_LIBNVML is not set.
const char* const kNvmlCandidates[] = {
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
    "/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "/usr/lib64/libnvidia-ml.so.1",
    "/usr/lib/wsl/lib/libnvidia-ml.so.1",
    "/usr/lib/libnvidia-ml.so.1",
    "/lib/libnvidia-ml.so.1",
};

// A library is this shim (another copy, or a symlink to us) if it exports the marker.
bool IsShim(void* handle) { return dlsym(handle, "tfusion_nvml_shim_version") != nullptr; }

void* OpenRealNvml() {
  const char* env = getenv("TFUSION_REAL_LIBNVML");
  if (env != nullptr && *env != '\0') {
    void* h = dlopen(env, RTLD_LAZY | RTLD_LOCAL);
    if (h != nullptr && !IsShim(h)) return h;
    ShimLog("cannot load the NVML library named by TFUSION_REAL_LIBNVML=%s: %s", env,
            h != nullptr ? "it is the TensorFusion NVML shim itself" : dlerror());
    if (h != nullptr) dlclose(h);
    return nullptr;
  }
  for (const char* path : kNvmlCandidates) {
    if (access(path, R_OK) != 0) continue;
    void* h = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
    if (h == nullptr) continue;
    if (!IsShim(h)) return h;
    dlclose(h);
  }
  ShimLog("no NVIDIA NVML library found (set TFUSION_REAL_LIBNVML to the real "
          "libnvidia-ml.so.1); NVML calls fail");
  return nullptr;
}

// The vGPU this process is bound to. Written only by the constructor; read-only afterwards.
struct Binding {
  GpuRegion* region = nullptr;  // never destroyed: NVML may be called from atexit handlers
  uint32_t vgpu = 0;
};
Binding g_binding;
alignas(GpuRegion) unsigned char g_region_storage[sizeof(GpuRegion)];

void Bind() {
  const char* region_path = getenv("TFUSION_REGION");
  const char* vgpu_id = getenv("TFUSION_VGPU");
  bool has_region = region_path != nullptr && *region_path != '\0';
  bool has_vgpu = vgpu_id != nullptr && *vgpu_id != '\0';
  if (!has_region && !has_vgpu) return;  // not a vGPU tenant: pass everything through
  if (!has_region || !has_vgpu) {
    ShimLog("TFUSION_REGION and TFUSION_VGPU must be set together; NVML reports the whole GPU");
    return;
  }
  auto* region = new (g_region_storage) GpuRegion();
  RegionErrorDetail why;
  RegionError e = GpuRegion::Attach(region_path, region, &why);
  uint32_t index = 0;
  if (e == RegionError::kOk) e = region->FindVgpu(vgpu_id, &index);
  if (e != RegionError::kOk) {
    ShimLog("cannot attach vGPU '%s' in %s: %s %s; NVML reports the whole GPU", vgpu_id,
            region_path, limiter::RegionErrorName(e), why.message);
    region->Detach();
    return;
  }
  g_binding.vgpu = index;
  g_binding.region = region;
}

// Slot answers after loading (arguments, if any, are ignored).
nvmlReturn_t FunctionNotFound() { return kErrorFunctionNotFound; }
nvmlReturn_t LibraryNotFound() { return kErrorLibraryNotFound; }

// Load time: find the real NVML, fill every slot, attach the vGPU. Calls no NVML function.
__attribute__((constructor)) void LoadTimeSetup() {
  void* real = OpenRealNvml();
  if (real == nullptr) {
    // Initialisation fails with "library not found"; everything else stays "uninitialized"
    // and nvmlErrorString answers from our own table.
    tf_nvml_slots[kSlot_nvmlInit] = reinterpret_cast<void*>(&LibraryNotFound);
    tf_nvml_slots[kSlot_nvmlInit_v2] = reinterpret_cast<void*>(&LibraryNotFound);
    tf_nvml_slots[kSlot_nvmlInitWithFlags] = reinterpret_cast<void*>(&LibraryNotFound);
  } else {
    for (unsigned i = 0; i < kSlotCount; ++i) {
      void* fn = dlsym(real, tf_nvml_names[i]);
      if (fn != nullptr) {
        tf_nvml_slots[i] = fn;
      } else if (i != kSlot_nvmlErrorString) {
        // Exported by a newer (or older) NVML than the one installed: answer as NVML does for
        // an entry point the driver lacks.
        tf_nvml_slots[i] = reinterpret_cast<void*>(&FunctionNotFound);
      }
    }
  }
  Bind();
}

bool SameUuid(const char* a, const char* b) {
  return a[0] != '\0' && strncasecmp(a, b, limiter::kGpuUuidBytes) == 0;
}

// The vGPU's slice of `device`, or false when the process is not bound, the device is another
// GPU (or a MIG instance), or its UUID cannot be read.
bool SliceOf(nvmlDevice_t device, uint64_t* limit, uint64_t* used) {
  GpuRegion* region = g_binding.region;
  if (region == nullptr) return false;
  using GetUuidFn = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned int);
  auto get_uuid = reinterpret_cast<GetUuidFn>(tf_nvml_slots[kSlot_nvmlDeviceGetUUID]);
  char uuid[kUuidBufferSize] = {};
  if (get_uuid(device, uuid, sizeof(uuid)) != kSuccess) return false;
  uuid[sizeof(uuid) - 1] = '\0';
  if (!SameUuid(uuid, region->gpu_uuid())) return false;
  *limit = region->Limit(g_binding.vgpu);
  *used = region->Used(g_binding.vgpu);
  return *limit != 0;  // 0: the vGPU slot was removed under us; report the GPU
}

// total = limit, free = min(limit - used, real free), used = total - free: the same numbers as
// the limiter's cuMemGetInfo_v2, so NVML and CUDA agree.
void Clamp(uint64_t limit, uint64_t used, unsigned long long* total, unsigned long long* avail,
           unsigned long long* in_use) {
  uint64_t slice_free = used >= limit ? 0 : limit - used;
  if (slice_free > *avail) slice_free = *avail;
  *total = limit;
  *avail = slice_free;
  *in_use = limit - slice_free;
}

}  // namespace
}  // namespace tf::nvml

using namespace tf::nvml;

extern "C" nvmlReturn_t tf_nvml_uninitialized() { return kErrorUninitialized; }

extern "C" const char* tf_nvml_error_string_fallback(nvmlReturn_t result) {
  switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 9: return "Driver Not Loaded";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    default: return "Unknown Error";
  }
}

// The marker by which a shim recognises itself (never load ourselves as "the real NVML").
TF_NVML_EXPORT const char* tfusion_nvml_shim_version() { return "tfusion-nvml " TF_NVML_SHIM_VERSION; }

TF_NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  using Fn = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);
  nvmlReturn_t r = reinterpret_cast<Fn>(tf_nvml_slots[kSlot_nvmlDeviceGetMemoryInfo])(device, memory);
  uint64_t limit = 0, used = 0;
  if (r == kSuccess && memory != nullptr && SliceOf(device, &limit, &used)) {
    Clamp(limit, used, &memory->total, &memory->free, &memory->used);
  }
  return r;
}

TF_NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory) {
  using Fn = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_v2_t*);
  nvmlReturn_t r = reinterpret_cast<Fn>(tf_nvml_slots[kSlot_nvmlDeviceGetMemoryInfo_v2])(device, memory);
  uint64_t limit = 0, used = 0;
  if (r == kSuccess && memory != nullptr && SliceOf(device, &limit, &used)) {
    Clamp(limit, used, &memory->total, &memory->free, &memory->used);
    memory->reserved = 0;
  }
  return r;
}
