// Device-memory allocation (api/remote_surface.tsv): cuMemAlloc_v2, cuMemAllocPitch_v2 and
// cuMemFree_v2 are generated (hook=clientcheck,client: the client's checks before the call, and its
// allocation table, which client_local.cc answers the pointer queries from, after it); the
// stream-ordered ones are written here (hand:alloc).
#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Writer;

CUresult AllocAsync(Fn fn, CUdeviceptr* dptr, size_t size, uint64_t pool, CUstream stream) {
  if (dptr == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[24];
  Writer w(buf, sizeof(buf));
  w.U64(size);
  if (fn == Fn::cuMemAllocFromPoolAsync) w.U64(pool);
  w.U64(H(stream));
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(fn), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t p = 0, used_pool = 0;
  rv.reader.U64(&p);
  if (!rv.reader.U64(&used_pool)) return CUDA_ERROR_UNKNOWN;
  RecordDeviceAlloc(l.session(), p, size, used_pool);
  *dptr = p;
  return CUDA_SUCCESS;
}

}  // namespace

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

// ---- stream-ordered allocation and pools (hand:alloc)

CUresult Impl_cuMemAllocAsync(CUdeviceptr* dptr, size_t size, CUstream stream) {
  return AllocAsync(Fn::cuMemAllocAsync, dptr, size, 0, stream);
}
CUresult Impl_cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t size, CUmemoryPool pool,
                                      CUstream stream) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return AllocAsync(Fn::cuMemAllocFromPoolAsync, dptr, size, H(pool), stream);
}

CUresult Impl_cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  auto it = s->allocs.find(dptr);
  if (it == s->allocs.end()) return CUDA_ERROR_INVALID_VALUE;
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  w.U64(dptr);
  w.U64(H(stream));
  CUresult r = SendAsync(s, Op(Fn::cuMemFreeAsync), w);
  if (r == CUDA_SUCCESS) s->allocs.erase(it);
  return r;
}

}  // namespace tf::client
