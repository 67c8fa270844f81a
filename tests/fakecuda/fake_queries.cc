// Fake driver queries: stream ids, devices and contexts, context ids, peer access, and the
// tensor-map encodings (a deterministic packing of the arguments into the 128-byte map, with the
// argument checks the real driver documents: alignment, ranks, box and element-stride bounds).
#include <cctype>
#include <cstdlib>
#include <cstring>

#include "fake_driver.h"

using fakecuda::Context;
using fakecuda::Driver;
using fakecuda::Stream;

namespace {

constexpr cuuint32_t kMaxRank = 5;

CUresult CheckDevice(CUdevice dev) {
  return dev >= 0 && dev < Driver::Get().topology.device_count ? CUDA_SUCCESS
                                                                : CUDA_ERROR_INVALID_DEVICE;
}

// Writes the fields common to every encoding and checks them (cuda.h's documented limits).
CUresult EncodeHead(CUtensorMap* map, uint64_t kind, CUtensorMapDataType type, cuuint32_t rank,
                    void* address, const cuuint64_t* dims, const cuuint64_t* strides,
                    const cuuint32_t* element_strides, unsigned interleave, unsigned swizzle,
                    unsigned l2, unsigned oob) {
  if (map == nullptr || reinterpret_cast<uintptr_t>(map) % 64 != 0 || rank == 0 ||
      rank > kMaxRank || dims == nullptr || element_strides == nullptr ||
      (rank > 1 && strides == nullptr) || reinterpret_cast<uintptr_t>(address) % 16 != 0 ||
      static_cast<unsigned>(type) > CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B ||
      interleave > CU_TENSOR_MAP_INTERLEAVE_32B || l2 > CU_TENSOR_MAP_L2_PROMOTION_L2_256B ||
      oob > CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (cuuint32_t i = 0; i < rank; ++i) {
    if (dims[i] == 0 || dims[i] > (1ull << 32) || element_strides[i] == 0 || element_strides[i] > 8) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  for (cuuint32_t i = 0; i + 1 < rank; ++i) {
    if (strides[i] % 16 != 0 || strides[i] >= (1ull << 40)) return CUDA_ERROR_INVALID_VALUE;
  }
  memset(map, 0, sizeof(*map));
  uint64_t* q = map->opaque;
  q[0] = reinterpret_cast<uint64_t>(address);
  q[1] = kind | uint64_t(type) << 8 | uint64_t(rank) << 16 | uint64_t(interleave) << 24 |
         uint64_t(swizzle) << 32 | uint64_t(l2) << 40 | uint64_t(oob) << 48;
  for (cuuint32_t i = 0; i < rank; ++i) {
    q[2 + i] = dims[i];
    q[12] |= uint64_t(element_strides[i] - 1) << (4 * i);
  }
  for (cuuint32_t i = 0; i + 1 < rank; ++i) q[7 + i] = strides[i];
  return CUDA_SUCCESS;
}

}  // namespace

CUresult cuStreamGetId(CUstream handle, unsigned long long* id) {
  FAKECUDA_ENTER();
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = fakecuda::ResolveStream(handle, &err);
  if (stream == nullptr) return err;
  *id = stream->id;
  return CUDA_SUCCESS;
}

CUresult cuStreamGetCtx(CUstream handle, CUcontext* ctx) {
  FAKECUDA_ENTER();
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = fakecuda::ResolveStream(handle, &err);
  if (stream == nullptr) return err;
  *ctx = reinterpret_cast<CUcontext>(stream->ctx);
  return CUDA_SUCCESS;
}

CUresult cuStreamGetDevice(CUstream handle, CUdevice* device) {
  FAKECUDA_ENTER();
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = fakecuda::ResolveStream(handle, &err);
  if (stream == nullptr) return err;
  *device = stream->ctx->device;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetId(CUcontext ctx, unsigned long long* id) {
  FAKECUDA_ENTER();
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  Context* c = ctx != nullptr ? reinterpret_cast<Context*>(ctx) : d.CurrentContextLocked();
  if (c == nullptr || d.contexts.count(c) == 0) return CUDA_ERROR_INVALID_CONTEXT;
  *id = c->id;
  return CUDA_SUCCESS;
}

// One GPU's memory is its own: a device reaches no peer (itself included, as the driver answers).
CUresult cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  FAKECUDA_ENTER();
  if (can == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDevice(dev); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckDevice(peer); r != CUDA_SUCCESS) return r;
  *can = 0;
  return CUDA_SUCCESS;
}

CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank,
                                void* address, const cuuint64_t* dims, const cuuint64_t* strides,
                                const cuuint32_t* box, const cuuint32_t* element_strides,
                                CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  FAKECUDA_ENTER();
  if (box == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (cuuint32_t i = 0; i < rank && i < kMaxRank; ++i) {
    if (box[i] == 0 || box[i] > 256) return CUDA_ERROR_INVALID_VALUE;
  }
  CUresult r = EncodeHead(map, 1, type, rank, address, dims, strides, element_strides, interleave,
                          swizzle, l2, oob);
  if (r != CUDA_SUCCESS) return r;
  for (cuuint32_t i = 0; i < rank; ++i) map->opaque[13] |= uint64_t(box[i] - 1) << (8 * i);
  return CUDA_SUCCESS;
}

CUresult cuTensorMapEncodeIm2col(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank,
                                 void* address, const cuuint64_t* dims, const cuuint64_t* strides,
                                 const int* lower, const int* upper, cuuint32_t channels,
                                 cuuint32_t pixels, const cuuint32_t* element_strides,
                                 CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                 CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  FAKECUDA_ENTER();
  if (rank < 3 || lower == nullptr || upper == nullptr || channels == 0 || channels > 256 ||
      pixels == 0 || pixels > 1024) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUresult r = EncodeHead(map, 2, type, rank, address, dims, strides, element_strides, interleave,
                          swizzle, l2, oob);
  if (r != CUDA_SUCCESS) return r;
  for (cuuint32_t i = 0; i + 2 < rank; ++i) {
    map->opaque[13] |= uint64_t(static_cast<uint8_t>(lower[i])) << (8 * i);
    map->opaque[14] |= uint64_t(static_cast<uint8_t>(upper[i])) << (8 * i);
  }
  map->opaque[15] = uint64_t(channels) | uint64_t(pixels) << 32;
  return CUDA_SUCCESS;
}

CUresult cuTensorMapEncodeIm2colWide(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank,
                                     void* address, const cuuint64_t* dims,
                                     const cuuint64_t* strides, int lower_w, int upper_w,
                                     cuuint32_t channels, cuuint32_t pixels,
                                     const cuuint32_t* element_strides,
                                     CUtensorMapInterleave interleave,
                                     CUtensorMapIm2ColWideMode mode, CUtensorMapSwizzle swizzle,
                                     CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  FAKECUDA_ENTER();
  if (rank < 3 || channels == 0 || channels > 256 || pixels == 0 || pixels > 1024 ||
      mode > CU_TENSOR_MAP_IM2COL_WIDE_MODE_W128) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUresult r = EncodeHead(map, 3 | uint64_t(mode) << 4, type, rank, address, dims, strides,
                          element_strides, interleave, swizzle, l2, oob);
  if (r != CUDA_SUCCESS) return r;
  map->opaque[13] = uint64_t(static_cast<uint32_t>(lower_w)) | uint64_t(static_cast<uint32_t>(upper_w)) << 32;
  map->opaque[15] = uint64_t(channels) | uint64_t(pixels) << 32;
  return CUDA_SUCCESS;
}

CUresult cuTensorMapReplaceAddress(CUtensorMap* map, void* address) {
  FAKECUDA_ENTER();
  if (map == nullptr || reinterpret_cast<uintptr_t>(address) % 16 != 0 ||
      (map->opaque[1] & 0xf) == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  map->opaque[0] = reinterpret_cast<uint64_t>(address);
  return CUDA_SUCCESS;
}

CUresult cuStreamGetCtx_v2(CUstream handle, CUcontext* ctx, CUgreenCtx* green) {
  FAKECUDA_ENTER();
  if (ctx == nullptr && green == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUcontext c = nullptr;
  if (CUresult r = cuStreamGetCtx(handle, &c); r != CUDA_SUCCESS) return r;
  if (ctx != nullptr) *ctx = c;
  if (green != nullptr) {
    if (CUresult r = cuStreamGetGreenCtx(handle, green); r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}

namespace {

// "[domain:]bus:device[.function]" in hexadecimal -> {domain, bus, device}; false otherwise.
bool ParseBusId(const char* text, unsigned out[3]) {
  unsigned f[3] = {};
  int n = 0;
  const char* p = text;
  for (;;) {
    if (n == 3 || !isxdigit(static_cast<unsigned char>(*p))) return false;
    char* end = nullptr;
    f[n++] = static_cast<unsigned>(strtoul(p, &end, 16));
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
  out[0] = n == 3 ? f[0] : 0;
  out[1] = f[n - 2];
  out[2] = f[n - 1];
  return true;
}

}  // namespace

CUresult cuDeviceGetByPCIBusId(CUdevice* dev, const char* pci_bus_id) {
  FAKECUDA_ENTER();
  unsigned want[3];
  if (dev == nullptr || pci_bus_id == nullptr || !ParseBusId(pci_bus_id, want)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Driver& d = Driver::Get();
  for (int i = 0; i < d.topology.device_count; ++i) {
    const int physical = d.ordinal_to_physical[static_cast<size_t>(i)];
    unsigned have[3];
    if (ParseBusId(fakecuda::DevicePciBusId(physical).c_str(), have) &&
        memcmp(have, want, sizeof(have)) == 0) {
      *dev = i;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_DEVICE;
}
