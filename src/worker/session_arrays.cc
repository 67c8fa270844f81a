// Replays the array family for a session (session_arrays.h); payloads in remote_arrays.h.
#include "worker/session_arrays.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "client/remote_arrays.h"
#include "worker/generated_calls.h"

namespace tf::worker {
namespace {

using driver::Fn;
using remote::CopyPart;
using remote::CopySide;
using transport::Reader;
using transport::Writer;

#define CALL(fn, ...) (d_.fn ? d_.fn(__VA_ARGS__) : CUDA_ERROR_NOT_SUPPORTED)

uint64_t H(const void* p) { return reinterpret_cast<uint64_t>(p); }
template <class T>
T As(uint64_t v) {
  return reinterpret_cast<T>(v);
}

// a * b + c without overflow; false when it does not fit.
bool MulAdd(uint64_t a, uint64_t b, uint64_t c, uint64_t* out) {
  uint64_t m = 0;
  return !__builtin_mul_overflow(a, b, &m) && !__builtin_add_overflow(m, c, out);
}

bool IsAsync(Fn fn) { return fn == Fn::cuMemcpy2DAsync_v2 || fn == Fn::cuMemcpy3DAsync_v2; }
bool Is2D(Fn fn) {
  return fn == Fn::cuMemcpy2D_v2 || fn == Fn::cuMemcpy2DUnaligned_v2 || fn == Fn::cuMemcpy2DAsync_v2;
}

}  // namespace

bool SessionArrays::Handles(Fn fn) {
  switch (fn) {
    case Fn::cuArrayCreate_v2:
    case Fn::cuArray3DCreate_v2:
    case Fn::cuArrayDestroy:
    case Fn::cuArrayGetMemoryRequirements:
    case Fn::cuMipmappedArrayCreate:
    case Fn::cuMipmappedArrayGetLevel:
    case Fn::cuMipmappedArrayDestroy:
    case Fn::cuArrayGetPlane:
    case Fn::cuArrayGetSparseProperties:
    case Fn::cuMipmappedArrayGetSparseProperties:
    case Fn::cuMipmappedArrayGetMemoryRequirements:
    case Fn::cuMemcpyHtoA_v2:
    case Fn::cuMemcpyHtoAAsync_v2:
    case Fn::cuMemcpyAtoH_v2:
    case Fn::cuMemcpyAtoHAsync_v2:
    case Fn::cuMemcpyDtoA_v2:
    case Fn::cuMemcpyAtoD_v2:
    case Fn::cuMemcpyAtoA_v2:
    case Fn::cuMemcpy2D_v2:
    case Fn::cuMemcpy2DUnaligned_v2:
    case Fn::cuMemcpy2DAsync_v2:
    case Fn::cuMemcpy3D_v2:
    case Fn::cuMemcpy3DAsync_v2:
    case Fn::cuTexObjectCreate:
    case Fn::cuTexObjectDestroy:
    case Fn::cuSurfObjectCreate:
    case Fn::cuSurfObjectDestroy:
      return true;
    default:
      return false;
  }
}

// Synchronous copies, and the asynchronous ones that return data (sent reply-expected only then).
bool SessionArrays::IsSyncPoint(Fn fn) {
  switch (fn) {
    case Fn::cuMemcpyHtoA_v2:
    case Fn::cuMemcpyAtoH_v2:
    case Fn::cuMemcpyAtoHAsync_v2:
    case Fn::cuMemcpyDtoA_v2:
    case Fn::cuMemcpyAtoD_v2:
    case Fn::cuMemcpyAtoA_v2:
    case Fn::cuMemcpy2D_v2:
    case Fn::cuMemcpy2DUnaligned_v2:
    case Fn::cuMemcpy2DAsync_v2:
    case Fn::cuMemcpy3D_v2:
    case Fn::cuMemcpy3DAsync_v2:
      return true;
    default:
      return false;
  }
}

CUresult SessionArrays::Call(Fn fn, Reader& rd, const uint8_t* bulk, uint64_t bulk_len, Writer& out) {
  if (IsGenerated(fn)) return GeneratedCall(fn, rd, out);
  switch (fn) {
    case Fn::cuMemcpyHtoA_v2:
    case Fn::cuMemcpyHtoAAsync_v2:
    case Fn::cuMemcpyAtoH_v2:
    case Fn::cuMemcpyAtoHAsync_v2:
    case Fn::cuMemcpyDtoA_v2:
    case Fn::cuMemcpyAtoD_v2:
    case Fn::cuMemcpyAtoA_v2:
      return LinearCopy(fn, rd, bulk, bulk_len);
    case Fn::cuMemcpy2D_v2:
    case Fn::cuMemcpy2DUnaligned_v2:
    case Fn::cuMemcpy2DAsync_v2:
    case Fn::cuMemcpy3D_v2:
    case Fn::cuMemcpy3DAsync_v2:
      return BoxCopy(fn, rd, bulk, bulk_len);
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

void SessionArrays::File(CUarray a, const CUDA_ARRAY3D_DESCRIPTOR& asked, uint64_t mipmap, uint64_t plane_of,
                         Writer& reply) {
  ArrayEntry e;
  e.mipmap = mipmap;
  e.plane_of = plane_of;
  // What the driver says the array is (the client answers descriptor queries with it).
  if (CALL(cuArray3DGetDescriptor_v2, &e.desc, a) != CUDA_SUCCESS) e.desc = asked;
  arrays_[H(a)] = e;
  remote::WriteArrayDesc(e.desc, reply);
}

bool SessionArrays::Extent(uint64_t array, uint64_t* row_bytes, uint64_t* rows,
                           uint64_t* slices) const {
  auto it = arrays_.find(array);
  if (it == arrays_.end()) return false;
  const CUDA_ARRAY3D_DESCRIPTOR& d = it->second.desc;
  const uint64_t elem = uint64_t{remote::FormatBytes(d.Format)} * d.NumChannels;
  if (elem == 0 || d.Width > remote::kMaxCopyExtent || d.Height > remote::kMaxCopyExtent ||
      d.Depth > remote::kMaxCopyExtent) {
    return false;
  }
  *row_bytes = d.Width * elem;
  *rows = d.Height == 0 ? 1 : d.Height;
  *slices = d.Depth == 0 ? 1 : d.Depth;
  return true;
}

// The 1D copies count an array's bytes in row-major order from its first element.
CUresult SessionArrays::LinearCopy(Fn fn, Reader& rd, const uint8_t* bulk, uint64_t bulk_len) {
  uint64_t array = 0, offset = 0, n = 0, dev = 0, array2 = 0, offset2 = 0, s = 0;
  switch (fn) {
    case Fn::cuMemcpyHtoA_v2:
    case Fn::cuMemcpyHtoAAsync_v2:
      rd.U64(&array);
      rd.U64(&offset);
      if (fn == Fn::cuMemcpyHtoAAsync_v2) rd.U64(&s);
      if (bulk == nullptr) return CUDA_ERROR_INVALID_VALUE;
      n = bulk_len;
      break;
    case Fn::cuMemcpyAtoH_v2:
    case Fn::cuMemcpyAtoHAsync_v2:
      rd.U64(&array);
      rd.U64(&offset);
      rd.U64(&n);
      if (fn == Fn::cuMemcpyAtoHAsync_v2) rd.U64(&s);
      break;
    case Fn::cuMemcpyDtoA_v2:
      rd.U64(&array);
      rd.U64(&offset);
      rd.U64(&dev);
      rd.U64(&n);
      break;
    case Fn::cuMemcpyAtoD_v2:
      rd.U64(&dev);
      rd.U64(&array);
      rd.U64(&offset);
      rd.U64(&n);
      break;
    default:  // cuMemcpyAtoA_v2
      rd.U64(&array);
      rd.U64(&offset);
      rd.U64(&array2);
      rd.U64(&offset2);
      rd.U64(&n);
      break;
  }
  if (!rd.Finish() || n == 0) return CUDA_ERROR_INVALID_VALUE;
  if (!Real(HandleKind::kArray, array)) return CUDA_ERROR_INVALID_VALUE;
  if (fn == Fn::cuMemcpyAtoA_v2 && !Real(HandleKind::kArray, array2)) return CUDA_ERROR_INVALID_VALUE;
  auto inside = [&](uint64_t a, uint64_t off) {
    uint64_t row = 0, rows = 0, slices = 0, total = 0;
    return Extent(a, &row, &rows, &slices) && MulAdd(row, rows * slices, 0, &total) &&
           off <= total && n <= total - off;
  };
  if (!inside(array, offset)) return CUDA_ERROR_INVALID_VALUE;
  if (fn == Fn::cuMemcpyAtoA_v2 && !inside(array2, offset2)) return CUDA_ERROR_INVALID_VALUE;
  if ((fn == Fn::cuMemcpyDtoA_v2 || fn == Fn::cuMemcpyAtoD_v2) && !host_.DeviceRange(dev, n)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!host_.KnownStream(s)) return CUDA_ERROR_INVALID_HANDLE;
  CUarray a = As<CUarray>(array);
  CUstream st = As<CUstream>(s);
  switch (fn) {
    case Fn::cuMemcpyHtoA_v2:
      return CALL(cuMemcpyHtoA_v2, a, offset, bulk, n);
    case Fn::cuMemcpyHtoAAsync_v2: {
      // The bulk view dies at the next frame: a private copy lives until the stream ran it.
      std::unique_ptr<uint8_t[]> copy(new uint8_t[n]);
      memcpy(copy.get(), bulk, n);
      CUresult r = CALL(cuMemcpyHtoAAsync_v2, a, offset, copy.get(), n, st);
      if (r == CUDA_SUCCESS) host_.KeepUntilStreamDone(std::move(copy), st);
      return r;
    }
    case Fn::cuMemcpyAtoH_v2:
    case Fn::cuMemcpyAtoHAsync_v2: {
      const uint64_t slice = host_.CallDataLimit();
      for (uint64_t off = 0; off < n; off += slice) {
        const uint64_t len = std::min(slice, n - off);
        if (staging_.size() < len) staging_.resize(len);
        CUresult r = fn == Fn::cuMemcpyAtoH_v2
                         ? CALL(cuMemcpyAtoH_v2, staging_.data(), a, offset + off, len)
                         : CALL(cuMemcpyAtoHAsync_v2, staging_.data(), a, offset + off, len, st);
        if (r == CUDA_SUCCESS && fn == Fn::cuMemcpyAtoHAsync_v2) r = CALL(cuStreamSynchronize, st);
        if (r != CUDA_SUCCESS) return r;
        if (!host_.SendCallData(off, staging_.data(), len)) return CUDA_ERROR_UNKNOWN;
      }
      return CUDA_SUCCESS;
    }
    case Fn::cuMemcpyDtoA_v2:
      return CALL(cuMemcpyDtoA_v2, a, offset, dev, n);
    case Fn::cuMemcpyAtoD_v2:
      return CALL(cuMemcpyAtoD_v2, dev, a, offset, n);
    default:
      return CALL(cuMemcpyAtoA_v2, a, offset, As<CUarray>(array2), offset2, n);
  }
}

// Copies one box, as the client's entry point would: the 2D entry points for the 2D calls.
CUresult SessionArrays::RunCopy(Fn fn, const CUDA_MEMCPY3D& c, CUstream st) {
  if (!Is2D(fn)) {
    return fn == Fn::cuMemcpy3D_v2 ? CALL(cuMemcpy3D_v2, &c) : CALL(cuMemcpy3DAsync_v2, &c, st);
  }
  CUDA_MEMCPY2D m = {};
  m.srcXInBytes = c.srcXInBytes;
  m.srcY = c.srcY;
  m.srcMemoryType = c.srcMemoryType;
  m.srcHost = c.srcHost;
  m.srcDevice = c.srcDevice;
  m.srcArray = c.srcArray;
  m.srcPitch = c.srcPitch;
  m.dstXInBytes = c.dstXInBytes;
  m.dstY = c.dstY;
  m.dstMemoryType = c.dstMemoryType;
  m.dstHost = c.dstHost;
  m.dstDevice = c.dstDevice;
  m.dstArray = c.dstArray;
  m.dstPitch = c.dstPitch;
  m.WidthInBytes = c.WidthInBytes;
  m.Height = c.Height;
  switch (fn) {
    case Fn::cuMemcpy2D_v2: return CALL(cuMemcpy2D_v2, &m);
    case Fn::cuMemcpy2DUnaligned_v2: return CALL(cuMemcpy2DUnaligned_v2, &m);
    default: return CALL(cuMemcpy2DAsync_v2, &m, st);
  }
}

namespace {

// Writes a checked device or array side into the driver's copy descriptor (the src or dst half).
void FillSide(const CopySide& s, CUmemorytype* type, CUdeviceptr* dev, CUarray* array, size_t* x,
              size_t* y, size_t* z, size_t* pitch, size_t* height) {
  *type = static_cast<CUmemorytype>(s.type);
  if (s.type == CU_MEMORYTYPE_DEVICE) {
    *dev = s.handle;
    *pitch = s.pitch;
    *height = s.height;
  } else {
    *array = As<CUarray>(s.handle);
  }
  *x = s.x;
  *y = s.y;
  *z = s.z;
}

}  // namespace

CUresult SessionArrays::BoxCopy(Fn fn, Reader& rd, const uint8_t* bulk, uint64_t bulk_len) {
  CopySide src, dst;
  uint64_t w = 0, h = 0, depth = 0, s = 0;
  if (!remote::ReadCopySide(rd, &src) || !remote::ReadCopySide(rd, &dst)) return CUDA_ERROR_INVALID_VALUE;
  rd.U64(&w);
  rd.U64(&h);
  rd.U64(&depth);
  if (IsAsync(fn)) rd.U64(&s);
  if (!rd.Finish() || w == 0 || h == 0 || depth == 0 || !remote::BoxFits(w, h, depth)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (Is2D(fn) && (depth != 1 || src.z != 0 || dst.z != 0)) return CUDA_ERROR_INVALID_VALUE;
  const bool src_host = src.type == CU_MEMORYTYPE_HOST, dst_host = dst.type == CU_MEMORYTYPE_HOST;
  const uint64_t packed = w * h * depth;
  // Host to host never leaves the client; a host source is exactly the packed box.
  if (src_host && dst_host) return CUDA_ERROR_INVALID_VALUE;
  if (src_host ? (bulk == nullptr || bulk_len != packed) : bulk != nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Device and array operands: the whole region inside one allocation or inside the array.
  auto inside = [&](const CopySide& side) {
    if (side.type == CU_MEMORYTYPE_HOST) return true;
    if (side.x > remote::kMaxCopyExtent || side.y > remote::kMaxCopyExtent ||
        side.z > remote::kMaxCopyExtent) {
      return false;
    }
    if (side.type == CU_MEMORYTYPE_ARRAY) {
      uint64_t row = 0, rows = 0, slices = 0;
      return Extent(side.handle, &row, &rows, &slices) && side.x <= row && w <= row - side.x &&
             side.y <= rows && h <= rows - side.y && side.z <= slices && depth <= slices - side.z;
    }
    // Rows may not overlap; every byte from the first row's start to the last row's end lies in
    // one allocation (so every row does).
    if ((h > 1 || depth > 1) && side.pitch < w) return false;
    if (depth > 1 && side.height < h) return false;
    if (side.pitch > remote::kMaxCopyExtent || side.height > remote::kMaxCopyExtent) return false;
    uint64_t first_row = 0, start = 0, last_row = 0, span = 0;
    return MulAdd(side.z, side.height, side.y, &first_row) &&
           MulAdd(first_row, side.pitch, side.x, &start) &&
           !__builtin_add_overflow(side.handle, start, &start) &&
           MulAdd(depth - 1, side.height, h - 1, &last_row) &&
           MulAdd(last_row, side.pitch, w, &span) && host_.DeviceRange(start, span);
  };
  // Array operands: names of the session's arrays, the driver's handles from here on.
  for (CopySide* side : {&src, &dst}) {
    if (side->type == CU_MEMORYTYPE_ARRAY && !Real(HandleKind::kArray, side->handle)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  if (!inside(src) || !inside(dst)) return CUDA_ERROR_INVALID_VALUE;
  if (!host_.KnownStream(s)) return CUDA_ERROR_INVALID_HANDLE;
  CUstream st = As<CUstream>(s);

  CUDA_MEMCPY3D c = {};
  if (!src_host) {
    FillSide(src, &c.srcMemoryType, &c.srcDevice, &c.srcArray, &c.srcXInBytes, &c.srcY, &c.srcZ,
             &c.srcPitch, &c.srcHeight);
  }
  if (!dst_host) {
    FillSide(dst, &c.dstMemoryType, &c.dstDevice, &c.dstArray, &c.dstXInBytes, &c.dstY, &c.dstZ,
             &c.dstPitch, &c.dstHeight);
  }
  c.WidthInBytes = w;
  c.Height = h;
  c.Depth = depth;
  if (src_host) {
    c.srcMemoryType = CU_MEMORYTYPE_HOST;
    c.srcPitch = w;
    c.srcHeight = h;
    if (!IsAsync(fn)) {
      c.srcHost = bulk;
      return RunCopy(fn, c, st);
    }
    // The bulk view dies at the next frame: a private copy lives until the stream ran it.
    std::unique_ptr<uint8_t[]> copy(new uint8_t[packed]);
    memcpy(copy.get(), bulk, packed);
    c.srcHost = copy.get();
    CUresult r = RunCopy(fn, c, st);
    if (r == CUDA_SUCCESS) host_.KeepUntilStreamDone(std::move(copy), st);
    return r;
  }
  if (!dst_host) return RunCopy(fn, c, st);
  // To the client: part by part into staging, each sent as the copy's data at its packed offset.
  c.dstMemoryType = CU_MEMORYTYPE_HOST;
  CUresult r = CUDA_SUCCESS;
  const uint64_t limit = std::max<uint64_t>(host_.CallDataLimit() & ~15ull, 16);
  remote::SplitCopyBox(w, h, depth, limit, [&](const CopyPart& p) {
    if (staging_.size() < p.bytes()) staging_.resize(p.bytes());
    CUDA_MEMCPY3D part = c;
    part.srcXInBytes += p.x;
    part.srcY += p.y;
    part.srcZ += p.z;
    part.dstHost = staging_.data();
    part.dstPitch = p.width;
    part.dstHeight = p.height;
    part.WidthInBytes = p.width;
    part.Height = p.height;
    part.Depth = p.depth;
    r = RunCopy(fn, part, st);
    if (r == CUDA_SUCCESS && IsAsync(fn)) r = CALL(cuStreamSynchronize, st);
    if (r != CUDA_SUCCESS) return false;
    if (!host_.SendCallData(p.offset, staging_.data(), p.bytes())) {
      r = CUDA_ERROR_UNKNOWN;
      return false;
    }
    return true;
  });
  return r;
}

// The live member of a resource descriptor, by its type, into a descriptor of that member alone
// (the rest zeroed, as the driver has always seen it here): an array or mipmapped array of the
// session (its name into the driver's handle), or device memory wholly inside one range of the
// session (linear: its bytes; pitch 2D: every row).
CUresult SessionArrays::CheckResource(CUDA_RESOURCE_DESC& res) {
  uint32_t type = 0;
  memcpy(&type, &res.resType, sizeof(type));
  CUDA_RESOURCE_DESC checked{};
  checked.resType = res.resType;
  checked.flags = res.flags;
  switch (type) {
    case CU_RESOURCE_TYPE_ARRAY: {
      uint64_t h = reinterpret_cast<uint64_t>(res.res.array.hArray);
      if (!Real(HandleKind::kArray, h) || !arrays_.count(h)) return CUDA_ERROR_INVALID_VALUE;
      checked.res.array.hArray = As<CUarray>(h);
      break;
    }
    case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY: {
      uint64_t h = reinterpret_cast<uint64_t>(res.res.mipmap.hMipmappedArray);
      if (!Real(HandleKind::kMipmappedArray, h) || !mipmaps_.count(h)) return CUDA_ERROR_INVALID_VALUE;
      checked.res.mipmap.hMipmappedArray = As<CUmipmappedArray>(h);
      break;
    }
    case CU_RESOURCE_TYPE_LINEAR: {
      const auto& l = res.res.linear;
      if (l.sizeInBytes == 0 || !host_.DeviceRange(l.devPtr, l.sizeInBytes)) return CUDA_ERROR_INVALID_VALUE;
      checked.res.linear.devPtr = l.devPtr;
      checked.res.linear.format = l.format;
      checked.res.linear.numChannels = l.numChannels;
      checked.res.linear.sizeInBytes = l.sizeInBytes;
      break;
    }
    case CU_RESOURCE_TYPE_PITCH2D: {
      const auto& p = res.res.pitch2D;
      uint32_t format = 0;
      memcpy(&format, &p.format, sizeof(format));
      // Every row inside one allocation: rows fit the pitch, the last one ends inside.
      const uint64_t elem = uint64_t{remote::FormatBytes(format)} * p.numChannels;
      uint64_t row = 0, span = 0;
      if (elem == 0 || p.width == 0 || p.height == 0 || !MulAdd(p.width, elem, 0, &row) || row > p.pitchInBytes ||
          !MulAdd(p.height - 1, p.pitchInBytes, row, &span) || !host_.DeviceRange(p.devPtr, span)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      checked.res.pitch2D.devPtr = p.devPtr;
      checked.res.pitch2D.format = p.format;
      checked.res.pitch2D.numChannels = p.numChannels;
      checked.res.pitch2D.width = p.width;
      checked.res.pitch2D.height = p.height;
      checked.res.pitch2D.pitchInBytes = p.pitchInBytes;
      break;
    }
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  res = checked;
  return CUDA_SUCCESS;
}

// Texture and surface objects (generated, hook=check,done): the resource is checked as above, the
// reserved words reach the driver zeroed (as they always have); an object is filed once made and
// only a filed one may be destroyed (else CUDA_ERROR_INVALID_VALUE).
CUresult SessionArrays::Check_cuTexObjectCreate(CUDA_RESOURCE_DESC& res, CUDA_TEXTURE_DESC& tex,
                                                CUDA_RESOURCE_VIEW_DESC* view) {
  if (CUresult r = CheckResource(res); r != CUDA_SUCCESS) return r;
  memset(tex.reserved, 0, sizeof(tex.reserved));
  if (view != nullptr) memset(view->reserved, 0, sizeof(view->reserved));
  return CUDA_SUCCESS;
}

// A surface reads and writes an array only.
CUresult SessionArrays::Check_cuSurfObjectCreate(CUDA_RESOURCE_DESC& res) {
  if (CUresult r = CheckResource(res); r != CUDA_SUCCESS) return r;
  return res.resType == CU_RESOURCE_TYPE_ARRAY ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

void SessionArrays::Cleanup() {
  for (uint64_t o : textures_) CALL(cuTexObjectDestroy, o);
  for (uint64_t o : surfaces_) CALL(cuSurfObjectDestroy, o);
  size_t arrays = 0;
  for (auto& [a, e] : arrays_) {
    if (e.mipmap == 0 && e.plane_of == 0 && CALL(cuArrayDestroy, As<CUarray>(a)) == CUDA_SUCCESS) ++arrays;
  }
  for (auto& [m, levels] : mipmaps_) CALL(cuMipmappedArrayDestroy, As<CUmipmappedArray>(m));
  if (arrays + mipmaps_.size() + textures_.size() + surfaces_.size() > 0) {
    fprintf(stderr,
            "tfusion-worker[%d]: session ended: destroyed %zu arrays, %zu mipmapped arrays, %zu "
            "texture and %zu surface objects\n",
            static_cast<int>(getpid()), arrays, mipmaps_.size(), textures_.size(), surfaces_.size());
  }
  for (auto& [a, e] : arrays_) host_.Handles().RetireReal(HandleKind::kArray, a);
  for (auto& [m, levels] : mipmaps_) host_.Handles().RetireReal(HandleKind::kMipmappedArray, m);
  textures_.clear();
  surfaces_.clear();
  arrays_.clear();
  mipmaps_.clear();
}

void SessionArrays::ForgetPlanes(const std::set<uint64_t>& owners) {
  for (auto it = arrays_.begin(); it != arrays_.end();) {
    if (it->second.plane_of != 0 && owners.count(it->second.plane_of)) {
      host_.Handles().RetireReal(HandleKind::kArray, it->first);
      it = arrays_.erase(it);
    } else {
      ++it;
    }
  }
}

// The array tables as the generated calls see them (api/remote_surface.tsv): an array or
// mipmapped array resolves only when this family filed it; a level or a plane may not be
// destroyed by itself; destroying an array forgets its planes, a mipmapped array its levels (and
// their planes). Created arrays, levels and planes are filed by the Done_ hooks below, which
// also send the driver's descriptor to the client.
class ArraysGeneratedHost final : public GeneratedHost {
 public:
  explicit ArraysGeneratedHost(SessionArrays& a) : a_(a) {}
  const driver::DriverTable& Driver() const override { return a_.d_; }
  HandleTable& Handles() override { return a_.host_.Handles(); }
  bool KnownDevice(int32_t d) const override { return a_.host_.KnownDevice(d); }
  bool DeviceRange(uint64_t p, uint64_t n) const override { return a_.host_.DeviceRange(p, n); }
  void AfterCall(Fn, CUresult) override {}
  GeneratedHooks& Hooks(Fn) override { return a_; }
  bool Resolve(HandleKind k, uint64_t wire, uint64_t* real) override {
    if (!Handles().Resolve(k, wire, real)) return false;
    if (k == HandleKind::kArray) return a_.arrays_.count(*real) != 0;
    if (k == HandleKind::kMipmappedArray) return a_.mipmaps_.count(*real) != 0;
    return true;
  }
  void Created(HandleKind k, uint64_t real) override {
    if (k == HandleKind::kMipmappedArray) a_.mipmaps_[real];
  }
  bool MayDestroy(HandleKind k, uint64_t real) const override {
    if (k != HandleKind::kArray) return true;
    auto it = a_.arrays_.find(real);
    return it != a_.arrays_.end() && it->second.mipmap == 0 && it->second.plane_of == 0;
  }
  void Destroyed(HandleKind k, uint64_t real) override {
    if (k == HandleKind::kArray) {
      a_.arrays_.erase(real);
      a_.ForgetPlanes({real});
      return;
    }
    auto it = a_.mipmaps_.find(real);
    if (k != HandleKind::kMipmappedArray || it == a_.mipmaps_.end()) return;
    // Its levels die with it (and their planes): their names fail from now on.
    for (uint64_t a : it->second) {
      a_.arrays_.erase(a);
      Handles().RetireReal(HandleKind::kArray, a);
    }
    a_.ForgetPlanes(it->second);
    a_.mipmaps_.erase(it);
  }

 private:
  SessionArrays& a_;
};

CUresult SessionArrays::GeneratedCall(Fn fn, Reader& rd, Writer& out) {
  ArraysGeneratedHost host(*this);
  return DispatchGenerated(fn, rd, out, host);
}

CUresult SessionArrays::Done_cuArrayCreate_v2(CUarray& a, const CUDA_ARRAY_DESCRIPTOR& d, Writer& reply) {
  CUDA_ARRAY3D_DESCRIPTOR asked = {};
  asked.Width = d.Width;
  asked.Height = d.Height;
  asked.Format = d.Format;
  asked.NumChannels = d.NumChannels;
  File(a, asked, 0, 0, reply);
  return CUDA_SUCCESS;
}

CUresult SessionArrays::Done_cuArray3DCreate_v2(CUarray& a, const CUDA_ARRAY3D_DESCRIPTOR& d, Writer& reply) {
  File(a, d, 0, 0, reply);
  return CUDA_SUCCESS;
}

// The driver gives the same plane (or level) the same handle, and so it keeps its name.
CUresult SessionArrays::Done_cuArrayGetPlane(CUarray& plane, const uint64_t& array, const uint32_t&,
                                             Writer& reply) {
  File(plane, CUDA_ARRAY3D_DESCRIPTOR{}, 0, array, reply);
  return CUDA_SUCCESS;
}

CUresult SessionArrays::Done_cuMipmappedArrayGetLevel(CUarray& level, const uint64_t& mipmap, const uint32_t&,
                                                      Writer& reply) {
  mipmaps_[mipmap].insert(H(level));
  File(level, CUDA_ARRAY3D_DESCRIPTOR{}, mipmap, 0, reply);
  return CUDA_SUCCESS;
}

}  // namespace tf::worker
