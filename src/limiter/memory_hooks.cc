// VRAM quota: every device-memory allocation path reserves its rounded size in the vGPU's
// shared ledger before the real allocation and rolls back when the driver fails; every free
// returns what its allocation charged. Memory reports (cuMemGetInfo, cuDeviceTotalMem) show the
// slice. A process without a vGPU passes straight through.
#include <atomic>
#include <cstdint>

#include "limiter/allocation_table.h"
#include "limiter/export_support.h"
#include "limiter/guest_log.h"
#include "limiter/runtime.h"
#include "limiter/tier_pools.h"
#include "limiter/tier_vmm.h"
#include "limiter/tiering.h"

namespace tf::limiter {
namespace {

std::atomic<bool> g_oom_logged{false};

// Reserves `bytes` (already rounded) for this process; false when over quota.
bool Reserve(Binding* b, uint64_t bytes) {
  RegionError e = b->region.Reserve(b->slot, bytes);
  if (e == RegionError::kOk) return true;
  if (!g_oom_logged.exchange(true)) {
    GuestLog("vGPU '%s': allocation of %llu MiB refused (%s): %llu of %llu MiB in use",
             b->vgpu_id, static_cast<unsigned long long>(bytes >> 20), RegionErrorName(e),
             static_cast<unsigned long long>(b->region.Used(b->vgpu) >> 20),
             static_cast<unsigned long long>(b->region.Limit(b->vgpu) >> 20));
  }
  return false;
}

void Release(Binding* b, uint64_t bytes) {
  if (bytes != 0) b->region.Release(b->slot, bytes);
}

// The common shape of an allocation: reserve, call, roll back on failure, record on success.
template <typename Call>
CUresult Charged(uint64_t charge, AllocKind kind, Call&& call) {
  Binding* b = Bound();
  if (b == nullptr) {
    if (BindingFailed()) return CUDA_ERROR_OPERATING_SYSTEM;
    uint64_t ignored = 0;
    return call(&ignored);
  }
  if (!Reserve(b, charge)) return CUDA_ERROR_OUT_OF_MEMORY;
  uint64_t key = 0;
  CUresult r = call(&key);
  if (r != CUDA_SUCCESS) {
    Release(b, charge);
    return r;
  }
  AllocationTable::Instance().Insert(kind, key, charge);
  return r;
}

// Returns the charge of a freed object after the real free succeeded.
void Uncharge(AllocKind kind, uint64_t key) {
  Binding* b = Bound();
  if (b == nullptr) return;
  Release(b, AllocationTable::Instance().Erase(kind, key));
}

// A freed device pointer: a plain or stream-ordered allocation, or one made during a capture.
void UnchargePointer(CUdeviceptr dptr) {
  Binding* b = Bound();
  if (b == nullptr) return;
  AllocationTable& t = AllocationTable::Instance();
  uint64_t charge = t.Erase(AllocKind::kDevicePtr, dptr);
  if (charge == 0) charge = t.Erase(AllocKind::kGraphPtr, dptr);
  Release(b, charge);
}

uint64_t FormatBytes(CUarray_format f) {
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
      return 4;
    default:
      return 16;  // unknown or block-compressed formats: charge the widest element
  }
}

uint64_t ArrayBytes(size_t w, size_t h, size_t d, unsigned channels, CUarray_format f) {
  uint64_t bytes = static_cast<uint64_t>(w) * (h ? h : 1) * (d ? d : 1);
  return bytes * (channels ? channels : 1) * FormatBytes(f);
}

}  // namespace

CUresult Hook_cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  TF_REAL_OR_MISSING(cuMemAlloc_v2)
  return Charged(RoundToGranule(bytesize), AllocKind::kDevicePtr, [&](uint64_t* key) {
    CUresult r = g_tiering && bytesize != 0 ? Tiering::Instance().Allocate(dptr, bytesize)
                                            : fn(dptr, bytesize);
    // VRAM held by idle tiered tenants of the GPU is freed for a tenant without tiering too.
    if (r == CUDA_ERROR_OUT_OF_MEMORY && !g_tiering) {
      r = RetryWithEviction(r, [&] { return fn(dptr, bytesize); });
    }
    if (r == CUDA_SUCCESS) *key = *dptr;
    return r;
  });
}

CUresult Hook_cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes,
                                 size_t Height, unsigned int ElementSizeBytes) {
  TF_REAL_OR_MISSING(cuMemAllocPitch_v2)
  // The pitch is chosen by the driver; charge an upper bound (rows padded to 512 bytes).
  uint64_t row = (static_cast<uint64_t>(WidthInBytes) + 511) / 512 * 512;
  // With tiering the rows are a movable range of our own, padded to those 512 bytes (a multiple of
  // every texture pitch alignment), checked as the driver checks them.
  if (g_tiering && row < (1ull << 31)) {
    if (dptr == nullptr || pPitch == nullptr || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    return Charged(RoundToGranule(row * Height), AllocKind::kDevicePtr, [&](uint64_t* key) {
      CUresult r = Tiering::Instance().Allocate(dptr, row * Height);
      if (r == CUDA_SUCCESS) {
        *pPitch = row;
        *key = *dptr;
      }
      return r;
    });
  }
  return Charged(RoundToGranule(row * Height), AllocKind::kDevicePtr, [&](uint64_t* key) {
    CUresult r = fn(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (r == CUDA_SUCCESS) *key = *dptr;
    return r;
  });
}

CUresult Hook_cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  TF_REAL_OR_MISSING(cuMemAllocManaged)
  return Charged(RoundToGranule(bytesize), AllocKind::kDevicePtr, [&](uint64_t* key) {
    CUresult r = fn(dptr, bytesize, flags);
    if (r == CUDA_SUCCESS) *key = *dptr;
    return r;
  });
}

}  // namespace tf::limiter

// For the remote worker's sessions (src/worker/session_host_memory.cc), which serve a client's
// cuMemAllocManaged as pinned host memory at the client's address: the bytes count against the
// vGPU's VRAM quota as a local cuMemAllocManaged does. *charged is 0 when this process has no
// vGPU (nothing is counted); CUDA_ERROR_OUT_OF_MEMORY over the quota.
extern "C" TF_EXPORT CUresult tfusion_limiter_charge_vram(unsigned long long bytes, int* charged) {
  using namespace tf::limiter;
  *charged = 0;
  EnsureInit();
  Binding* b = Bound();
  if (b == nullptr) return BindingFailed() ? CUDA_ERROR_OPERATING_SYSTEM : CUDA_SUCCESS;
  if (!Reserve(b, RoundToGranule(bytes))) return CUDA_ERROR_OUT_OF_MEMORY;
  *charged = 1;
  return CUDA_SUCCESS;
}

// Gives back what tfusion_limiter_charge_vram charged for `bytes`.
extern "C" TF_EXPORT void tfusion_limiter_release_vram(unsigned long long bytes) {
  using namespace tf::limiter;
  if (Binding* b = Bound()) Release(b, RoundToGranule(bytes));
}

namespace tf::limiter {

CUresult Hook_cuMemFree_v2(CUdeviceptr dptr) {
  TF_REAL_OR_MISSING(cuMemFree_v2)
  CUresult r = CUDA_SUCCESS;
  if (g_tiering && StreamOrderedPools::Instance().FreeNow(dptr, &r)) return r;  // charged by the pool
  if (!g_tiering || !Tiering::Instance().Free(dptr, &r)) r = fn(dptr);
  if (r == CUDA_SUCCESS) UnchargePointer(dptr);
  return r;
}

// ---- stream-ordered allocation (default and explicit pools) ----
// With tiering, pools without export handle types are served from movable ranges by
// StreamOrderedPools, which charges the quota itself; everything else goes to the driver's pools.

// With tiering, one made during a capture is charged as a graph allocation (kGraphPtr): the tier
// report counts graph memory by what the driver holds, not by these charges.
#define TF_ASYNC_ALLOC(name, pool, per_thread, ...)                                  \
  TF_REAL_OR_MISSING(name)                                                          \
  bool captured = false;                                                            \
  if (g_tiering) {                                                                  \
    CUresult served = CUDA_SUCCESS;                                                 \
    if (StreamOrderedPools::Instance().Allocate(dptr, bytesize, pool, hStream, per_thread, &served, \
                                                &captured))                         \
      return served;                                                                \
  }                                                                                 \
  const AllocKind kind = captured ? AllocKind::kGraphPtr : AllocKind::kDevicePtr;   \
  return Charged(RoundToGranule(bytesize), kind, [&](uint64_t* key) {               \
    CUresult r = fn(__VA_ARGS__);                                                   \
    if (r == CUDA_SUCCESS) *key = *dptr;                                            \
    return r;                                                                       \
  });

CUresult Hook_cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  TF_ASYNC_ALLOC(cuMemAllocAsync, nullptr, false, dptr, bytesize, hStream)
}
CUresult Hook_cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  TF_ASYNC_ALLOC(cuMemAllocAsync_ptsz, nullptr, true, dptr, bytesize, hStream)
}
CUresult Hook_cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream) {
  if (g_tiering && pool == nullptr) return CUDA_ERROR_INVALID_VALUE;  // nullptr: "the current pool" to us
  TF_ASYNC_ALLOC(cuMemAllocFromPoolAsync, pool, false, dptr, bytesize, pool, hStream)
}
CUresult Hook_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                           CUstream hStream) {
  if (g_tiering && pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_ASYNC_ALLOC(cuMemAllocFromPoolAsync_ptsz, pool, true, dptr, bytesize, pool, hStream)
}
#undef TF_ASYNC_ALLOC

namespace {
template <typename Fn>
CUresult FreeAsync(Fn fn, CUdeviceptr dptr, CUstream hStream, bool per_thread) {
  CUresult r = CUDA_SUCCESS;
  if (g_tiering && StreamOrderedPools::Instance().FreeAsync(dptr, hStream, per_thread, &r)) return r;
  r = fn(dptr, hStream);
  if (r == CUDA_SUCCESS) UnchargePointer(dptr);
  return r;
}
}  // namespace

CUresult Hook_cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  TF_REAL_OR_MISSING(cuMemFreeAsync)
  return FreeAsync(fn, dptr, hStream, false);
}

CUresult Hook_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  TF_REAL_OR_MISSING(cuMemFreeAsync_ptsz)
  return FreeAsync(fn, dptr, hStream, true);
}

// The pool calls that must agree with what StreamOrderedPools serves: without tiering, or for a
// pool it does not serve, they are the driver's.

CUresult Hook_cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* poolProps) {
  TF_REAL_OR_MISSING(cuMemPoolCreate)
  CUresult r = fn(pool, poolProps);
  if (r == CUDA_SUCCESS && g_tiering) StreamOrderedPools::Instance().Created(*pool, poolProps);
  return r;
}

CUresult Hook_cuMemPoolDestroy(CUmemoryPool pool) {
  TF_REAL_OR_MISSING(cuMemPoolDestroy)
  CUresult r = fn(pool);
  if (r == CUDA_SUCCESS && g_tiering) StreamOrderedPools::Instance().Destroyed(pool);
  return r;
}

CUresult Hook_cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  TF_REAL_OR_MISSING(cuMemPoolGetAttribute)
  CUresult r = CUDA_SUCCESS;
  if (g_tiering && StreamOrderedPools::Instance().GetAttribute(pool, attr, value, &r)) return r;
  return fn(pool, attr, value);
}

CUresult Hook_cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  TF_REAL_OR_MISSING(cuMemPoolSetAttribute)
  CUresult r = fn(pool, attr, value);
  if (r == CUDA_SUCCESS && g_tiering) StreamOrderedPools::Instance().AttributeSet(pool, attr);
  return r;
}

CUresult Hook_cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  TF_REAL_OR_MISSING(cuMemPoolTrimTo)
  CUresult r = CUDA_SUCCESS;
  if (g_tiering && StreamOrderedPools::Instance().TrimTo(pool, minBytesToKeep, &r)) return r;
  return fn(pool, minBytesToKeep);
}

CUresult Hook_cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  TF_REAL_OR_MISSING(cuPointerGetAttribute)
  CUmemoryPool pool = nullptr;
  if (g_tiering && attribute == CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE && data != nullptr &&
      StreamOrderedPools::Instance().PoolOf(ptr, &pool)) {
    *static_cast<CUmemoryPool*>(data) = pool;
    return CUDA_SUCCESS;
  }
  return fn(data, attribute, ptr);
}

// ---- virtual memory management (PyTorch expandable segments, NCCL) ----
// With tiering the handles are TenantVmm's values (tier_vmm.h); the rest of the family is in
// vmm_hooks.cc.

CUresult Hook_cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                          const CUmemAllocationProp* prop, unsigned long long flags) {
  TF_REAL_OR_MISSING(cuMemCreate)
  auto create = [&] {
    return g_tiering ? TenantVmm::Instance().Create(handle, size, prop, flags, fn) : fn(handle, size, prop, flags);
  };
  // Host-located physical memory (NCCL's cuMem host buffers) is not VRAM.
  if (prop == nullptr || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return create();
  return Charged(RoundToGranule(size), AllocKind::kVmmHandle, [&](uint64_t* key) {
    CUresult r = create();
    if (r == CUDA_SUCCESS) *key = *handle;
    return r;
  });
}

CUresult Hook_cuMemRelease(CUmemGenericAllocationHandle handle) {
  TF_REAL_OR_MISSING(cuMemRelease)
  bool last = false;
  CUresult r = CUDA_SUCCESS;
  if (g_tiering && TenantVmm::Instance().Release(handle, &last, &r)) {
    if (r == CUDA_SUCCESS && last) Uncharge(AllocKind::kVmmHandle, handle);
    return r;
  }
  r = fn(handle);
  if (r == CUDA_SUCCESS) Uncharge(AllocKind::kVmmHandle, handle);
  return r;
}

// ---- arrays and mipmapped arrays ----

CUresult Hook_cuArrayCreate_v2(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR* d) {
  TF_REAL_OR_MISSING(cuArrayCreate_v2)
  uint64_t bytes = d ? ArrayBytes(d->Width, d->Height, 1, d->NumChannels, d->Format) : 0;
  return Charged(RoundToGranule(bytes), AllocKind::kArray, [&](uint64_t* key) {
    CUresult r = fn(pHandle, d);
    if (r == CUDA_SUCCESS) *key = reinterpret_cast<uint64_t>(*pHandle);
    return r;
  });
}

CUresult Hook_cuArray3DCreate_v2(CUarray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* d) {
  TF_REAL_OR_MISSING(cuArray3DCreate_v2)
  uint64_t bytes = d ? ArrayBytes(d->Width, d->Height, d->Depth, d->NumChannels, d->Format) : 0;
  return Charged(RoundToGranule(bytes), AllocKind::kArray, [&](uint64_t* key) {
    CUresult r = fn(pHandle, d);
    if (r == CUDA_SUCCESS) *key = reinterpret_cast<uint64_t>(*pHandle);
    return r;
  });
}

CUresult Hook_cuArrayDestroy(CUarray hArray) {
  TF_REAL_OR_MISSING(cuArrayDestroy)
  CUresult r = fn(hArray);
  if (r == CUDA_SUCCESS) Uncharge(AllocKind::kArray, reinterpret_cast<uint64_t>(hArray));
  return r;
}

CUresult Hook_cuMipmappedArrayCreate(CUmipmappedArray* pHandle, const CUDA_ARRAY3D_DESCRIPTOR* d,
                                     unsigned int numMipmapLevels) {
  TF_REAL_OR_MISSING(cuMipmappedArrayCreate)
  // Each level halves every extent (never below 1).
  uint64_t bytes = 0;
  for (unsigned l = 0; d != nullptr && l < numMipmapLevels && l < 32; ++l) {
    auto level = [l](size_t e) -> size_t { return e == 0 ? 0 : ((e >> l) ? (e >> l) : 1); };
    bytes += ArrayBytes(level(d->Width), level(d->Height), level(d->Depth), d->NumChannels, d->Format);
  }
  return Charged(RoundToGranule(bytes), AllocKind::kMipmappedArray, [&](uint64_t* key) {
    CUresult r = fn(pHandle, d, numMipmapLevels);
    if (r == CUDA_SUCCESS) *key = reinterpret_cast<uint64_t>(*pHandle);
    return r;
  });
}

CUresult Hook_cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
  TF_REAL_OR_MISSING(cuMipmappedArrayDestroy)
  CUresult r = fn(hMipmappedArray);
  if (r == CUDA_SUCCESS) {
    Uncharge(AllocKind::kMipmappedArray, reinterpret_cast<uint64_t>(hMipmappedArray));
  }
  return r;
}

// ---- graph memory nodes: charged from creation until the node or its graph is destroyed ----

namespace {
template <typename Call>
CUresult ChargedGraphNode(CUgraph graph, uint64_t bytes, CUgraphNode* node, Call&& call) {
  CUresult r = Charged(RoundToGranule(bytes), AllocKind::kGraphNode, [&](uint64_t* key) {
    CUresult rr = call();
    if (rr == CUDA_SUCCESS) *key = reinterpret_cast<uint64_t>(*node);
    return rr;
  });
  if (r == CUDA_SUCCESS && Bound() != nullptr) {
    AllocationTable::Instance().AttachToGraph(reinterpret_cast<uint64_t>(graph),
                                              reinterpret_cast<uint64_t>(*node));
  }
  return r;
}
}  // namespace

CUresult Hook_cuGraphAddMemAllocNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                                     const CUgraphNode* dependencies, size_t numDependencies,
                                     CUDA_MEM_ALLOC_NODE_PARAMS* nodeParams) {
  TF_REAL_OR_MISSING(cuGraphAddMemAllocNode)
  if (nodeParams == nullptr || phGraphNode == nullptr) {
    return fn(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
  }
  return ChargedGraphNode(hGraph, nodeParams->bytesize, phGraphNode, [&] {
    return fn(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
  });
}

CUresult Hook_cuGraphAddNode(CUgraphNode* phGraphNode, CUgraph hGraph,
                             const CUgraphNode* dependencies, size_t numDependencies,
                             CUgraphNodeParams* nodeParams) {
  TF_REAL_OR_MISSING(cuGraphAddNode)
  if (nodeParams == nullptr || phGraphNode == nullptr ||
      nodeParams->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
    return fn(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
  }
  return ChargedGraphNode(hGraph, nodeParams->alloc.bytesize, phGraphNode, [&] {
    return fn(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
  });
}

CUresult Hook_cuGraphAddNode_v2(CUgraphNode* phGraphNode, CUgraph hGraph,
                                const CUgraphNode* dependencies, const CUgraphEdgeData* dependencyData,
                                size_t numDependencies, CUgraphNodeParams* nodeParams) {
  TF_REAL_OR_MISSING(cuGraphAddNode_v2)
  if (nodeParams == nullptr || phGraphNode == nullptr ||
      nodeParams->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
    return fn(phGraphNode, hGraph, dependencies, dependencyData, numDependencies, nodeParams);
  }
  return ChargedGraphNode(hGraph, nodeParams->alloc.bytesize, phGraphNode, [&] {
    return fn(phGraphNode, hGraph, dependencies, dependencyData, numDependencies, nodeParams);
  });
}

CUresult Hook_cuGraphDestroyNode(CUgraphNode hNode) {
  TF_REAL_OR_MISSING(cuGraphDestroyNode)
  CUresult r = fn(hNode);
  if (r == CUDA_SUCCESS) Uncharge(AllocKind::kGraphNode, reinterpret_cast<uint64_t>(hNode));
  return r;
}

CUresult Hook_cuGraphDestroy(CUgraph hGraph) {
  TF_REAL_OR_MISSING(cuGraphDestroy)
  CUresult r = fn(hGraph);
  if (r == CUDA_SUCCESS) {
    if (Binding* b = Bound()) {
      Release(b, AllocationTable::Instance().EraseGraph(reinterpret_cast<uint64_t>(hGraph)));
    }
  }
  return r;
}

// ---- what the tenant is told about memory: the slice, consistently with NVML ----

CUresult Hook_cuMemGetInfo_v2(size_t* free, size_t* total) {
  TF_REAL_OR_MISSING(cuMemGetInfo_v2)
  size_t real_free = 0, real_total = 0;
  CUresult r = fn(&real_free, &real_total);
  Binding* b = Bound();
  if (r != CUDA_SUCCESS || b == nullptr) {
    if (free) *free = real_free;
    if (total) *total = real_total;
    return r;
  }
  uint64_t limit = b->region.Limit(b->vgpu);
  uint64_t used = b->region.Used(b->vgpu);
  uint64_t slice_free = used >= limit ? 0 : limit - used;
  if (slice_free > real_free) slice_free = real_free;
  if (free) *free = slice_free;
  if (total) *total = limit;
  return r;
}

CUresult Hook_cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  TF_REAL_OR_MISSING(cuDeviceTotalMem_v2)
  CUresult r = fn(bytes, dev);
  if (r == CUDA_SUCCESS && bytes != nullptr) {
    if (Binding* b = Bound()) *bytes = b->region.Limit(b->vgpu);
  }
  return r;
}

}  // namespace tf::limiter
