// Device-memory allocation (api/remote_surface.tsv): cuMemAlloc_v2, cuMemAllocPitch_v2 and
// cuMemFree_v2 are generated (hook=clientcheck,client: the client's checks before the call, and its
// allocation table, which client_local.cc answers the pointer queries from, after it), and so are
// the stream-ordered ones (the reply names the pool the memory came from).
#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {

CUresult ClientCheck_cuMemAlloc_v2(bool*, CUdeviceptr*, size_t bytesize) {
  return bytesize == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
void ClientDone_cuMemAlloc_v2(Session* s, CUdeviceptr* dptr, size_t bytesize) {
  RecordDeviceAlloc(s, *dptr, bytesize, 0);
}

// Pitched allocation: the worker's driver chooses the pitch; the allocation is pitch * height
// bytes, freed with cuMemFree like any other.
CUresult ClientCheck_cuMemAllocPitch_v2(bool*, CUdeviceptr*, size_t*, size_t width, size_t height,
                                        unsigned int element_bytes) {
  if (width == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
  if (element_bytes != 4 && element_bytes != 8 && element_bytes != 16) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}
void ClientDone_cuMemAllocPitch_v2(Session* s, CUdeviceptr* dptr, size_t* pitch, size_t, size_t height,
                                   unsigned int) {
  RecordDeviceAlloc(s, *dptr, *pitch * height, 0);
}

// Answered here: freeing NULL, and managed memory (the client's mirror of it).
CUresult ClientCheck_cuMemFree_v2(bool* answered, CUdeviceptr dptr) {
  TF_LOCK(l);
  TF_CTX(l);
  // Freeing NULL succeeds, as on the driver: cudart's cudaFree(0), which cuBLAS's cudart uses to
  // bind its context, reaches us as cuMemFree_v2(0).
  if (dptr == 0) {
    *answered = true;
    return CUDA_SUCCESS;
  }
  if (HostRange h; FindHostRange(dptr, &h) && h.managed) {
    // Managed memory: the worker unmaps it once the context's work is done.
    *answered = true;
    if (h.base != dptr) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = FreeManaged(l.session(), dptr);
    if (r == CUDA_SUCCESS) ForgetManagedAdvice(dptr);
    return r;
  }
  return CUDA_SUCCESS;
}
void ClientDone_cuMemFree_v2(Session* s, CUdeviceptr dptr) { s->allocs.erase(dptr); }

// Stream-ordered allocation: the reply names the pool the memory came from, kept with it.
CUresult ClientCheck_cuMemAllocAsync(bool*, CUdeviceptr*, size_t size, CUstream) {
  return size == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
CUresult ClientDone_cuMemAllocAsync(Session* s, transport::Reader& reply, CUdeviceptr* dptr, size_t size,
                                    CUstream) {
  uint64_t pool = 0;
  if (!reply.U64(&pool)) return CUDA_ERROR_UNKNOWN;
  RecordDeviceAlloc(s, *dptr, size, pool);
  return CUDA_SUCCESS;
}
CUresult ClientCheck_cuMemAllocFromPoolAsync(bool*, CUdeviceptr* dptr, size_t size, CUmemoryPool, CUstream stream) {
  return ClientCheck_cuMemAllocAsync(nullptr, dptr, size, stream);
}
CUresult ClientDone_cuMemAllocFromPoolAsync(Session* s, transport::Reader& reply, CUdeviceptr* dptr, size_t size,
                                            CUmemoryPool, CUstream stream) {
  return ClientDone_cuMemAllocAsync(s, reply, dptr, size, stream);
}

// Only an allocation of the client's table is freed (fire-and-forget: refused here, not later).
CUresult ClientCheck_cuMemFreeAsync(bool*, CUdeviceptr dptr, CUstream) {
  TF_LOCK(l);
  TF_CTX(l);
  return l.session()->allocs.count(dptr) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
void ClientDone_cuMemFreeAsync(Session* s, CUdeviceptr dptr, CUstream) { s->allocs.erase(dptr); }

}  // namespace tf::client
