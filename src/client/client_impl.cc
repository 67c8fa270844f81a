// Entry points the remote stub implements by hand (api/remote_surface.tsv, class hand:impl).
// Device queries are answered from the snapshot taken at connect; everything else is one call to
// the worker session, fire-and-forget where CUDA's contract is asynchronous.
#include <sys/resource.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client/client_internal.h"
#include "client/thread_scratch.h"
#include "client/export_tables.h"
#include "client/parallel_copy.h"
#include "driver/procaddress.h"
#include "tf_client_impl.h"

namespace tf::client {

CUresult Simple(Locked& l, driver::Fn fn, const transport::Writer& w) {
  return CallSync(l.session(), remote::Op(fn), w, nullptr);
}

namespace {

using driver::Fn;
using remote::Op;
using transport::Writer;

// The context description that follows a context handle in a reply: u32 flags, u32 api version,
// i32 least and greatest stream priority, u8 primary.
void ReadContextInfo(transport::Reader& rd, int dev, ContextInfo* info) {
  info->device = dev;
  uint8_t primary = 0;
  rd.U32(&info->flags);
  rd.U32(&info->api_version);
  rd.I32(&info->least_priority);
  rd.I32(&info->greatest_priority);
  rd.U8(&primary);
  info->primary = primary != 0;
}

const DeviceInfo* Device(Session* s, CUdevice dev) {
  if (dev < 0 || static_cast<size_t>(dev) >= s->devices.size()) return nullptr;
  return &s->devices[dev];
}

// 128-bit content hash of a module image (two independent 64-bit FNV-1a lanes).
void HashImage(const uint8_t* p, size_t n, uint64_t* lo, uint64_t* hi) {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull ^ n;
  for (size_t i = 0; i < n; ++i) {
    a = (a ^ p[i]) * 0x100000001b3ull;
    b = (b ^ p[n - 1 - i]) * 0x100000001b3ull;
  }
  *lo = a;
  *hi = b;
}

// The size of a module image: a fatbinary, an ELF cubin, or NUL-terminated text (PTX, or the
// fake driver's "fakecuda:<module>").
size_t ImageSize(const void* image, const void** start) {
  const uint8_t* p = static_cast<const uint8_t*>(image);
  uint32_t magic;
  memcpy(&magic, p, 4);
  if (magic == 0x466243B1u) {  // fat binary wrapper: { int magic; int version; data; ... }
    const void* data;
    memcpy(&data, p + 8, sizeof(data));
    return ImageSize(data, start);
  }
  *start = image;
  if (magic == 0xBA55ED50u) {  // fatbin: u32 magic, u16 version, u16 header size, u64 body size
    uint16_t hs;
    uint64_t body;
    memcpy(&hs, p + 6, 2);
    memcpy(&body, p + 8, 8);
    return hs + body;
  }
  if (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F' && p[4] == 2) {  // ELF64
    uint64_t phoff, shoff;
    uint16_t phentsize, phnum, shentsize, shnum;
    memcpy(&phoff, p + 32, 8);
    memcpy(&shoff, p + 40, 8);
    memcpy(&phentsize, p + 54, 2);
    memcpy(&phnum, p + 56, 2);
    memcpy(&shentsize, p + 58, 2);
    memcpy(&shnum, p + 60, 2);
    uint64_t end = std::max<uint64_t>(shoff + uint64_t(shentsize) * shnum,
                                      phoff + uint64_t(phentsize) * phnum);
    // Section contents may lie after the header table.
    for (uint16_t i = 0; i < shnum; ++i) {
      const uint8_t* sh = p + shoff + uint64_t(i) * shentsize;
      uint32_t type;
      uint64_t off, size;
      memcpy(&type, sh + 4, 4);
      memcpy(&off, sh + 24, 8);
      memcpy(&size, sh + 32, 8);
      if (type != 8 /*SHT_NOBITS*/) end = std::max(end, off + size);
    }
    return end;
  }
  return strlen(static_cast<const char*>(image)) + 1;
}

CUresult LoadModule(CUmodule* module, const void* image) {
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  uint8_t buf[32];
  Writer w(buf, sizeof(buf));
  if (CUresult r = SendImage(s, image, w); r != CUDA_SUCCESS) return r;
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuModuleLoadData), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t m = 0;
  if (!rv.reader.U64(&m)) return CUDA_ERROR_UNKNOWN;
  *module = reinterpret_cast<CUmodule>(m);
  return CUDA_SUCCESS;
}

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

CUresult Launch(Fn fn, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                unsigned by, unsigned bz, unsigned shmem, CUstream stream, void** params,
                void** extra) {
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0) return CUDA_ERROR_INVALID_VALUE;
  if (params != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  auto it = s->functions.find(H(f));
  if (it == s->functions.end()) return CUDA_ERROR_INVALID_HANDLE;
  uint8_t* buf = ThreadScratch(Scratch::kLaunch);
  if (buf == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  Writer w(buf, ScratchBytes(Scratch::kLaunch));
  w.U64(H(f));
  w.U32(gx);
  w.U32(gy);
  w.U32(gz);
  w.U32(bx);
  w.U32(by);
  w.U32(bz);
  w.U32(shmem);
  w.U64(H(stream));
  MirrorKernelPointers(s, it->second, params);
  if (CUresult r = WriteLaunchArgs(it->second, params, extra, w); r != CUDA_SUCCESS) return r;
  if (!w.ok()) return CUDA_ERROR_INVALID_VALUE;
  return SendAsync(s, Op(fn), w);
}

}  // namespace

CUresult SendImage(Session* s, const void* image, Writer& w) {
  const void* start = nullptr;
  size_t n = ImageSize(image, &start);
  return SendImageBytes(s, start, n, w);
}

CUresult SendImageBytes(Session* s, const void* start, size_t n, Writer& w) {
  if (start == nullptr || n == 0 || n > remote::kMaxImageBytes) return CUDA_ERROR_INVALID_IMAGE;
  uint64_t lo, hi;
  HashImage(static_cast<const uint8_t*>(start), n, &lo, &hi);
  uint64_t key = lo ^ ((hi << 1) | (hi >> 63));
  if (!s->images_sent.count(key)) {
    uint64_t slice = s->transport->max_bulk_bytes();
    for (uint64_t off = 0; off < n; off += slice) {
      uint8_t buf[32];
      Writer cw(buf, sizeof(buf));
      cw.U64(lo);
      cw.U64(hi);
      cw.U64(n);
      cw.U64(off);
      CUresult r = SendAsync(s, remote::kOpImageChunk, cw, static_cast<const uint8_t*>(start) + off,
                             std::min<uint64_t>(slice, n - off));
      if (r != CUDA_SUCCESS) return r;
    }
    s->images_sent.insert(key);
  }
  w.U64(lo);
  w.U64(hi);
  w.U64(n);
  return CUDA_SUCCESS;
}

bool ReadFunctionInfo(transport::Reader& rd, FunctionInfo* fi) {
  uint32_t n = 0;
  rd.U32(&n);
  if (n != remote::kUnknownParamCount) {
    if (n > remote::kMaxKernelParams) return false;
    fi->layout_known = true;
    fi->offsets.resize(n);
    fi->sizes.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      rd.U64(&fi->offsets[i]);
      rd.U64(&fi->sizes[i]);
    }
  }
  uint32_t na = 0;
  if (rd.U32(&na) && na <= remote::kMaxFuncAttributes) {
    fi->attrs.resize(na);
    for (auto& a : fi->attrs) rd.I32(&a);
  }
  return rd.ok();
}

CUresult WriteLaunchArgs(const FunctionInfo& fi, void** params, void** extra, Writer& w) {
  if (params != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (extra != nullptr) {
    const void* buffer = nullptr;
    size_t size = 0;
    for (int i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = extra[i + 1];
      else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) memcpy(&size, extra[i + 1], sizeof(size));
      else return CUDA_ERROR_INVALID_VALUE;
    }
    if (buffer == nullptr || size > remote::kMaxKernelParamBytes) return CUDA_ERROR_INVALID_VALUE;
    w.U32(remote::kLaunchExtraBuffer);
    w.Blob(buffer, static_cast<uint32_t>(size));
  } else if (!fi.layout_known) {
    if (params != nullptr) {
      static std::atomic<bool> logged{false};
      if (!logged.exchange(true)) {
        ClientLog("cuLaunchKernel: the worker's driver does not describe this kernel's parameters "
                  "(cuFuncGetParamInfo): cannot forward kernelParams");
      }
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    w.U32(remote::kLaunchNoParams);
  } else {
    if (params == nullptr && !fi.sizes.empty()) return CUDA_ERROR_INVALID_VALUE;
    w.U32(remote::kLaunchParams);
    w.U32(static_cast<uint32_t>(fi.sizes.size()));
    for (size_t i = 0; i < fi.sizes.size(); ++i) w.Blob(params[i], static_cast<uint32_t>(fi.sizes[i]));
  }
  return w.ok() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// ---- initialisation, version, lookup, errors

CUresult Impl_cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  ClientState& st = State();
  pthread_mutex_lock(&st.mu);
  CUresult r = CUDA_SUCCESS;
  if (st.session == nullptr) {
    r = ConnectLocked();
    st.init_called = r == CUDA_SUCCESS;
    st.init_result = r;
  }
  pthread_mutex_unlock(&st.mu);
  return r;
}

CUresult Impl_cuDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Answerable before cuInit in CUDA: the version this stub's tables were built for, replaced by
  // the worker's once connected.
  ClientState& st = State();
  pthread_mutex_lock(&st.mu);
  *version = st.session ? st.session->driver_version : CUDA_VERSION;
  pthread_mutex_unlock(&st.mu);
  return CUDA_SUCCESS;
}

namespace {
CUresult Resolve(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                 CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  driver::ProcLookup hit = driver::LookupProcAddress(symbol, cuda_version, flags);
  int id = hit.fn;
  if (id < 0 && !hit.known_base) id = driver::FunctionId(symbol);  // an exact exported name
  if (id >= 0) {
    *pfn = OwnExport(id);
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
  }
  if (status) {
    *status = hit.needs_newer_version ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                      : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  }
  // Under any TFUSION_CLIENT_TRACE: which names a library looked for and did without.
  static const bool trace = [] {
    const char* v = getenv("TFUSION_CLIENT_TRACE");
    return v != nullptr && v[0] != '\0' && strcmp(v, "0") != 0;
  }();
  if (trace) {
    ClientLog("cuGetProcAddress(\"%s\", cudaVersion=%d, flags=%llu): %s -> CUDA_ERROR_NOT_FOUND",
              symbol, cuda_version, static_cast<unsigned long long>(flags),
              hit.needs_newer_version ? "needs a newer CUDA version" : "no such entry point");
  }
  return CUDA_ERROR_NOT_FOUND;
}

struct ErrorEntry {
  const char* name;
  int value;
};
const ErrorEntry kErrors[] = {
#define X(name, value) {#name, value},
#include "tf_client_errors.inc"
#undef X
};

// "CUDA_ERROR_INVALID_VALUE" -> "invalid value" (stable storage, built once per entry).
const char* Describe(size_t i) {
  static char texts[sizeof(kErrors) / sizeof(kErrors[0])][96];
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, [] {
    for (size_t k = 0; k < sizeof(kErrors) / sizeof(kErrors[0]); ++k) {
      const char* n = kErrors[k].name;
      if (strncmp(n, "CUDA_ERROR_", 11) == 0) n += 11;
      else if (strncmp(n, "CUDA_", 5) == 0) n += 5;
      size_t j = 0;
      for (; n[j] && j + 1 < sizeof(texts[k]); ++j) {
        char c = n[j];
        texts[k][j] = c == '_' ? ' ' : (c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c);
      }
      texts[k][j] = '\0';
    }
  });
  return texts[i];
}
}  // namespace

CUresult Impl_cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult* symbolStatus) {
  return Resolve(symbol, pfn, cudaVersion, flags, symbolStatus);
}
CUresult Impl_cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  return Resolve(symbol, pfn, cudaVersion, flags, nullptr);
}

CUresult Impl_cuGetErrorName(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& e : kErrors) {
    if (e.value == static_cast<int>(error)) {
      *pStr = e.name;
      return CUDA_SUCCESS;
    }
  }
  *pStr = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult Impl_cuGetErrorString(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof(kErrors) / sizeof(kErrors[0]); ++i) {
    if (kErrors[i].value == static_cast<int>(error)) {
      *pStr = Describe(i);
      return CUDA_SUCCESS;
    }
  }
  *pStr = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

// ---- devices

CUresult Impl_cuDeviceGetCount(int* count) {
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  *count = static_cast<int>(l.session()->devices.size());
  return CUDA_SUCCESS;
}

CUresult Impl_cuDeviceGet(CUdevice* device, int ordinal) {
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  if (!Device(l.session(), ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult Impl_cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  const DeviceInfo* d = Device(l.session(), dev);
  if (!d) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, static_cast<size_t>(len), "%s", d->name);
  return CUDA_SUCCESS;
}

CUresult Impl_cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  const DeviceInfo* d = Device(l.session(), dev);
  if (!d) return CUDA_ERROR_INVALID_DEVICE;
  *uuid = d->uuid;
  return CUDA_SUCCESS;
}
CUresult Impl_cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) { return Impl_cuDeviceGetUuid_v2(uuid, dev); }

CUresult Impl_cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  const DeviceInfo* d = Device(l.session(), dev);
  if (!d) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = d->total_mem;
  return CUDA_SUCCESS;
}

CUresult Impl_cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  const DeviceInfo* d = Device(l.session(), dev);
  if (!d) return CUDA_ERROR_INVALID_DEVICE;
  int a = static_cast<int>(attrib);
  if (a < 0 || static_cast<size_t>(a) >= d->attrs.size()) return CUDA_ERROR_INVALID_VALUE;
  *pi = d->attrs[a];
  return CUDA_SUCCESS;
}

// ---- contexts

CUresult Impl_cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  if (!Device(l.session(), dev)) return CUDA_ERROR_INVALID_DEVICE;
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.I32(dev);
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuDevicePrimaryCtxRetain), w, &rv);
  ForgetAnswers(l.session(), Fn::cuDevicePrimaryCtxGetState);
  if (r != CUDA_SUCCESS) return r;
  uint64_t c = 0;
  if (!rv.reader.U64(&c)) return CUDA_ERROR_UNKNOWN;
  l.session()->contexts[c] = dev;
  ReadContextInfo(rv.reader, dev, &l.session()->context_info[c]);
  *ctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

CUresult Impl_cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  TF_LOCK(l);
  if (!Device(l.session(), dev)) return CUDA_ERROR_INVALID_DEVICE;
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.I32(dev);
  ForgetAnswers(l.session(), Fn::cuDevicePrimaryCtxGetState);
  ForgetFunctionAnswers(l.session());  // the last release destroys the context's modules
  return Simple(l, Fn::cuDevicePrimaryCtxRelease_v2, w);
}
CUresult Impl_cuDevicePrimaryCtxRelease(CUdevice dev) { return Impl_cuDevicePrimaryCtxRelease_v2(dev); }

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
  if (!Device(l.session(), dev)) return CUDA_ERROR_INVALID_DEVICE;
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

CUresult Impl_cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  TF_LOCK(l);
  if (!Device(l.session(), dev)) return CUDA_ERROR_INVALID_DEVICE;
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.I32(dev);
  w.U32(flags);
  ForgetAnswers(l.session(), Fn::cuDevicePrimaryCtxGetState);
  CUresult r = Simple(l, Fn::cuDevicePrimaryCtxSetFlags_v2, w);
  if (r == CUDA_SUCCESS) {
    for (auto& [c, info] : l.session()->context_info) {
      if (info.device == dev && info.primary) info.flags = flags;
    }
  }
  return r;
}
CUresult Impl_cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  return Impl_cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

CUresult Impl_cuCtxGetCurrent(CUcontext* pctx) {
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  *pctx = reinterpret_cast<CUcontext>(CurrentContext());
  return CUDA_SUCCESS;
}

CUresult Impl_cuCtxSetCurrent(CUcontext ctx) {
  TF_LOCK(l);
  if (ctx != nullptr && !l.session()->contexts.count(H(ctx))) return CUDA_ERROR_INVALID_CONTEXT;
  SetCurrentContext(H(ctx));
  return CUDA_SUCCESS;
}

CUresult Impl_cuCtxGetDevice(CUdevice* device) {
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  auto it = l.session()->contexts.find(CurrentContext());
  if (it == l.session()->contexts.end()) return CUDA_ERROR_INVALID_CONTEXT;
  *device = it->second;
  return CUDA_SUCCESS;
}

CUresult Impl_cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  auto it = l.session()->contexts.find(ctx != nullptr ? H(ctx) : CurrentContext());
  if (it == l.session()->contexts.end()) return CUDA_ERROR_INVALID_CONTEXT;
  *device = it->second;
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

CUresult Impl_cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags,
                             CUdevice dev) {
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Execution affinity and CIG parameters are not forwarded; empty ones (NVIDIA's samples pass a
  // zeroed CUctxCreateParams) are the plain form, as natively.
  if (params != nullptr &&
      (params->execAffinityParams != nullptr || params->numExecAffinityParams != 0 || params->cigParams != nullptr)) {
    return Unsupported(Fn::cuCtxCreate_v4);
  }
  TF_LOCK(l);
  Session* s = l.session();
  if (!Device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U32(flags);
  w.I32(dev);
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuCtxCreate_v4), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t c = 0;
  if (!rv.reader.U64(&c)) return CUDA_ERROR_UNKNOWN;
  s->contexts[c] = dev;
  ReadContextInfo(rv.reader, dev, &s->context_info[c]);
  s->worker_ctx = c;  // cuCtxCreate makes it current on the session's thread
  PushCurrentContext(c);  // as CUDA: pushed on the calling thread's stack
  *pctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

CUresult Impl_cuCtxDestroy_v2(CUcontext ctx) {
  ReleaseContextStorage(H(ctx));  // export_tables.h: cudart's per-context destructors, unlocked
  TF_LOCK(l);
  Session* s = l.session();
  if (!s->contexts.count(H(ctx))) return CUDA_ERROR_INVALID_CONTEXT;
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(H(ctx));
  CUresult r = Simple(l, Fn::cuCtxDestroy_v2, w);
  if (r == CUDA_SUCCESS) {
    s->contexts.erase(H(ctx));
    s->context_info.erase(H(ctx));
    s->worker_ctx = ~0ull;
    if (CurrentContext() == H(ctx)) SetCurrentContext(0);
    ForgetFunctionAnswers(s);  // the context's modules and functions are gone
    ForgetContextAnswers(s);   // and its streams
  }
  return r;
}

// ---- memory

CUresult Impl_cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(bytesize);
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuMemAlloc_v2), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t p = 0;
  if (!rv.reader.U64(&p)) return CUDA_ERROR_UNKNOWN;
  RecordDeviceAlloc(l.session(), p, bytesize, 0);
  *dptr = p;
  return CUDA_SUCCESS;
}

// Pitched allocation: the worker's driver chooses the pitch; the allocation is pitch * height
// bytes, freed with cuMemFree like any other.
CUresult Impl_cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                 unsigned int element_bytes) {
  if (dptr == nullptr || pitch == nullptr || width == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
  if (element_bytes != 4 && element_bytes != 8 && element_bytes != 16) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[24];
  Writer w(buf, sizeof(buf));
  w.U64(width);
  w.U64(height);
  w.U32(element_bytes);
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuMemAllocPitch_v2), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t p = 0, pt = 0;
  if (!rv.reader.U64(&p) || !rv.reader.U64(&pt)) return CUDA_ERROR_UNKNOWN;
  RecordDeviceAlloc(l.session(), p, pt * height, 0);
  *dptr = p;
  *pitch = pt;
  return CUDA_SUCCESS;
}

CUresult Impl_cuMemFree_v2(CUdeviceptr dptr) {
  TF_LOCK(l);
  TF_CTX(l);
  // Freeing NULL succeeds, as on the driver: cudart's cudaFree(0), which cuBLAS's cudart uses to
  // bind its context, reaches us as cuMemFree_v2(0).
  if (dptr == 0) return CUDA_SUCCESS;
  if (HostRange h; FindHostRange(dptr, &h) && h.managed) {
    // Managed memory: the worker unmaps it once the context's work is done.
    if (h.base != dptr) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = FreeManaged(l.session(), dptr);
    if (r == CUDA_SUCCESS) ForgetManagedAdvice(dptr);
    return r;
  }
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(dptr);
  CUresult r = Simple(l, Fn::cuMemFree_v2, w);
  if (r == CUDA_SUCCESS) l.session()->allocs.erase(dptr);
  return r;
}

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


// ---- modules and launches

CUresult Impl_cuModuleLoadData(CUmodule* module, const void* image) { return LoadModule(module, image); }

CUresult ReadImageFile(const char* fname, std::vector<char>* image) {
  FILE* f = fopen(fname, "rb");
  if (f == nullptr) return CUDA_ERROR_FILE_NOT_FOUND;
  image->clear();
  char chunk[65536];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) image->insert(image->end(), chunk, chunk + n);
  bool failed = ferror(f) != 0;
  fclose(f);
  if (failed) return CUDA_ERROR_FILE_NOT_FOUND;
  if (image->empty()) return CUDA_ERROR_INVALID_IMAGE;
  image->push_back('\0');
  return CUDA_SUCCESS;
}

// A module from a file (Triton and Inductor load their cubins this way): the file is read here and
// its image sent like cuModuleLoadData's.
CUresult Impl_cuModuleLoad(CUmodule* module, const char* fname) {
  if (module == nullptr || fname == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<char> image;
  if (CUresult r = ReadImageFile(fname, &image); r != CUDA_SUCCESS) return r;
  return LoadModule(module, image.data());
}
CUresult Impl_cuModuleLoadFatBinary(CUmodule* module, const void* fatCubin) {
  return LoadModule(module, fatCubin);
}

CUresult Impl_cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  size_t len = strlen(name);
  if (len > remote::kMaxFunctionName) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  uint8_t buf[remote::kMaxFunctionName + 16];
  Writer w(buf, sizeof(buf));
  w.U64(H(hmod));
  w.Blob(name, static_cast<uint32_t>(len));
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuModuleGetFunction), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t f = 0;
  rv.reader.U64(&f);
  FunctionInfo fi;
  fi.module = H(hmod);
  fi.name.assign(name, len);
  if (!ReadFunctionInfo(rv.reader, &fi)) return CUDA_ERROR_UNKNOWN;
  s->functions[f] = std::move(fi);
  *hfunc = reinterpret_cast<CUfunction>(f);
  return CUDA_SUCCESS;
}

// Functions of a module (cuFFT reaches them through the tools table, export_tables.cc): each
// recorded with its name and launch layout, as cuModuleGetFunction records one.
CUresult Impl_cuModuleEnumerateFunctions(CUfunction* functions, unsigned int num, CUmodule mod) {
  if (functions == nullptr || num == 0 || num > remote::kMaxLibraryKernels) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  w.U64(H(mod));
  w.U32(num);
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuModuleEnumerateFunctions), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint32_t n = 0;
  if (!rv.reader.U32(&n) || n > num) return CUDA_ERROR_UNKNOWN;
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t f = 0;
    const uint8_t* name = nullptr;
    uint32_t len = 0;
    FunctionInfo fi;
    fi.module = H(mod);
    if (!rv.reader.U64(&f) || !rv.reader.Blob(&name, &len, remote::kMaxFunctionName) ||
        !ReadFunctionInfo(rv.reader, &fi)) {
      return CUDA_ERROR_UNKNOWN;
    }
    fi.name.assign(reinterpret_cast<const char*>(name), len);
    s->functions[f] = std::move(fi);
    functions[i] = reinterpret_cast<CUfunction>(f);
  }
  return CUDA_SUCCESS;
}

CUresult Impl_cuModuleUnload(CUmodule hmod) {
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(H(hmod));
  CUresult r = Simple(l, Fn::cuModuleUnload, w);
  if (r == CUDA_SUCCESS) {
    for (auto it = s->functions.begin(); it != s->functions.end();) {
      if (it->second.module == H(hmod)) it = s->functions.erase(it);
      else ++it;
    }
    ForgetFunctionAnswers(s);  // function handles may be reused by the next module
  }
  return r;
}

// Answered from what the client recorded when it handed the function out; the name stays valid
// until its module or library is unloaded, as the driver's does.
CUresult Impl_cuFuncGetName(const char** name, CUfunction hfunc) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  Session* s = l.session();
  auto it = s->functions.find(H(hfunc));
  if (it != s->functions.end()) {
    *name = it->second.name.c_str();
    return CUDA_SUCCESS;
  }
  // A function the client never looked up (the kernel of a graph node): asked of the worker once.
  auto known = s->other_function_names.find(H(hfunc));
  if (known == s->other_function_names.end()) {
    TF_CTX(l);
    uint8_t buf[8];
    Writer w(buf, sizeof(buf));
    w.U64(H(hfunc));
    ReplyView rv;
    CUresult r = CallSync(s, Op(Fn::cuFuncGetName), w, &rv);
    if (r != CUDA_SUCCESS) return r;
    const uint8_t* data = nullptr;
    uint32_t len = 0;
    if (!rv.reader.Blob(&data, &len, remote::kMaxFunctionName)) return CUDA_ERROR_UNKNOWN;
    known = s->other_function_names.emplace(H(hfunc), std::string(reinterpret_cast<const char*>(data), len)).first;
  }
  *name = known->second.c_str();
  return CUDA_SUCCESS;
}

// The module a function came from (0 for a library's kernels: they have none here).
CUresult Impl_cuFuncGetModule(CUmodule* hmod, CUfunction hfunc) {
  if (hmod == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  auto it = l.session()->functions.find(H(hfunc));
  if (it == l.session()->functions.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (it->second.module == 0) return CUDA_ERROR_NOT_FOUND;
  *hmod = reinterpret_cast<CUmodule>(it->second.module);
  return CUDA_SUCCESS;
}

CUresult Impl_cuFuncGetParamInfo(CUfunction func, size_t index, size_t* offset, size_t* size) {
  TF_LOCK(l);
  auto it = l.session()->functions.find(H(func));
  if (it == l.session()->functions.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (!it->second.layout_known || index >= it->second.sizes.size()) return CUDA_ERROR_INVALID_VALUE;
  if (offset) *offset = it->second.offsets[index];
  if (size) *size = it->second.sizes[index];
  return CUDA_SUCCESS;
}

CUresult Impl_cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                             unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                             CUstream stream, void** params, void** extra) {
  return Launch(Fn::cuLaunchKernel, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
}
CUresult Impl_cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                  unsigned int bx, unsigned int by, unsigned int bz,
                                  unsigned int shmem, CUstream stream, void** params, void** extra) {
  return Launch(Fn::cuLaunchKernel_ptsz, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
}

CUresult Impl_cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                        unsigned int gz, unsigned int bx, unsigned int by,
                                        unsigned int bz, unsigned int shmem, CUstream stream,
                                        void** params) {
  return Launch(Fn::cuLaunchCooperativeKernel, f, gx, gy, gz, bx, by, bz, shmem, stream, params,
                nullptr);
}
CUresult Impl_cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                             unsigned int gz, unsigned int bx, unsigned int by,
                                             unsigned int bz, unsigned int shmem, CUstream stream,
                                             void** params) {
  return Launch(Fn::cuLaunchCooperativeKernel_ptsz, f, gx, gy, gz, bx, by, bz, shmem, stream,
                params, nullptr);
}

// ---- streams and events: generated (api/remote_surface.tsv)

}  // namespace tf::client
