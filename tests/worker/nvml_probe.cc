// What a program that loads libnvidia-ml.so.1 sees (PyTorch's device count, pynvml, nvidia-smi-
// style tools), for the remote client's NVML tests: it dlopens NVML (and, in "alloc", the driver)
// from the library path and prints "key=value" lines the tests compare.
//   list    device count, names, UUIDs, memory, PCI, compute capability, lookups by UUID and bus id
//   alloc   a context and an 8 MiB allocation on device 0, then NVML's and CUDA's memory, processes
//   args    argument checking: uninitialised calls, short buffers, bad handles and indices
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace {

struct Memory {
  unsigned long long total, free, used;
};
struct MemoryV2 {
  unsigned int version;
  unsigned long long total, reserved, free, used;
};
struct PciInfo {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
struct ProcessInfo {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
};
using Dev = void*;
constexpr unsigned kMemoryV2 = sizeof(MemoryV2) | (2u << 24);

void* g_nvml = nullptr;

template <typename F>
F Sym(const char* name) {
  void* p = dlsym(g_nvml, name);
  if (p == nullptr) {
    std::printf("missing=%s\n", name);
    std::fflush(stdout);
    _exit(3);
  }
  return reinterpret_cast<F>(p);
}
#define NVML(name, ...) Sym<int (*)(__VA_ARGS__)>(#name)

int List() {
  int r = NVML(nvmlInit_v2)();
  std::printf("init=%d\n", r);
  if (r != 0) {
    std::printf("init_error=%s\n", Sym<const char* (*)(int)>("nvmlErrorString")(r));
    std::printf("count_uninit=%d\n", NVML(nvmlDeviceGetCount_v2, unsigned*)(nullptr));
    return 0;
  }
  std::printf("is_tfusion=%d\n", dlsym(g_nvml, "tfusion_client_nvml_version") != nullptr ? 1 : 0);
  int cuda = 0;
  NVML(nvmlSystemGetCudaDriverVersion_v2, int*)(&cuda);
  std::printf("cuda_driver_version=%d\n", cuda);
  unsigned count = 0;
  std::printf("count_result=%d\n", NVML(nvmlDeviceGetCount_v2, unsigned*)(&count));
  std::printf("count=%u\n", count);
  for (unsigned i = 0; i < count; ++i) {
    Dev d = nullptr;
    NVML(nvmlDeviceGetHandleByIndex_v2, unsigned, Dev*)(i, &d);
    char name[96] = {}, uuid[96] = {};
    NVML(nvmlDeviceGetName, Dev, char*, unsigned)(d, name, sizeof(name));
    NVML(nvmlDeviceGetUUID, Dev, char*, unsigned)(d, uuid, sizeof(uuid));
    std::printf("name_%u=%s\nuuid_%u=%s\n", i, name, i, uuid);
    Memory m = {};
    std::printf("mem_result_%u=%d\n", i, NVML(nvmlDeviceGetMemoryInfo, Dev, Memory*)(d, &m));
    std::printf("mem_total_mib_%u=%llu\nmem_used_mib_%u=%llu\nmem_free_mib_%u=%llu\n", i,
                m.total >> 20, i, m.used >> 20, i, m.free >> 20);
    MemoryV2 m2 = {};
    m2.version = kMemoryV2;
    NVML(nvmlDeviceGetMemoryInfo_v2, Dev, MemoryV2*)(d, &m2);
    std::printf("mem_v2_total_mib_%u=%llu\n", i, m2.total >> 20);
    PciInfo pci = {};
    NVML(nvmlDeviceGetPciInfo_v3, Dev, PciInfo*)(d, &pci);
    std::printf("pci_%u=%s\n", i, pci.busId);
    int major = 0, minor = 0;
    NVML(nvmlDeviceGetCudaComputeCapability, Dev, int*, int*)(d, &major, &minor);
    std::printf("cc_%u=%d.%d\n", i, major, minor);
    unsigned index = 99;
    Dev by = nullptr;
    NVML(nvmlDeviceGetHandleByUUID, const char*, Dev*)(uuid, &by);
    NVML(nvmlDeviceGetIndex, Dev, unsigned*)(by, &index);
    std::printf("by_uuid_%u=%u\n", i, index);
    by = nullptr;
    index = 99;
    NVML(nvmlDeviceGetHandleByPciBusId_v2, const char*, Dev*)(pci.busId, &by);
    NVML(nvmlDeviceGetIndex, Dev, unsigned*)(by, &index);
    std::printf("by_pci_%u=%u\n", i, index);
    unsigned n = 8;
    ProcessInfo procs[8];
    int pr = NVML(nvmlDeviceGetComputeRunningProcesses_v3, Dev, unsigned*, ProcessInfo*)(d, &n, procs);
    std::printf("procs_%u=%d/%u\n", i, pr, n);
    unsigned mig = 9, pending = 9;
    NVML(nvmlDeviceGetMigMode, Dev, unsigned*, unsigned*)(d, &mig, &pending);
    std::printf("mig_%u=%u\n", i, mig);
  }
  std::printf("shutdown=%d\n", NVML(nvmlShutdown)());
  std::printf("count_after_shutdown=%d\n", NVML(nvmlDeviceGetCount_v2, unsigned*)(&count));
  return 0;
}

int Alloc() {
  void* cu = dlopen("libcuda.so.1", RTLD_NOW);
  if (cu == nullptr) return 4;
  auto cu_init = reinterpret_cast<int (*)(unsigned)>(dlsym(cu, "cuInit"));
  auto retain = reinterpret_cast<int (*)(void**, int)>(dlsym(cu, "cuDevicePrimaryCtxRetain"));
  auto set_current = reinterpret_cast<int (*)(void*)>(dlsym(cu, "cuCtxSetCurrent"));
  auto alloc = reinterpret_cast<int (*)(unsigned long long*, size_t)>(dlsym(cu, "cuMemAlloc_v2"));
  auto info = reinterpret_cast<int (*)(size_t*, size_t*)>(dlsym(cu, "cuMemGetInfo_v2"));
  void* ctx = nullptr;
  unsigned long long p = 0;
  int r = cu_init(0);
  if (r == 0) r = retain(&ctx, 0);
  if (r == 0) r = set_current(ctx);
  if (r == 0) r = alloc(&p, 8u << 20);
  std::printf("cuda_setup=%d\n", r);
  if (r != 0) return 0;
  std::printf("init=%d\n", NVML(nvmlInit_v2)());
  Dev d = nullptr;
  NVML(nvmlDeviceGetHandleByIndex_v2, unsigned, Dev*)(0, &d);
  Memory m = {};
  NVML(nvmlDeviceGetMemoryInfo, Dev, Memory*)(d, &m);
  size_t cu_free = 0, cu_total = 0;
  info(&cu_free, &cu_total);
  std::printf("nvml_total=%llu\nnvml_free=%llu\nnvml_used=%llu\n", m.total, m.free, m.used);
  std::printf("cuda_total=%zu\ncuda_free=%zu\n", cu_total, cu_free);
  unsigned n = 0;
  int pr = NVML(nvmlDeviceGetComputeRunningProcesses_v3, Dev, unsigned*, ProcessInfo*)(d, &n, nullptr);
  std::printf("procs_probe=%d/%u\n", pr, n);
  ProcessInfo procs[4] = {};
  n = 4;
  pr = NVML(nvmlDeviceGetComputeRunningProcesses_v3, Dev, unsigned*, ProcessInfo*)(d, &n, procs);
  std::printf("procs=%d/%u\n", pr, n);
  std::printf("proc_is_me=%d\n", n >= 1 && procs[0].pid == static_cast<unsigned>(getpid()) ? 1 : 0);
  std::printf("proc_used_mib=%llu\n", procs[0].usedGpuMemory >> 20);
  return 0;
}

int Args() {
  unsigned count = 0;
  std::printf("count_before_init=%d\n", NVML(nvmlDeviceGetCount_v2, unsigned*)(&count));
  std::printf("shutdown_before_init=%d\n", NVML(nvmlShutdown)());
  std::printf("init=%d\n", NVML(nvmlInit)());
  std::printf("count_null=%d\n", NVML(nvmlDeviceGetCount_v2, unsigned*)(nullptr));
  Dev d = nullptr;
  std::printf("index_out_of_range=%d\n", NVML(nvmlDeviceGetHandleByIndex_v2, unsigned, Dev*)(7, &d));
  std::printf("handle_null=%d\n", NVML(nvmlDeviceGetHandleByIndex_v2, unsigned, Dev*)(0, nullptr));
  NVML(nvmlDeviceGetHandleByIndex_v2, unsigned, Dev*)(0, &d);
  char small[4];
  std::printf("name_short=%d\n", NVML(nvmlDeviceGetName, Dev, char*, unsigned)(d, small, sizeof(small)));
  char uuid[40];
  std::printf("uuid_40=%d\n", NVML(nvmlDeviceGetUUID, Dev, char*, unsigned)(d, uuid, sizeof(uuid)));
  char uuid41[41];
  std::printf("uuid_41=%d\n", NVML(nvmlDeviceGetUUID, Dev, char*, unsigned)(d, uuid41, sizeof(uuid41)));
  std::printf("name_null=%d\n", NVML(nvmlDeviceGetName, Dev, char*, unsigned)(d, nullptr, 64));
  int fake_handle = 0;
  char name[96];
  std::printf("bad_handle=%d\n",
              NVML(nvmlDeviceGetName, Dev, char*, unsigned)(&fake_handle, name, sizeof(name)));
  std::printf("null_handle=%d\n", NVML(nvmlDeviceGetName, Dev, char*, unsigned)(nullptr, name, sizeof(name)));
  MemoryV2 m2 = {};
  m2.version = 1;
  std::printf("mem_v2_bad_version=%d\n", NVML(nvmlDeviceGetMemoryInfo_v2, Dev, MemoryV2*)(d, &m2));
  std::printf("mem_null=%d\n", NVML(nvmlDeviceGetMemoryInfo, Dev, Memory*)(d, nullptr));
  Dev by = nullptr;
  std::printf("unknown_uuid=%d\n", NVML(nvmlDeviceGetHandleByUUID, const char*, Dev*)(
                                       "GPU-00000000-0000-0000-0000-000000000000", &by));
  std::printf("unknown_bus=%d\n", NVML(nvmlDeviceGetHandleByPciBusId_v2, const char*, Dev*)(
                                      "00000000:FF:1F.0", &by));
  std::printf("garbage_bus=%d\n", NVML(nvmlDeviceGetHandleByPciBusId_v2, const char*, Dev*)("gpu0", &by));
  unsigned n = 0;
  std::printf("procs_null_count=%d\n",
              NVML(nvmlDeviceGetComputeRunningProcesses_v3, Dev, unsigned*, ProcessInfo*)(d, nullptr, nullptr));
  std::printf("procs_none=%d/%u\n",
              NVML(nvmlDeviceGetComputeRunningProcesses_v3, Dev, unsigned*, ProcessInfo*)(d, &n, nullptr), n);
  unsigned mw = 0;
  std::printf("power_usage=%d\n", NVML(nvmlDeviceGetPowerUsage, Dev, unsigned*)(d, &mw));
  char version[80];
  std::printf("driver_version_short=%d\n", NVML(nvmlSystemGetDriverVersion, char*, unsigned)(version, 2));
  std::printf("error_string_7=%s\n", Sym<const char* (*)(int)>("nvmlErrorString")(7));
  std::printf("shutdown=%d\n", NVML(nvmlShutdown)());
  std::printf("shutdown_again=%d\n", NVML(nvmlShutdown)());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* mode = argc > 1 ? argv[1] : "list";
  g_nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (g_nvml == nullptr) {
    std::printf("dlopen_error=%s\n", dlerror());
    return 2;
  }
  int rc = 1;
  if (strcmp(mode, "list") == 0) rc = List();
  else if (strcmp(mode, "alloc") == 0) rc = Alloc();
  else if (strcmp(mode, "args") == 0) rc = Args();
  std::printf("done=1\n");
  return rc;
}
