// Contexts (api/remote_surface.tsv, hand:contexts): the client's context table (each context's
// device and the description that came with it) and the thread's context stack. Creating and
// destroying a context and retaining, releasing and flagging a primary context are generated;
// their hooks here keep the table.
#include "client/client_internal.h"
#include "client/export_tables.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Writer;

// The context description that follows a context handle in a reply: u32 flags, u32 api version,
// i32 least and greatest stream priority, u8 primary.
bool ReadContextInfo(transport::Reader& rd, int dev, ContextInfo* info) {
  info->device = dev;
  uint8_t primary = 0;
  rd.U32(&info->flags);
  rd.U32(&info->api_version);
  rd.I32(&info->least_priority);
  rd.I32(&info->greatest_priority);
  rd.U8(&primary);
  info->primary = primary != 0;
  return rd.ok();
}

}  // namespace

// hook=client,reply: the retained primary context joins the context table with its description.
CUresult ClientDone_cuDevicePrimaryCtxRetain(Session* s, transport::Reader& reply, CUcontext* ctx,
                                             CUdevice dev) {
  const uint64_t c = H(*ctx);
  s->contexts[c] = dev;
  if (!ReadContextInfo(reply, dev, &s->context_info[c])) return CUDA_ERROR_UNKNOWN;
  return CUDA_SUCCESS;
}

// hook=client: the last release destroys the context's modules.
void ClientDone_cuDevicePrimaryCtxRelease_v2(Session* s, CUdevice) { ForgetFunctionAnswers(s); }

// hook=client: the device's primary context keeps the flags it was given.
void ClientDone_cuDevicePrimaryCtxSetFlags_v2(Session* s, CUdevice dev, unsigned int flags) {
  for (auto& [c, info] : s->context_info) {
    if (info.device == dev && info.primary) info.flags = flags;
  }
}

CUresult Impl_cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Locked l;
  if (l.session() == nullptr) {
    // With the worker gone there is no primary context any more: say so rather than fail. A
    // framework asks this while it unwinds after the error its last call got (PyTorch checks it
    // where it cannot throw, and would abort the process instead of letting it exit cleanly).
    if (l.result() != kLostConnectionError) return l.result();
    *flags = 0;
    *active = 0;
    return CUDA_SUCCESS;
  }
  if (!FindDevice(l.session(), dev)) return CUDA_ERROR_INVALID_DEVICE;
  // The session's worker process serves this client alone, so the state changes only through
  // this client's retain, release, reset and flag calls, which forget the cached answer.
  uint64_t cached = 0;
  if (CachedAnswer(l.session(), Fn::cuDevicePrimaryCtxGetState, static_cast<uint64_t>(dev), 0, 0,
                   &cached)) {
    *flags = static_cast<unsigned>(cached >> 32);
    *active = static_cast<int>(cached & 1);
    return CUDA_SUCCESS;
  }
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.I32(dev);
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuDevicePrimaryCtxGetState), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint32_t f = 0;
  int32_t a = 0;
  rv.reader.U32(&f);
  if (!rv.reader.I32(&a)) return CUDA_ERROR_UNKNOWN;
  StoreAnswer(l.session(), Fn::cuDevicePrimaryCtxGetState, static_cast<uint64_t>(dev), 0, 0,
              (static_cast<uint64_t>(f) << 32) | (a != 0 ? 1 : 0));
  *flags = f;
  *active = a;
  return CUDA_SUCCESS;
}

// CUDA 13: synchronize a given context (NULL: the current one), without changing the current one.
CUresult Impl_cuCtxSynchronize_v2(CUcontext ctx) {
  if (ctx == nullptr || reinterpret_cast<uint64_t>(ctx) == CurrentContext()) {
    return Impl_cuCtxSynchronize();
  }
  CUresult r = Impl_cuCtxPushCurrent_v2(ctx);
  if (r != CUDA_SUCCESS) return r;
  r = Impl_cuCtxSynchronize();
  CUcontext popped = nullptr;
  CUresult p = Impl_cuCtxPopCurrent_v2(&popped);
  return r != CUDA_SUCCESS ? r : p;
}

// Execution affinity and CIG parameters are not forwarded; empty ones (NVIDIA's samples pass a
// zeroed CUctxCreateParams) are the plain form, as natively.
CUresult ClientCheck_cuCtxCreate_v4(bool*, CUcontext*, CUctxCreateParams* params, unsigned int, CUdevice) {
  if (params != nullptr &&
      (params->execAffinityParams != nullptr || params->numExecAffinityParams != 0 || params->cigParams != nullptr)) {
    return Unsupported(Fn::cuCtxCreate_v4);
  }
  return CUDA_SUCCESS;
}

// hook=client,reply: the new context joins the context table with its description; as CUDA, it
// is current on the session's thread and pushed on the calling thread's stack.
CUresult ClientDone_cuCtxCreate_v4(Session* s, transport::Reader& reply, CUcontext* pctx, CUctxCreateParams*,
                                   unsigned int, CUdevice dev) {
  const uint64_t c = H(*pctx);
  s->contexts[c] = dev;
  ReadContextInfo(reply, dev, &s->context_info[c]);
  s->worker_ctx = c;
  PushCurrentContext(c);
  return CUDA_SUCCESS;
}

// The legacy forms: cuCtxCreate_v4 without create parameters.
CUresult Impl_cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return Impl_cuCtxCreate_v4(pctx, nullptr, flags, dev);
}
CUresult Impl_cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return Impl_cuCtxCreate_v4(pctx, nullptr, flags, dev);
}

// cudart's per-context destructors run first, without the client's lock (export_tables.h).
CUresult ClientCheck_cuCtxDestroy_v2(bool*, CUcontext ctx) {
  ReleaseContextStorage(H(ctx));
  return CUDA_SUCCESS;
}

// hook=client: the context leaves the table (and the thread, where it was current).
void ClientDone_cuCtxDestroy_v2(Session* s, CUcontext ctx) {
  s->contexts.erase(H(ctx));
  s->context_info.erase(H(ctx));
  s->worker_ctx = ~0ull;
  if (CurrentContext() == H(ctx)) SetCurrentContext(0);
  ForgetFunctionAnswers(s);  // the context's modules and functions are gone
  ForgetContextAnswers(s);   // and its streams
}

}  // namespace tf::client
