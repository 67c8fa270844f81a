// Multicast objects (cuMulticastCreate, cuMulticastAddDevice, cuMulticastBindMem,
// cuMulticastBindAddr, cuMulticastUnbind: NCCL's NVLink SHARP path; cuMulticastGetGranularity is
// generated), forwarded synchronously; payloads and checks in src/worker/session_multicast.h. A multicast
// object is a VMM handle of the session: cuMemRelease releases it, cuMemMap maps it.
#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Writer;

CUresult WriteProp(Writer& w, const CUmulticastObjectProp* prop) {
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  w.U32(prop->numDevices);
  w.U64(prop->size);
  w.U64(prop->handleTypes);
  w.U64(prop->flags);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult Impl_cuMulticastCreate(CUmemGenericAllocationHandle* handle, const CUmulticastObjectProp* prop) {
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX_IF_ANY(l);
  uint8_t buf[32];
  Writer w(buf, sizeof(buf));
  if (CUresult r = WriteProp(w, prop); r != CUDA_SUCCESS) return r;
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuMulticastCreate), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t h = 0;
  if (!rv.reader.U64(&h)) return CUDA_ERROR_UNKNOWN;
  *handle = h;
  return CUDA_SUCCESS;
}

CUresult Impl_cuMulticastAddDevice(CUmemGenericAllocationHandle handle, CUdevice dev) {
  TF_LOCK(l);
  TF_CTX_IF_ANY(l);
  uint8_t buf[12];
  Writer w(buf, sizeof(buf));
  w.U64(handle);
  w.I32(dev);
  return Simple(l, Fn::cuMulticastAddDevice, w);
}

CUresult Impl_cuMulticastBindMem(CUmemGenericAllocationHandle handle, size_t mc_offset,
                                 CUmemGenericAllocationHandle mem, size_t mem_offset, size_t size,
                                 unsigned long long flags) {
  TF_LOCK(l);
  TF_CTX_IF_ANY(l);
  uint8_t buf[48];
  Writer w(buf, sizeof(buf));
  w.U64(handle);
  w.U64(mc_offset);
  w.U64(mem);
  w.U64(mem_offset);
  w.U64(size);
  w.U64(flags);
  return Simple(l, Fn::cuMulticastBindMem, w);
}

CUresult Impl_cuMulticastBindAddr(CUmemGenericAllocationHandle handle, size_t mc_offset, CUdeviceptr ptr,
                                  size_t size, unsigned long long flags) {
  TF_LOCK(l);
  TF_CTX_IF_ANY(l);
  uint8_t buf[40];
  Writer w(buf, sizeof(buf));
  w.U64(handle);
  w.U64(mc_offset);
  w.U64(ptr);
  w.U64(size);
  w.U64(flags);
  return Simple(l, Fn::cuMulticastBindAddr, w);
}

CUresult Impl_cuMulticastUnbind(CUmemGenericAllocationHandle handle, CUdevice dev, size_t mc_offset,
                                size_t size) {
  TF_LOCK(l);
  TF_CTX_IF_ANY(l);
  uint8_t buf[28];
  Writer w(buf, sizeof(buf));
  w.U64(handle);
  w.I32(dev);
  w.U64(mc_offset);
  w.U64(size);
  return Simple(l, Fn::cuMulticastUnbind, w);
}

}  // namespace tf::client
