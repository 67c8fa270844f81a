// CUDA arrays, mipmapped arrays, array and 2D/3D copies, texture and surface objects: forwarded
// to the worker (payloads: remote_arrays.h). Creating, destroying and querying arrays and
// mipmapped arrays, and creating and destroying texture and surface objects, is generated
// (api/remote_surface.tsv); what the client keeps of those calls is here (ClientDone_ hooks).
// Host operands of copies travel as data: a source is gathered into packed rows and sent in parts
// of at most the transport's bulk limit; a destination's packed rows arrive as kEvtCopyData events
// and are scattered into its pitch here. Array descriptors and the descriptors of texture and
// surface objects are answered locally; a plane of a multi-planar array (cuArrayGetPlane) is an
// array of its own there, kept until its owner is destroyed.
#include <cstring>
#include <unordered_set>
#include <vector>

#include "client/client_internal.h"
#include "client/remote_arrays.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::CopyPart;
using remote::CopySide;
using remote::Op;
using transport::Writer;

// Largest packed part of a copy with a host side (a multiple of 16, see SplitCopyBox).
uint64_t PartLimit(Session* s) {
  uint64_t limit = std::min<uint64_t>(s->transport->max_bulk_bytes(), 8ull << 20);
  return std::max<uint64_t>(limit & ~15ull, 16);
}

// ---- arrays

// The planes of these arrays leave the table with them.
void ForgetPlanes(Session* s, const std::unordered_set<uint64_t>& owners) {
  for (auto it = s->arrays.begin(); it != s->arrays.end();) {
    if (it->second.plane_of != 0 && owners.count(it->second.plane_of)) it = s->arrays.erase(it);
    else ++it;
  }
}

// ---- linear copies with an array (the array's bytes in row-major order, as the driver counts
// offsets)

struct LinearOut {
  uint8_t* dst;
  uint64_t n;
};
bool SinkLinear(void* ctx, uint64_t offset, const uint8_t* data, uint64_t len) {
  auto* c = static_cast<LinearOut*>(ctx);
  if (offset > c->n || len > c->n - offset) return false;
  memcpy(c->dst + offset, data, len);
  return true;
}

CUresult HostToArray(CUarray dst, size_t offset, const void* src, size_t n, CUstream stream,
                     bool async) {
  if (n == 0) return CUDA_SUCCESS;
  if (src == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  if (!s->arrays.count(H(dst))) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t slice = PartLimit(s);
  const uint8_t* p = static_cast<const uint8_t*>(src);
  for (uint64_t off = 0; off < n; off += slice) {
    const uint64_t len = std::min<uint64_t>(slice, n - off);
    uint8_t buf[32];
    Writer w(buf, sizeof(buf));
    w.U64(H(dst));
    w.U64(offset + off);
    CUresult r;
    if (async) {
      w.U64(H(stream));
      r = SendAsync(s, Op(Fn::cuMemcpyHtoAAsync_v2), w, p + off, len);
    } else {
      r = CallSync(s, Op(Fn::cuMemcpyHtoA_v2), w, nullptr, p + off, len);
    }
    if (r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}

CUresult ArrayToHost(void* dst, CUarray src, size_t offset, size_t n, CUstream stream, bool async) {
  if (n == 0) return CUDA_SUCCESS;
  if (dst == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  if (!s->arrays.count(H(src))) return CUDA_ERROR_INVALID_VALUE;
  uint8_t buf[32];
  Writer w(buf, sizeof(buf));
  w.U64(H(src));
  w.U64(offset);
  w.U64(n);
  if (async) w.U64(H(stream));
  LinearOut out{static_cast<uint8_t*>(dst), n};
  return CallSyncWithData(s, Op(async ? Fn::cuMemcpyAtoHAsync_v2 : Fn::cuMemcpyAtoH_v2), w,
                          &SinkLinear, &out);
}

// ---- 2D and 3D copies

// One side of a copy as the application described it, resolved: host sides keep their layout
// here (address of the box's first byte, pitch, rows per slice); the others travel.
struct Side {
  CopySide wire;
  uint8_t* host = nullptr;
  uint64_t pitch = 0, height = 0;
};

struct Box {
  Side src, dst;
  uint64_t width = 0, height = 0, depth = 0;
};

CUresult ResolveSide(Session* s, CUmemorytype type, const void* host, CUdeviceptr dev, CUarray array,
                     uint64_t x, uint64_t y, uint64_t z, uint64_t pitch, uint64_t height,
                     const Box& box, Side* out) {
  if (type == CU_MEMORYTYPE_UNIFIED) {
    // Unified addressing: the client's device allocations are device memory, the rest is host.
    if (FindDeviceAlloc(s, dev) != nullptr) {
      type = CU_MEMORYTYPE_DEVICE;
    } else {
      type = CU_MEMORYTYPE_HOST;
      host = reinterpret_cast<const void*>(dev);
    }
  }
  out->wire.type = static_cast<uint8_t>(type);
  switch (type) {
    case CU_MEMORYTYPE_HOST: {
      if (host == nullptr) return CUDA_ERROR_INVALID_VALUE;
      // Rows may not overlap: the driver refuses a pitch below the width, as it does here.
      if ((box.height > 1 || box.depth > 1) && pitch < box.width) return CUDA_ERROR_INVALID_VALUE;
      if (box.depth > 1 && height < box.height) return CUDA_ERROR_INVALID_VALUE;
      if (pitch > remote::kMaxCopyExtent || height > remote::kMaxCopyExtent ||
          x > remote::kMaxCopyExtent || y > remote::kMaxCopyExtent || z > remote::kMaxCopyExtent) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      out->host = const_cast<uint8_t*>(static_cast<const uint8_t*>(host)) + (z * height + y) * pitch + x;
      out->pitch = pitch;
      out->height = height;
      return CUDA_SUCCESS;
    }
    case CU_MEMORYTYPE_DEVICE:
      out->wire.handle = dev;
      out->wire.pitch = pitch;
      out->wire.height = height;
      break;
    case CU_MEMORYTYPE_ARRAY:
      if (!s->arrays.count(H(array))) return CUDA_ERROR_INVALID_VALUE;
      out->wire.handle = H(array);
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  out->wire.x = x;
  out->wire.y = y;
  out->wire.z = z;
  return CUDA_SUCCESS;
}

// The address of packed row `row` (counted over all slices) of a host side.
uint8_t* HostRow(const Side& h, uint64_t box_height, uint64_t row) {
  return h.host + ((row / box_height) * h.height + row % box_height) * h.pitch;
}

// Scatters packed bytes of a device-to-host copy into the destination's layout.
struct ScatterOut {
  const Box* box;
  uint64_t total;
};
bool SinkScatter(void* ctx, uint64_t offset, const uint8_t* data, uint64_t len) {
  auto* c = static_cast<ScatterOut*>(ctx);
  if (offset > c->total || len > c->total - offset) return false;
  const Box& b = *c->box;
  while (len > 0) {
    const uint64_t row = offset / b.width, col = offset % b.width;
    const uint64_t n = std::min(len, b.width - col);
    memcpy(HostRow(b.dst, b.height, row) + col, data, n);
    offset += n;
    data += n;
    len -= n;
  }
  return true;
}

void WriteBox(const CopySide& src, const CopySide& dst, uint64_t w, uint64_t h, uint64_t d,
              Writer& out) {
  remote::WriteCopySide(src, out);
  remote::WriteCopySide(dst, out);
  out.U64(w);
  out.U64(h);
  out.U64(d);
}

// Host to host: in stream order (after the work queued before it), then copied row by row here.
CUresult HostToHost(const Box& b, CUstream stream, bool async) {
  CUresult r = async ? Impl_cuStreamSynchronize(stream) : Impl_cuCtxSynchronize();
  if (r != CUDA_SUCCESS) return r;
  for (uint64_t row = 0; row < b.height * b.depth; ++row) {
    memmove(HostRow(b.dst, b.height, row), HostRow(b.src, b.height, row), b.width);
  }
  return CUDA_SUCCESS;
}

// fn: the synchronous or asynchronous 2D or 3D entry point the worker replays.
CUresult Copy(Fn fn, bool async, CUstream stream, Box& b,
              CUresult (*resolve)(Session*, const void*, Box*), const void* desc) {
  if (b.width == 0 || b.height == 0 || b.depth == 0) return CUDA_SUCCESS;
  if (!remote::BoxFits(b.width, b.height, b.depth)) return CUDA_ERROR_INVALID_VALUE;
  bool host_to_host = false;
  {
    TF_LOCK(l);
    TF_CTX(l);
    Session* s = l.session();
    if (CUresult r = resolve(s, desc, &b); r != CUDA_SUCCESS) return r;
    const bool src_host = b.src.wire.type == CU_MEMORYTYPE_HOST;
    const bool dst_host = b.dst.wire.type == CU_MEMORYTYPE_HOST;
    if (src_host && dst_host) {
      host_to_host = true;
    } else if (dst_host) {
      uint8_t buf[160];
      Writer w(buf, sizeof(buf));
      WriteBox(b.src.wire, b.dst.wire, b.width, b.height, b.depth, w);
      if (async) w.U64(H(stream));
      ScatterOut out{&b, b.width * b.height * b.depth};
      return CallSyncWithData(s, Op(fn), w, &SinkScatter, &out);
    } else if (src_host) {
      // Parts of packed rows, each a copy of its sub-box.
      std::vector<uint8_t> packed;
      CUresult r = CUDA_SUCCESS;
      remote::SplitCopyBox(b.width, b.height, b.depth, PartLimit(s), [&](const CopyPart& p) {
        packed.resize(p.bytes());
        uint8_t* at = packed.data();
        for (uint64_t z = 0; z < p.depth; ++z) {
          for (uint64_t y = 0; y < p.height; ++y) {
            const uint64_t row = (p.z + z) * b.height + p.y + y;
            memcpy(at, HostRow(b.src, b.height, row) + p.x, p.width);
            at += p.width;
          }
        }
        CopySide dst = b.dst.wire;
        dst.x += p.x;
        dst.y += p.y;
        dst.z += p.z;
        uint8_t buf[160];
        Writer w(buf, sizeof(buf));
        WriteBox(b.src.wire, dst, p.width, p.height, p.depth, w);
        if (async) {
          w.U64(H(stream));
          r = SendAsync(s, Op(fn), w, packed.data(), packed.size());
        } else {
          r = CallSync(s, Op(fn), w, nullptr, packed.data(), packed.size());
        }
        return r == CUDA_SUCCESS;
      });
      return r;
    } else {
      uint8_t buf[160];
      Writer w(buf, sizeof(buf));
      WriteBox(b.src.wire, b.dst.wire, b.width, b.height, b.depth, w);
      if (async) {
        w.U64(H(stream));
        return SendAsync(s, Op(fn), w);
      }
      return CallSync(s, Op(fn), w, nullptr);
    }
  }
  return host_to_host ? HostToHost(b, stream, async) : CUDA_SUCCESS;
}

CUresult Resolve2D(Session* s, const void* desc, Box* b) {
  const auto* c = static_cast<const CUDA_MEMCPY2D*>(desc);
  CUresult r = ResolveSide(s, c->srcMemoryType, c->srcHost, c->srcDevice, c->srcArray,
                           c->srcXInBytes, c->srcY, 0, c->srcPitch, c->Height, *b, &b->src);
  if (r != CUDA_SUCCESS) return r;
  return ResolveSide(s, c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray, c->dstXInBytes,
                     c->dstY, 0, c->dstPitch, c->Height, *b, &b->dst);
}

CUresult Resolve3D(Session* s, const void* desc, Box* b) {
  const auto* c = static_cast<const CUDA_MEMCPY3D*>(desc);
  if (c->srcLOD != 0 || c->dstLOD != 0 || c->reserved0 != nullptr || c->reserved1 != nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUresult r = ResolveSide(s, c->srcMemoryType, c->srcHost, c->srcDevice, c->srcArray,
                           c->srcXInBytes, c->srcY, c->srcZ, c->srcPitch, c->srcHeight, *b, &b->src);
  if (r != CUDA_SUCCESS) return r;
  return ResolveSide(s, c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray, c->dstXInBytes,
                     c->dstY, c->dstZ, c->dstPitch, c->dstHeight, *b, &b->dst);
}

CUresult Copy2D(Fn fn, const CUDA_MEMCPY2D* c, CUstream stream, bool async) {
  if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Box b;
  b.width = c->WidthInBytes;
  b.height = c->Height;
  b.depth = 1;
  return Copy(fn, async, stream, b, &Resolve2D, c);
}

CUresult Copy3D(Fn fn, const CUDA_MEMCPY3D* c, CUstream stream, bool async) {
  if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Box b;
  b.width = c->WidthInBytes;
  b.height = c->Height;
  b.depth = c->Depth;
  return Copy(fn, async, stream, b, &Resolve3D, c);
}

// The generated array calls (api/remote_surface.tsv, hook=client): what the client keeps of
// them. An array's descriptor (the driver's, after the handle in the reply) answers the
// descriptor queries and sizes batch operations; a level or a plane goes with its owner.
CUresult FileArray(Session* s, transport::Reader& reply, CUarray a, uint64_t mipmap, uint64_t plane_of) {
  Session::ArrayInfo info;
  info.mipmap = mipmap;
  info.plane_of = plane_of;
  if (!remote::ReadArrayDesc(reply, &info.desc) || !reply.Finish()) return CUDA_ERROR_UNKNOWN;
  s->arrays[H(a)] = info;
  return CUDA_SUCCESS;
}

}  // namespace

CUresult ClientDone_cuArrayCreate_v2(Session* s, transport::Reader& reply, CUarray* handle,
                                     const CUDA_ARRAY_DESCRIPTOR*) {
  return FileArray(s, reply, *handle, 0, 0);
}

CUresult ClientDone_cuArray3DCreate_v2(Session* s, transport::Reader& reply, CUarray* handle,
                                       const CUDA_ARRAY3D_DESCRIPTOR*) {
  return FileArray(s, reply, *handle, 0, 0);
}

CUresult ClientDone_cuArrayGetPlane(Session* s, transport::Reader& reply, CUarray* plane, CUarray array,
                                    unsigned int) {
  return FileArray(s, reply, *plane, 0, H(array));
}

CUresult ClientDone_cuMipmappedArrayGetLevel(Session* s, transport::Reader& reply, CUarray* level,
                                             CUmipmappedArray mipmap, unsigned int) {
  return FileArray(s, reply, *level, H(mipmap), 0);
}

void ClientDone_cuArrayDestroy(Session* s, CUarray array) {
  s->arrays.erase(H(array));
  ForgetPlanes(s, {H(array)});
}

void ClientDone_cuMipmappedArrayCreate(Session* s, CUmipmappedArray* handle, const CUDA_ARRAY3D_DESCRIPTOR*,
                                       unsigned int) {
  s->mipmaps.insert(H(*handle));
}

// Its levels die with it, and their planes.
void ClientDone_cuMipmappedArrayDestroy(Session* s, CUmipmappedArray mipmap) {
  s->mipmaps.erase(H(mipmap));
  std::unordered_set<uint64_t> levels;
  for (auto it = s->arrays.begin(); it != s->arrays.end();) {
    if (it->second.mipmap == H(mipmap)) {
      levels.insert(it->first);
      it = s->arrays.erase(it);
    } else {
      ++it;
    }
  }
  ForgetPlanes(s, levels);
}

CUresult Impl_cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR* desc, CUarray array) {
  if (desc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  auto it = l.session()->arrays.find(H(array));
  if (it == l.session()->arrays.end()) return CUDA_ERROR_INVALID_HANDLE;
  const CUDA_ARRAY3D_DESCRIPTOR& d = it->second.desc;
  *desc = CUDA_ARRAY_DESCRIPTOR{};
  desc->Width = d.Width;
  desc->Height = d.Height;
  desc->Format = d.Format;
  desc->NumChannels = d.NumChannels;
  return CUDA_SUCCESS;
}

CUresult Impl_cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR* desc, CUarray array) {
  if (desc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  auto it = l.session()->arrays.find(H(array));
  if (it == l.session()->arrays.end()) return CUDA_ERROR_INVALID_HANDLE;
  *desc = it->second.desc;
  return CUDA_SUCCESS;
}

CUresult Impl_cuMemcpyHtoA_v2(CUarray dst, size_t offset, const void* src, size_t n) {
  return HostToArray(dst, offset, src, n, nullptr, false);
}
CUresult Impl_cuMemcpyHtoAAsync_v2(CUarray dst, size_t offset, const void* src, size_t n,
                                   CUstream stream) {
  return HostToArray(dst, offset, src, n, stream, true);
}
CUresult Impl_cuMemcpyAtoH_v2(void* dst, CUarray src, size_t offset, size_t n) {
  return ArrayToHost(dst, src, offset, n, nullptr, false);
}
CUresult Impl_cuMemcpyAtoHAsync_v2(void* dst, CUarray src, size_t offset, size_t n,
                                   CUstream stream) {
  return ArrayToHost(dst, src, offset, n, stream, true);
}

CUresult Impl_cuMemcpyDtoA_v2(CUarray dst, size_t offset, CUdeviceptr src, size_t n) {
  TF_LOCK(l);
  TF_CTX(l);
  if (!l.session()->arrays.count(H(dst))) return CUDA_ERROR_INVALID_VALUE;
  uint8_t buf[32];
  Writer w(buf, sizeof(buf));
  w.U64(H(dst));
  w.U64(offset);
  w.U64(src);
  w.U64(n);
  return Simple(l, Fn::cuMemcpyDtoA_v2, w);
}

CUresult Impl_cuMemcpyAtoD_v2(CUdeviceptr dst, CUarray src, size_t offset, size_t n) {
  TF_LOCK(l);
  TF_CTX(l);
  if (!l.session()->arrays.count(H(src))) return CUDA_ERROR_INVALID_VALUE;
  uint8_t buf[32];
  Writer w(buf, sizeof(buf));
  w.U64(dst);
  w.U64(H(src));
  w.U64(offset);
  w.U64(n);
  return Simple(l, Fn::cuMemcpyAtoD_v2, w);
}

CUresult Impl_cuMemcpyAtoA_v2(CUarray dst, size_t dst_offset, CUarray src, size_t src_offset,
                              size_t n) {
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  if (!s->arrays.count(H(dst)) || !s->arrays.count(H(src))) return CUDA_ERROR_INVALID_VALUE;
  uint8_t buf[40];
  Writer w(buf, sizeof(buf));
  w.U64(H(dst));
  w.U64(dst_offset);
  w.U64(H(src));
  w.U64(src_offset);
  w.U64(n);
  return Simple(l, Fn::cuMemcpyAtoA_v2, w);
}

CUresult Impl_cuMemcpy2D_v2(const CUDA_MEMCPY2D* c) {
  return Copy2D(Fn::cuMemcpy2D_v2, c, nullptr, false);
}
CUresult Impl_cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D* c) {
  return Copy2D(Fn::cuMemcpy2DUnaligned_v2, c, nullptr, false);
}
CUresult Impl_cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D* c, CUstream stream) {
  return Copy2D(Fn::cuMemcpy2DAsync_v2, c, stream, true);
}
CUresult Impl_cuMemcpy3D_v2(const CUDA_MEMCPY3D* c) {
  return Copy3D(Fn::cuMemcpy3D_v2, c, nullptr, false);
}
CUresult Impl_cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D* c, CUstream stream) {
  return Copy3D(Fn::cuMemcpy3DAsync_v2, c, stream, true);
}

// The generated texture and surface object calls (api/remote_surface.tsv, hook=client): the
// client keeps what it sent, which answers the descriptor queries (class local).
void ClientDone_cuTexObjectCreate(Session* s, CUtexObject* object, const CUDA_RESOURCE_DESC* res,
                                  const CUDA_TEXTURE_DESC* tex, const CUDA_RESOURCE_VIEW_DESC* view) {
  Session::TextureInfo& info = s->textures[*object];
  info.res = *res;
  info.tex = *tex;
  info.has_view = view != nullptr;
  info.view = view != nullptr ? *view : CUDA_RESOURCE_VIEW_DESC{};
}

void ClientDone_cuTexObjectDestroy(Session* s, CUtexObject object) { s->textures.erase(object); }

void ClientDone_cuSurfObjectCreate(Session* s, CUsurfObject* object, const CUDA_RESOURCE_DESC* res) {
  s->surfaces[*object] = *res;
}

void ClientDone_cuSurfObjectDestroy(Session* s, CUsurfObject object) { s->surfaces.erase(object); }

CUresult Impl_cuTexObjectGetResourceDesc(CUDA_RESOURCE_DESC* res, CUtexObject object) {
  if (res == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  auto it = l.session()->textures.find(object);
  if (it == l.session()->textures.end()) return CUDA_ERROR_INVALID_VALUE;
  *res = it->second.res;
  return CUDA_SUCCESS;
}

CUresult Impl_cuTexObjectGetTextureDesc(CUDA_TEXTURE_DESC* tex, CUtexObject object) {
  if (tex == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  auto it = l.session()->textures.find(object);
  if (it == l.session()->textures.end()) return CUDA_ERROR_INVALID_VALUE;
  *tex = it->second.tex;
  return CUDA_SUCCESS;
}

CUresult Impl_cuTexObjectGetResourceViewDesc(CUDA_RESOURCE_VIEW_DESC* view, CUtexObject object) {
  if (view == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  auto it = l.session()->textures.find(object);
  if (it == l.session()->textures.end() || !it->second.has_view) return CUDA_ERROR_INVALID_VALUE;
  *view = it->second.view;
  return CUDA_SUCCESS;
}

CUresult Impl_cuSurfObjectGetResourceDesc(CUDA_RESOURCE_DESC* res, CUsurfObject object) {
  if (res == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  auto it = l.session()->surfaces.find(object);
  if (it == l.session()->surfaces.end()) return CUDA_ERROR_INVALID_VALUE;
  *res = it->second;
  return CUDA_SUCCESS;
}

}  // namespace tf::client
