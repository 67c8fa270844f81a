// User objects: cuUserObjectCreate (the reference calls are generated, api/remote_surface.tsv).
// The object lives on the worker; its destroy callback is this process's function: it is
// registered here under an id (client_callbacks.cc) and runs once, on the callback thread, when
// the worker reports that its driver released the object. Formats: remote_protocol.h "Graph
// nodes"; worker/session_user_objects.cc.
#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {

using driver::Fn;
using remote::Op;
using transport::Writer;

CUresult Impl_cuUserObjectCreate(CUuserObject* out, void* ptr, CUhostFn destroy, unsigned int refs,
                                 unsigned int flags) {
  if (out == nullptr || destroy == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  uint64_t id = 0;
  if (CUresult r = RegisterUserObjectRelease(s, destroy, ptr, &id); r != CUDA_SUCCESS) return r;
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  w.U64(id);
  w.U32(refs);
  w.U32(flags);
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuUserObjectCreate), w, &rv);
  uint64_t o = 0;
  if (r == CUDA_SUCCESS && !rv.reader.U64(&o)) r = CUDA_ERROR_UNKNOWN;
  if (r != CUDA_SUCCESS) {
    ForgetUserObjectRelease(id);
    return r;
  }
  *out = reinterpret_cast<CUuserObject>(o);
  return CUDA_SUCCESS;
}

}  // namespace tf::client
