// Fake NVML (libnvidia-ml.so.1): the devices of the fake CUDA driver as NVML sees them. Memory in
// use comes from the UsageBoard the fake CUDA side writes, so it counts every process's fake
// allocations on that device.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "fake_device_identity.h"

#pragma GCC visibility push(default)
#include "nvml_types.h"
#pragma GCC visibility pop

#define FAKENVML_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

struct NvmlState {
  std::mutex mu;
  int init_count = 0;  // nvmlInit nests; guarded by mu
  fakecuda::FakeTopology topology;
};

NvmlState& State() {
  static NvmlState* state = new NvmlState;  // leaked: no teardown order issues at exit
  return *state;
}

bool Initialized() {
  std::lock_guard<std::mutex> lock(State().mu);
  return State().init_count > 0;
}

// Device handles are 1-based indices disguised as pointers.
int IndexOf(nvmlDevice_t device) {
  auto value = reinterpret_cast<uintptr_t>(device);
  if (value == 0 || value > static_cast<uintptr_t>(State().topology.device_count)) return -1;
  return static_cast<int>(value - 1);
}

nvmlReturn_t CopyString(const std::string& text, char* out, unsigned int length) {
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (text.size() + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(out, text.c_str(), text.size() + 1);
  return NVML_SUCCESS;
}

// FAKENVML_LOST_FILE names a file of device indices (one a line) that have "fallen off the bus":
// read at every handle lookup, so a test can lose and restore a GPU under a running process.
bool IsLost(unsigned index) {
  const char* path = std::getenv("FAKENVML_LOST_FILE");
  if (path == nullptr || *path == '\0') return false;
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  bool lost = false;
  unsigned listed = 0;
  while (!lost && std::fscanf(f, "%u", &listed) == 1) lost = listed == index;
  std::fclose(f);
  return lost;
}

}  // namespace

#define FAKENVML_DEVICE(index_var, device)                     \
  if (!Initialized()) return NVML_ERROR_UNINITIALIZED;         \
  int index_var = IndexOf(device);                             \
  if (index_var < 0) return NVML_ERROR_INVALID_ARGUMENT

FAKENVML_EXPORT nvmlReturn_t nvmlInit_v2() {
  NvmlState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.init_count++ == 0) s.topology = fakecuda::ReadTopologyFromEnv();
  return NVML_SUCCESS;
}

FAKENVML_EXPORT nvmlReturn_t nvmlInit() { return nvmlInit_v2(); }

FAKENVML_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
  (void)flags;
  return nvmlInit_v2();
}

FAKENVML_EXPORT nvmlReturn_t nvmlShutdown() {
  NvmlState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.init_count == 0) return NVML_ERROR_UNINITIALIZED;
  --s.init_count;
  return NVML_SUCCESS;
}

FAKENVML_EXPORT const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
  }
}

FAKENVML_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  if (!Initialized()) return NVML_ERROR_UNINITIALIZED;
  return CopyString("580.00", version, length);
}

FAKENVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* version) {
  if (version == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *version = 13000;
  return NVML_SUCCESS;
}

FAKENVML_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  if (!Initialized()) return NVML_ERROR_UNINITIALIZED;
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *count = static_cast<unsigned>(State().topology.device_count);
  return NVML_SUCCESS;
}

FAKENVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index,
                                                           nvmlDevice_t* device) {
  if (!Initialized()) return NVML_ERROR_UNINITIALIZED;
  if (device == nullptr || index >= static_cast<unsigned>(State().topology.device_count)) {
    return NVML_ERROR_INVALID_ARGUMENT;
  }
  if (IsLost(index)) return NVML_ERROR_GPU_IS_LOST;
  *device = reinterpret_cast<nvmlDevice_t>(static_cast<uintptr_t>(index) + 1);
  return NVML_SUCCESS;
}

FAKENVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  if (!Initialized()) return NVML_ERROR_UNINITIALIZED;
  if (uuid == nullptr || device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  for (int i = 0; i < State().topology.device_count; ++i) {
    if (fakecuda::DeviceUuidString(i) == uuid) {
      *device = reinterpret_cast<nvmlDevice_t>(static_cast<uintptr_t>(i) + 1);
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}

FAKENVML_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int* index) {
  FAKENVML_DEVICE(i, device);
  if (index == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *index = static_cast<unsigned>(i);
  return NVML_SUCCESS;
}

FAKENVML_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name,
                                               unsigned int length) {
  FAKENVML_DEVICE(i, device);
  (void)i;
  return CopyString(fakecuda::kDeviceName, name, length);
}

FAKENVML_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid,
                                               unsigned int length) {
  FAKENVML_DEVICE(i, device);
  return CopyString(fakecuda::DeviceUuidString(i), uuid, length);
}

FAKENVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  FAKENVML_DEVICE(i, device);
  if (memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  uint64_t total = State().topology.total_bytes;
  uint64_t used = std::min<uint64_t>(fakecuda::UsageBoard::Used(i), total);
  memory->total = total;
  memory->used = used;
  memory->free = total - used;
  return NVML_SUCCESS;
}

FAKENVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device,
                                                        nvmlMemory_v2_t* memory) {
  FAKENVML_DEVICE(i, device);
  if (memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (memory->version != nvmlMemory_v2) return NVML_ERROR_INVALID_ARGUMENT;
  uint64_t total = State().topology.total_bytes;
  uint64_t used = std::min<uint64_t>(fakecuda::UsageBoard::Used(i), total);
  memory->total = total;
  memory->reserved = 0;
  memory->used = used;
  memory->free = total - used;
  return NVML_SUCCESS;
}

FAKENVML_EXPORT nvmlReturn_t nvmlDeviceGetMultiProcessorCount(nvmlDevice_t device,
                                                              unsigned int* count) {
  FAKENVML_DEVICE(i, device);
  (void)i;
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *count = fakecuda::kMultiprocessorCount;
  return NVML_SUCCESS;
}

// The fake has no busy time to report: utilization is always zero.
FAKENVML_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                           nvmlUtilization_t* utilization) {
  FAKENVML_DEVICE(i, device);
  (void)i;
  if (utilization == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  utilization->gpu = 0;
  utilization->memory = 0;
  return NVML_SUCCESS;
}

