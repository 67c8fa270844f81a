// Stream-ordered calls added after the first slice: cuLaunchKernelEx, stream waits, event records
// with flags, unified-addressing copies (cuMemcpy, cuMemcpyAsync: the
// client's allocation tables tell device from host pointers), stream-ordered allocation and pools.
#include <cstring>

#include "client/client_internal.h"
#include "client/thread_scratch.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Writer;

CUresult LaunchEx(Fn fn, const CUlaunchConfig* config, CUfunction f, void** params, void** extra) {
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (config->gridDimX == 0 || config->gridDimY == 0 || config->gridDimZ == 0 ||
      config->blockDimX == 0 || config->blockDimY == 0 || config->blockDimZ == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (config->numAttrs > remote::kMaxLaunchAttributes ||
      (config->numAttrs > 0 && config->attrs == nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  auto it = s->functions.find(H(f));
  if (it == s->functions.end()) return CUDA_ERROR_INVALID_HANDLE;
  uint8_t* buf = ThreadScratch(Scratch::kLaunchEx);
  if (buf == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  Writer w(buf, ScratchBytes(Scratch::kLaunchEx));
  w.U64(H(f));
  WriteLaunchGeometry(config, w);
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    const CUlaunchAttribute& a = config->attrs[i];
    const uint32_t id = static_cast<uint32_t>(a.id);
    w.U32(id);
    if (id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT) {
      w.U64(H(a.value.programmaticEvent.event));
      w.I32(a.value.programmaticEvent.flags);
      w.I32(a.value.programmaticEvent.triggerAtBlockStart);
    } else if (id == CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT) {
      w.U64(H(a.value.launchCompletionEvent.event));
      w.I32(a.value.launchCompletionEvent.flags);
      w.I32(0);
    } else if (id == CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW) {
      const CUaccessPolicyWindow& apw = a.value.accessPolicyWindow;
      uint32_t ratio;
      memcpy(&ratio, &apw.hitRatio, sizeof(ratio));
      w.U64(H(apw.base_ptr));
      w.U64(apw.num_bytes);
      w.U32(ratio);
      w.U32(static_cast<uint32_t>(apw.hitProp));
      w.U32(static_cast<uint32_t>(apw.missProp));
    } else if (remote::IsPlainLaunchAttribute(id)) {
      static_assert(sizeof(a.value) == 64, "CUlaunchAttributeValue is 64 bytes");
      w.Bytes(&a.value, sizeof(a.value));
    } else {
      return Unsupported(fn);  // device-updatable graph nodes and attributes newer than us
    }
  }
  MirrorKernelPointers(s, it->second, params);
  if (CUresult r = WriteLaunchArgs(it->second, params, extra, w); r != CUDA_SUCCESS) return r;
  if (!w.ok()) return CUDA_ERROR_INVALID_VALUE;
  return SendAsync(s, Op(fn), w);
}

bool IsDevice(uint64_t p) {
  Locked l;
  return l.session() != nullptr && FindDeviceAlloc(l.session(), p) != nullptr;
}

// cuMemcpy(Async) under unified addressing: the pointers the client allocated on the device are
// device pointers, everything else is host memory of this process.
CUresult UnifiedCopy(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream, bool async) {
  if (n == 0) return CUDA_SUCCESS;
  const bool dd = IsDevice(dst), sd = IsDevice(src);
  void* hdst = reinterpret_cast<void*>(dst);
  const void* hsrc = reinterpret_cast<const void*>(src);
  if (dd && sd) {
    return async ? Impl_cuMemcpyDtoDAsync_v2(dst, src, n, stream) : Impl_cuMemcpyDtoD_v2(dst, src, n);
  }
  if (dd) return async ? Impl_cuMemcpyHtoDAsync_v2(dst, hsrc, n, stream) : Impl_cuMemcpyHtoD_v2(dst, hsrc, n);
  if (sd) return async ? Impl_cuMemcpyDtoHAsync_v2(hdst, src, n, stream) : Impl_cuMemcpyDtoH_v2(hdst, src, n);
  // Host to host: in stream order (after the work queued before it), then a plain copy.
  CUresult r = async ? Impl_cuStreamSynchronize(stream) : Impl_cuCtxSynchronize();
  if (r != CUDA_SUCCESS) return r;
  if (hdst == nullptr || hsrc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  memmove(hdst, hsrc, n);
  return CUDA_SUCCESS;
}

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

// ---- launches

CUresult Impl_cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params,
                               void** extra) {
  return LaunchEx(Fn::cuLaunchKernelEx, config, f, params, extra);
}
CUresult Impl_cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** params,
                                    void** extra) {
  return LaunchEx(Fn::cuLaunchKernelEx_ptsz, config, f, params, extra);
}

// ---- unified copies

CUresult Impl_cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return UnifiedCopy(dst, src, n, nullptr, false);
}
CUresult Impl_cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) {
  return UnifiedCopy(dst, src, n, stream, true);
}

// ---- stream-ordered allocation and pools

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
