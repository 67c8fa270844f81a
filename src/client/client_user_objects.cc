// User objects (cuUserObjectCreate and friends). The object lives on the worker; its destroy
// callback is this process's function: it is registered here under an id (client_callbacks.cc)
// and runs once, on the callback thread, when the worker reports that its driver released the
// object. Formats: remote_protocol.h "Graph nodes"; worker/session_user_objects.cc.
#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Writer;

// [u64 graph,] u64 object, u32 count [, u32 flags].
CUresult Refs(Fn fn, CUgraph graph, CUuserObject object, unsigned count, const unsigned* flags) {
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[24];
  Writer w(buf, sizeof(buf));
  if (fn == Fn::cuGraphRetainUserObject || fn == Fn::cuGraphReleaseUserObject) w.U64(H(graph));
  w.U64(H(object));
  w.U32(count);
  if (flags) w.U32(*flags);
  return CallSync(l.session(), Op(fn), w, nullptr);
}

}  // namespace

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

CUresult Impl_cuUserObjectRetain(CUuserObject object, unsigned int count) {
  return Refs(Fn::cuUserObjectRetain, nullptr, object, count, nullptr);
}
CUresult Impl_cuUserObjectRelease(CUuserObject object, unsigned int count) {
  return Refs(Fn::cuUserObjectRelease, nullptr, object, count, nullptr);
}
CUresult Impl_cuGraphRetainUserObject(CUgraph graph, CUuserObject object, unsigned int count,
                                      unsigned int flags) {
  return Refs(Fn::cuGraphRetainUserObject, graph, object, count, &flags);
}
CUresult Impl_cuGraphReleaseUserObject(CUgraph graph, CUuserObject object, unsigned int count) {
  return Refs(Fn::cuGraphReleaseUserObject, graph, object, count, nullptr);
}

}  // namespace tf::client
