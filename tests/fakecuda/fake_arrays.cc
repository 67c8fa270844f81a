// Fake driver arrays: CUDA arrays and mipmapped arrays with real byte storage (host memory, row-major
// without padding), their levels, array and 2D/3D copies, texture and surface objects.
//
// Copies check what the fake can know: an array operand's region must lie inside the array, a
// device operand's region inside one allocation (CUDA_ERROR_INVALID_VALUE otherwise); host
// operands are trusted, as the driver trusts them.
#include <algorithm>
#include <cstring>

#include "fake_driver.h"

namespace fakecuda {
namespace {

size_t FormatBytes(CUarray_format format) {
  switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    default:
      return 4;
  }
}

size_t ElementBytes(const CUDA_ARRAY3D_DESCRIPTOR& desc) {
  return desc.NumChannels * FormatBytes(desc.Format);
}

// The descriptor of level `level` of a mipmapped array: each extent halves, down to 1 (0 stays 0).
CUDA_ARRAY3D_DESCRIPTOR LevelDesc(const CUDA_ARRAY3D_DESCRIPTOR& desc, unsigned level) {
  CUDA_ARRAY3D_DESCRIPTOR d = desc;
  d.Width = std::max<size_t>(desc.Width >> level, 1);
  d.Height = desc.Height == 0 ? 0 : std::max<size_t>(desc.Height >> level, 1);
  d.Depth = desc.Depth == 0 ? 0 : std::max<size_t>(desc.Depth >> level, 1);
  return d;
}

// Bytes of one level: width * height * depth * element size.
size_t LevelBytes(const CUDA_ARRAY3D_DESCRIPTOR& desc, unsigned level) {
  CUDA_ARRAY3D_DESCRIPTOR d = LevelDesc(desc, level);
  return d.Width * std::max<size_t>(d.Height, 1) * std::max<size_t>(d.Depth, 1) * ElementBytes(d);
}

CUresult CreateArray(FakeArray** out, const CUDA_ARRAY3D_DESCRIPTOR& desc, unsigned levels,
                     bool mipmapped) {
  if (desc.Width == 0 || desc.NumChannels == 0 || desc.NumChannels > 4 || levels == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (desc.Depth != 0 && desc.Height == 0) return CUDA_ERROR_INVALID_VALUE;
  const bool nv12 = desc.Format == CU_AD_FORMAT_NV12;
  if (nv12 && (desc.NumChannels != 3 || desc.Width % 2 != 0 || desc.Height == 0 || desc.Height % 2 != 0 ||
               desc.Depth != 0 || mipmapped)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  size_t bytes = 0;
  for (unsigned level = 0; level < levels; ++level) bytes += LevelBytes(desc, level);
  // NV12: a plane of luma bytes, then one of half the width and height with 2-byte chroma pairs.
  if (nv12) bytes = desc.Width * desc.Height + (desc.Width / 2) * (desc.Height / 2) * 2;
  bytes = RoundUp(bytes, kGranularity);
  auto array = std::make_unique<FakeArray>();
  array->device = ctx->device;
  array->desc = desc;
  array->levels = levels;
  array->bytes = bytes;
  array->mipmapped = mipmapped;
  if (mipmapped) array->level_views.assign(levels, nullptr);
  if (nv12) array->level_views.assign(2, nullptr);  // its planes
  Driver& d = Driver::Get();
  {
    std::lock_guard<std::mutex> lock(d.mu);
    if (!d.Charge(ctx->device, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  array->mem = MapHostMemory(bytes);
  std::lock_guard<std::mutex> lock(d.mu);
  if (array->mem == nullptr) {
    d.Uncharge(ctx->device, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *out = array.get();
  d.arrays[array.get()] = std::move(array);
  return CUDA_SUCCESS;
}

// Destroys an array (mipmapped: a mipmapped array and its level views). A level view, or the
// other kind of handle, is CUDA_ERROR_INVALID_HANDLE.
CUresult DestroyArray(FakeArray* array, bool mipmapped) {
  Driver& d = Driver::Get();
  std::unique_ptr<FakeArray> owned;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.arrays.find(array);
    if (array == nullptr || it == d.arrays.end() || it->second->owner != nullptr ||
        it->second->mipmapped != mipmapped) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    owned = std::move(it->second);
    d.arrays.erase(it);
    for (FakeArray* view : owned->level_views) {
      if (view != nullptr) d.arrays.erase(view);
    }
    d.Uncharge(owned->device, owned->bytes);
  }
  UnmapHostMemory(owned->mem, owned->bytes);
  return CUDA_SUCCESS;
}

CUresult ArrayRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* req, FakeArray* array, CUdevice dev, bool mipmapped) {
  if (req == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  if (dev < 0 || dev >= d.topology.device_count) return CUDA_ERROR_INVALID_DEVICE;
  auto it = d.arrays.find(array);
  if (it == d.arrays.end() || it->second->mipmapped != mipmapped) return CUDA_ERROR_INVALID_HANDLE;
  *req = CUDA_ARRAY_MEMORY_REQUIREMENTS{};
  req->size = array->bytes;
  req->alignment = kGranularity;
  return CUDA_SUCCESS;
}

// REQUIRES d.mu. A plain array or a level view (not a mipmapped array), or nullptr.
FakeArray* FindArray(Driver& d, CUarray handle) {
  auto it = d.arrays.find(reinterpret_cast<FakeArray*>(handle));
  if (it == d.arrays.end() || it->second->mipmapped) return nullptr;
  return it->second.get();
}

// One operand of a copy, resolved: the address of the box's first byte, the bytes from one row to
// the next and from one slice to the next.
struct Operand {
  unsigned char* base = nullptr;
  size_t pitch = 0, slice = 0;
};

// REQUIRES d.mu. Resolves and checks one operand of a copy of w bytes x h rows x depth slices.
CUresult ResolveOperand(Driver& d, CUmemorytype type, const void* host, CUdeviceptr dev,
                        CUarray array, size_t x, size_t y, size_t z, size_t pitch, size_t height,
                        size_t w, size_t h, size_t depth, Operand* out) {
  if (type == CU_MEMORYTYPE_UNIFIED) {
    Allocation* a = d.FindAllocation(dev);
    if (a != nullptr && !IsHostKind(a->kind)) {
      type = CU_MEMORYTYPE_DEVICE;
    } else {
      type = CU_MEMORYTYPE_HOST;
      host = reinterpret_cast<const void*>(dev);
    }
  }
  if (type == CU_MEMORYTYPE_ARRAY) {
    FakeArray* arr = FindArray(d, array);
    if (arr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const size_t row = arr->desc.Width * ElementBytes(arr->desc);
    const size_t rows = std::max<size_t>(arr->desc.Height, 1);
    const size_t slices = std::max<size_t>(arr->desc.Depth, 1);
    if (x > row || w > row - x || y > rows || h > rows - y || z > slices || depth > slices - z) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    out->pitch = row;
    out->slice = row * rows;
    out->base = static_cast<unsigned char*>(arr->mem) + z * out->slice + y * row + x;
    return CUDA_SUCCESS;
  }
  if (type != CU_MEMORYTYPE_HOST && type != CU_MEMORYTYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  if ((h > 1 || depth > 1) && pitch < w) return CUDA_ERROR_INVALID_VALUE;
  if (depth > 1 && height < h) return CUDA_ERROR_INVALID_VALUE;
  const size_t start = (z * height + y) * pitch + x;
  const size_t span = ((depth - 1) * height + (h - 1)) * pitch + w;
  if (type == CU_MEMORYTYPE_HOST) {
    if (host == nullptr) return CUDA_ERROR_INVALID_VALUE;
    out->base = const_cast<unsigned char*>(static_cast<const unsigned char*>(host)) + start;
  } else {
    Allocation* a = d.FindAllocation(dev + start);
    if (a == nullptr || IsHostKind(a->kind) || dev + start + span > a->base + a->size) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    out->base = reinterpret_cast<unsigned char*>(dev + start);
  }
  out->pitch = pitch;
  out->slice = height * pitch;
  return CUDA_SUCCESS;
}

struct BoxCopy {
  Operand src, dst;
  size_t w = 0, h = 0, depth = 0;
  void Run() const {
    for (size_t z = 0; z < depth; ++z) {
      for (size_t y = 0; y < h; ++y) {
        std::memmove(dst.base + z * dst.slice + y * dst.pitch, src.base + z * src.slice + y * src.pitch,
                     w);
      }
    }
  }
};

CUresult Prepare3D(const CUDA_MEMCPY3D* c, BoxCopy* out) {
  if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
  out->w = c->WidthInBytes;
  out->h = c->Height;
  out->depth = c->Depth;
  if (out->w == 0 || out->h == 0 || out->depth == 0) return CUDA_SUCCESS;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  CUresult r = ResolveOperand(d, c->srcMemoryType, c->srcHost, c->srcDevice, c->srcArray,
                              c->srcXInBytes, c->srcY, c->srcZ, c->srcPitch, c->srcHeight, out->w,
                              out->h, out->depth, &out->src);
  if (r != CUDA_SUCCESS) return r;
  return ResolveOperand(d, c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray, c->dstXInBytes,
                        c->dstY, c->dstZ, c->dstPitch, c->dstHeight, out->w, out->h, out->depth,
                        &out->dst);
}

CUresult Prepare2D(const CUDA_MEMCPY2D* c, BoxCopy* out) {
  if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_MEMCPY3D m = {};
  m.srcXInBytes = c->srcXInBytes;
  m.srcY = c->srcY;
  m.srcMemoryType = c->srcMemoryType;
  m.srcHost = c->srcHost;
  m.srcDevice = c->srcDevice;
  m.srcArray = c->srcArray;
  m.srcPitch = c->srcPitch;
  m.srcHeight = c->Height;
  m.dstXInBytes = c->dstXInBytes;
  m.dstY = c->dstY;
  m.dstMemoryType = c->dstMemoryType;
  m.dstHost = c->dstHost;
  m.dstDevice = c->dstDevice;
  m.dstArray = c->dstArray;
  m.dstPitch = c->dstPitch;
  m.dstHeight = c->Height;
  m.WidthInBytes = c->WidthInBytes;
  m.Height = c->Height;
  m.Depth = 1;
  return Prepare3D(&m, out);
}

CUresult RunBox(const BoxCopy& b, bool async, CUstream stream) {
  if (b.w == 0 || b.h == 0 || b.depth == 0) return CUDA_SUCCESS;
  if (async) return RunAsync(stream, [b] { b.Run(); });
  return RunSynchronous([&b] { b.Run(); });
}

// The 1D copies: an array's bytes in row-major order from `offset`, as one row of a box.
CUresult ArrayBytes(CUarray array, size_t offset, size_t n, unsigned char** at) {
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  FakeArray* arr = FindArray(d, array);
  if (arr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const size_t total = arr->desc.Width * ElementBytes(arr->desc) *
                       std::max<size_t>(arr->desc.Height, 1) * std::max<size_t>(arr->desc.Depth, 1);
  if (offset > total || n > total - offset) return CUDA_ERROR_INVALID_VALUE;
  *at = static_cast<unsigned char*>(arr->mem) + offset;
  return CUDA_SUCCESS;
}

CUresult DeviceBytes(CUdeviceptr p, size_t n) {
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  Allocation* a = d.FindAllocation(p);
  if (a == nullptr || IsHostKind(a->kind) || p + n > a->base + a->size) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

// REQUIRES d.mu. Checks what a texture or surface object is made from.
CUresult CheckResource(Driver& d, const CUDA_RESOURCE_DESC* res) {
  if (res == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (res->resType) {
    case CU_RESOURCE_TYPE_ARRAY:
      return FindArray(d, res->res.array.hArray) != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY: {
      auto it = d.arrays.find(reinterpret_cast<FakeArray*>(res->res.mipmap.hMipmappedArray));
      return it != d.arrays.end() && it->second->mipmapped ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    }
    case CU_RESOURCE_TYPE_LINEAR: {
      Allocation* a = d.FindAllocation(res->res.linear.devPtr);
      const size_t n = res->res.linear.sizeInBytes;
      return a != nullptr && n > 0 && res->res.linear.devPtr + n <= a->base + a->size
                 ? CUDA_SUCCESS
                 : CUDA_ERROR_INVALID_VALUE;
    }
    case CU_RESOURCE_TYPE_PITCH2D: {
      const auto& p = res->res.pitch2D;
      const size_t row = p.width * p.numChannels * FormatBytes(p.format);
      Allocation* a = d.FindAllocation(p.devPtr);
      if (a == nullptr || p.width == 0 || p.height == 0 || row > p.pitchInBytes) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      return p.devPtr + (p.height - 1) * p.pitchInBytes + row <= a->base + a->size
                 ? CUDA_SUCCESS
                 : CUDA_ERROR_INVALID_VALUE;
    }
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult CreateObject(unsigned long long* out, TexObject obj) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  if (CUresult r = CheckResource(d, &obj.res); r != CUDA_SUCCESS) return r;
  *out = d.next_object++;
  d.objects[*out] = obj;
  return CUDA_SUCCESS;
}

// The object `handle` of the given kind, or nullptr. REQUIRES d.mu.
TexObject* FindObject(Driver& d, unsigned long long handle, bool surface) {
  auto it = d.objects.find(handle);
  return it == d.objects.end() || it->second.surface != surface ? nullptr : &it->second;
}

CUresult DestroyObject(unsigned long long handle, bool surface) {
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  if (FindObject(d, handle, surface) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  d.objects.erase(handle);
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace fakecuda

using fakecuda::Driver;

// ---- Arrays and mipmapped arrays ----

CUresult cuArrayCreate_v2(CUarray* handle, const CUDA_ARRAY_DESCRIPTOR* desc) {
  FAKECUDA_ENTER();
  if (handle == nullptr || desc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_ARRAY3D_DESCRIPTOR d3{};
  d3.Width = desc->Width;
  d3.Height = desc->Height;
  d3.Format = desc->Format;
  d3.NumChannels = desc->NumChannels;
  return fakecuda::CreateArray(reinterpret_cast<fakecuda::FakeArray**>(handle), d3, 1, false);
}

CUresult cuArray3DCreate_v2(CUarray* handle, const CUDA_ARRAY3D_DESCRIPTOR* desc) {
  FAKECUDA_ENTER();
  if (handle == nullptr || desc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return fakecuda::CreateArray(reinterpret_cast<fakecuda::FakeArray**>(handle), *desc, 1, false);
}

CUresult cuArrayDestroy(CUarray handle) {
  FAKECUDA_ENTER();
  return fakecuda::DestroyArray(reinterpret_cast<fakecuda::FakeArray*>(handle), false);
}

CUresult cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR* desc, CUarray handle) {
  FAKECUDA_ENTER();
  if (desc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::FakeArray* arr = fakecuda::FindArray(d, handle);
  if (arr == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *desc = arr->desc;
  return CUDA_SUCCESS;
}

CUresult cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR* desc, CUarray handle) {
  FAKECUDA_ENTER();
  if (desc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_ARRAY3D_DESCRIPTOR d3{};
  if (CUresult r = cuArray3DGetDescriptor_v2(&d3, handle); r != CUDA_SUCCESS) return r;
  *desc = CUDA_ARRAY_DESCRIPTOR{};
  desc->Width = d3.Width;
  desc->Height = d3.Height;
  desc->Format = d3.Format;
  desc->NumChannels = d3.NumChannels;
  return CUDA_SUCCESS;
}

CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* req, CUarray handle,
                                      CUdevice dev) {
  FAKECUDA_ENTER();
  return fakecuda::ArrayRequirements(req, reinterpret_cast<fakecuda::FakeArray*>(handle), dev, false);
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray* handle, const CUDA_ARRAY3D_DESCRIPTOR* desc,
                                unsigned int levels) {
  FAKECUDA_ENTER();
  if (handle == nullptr || desc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return fakecuda::CreateArray(reinterpret_cast<fakecuda::FakeArray**>(handle), *desc, levels, true);
}

CUresult cuMipmappedArrayGetLevel(CUarray* level_array, CUmipmappedArray handle, unsigned int level) {
  FAKECUDA_ENTER();
  if (level_array == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.arrays.find(reinterpret_cast<fakecuda::FakeArray*>(handle));
  if (it == d.arrays.end() || !it->second->mipmapped) return CUDA_ERROR_INVALID_HANDLE;
  fakecuda::FakeArray* m = it->second.get();
  if (level >= m->levels) return CUDA_ERROR_INVALID_VALUE;
  if (m->level_views[level] == nullptr) {
    size_t offset = 0;
    for (unsigned l = 0; l < level; ++l) offset += fakecuda::LevelBytes(m->desc, l);
    auto view = std::make_unique<fakecuda::FakeArray>();
    view->device = m->device;
    view->desc = fakecuda::LevelDesc(m->desc, level);
    view->mem = static_cast<unsigned char*>(m->mem) + offset;
    view->owner = m;
    m->level_views[level] = view.get();
    d.arrays[view.get()] = std::move(view);
  }
  *level_array = reinterpret_cast<CUarray>(m->level_views[level]);
  return CUDA_SUCCESS;
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray handle) {
  FAKECUDA_ENTER();
  return fakecuda::DestroyArray(reinterpret_cast<fakecuda::FakeArray*>(handle), true);
}

CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* req,
                                               CUmipmappedArray handle, CUdevice dev) {
  FAKECUDA_ENTER();
  return fakecuda::ArrayRequirements(req, reinterpret_cast<fakecuda::FakeArray*>(handle), dev, true);
}

// ---- Copies with arrays (1D: the array's bytes in row-major order) ----

CUresult cuMemcpyHtoA_v2(CUarray dst, size_t offset, const void* src, size_t n) {
  FAKECUDA_ENTER();
  unsigned char* at = nullptr;
  if (CUresult r = fakecuda::ArrayBytes(dst, offset, n, &at); r != CUDA_SUCCESS) return r;
  return fakecuda::RunSynchronous([=] { std::memcpy(at, src, n); });
}

CUresult cuMemcpyHtoAAsync_v2(CUarray dst, size_t offset, const void* src, size_t n,
                              CUstream stream) {
  FAKECUDA_ENTER();
  unsigned char* at = nullptr;
  if (CUresult r = fakecuda::ArrayBytes(dst, offset, n, &at); r != CUDA_SUCCESS) return r;
  return fakecuda::RunAsync(stream, [=] { std::memcpy(at, src, n); });
}

CUresult cuMemcpyAtoH_v2(void* dst, CUarray src, size_t offset, size_t n) {
  FAKECUDA_ENTER();
  unsigned char* at = nullptr;
  if (CUresult r = fakecuda::ArrayBytes(src, offset, n, &at); r != CUDA_SUCCESS) return r;
  return fakecuda::RunSynchronous([=] { std::memcpy(dst, at, n); });
}

CUresult cuMemcpyAtoHAsync_v2(void* dst, CUarray src, size_t offset, size_t n, CUstream stream) {
  FAKECUDA_ENTER();
  unsigned char* at = nullptr;
  if (CUresult r = fakecuda::ArrayBytes(src, offset, n, &at); r != CUDA_SUCCESS) return r;
  return fakecuda::RunAsync(stream, [=] { std::memcpy(dst, at, n); });
}

CUresult cuMemcpyDtoA_v2(CUarray dst, size_t offset, CUdeviceptr src, size_t n) {
  FAKECUDA_ENTER();
  unsigned char* at = nullptr;
  if (CUresult r = fakecuda::ArrayBytes(dst, offset, n, &at); r != CUDA_SUCCESS) return r;
  if (CUresult r = fakecuda::DeviceBytes(src, n); r != CUDA_SUCCESS) return r;
  return fakecuda::RunSynchronous([=] { std::memmove(at, reinterpret_cast<void*>(src), n); });
}

CUresult cuMemcpyAtoD_v2(CUdeviceptr dst, CUarray src, size_t offset, size_t n) {
  FAKECUDA_ENTER();
  unsigned char* at = nullptr;
  if (CUresult r = fakecuda::ArrayBytes(src, offset, n, &at); r != CUDA_SUCCESS) return r;
  if (CUresult r = fakecuda::DeviceBytes(dst, n); r != CUDA_SUCCESS) return r;
  return fakecuda::RunSynchronous([=] { std::memmove(reinterpret_cast<void*>(dst), at, n); });
}

CUresult cuMemcpyAtoA_v2(CUarray dst, size_t dst_offset, CUarray src, size_t src_offset, size_t n) {
  FAKECUDA_ENTER();
  unsigned char *to = nullptr, *from = nullptr;
  if (CUresult r = fakecuda::ArrayBytes(dst, dst_offset, n, &to); r != CUDA_SUCCESS) return r;
  if (CUresult r = fakecuda::ArrayBytes(src, src_offset, n, &from); r != CUDA_SUCCESS) return r;
  return fakecuda::RunSynchronous([=] { std::memmove(to, from, n); });
}

// ---- 2D and 3D copies ----

CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D* c) {
  FAKECUDA_ENTER();
  fakecuda::BoxCopy b;
  if (CUresult r = fakecuda::Prepare2D(c, &b); r != CUDA_SUCCESS) return r;
  return fakecuda::RunBox(b, false, nullptr);
}

CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D* c) {
  FAKECUDA_ENTER();
  fakecuda::BoxCopy b;
  if (CUresult r = fakecuda::Prepare2D(c, &b); r != CUDA_SUCCESS) return r;
  return fakecuda::RunBox(b, false, nullptr);
}

CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D* c, CUstream stream) {
  FAKECUDA_ENTER();
  fakecuda::BoxCopy b;
  if (CUresult r = fakecuda::Prepare2D(c, &b); r != CUDA_SUCCESS) return r;
  return fakecuda::RunBox(b, true, stream);
}

CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D* c) {
  FAKECUDA_ENTER();
  fakecuda::BoxCopy b;
  if (CUresult r = fakecuda::Prepare3D(c, &b); r != CUDA_SUCCESS) return r;
  return fakecuda::RunBox(b, false, nullptr);
}

CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D* c, CUstream stream) {
  FAKECUDA_ENTER();
  fakecuda::BoxCopy b;
  if (CUresult r = fakecuda::Prepare3D(c, &b); r != CUDA_SUCCESS) return r;
  return fakecuda::RunBox(b, true, stream);
}

// ---- Texture and surface objects (bookkeeping: the fake has no texture units) ----

CUresult cuTexObjectCreate(CUtexObject* object, const CUDA_RESOURCE_DESC* res,
                           const CUDA_TEXTURE_DESC* tex, const CUDA_RESOURCE_VIEW_DESC* view) {
  FAKECUDA_ENTER();
  if (res == nullptr || tex == nullptr) return CUDA_ERROR_INVALID_VALUE;
  fakecuda::TexObject obj;
  obj.res = *res;
  obj.tex = *tex;
  obj.has_view = view != nullptr;
  if (view != nullptr) obj.view = *view;
  return fakecuda::CreateObject(object, obj);
}

CUresult cuTexObjectDestroy(CUtexObject object) {
  FAKECUDA_ENTER();
  return fakecuda::DestroyObject(object, false);
}

CUresult cuTexObjectGetResourceDesc(CUDA_RESOURCE_DESC* res, CUtexObject object) {
  FAKECUDA_ENTER();
  if (res == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::TexObject* o = fakecuda::FindObject(d, object, false);
  if (o == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *res = o->res;
  return CUDA_SUCCESS;
}

CUresult cuTexObjectGetTextureDesc(CUDA_TEXTURE_DESC* tex, CUtexObject object) {
  FAKECUDA_ENTER();
  if (tex == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::TexObject* o = fakecuda::FindObject(d, object, false);
  if (o == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *tex = o->tex;
  return CUDA_SUCCESS;
}

CUresult cuTexObjectGetResourceViewDesc(CUDA_RESOURCE_VIEW_DESC* view, CUtexObject object) {
  FAKECUDA_ENTER();
  if (view == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::TexObject* o = fakecuda::FindObject(d, object, false);
  if (o == nullptr || !o->has_view) return CUDA_ERROR_INVALID_VALUE;
  *view = o->view;
  return CUDA_SUCCESS;
}

CUresult cuSurfObjectCreate(CUsurfObject* object, const CUDA_RESOURCE_DESC* res) {
  FAKECUDA_ENTER();
  if (res == nullptr || res->resType != CU_RESOURCE_TYPE_ARRAY) return CUDA_ERROR_INVALID_VALUE;
  fakecuda::TexObject obj;
  obj.res = *res;
  obj.surface = true;
  return fakecuda::CreateObject(object, obj);
}

CUresult cuSurfObjectDestroy(CUsurfObject object) {
  FAKECUDA_ENTER();
  return fakecuda::DestroyObject(object, true);
}

CUresult cuSurfObjectGetResourceDesc(CUDA_RESOURCE_DESC* res, CUsurfObject object) {
  FAKECUDA_ENTER();
  if (res == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::TexObject* o = fakecuda::FindObject(d, object, true);
  if (o == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *res = o->res;
  return CUDA_SUCCESS;
}

// ---- Planes of multi-planar arrays and sparse properties ----

CUresult cuArrayGetPlane(CUarray* plane, CUarray handle, unsigned int index) {
  FAKECUDA_ENTER();
  if (plane == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::FakeArray* a = fakecuda::FindArray(d, handle);
  if (a == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (a->desc.Format != CU_AD_FORMAT_NV12 || index >= a->level_views.size()) return CUDA_ERROR_INVALID_VALUE;
  if (a->level_views[index] == nullptr) {
    auto view = std::make_unique<fakecuda::FakeArray>();
    view->device = a->device;
    view->desc = CUDA_ARRAY3D_DESCRIPTOR{};
    view->desc.Format = CU_AD_FORMAT_UNSIGNED_INT8;
    view->desc.Width = index == 0 ? a->desc.Width : a->desc.Width / 2;
    view->desc.Height = index == 0 ? a->desc.Height : a->desc.Height / 2;
    view->desc.NumChannels = index == 0 ? 1 : 2;
    view->mem = static_cast<unsigned char*>(a->mem) + (index == 0 ? 0 : a->desc.Width * a->desc.Height);
    view->owner = a;
    a->level_views[index] = view.get();
    d.arrays[view.get()] = std::move(view);
  }
  *plane = reinterpret_cast<CUarray>(a->level_views[index]);
  return CUDA_SUCCESS;
}

namespace {

// Fixed, plausible sparse properties: 64 KiB tiles 128 rows high (and one slice deep); the mip tail
// starts at the first level narrower or shorter than a tile and holds the rest, in whole tiles.
CUresult SparseProperties(CUDA_ARRAY_SPARSE_PROPERTIES* p, fakecuda::FakeArray* a) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if ((a->desc.Flags & CUDA_ARRAY3D_SPARSE) == 0) return CUDA_ERROR_INVALID_VALUE;
  const size_t elem = fakecuda::ElementBytes(a->desc);
  *p = CUDA_ARRAY_SPARSE_PROPERTIES{};
  p->tileExtent.width = static_cast<unsigned>(65536 / 128 / elem);
  p->tileExtent.height = 128;
  p->tileExtent.depth = 1;
  unsigned first = a->levels;
  size_t tail = 0;
  for (unsigned level = 0; level < a->levels; ++level) {
    CUDA_ARRAY3D_DESCRIPTOR d = fakecuda::LevelDesc(a->desc, level);
    if (first == a->levels && (d.Width < p->tileExtent.width || d.Height < p->tileExtent.height)) first = level;
    if (level >= first) tail += fakecuda::LevelBytes(a->desc, level);
  }
  p->miptailFirstLevel = first == a->levels ? 0 : first;
  p->miptailSize = fakecuda::RoundUp(tail, 65536);
  if (a->desc.Flags & CUDA_ARRAY3D_LAYERED) p->flags = CU_ARRAY_SPARSE_PROPERTIES_SINGLE_MIPTAIL;
  return CUDA_SUCCESS;
}

}  // namespace

CUresult cuArrayGetSparseProperties(CUDA_ARRAY_SPARSE_PROPERTIES* props, CUarray handle) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::FakeArray* a = fakecuda::FindArray(d, handle);
  if (a == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return SparseProperties(props, a);
}

CUresult cuMipmappedArrayGetSparseProperties(CUDA_ARRAY_SPARSE_PROPERTIES* props, CUmipmappedArray handle) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.arrays.find(reinterpret_cast<fakecuda::FakeArray*>(handle));
  if (it == d.arrays.end() || !it->second->mipmapped) return CUDA_ERROR_INVALID_HANDLE;
  return SparseProperties(props, it->second.get());
}
