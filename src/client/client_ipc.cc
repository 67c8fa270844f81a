// IPC between processes whose sessions run on one worker (torch.multiprocessing's CUDA tensors):
// every call is generated (api/remote_surface.tsv); here is what the client keeps of the memory
// ones (hook=client,reply: its allocation table). A handle is the worker driver's 64 opaque bytes,
// copied through unchanged; another client of the same worker opens it in its own session, on the
// same host and driver. Memory opened from a handle is recorded like an allocation (pointer
// attributes, cuMemcpy's direction, cuMemGetAddressRange) until its last close; an opened event
// is an event of this session like any other (record, wait, synchronize, destroy).
#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {

// hook=client,reply: memory opened from a handle is recorded like an allocation with the size
// the worker's reply adds; opened again (the driver counts opens), the record stays as it is.
CUresult ClientDone_cuIpcOpenMemHandle_v2(Session* s, transport::Reader& reply, CUdeviceptr* pdptr, CUipcMemHandle,
                                          unsigned int) {
  uint64_t size = 0;
  if (!reply.U64(&size) || !reply.Finish() || *pdptr == 0 || size == 0) return CUDA_ERROR_UNKNOWN;
  if (s->allocs.count(*pdptr) == 0) RecordDeviceAlloc(s, *pdptr, size, 0);
  return CUDA_SUCCESS;
}

// The range is forgotten with its last close (the reply adds the opens left).
CUresult ClientDone_cuIpcCloseMemHandle(Session* s, transport::Reader& reply, CUdeviceptr dptr) {
  uint32_t opens_left = 0;
  if (!reply.U32(&opens_left) || !reply.Finish()) return CUDA_ERROR_UNKNOWN;
  if (opens_left == 0) s->allocs.erase(dptr);
  return CUDA_SUCCESS;
}

}  // namespace tf::client
