#include "worker/session_green.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace tf::worker {

namespace {

using driver::Fn;
using transport::Reader;
using transport::Writer;

uint64_t H(const void* p) { return reinterpret_cast<uint64_t>(p); }
template <class T>
T As(uint64_t v) {
  return reinterpret_cast<T>(v);
}

#define CALL(fn, ...) (d_.fn ? d_.fn(__VA_ARGS__) : CUDA_ERROR_NOT_SUPPORTED)

// The resource types cuda.h defines for applications (INVALID and SM).
bool KnownType(uint32_t t) { return t == CU_DEV_RESOURCE_TYPE_INVALID || t == CU_DEV_RESOURCE_TYPE_SM; }

constexpr uint32_t kSplitFlags =
    CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING | CU_DEV_SM_RESOURCE_SPLIT_MAX_POTENTIAL_CLUSTER_SIZE;
constexpr uint32_t kGreenFlags = CU_GREEN_CTX_DEFAULT_STREAM;

}  // namespace

bool SessionGreen::Handles(Fn fn) {
  switch (fn) {
    case Fn::cuDeviceGetDevResource:
    case Fn::cuCtxGetDevResource:
    case Fn::cuGreenCtxGetDevResource:
    case Fn::cuDevSmResourceSplitByCount:
    case Fn::cuDevResourceGenerateDesc:
    case Fn::cuGreenCtxCreate:
    case Fn::cuCtxFromGreenCtx:
    case Fn::cuGreenCtxDestroy:
      return true;
    default:
      return false;
  }
}

void SessionGreen::Issue(const CUdevResource& r, Writer& out) {
  std::string bytes(reinterpret_cast<const char*>(&r), sizeof(r));
  if (issued_.insert(bytes).second) {
    issued_order_.push_back(bytes);
    if (issued_order_.size() > kMaxIssued) {
      issued_.erase(issued_order_.front());
      issued_order_.pop_front();
    }
  }
  out.Bytes(&r, sizeof(r));
}

bool SessionGreen::ReadIssued(Reader& rd, CUdevResource* r) const {
  if (!rd.Bytes(r, sizeof(*r))) return false;
  return issued_.count(std::string(reinterpret_cast<const char*>(r), sizeof(*r))) != 0;
}

CUresult SessionGreen::Call(Fn fn, Reader& rd, Writer& out) {
  switch (fn) {
    case Fn::cuDeviceGetDevResource:
    case Fn::cuCtxGetDevResource:
    case Fn::cuGreenCtxGetDevResource:
      return GetResource(fn, rd, out);
    case Fn::cuDevSmResourceSplitByCount:
      return Split(rd, out);
    case Fn::cuDevResourceGenerateDesc: {
      uint32_t n = 0;
      if (!rd.U32(&n) || n == 0 || n > kMaxDescResources) return CUDA_ERROR_INVALID_VALUE;
      std::vector<CUdevResource> res(n);
      for (uint32_t i = 0; i < n; ++i) {
        if (!ReadIssued(rd, &res[i])) return CUDA_ERROR_INVALID_VALUE;
      }
      if (!rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      CUdevResourceDesc desc = nullptr;
      CUresult r = CALL(cuDevResourceGenerateDesc, &desc, res.data(), n);
      if (r != CUDA_SUCCESS) return r;
      out.U64(host_.Handles().Publish(HandleKind::kDevResourceDesc, H(desc)));
      return CUDA_SUCCESS;
    }
    case Fn::cuGreenCtxCreate:
      return Create(rd, out);
    case Fn::cuCtxFromGreenCtx: {
      uint64_t g = 0;
      if (!rd.U64(&g) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      uint64_t real = 0;
      if (!host_.Handles().Resolve(HandleKind::kGreenCtx, g, &real)) return CUDA_ERROR_INVALID_HANDLE;
      auto it = greens_.find(real);
      if (it == greens_.end()) return CUDA_ERROR_INVALID_HANDLE;
      uint64_t wire = 0;
      if (!host_.Handles().WireOf(HandleKind::kContext, it->second.ctx, &wire)) return CUDA_ERROR_INVALID_HANDLE;
      out.U64(wire);
      out.I32(it->second.device);
      host_.WriteGreenContextInfo(it->second.ctx, it->second.device, out);
      return CUDA_SUCCESS;
    }
    case Fn::cuGreenCtxDestroy:
      return Destroy(rd, out);
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

CUresult SessionGreen::GetResource(Fn fn, Reader& rd, Writer& out) {
  CUdevResource res;
  memset(&res, 0, sizeof(res));
  CUresult r;
  uint32_t type = 0;
  if (fn == Fn::cuDeviceGetDevResource) {
    int32_t dev = 0;
    if (!rd.I32(&dev) || !rd.U32(&type) || !rd.Finish() || !KnownType(type)) return CUDA_ERROR_INVALID_VALUE;
    if (!host_.KnownDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
    r = CALL(cuDeviceGetDevResource, dev, &res, static_cast<CUdevResourceType>(type));
  } else if (fn == Fn::cuCtxGetDevResource) {
    uint64_t c = 0;
    if (!rd.U64(&c) || !rd.U32(&type) || !rd.Finish() || !KnownType(type)) return CUDA_ERROR_INVALID_VALUE;
    if (!host_.KnownContext(c)) return CUDA_ERROR_INVALID_CONTEXT;
    r = CALL(cuCtxGetDevResource, As<CUcontext>(c), &res, static_cast<CUdevResourceType>(type));
  } else {
    uint64_t g = 0;
    if (!rd.U64(&g) || !rd.U32(&type) || !rd.Finish() || !KnownType(type)) return CUDA_ERROR_INVALID_VALUE;
    if (!host_.Handles().Resolve(HandleKind::kGreenCtx, g, &g)) return CUDA_ERROR_INVALID_HANDLE;
    r = CALL(cuGreenCtxGetDevResource, As<CUgreenCtx>(g), &res, static_cast<CUdevResourceType>(type));
  }
  if (r != CUDA_SUCCESS) return r;
  Issue(res, out);
  return CUDA_SUCCESS;
}

CUresult SessionGreen::Split(Reader& rd, Writer& out) {
  uint8_t want_result = 0, want_remaining = 0;
  uint32_t groups = 0, flags = 0, min_count = 0;
  CUdevResource input;
  if (!rd.U8(&want_result) || !rd.U32(&groups)) return CUDA_ERROR_INVALID_VALUE;
  const bool known = ReadIssued(rd, &input);
  if (!rd.U8(&want_remaining) || !rd.U32(&flags) || !rd.U32(&min_count) || !rd.Finish()) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!known || want_result > 1 || want_remaining > 1 || (flags & ~kSplitFlags) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (want_result && (groups == 0 || groups > kMaxGroups)) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUdevResource> result(want_result ? groups : 0);
  for (auto& x : result) memset(&x, 0, sizeof(x));
  CUdevResource remaining;
  memset(&remaining, 0, sizeof(remaining));
  unsigned n = want_result ? groups : 0;
  CUresult r = CALL(cuDevSmResourceSplitByCount, want_result ? result.data() : nullptr, &n, &input,
                    want_remaining ? &remaining : nullptr, flags, min_count);
  if (r != CUDA_SUCCESS) return r;
  if (want_result && n > groups) return CUDA_ERROR_UNKNOWN;  // the driver wrote past the array
  out.U32(n);
  if (want_result) {
    for (unsigned i = 0; i < n; ++i) Issue(result[i], out);
  }
  if (want_remaining) Issue(remaining, out);
  return CUDA_SUCCESS;
}

CUresult SessionGreen::Create(Reader& rd, Writer& out) {
  uint64_t desc = 0;
  int32_t dev = 0;
  uint32_t flags = 0;
  if (!rd.U64(&desc) || !rd.I32(&dev) || !rd.U32(&flags) || !rd.Finish() || (flags & ~kGreenFlags) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!host_.KnownDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (!host_.Handles().Resolve(HandleKind::kDevResourceDesc, desc, &desc)) return CUDA_ERROR_INVALID_VALUE;
  CUgreenCtx g = nullptr;
  CUresult r = CALL(cuGreenCtxCreate, &g, As<CUdevResourceDesc>(desc), dev, flags);
  if (r != CUDA_SUCCESS) return r;
  CUcontext c = nullptr;
  r = CALL(cuCtxFromGreenCtx, &c, g);
  if (r != CUDA_SUCCESS || c == nullptr) {
    CALL(cuGreenCtxDestroy, g);
    return r != CUDA_SUCCESS ? r : CUDA_ERROR_UNKNOWN;
  }
  greens_[H(g)] = Green{H(c), dev};
  host_.Handles().Publish(HandleKind::kContext, H(c));
  host_.GreenContextAdded(H(c));
  out.U64(host_.Handles().Publish(HandleKind::kGreenCtx, H(g)));
  return CUDA_SUCCESS;
}

CUresult SessionGreen::Destroy(Reader& rd, Writer& out) {
  uint64_t wire = 0, g = 0;
  if (!rd.U64(&wire) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
  if (!host_.Handles().Resolve(HandleKind::kGreenCtx, wire, &g)) return CUDA_ERROR_INVALID_HANDLE;
  auto it = greens_.find(g);
  if (it == greens_.end()) return CUDA_ERROR_INVALID_HANDLE;
  // The streams of the green context (cuGreenCtxStreamCreate, or made while its context was
  // current) go with it: asked before it goes.
  std::vector<uint64_t> gone;
  for (uint64_t s : host_.SessionStreams()) {
    CUgreenCtx owner = nullptr;
    if (CALL(cuStreamGetGreenCtx, As<CUstream>(s), &owner) == CUDA_SUCCESS && H(owner) == g) gone.push_back(s);
  }
  CUresult r = CALL(cuGreenCtxDestroy, As<CUgreenCtx>(g));
  if (r != CUDA_SUCCESS) return r;
  const uint64_t ctx = it->second.ctx;
  greens_.erase(it);
  uint64_t ctx_wire = 0;
  host_.Handles().WireOf(HandleKind::kContext, ctx, &ctx_wire);
  host_.Handles().RetireReal(HandleKind::kContext, ctx);
  host_.GreenContextRemoved(ctx);
  host_.Handles().Retire(HandleKind::kGreenCtx, wire);
  out.U64(ctx_wire);
  out.U32(static_cast<uint32_t>(gone.size()));
  for (uint64_t s : gone) {
    uint64_t sw = 0;
    host_.Handles().WireOf(HandleKind::kStream, s, &sw);
    host_.Handles().RetireReal(HandleKind::kStream, s);
    host_.StreamGone(s);
    out.U64(sw);
  }
  return CUDA_SUCCESS;
}

void SessionGreen::Cleanup() {
  for (auto& [g, e] : greens_) CALL(cuGreenCtxDestroy, As<CUgreenCtx>(g));
  if (!greens_.empty()) {
    fprintf(stderr, "tfusion-worker[%d]: session ended: destroyed %zu green contexts\n",
            static_cast<int>(getpid()), greens_.size());
  }
  greens_.clear();
}

}  // namespace tf::worker
