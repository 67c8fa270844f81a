// Fake driver memory: linear device memory (host-backed), host memory, stream-ordered pools,
// virtual memory management and pointer queries (arrays: fake_arrays.cc).
//
// Device memory is host memory mapped with mmap, so a CUdeviceptr is a host address and copies are
// plain memcpy. Every device allocation is charged against its device's total, rounded up to the
// 2 MiB granularity the real driver reports, and fails with CUDA_ERROR_OUT_OF_MEMORY past it.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "fake_driver.h"

namespace fakecuda {
namespace {

// Allocates `bytes` of device memory on the current context's device and records it.
CUresult AllocateDevice(CUdeviceptr* dptr, size_t bytes, MemoryKind kind, MemPool* pool) {
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  size_t counted = RoundUp(bytes, kGranularity);
  Driver& d = Driver::Get();
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (!d.Charge(ctx->device, counted)) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  void* mem = MapHostMemory(bytes);
  std::lock_guard<std::mutex> lock(d.mu);
  if (mem == nullptr) {
    d.Uncharge(ctx->device, counted);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Allocation a;
  a.base = reinterpret_cast<uintptr_t>(mem);
  a.size = bytes;
  a.mapped = bytes;
  a.counted = counted;
  a.kind = kind;
  a.device = ctx->device;
  a.ctx = ctx;
  a.pool = pool;
  if (pool != nullptr) pool->used_bytes += counted;
  d.allocations[a.base] = a;
  *dptr = a.base;
  return CUDA_SUCCESS;
}

// REQUIRES d.mu. Removes the allocation starting at `ptr` and uncharges it; the host mapping is
// returned through `unmap` (to be released after the lock is dropped).
CUresult ForgetDeviceAllocation(Driver& d, CUdeviceptr ptr, std::pair<void*, size_t>* unmap) {
  auto it = d.allocations.find(ptr);
  if (it == d.allocations.end() || IsHostKind(it->second.kind) ||
      it->second.kind == MemoryKind::kVmmMapping || it->second.kind == MemoryKind::kIpcOpened) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Allocation& a = it->second;
  // An exported allocation's memfd: processes that opened it keep their mappings (fake_ipc.cc).
  if (a.ipc_fd >= 0) close(a.ipc_fd);
  // A graph allocation freed outside its graph goes back to the graph memory pool (fake_graphs.cc).
  if (a.kind == MemoryKind::kGraph) d.devices[a.device].graph_idle += a.counted;
  else d.Uncharge(a.device, a.counted);
  // Pool lookups need the pool to be alive: cuMemPoolDestroy clears `pool` of its allocations.
  if (a.pool != nullptr) a.pool->used_bytes -= a.counted;
  *unmap = {reinterpret_cast<void*>(a.base), a.mapped};
  d.allocations.erase(it);
  return CUDA_SUCCESS;
}

CUresult FreeDevice(CUdeviceptr ptr) {
  Driver& d = Driver::Get();
  std::pair<void*, size_t> unmap{nullptr, 0};
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (CUresult r = ForgetDeviceAllocation(d, ptr, &unmap); r != CUDA_SUCCESS) return r;
  }
  if (unmap.second != 0) UnmapHostMemory(unmap.first, unmap.second);
  return CUDA_SUCCESS;
}

template <typename T>
void Fill(CUdeviceptr dst, T value, size_t count) {
  T* p = reinterpret_cast<T*>(dst);
  for (size_t i = 0; i < count; ++i) p[i] = value;
}

void* AsHost(CUdeviceptr p) { return reinterpret_cast<void*>(p); }

}  // namespace
}  // namespace fakecuda

using fakecuda::Driver;
using fakecuda::MemoryKind;

// ---- Linear device memory ----

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  FAKECUDA_ENTER();
  if (CUresult r = fakecuda::CheckUnsafeDuringCapture(); r != CUDA_SUCCESS) return r;
  return fakecuda::AllocateDevice(dptr, bytesize, MemoryKind::kDevice, nullptr);
}

CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width_bytes, size_t height,
                            unsigned int element_bytes) {
  FAKECUDA_ENTER();
  if (pitch == nullptr || width_bytes == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
  if (element_bytes != 4 && element_bytes != 8 && element_bytes != 16) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  size_t rounded = fakecuda::RoundUp(width_bytes, fakecuda::kPitchAlignment);
  CUresult r = fakecuda::AllocateDevice(dptr, rounded * height, MemoryKind::kDevice, nullptr);
  if (r == CUDA_SUCCESS) *pitch = rounded;
  return r;
}

CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  FAKECUDA_ENTER();
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return CUDA_ERROR_INVALID_VALUE;
  return fakecuda::AllocateDevice(dptr, bytesize, MemoryKind::kManaged, nullptr);
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  FAKECUDA_ENTER();
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  (void)ctx;
  if (dptr == 0) return CUDA_SUCCESS;
  // Like the driver, freeing waits for work that may still use the memory.
  fakecuda::SynchronizeContextStreams(ctx, /*blocking_only=*/false);
  return fakecuda::FreeDevice(dptr);
}

CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  FAKECUDA_ENTER();
  if (free_bytes == nullptr || total_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  *total_bytes = d.topology.total_bytes;
  *free_bytes = d.topology.total_bytes - d.devices[ctx->device].used_bytes;
  return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  FAKECUDA_ENTER();
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  (void)ctx;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::Allocation* a = d.FindAllocation(dptr);
  if (a == nullptr || fakecuda::IsHostKind(a->kind)) return CUDA_ERROR_NOT_FOUND;
  if (pbase != nullptr) *pbase = a->base;
  if (psize != nullptr) *psize = a->size;
  return CUDA_SUCCESS;
}

// ---- Host memory (page-locked in the real driver; not charged to the device) ----

namespace {
CUresult AllocateHost(void** pp, size_t bytesize, unsigned flags) {
  if (pp == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  void* mem = fakecuda::MapHostMemory(bytesize);
  if (mem == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::Allocation a;
  a.base = reinterpret_cast<uintptr_t>(mem);
  a.size = bytesize;
  a.mapped = bytesize;
  a.kind = MemoryKind::kHost;
  a.host_flags = flags;
  a.device = ctx->device;
  a.ctx = ctx;
  d.allocations[a.base] = a;
  *pp = mem;
  return CUDA_SUCCESS;
}
}  // namespace

CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) {
  FAKECUDA_ENTER();
  return AllocateHost(pp, bytesize, 0);
}

CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
  FAKECUDA_ENTER();
  return AllocateHost(pp, bytesize, flags);
}

CUresult cuMemHostGetFlags(unsigned int* flags, void* p) {
  FAKECUDA_ENTER();
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::Allocation* a = d.FindAllocation(reinterpret_cast<uintptr_t>(p));
  if (a == nullptr || !fakecuda::IsHostKind(a->kind)) return CUDA_ERROR_INVALID_VALUE;
  *flags = a->host_flags;
  return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void* p) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::pair<void*, size_t> unmap{nullptr, 0};
  {
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.allocations.find(reinterpret_cast<uintptr_t>(p));
    if (it == d.allocations.end() || it->second.kind != MemoryKind::kHost) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    unmap = {p, it->second.mapped};
    d.allocations.erase(it);
  }
  fakecuda::UnmapHostMemory(unmap.first, unmap.second);
  return CUDA_SUCCESS;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int flags) {
  FAKECUDA_ENTER();
  if (pdptr == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::Allocation* a = d.FindAllocation(reinterpret_cast<uintptr_t>(p));
  if (a == nullptr || !fakecuda::IsHostKind(a->kind)) return CUDA_ERROR_INVALID_VALUE;
  *pdptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}

// Registration records the range (the memory is the caller's; device pointers are host
// addresses): overlapping an existing host range is CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED.
CUresult cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int flags) {
  FAKECUDA_ENTER();
  // FAKECUDA_HOST_REGISTER_SLOW_MS=N: each registration takes N ms more (pinning a large host
  // range), so that a test can kill the caller while it pins.
  if (const char* slow = std::getenv("FAKECUDA_HOST_REGISTER_SLOW_MS"); slow != nullptr && *slow) {
    usleep(static_cast<useconds_t>(std::atoi(slow)) * 1000);
  }
  // Unsafe during a global-mode capture, as on the real driver (it invalidates the capture).
  if (CUresult r = fakecuda::CheckUnsafeDuringCapture(); r != CUDA_SUCCESS) return r;
  if (p == nullptr || bytesize == 0 ||
      (flags & ~(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                 CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  const uintptr_t base = reinterpret_cast<uintptr_t>(p);
  auto it = d.allocations.lower_bound(base);
  if (it != d.allocations.end() && it->first < base + bytesize) {
    return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  if (d.FindAllocation(base) != nullptr) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  fakecuda::Allocation a;
  a.base = base;
  a.size = bytesize;
  a.kind = MemoryKind::kHostRegistered;
  a.host_flags = flags;
  a.device = ctx->device;
  a.ctx = ctx;
  d.allocations[a.base] = a;
  // FAKECUDA_HOST_REGISTER_LOG: one line per registration, so that a test can tell when a
  // process pinned fresh host memory (the real driver faults it in at this call).
  if (const char* log = getenv("FAKECUDA_HOST_REGISTER_LOG"); log != nullptr && *log != '\0') {
    if (FILE* f = fopen(log, "a")) {
      fprintf(f, "pid=%d bytes=%zu\n", static_cast<int>(getpid()), bytesize);
      fclose(f);
    }
  }
  return CUDA_SUCCESS;
}

CUresult cuMemHostUnregister(void* p) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.allocations.find(reinterpret_cast<uintptr_t>(p));
  if (it == d.allocations.end() || it->second.kind != MemoryKind::kHostRegistered) {
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  }
  d.allocations.erase(it);
  return CUDA_SUCCESS;
}

// ---- Stream-ordered allocation and pools ----

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
  FAKECUDA_ENTER();
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  if (dev < 0 || dev >= d.topology.device_count) return CUDA_ERROR_INVALID_DEVICE;
  *pool = reinterpret_cast<CUmemoryPool>(d.devices[dev].default_pool.get());
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  FAKECUDA_ENTER();
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  if (dev < 0 || dev >= d.topology.device_count) return CUDA_ERROR_INVALID_DEVICE;
  *pool = reinterpret_cast<CUmemoryPool>(d.devices[dev].current_pool);
  return CUDA_SUCCESS;
}

CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  FAKECUDA_ENTER();
  if (pool == nullptr || props == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  int dev = props->location.id;
  if (props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || dev < 0 ||
      dev >= d.topology.device_count) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto p = std::make_unique<fakecuda::MemPool>();
  p->device = dev;
  *pool = reinterpret_cast<CUmemoryPool>(p.get());
  d.pools[p.get()] = std::move(p);
  return CUDA_SUCCESS;
}

CUresult cuMemPoolDestroy(CUmemoryPool handle) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto* pool = reinterpret_cast<fakecuda::MemPool*>(handle);
  auto it = d.pools.find(pool);
  if (it == d.pools.end()) return CUDA_ERROR_INVALID_VALUE;
  // Allocations still out keep their memory; they just stop belonging to a pool.
  for (auto& [base, a] : d.allocations) {
    if (a.pool == pool) a.pool = nullptr;
  }
  for (auto& state : d.devices) {
    if (state.current_pool == pool) state.current_pool = state.default_pool.get();
  }
  d.pools.erase(it);
  return CUDA_SUCCESS;
}

namespace {
fakecuda::MemPool* LivePool(Driver& d, CUmemoryPool handle) {
  auto* pool = reinterpret_cast<fakecuda::MemPool*>(handle);
  if (d.pools.count(pool) != 0) return pool;
  for (auto& state : d.devices) {
    if (state.default_pool.get() == pool) return pool;
  }
  return nullptr;
}
}  // namespace

CUresult cuMemPoolSetAttribute(CUmemoryPool handle, CUmemPool_attribute attr, void* value) {
  FAKECUDA_ENTER();
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::MemPool* pool = LivePool(d, handle);
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  bool is_int = attr <= CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
  pool->attributes[attr] =
      is_int ? static_cast<uint64_t>(*static_cast<int*>(value)) : *static_cast<cuuint64_t*>(value);
  return CUDA_SUCCESS;
}

// Returning the pool's unused memory to the device: the fake pools hold none, so a live pool
// is all that is checked.
CUresult cuMemPoolTrimTo(CUmemoryPool handle, size_t min_bytes_to_keep) {
  FAKECUDA_ENTER();
  (void)min_bytes_to_keep;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  return LivePool(d, handle) != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool handle, CUmemPool_attribute attr, void* value) {
  FAKECUDA_ENTER();
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::MemPool* pool = LivePool(d, handle);
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t v = pool->attributes.count(attr) != 0 ? pool->attributes[attr] : 0;
  if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT || attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT) {
    v = pool->used_bytes;
  }
  if (attr <= CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES) {
    *static_cast<int*>(value) = static_cast<int>(v);
  } else {
    *static_cast<cuuint64_t*>(value) = v;
  }
  return CUDA_SUCCESS;
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool handle,
                                 CUstream stream) {
  FAKECUDA_ENTER();
  CUresult err = CUDA_SUCCESS;
  if (fakecuda::ResolveStream(stream, &err) == nullptr) return err;
  fakecuda::MemPool* pool = nullptr;
  {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    pool = LivePool(d, handle);
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  }
  // Memory is handed out at once; being available earlier than stream order is harmless.
  return fakecuda::AllocateDevice(dptr, bytesize, MemoryKind::kDevice, pool);
}

CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  FAKECUDA_ENTER();
  CUresult err = CUDA_SUCCESS;
  if (fakecuda::ResolveStream(stream, &err) == nullptr) return err;
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  fakecuda::MemPool* pool = nullptr;
  {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    pool = d.devices[ctx->device].current_pool;
  }
  return fakecuda::AllocateDevice(dptr, bytesize, MemoryKind::kDevice, pool);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream handle) {
  FAKECUDA_ENTER();
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<fakecuda::Stream> stream = fakecuda::ResolveStream(handle, &err);
  if (stream == nullptr) return err;
  {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.allocations.find(dptr);
    if (it == d.allocations.end() || fakecuda::IsHostKind(it->second.kind) ||
        it->second.kind == MemoryKind::kVmmMapping) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  // The memory stays valid for the work queued before the free.
  stream->worker.Enqueue([dptr] { fakecuda::FreeDevice(dptr); });
  return CUDA_SUCCESS;
}

// ---- Virtual memory management ----
//
// A reservation is an inaccessible anonymous mapping. A physical allocation is a memfd of its size,
// charged to the device. cuMemMap maps the memfd over the reserved range (so two mappings of one
// handle alias), still inaccessible; cuMemSetAccess makes it readable and writable.

CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags option) {
  FAKECUDA_ENTER();
  (void)option;
  if (granularity == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *granularity = fakecuda::kGranularity;
  return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags) {
  FAKECUDA_ENTER();
  if (handle == nullptr || prop == nullptr || flags != 0 || size == 0 ||
      size % fakecuda::kGranularity != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Driver& d = Driver::Get();
  int dev = prop->location.id;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || dev < 0 ||
      dev >= d.topology.device_count) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (!d.Charge(dev, size)) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  static std::atomic<uint64_t> next_serial{1};
  const uint64_t serial = next_serial.fetch_add(1);
  char name[64];
  snprintf(name, sizeof(name), "fakecuda-vmm-%u-%llu", static_cast<unsigned>(getpid()),
           static_cast<unsigned long long>(serial));
  int fd = memfd_create(name, MFD_CLOEXEC);
  std::lock_guard<std::mutex> lock(d.mu);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    if (fd >= 0) close(fd);
    d.Uncharge(dev, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  auto phys = std::make_unique<fakecuda::PhysicalMemory>();
  phys->device = dev;
  phys->size = size;
  phys->fd = fd;
  phys->serial = serial;
  phys->handle_types = prop->requestedHandleTypes;
  phys->prop = *prop;
  phys->prop.win32HandleMetaData = nullptr;
  *handle = reinterpret_cast<CUmemGenericAllocationHandle>(phys.get());
  d.physical[phys.get()] = std::move(phys);
  return CUDA_SUCCESS;
}

namespace {
// REQUIRES d.mu. Frees a released physical allocation once nothing maps it.
void MaybeFreePhysical(Driver& d, fakecuda::PhysicalMemory* phys) {
  if (!phys->released || phys->mappings > 0) return;
  if (!phys->imported && !phys->multicast) d.Uncharge(phys->device, phys->size);
  close(phys->fd);
  d.physical.erase(phys);
}
}  // namespace

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto* phys = reinterpret_cast<fakecuda::PhysicalMemory*>(handle);
  if (d.physical.count(phys) == 0) return CUDA_ERROR_INVALID_VALUE;
  if (phys->retains > 0) {  // balances a cuMemRetainAllocationHandle
    --phys->retains;
    return CUDA_SUCCESS;
  }
  if (phys->released) return CUDA_ERROR_INVALID_VALUE;
  phys->released = true;
  MaybeFreePhysical(d, phys);
  return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  FAKECUDA_ENTER();
  (void)alignment;
  (void)addr;  // a hint only
  if (ptr == nullptr || size == 0 || size % fakecuda::kGranularity != 0 || flags != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Over-reserve so the start can be aligned to the granularity.
  size_t span = size + fakecuda::kGranularity;
  void* raw = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t start = fakecuda::RoundUp(reinterpret_cast<uintptr_t>(raw), fakecuda::kGranularity);
  uintptr_t raw_start = reinterpret_cast<uintptr_t>(raw);
  if (start > raw_start) munmap(raw, start - raw_start);
  uintptr_t end = start + size;
  if (raw_start + span > end) munmap(reinterpret_cast<void*>(end), raw_start + span - end);
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  d.reservations[start] = size;
  *ptr = start;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.reservations.find(ptr);
  if (it == d.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  munmap(fakecuda::AsHost(ptr), size);
  d.reservations.erase(it);
  return CUDA_SUCCESS;
}

namespace {
// REQUIRES d.mu. True when [ptr, ptr+size) lies inside one reservation.
bool InReservation(Driver& d, CUdeviceptr ptr, size_t size) {
  auto it = d.reservations.upper_bound(ptr);
  if (it == d.reservations.begin()) return false;
  --it;
  return ptr >= it->first && ptr + size <= it->first + it->second;
}
}  // namespace

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto* phys = reinterpret_cast<fakecuda::PhysicalMemory*>(handle);
  if (flags != 0 || d.physical.count(phys) == 0 || phys->released || size == 0 ||
      offset + size > phys->size || !InReservation(d, ptr, size) ||
      d.FindAllocation(ptr) != nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  void* mapped = mmap(fakecuda::AsHost(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, phys->fd,
                      static_cast<off_t>(offset));
  if (mapped == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  ++phys->mappings;
  fakecuda::Allocation a;
  a.base = ptr;
  a.size = size;
  a.kind = MemoryKind::kVmmMapping;
  a.device = phys->device;
  a.ctx = d.CurrentContextLocked();
  a.physical = phys;
  a.vmm_offset = offset;
  d.allocations[ptr] = a;
  return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.allocations.find(ptr);
  if (it == d.allocations.end() || it->second.kind != MemoryKind::kVmmMapping ||
      it->second.size != size) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  fakecuda::PhysicalMemory* phys = it->second.physical;
  mmap(fakecuda::AsHost(ptr), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
       -1, 0);
  d.allocations.erase(it);
  --phys->mappings;
  MaybeFreePhysical(d, phys);
  return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  FAKECUDA_ENTER();
  if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  if (!InReservation(d, ptr, size)) return CUDA_ERROR_INVALID_VALUE;
  int prot = PROT_NONE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ) prot |= PROT_READ;
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) prot |= PROT_READ | PROT_WRITE;
  }
  if (mprotect(fakecuda::AsHost(ptr), size, prot) != 0) return CUDA_ERROR_INVALID_VALUE;
  unsigned flags = 0;
  for (size_t i = 0; i < count; ++i) flags |= static_cast<unsigned>(desc[i].flags);
  for (auto& [base, a] : d.allocations) {
    if (a.kind == MemoryKind::kVmmMapping && base < ptr + size && base + a.size > ptr) a.vmm_access = flags;
  }
  return CUDA_SUCCESS;
}

// The handle of the physical allocation mapped at `addr`; a reference to release once more.
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  FAKECUDA_ENTER();
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::Allocation* a = d.FindAllocation(reinterpret_cast<uintptr_t>(addr));
  if (a == nullptr || a->kind != MemoryKind::kVmmMapping) return CUDA_ERROR_INVALID_VALUE;
  if (a->physical->released) {
    a->physical->released = false;
  } else {
    ++a->physical->retains;
  }
  *handle = reinterpret_cast<CUmemGenericAllocationHandle>(a->physical);
  return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto* phys = reinterpret_cast<fakecuda::PhysicalMemory*>(handle);
  if (prop == nullptr || d.physical.count(phys) == 0 || phys->released) return CUDA_ERROR_INVALID_VALUE;
  *prop = phys->prop;  // as cuMemCreate was given it (imported handles: what follows)
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->requestedHandleTypes = phys->handle_types;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = phys->device;
  return CUDA_SUCCESS;
}

// A file descriptor of the memfd, for a handle created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.
CUresult cuMemExportToShareableHandle(void* shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType, unsigned long long flags) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto* phys = reinterpret_cast<fakecuda::PhysicalMemory*>(handle);
  if (shareableHandle == nullptr || flags != 0 || d.physical.count(phys) == 0 || phys->released ||
      handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
      (phys->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  int fd = fcntl(phys->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareableHandle) = fd;
  return CUDA_SUCCESS;
}

// A new handle on the memory behind an exported file descriptor (device 0; not charged again).
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* osHandle,
                                        CUmemAllocationHandleType shHandleType) {
  FAKECUDA_ENTER();
  if (handle == nullptr || shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  struct stat st;
  const int given = static_cast<int>(reinterpret_cast<intptr_t>(osHandle));
  if (fstat(given, &st) != 0 || st.st_size <= 0) return CUDA_ERROR_INVALID_VALUE;
  int fd = fcntl(given, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto phys = std::make_unique<fakecuda::PhysicalMemory>();
  phys->size = static_cast<size_t>(st.st_size);
  phys->fd = fd;
  phys->handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  phys->imported = true;
  *handle = reinterpret_cast<CUmemGenericAllocationHandle>(phys.get());
  d.physical[phys.get()] = std::move(phys);
  return CUDA_SUCCESS;
}

// ---- Pointer queries ----

CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  FAKECUDA_ENTER();
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::Allocation* a = d.FindAllocation(ptr);
  if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
  bool host = fakecuda::IsHostKind(a->kind);
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = reinterpret_cast<CUcontext>(a->ctx);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      *static_cast<CUdeviceptr*>(data) = ptr;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (!host && a->kind != MemoryKind::kManaged) return CUDA_ERROR_INVALID_VALUE;
      *static_cast<void**>(data) = fakecuda::AsHost(ptr);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *static_cast<int*>(data) = a->kind == MemoryKind::kManaged ? 1 : 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = a->device;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = a->base;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = a->size;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
      *static_cast<int*>(data) = 1;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      *static_cast<CUmemoryPool*>(data) = reinterpret_cast<CUmemoryPool>(a->pool);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
      *static_cast<int*>(data) = a->sync_memops ? 1 : 0;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// ---- Copies and memset (unified addressing: every copy is a memcpy) ----

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  FAKECUDA_ENTER();
  return fakecuda::RunSynchronous([=] { std::memmove(fakecuda::AsHost(dst), fakecuda::AsHost(src), bytes); });
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
  FAKECUDA_ENTER();
  return fakecuda::RunSynchronous([=] { std::memcpy(fakecuda::AsHost(dst), src, bytes); });
}

CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
  FAKECUDA_ENTER();
  return fakecuda::RunSynchronous([=] { std::memcpy(dst, fakecuda::AsHost(src), bytes); });
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  FAKECUDA_ENTER();
  return fakecuda::RunSynchronous([=] { std::memmove(fakecuda::AsHost(dst), fakecuda::AsHost(src), bytes); });
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  FAKECUDA_ENTER();
  return fakecuda::RunAsync(stream, [=] { std::memmove(fakecuda::AsHost(dst), fakecuda::AsHost(src), bytes); });
}

namespace {

// Stream capture: a copy on a capturing stream becomes a memcpy node of the capture graph (as the
// driver records it; nothing is copied now). False when the stream is not capturing.
bool CaptureCopy(CUstream handle, const CUDA_MEMCPY3D& c, CUresult* r) {
  std::shared_ptr<fakecuda::Stream> stream = fakecuda::ResolveStream(handle, r);
  if (stream == nullptr) return true;
  fakecuda::Driver& d = fakecuda::Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  if (stream->capture == nullptr) return false;
  auto node = std::make_unique<fakecuda::GraphNode>();
  node->kind = fakecuda::GraphNodeKind::kMemcpy;
  node->copy = c;
  node->deps = stream->capture_deps;
  stream->capture_deps = {node.get()};
  stream->capture->nodes.push_back(std::move(node));
  *r = CUDA_SUCCESS;
  return true;
}

CUDA_MEMCPY3D LinearCopy(CUmemorytype st, const void* sh, CUdeviceptr sd, CUmemorytype dt, void* dh,
                         CUdeviceptr dd, size_t bytes) {
  CUDA_MEMCPY3D c = {};
  c.srcMemoryType = st;
  c.srcHost = sh;
  c.srcDevice = sd;
  c.dstMemoryType = dt;
  c.dstHost = dh;
  c.dstDevice = dd;
  c.WidthInBytes = bytes;
  c.Height = 1;
  c.Depth = 1;
  return c;
}

}  // namespace

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream) {
  FAKECUDA_ENTER();
  CUresult r = CUDA_SUCCESS;
  if (CaptureCopy(stream, LinearCopy(CU_MEMORYTYPE_HOST, src, 0, CU_MEMORYTYPE_DEVICE, nullptr, dst, bytes), &r)) {
    return r;
  }
  return fakecuda::RunAsync(stream, [=] { std::memcpy(fakecuda::AsHost(dst), src, bytes); });
}

CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  FAKECUDA_ENTER();
  CUresult r = CUDA_SUCCESS;
  if (CaptureCopy(stream, LinearCopy(CU_MEMORYTYPE_DEVICE, nullptr, src, CU_MEMORYTYPE_HOST, dst, 0, bytes), &r)) {
    return r;
  }
  return fakecuda::RunAsync(stream, [=] { std::memcpy(dst, fakecuda::AsHost(src), bytes); });
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  FAKECUDA_ENTER();
  return fakecuda::RunAsync(stream, [=] { std::memmove(fakecuda::AsHost(dst), fakecuda::AsHost(src), bytes); });
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t count) {
  FAKECUDA_ENTER();
  return fakecuda::RunSynchronous([=] { std::memset(fakecuda::AsHost(dst), value, count); });
}

CUresult cuMemsetD16_v2(CUdeviceptr dst, unsigned short value, size_t count) {
  FAKECUDA_ENTER();
  return fakecuda::RunSynchronous([=] { fakecuda::Fill(dst, value, count); });
}

CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t count) {
  FAKECUDA_ENTER();
  return fakecuda::RunSynchronous([=] { fakecuda::Fill(dst, value, count); });
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream) {
  FAKECUDA_ENTER();
  return fakecuda::RunAsync(stream, [=] { std::memset(fakecuda::AsHost(dst), value, count); });
}

CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t count, CUstream stream) {
  FAKECUDA_ENTER();
  return fakecuda::RunAsync(stream, [=] { fakecuda::Fill(dst, value, count); });
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, CUstream stream) {
  FAKECUDA_ENTER();
  return fakecuda::RunAsync(stream, [=] { fakecuda::Fill(dst, value, count); });
}

// ---- 2D memsets: `height` rows of `width` elements, `pitch` bytes apart ----

namespace fakecuda {
namespace {
template <typename T>
void Fill2D(CUdeviceptr dst, size_t pitch, T value, size_t width, size_t height) {
  for (size_t row = 0; row < height; ++row) Fill(dst + row * pitch, value, width);
}
}  // namespace
}  // namespace fakecuda

CUresult cuMemsetD2D8_v2(CUdeviceptr dst, size_t pitch, unsigned char v, size_t w, size_t h) {
  FAKECUDA_ENTER();
  return fakecuda::RunSynchronous([=] { fakecuda::Fill2D(dst, pitch, v, w, h); });
}
CUresult cuMemsetD2D16_v2(CUdeviceptr dst, size_t pitch, unsigned short v, size_t w, size_t h) {
  FAKECUDA_ENTER();
  return fakecuda::RunSynchronous([=] { fakecuda::Fill2D(dst, pitch, v, w, h); });
}
CUresult cuMemsetD2D32_v2(CUdeviceptr dst, size_t pitch, unsigned int v, size_t w, size_t h) {
  FAKECUDA_ENTER();
  return fakecuda::RunSynchronous([=] { fakecuda::Fill2D(dst, pitch, v, w, h); });
}
CUresult cuMemsetD2D8Async(CUdeviceptr dst, size_t pitch, unsigned char v, size_t w, size_t h,
                           CUstream s) {
  FAKECUDA_ENTER();
  return fakecuda::RunAsync(s, [=] { fakecuda::Fill2D(dst, pitch, v, w, h); });
}
CUresult cuMemsetD2D16Async(CUdeviceptr dst, size_t pitch, unsigned short v, size_t w, size_t h,
                            CUstream s) {
  FAKECUDA_ENTER();
  return fakecuda::RunAsync(s, [=] { fakecuda::Fill2D(dst, pitch, v, w, h); });
}
CUresult cuMemsetD2D32Async(CUdeviceptr dst, size_t pitch, unsigned int v, size_t w, size_t h,
                            CUstream s) {
  FAKECUDA_ENTER();
  return fakecuda::RunAsync(s, [=] { fakecuda::Fill2D(dst, pitch, v, w, h); });
}
