// Fake driver: stream memory operations (wait and write values, batches of them), peer copies
// between contexts of one device and peer access, batched copies and managed-memory prefetches
// and discards, stream attribute copies and the device's current memory pool.
//
// A wait-value really waits: its stream's worker thread polls the word until the condition holds
// (so a write on another stream, or from the host, releases it), giving up after 30 s so that a
// test that never writes fails instead of hanging the process for ever.
#include <chrono>
#include <cstring>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "fake_driver.h"

using fakecuda::Driver;

namespace {

constexpr auto kWaitLimit = std::chrono::seconds(30);

void* AsHost(CUdeviceptr p) { return reinterpret_cast<void*>(p); }

// [p, p + n) lies inside one allocation of the driver, aligned to n (the words of memory ops).
bool AlignedWord(CUdeviceptr p, size_t n) {
  if (p % n != 0) return false;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::Allocation* a = d.FindAllocation(p);
  return a != nullptr && p + n <= a->base + a->size;
}

bool InsideAllocation(CUdeviceptr p, size_t n, bool managed_only) {
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::Allocation* a = d.FindAllocation(p);
  if (a == nullptr || n > a->size || p - a->base > a->size - n) return false;
  return !managed_only || a->kind == fakecuda::MemoryKind::kManaged;
}

template <typename T>
bool Satisfied(T now, T value, unsigned cond) {
  switch (cond) {
    case CU_STREAM_WAIT_VALUE_GEQ: return static_cast<typename std::make_signed<T>::type>(now - value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return now == value;
    case CU_STREAM_WAIT_VALUE_AND: return (now & value) != 0;
    default: return static_cast<T>(~(now | value)) != 0;  // NOR
  }
}

template <typename T>
void WaitWord(CUdeviceptr addr, T value, unsigned flags) {
  const auto give_up = std::chrono::steady_clock::now() + kWaitLimit;
  const unsigned cond = flags & 0x3;
  T* word = static_cast<T*>(AsHost(addr));
  while (!Satisfied<T>(__atomic_load_n(word, __ATOMIC_ACQUIRE), value, cond) &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

template <typename T>
void WriteWord(CUdeviceptr addr, T value) {
  __atomic_store_n(static_cast<T*>(AsHost(addr)), value, __ATOMIC_RELEASE);
}

constexpr unsigned kWaitFlags = 0x3 | CU_STREAM_WAIT_VALUE_FLUSH;

template <typename T>
CUresult WaitValue(CUstream s, CUdeviceptr addr, T value, unsigned flags) {
  if ((flags & ~kWaitFlags) != 0 || !AlignedWord(addr, sizeof(T))) return CUDA_ERROR_INVALID_VALUE;
  return fakecuda::RunAsync(s, [=] { WaitWord<T>(addr, value, flags); });
}

template <typename T>
CUresult WriteValue(CUstream s, CUdeviceptr addr, T value, unsigned flags) {
  if ((flags & ~1u) != 0 || !AlignedWord(addr, sizeof(T))) return CUDA_ERROR_INVALID_VALUE;
  return fakecuda::RunAsync(s, [=] { WriteWord<T>(addr, value); });
}

bool LiveContext(CUcontext c) {
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  return c != nullptr && d.contexts.count(reinterpret_cast<fakecuda::Context*>(c)) != 0;
}

// The checks the batched copies and prefetches share: a count, and attributes or locations given
// as (item, index of the first copy it applies to) lists that start at 0 and increase.
bool IndexList(size_t count, const size_t* idxs, size_t num) {
  if (num == 0 || num > count || idxs == nullptr || idxs[0] != 0) return false;
  for (size_t i = 1; i < num; ++i) {
    if (idxs[i] <= idxs[i - 1] || idxs[i] >= count) return false;
  }
  return true;
}

bool LegacyStream(CUstream s) { return s == nullptr || s == CU_STREAM_LEGACY; }

CUresult PrefetchOrDiscard(CUdeviceptr* dptrs, size_t* sizes, size_t count, CUmemLocation* locs,
                           size_t* loc_idxs, size_t num_locs, unsigned long long flags, CUstream s,
                           bool prefetch) {
  if (count == 0 || dptrs == nullptr || sizes == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (prefetch && (locs == nullptr || !IndexList(count, loc_idxs, num_locs))) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; prefetch && i < num_locs; ++i) {
    if (locs[i].type != CU_MEM_LOCATION_TYPE_DEVICE && locs[i].type != CU_MEM_LOCATION_TYPE_HOST) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (locs[i].type == CU_MEM_LOCATION_TYPE_DEVICE &&
        (locs[i].id < 0 || locs[i].id >= Driver::Get().topology.device_count)) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
  }
  for (size_t i = 0; i < count; ++i) {
    if (sizes[i] == 0 || !InsideAllocation(dptrs[i], sizes[i], true)) return CUDA_ERROR_INVALID_VALUE;
  }
  // Nothing migrates in host memory: in stream order, the data stays as it was.
  return fakecuda::RunAsync(s, [] {});
}

}  // namespace

CUresult cuStreamWaitValue32_v2(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  FAKECUDA_ENTER();
  return WaitValue<uint32_t>(s, addr, value, flags);
}
CUresult cuStreamWaitValue64_v2(CUstream s, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  FAKECUDA_ENTER();
  return WaitValue<uint64_t>(s, addr, value, flags);
}
CUresult cuStreamWriteValue32_v2(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  FAKECUDA_ENTER();
  return WriteValue<uint32_t>(s, addr, value, flags);
}
CUresult cuStreamWriteValue64_v2(CUstream s, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  FAKECUDA_ENTER();
  return WriteValue<uint64_t>(s, addr, value, flags);
}

// At most 256 operations per batch, as the driver reports (CU_DEVICE_ATTRIBUTE_... not modelled).
CUresult cuStreamBatchMemOp_v2(CUstream s, unsigned int count, CUstreamBatchMemOpParams* ops,
                               unsigned int flags) {
  FAKECUDA_ENTER();
  if (count == 0 || count > 256 || ops == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUstreamBatchMemOpParams> copy(ops, ops + count);
  for (const CUstreamBatchMemOpParams& op : copy) {
    switch (op.operation) {
      case CU_STREAM_MEM_OP_WAIT_VALUE_32:
      case CU_STREAM_MEM_OP_WAIT_VALUE_64:
        if ((op.waitValue.flags & ~kWaitFlags) != 0 ||
            !AlignedWord(op.waitValue.address, op.operation == CU_STREAM_MEM_OP_WAIT_VALUE_32 ? 4 : 8)) {
          return CUDA_ERROR_INVALID_VALUE;
        }
        break;
      case CU_STREAM_MEM_OP_WRITE_VALUE_32:
      case CU_STREAM_MEM_OP_WRITE_VALUE_64:
        if ((op.writeValue.flags & ~1u) != 0 ||
            !AlignedWord(op.writeValue.address, op.operation == CU_STREAM_MEM_OP_WRITE_VALUE_32 ? 4 : 8)) {
          return CUDA_ERROR_INVALID_VALUE;
        }
        break;
      case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
        if (op.flushRemoteWrites.flags != 0) return CUDA_ERROR_INVALID_VALUE;
        break;
      case CU_STREAM_MEM_OP_BARRIER:
        if (op.memoryBarrier.flags > CU_STREAM_MEMORY_BARRIER_TYPE_GPU) return CUDA_ERROR_INVALID_VALUE;
        break;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return fakecuda::RunAsync(s, [copy] {
    for (const CUstreamBatchMemOpParams& op : copy) {
      switch (op.operation) {
        case CU_STREAM_MEM_OP_WAIT_VALUE_32:
          WaitWord<uint32_t>(op.waitValue.address, op.waitValue.value, op.waitValue.flags);
          break;
        case CU_STREAM_MEM_OP_WAIT_VALUE_64:
          WaitWord<uint64_t>(op.waitValue.address, op.waitValue.value64, op.waitValue.flags);
          break;
        case CU_STREAM_MEM_OP_WRITE_VALUE_32:
          WriteWord<uint32_t>(op.writeValue.address, op.writeValue.value);
          break;
        case CU_STREAM_MEM_OP_WRITE_VALUE_64:
          WriteWord<uint64_t>(op.writeValue.address, op.writeValue.value64);
          break;
        default:
          __atomic_thread_fence(__ATOMIC_SEQ_CST);
          break;
      }
    }
  });
}

// ---- peer copies and peer access (one device: contexts of it share its memory)

CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                      size_t n) {
  FAKECUDA_ENTER();
  if (!LiveContext(dst_ctx) || !LiveContext(src_ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (n == 0) return CUDA_SUCCESS;
  if (!InsideAllocation(dst, n, false) || !InsideAllocation(src, n, false)) return CUDA_ERROR_INVALID_VALUE;
  return fakecuda::RunSynchronous([=] { std::memmove(AsHost(dst), AsHost(src), n); });
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                           size_t n, CUstream s) {
  FAKECUDA_ENTER();
  if (!LiveContext(dst_ctx) || !LiveContext(src_ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (n == 0) return CUDA_SUCCESS;
  if (!InsideAllocation(dst, n, false) || !InsideAllocation(src, n, false)) return CUDA_ERROR_INVALID_VALUE;
  return fakecuda::RunAsync(s, [=] { std::memmove(AsHost(dst), AsHost(src), n); });
}

// A 3D peer copy between contexts of the one device is the 3D copy of the same description.
namespace {
CUresult PeerAs3D(const CUDA_MEMCPY3D_PEER* p, CUDA_MEMCPY3D* c) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!LiveContext(p->srcContext) || !LiveContext(p->dstContext)) return CUDA_ERROR_INVALID_CONTEXT;
  *c = CUDA_MEMCPY3D{};
  c->srcXInBytes = p->srcXInBytes;
  c->srcY = p->srcY;
  c->srcZ = p->srcZ;
  c->srcLOD = p->srcLOD;
  c->srcMemoryType = p->srcMemoryType;
  c->srcHost = p->srcHost;
  c->srcDevice = p->srcDevice;
  c->srcArray = p->srcArray;
  c->srcPitch = p->srcPitch;
  c->srcHeight = p->srcHeight;
  c->dstXInBytes = p->dstXInBytes;
  c->dstY = p->dstY;
  c->dstZ = p->dstZ;
  c->dstLOD = p->dstLOD;
  c->dstMemoryType = p->dstMemoryType;
  c->dstHost = p->dstHost;
  c->dstDevice = p->dstDevice;
  c->dstArray = p->dstArray;
  c->dstPitch = p->dstPitch;
  c->dstHeight = p->dstHeight;
  c->WidthInBytes = p->WidthInBytes;
  c->Height = p->Height;
  c->Depth = p->Depth;
  return CUDA_SUCCESS;
}
}  // namespace

CUresult cuMemcpy3DPeer(const CUDA_MEMCPY3D_PEER* p) {
  FAKECUDA_ENTER();
  CUDA_MEMCPY3D c;
  if (CUresult r = PeerAs3D(p, &c); r != CUDA_SUCCESS) return r;
  return cuMemcpy3D_v2(&c);
}

CUresult cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER* p, CUstream s) {
  FAKECUDA_ENTER();
  CUDA_MEMCPY3D c;
  if (CUresult r = PeerAs3D(p, &c); r != CUDA_SUCCESS) return r;
  return cuMemcpy3DAsync_v2(&c, s);
}

// A device never reaches itself as a peer (cuDeviceCanAccessPeer answers 0), so a context of the
// same device cannot be enabled; nothing is ever enabled to disable.
CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  FAKECUDA_ENTER();
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!LiveContext(peer) || reinterpret_cast<fakecuda::Context*>(peer) == ctx) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  return CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuCtxDisablePeerAccess(CUcontext peer) {
  FAKECUDA_ENTER();
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  (void)ctx;
  if (!LiveContext(peer)) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
}

// ---- stream attributes, the current pool

CUresult cuStreamCopyAttributes(CUstream dst, CUstream src) {
  FAKECUDA_ENTER();
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<fakecuda::Stream> to = fakecuda::ResolveStream(dst, &err);
  if (to == nullptr) return err;
  std::shared_ptr<fakecuda::Stream> from = fakecuda::ResolveStream(src, &err);
  if (from == nullptr) return err;
  to->priority = from->priority;
  return CUDA_SUCCESS;
}

CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  if (dev < 0 || dev >= d.topology.device_count) return CUDA_ERROR_INVALID_DEVICE;
  auto* p = reinterpret_cast<fakecuda::MemPool*>(pool);
  if (p == d.devices[dev].default_pool.get()) {
    d.devices[dev].current_pool = p;
    return CUDA_SUCCESS;
  }
  auto it = d.pools.find(p);
  if (it == d.pools.end() || p->device != dev) return CUDA_ERROR_INVALID_VALUE;
  d.devices[dev].current_pool = p;
  return CUDA_SUCCESS;
}

// ---- batched copies and managed-memory prefetches and discards

CUresult cuMemcpyBatchAsync_v2(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                               CUmemcpyAttributes* attrs, size_t* attr_idxs, size_t num_attrs,
                               CUstream s) {
  FAKECUDA_ENTER();
  if (count == 0 || dsts == nullptr || srcs == nullptr || sizes == nullptr || attrs == nullptr ||
      !IndexList(count, attr_idxs, num_attrs) || LegacyStream(s)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (size_t i = 0; i < num_attrs; ++i) {
    if (attrs[i].srcAccessOrder < CU_MEMCPY_SRC_ACCESS_ORDER_STREAM ||
        attrs[i].srcAccessOrder > CU_MEMCPY_SRC_ACCESS_ORDER_ANY ||
        (attrs[i].flags & ~static_cast<unsigned>(CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  std::vector<std::tuple<CUdeviceptr, CUdeviceptr, size_t>> copies;
  for (size_t i = 0; i < count; ++i) {
    if (sizes[i] == 0) return CUDA_ERROR_INVALID_VALUE;
    copies.emplace_back(dsts[i], srcs[i], sizes[i]);
  }
  return fakecuda::RunAsync(s, [copies] {
    for (const auto& [dst, src, n] : copies) std::memmove(AsHost(dst), AsHost(src), n);
  });
}

CUresult cuMemPrefetchBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count, CUmemLocation* locs,
                                 size_t* loc_idxs, size_t num_locs, unsigned long long flags, CUstream s) {
  FAKECUDA_ENTER();
  return PrefetchOrDiscard(dptrs, sizes, count, locs, loc_idxs, num_locs, flags, s, true);
}

CUresult cuMemDiscardBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count, unsigned long long flags,
                                CUstream s) {
  FAKECUDA_ENTER();
  return PrefetchOrDiscard(dptrs, sizes, count, nullptr, nullptr, 0, flags, s, false);
}

CUresult cuMemDiscardAndPrefetchBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                           CUmemLocation* locs, size_t* loc_idxs, size_t num_locs,
                                           unsigned long long flags, CUstream s) {
  FAKECUDA_ENTER();
  return PrefetchOrDiscard(dptrs, sizes, count, locs, loc_idxs, num_locs, flags, s, true);
}

// ---- VMM queries, per-location pools and pool access

namespace {

// A device location of the fake (the only kind it serves here).
CUresult CheckDeviceLocation(const CUmemLocation* loc) {
  if (loc == nullptr || loc->type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  if (loc->id < 0 || loc->id >= Driver::Get().topology.device_count) return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

// REQUIRES d.mu.
fakecuda::MemPool* PoolOf(Driver& d, CUmemoryPool handle) {
  auto* pool = reinterpret_cast<fakecuda::MemPool*>(handle);
  if (d.pools.count(pool) != 0) return pool;
  for (auto& state : d.devices) {
    if (state.default_pool.get() == pool) return pool;
  }
  return nullptr;
}

// REQUIRES d.mu. The kVmmMapping allocation holding p, or null.
fakecuda::Allocation* Mapping(Driver& d, CUdeviceptr p) {
  fakecuda::Allocation* a = d.FindAllocation(p);
  return a != nullptr && a->kind == fakecuda::MemoryKind::kVmmMapping ? a : nullptr;
}

}  // namespace

CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  FAKECUDA_ENTER();
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDeviceLocation(location); r != CUDA_SUCCESS) return r;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::Allocation* a = Mapping(d, ptr);
  if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = a->vmm_access;
  return CUDA_SUCCESS;
}

// cuMemGetAllocationPropertiesFromHandle and cuMemRetainAllocationHandle: fake_memory.cc.

CUresult cuMemGetDefaultMemPool(CUmemoryPool* pool, CUmemLocation* location, CUmemAllocationType type) {
  FAKECUDA_ENTER();
  if (pool == nullptr || type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDeviceLocation(location); r != CUDA_SUCCESS) return r;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  *pool = reinterpret_cast<CUmemoryPool>(d.devices[location->id].default_pool.get());
  return CUDA_SUCCESS;
}

CUresult cuMemGetMemPool(CUmemoryPool* pool, CUmemLocation* location, CUmemAllocationType type) {
  FAKECUDA_ENTER();
  if (pool == nullptr || type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDeviceLocation(location); r != CUDA_SUCCESS) return r;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  *pool = reinterpret_cast<CUmemoryPool>(d.devices[location->id].current_pool);
  return CUDA_SUCCESS;
}

CUresult cuMemSetMemPool(CUmemLocation* location, CUmemAllocationType type, CUmemoryPool pool) {
  FAKECUDA_ENTER();
  if (type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDeviceLocation(location); r != CUDA_SUCCESS) return r;
  return cuDeviceSetMemPool(location->id, pool);
}

CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count) {
  FAKECUDA_ENTER();
  if (map == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    if (CUresult r = CheckDeviceLocation(&map[i].location); r != CUDA_SUCCESS) return r;
    if (map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
        map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::MemPool* p = PoolOf(d, pool);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    // The owner always reads and writes its pool's memory; only read-write may be asked of it.
    if (map[i].location.id == p->device) {
      if (map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return CUDA_ERROR_INVALID_DEVICE;
      continue;
    }
    p->access[map[i].location.id] = map[i].flags;
  }
  return CUDA_SUCCESS;
}

CUresult cuMemPoolGetAccess(CUmemAccess_flags* flags, CUmemoryPool pool, CUmemLocation* location) {
  FAKECUDA_ENTER();
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDeviceLocation(location); r != CUDA_SUCCESS) return r;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::MemPool* p = PoolOf(d, pool);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (location->id == p->device) {
    *flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  } else {
    auto it = p->access.find(location->id);
    *flags = it == p->access.end() ? CU_MEM_ACCESS_FLAGS_PROT_NONE : it->second;
  }
  return CUDA_SUCCESS;
}

// ---- settable pointer attributes, atomic capabilities

CUresult cuPointerSetAttribute(const void* value, CUpointer_attribute attribute, CUdeviceptr ptr) {
  FAKECUDA_ENTER();
  if (value == nullptr || attribute != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::Allocation* a = d.FindAllocation(ptr);
  if (a == nullptr || fakecuda::IsHostKind(a->kind)) return CUDA_ERROR_INVALID_VALUE;
  a->sync_memops = *static_cast<const unsigned*>(value) != 0;
  return CUDA_SUCCESS;
}

namespace {

CUresult DeviceOk(CUdevice dev) {
  return dev >= 0 && dev < Driver::Get().topology.device_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

// What the fake device can do atomically with the host or a peer: integer and bitwise operations
// on 32 and 64 bits, floating-point ones on 32 bits.
CUresult FakeAtomicCaps(unsigned* caps, const CUatomicOperation* ops, unsigned count) {
  if (caps == nullptr || ops == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < count; ++i) {
    if (ops[i] < 0 || ops[i] >= CU_ATOMIC_OPERATION_MAX) return CUDA_ERROR_INVALID_VALUE;
  }
  for (unsigned i = 0; i < count; ++i) {
    caps[i] = ops[i] >= CU_ATOMIC_OPERATION_FLOAT_ADD
                  ? CU_ATOMIC_CAPABILITY_SCALAR_32
                  : CU_ATOMIC_CAPABILITY_SIGNED | CU_ATOMIC_CAPABILITY_UNSIGNED |
                        CU_ATOMIC_CAPABILITY_SCALAR_32 | CU_ATOMIC_CAPABILITY_SCALAR_64;
  }
  return CUDA_SUCCESS;
}

}  // namespace

CUresult cuDeviceGetHostAtomicCapabilities(unsigned int* capabilities, const CUatomicOperation* operations,
                                           unsigned int count, CUdevice dev) {
  FAKECUDA_ENTER();
  if (CUresult r = DeviceOk(dev); r != CUDA_SUCCESS) return r;
  return FakeAtomicCaps(capabilities, operations, count);
}

CUresult cuDeviceGetP2PAtomicCapabilities(unsigned int* capabilities, const CUatomicOperation* operations,
                                          unsigned int count, CUdevice src, CUdevice dst) {
  FAKECUDA_ENTER();
  if (CUresult r = DeviceOk(src); r != CUDA_SUCCESS) return r;
  if (CUresult r = DeviceOk(dst); r != CUDA_SUCCESS) return r;
  if (src == dst) return CUDA_ERROR_INVALID_DEVICE;
  return FakeAtomicCaps(capabilities, operations, count);
}

// ---- 3D batched copies: all checked first, then each the 3D copy of its description

namespace {

size_t ArrayElement(CUarray a) {
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.arrays.find(reinterpret_cast<fakecuda::FakeArray*>(a));
  if (it == d.arrays.end()) return 0;
  const CUDA_ARRAY3D_DESCRIPTOR& desc = it->second->desc;
  size_t bytes = 4;
  switch (desc.Format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      bytes = 1;
      break;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      bytes = 2;
      break;
    default:
      break;
  }
  return bytes * desc.NumChannels;
}

bool Side3D(const CUmemcpy3DOperand& op, const CUextent3D& e, size_t elem, bool src, CUDA_MEMCPY3D* c) {
  if (op.type == CU_MEMCPY_OPERAND_TYPE_POINTER) {
    const size_t row = op.op.ptr.rowLength, layer = op.op.ptr.layerHeight;
    if ((row != 0 && row < e.width) || (layer != 0 && layer < e.height)) return false;
    (src ? c->srcMemoryType : c->dstMemoryType) = CU_MEMORYTYPE_UNIFIED;
    (src ? c->srcDevice : c->dstDevice) = op.op.ptr.ptr;
    (src ? c->srcPitch : c->dstPitch) = (row != 0 ? row : e.width) * elem;
    (src ? c->srcHeight : c->dstHeight) = layer != 0 ? layer : e.height;
    return true;
  }
  if (op.type != CU_MEMCPY_OPERAND_TYPE_ARRAY) return false;
  (src ? c->srcMemoryType : c->dstMemoryType) = CU_MEMORYTYPE_ARRAY;
  (src ? c->srcArray : c->dstArray) = op.op.array.array;
  (src ? c->srcXInBytes : c->dstXInBytes) = op.op.array.offset.x * elem;
  (src ? c->srcY : c->dstY) = op.op.array.offset.y;
  (src ? c->srcZ : c->dstZ) = op.op.array.offset.z;
  return true;
}

CUresult Batch3D(size_t n, CUDA_MEMCPY3D_BATCH_OP* ops, unsigned long long flags, size_t* fail_idx, CUstream s) {
  if (fail_idx != nullptr) *fail_idx = SIZE_MAX;
  if (n == 0 || ops == nullptr || flags != 0 || LegacyStream(s)) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUDA_MEMCPY3D> copies(n);
  for (size_t i = 0; i < n; ++i) {
    const CUDA_MEMCPY3D_BATCH_OP& op = ops[i];
    if (op.extent.width == 0 || op.extent.height == 0 || op.extent.depth == 0 ||
        op.srcAccessOrder < CU_MEMCPY_SRC_ACCESS_ORDER_STREAM || op.srcAccessOrder > CU_MEMCPY_SRC_ACCESS_ORDER_ANY ||
        (op.flags & ~static_cast<unsigned>(CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const bool sa = op.src.type == CU_MEMCPY_OPERAND_TYPE_ARRAY, da = op.dst.type == CU_MEMCPY_OPERAND_TYPE_ARRAY;
    const size_t es = sa ? ArrayElement(op.src.op.array.array) : 1;
    const size_t ed = da ? ArrayElement(op.dst.op.array.array) : 1;
    if (es == 0 || ed == 0 || (sa && da && es != ed)) return CUDA_ERROR_INVALID_VALUE;
    const size_t elem = sa ? es : ed;
    CUDA_MEMCPY3D& c = copies[i];
    c = CUDA_MEMCPY3D{};
    if (!Side3D(op.src, op.extent, elem, true, &c) || !Side3D(op.dst, op.extent, elem, false, &c)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    c.WidthInBytes = op.extent.width * elem;
    c.Height = op.extent.height;
    c.Depth = op.extent.depth;
  }
  for (size_t i = 0; i < n; ++i) {
    if (CUresult r = cuMemcpy3DAsync_v2(&copies[i], s); r != CUDA_SUCCESS) {
      if (fail_idx != nullptr) *fail_idx = i;
      return r;
    }
  }
  return CUDA_SUCCESS;
}

}  // namespace

CUresult cuMemcpy3DBatchAsync_v2(size_t n, CUDA_MEMCPY3D_BATCH_OP* ops, unsigned long long flags, CUstream s) {
  FAKECUDA_ENTER();
  return Batch3D(n, ops, flags, nullptr, s);
}

CUresult cuMemcpy3DBatchAsync(size_t n, CUDA_MEMCPY3D_BATCH_OP* ops, size_t* fail_idx, unsigned long long flags,
                              CUstream s) {
  FAKECUDA_ENTER();
  return Batch3D(n, ops, flags, fail_idx, s);
}
