// Payloads of the array family of the remote vGPU protocol (client_arrays.cc, worker
// session_arrays.cc): CUDA arrays, mipmapped arrays, array and 2D/3D copies. Fields are
// little-endian, written with transport::Writer and read with Reader; the worker checks every
// handle against its session's tables and every region against the array's extent or one device
// allocation of the session. docs/remote.md "Arrays and 2D/3D copies".
//
//   array descriptor   u64 width, u64 height, u64 depth, u32 CUarray_format, u32 channels, u32 flags
//   Creating, destroying and querying arrays and mipmapped arrays is generated (api/remote_surface.tsv,
//   its wire format in docs/remote.md "The remote surface"); the reply of cuArrayCreate_v2,
//   cuArray3DCreate_v2, cuArrayGetPlane and cuMipmappedArrayGetLevel carries the array's
//   descriptor (the driver's) after its handle (hook=reply).
//   cuMemcpyHtoA_v2                           u64 array, u64 offset; bulk: the bytes (one slice)
//   cuMemcpyHtoAAsync_v2                      u64 array, u64 offset, u64 stream; bulk (fire-and-forget)
//   cuMemcpyAtoH_v2                           u64 array, u64 offset, u64 length
//   cuMemcpyAtoHAsync_v2                      u64 array, u64 offset, u64 length, u64 stream
//                                             (both: the bytes arrive as kEvtCopyData events
//                                             before the reply, offsets into the copy)
//   cuMemcpyDtoA_v2                           u64 array, u64 offset, u64 device pointer, u64 length
//   cuMemcpyAtoD_v2                           u64 device pointer, u64 array, u64 offset, u64 length
//   cuMemcpyAtoA_v2                           u64 dst array, u64 dst offset, u64 src array,
//                                             u64 src offset, u64 length
//   cuMemcpy2D_v2, cuMemcpy2DUnaligned_v2, cuMemcpy3D_v2     copy box
//   cuMemcpy2DAsync_v2, cuMemcpy3DAsync_v2                  copy box, u64 stream
//     copy box: src side, dst side, u64 width in bytes, u64 height, u64 depth (1 for 2D), where a
//     side is u8 CUmemorytype (never UNIFIED: the client resolves it), then
//       CU_MEMORYTYPE_HOST:   nothing (packed rows of width bytes: the request's bulk for a
//                             source, kEvtCopyData events before the reply for a destination)
//       CU_MEMORYTYPE_DEVICE: u64 pointer, u64 x bytes, u64 y, u64 z, u64 pitch, u64 height
//       CU_MEMORYTYPE_ARRAY:  u64 array, u64 x bytes, u64 y, u64 z
//     A copy with a host side larger than the transport's bulk limit is sent as several copies of
//     sub-boxes (SplitCopyBox); host to host never leaves the client.
//   Texture and surface objects are generated too (their resource descriptor's union travels as
//   its bytes: bytes=pResDesc.res, checked by the worker's array family by its resType).
// Descriptors of arrays and objects are answered by the client from what it sent and got back.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "transport/wire.h"

namespace tf::remote {

inline void WriteArrayDesc(const CUDA_ARRAY3D_DESCRIPTOR& d, transport::Writer& w) {
  w.U64(d.Width);
  w.U64(d.Height);
  w.U64(d.Depth);
  w.U32(static_cast<uint32_t>(d.Format));
  w.U32(d.NumChannels);
  w.U32(d.Flags);
}

inline bool ReadArrayDesc(transport::Reader& rd, CUDA_ARRAY3D_DESCRIPTOR* d) {
  uint64_t w = 0, h = 0, depth = 0;
  uint32_t format = 0, channels = 0, flags = 0;
  rd.U64(&w);
  rd.U64(&h);
  rd.U64(&depth);
  rd.U32(&format);
  rd.U32(&channels);
  if (!rd.U32(&flags)) return false;
  *d = CUDA_ARRAY3D_DESCRIPTOR{};
  d->Width = w;
  d->Height = h;
  d->Depth = depth;
  d->Format = static_cast<CUarray_format>(format);
  d->NumChannels = channels;
  d->Flags = flags;
  return true;
}

// Bytes of one element of an array or texture format (0: a format this layer does not know).
inline uint32_t FormatBytes(uint32_t format) {
  switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
    case CU_AD_FORMAT_UNORM_INT8X1:
    case CU_AD_FORMAT_SNORM_INT8X1:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
    case CU_AD_FORMAT_UNORM_INT16X1:
    case CU_AD_FORMAT_SNORM_INT16X1:
    case CU_AD_FORMAT_UNORM_INT8X2:
    case CU_AD_FORMAT_SNORM_INT8X2:
      return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
    case CU_AD_FORMAT_UNORM_INT16X2:
    case CU_AD_FORMAT_SNORM_INT16X2:
    case CU_AD_FORMAT_UNORM_INT8X4:
    case CU_AD_FORMAT_SNORM_INT8X4:
      return 4;
    case CU_AD_FORMAT_UNORM_INT16X4:
    case CU_AD_FORMAT_SNORM_INT16X4:
      return 8;
    default:
      return 0;
  }
}

// One side of a 2D/3D copy as it travels (host sides carry no fields).
struct CopySide {
  uint8_t type = 0;  // CUmemorytype: HOST, DEVICE or ARRAY
  uint64_t handle = 0;  // device pointer or array
  uint64_t x = 0, y = 0, z = 0;
  uint64_t pitch = 0, height = 0;  // device sides
};

inline void WriteCopySide(const CopySide& s, transport::Writer& w) {
  w.U8(s.type);
  if (s.type == CU_MEMORYTYPE_HOST) return;
  w.U64(s.handle);
  w.U64(s.x);
  w.U64(s.y);
  w.U64(s.z);
  if (s.type == CU_MEMORYTYPE_DEVICE) {
    w.U64(s.pitch);
    w.U64(s.height);
  }
}

inline bool ReadCopySide(transport::Reader& rd, CopySide* s) {
  if (!rd.U8(&s->type)) return false;
  if (s->type == CU_MEMORYTYPE_HOST) return true;
  if (s->type != CU_MEMORYTYPE_DEVICE && s->type != CU_MEMORYTYPE_ARRAY) return false;
  rd.U64(&s->handle);
  rd.U64(&s->x);
  rd.U64(&s->y);
  if (!rd.U64(&s->z)) return false;
  if (s->type == CU_MEMORYTYPE_DEVICE) {
    rd.U64(&s->pitch);
    return rd.U64(&s->height);
  }
  return true;
}

// A sub-box of a copy of (width bytes x height rows x depth slices) whose packed bytes (rows of
// the part's width, in row-major order) are one contiguous run of the whole copy's packed bytes,
// starting at `offset`.
struct CopyPart {
  uint64_t x = 0, width = 0, y = 0, height = 0, z = 0, depth = 0;
  uint64_t offset = 0;
  uint64_t bytes() const { return width * height * depth; }
};

// Splits a copy into parts of at most `limit` packed bytes (limit >= 16, a multiple of 16 so that
// parts of a row start on an element of any array format), in packed order. Calls part(p) for
// each and stops at the first false. REQUIRES width, height, depth > 0.
template <class F>
bool SplitCopyBox(uint64_t width, uint64_t height, uint64_t depth, uint64_t limit, F part) {
  const uint64_t slice = width * height;
  if (slice <= limit) {
    const uint64_t k = limit / slice;
    for (uint64_t z = 0; z < depth; z += k) {
      if (!part(CopyPart{0, width, 0, height, z, std::min(k, depth - z), z * slice})) return false;
    }
  } else if (width <= limit) {
    const uint64_t rows = limit / width;
    for (uint64_t z = 0; z < depth; ++z) {
      for (uint64_t y = 0; y < height; y += rows) {
        if (!part(CopyPart{0, width, y, std::min(rows, height - y), z, 1, z * slice + y * width})) {
          return false;
        }
      }
    }
  } else {
    for (uint64_t z = 0; z < depth; ++z) {
      for (uint64_t y = 0; y < height; ++y) {
        for (uint64_t x = 0; x < width; x += limit) {
          if (!part(CopyPart{x, std::min(limit, width - x), y, 1, z, 1, z * slice + y * width + x})) {
            return false;
          }
        }
      }
    }
  }
  return true;
}

// Largest coordinate, pitch or packed size of a copy the protocol accepts (a guard against
// overflow in size arithmetic).
inline constexpr uint64_t kMaxCopyExtent = 1ull << 48;

// Whether a box of width bytes x height x depth packs into at most kMaxCopyExtent bytes.
// REQUIRES width, height, depth > 0.
constexpr bool BoxFits(uint64_t width, uint64_t height, uint64_t depth) {
  return width <= kMaxCopyExtent && height <= kMaxCopyExtent / width &&
         depth <= kMaxCopyExtent / (width * height);
}

}  // namespace tf::remote
