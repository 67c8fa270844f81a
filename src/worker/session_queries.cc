// Queries and host-side encodings of a worker session (see session_queries.h).
#include "worker/session_queries.h"

#include <cstring>

namespace tf::worker {
namespace {

using driver::Fn;
using transport::Reader;
using transport::Writer;

template <class T>
T As(uint64_t v) {
  return reinterpret_cast<T>(v);
}

// The tensor-map encodings accept ranks 1 to 5 (3 to 5 for im2col); the client checks the same.
constexpr uint32_t kMaxTensorRank = 5;
constexpr size_t kTensorMapBytes = sizeof(CUtensorMap);  // 128

}  // namespace

#define CALL(fn, ...) (d_.fn ? d_.fn(__VA_ARGS__) : CUDA_ERROR_NOT_SUPPORTED)

bool SessionQueries::Handles(Fn fn) {
  switch (fn) {
    case Fn::cuTensorMapEncodeTiled:
    case Fn::cuTensorMapEncodeIm2col:
    case Fn::cuTensorMapEncodeIm2colWide:
    case Fn::cuTensorMapReplaceAddress:
      return true;
    default:
      return false;
  }
}

CUresult SessionQueries::Call(Fn fn, Reader& rd, Writer& out) {
  switch (fn) {
    case Fn::cuTensorMapEncodeTiled:
    case Fn::cuTensorMapEncodeIm2col:
    case Fn::cuTensorMapEncodeIm2colWide:
    case Fn::cuTensorMapReplaceAddress:
      return TensorMap(fn, rd, out);
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

// Tensor maps: every argument by value, the 128-byte map back.
//   Tiled:       u32 type, u32 rank, u64 address, rank x u64 dims, (rank-1) x u64 strides,
//                rank x u32 box, rank x u32 element strides, u32 interleave, swizzle, l2, oob.
//   Im2col:      u32 type, u32 rank, u64 address, dims, strides, (rank-2) x i32 lower corner,
//                (rank-2) x i32 upper corner, u32 channels, u32 pixels, element strides,
//                u32 interleave, swizzle, l2, oob.
//   Im2colWide:  as Im2col with i32 lower and i32 upper corner width, and u32 mode after
//                interleave.
//   ReplaceAddress: 128-byte map, u64 address.
CUresult SessionQueries::TensorMap(Fn fn, Reader& rd, Writer& out) {
  CUtensorMap map;
  memset(&map, 0, sizeof(map));
  CUresult r = CUDA_ERROR_NOT_SUPPORTED;
  if (fn == Fn::cuTensorMapReplaceAddress) {
    uint64_t addr = 0;
    rd.Bytes(&map, kTensorMapBytes);
    if (!rd.U64(&addr) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
    r = CALL(cuTensorMapReplaceAddress, &map, As<void*>(addr));
  } else {
    uint32_t type = 0, rank = 0;
    uint64_t addr = 0;
    rd.U32(&type);
    rd.U32(&rank);
    if (!rd.U64(&addr) || rank == 0 || rank > kMaxTensorRank) return CUDA_ERROR_INVALID_VALUE;
    const bool im2col = fn != Fn::cuTensorMapEncodeTiled;
    if (im2col && rank < 3) return CUDA_ERROR_INVALID_VALUE;
    cuuint64_t dims[kMaxTensorRank] = {}, strides[kMaxTensorRank] = {};
    cuuint32_t box[kMaxTensorRank] = {}, elem[kMaxTensorRank] = {};
    int lower[kMaxTensorRank] = {}, upper[kMaxTensorRank] = {};
    int32_t lower_w = 0, upper_w = 0;
    uint32_t channels = 0, pixels = 0;
    for (uint32_t i = 0; i < rank; ++i) rd.U64(&dims[i]);
    for (uint32_t i = 0; i + 1 < rank; ++i) rd.U64(&strides[i]);
    if (fn == Fn::cuTensorMapEncodeTiled) {
      for (uint32_t i = 0; i < rank; ++i) rd.U32(&box[i]);
    } else if (fn == Fn::cuTensorMapEncodeIm2col) {
      for (uint32_t i = 0; i + 2 < rank; ++i) rd.I32(&lower[i]);
      for (uint32_t i = 0; i + 2 < rank; ++i) rd.I32(&upper[i]);
    } else {
      rd.I32(&lower_w);
      rd.I32(&upper_w);
    }
    if (im2col) {
      rd.U32(&channels);
      rd.U32(&pixels);
    }
    for (uint32_t i = 0; i < rank; ++i) rd.U32(&elem[i]);
    uint32_t interleave = 0, mode = 0, swizzle = 0, l2 = 0, oob = 0;
    rd.U32(&interleave);
    if (fn == Fn::cuTensorMapEncodeIm2colWide) rd.U32(&mode);
    rd.U32(&swizzle);
    rd.U32(&l2);
    if (!rd.U32(&oob) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
    const auto dt = static_cast<CUtensorMapDataType>(type);
    const auto il = static_cast<CUtensorMapInterleave>(interleave);
    const auto sw = static_cast<CUtensorMapSwizzle>(swizzle);
    const auto pr = static_cast<CUtensorMapL2promotion>(l2);
    const auto fill = static_cast<CUtensorMapFloatOOBfill>(oob);
    void* ga = As<void*>(addr);
    if (fn == Fn::cuTensorMapEncodeTiled) {
      r = CALL(cuTensorMapEncodeTiled, &map, dt, rank, ga, dims, strides, box, elem, il, sw, pr,
               fill);
    } else if (fn == Fn::cuTensorMapEncodeIm2col) {
      r = CALL(cuTensorMapEncodeIm2col, &map, dt, rank, ga, dims, strides, lower, upper, channels,
               pixels, elem, il, sw, pr, fill);
    } else {
      r = CALL(cuTensorMapEncodeIm2colWide, &map, dt, rank, ga, dims, strides, lower_w, upper_w,
               channels, pixels, elem, il, static_cast<CUtensorMapIm2ColWideMode>(mode), sw, pr,
               fill);
    }
  }
  if (r == CUDA_SUCCESS) out.Bytes(&map, kTensorMapBytes);
  return r;
}

}  // namespace tf::worker
