// The copies between host and device memory and within device memory (api/remote_surface.tsv,
// hand:copies), and cuMemcpy(Async) under unified addressing: pageable memory travels through the
// transport's bulk memory in slices, page-locked memory the worker shares as addresses only.
#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "client/client_internal.h"
#include "client/parallel_copy.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Writer;

// Host to device. From a host region: addresses only. From pageable memory: slices through the
// transport's bulk memory; where the transport has zero-copy bulk the slices are small and, for a
// synchronous copy, all but the last go fire-and-forget on the legacy stream (ordered exactly as
// the synchronous copy would be), so that the memcpy of one slice here overlaps the worker's DMA
// of the previous ones; the last one is synchronous and returns the copy's result.
CUresult MemcpyHtoD(CUdeviceptr dst, const void* src, size_t n, CUstream stream, bool async) {
  if (n == 0) return CUDA_SUCCESS;
  if (src == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  MirrorIfUsedAsDevice(s, dst);
  if (InHostRegion(s, H(src), n) || InMirroredHostRange(s, H(src), n)) {
    return HostRegionCopy(s, remote::kRegionToDevice, dst, H(src), n, H(stream), async);
  }
  uint64_t slice = s->transport->max_bulk_bytes();
  if (s->pipelined_copies) slice = std::min<uint64_t>(slice, remote::kPipelinedCopySlice);
  const uint8_t* p = static_cast<const uint8_t*>(src);
  for (uint64_t off = 0; off < n; off += slice) {
    uint64_t len = std::min<uint64_t>(slice, n - off);
    const bool last = off + len == n;
    uint8_t buf[48];  // dst, stream, host, whole host and length
    Writer w(buf, sizeof(buf));
    w.U64(dst + off);
    CUresult r;
    if (async || (s->pipelined_copies && !last)) {
      w.U64(async ? H(stream) : 0);
      // Where the bytes come from: a capturing stream records a copy from a shadow of it; a copy
      // sent in slices names the whole copy too, so that a capture records one node, as natively.
      if (async) {
        w.U64(H(p + off));
        if (n > slice) {
          w.U64(H(p));
          w.U64(n);
        }
      }
      r = SendAsync(s, Op(Fn::cuMemcpyHtoDAsync_v2), w, p + off, len);
    } else {
      r = CallSync(s, Op(Fn::cuMemcpyHtoD_v2), w, nullptr, p + off, len);
    }
    if (r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}

struct CopyOut {
  uint8_t* dst;
  uint64_t n;
  int64_t copy_ns = 0;  // TFUSION_COPY_PROFILE: time spent copying out of the bulk memory
  uint64_t slices = 0;
};

bool CopyProfile() {
  static const bool on = [] {
    const char* v = getenv("TFUSION_COPY_PROFILE");
    return v != nullptr && *v == '1';
  }();
  return on;
}

// TCP reads each slice straight into the destination: nothing left to copy.
uint8_t* PlaceCopyData(void* ctx, uint64_t offset, uint64_t len) {
  auto* c = static_cast<CopyOut*>(ctx);
  if (offset > c->n || len > c->n - offset) return nullptr;
  return c->dst + offset;
}

bool SinkCopyData(void* ctx, uint64_t offset, const uint8_t* data, uint64_t len) {
  auto* c = static_cast<CopyOut*>(ctx);
  if (offset > c->n || len > c->n - offset) return false;
  ++c->slices;
  if (data == c->dst + offset) return true;
  const int64_t t0 = CopyProfile() ? transport::MonotonicNowNs() : 0;
  ParallelCopy(c->dst + offset, data, len);
  if (t0) c->copy_ns += transport::MonotonicNowNs() - t0;
  return true;
}

// Device to host. Into a host region: addresses only (async ones fire-and-forget). Into pageable
// memory: one call whose data streams back in kEvtCopyData slices before its reply (the worker
// overlaps its DMA of the next slices with this side's memcpy of the earlier ones).
CUresult MemcpyDtoH(void* dst, CUdeviceptr src, size_t n, CUstream stream, bool async) {
  if (n == 0) return CUDA_SUCCESS;
  if (dst == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  MirrorIfUsedAsDevice(s, src);
  if (InHostRegion(s, H(dst), n) || InMirroredHostRange(s, H(dst), n)) {
    return HostRegionCopy(s, remote::kRegionToHost, src, H(dst), n, H(stream), async);
  }
  uint8_t buf[32];
  Writer w(buf, sizeof(buf));
  w.U64(src);
  w.U64(n);
  if (async) {
    w.U64(H(stream));
    w.U64(H(dst));  // a capturing stream records a copy into a shadow of it (no data comes back)
  }
  CopyOut out{static_cast<uint8_t*>(dst), n};
  const int64_t t0 = CopyProfile() ? transport::MonotonicNowNs() : 0;
  rusage u0{};
  ParallelCopyStats c0;
  if (t0) {
    getrusage(RUSAGE_SELF, &u0);
    c0 = GetParallelCopyStats();
  }
  CUresult r = CallSyncWithData(s, Op(async ? Fn::cuMemcpyDtoHAsync_v2 : Fn::cuMemcpyDtoH_v2), w,
                                &SinkCopyData, &out, &PlaceCopyData);
  if (t0 && n >= (1u << 20)) {
    rusage u1{};
    getrusage(RUSAGE_SELF, &u1);
    const ParallelCopyStats c1 = GetParallelCopyStats();
    ClientLog("copy profile: DtoH %llu bytes in %llu slices: %.3f ms, of which copying out %.3f ms "
              "(%llu split copies, %d helpers%s: own part %.3f ms, then waiting for the helpers %.3f ms); "
              "page faults %ld minor %ld major, context switches %ld voluntary %ld involuntary",
              static_cast<unsigned long long>(n), static_cast<unsigned long long>(out.slices),
              (transport::MonotonicNowNs() - t0) / 1e6, out.copy_ns / 1e6,
              static_cast<unsigned long long>(c1.calls - c0.calls), c1.helpers,
              c1.start_error ? " (a helper failed to start)" : "", (c1.own_ns - c0.own_ns) / 1e6,
              (c1.wait_ns - c0.wait_ns) / 1e6, u1.ru_minflt - u0.ru_minflt, u1.ru_majflt - u0.ru_majflt,
              u1.ru_nvcsw - u0.ru_nvcsw, u1.ru_nivcsw - u0.ru_nivcsw);
  }
  return r;
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

}  // namespace

CUresult Impl_cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  return MemcpyHtoD(dst, src, n, nullptr, false);
}
CUresult Impl_cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream stream) {
  return MemcpyHtoD(dst, src, n, stream, true);
}
CUresult Impl_cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  return MemcpyDtoH(dst, src, n, nullptr, false);
}
CUresult Impl_cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream stream) {
  return MemcpyDtoH(dst, src, n, stream, true);
}

CUresult Impl_cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  TF_LOCK(l);
  TF_CTX(l);
  MirrorIfUsedAsDevice(l.session(), dst);
  MirrorIfUsedAsDevice(l.session(), src);
  uint8_t buf[24];
  Writer w(buf, sizeof(buf));
  w.U64(dst);
  w.U64(src);
  w.U64(n);
  return Simple(l, Fn::cuMemcpyDtoD_v2, w);
}

CUresult Impl_cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) {
  TF_LOCK(l);
  TF_CTX(l);
  MirrorIfUsedAsDevice(l.session(), dst);
  MirrorIfUsedAsDevice(l.session(), src);
  uint8_t buf[32];
  Writer w(buf, sizeof(buf));
  w.U64(dst);
  w.U64(src);
  w.U64(n);
  w.U64(H(stream));
  return SendAsync(l.session(), Op(Fn::cuMemcpyDtoDAsync_v2), w);
}

// Under unified addressing (the client's allocation tables tell device from host pointers).
CUresult Impl_cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return UnifiedCopy(dst, src, n, nullptr, false);
}
CUresult Impl_cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) {
  return UnifiedCopy(dst, src, n, stream, true);
}

}  // namespace tf::client
