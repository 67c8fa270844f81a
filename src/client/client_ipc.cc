// IPC between processes whose sessions run on one worker (torch.multiprocessing's CUDA tensors):
// cuIpcOpenMemHandle(_v2), cuIpcCloseMemHandle, forwarded synchronously (they keep the client's
// allocation table); cuIpcGetMemHandle and the event handles (cuIpcGetEventHandle,
// cuIpcOpenEventHandle) are generated (api/remote_surface.tsv). A handle is the worker driver's 64 opaque bytes,
// copied through unchanged; another client of the same worker opens it in its own session, on the
// same host and driver. Memory opened from a handle is recorded like an allocation (pointer
// attributes, cuMemcpy's direction, cuMemGetAddressRange) until its last close; an opened event
// is an event of this session like any other (record, wait, synchronize, destroy).
#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {

using driver::Fn;
using remote::Op;
using transport::Writer;

CUresult Impl_cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int flags) {
  if (pdptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[CU_IPC_HANDLE_SIZE + 4];
  Writer w(buf, sizeof(buf));
  w.Bytes(handle.reserved, sizeof(handle.reserved));
  w.U32(flags);
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuIpcOpenMemHandle_v2), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t p = 0, size = 0;
  rv.reader.U64(&p);
  if (!rv.reader.U64(&size) || p == 0 || size == 0) return CUDA_ERROR_UNKNOWN;
  // Opened again (the driver counts opens): the record stays as it is.
  if (l.session()->allocs.count(p) == 0) RecordDeviceAlloc(l.session(), p, size, 0);
  *pdptr = p;
  return CUDA_SUCCESS;
}

CUresult Impl_cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int flags) {
  return Impl_cuIpcOpenMemHandle_v2(pdptr, handle, flags);
}

CUresult Impl_cuIpcCloseMemHandle(CUdeviceptr dptr) {
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(dptr);
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuIpcCloseMemHandle), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint32_t opens_left = 0;
  if (!rv.reader.U32(&opens_left)) return CUDA_ERROR_UNKNOWN;
  if (opens_left == 0) l.session()->allocs.erase(dptr);
  return CUDA_SUCCESS;
}

}  // namespace tf::client
