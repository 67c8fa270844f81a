// Fake driver core: initialization, devices, contexts, fault injection, error names and
// cuGetProcAddress.
#include "fake_driver.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace fakecuda {
namespace {

// The calling thread's context stack; the top is the current context. Entries may name contexts
// destroyed by another thread, so every use validates against Driver::contexts.
thread_local std::vector<Context*> tls_context_stack;

// Armed faults by base function name (versions and _ptsz/_ptds suffixes stripped).
class FaultTable {
 public:
  static FaultTable& Get() {
    static FaultTable* table = new FaultTable;  // leaked: outlives every caller
    return *table;
  }
  void Arm(const char* function, int n, int error) {
    std::lock_guard<std::mutex> lock(mu_);
    std::string key = BaseName(function);
    if (n <= 0) {
      faults_.erase(key);
    } else {
      faults_[key] = Fault{n, error};
    }
    armed_.store(!faults_.empty(), std::memory_order_release);
  }
  CUresult Check(const char* function) {
    if (!armed_.load(std::memory_order_acquire)) return CUDA_SUCCESS;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = faults_.find(BaseName(function));
    if (it == faults_.end()) return CUDA_SUCCESS;
    if (--it->second.remaining > 0) return CUDA_SUCCESS;
    CUresult error = static_cast<CUresult>(it->second.error);
    faults_.erase(it);
    armed_.store(!faults_.empty(), std::memory_order_release);
    return error;
  }

 private:
  struct Fault {
    int remaining;
    int error;
  };
  static std::string BaseName(std::string_view name) {
    for (std::string_view suffix : {"_ptsz", "_ptds"}) {
      if (name.size() > suffix.size() && name.ends_with(suffix)) name.remove_suffix(suffix.size());
    }
    size_t v = name.rfind("_v");
    if (v != std::string_view::npos && v + 2 < name.size() &&
        name.find_first_not_of("0123456789", v + 2) == std::string_view::npos) {
      name = name.substr(0, v);
    }
    return std::string(name);
  }
  std::mutex mu_;
  std::atomic<bool> armed_{false};
  std::map<std::string, Fault> faults_;
};

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};

constexpr ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT",
     "context already current"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
     "too many resources requested for launch"},
    {CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
     "primary context active"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

int AttributeValue(CUdevice_attribute attribute, CUdevice device) {
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 49152;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1980000;  // kHz
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: return 1;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return kMultiprocessorCount;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
      return (Driver::Get().ordinal_to_physical[static_cast<size_t>(device)] + 0x18) & 0xff;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return 2619000;  // kHz
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 5120;  // bits
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return 50 << 20;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return 2048;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 3;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return 0;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return 233472;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return 65536;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return 232448;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE: return 30 << 20;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED: return 1;  // fake_ipc.cc
    default: return 0;
  }
}

}  // namespace

Driver& Driver::Get() {
  static Driver* driver = new Driver;  // leaked: stream threads may run until process exit
  return *driver;
}

bool Driver::Charge(CUdevice device, size_t bytes) {
  DeviceState& state = devices[device];
  if (bytes > topology.total_bytes - state.used_bytes) return false;
  // Like a real GPU, the memory is shared by every process using the device.
  uint64_t everyone = UsageBoard::Used(ordinal_to_physical[static_cast<size_t>(device)]);
  if (everyone > topology.total_bytes || bytes > topology.total_bytes - everyone) return false;
  state.used_bytes += bytes;
  UsageBoard::Add(ordinal_to_physical[static_cast<size_t>(device)], static_cast<int64_t>(bytes));
  return true;
}

void Driver::Uncharge(CUdevice device, size_t bytes) {
  DeviceState& state = devices[device];
  state.used_bytes -= bytes;
  UsageBoard::Add(ordinal_to_physical[static_cast<size_t>(device)], -static_cast<int64_t>(bytes));
}

Allocation* Driver::FindAllocation(uintptr_t ptr) {
  auto it = allocations.upper_bound(ptr);
  if (it == allocations.begin()) return nullptr;
  --it;
  Allocation& a = it->second;
  return ptr < a.base + (a.size == 0 ? 1 : a.size) ? &a : nullptr;
}

Context* Driver::CurrentContextLocked() {
  if (tls_context_stack.empty()) return nullptr;
  Context* ctx = tls_context_stack.back();
  return contexts.count(ctx) != 0 ? ctx : nullptr;
}

Context* CurrentContext(CUresult* err) {
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  Context* ctx = d.CurrentContextLocked();
  if (ctx == nullptr) *err = CUDA_ERROR_INVALID_CONTEXT;
  return ctx;
}

std::shared_ptr<Stream> ResolveStream(CUstream handle, CUresult* err) {
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  if (handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
    Context* ctx = d.CurrentContextLocked();
    if (ctx == nullptr) {
      *err = CUDA_ERROR_INVALID_CONTEXT;
      return nullptr;
    }
    return ctx->null_stream;
  }
  auto it = d.streams.find(reinterpret_cast<Stream*>(handle));
  if (it == d.streams.end()) {
    *err = CUDA_ERROR_INVALID_HANDLE;
    return nullptr;
  }
  return it->second;
}

void SynchronizeContextStreams(Context* ctx, bool blocking_only) {
  std::vector<std::shared_ptr<Stream>> to_wait;
  {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.contexts.count(ctx) == 0) return;
    to_wait.push_back(ctx->null_stream);
    for (Stream* s : ctx->streams) {
      if (blocking_only && (s->flags & CU_STREAM_NON_BLOCKING) != 0) continue;
      to_wait.push_back(d.streams[s]);
    }
  }
  for (auto& s : to_wait) s->worker.Drain();
  FlushDevicePrintf();
}

CUresult InjectedFault(const char* function) {
  CheckpointGate();  // every entry point starts here: a locked process blocks (fake_checkpoint.cc)
  return FaultTable::Get().Check(function);
}

// FAKECUDA_FAIL_NTH=name:n:error[,name:n:error...]: armed at cuInit, for faults in a process
// the test does not run itself (a checkpointer, a restorer).
void ArmFaultsFromEnv() {
  const char* env = getenv("FAKECUDA_FAIL_NTH");
  if (env == nullptr) return;
  std::string list(env);
  size_t start = 0;
  while (start < list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string entry = list.substr(start, comma - start);
    size_t a = entry.find(':'), b = entry.rfind(':');
    if (a != std::string::npos && b != a) {
      FaultTable::Get().Arm(entry.substr(0, a).c_str(), std::atoi(entry.substr(a + 1, b - a - 1).c_str()),
                            std::atoi(entry.substr(b + 1).c_str()));
    }
    start = comma + 1;
  }
}

std::atomic<long> g_stream_queries{0};

void LogCallsAtExit() {
  static const char* path = nullptr;
  const char* env = getenv("FAKECUDA_CALL_LOG");
  if (env == nullptr || *env == '\0' || path != nullptr) return;
  path = strdup(env);
  atexit([] {
    if (FILE* f = fopen(path, "a")) {
      fprintf(f, "pid=%d cuStreamQuery=%ld\n", static_cast<int>(getpid()), g_stream_queries.load());
      fclose(f);
    }
  });
}

void* MapHostMemory(size_t bytes) {
  void* p = mmap(nullptr, RoundUp(bytes == 0 ? 1 : bytes, 4096), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void UnmapHostMemory(void* ptr, size_t bytes) {
  munmap(ptr, RoundUp(bytes == 0 ? 1 : bytes, 4096));
}

namespace {

std::unique_ptr<Context> NewContext(CUdevice device, unsigned flags, bool primary) {
  auto ctx = std::make_unique<Context>();
  ctx->device = device;
  ctx->flags = flags;
  ctx->primary = primary;
  ctx->null_stream = std::make_shared<Stream>();
  ctx->null_stream->ctx = ctx.get();
  return ctx;
}

CUresult CheckDevice(CUdevice dev) {
  Driver& d = Driver::Get();
  return dev >= 0 && dev < d.topology.device_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

// Drains and forgets every stream of `ctx`. REQUIRES not holding mu.
void RetireContextStreams(Context* ctx) {
  std::vector<std::shared_ptr<Stream>> retired;
  {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    for (Stream* s : ctx->streams) {
      retired.push_back(d.streams[s]);
      d.streams.erase(s);
    }
    ctx->streams.clear();
  }
  for (auto& s : retired) s->worker.Drain();
  ctx->null_stream->worker.Drain();
}

}  // namespace
}  // namespace fakecuda

using fakecuda::Context;
using fakecuda::Driver;

FAKECUDA_EXPORT void fakecuda_fail_nth(const char* function_name, int n, int cuda_error) {
  if (function_name == nullptr) return;
  fakecuda::FaultTable::Get().Arm(function_name, n, cuda_error);
}

CUresult cuInit(unsigned int flags) {
  if (CUresult fault = fakecuda::InjectedFault(__func__); fault != CUDA_SUCCESS) return fault;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.initialized.load()) return CUDA_SUCCESS;
  d.topology = fakecuda::ReadTopologyFromEnv();
  d.ordinal_to_physical = fakecuda::VisibleDevices(d.topology.device_count);
  // The real driver fails every cuInit when CUDA_VISIBLE_DEVICES leaves no device.
  if (d.ordinal_to_physical.empty()) return CUDA_ERROR_NO_DEVICE;
  d.topology.device_count = static_cast<int>(d.ordinal_to_physical.size());
  d.devices.resize(d.topology.device_count);
  for (int i = 0; i < d.topology.device_count; ++i) {
    fakecuda::DeviceState& state = d.devices[i];
    state.primary = fakecuda::NewContext(i, 0, true);
    state.default_pool = std::make_unique<fakecuda::MemPool>();
    state.default_pool->device = i;
    state.current_pool = state.default_pool.get();
  }
  d.initialized.store(true, std::memory_order_release);
  fakecuda::ArmFaultsFromEnv();
  fakecuda::LogCallsAtExit();
  fakecuda::CheckpointRegister();
  // FAKECUDA_ENV_LOG: one line per process that initialised, with the MPS client variables the
  // real driver reads at this point (tests assert what a tenant's driver saw).
  if (const char* log = getenv("FAKECUDA_ENV_LOG"); log != nullptr && *log != '\0') {
    std::string line = "pid=" + std::to_string(getpid());
    for (const char* name : {"CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                             "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"}) {
      if (const char* v = getenv(name); v != nullptr) line += std::string(" ") + name + "=" + v;
    }
    line += "\n";
    if (FILE* f = fopen(log, "a")) {
      fputs(line.c_str(), f);
      fclose(f);
    }
  }
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* version) {
  if (CUresult fault = fakecuda::InjectedFault(__func__); fault != CUDA_SUCCESS) return fault;
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = CUDA_VERSION;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* count) {
  FAKECUDA_ENTER();
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = Driver::Get().topology.device_count;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  FAKECUDA_ENTER();
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = fakecuda::CheckDevice(ordinal); r != CUDA_SUCCESS) return r;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  FAKECUDA_ENTER();
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = fakecuda::CheckDevice(dev); r != CUDA_SUCCESS) return r;
  std::snprintf(name, static_cast<size_t>(len), "%s", fakecuda::kDeviceName);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  FAKECUDA_ENTER();
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = fakecuda::CheckDevice(dev); r != CUDA_SUCCESS) return r;
  fakecuda::DeviceUuid(Driver::Get().ordinal_to_physical[static_cast<size_t>(dev)],
                       reinterpret_cast<unsigned char*>(uuid->bytes));
  return CUDA_SUCCESS;
}

// The unversioned export that cuda.h's macro hides; same behaviour as _v2 here.
#undef cuDeviceGetUuid
FAKECUDA_EXPORT CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  return cuDeviceGetUuid_v2(uuid, dev);
}

CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice dev) {
  FAKECUDA_ENTER();
  if (value == nullptr || attribute <= 0 || attribute >= CU_DEVICE_ATTRIBUTE_MAX) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult r = fakecuda::CheckDevice(dev); r != CUDA_SUCCESS) return r;
  *value = fakecuda::AttributeValue(attribute, dev);
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  FAKECUDA_ENTER();
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = fakecuda::CheckDevice(dev); r != CUDA_SUCCESS) return r;
  *bytes = Driver::Get().topology.total_bytes;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char* bus_id, int len, CUdevice dev) {
  FAKECUDA_ENTER();
  if (bus_id == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = fakecuda::CheckDevice(dev); r != CUDA_SUCCESS) return r;
  const int physical = Driver::Get().ordinal_to_physical[static_cast<size_t>(dev)];
  const std::string text = fakecuda::DevicePciBusId(physical);
  if (text.size() >= static_cast<size_t>(len)) return CUDA_ERROR_INVALID_VALUE;  // as the driver: no room
  std::snprintf(bus_id, static_cast<size_t>(len), "%s", text.c_str());
  return CUDA_SUCCESS;
}

// ---- Primary contexts ----

CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  FAKECUDA_ENTER();
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = fakecuda::CheckDevice(dev); r != CUDA_SUCCESS) return r;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::DeviceState& state = d.devices[dev];
  Context* ctx = state.primary.get();
  if (state.primary_refs++ == 0) {
    ctx->flags = state.primary_flags;
    d.contexts.insert(ctx);
  }
  *pctx = reinterpret_cast<CUcontext>(ctx);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  FAKECUDA_ENTER();
  if (CUresult r = fakecuda::CheckDevice(dev); r != CUDA_SUCCESS) return r;
  Context* ctx = nullptr;
  {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    fakecuda::DeviceState& state = d.devices[dev];
    if (state.primary_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (--state.primary_refs > 0) return CUDA_SUCCESS;
    ctx = state.primary.get();
  }
  fakecuda::RetireContextStreams(ctx);
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.devices[dev].primary_refs == 0) d.contexts.erase(ctx);
  return CUDA_SUCCESS;
}

// Destroys what the process made in the device's primary context: its streams, its device,
// managed and page-locked (cuMemAllocHost, cuMemHostAlloc) allocations, and (when no other
// context of the process lives) every event and module; libraries (context-independent) stay; the
// retains stay, and the context can be used again at once. Graphs, arrays and registrations
// (cuMemHostRegister) are not tracked by context here and stay.
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  FAKECUDA_ENTER();
  if (CUresult r = fakecuda::CheckDevice(dev); r != CUDA_SUCCESS) return r;
  Driver& d = Driver::Get();
  Context* ctx = nullptr;
  bool only = true;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    ctx = d.devices[dev].primary.get();
    for (Context* c : d.contexts) only = only && c == ctx;
  }
  fakecuda::SynchronizeContextStreams(ctx, /*blocking_only=*/false);
  fakecuda::RetireContextStreams(ctx);
  std::vector<uintptr_t> frees, host_frees;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    for (const auto& [base, a] : d.allocations) {
      if (a.ctx == ctx && (a.kind == fakecuda::MemoryKind::kDevice || a.kind == fakecuda::MemoryKind::kManaged)) {
        frees.push_back(base);
      }
      if (a.ctx == ctx && a.kind == fakecuda::MemoryKind::kHost) host_frees.push_back(base);
    }
    if (only) {
      d.events.clear();
      d.Uncharge(dev, d.devices[dev].graph_idle);  // the graph memory pool goes with the context
      d.devices[dev].graph_idle = 0;
      for (auto it = d.modules.begin(); it != d.modules.end();) {
        if (it->second->library) ++it;  // libraries are context-independent
        else it = d.modules.erase(it);
      }
    }
  }
  cuCtxPushCurrent_v2(reinterpret_cast<CUcontext>(ctx));
  for (uintptr_t p : frees) cuMemFree_v2(p);
  for (uintptr_t p : host_frees) cuMemFreeHost(reinterpret_cast<void*>(p));
  CUcontext popped = nullptr;
  cuCtxPopCurrent_v2(&popped);
  return CUDA_SUCCESS;
}

#undef cuDevicePrimaryCtxReset
FAKECUDA_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  FAKECUDA_ENTER();
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = fakecuda::CheckDevice(dev); r != CUDA_SUCCESS) return r;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  *flags = d.devices[dev].primary_flags;
  *active = d.devices[dev].primary_refs > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  FAKECUDA_ENTER();
  if (CUresult r = fakecuda::CheckDevice(dev); r != CUDA_SUCCESS) return r;
  if ((flags & ~static_cast<unsigned>(CU_CTX_FLAGS_MASK)) != 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  d.devices[dev].primary_flags = flags;
  d.devices[dev].primary->flags = flags;
  return CUDA_SUCCESS;
}

// ---- Created contexts and the context stack ----

namespace {
CUresult CreateContext(CUcontext* pctx, unsigned flags, CUdevice dev) {
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = fakecuda::CheckDevice(dev); r != CUDA_SUCCESS) return r;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto ctx = fakecuda::NewContext(dev, flags, false);
  Context* raw = ctx.get();
  d.owned_contexts.push_back(std::move(ctx));
  d.contexts.insert(raw);
  fakecuda::tls_context_stack.push_back(raw);
  *pctx = reinterpret_cast<CUcontext>(raw);
  return CUDA_SUCCESS;
}
}  // namespace

CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags,
                        CUdevice dev) {
  FAKECUDA_ENTER();
  (void)params;  // execution affinity and CIG are accepted and ignored
  return CreateContext(pctx, flags, dev);
}

FAKECUDA_EXPORT CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* params,
                                        int num_params, unsigned int flags, CUdevice dev) {
  FAKECUDA_ENTER();
  (void)params;
  (void)num_params;
  return CreateContext(pctx, flags, dev);
}

CUresult cuCtxDestroy_v2(CUcontext handle) {
  FAKECUDA_ENTER();
  Context* ctx = reinterpret_cast<Context*>(handle);
  Driver& d = Driver::Get();
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (ctx == nullptr || d.contexts.count(ctx) == 0 || ctx->primary) {
      return CUDA_ERROR_INVALID_CONTEXT;
    }
    d.contexts.erase(ctx);
  }
  fakecuda::RetireContextStreams(ctx);
  std::erase(fakecuda::tls_context_stack, ctx);
  // The Context object itself stays allocated (owned_contexts): other threads' stacks may still
  // name it, and validation compares against the live set.
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* pctx) {
  FAKECUDA_ENTER();
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  *pctx = reinterpret_cast<CUcontext>(d.CurrentContextLocked());
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext handle) {
  FAKECUDA_ENTER();
  Context* ctx = reinterpret_cast<Context*>(handle);
  auto& stack = fakecuda::tls_context_stack;
  if (ctx == nullptr) {
    if (!stack.empty()) stack.pop_back();
    return CUDA_SUCCESS;
  }
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.contexts.count(ctx) == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (stack.empty()) {
    stack.push_back(ctx);
  } else {
    stack.back() = ctx;
  }
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext handle) {
  FAKECUDA_ENTER();
  Context* ctx = reinterpret_cast<Context*>(handle);
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  if (ctx == nullptr || d.contexts.count(ctx) == 0) return CUDA_ERROR_INVALID_CONTEXT;
  fakecuda::tls_context_stack.push_back(ctx);
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  FAKECUDA_ENTER();
  auto& stack = fakecuda::tls_context_stack;
  if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx != nullptr) *pctx = reinterpret_cast<CUcontext>(stack.back());
  stack.pop_back();
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice* device) {
  FAKECUDA_ENTER();
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  *device = ctx->device;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetFlags(unsigned int* flags) {
  FAKECUDA_ENTER();
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  *flags = ctx->flags;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetApiVersion(CUcontext handle, unsigned int* version) {
  FAKECUDA_ENTER();
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  (void)handle;
  *version = 12000;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetStreamPriorityRange(int* least, int* greatest) {
  FAKECUDA_ENTER();
  if (least != nullptr) *least = 0;
  if (greatest != nullptr) *greatest = -5;
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize() {
  FAKECUDA_ENTER();
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  fakecuda::SynchronizeContextStreams(ctx, /*blocking_only=*/false);
  return CUDA_SUCCESS;
}

// Context limits of the fake device, shared by its contexts: defaults as a CUDA 13 driver reports
// them (stack 1 KiB, printf FIFO 1 MiB, malloc heap 8 MiB), others 0; any value may be set.
CUresult cuCtxGetLimit(size_t* value, CUlimit limit) {
  FAKECUDA_ENTER();
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  (void)ctx;
  if (value == nullptr || limit < 0 || limit >= CU_LIMIT_MAX) return CUDA_ERROR_INVALID_VALUE;
  static const size_t kDefaults[CU_LIMIT_MAX] = {1024, 1 << 20, 8 << 20};
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.limits.find(limit);
  *value = it != d.limits.end() ? it->second : (limit < 3 ? kDefaults[limit] : 0);
  return CUDA_SUCCESS;
}

CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
  FAKECUDA_ENTER();
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  (void)ctx;
  if (limit < 0 || limit >= CU_LIMIT_MAX) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  d.limits[limit] = value;
  return CUDA_SUCCESS;
}

// The preferred split of L1 and shared memory: a hint on real GPUs, kept and answered here.
CUresult cuCtxGetCacheConfig(CUfunc_cache* config) {
  FAKECUDA_ENTER();
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  (void)ctx;
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  *config = static_cast<CUfunc_cache>(d.cache_config);
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCacheConfig(CUfunc_cache config) {
  FAKECUDA_ENTER();
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  (void)ctx;
  if (config < CU_FUNC_CACHE_PREFER_NONE || config > CU_FUNC_CACHE_PREFER_EQUAL) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  d.cache_config = config;
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize_v2(CUcontext handle) {
  FAKECUDA_ENTER();
  if (handle == nullptr) return cuCtxSynchronize();
  Context* ctx = reinterpret_cast<Context*>(handle);
  {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.contexts.count(ctx) == 0) return CUDA_ERROR_INVALID_CONTEXT;
  }
  fakecuda::SynchronizeContextStreams(ctx, /*blocking_only=*/false);
  return CUDA_SUCCESS;
}

// ---- Errors and entry-point lookup ----

CUresult cuGetErrorName(CUresult error, const char** name) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& e : fakecuda::kErrors) {
    if (e.code == error) {
      *name = e.name;
      return CUDA_SUCCESS;
    }
  }
  *name = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char** text) {
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& e : fakecuda::kErrors) {
    if (e.code == error) {
      *text = e.text;
      return CUDA_SUCCESS;
    }
  }
  *text = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

// Resolves `symbol` to this library's own export, preferring the newest version this library has
// (name_v4 .. name_v2, then name); with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM the _ptsz and
// _ptds variants are tried first. cudaVersion is not consulted: the real routing lives in src/.
CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* status) {
  FAKECUDA_ENTER();
  (void)cuda_version;
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  static void* self = [] {
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(&cuInit), &info);
    return dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  }();
  *pfn = nullptr;
  std::vector<std::string> candidates;
  std::string base = symbol;
  if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0) {
    for (const char* v : {"_v2", ""}) {
      candidates.push_back(base + v + "_ptsz");
      candidates.push_back(base + v + "_ptds");
    }
  }
  for (const char* v : {"_v4", "_v3", "_v2", ""}) candidates.push_back(base + v);
  for (const std::string& name : candidates) {
    if (self == nullptr) break;
    if (void* fn = dlsym(self, name.c_str()); fn != nullptr) {
      *pfn = fn;
      if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  }
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}
