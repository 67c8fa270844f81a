// Virtual memory management (PyTorch's expandable segments; cuMemGetAllocationGranularity is
// generated from api/remote_surface.tsv): cuMemAddressReserve/Free, cuMemCreate/Release,
// cuMemMap/Unmap, cuMemSetAccess, forwarded synchronously (they are not stream-ordered and each answers something the next call needs).
// Addresses and handles are the worker's; a mapped range is device memory to the client's pointer
// attributes and copy-direction guesses until it is unmapped. Exporting handles (IPC) is not
// forwarded.
#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Writer;

CUresult WriteProp(Writer& w, const CUmemAllocationProp* prop) {
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (prop->win32HandleMetaData != nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  w.U32(static_cast<uint32_t>(prop->type));
  w.U32(static_cast<uint32_t>(prop->requestedHandleTypes));
  w.U32(static_cast<uint32_t>(prop->location.type));
  w.I32(prop->location.id);
  w.U8(prop->allocFlags.compressionType);
  w.U8(prop->allocFlags.gpuDirectRDMACapable);
  w.U16(prop->allocFlags.usage);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult Impl_cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                  unsigned long long flags) {
  if (ptr == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[32];
  Writer w(buf, sizeof(buf));
  w.U64(size);
  w.U64(alignment);
  w.U64(addr);
  w.U64(flags);
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuMemAddressReserve), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t p = 0;
  if (!rv.reader.U64(&p)) return CUDA_ERROR_UNKNOWN;
  *ptr = p;
  return CUDA_SUCCESS;
}

CUresult Impl_cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  w.U64(ptr);
  w.U64(size);
  return Simple(l, Fn::cuMemAddressFree, w);
}

CUresult Impl_cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                          const CUmemAllocationProp* prop, unsigned long long flags) {
  if (handle == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[48];
  Writer w(buf, sizeof(buf));
  w.U64(size);
  if (CUresult r = WriteProp(w, prop); r != CUDA_SUCCESS) return r;
  w.U64(flags);
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuMemCreate), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t h = 0;
  if (!rv.reader.U64(&h)) return CUDA_ERROR_UNKNOWN;
  *handle = h;
  return CUDA_SUCCESS;
}

CUresult Impl_cuMemRelease(CUmemGenericAllocationHandle handle) {
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(handle);
  return Simple(l, Fn::cuMemRelease, w);
}

CUresult Impl_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                       CUmemGenericAllocationHandle handle, unsigned long long flags) {
  if (size == 0) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  uint8_t buf[40];
  Writer w(buf, sizeof(buf));
  w.U64(ptr);
  w.U64(size);
  w.U64(offset);
  w.U64(handle);
  w.U64(flags);
  CUresult r = Simple(l, Fn::cuMemMap, w);
  if (r != CUDA_SUCCESS) return r;
  RecordDeviceAlloc(s, ptr, size, 0);
  return CUDA_SUCCESS;
}

CUresult Impl_cuMemUnmap(CUdeviceptr ptr, size_t size) {
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  w.U64(ptr);
  w.U64(size);
  CUresult r = Simple(l, Fn::cuMemUnmap, w);
  if (r != CUDA_SUCCESS) return r;
  s->allocs.erase(s->allocs.lower_bound(ptr), s->allocs.lower_bound(ptr + size));
  return CUDA_SUCCESS;
}

CUresult Impl_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc,
                             size_t count) {
  if (desc == nullptr || count == 0 || count > 64) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[24 + 64 * 12];
  Writer w(buf, sizeof(buf));
  w.U64(ptr);
  w.U64(size);
  w.U32(static_cast<uint32_t>(count));
  for (size_t i = 0; i < count; ++i) {
    w.U32(static_cast<uint32_t>(desc[i].location.type));
    w.I32(desc[i].location.id);
    w.U32(static_cast<uint32_t>(desc[i].flags));
  }
  return Simple(l, Fn::cuMemSetAccess, w);
}

}  // namespace tf::client
