// Green contexts and device resources (the hand-written half; cuGreenCtxStreamCreate,
// cuGreenCtxRecordEvent/WaitEvent, cuGreenCtxGetId, cuStreamGetGreenCtx and cuCtxSetFlags are
// generated from api/remote_surface.tsv; what the client keeps of cuCtxSetFlags is here).
// Payloads: src/worker/session_green.h.
//
// A CUdevResource travels as its bytes and comes back unchanged (the worker accepts only the ones
// it handed out); a CUdevResourceDesc and a CUgreenCtx are the session's names. The CUcontext of
// a green context is an ordinary context of the session once cuCtxFromGreenCtx returned it.
#include <cstring>

#include "client/client_internal.h"
#include "client/export_tables.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Writer;

constexpr uint32_t kMaxGroups = 256;         // as the worker (session_green.h)
constexpr uint32_t kMaxDescResources = 64;

CUresult ReadResource(ReplyView& rv, CUdevResource* out) {
  CUdevResource r;
  if (!rv.reader.Bytes(&r, sizeof(r))) return CUDA_ERROR_UNKNOWN;
  memcpy(out, &r, sizeof(r));
  return CUDA_SUCCESS;
}

CUresult GetResource(Fn fn, uint64_t a, bool device, CUdevResource* resource, CUdevResourceType type) {
  if (resource == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  if (device) {
    w.I32(static_cast<int32_t>(a));
  } else {
    w.U64(a);
  }
  w.U32(static_cast<uint32_t>(type));
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(fn), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  return ReadResource(rv, resource);
}

}  // namespace

CUresult Impl_cuDeviceGetDevResource(CUdevice device, CUdevResource* resource, CUdevResourceType type) {
  return GetResource(Fn::cuDeviceGetDevResource, static_cast<uint32_t>(device), true, resource, type);
}

CUresult Impl_cuCtxGetDevResource(CUcontext ctx, CUdevResource* resource, CUdevResourceType type) {
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  return GetResource(Fn::cuCtxGetDevResource, H(ctx), false, resource, type);
}

CUresult Impl_cuGreenCtxGetDevResource(CUgreenCtx green, CUdevResource* resource, CUdevResourceType type) {
  if (green == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return GetResource(Fn::cuGreenCtxGetDevResource, H(green), false, resource, type);
}

CUresult Impl_cuDevSmResourceSplitByCount(CUdevResource* result, unsigned int* groups,
                                          const CUdevResource* input, CUdevResource* remaining,
                                          unsigned int flags, unsigned int min_count) {
  if (groups == nullptr || input == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (result != nullptr && (*groups == 0 || *groups > kMaxGroups)) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  uint8_t buf[32 + sizeof(CUdevResource)];
  Writer w(buf, sizeof(buf));
  w.U8(result != nullptr ? 1 : 0);
  w.U32(result != nullptr ? *groups : 0);
  w.Bytes(input, sizeof(*input));
  w.U8(remaining != nullptr ? 1 : 0);
  w.U32(flags);
  w.U32(min_count);
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuDevSmResourceSplitByCount), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint32_t n = 0;
  if (!rv.reader.U32(&n) || (result != nullptr && n > *groups)) return CUDA_ERROR_UNKNOWN;
  if (result != nullptr) {
    for (uint32_t i = 0; i < n; ++i) {
      if (ReadResource(rv, &result[i]) != CUDA_SUCCESS) return CUDA_ERROR_UNKNOWN;
    }
  }
  if (remaining != nullptr && ReadResource(rv, remaining) != CUDA_SUCCESS) return CUDA_ERROR_UNKNOWN;
  *groups = n;
  return CUDA_SUCCESS;
}

CUresult Impl_cuDevResourceGenerateDesc(CUdevResourceDesc* desc, CUdevResource* resources, unsigned int n) {
  if (desc == nullptr || resources == nullptr || n == 0 || n > kMaxDescResources) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  std::vector<uint8_t> buf(8 + n * sizeof(CUdevResource));
  Writer w(buf.data(), buf.size());
  w.U32(n);
  w.Bytes(resources, n * sizeof(CUdevResource));
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuDevResourceGenerateDesc), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t d = 0;
  if (!rv.reader.U64(&d)) return CUDA_ERROR_UNKNOWN;
  *desc = reinterpret_cast<CUdevResourceDesc>(d);
  return CUDA_SUCCESS;
}

CUresult Impl_cuGreenCtxCreate(CUgreenCtx* green, CUdevResourceDesc desc, CUdevice dev, unsigned int flags) {
  if (green == nullptr || desc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  w.U64(H(desc));
  w.I32(dev);
  w.U32(flags);
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuGreenCtxCreate), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t g = 0;
  if (!rv.reader.U64(&g)) return CUDA_ERROR_UNKNOWN;
  *green = reinterpret_cast<CUgreenCtx>(g);
  return CUDA_SUCCESS;
}

CUresult Impl_cuCtxFromGreenCtx(CUcontext* ctx, CUgreenCtx green) {
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (green == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  TF_LOCK(l);
  Session* s = l.session();
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(H(green));
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuCtxFromGreenCtx), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t c = 0;
  int32_t dev = 0;
  if (!rv.reader.U64(&c) || !rv.reader.I32(&dev)) return CUDA_ERROR_UNKNOWN;
  ContextInfo& info = s->context_info[c];
  info.device = dev;
  uint8_t primary = 0;
  rv.reader.U32(&info.flags);
  rv.reader.U32(&info.api_version);
  rv.reader.I32(&info.least_priority);
  rv.reader.I32(&info.greatest_priority);
  if (!rv.reader.U8(&primary)) return CUDA_ERROR_UNKNOWN;
  info.primary = false;
  s->contexts[c] = dev;
  *ctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

CUresult Impl_cuGreenCtxDestroy(CUgreenCtx green) {
  if (green == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  TF_LOCK(l);
  Session* s = l.session();
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(H(green));
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuGreenCtxDestroy), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t c = 0;
  uint32_t n = 0;
  if (!rv.reader.U64(&c) || !rv.reader.U32(&n)) return CUDA_ERROR_UNKNOWN;
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t st = 0;
    if (!rv.reader.U64(&st)) return CUDA_ERROR_UNKNOWN;
    NoteDestroyedHandle(s, HandleKind::kStream, st);
  }
  s->contexts.erase(c);
  s->context_info.erase(c);
  s->worker_ctx = ~0ull;  // the session's thread may have had it current
  if (CurrentContext() == c) SetCurrentContext(0);
  ForgetFunctionAnswers(s);
  ForgetContextAnswers(s);
  return CUDA_SUCCESS;
}

// hook=client (the call is generated): the current context's flags, which cuCtxGetFlags answers.
void ClientDone_cuCtxSetFlags(Session* s, unsigned int flags) {
  auto it = s->context_info.find(CurrentContext());
  if (it != s->context_info.end()) it->second.flags = flags;
}

}  // namespace tf::client
