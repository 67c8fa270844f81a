// The tenant's own virtual memory management under VRAM tiering (local mode and remote sessions):
// physical allocations a tenant makes itself with cuMemCreate and maps into its own reservations
// (PyTorch's expandable segments, NCCL) become movable.
//
// With tiering on, the tenant never sees the driver's CUmemGenericAllocationHandle values: every
// cuMemCreate and cuMemImportFromShareableHandle hands out a value of our own (stable for the
// handle's life) that this book maps to the current driver handle, and every entry point that
// takes or returns a handle translates it. The book records what a swap-in needs to rebuild the
// tenant's view exactly: the allocation's properties, each mapping (address, size, offset into the
// handle) and the access descriptors the tenant set on it (cuMemSetAccess, replayed in order).
//
// A movable handle is a range of Tiering's table, keyed by our handle value. Swap-out copies its
// contents through a tenant mapping that covers all of it with read-write access for its device,
// else through a temporary mapping of our own; then unmaps every mapping and releases the driver's
// handle. Swap-in creates a new physical allocation with the same properties, maps it at the same
// addresses and offsets, replays the access descriptors and copies the contents back.
//
// What stays resident (fixed, counted as such in the region): handles exported to a shareable
// handle or as a dma-buf (another process or device may hold it), imported ones, handles bound to a
// multicast object or mapped into a sparse array, handles created with flags or a usage (tile pool,
// hardware decompression), or without a current context, and with TFUSION_TIER_FIX_RDMA=1 those
// created GPUDirect RDMA capable (a NIC may hold a registration of their pages through
// nvidia-peermem, which we cannot see). Host-located handles are not VRAM and never move.
//
// Calls that change the GPU's page tables (cuMemMap, cuMemUnmap, cuMemSetAccess, cuMemAddressFree
// of a range with mappings, exports, multicast and sparse bindings) bring a swapped tenant back
// first; cuMemCreate (new resident memory), cuMemRelease, cuMemRetainAllocationHandle,
// cuMemGetAllocationPropertiesFromHandle and cuMemGetAccess do not.
//
// Thread safety: every entry takes the tier mutex (TierLock); the *Locked methods require it.
// Each entry that returns false did nothing: the caller forwards the call to the driver as it is.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tf_driver_api.h"

namespace tf::limiter {

class TenantVmm {
 public:
  static TenantVmm& Instance();

  // ---- the hooks (g_tiering only); `fn` is the driver's entry point ----
  // cuMemCreate: *handle receives our value. Device memory the driver refuses for lack of room
  // first evicts colder tenants.
  CUresult Create(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                  unsigned long long flags, decltype(&cuMemCreate) fn);
  // cuMemRelease: *last is true when this was the tenant's last reference (the quota's charge
  // goes back then).
  bool Release(CUmemGenericAllocationHandle handle, bool* last, CUresult* result);
  bool Map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
           unsigned long long flags, decltype(&cuMemMap) fn, CUresult* result);
  bool Unmap(CUdeviceptr ptr, size_t size, decltype(&cuMemUnmap) fn, CUresult* result);
  bool SetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count,
                 decltype(&cuMemSetAccess) fn, CUresult* result);
  bool GetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr,
                 CUresult* result);
  bool Retain(CUmemGenericAllocationHandle* handle, void* addr, CUresult* result);
  bool GetProperties(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle,
                     decltype(&cuMemGetAllocationPropertiesFromHandle) fn, CUresult* result);
  bool Export(void* shareable, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type,
              unsigned long long flags, decltype(&cuMemExportToShareableHandle) fn, CUresult* result);
  CUresult Import(CUmemGenericAllocationHandle* handle, void* os_handle, CUmemAllocationHandleType type,
                  decltype(&cuMemImportFromShareableHandle) fn);
  bool MulticastBindMem(CUmemGenericAllocationHandle mc, size_t mc_offset, CUmemGenericAllocationHandle handle,
                        size_t mem_offset, size_t size, unsigned long long flags,
                        decltype(&cuMulticastBindMem) fn, CUresult* result);
  // Calls that reach the tenant's mappings by address: the handles mapped in [ptr, ptr+size) stay
  // fixed from then on (bind, dma-buf export), or the mappings go (address free).
  bool MulticastBindAddr(CUmemGenericAllocationHandle mc, size_t mc_offset, CUdeviceptr ptr, size_t size,
                         unsigned long long flags, decltype(&cuMulticastBindAddr) fn, CUresult* result);
  bool HandleForAddressRange(void* handle, CUdeviceptr ptr, size_t size, CUmemRangeHandleType type,
                             unsigned long long flags, decltype(&cuMemGetHandleForAddressRange) fn,
                             CUresult* result);
  bool AddressFree(CUdeviceptr ptr, size_t size, decltype(&cuMemAddressFree) fn, CUresult* result);
  // cuMemMapArrayAsync(_ptsz): generic handles in the list are translated and stay fixed.
  bool MapArray(CUarrayMapInfo* list, unsigned count, CUstream stream,
                CUresult (*fn)(CUarrayMapInfo*, unsigned, CUstream), CUresult* result);

  // ---- for Tiering (tiering.cc), REQUIRES the tier mutex; `key` is our handle value ----
  // A new physical allocation for a swapped handle, mapped and accessible as the tenant left it.
  CUresult RestoreLocked(uint64_t key);
  // Unmaps every mapping of the handle and releases the driver's handle (after its copy).
  void ReleasePhysicalLocked(uint64_t key);
  // Where the handle's whole contents can be read and written: a tenant mapping, or a temporary
  // mapping of ours (released by ReleasePhysicalLocked or DropWindowsLocked).
  CUresult CopyAddressLocked(uint64_t key, CUdeviceptr* at);
  void DropWindowsLocked();

  // A forked child holds none of the parent's handles.
  void ResetAfterFork();

 private:
  TenantVmm() = default;
};

}  // namespace tf::limiter
