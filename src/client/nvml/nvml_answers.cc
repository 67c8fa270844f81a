// The NVML of the remote vGPU client: the read-only device queries that PyTorch, pynvml and
// nvidia-smi-style tools make, answered from the remote session of the client stub in the same
// process (client/nvml_bridge.h). Every other NVML export answers NVML_ERROR_NOT_SUPPORTED (the
// generated weak defaults). Runs inside the tenant's process: never exits, never throws, never
// waits longer than the stub's own connect. See docs/remote.md ("NVML in the client").
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "client/nvml_bridge.h"

#define TF_EXPORT extern "C" __attribute__((visibility("default")))

// NVML's ABI, declared here (nvml.h is not a build dependency). Values and layouts match NVIDIA's
// nvml.h.
extern "C" {
typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {  // nvmlPciInfo_t (v2 and v3)
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
} nvmlPciInfo_t;
typedef struct {  // the nvmlPciInfo_t of nvmlDeviceGetPciInfo (v1)
  char busId[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  unsigned int reserved0, reserved1, reserved2, reserved3;
} nvmlPciInfoV1_t;
typedef struct {  // nvmlDeviceGetComputeRunningProcesses (v1)
  unsigned int pid;
  unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;
typedef struct {  // _v2 and _v3
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;
}

namespace {

constexpr nvmlReturn_t kSuccess = 0;
constexpr nvmlReturn_t kUninitialized = 1;
constexpr nvmlReturn_t kInvalidArgument = 2;
constexpr nvmlReturn_t kNotSupported = 3;
constexpr nvmlReturn_t kNotFound = 6;
constexpr nvmlReturn_t kInsufficientSize = 7;
constexpr nvmlReturn_t kDriverNotLoaded = 9;
constexpr nvmlReturn_t kLibraryNotFound = 12;
constexpr nvmlReturn_t kGpuIsLost = 15;
constexpr nvmlReturn_t kArgumentVersionMismatch = 25;
constexpr nvmlReturn_t kUnknown = 999;

constexpr unsigned kMemoryV2 = sizeof(nvmlMemory_v2_t) | (2u << 24);  // nvmlMemory_v2
constexpr unsigned kValueNotAvailable = 0xFFFFFFFFu;                 // NVML_VALUE_NOT_AVAILABLE
constexpr int kMaxDevices = 64;
constexpr int kCudaLaunchFailed = 719;  // the stub's answer once the worker is gone

void Log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void Log(const char* fmt, ...) {
  char line[512];
  int n = snprintf(line, sizeof(line), "tfusion-client-nvml: ");
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof(line) - static_cast<size_t>(n) - 1, fmt, ap);
  va_end(ap);
  size_t len = static_cast<size_t>(n) + (m < 0 ? 0 : static_cast<size_t>(m));
  if (len > sizeof(line) - 2) len = sizeof(line) - 2;
  line[len++] = '\n';
  ssize_t w = write(2, line, len);
  (void)w;
}

// The device handles NVML hands out are addresses of these; a handle is valid when it points at
// one of the first g_count entries.
struct Device {
  tfusion_client_device info;
};

struct State {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  int init_count = 0;
  bool loaded = false;  // the snapshot below was taken
  tfusion_client_mem_info_fn mem_info = nullptr;
  int driver_version = 0;
  int count = 0;
  Device devices[kMaxDevices];
};
State g;
std::atomic<bool> g_logged_not_stub{false};
std::atomic<bool> g_logged_no_session{false};

// Finds the stub among the loaded libraries (or loads libcuda.so.1 from the library path).
nvmlReturn_t LoadLocked() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    if (!g_logged_not_stub.exchange(true)) {
      Log("no libcuda.so.1 on the library path: this NVML answers only for the TensorFusion remote "
          "client (run the program with `tfusion run --remote`)");
    }
    return kLibraryNotFound;
  }
  auto devices = reinterpret_cast<tfusion_client_devices_fn>(dlsym(h, "tfusion_client_devices"));
  auto mem = reinterpret_cast<tfusion_client_mem_info_fn>(dlsym(h, "tfusion_client_mem_info"));
  if (devices == nullptr || mem == nullptr) {
    if (!g_logged_not_stub.exchange(true)) {
      Log("the libcuda.so.1 in this process is not the TensorFusion remote client stub: this NVML "
          "has no devices to report (run the program with `tfusion run --remote`)");
    }
    return kDriverNotLoaded;
  }
  tfusion_client_device snap[kMaxDevices];
  int version = 0, count = 0;
  int r = devices(TFUSION_CLIENT_NVML_ABI, &version, snap, kMaxDevices, &count);
  if (r != 0) {
    if (!g_logged_no_session.exchange(true)) {
      Log("the remote vGPU session is not available (CUDA error %d; the tfusion-client line above "
          "says why): NVML is not initialised",
          r);
    }
    return kDriverNotLoaded;
  }
  if (count < 0) count = 0;
  if (count > kMaxDevices) count = kMaxDevices;
  for (int i = 0; i < count; ++i) {
    g.devices[i].info = snap[i];
    g.devices[i].info.name[sizeof(snap[i].name) - 1] = '\0';
  }
  g.count = count;
  g.driver_version = version;
  g.mem_info = mem;
  g.loaded = true;
  return kSuccess;
}

nvmlReturn_t Init() {
  pthread_mutex_lock(&g.mu);
  nvmlReturn_t r = g.loaded ? kSuccess : LoadLocked();
  if (r == kSuccess) ++g.init_count;
  pthread_mutex_unlock(&g.mu);
  return r;
}

bool Initialised() {
  pthread_mutex_lock(&g.mu);
  bool on = g.init_count > 0;
  pthread_mutex_unlock(&g.mu);
  return on;
}

// The device behind a handle, or null (with *r the error) when NVML is not initialised or the
// handle is not one this library gave out.
const tfusion_client_device* Dev(nvmlDevice_t h, nvmlReturn_t* r) {
  if (!Initialised()) {
    *r = kUninitialized;
    return nullptr;
  }
  auto p = reinterpret_cast<uintptr_t>(h);
  auto first = reinterpret_cast<uintptr_t>(&g.devices[0]);
  if (h == nullptr || p < first || (p - first) % sizeof(Device) != 0 ||
      (p - first) / sizeof(Device) >= static_cast<uintptr_t>(g.count)) {
    *r = kInvalidArgument;
    return nullptr;
  }
  *r = kSuccess;
  return &reinterpret_cast<Device*>(h)->info;
}

int IndexOf(const tfusion_client_device* d) {
  return static_cast<int>(reinterpret_cast<const Device*>(d) - &g.devices[0]);
}

nvmlDevice_t Handle(int i) { return reinterpret_cast<nvmlDevice_t>(&g.devices[i]); }

// Copies s into buf of length len: NVML_ERROR_INSUFFICIENT_SIZE when it does not fit with its NUL.
nvmlReturn_t CopyString(const char* s, char* buf, unsigned len) {
  if (buf == nullptr) return kInvalidArgument;
  size_t n = strlen(s);
  if (len < n + 1) return kInsufficientSize;
  memcpy(buf, s, n + 1);
  return kSuccess;
}

void FormatUuid(const uint8_t* u, char* out /* 41+ */) {
  snprintf(out, 48,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
           u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

struct Memory {
  uint64_t total = 0, free = 0, used = 0, process = 0;
  bool has_context = false;
};

nvmlReturn_t ReadMemory(const tfusion_client_device* d, Memory* m) {
  uint64_t f = 0, t = 0, mine = 0;
  int ctx = 0;
  int r = g.mem_info(TFUSION_CLIENT_NVML_ABI, IndexOf(d), &f, &t, &mine, &ctx);
  if (r == kCudaLaunchFailed) return kGpuIsLost;
  if (r != 0) return kUnknown;
  m->total = t;
  m->free = f <= t ? f : t;
  m->used = t - m->free;
  m->process = mine;
  m->has_context = ctx != 0;
  return kSuccess;
}

// "[domain:]bus:device[.function]" in hex, as NVML accepts it.
bool ParseBusId(const char* s, unsigned* domain, unsigned* bus, unsigned* device) {
  unsigned a = 0, b = 0, c = 0, f = 0;
  char tail = 0;
  if (sscanf(s, "%x:%x:%x.%x%c", &a, &b, &c, &f, &tail) == 4 ||
      sscanf(s, "%x:%x:%x%c", &a, &b, &c, &tail) == 3) {
    *domain = a;
    *bus = b;
    *device = c;
    return true;
  }
  if (sscanf(s, "%x:%x.%x%c", &b, &c, &f, &tail) == 3 || sscanf(s, "%x:%x%c", &b, &c, &tail) == 2) {
    *domain = 0;
    *bus = b;
    *device = c;
    return true;
  }
  return false;
}

template <typename Info>
nvmlReturn_t RunningProcesses(nvmlDevice_t h, unsigned* count, Info* infos, bool compute) {
  nvmlReturn_t r;
  const tfusion_client_device* d = Dev(h, &r);
  if (d == nullptr) return r;
  if (count == nullptr) return kInvalidArgument;
  unsigned n = 0;
  Memory m;
  if (compute) {
    r = ReadMemory(d, &m);
    if (r != kSuccess) return r;
    n = m.has_context ? 1 : 0;  // this process, when it has a context there
  }
  unsigned room = *count;
  *count = n;
  if (n == 0) return kSuccess;
  if (room < n || infos == nullptr) return kInsufficientSize;
  memset(&infos[0], 0, sizeof(Info));
  infos[0].pid = static_cast<unsigned>(getpid());
  infos[0].usedGpuMemory = m.process;
  if constexpr (sizeof(Info) == sizeof(nvmlProcessInfo_v2_t)) {
    infos[0].gpuInstanceId = kValueNotAvailable;
    infos[0].computeInstanceId = kValueNotAvailable;
  }
  return kSuccess;
}

template <typename Pci>
nvmlReturn_t PciInfo(nvmlDevice_t h, Pci* pci) {
  nvmlReturn_t r;
  const tfusion_client_device* d = Dev(h, &r);
  if (d == nullptr) return r;
  if (pci == nullptr) return kInvalidArgument;
  memset(pci, 0, sizeof(*pci));
  pci->domain = static_cast<unsigned>(d->pci_domain);
  pci->bus = static_cast<unsigned>(d->pci_bus);
  pci->device = static_cast<unsigned>(d->pci_device);
  if constexpr (sizeof(Pci) == sizeof(nvmlPciInfo_t)) {
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.0", pci->domain & 0xffff,
             pci->bus & 0xff, pci->device & 0xff);
    snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.0", pci->domain, pci->bus & 0xff,
             pci->device & 0xff);
  } else {
    snprintf(pci->busId, sizeof(pci->busId), "%04X:%02X:%02X.0", pci->domain & 0xffff,
             pci->bus & 0xff, pci->device & 0xff);
  }
  return kSuccess;
}

nvmlReturn_t HandleByPciBusId(const char* bus_id, nvmlDevice_t* device) {
  if (!Initialised()) return kUninitialized;
  if (bus_id == nullptr || device == nullptr) return kInvalidArgument;
  unsigned domain = 0, bus = 0, dev = 0;
  if (!ParseBusId(bus_id, &domain, &bus, &dev)) return kInvalidArgument;
  for (int i = 0; i < g.count; ++i) {
    const tfusion_client_device& d = g.devices[i].info;
    if (static_cast<unsigned>(d.pci_domain) == domain && static_cast<unsigned>(d.pci_bus) == bus &&
        static_cast<unsigned>(d.pci_device) == dev) {
      *device = Handle(i);
      return kSuccess;
    }
  }
  return kNotFound;
}

nvmlReturn_t DeviceCount(unsigned* count) {
  if (!Initialised()) return kUninitialized;
  if (count == nullptr) return kInvalidArgument;
  *count = static_cast<unsigned>(g.count);
  return kSuccess;
}

nvmlReturn_t HandleByIndex(unsigned index, nvmlDevice_t* device) {
  if (!Initialised()) return kUninitialized;
  if (device == nullptr || index >= static_cast<unsigned>(g.count)) return kInvalidArgument;
  *device = Handle(static_cast<int>(index));
  return kSuccess;
}

nvmlReturn_t CudaDriverVersion(int* version) {
  if (version == nullptr) return kInvalidArgument;
  if (!Initialised()) return kUninitialized;
  *version = g.driver_version;
  return kSuccess;
}

}  // namespace

// Lets tests and tools tell this library from NVIDIA's.
TF_EXPORT const char* tfusion_client_nvml_version() { return "tensorfusion-client-nvml " TF_CLIENT_NVML_VERSION; }

TF_EXPORT nvmlReturn_t nvmlInit_v2() { return Init(); }
TF_EXPORT nvmlReturn_t nvmlInit() { return Init(); }
TF_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
  (void)flags;  // NO_GPUS and NO_ATTACH change nothing here: there is nothing to attach
  return Init();
}

TF_EXPORT nvmlReturn_t nvmlShutdown() {
  pthread_mutex_lock(&g.mu);
  nvmlReturn_t r = kUninitialized;
  if (g.init_count > 0) {
    --g.init_count;
    r = kSuccess;
  }
  pthread_mutex_unlock(&g.mu);
  return r;
}

TF_EXPORT const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt Request Issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request";
    case 18: return "RM has detected an NVML/RM version mismatch";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 22: return "The requested vgpu operation is not available on target device";
    case 23: return "Insufficient Resources";
    case 24: return "Frequency not supported";
    case 25: return "Argument version mismatch";
    case 26: return "Deprecated";
    case 27: return "Not Ready";
    case 28: return "GPU not found";
    case 29: return "Invalid state";
    default: return "Unknown Error";
  }
}

TF_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  if (!Initialised()) return kUninitialized;
  // The worker's CUDA driver API version ("13.0"): the NVIDIA driver's own version string is not
  // part of the session.
  char v[32];
  snprintf(v, sizeof(v), "%d.%d", g.driver_version / 1000, (g.driver_version % 1000) / 10);
  return CopyString(v, version, length);
}

TF_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char* version, unsigned int length) {
  char v[32];
  snprintf(v, sizeof(v), "%d.%d", g.driver_version / 1000, (g.driver_version % 1000) / 10);
  if (!Initialised()) return kUninitialized;
  return CopyString(v, version, length);
}

TF_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int* v) { return CudaDriverVersion(v); }
TF_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* v) { return CudaDriverVersion(v); }

TF_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int* count) { return DeviceCount(count); }
TF_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) { return DeviceCount(count); }

TF_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t* d) {
  return HandleByIndex(i, d);
}
TF_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t* d) {
  return HandleByIndex(i, d);
}

TF_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  if (!Initialised()) return kUninitialized;
  if (uuid == nullptr || device == nullptr) return kInvalidArgument;
  for (int i = 0; i < g.count; ++i) {
    char s[48];
    FormatUuid(g.devices[i].info.uuid, s);
    if (strcasecmp(s, uuid) == 0) {
      *device = Handle(i);
      return kSuccess;
    }
  }
  return kNotFound;
}

TF_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char* id, nvmlDevice_t* d) {
  return HandleByPciBusId(id, d);
}
TF_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* id, nvmlDevice_t* d) {
  return HandleByPciBusId(id, d);
}

TF_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t h, unsigned int* index) {
  nvmlReturn_t r;
  const tfusion_client_device* d = Dev(h, &r);
  if (d == nullptr) return r;
  if (index == nullptr) return kInvalidArgument;
  *index = static_cast<unsigned>(IndexOf(d));
  return kSuccess;
}

TF_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char* name, unsigned int length) {
  nvmlReturn_t r;
  const tfusion_client_device* d = Dev(h, &r);
  if (d == nullptr) return r;
  return CopyString(d->name, name, length);
}

TF_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char* uuid, unsigned int length) {
  nvmlReturn_t r;
  const tfusion_client_device* d = Dev(h, &r);
  if (d == nullptr) return r;
  char s[48];
  FormatUuid(d->uuid, s);
  return CopyString(s, uuid, length);
}

TF_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t* memory) {
  nvmlReturn_t r;
  const tfusion_client_device* d = Dev(h, &r);
  if (d == nullptr) return r;
  if (memory == nullptr) return kInvalidArgument;
  Memory m;
  if ((r = ReadMemory(d, &m)) != kSuccess) return r;
  memory->total = m.total;
  memory->free = m.free;
  memory->used = m.used;
  return kSuccess;
}

TF_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t* memory) {
  nvmlReturn_t r;
  const tfusion_client_device* d = Dev(h, &r);
  if (d == nullptr) return r;
  if (memory == nullptr) return kInvalidArgument;
  if (memory->version != kMemoryV2) return kArgumentVersionMismatch;
  Memory m;
  if ((r = ReadMemory(d, &m)) != kSuccess) return r;
  memory->total = m.total;
  memory->reserved = 0;
  memory->free = m.free;
  memory->used = m.used;
  return kSuccess;
}

TF_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t h, int* major, int* minor) {
  nvmlReturn_t r;
  const tfusion_client_device* d = Dev(h, &r);
  if (d == nullptr) return r;
  if (major == nullptr || minor == nullptr) return kInvalidArgument;
  *major = d->cc_major;
  *minor = d->cc_minor;
  return kSuccess;
}

TF_EXPORT nvmlReturn_t nvmlDeviceGetMultiGpuBoard(nvmlDevice_t h, unsigned int* multi) {
  nvmlReturn_t r;
  const tfusion_client_device* d = Dev(h, &r);
  if (d == nullptr) return r;
  if (multi == nullptr) return kInvalidArgument;
  *multi = d->multi_gpu_board != 0 ? 1 : 0;
  return kSuccess;
}

TF_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t h, unsigned int* minor) {
  nvmlReturn_t r;
  const tfusion_client_device* d = Dev(h, &r);
  if (d == nullptr) return r;
  if (minor == nullptr) return kInvalidArgument;
  *minor = static_cast<unsigned>(IndexOf(d));  // no /dev/nvidiaN on this side: the index
  return kSuccess;
}

TF_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t h, unsigned int* n,
                                                            nvmlProcessInfo_v1_t* infos) {
  return RunningProcesses(h, n, infos, true);
}
TF_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t h, unsigned int* n,
                                                               nvmlProcessInfo_v2_t* infos) {
  return RunningProcesses(h, n, infos, true);
}
TF_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int* n,
                                                               nvmlProcessInfo_v2_t* infos) {
  return RunningProcesses(h, n, infos, true);
}
TF_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t h, unsigned int* n,
                                                             nvmlProcessInfo_v1_t* infos) {
  return RunningProcesses(h, n, infos, false);
}
TF_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t h, unsigned int* n,
                                                                nvmlProcessInfo_v2_t* infos) {
  return RunningProcesses(h, n, infos, false);
}
TF_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t h, unsigned int* n,
                                                                nvmlProcessInfo_v2_t* infos) {
  return RunningProcesses(h, n, infos, false);
}
TF_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t h, unsigned int* n,
                                                               nvmlProcessInfo_v1_t* infos) {
  return RunningProcesses(h, n, infos, false);
}
TF_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t h, unsigned int* n,
                                                                  nvmlProcessInfo_v2_t* infos) {
  return RunningProcesses(h, n, infos, false);
}
TF_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int* n,
                                                                  nvmlProcessInfo_v2_t* infos) {
  return RunningProcesses(h, n, infos, false);
}

TF_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t h, nvmlPciInfoV1_t* pci) { return PciInfo(h, pci); }
TF_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t h, nvmlPciInfo_t* pci) { return PciInfo(h, pci); }
TF_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t h, nvmlPciInfo_t* pci) { return PciInfo(h, pci); }

TF_EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t h, int* brand) {
  nvmlReturn_t r;
  const tfusion_client_device* d = Dev(h, &r);
  if (d == nullptr) return r;
  if (brand == nullptr) return kInvalidArgument;
  // nvmlBrandType_t from the product name; data-center parts are NVML_BRAND_NVIDIA (14).
  const char* n = d->name;
  if (strstr(n, "GeForce RTX")) *brand = 15;
  else if (strstr(n, "GeForce")) *brand = 5;
  else if (strstr(n, "TITAN RTX")) *brand = 16;
  else if (strstr(n, "TITAN")) *brand = 6;
  else if (strstr(n, "Quadro RTX")) *brand = 12;
  else if (strstr(n, "Quadro")) *brand = 1;
  else if (strstr(n, "NVS")) *brand = 3;
  else if (strstr(n, "Tesla")) *brand = 2;
  else if (strstr(n, "RTX")) *brand = 13;
  else *brand = 14;
  return kSuccess;
}

TF_EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t h, int* mode) {
  nvmlReturn_t r;
  const tfusion_client_device* d = Dev(h, &r);
  if (d == nullptr) return r;
  if (mode == nullptr) return kInvalidArgument;
  *mode = 0;  // NVML_FEATURE_DISABLED: the worker keeps the session's driver loaded
  return kSuccess;
}

TF_EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t h, int* mode) {
  nvmlReturn_t r;
  const tfusion_client_device* d = Dev(h, &r);
  if (d == nullptr) return r;
  if (mode == nullptr) return kInvalidArgument;
  *mode = d->compute_mode;  // CUcomputemode and nvmlComputeMode_t share their values
  return kSuccess;
}

TF_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t h, unsigned int* current, unsigned int* pending) {
  nvmlReturn_t r;
  const tfusion_client_device* d = Dev(h, &r);
  if (d == nullptr) return r;
  if (current == nullptr || pending == nullptr) return kInvalidArgument;
  *current = 0;  // NVML_DEVICE_MIG_DISABLE: a vGPU is not partitioned further
  *pending = 0;
  return kSuccess;
}

TF_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, void* utilization) {
  nvmlReturn_t r;
  const tfusion_client_device* d = Dev(h, &r);
  if (d == nullptr) return r;
  if (utilization == nullptr) return kInvalidArgument;
  return kNotSupported;  // the worker does not sample its GPU for the client
}
