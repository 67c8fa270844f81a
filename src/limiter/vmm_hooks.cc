// The tenant's own virtual memory management (cuMemMap and the calls around it). Without VRAM
// tiering every call goes straight to the driver; with it, TenantVmm (tier_vmm.h) translates our
// handle values and keeps the book a swap-in needs. cuMemCreate and cuMemRelease, which also
// charge the quota, are in memory_hooks.cc.
#include "limiter/export_support.h"
#include "limiter/tier_vmm.h"
#include "limiter/tiering.h"

namespace tf::limiter {

// A hook whose book call answers (true) or leaves the call to the driver (false).
#define TF_VMM_HOOK(name, book_call, ...)                 \
  TF_REAL_OR_MISSING(name)                               \
  if (g_tiering) {                                       \
    CUresult result = CUDA_SUCCESS;                      \
    if (TenantVmm::Instance().book_call) return result;  \
  }                                                      \
  return fn(__VA_ARGS__);

CUresult Hook_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                       unsigned long long flags) {
  TF_VMM_HOOK(cuMemMap, Map(ptr, size, offset, handle, flags, fn, &result), ptr, size, offset, handle, flags)
}

CUresult Hook_cuMemUnmap(CUdeviceptr ptr, size_t size) {
  TF_VMM_HOOK(cuMemUnmap, Unmap(ptr, size, fn, &result), ptr, size)
}

CUresult Hook_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  TF_VMM_HOOK(cuMemSetAccess, SetAccess(ptr, size, desc, count, fn, &result), ptr, size, desc, count)
}

CUresult Hook_cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  TF_VMM_HOOK(cuMemGetAccess, GetAccess(flags, location, ptr, &result), flags, location, ptr)
}

CUresult Hook_cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  TF_VMM_HOOK(cuMemAddressFree, AddressFree(ptr, size, fn, &result), ptr, size)
}

CUresult Hook_cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  TF_VMM_HOOK(cuMemRetainAllocationHandle, Retain(handle, addr, &result), handle, addr)
}

CUresult Hook_cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  TF_VMM_HOOK(cuMemGetAllocationPropertiesFromHandle, GetProperties(prop, handle, fn, &result), prop, handle)
}

CUresult Hook_cuMemExportToShareableHandle(void* shareableHandle, CUmemGenericAllocationHandle handle,
                                           CUmemAllocationHandleType handleType, unsigned long long flags) {
  TF_VMM_HOOK(cuMemExportToShareableHandle, Export(shareableHandle, handle, handleType, flags, fn, &result),
              shareableHandle, handle, handleType, flags)
}

CUresult Hook_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* osHandle,
                                             CUmemAllocationHandleType shHandleType) {
  TF_REAL_OR_MISSING(cuMemImportFromShareableHandle)
  if (g_tiering) return TenantVmm::Instance().Import(handle, osHandle, shHandleType, fn);
  return fn(handle, osHandle, shHandleType);
}

CUresult Hook_cuMemGetHandleForAddressRange(void* handle, CUdeviceptr dptr, size_t size,
                                            CUmemRangeHandleType handleType, unsigned long long flags) {
  TF_VMM_HOOK(cuMemGetHandleForAddressRange, HandleForAddressRange(handle, dptr, size, handleType, flags, fn, &result),
              handle, dptr, size, handleType, flags)
}

CUresult Hook_cuMemMapArrayAsync(CUarrayMapInfo* mapInfoList, unsigned int count, CUstream hStream) {
  TF_VMM_HOOK(cuMemMapArrayAsync, MapArray(mapInfoList, count, hStream, fn, &result), mapInfoList, count, hStream)
}

CUresult Hook_cuMemMapArrayAsync_ptsz(CUarrayMapInfo* mapInfoList, unsigned int count, CUstream hStream) {
  TF_VMM_HOOK(cuMemMapArrayAsync_ptsz, MapArray(mapInfoList, count, hStream, fn, &result), mapInfoList, count,
              hStream)
}

CUresult Hook_cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                                 CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size,
                                 unsigned long long flags) {
  TF_VMM_HOOK(cuMulticastBindMem, MulticastBindMem(mcHandle, mcOffset, memHandle, memOffset, size, flags, fn, &result),
              mcHandle, mcOffset, memHandle, memOffset, size, flags)
}

CUresult Hook_cuMulticastBindAddr(CUmemGenericAllocationHandle mcHandle, size_t mcOffset, CUdeviceptr memptr,
                                  size_t size, unsigned long long flags) {
  TF_VMM_HOOK(cuMulticastBindAddr, MulticastBindAddr(mcHandle, mcOffset, memptr, size, flags, fn, &result),
              mcHandle, mcOffset, memptr, size, flags)
}

#undef TF_VMM_HOOK

}  // namespace tf::limiter
