// Queries and host-side encodings forwarded to the worker (worker half: src/worker/
// session_queries.cc, where the wire format of each call is written down): the tensor-map
// encodings (cuTensorMapEncode*: a 128-byte CUtensorMap the worker's driver computes from the
// arguments, which travel by value; the map comes back into the caller's), and the device lookup
// by PCI bus id, answered from the snapshot.
//
// Answers that only this client can change are asked once and then answered here (Session::answers):
// the generated queries (api/remote_surface.tsv) keep a device's PCI bus id for the connection
// (str= with cache=: Session::text_answers), a
// context's id until it is destroyed (ForgetContextAnswers) and the stream getters until the
// stream is destroyed (ForgetStreamAnswers) or an attribute set (the priority may change).
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Writer;

constexpr uint32_t kMaxTensorRank = 5;
constexpr Fn kStreamQueries[] = {Fn::cuStreamGetPriority, Fn::cuStreamGetFlags, Fn::cuStreamGetId,
                                 Fn::cuStreamGetDevice, Fn::cuStreamGetCtx};

// Parses "[domain:]bus:device[.function]" (hexadecimal fields, any case), the forms the driver
// accepts. False for anything else.
bool ParseBusId(const char* text, unsigned* domain, unsigned* bus, unsigned* device) {
  unsigned f[3] = {};
  int n = 0;
  const char* p = text;
  for (;;) {
    if (n == 3 || !isxdigit(static_cast<unsigned char>(*p))) return false;
    char* end = nullptr;
    unsigned long v = strtoul(p, &end, 16);
    if (end - p > 8) return false;
    f[n++] = static_cast<unsigned>(v);
    p = end;
    if (*p == ':') {
      ++p;
      continue;
    }
    if (*p == '.') {
      ++p;
      if (!isxdigit(static_cast<unsigned char>(*p))) return false;
      strtoul(p, &end, 16);
      p = end;
    }
    break;
  }
  if (*p != '\0' || n < 2) return false;
  *domain = n == 3 ? f[0] : 0;
  *bus = f[n - 2];
  *device = f[n - 1];
  return true;
}

// Sends a tensor-map request and copies the 128-byte answer into *map.
CUresult TensorMapCall(Fn fn, const Writer& w, CUtensorMap* map) {
  TF_LOCK(l);
  TF_CTX_IF_ANY(l);
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(fn), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  CUtensorMap got;
  if (!rv.reader.Bytes(&got, sizeof(got))) return CUDA_ERROR_UNKNOWN;
  *map = got;
  return CUDA_SUCCESS;
}

// What the encodings share: u32 type, u32 rank, u64 address, dims, strides. CUDA_ERROR_INVALID_VALUE
// for arguments the driver would refuse before reading them.
CUresult WriteTensorHead(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, uint32_t min_rank,
                         void* address, const cuuint64_t* dims, const cuuint64_t* strides,
                         const cuuint32_t* element_strides, Writer& w) {
  if (map == nullptr || rank < min_rank || rank > kMaxTensorRank || dims == nullptr ||
      element_strides == nullptr || (rank > 1 && strides == nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  w.U32(static_cast<uint32_t>(type));
  w.U32(rank);
  w.U64(H(address));
  for (cuuint32_t i = 0; i < rank; ++i) w.U64(dims[i]);
  for (cuuint32_t i = 0; i + 1 < rank; ++i) w.U64(strides[i]);
  return CUDA_SUCCESS;
}

}  // namespace

void ForgetStreamAnswers(Session* s, uint64_t stream) {
  for (Fn fn : kStreamQueries) ForgetAnswersAbout(s, fn, stream);
}

void NoteCreatedHandle(Session* s, HandleKind k, uint64_t h) {
  if (k == HandleKind::kStream) s->streams.insert(h);
}

void NoteDestroyedHandle(Session* s, HandleKind k, uint64_t h) {
  if (k == HandleKind::kStream) {
    s->streams.erase(h);
    ForgetStreamAnswers(s, h);
  }
}

void ForgetContextAnswers(Session* s) {
  ForgetAnswers(s, Fn::cuCtxGetId);
  for (Fn fn : kStreamQueries) ForgetAnswers(s, fn);
}

// ---- streams: the getters are generated (api/remote_surface.tsv, answered once per stream)

// The context as cuStreamGetCtx answers it, the green context as cuStreamGetGreenCtx does.
CUresult Impl_cuStreamGetCtx_v2(CUstream st, CUcontext* ctx, CUgreenCtx* green) {
  if (ctx == nullptr && green == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUcontext c = nullptr;
  CUresult r = Impl_cuStreamGetCtx(st, &c);
  if (r != CUDA_SUCCESS) return r;
  CUgreenCtx g = nullptr;
  if (green != nullptr && (r = Impl_cuStreamGetGreenCtx(st, &g)) != CUDA_SUCCESS) return r;
  if (ctx != nullptr) *ctx = c;
  if (green != nullptr) *green = g;
  return CUDA_SUCCESS;
}

// ---- devices

// Answered here: the device whose PCI domain, bus and device (CU_DEVICE_ATTRIBUTE_PCI_*, from the
// snapshot) match the text.
CUresult Impl_cuDeviceGetByPCIBusId(CUdevice* dev, const char* pci_bus_id) {
  if (dev == nullptr || pci_bus_id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  unsigned domain = 0, bus = 0, device = 0;
  if (!ParseBusId(pci_bus_id, &domain, &bus, &device)) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  const std::vector<DeviceInfo>& devs = l.session()->devices;
  for (size_t i = 0; i < devs.size(); ++i) {
    auto attr = [&](CUdevice_attribute a) {
      size_t k = static_cast<size_t>(a);
      return k < devs[i].attrs.size() ? static_cast<unsigned>(devs[i].attrs[k]) : ~0u;
    };
    if (attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID) == domain &&
        attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) == bus &&
        attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID) == device) {
      *dev = static_cast<CUdevice>(i);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_DEVICE;
}

// ---- tensor maps (Hopper's bulk tensor copies; XLA and Triton encode them on the host)

CUresult Impl_cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank,
                                     void* address, const cuuint64_t* dims,
                                     const cuuint64_t* strides, const cuuint32_t* box,
                                     const cuuint32_t* element_strides,
                                     CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                     CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  uint8_t buf[256];
  Writer w(buf, sizeof(buf));
  CUresult r = WriteTensorHead(map, type, rank, 1, address, dims, strides, element_strides, w);
  if (r != CUDA_SUCCESS) return r;
  if (box == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (cuuint32_t i = 0; i < rank; ++i) w.U32(box[i]);
  for (cuuint32_t i = 0; i < rank; ++i) w.U32(element_strides[i]);
  w.U32(static_cast<uint32_t>(interleave));
  w.U32(static_cast<uint32_t>(swizzle));
  w.U32(static_cast<uint32_t>(l2));
  w.U32(static_cast<uint32_t>(oob));
  return TensorMapCall(Fn::cuTensorMapEncodeTiled, w, map);
}

CUresult Impl_cuTensorMapEncodeIm2col(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank,
                                      void* address, const cuuint64_t* dims,
                                      const cuuint64_t* strides, const int* lower,
                                      const int* upper, cuuint32_t channels, cuuint32_t pixels,
                                      const cuuint32_t* element_strides,
                                      CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                      CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  uint8_t buf[256];
  Writer w(buf, sizeof(buf));
  CUresult r = WriteTensorHead(map, type, rank, 3, address, dims, strides, element_strides, w);
  if (r != CUDA_SUCCESS) return r;
  if (lower == nullptr || upper == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (cuuint32_t i = 0; i + 2 < rank; ++i) w.I32(lower[i]);
  for (cuuint32_t i = 0; i + 2 < rank; ++i) w.I32(upper[i]);
  w.U32(channels);
  w.U32(pixels);
  for (cuuint32_t i = 0; i < rank; ++i) w.U32(element_strides[i]);
  w.U32(static_cast<uint32_t>(interleave));
  w.U32(static_cast<uint32_t>(swizzle));
  w.U32(static_cast<uint32_t>(l2));
  w.U32(static_cast<uint32_t>(oob));
  return TensorMapCall(Fn::cuTensorMapEncodeIm2col, w, map);
}

CUresult Impl_cuTensorMapEncodeIm2colWide(CUtensorMap* map, CUtensorMapDataType type,
                                          cuuint32_t rank, void* address, const cuuint64_t* dims,
                                          const cuuint64_t* strides, int lower_w, int upper_w,
                                          cuuint32_t channels, cuuint32_t pixels,
                                          const cuuint32_t* element_strides,
                                          CUtensorMapInterleave interleave,
                                          CUtensorMapIm2ColWideMode mode,
                                          CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                          CUtensorMapFloatOOBfill oob) {
  uint8_t buf[256];
  Writer w(buf, sizeof(buf));
  CUresult r = WriteTensorHead(map, type, rank, 3, address, dims, strides, element_strides, w);
  if (r != CUDA_SUCCESS) return r;
  w.I32(lower_w);
  w.I32(upper_w);
  w.U32(channels);
  w.U32(pixels);
  for (cuuint32_t i = 0; i < rank; ++i) w.U32(element_strides[i]);
  w.U32(static_cast<uint32_t>(interleave));
  w.U32(static_cast<uint32_t>(mode));
  w.U32(static_cast<uint32_t>(swizzle));
  w.U32(static_cast<uint32_t>(l2));
  w.U32(static_cast<uint32_t>(oob));
  return TensorMapCall(Fn::cuTensorMapEncodeIm2colWide, w, map);
}

CUresult Impl_cuTensorMapReplaceAddress(CUtensorMap* map, void* address) {
  if (map == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint8_t buf[sizeof(CUtensorMap) + 8];
  Writer w(buf, sizeof(buf));
  w.Bytes(map, sizeof(*map));
  w.U64(H(address));
  return TensorMapCall(Fn::cuTensorMapReplaceAddress, w, map);
}

}  // namespace tf::client
