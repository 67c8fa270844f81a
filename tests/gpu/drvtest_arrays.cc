// arrays: data round trips through CUDA arrays, mipmap levels and pitched 2D/3D copies, texture
// and surface objects, and copies the driver must refuse. Written for the real driver; run
// natively and through the remote vGPU (remote_compare.sh, phase driver) and compared: every
// `*_ok` result must be 1 and every `refused_*` result the same error in both runs.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "drvtest.h"

namespace tf::gpu {
namespace {

uint8_t Pat(uint64_t seed, uint64_t i) {
  return static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 9) * 17) & 0xff);
}
std::vector<uint8_t> Pattern(uint64_t seed, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = Pat(seed, i);
  return v;
}
bool SameRows(const uint8_t* a, size_t pa, const uint8_t* b, size_t pb, size_t w, size_t h) {
  for (size_t y = 0; y < h; ++y) {
    if (memcmp(a + y * pa, b + y * pb, w) != 0) return false;
  }
  return true;
}

// Counts failed checks; a call that fails where it must succeed is reported and counted.
struct Checker {
  int failed = 0;
  bool Ok(const char* what, CUresult rc) {
    if (rc == CUDA_SUCCESS) return true;
    Result(std::string("call_failed_") + what, CuErrorName(rc));
    ++failed;
    return false;
  }
  void Check(const char* key, bool ok) {
    Result(key, ok ? 1 : 0);
    if (!ok) ++failed;
  }
  void Refused(const char* key, CUresult rc) {
    Result(key, CuErrorName(rc));
    if (rc == CUDA_SUCCESS) ++failed;
  }
};

CUDA_MEMCPY2D HostToArray(const void* src, size_t pitch, CUarray a, size_t x, size_t y, size_t w,
                          size_t h) {
  CUDA_MEMCPY2D c = {};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = src;
  c.srcPitch = pitch;
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = a;
  c.dstXInBytes = x;
  c.dstY = y;
  c.WidthInBytes = w;
  c.Height = h;
  return c;
}

CUDA_MEMCPY2D ArrayToHost(CUarray a, size_t x, size_t y, void* dst, size_t pitch, size_t w,
                          size_t h) {
  CUDA_MEMCPY2D c = {};
  c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  c.srcArray = a;
  c.srcXInBytes = x;
  c.srcY = y;
  c.dstMemoryType = CU_MEMORYTYPE_HOST;
  c.dstHost = dst;
  c.dstPitch = pitch;
  c.WidthInBytes = w;
  c.Height = h;
  return c;
}

}  // namespace

int RunArrays(const Flags& flags) {
  const uint64_t big_mib = flags.Bytes("big", 64 * kMiB) / kMiB;
  if (!FlagsOk(flags) || big_mib == 0) return 2;
  DriverSession session;
  if (!session.ok()) {
    Result("setup_failed", session.failed_call() + ":" + CuErrorName(session.rc()));
    Result("verdict", "FAIL");
    return 2;
  }
  Checker k;
  CUstream s = nullptr;
  k.Ok("cuStreamCreate", cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

  // 1D array of 2048 floats: the linear copies.
  CUDA_ARRAY_DESCRIPTOR d1 = {};
  d1.Width = 2048;
  d1.Format = CU_AD_FORMAT_FLOAT;
  d1.NumChannels = 1;
  CUarray a1 = nullptr, b1 = nullptr;
  k.Ok("cuArrayCreate(1d)", cuArrayCreate(&a1, &d1));
  k.Ok("cuArrayCreate(1d)", cuArrayCreate(&b1, &d1));
  std::vector<uint8_t> in = Pattern(1, 8192), out(8192, 0);
  k.Ok("cuMemcpyHtoA", cuMemcpyHtoA(a1, 0, in.data(), in.size()));
  k.Ok("cuMemcpyAtoH", cuMemcpyAtoH(out.data(), a1, 0, out.size()));
  k.Check("htoa_atoh_ok", in == out);
  std::vector<uint8_t> in2 = Pattern(2, 4096), back(4096, 0);
  k.Ok("cuMemcpyHtoAAsync", cuMemcpyHtoAAsync(a1, 4096, in2.data(), in2.size(), s));
  k.Ok("cuMemcpyAtoHAsync", cuMemcpyAtoHAsync(back.data(), a1, 4096, back.size(), s));
  k.Ok("cuStreamSynchronize", cuStreamSynchronize(s));
  k.Check("async_htoa_atoh_ok", back == in2);
  CUdeviceptr lin = 0, lin2 = 0;
  k.Ok("cuMemAlloc", cuMemAlloc(&lin, 8192));
  k.Ok("cuMemAlloc", cuMemAlloc(&lin2, 8192));
  std::vector<uint8_t> dv = Pattern(3, 8192), dback(4096, 0);
  k.Ok("cuMemcpyHtoD", cuMemcpyHtoD(lin, dv.data(), dv.size()));
  k.Ok("cuMemcpyDtoA", cuMemcpyDtoA(b1, 0, lin, 8192));
  k.Ok("cuMemcpyAtoA", cuMemcpyAtoA(a1, 256, b1, 512, 4096));
  k.Ok("cuMemcpyAtoD", cuMemcpyAtoD(lin2, a1, 256, 4096));
  k.Ok("cuMemcpyDtoH", cuMemcpyDtoH(dback.data(), lin2, 4096));
  k.Check("dtoa_atoa_atod_ok", memcmp(dback.data(), dv.data() + 512, 4096) == 0);

  // 2D array of 64 x 32 floats, surface load/store allowed; descriptors.
  CUDA_ARRAY3D_DESCRIPTOR d2 = {};
  d2.Width = 64;
  d2.Height = 32;
  d2.Format = CU_AD_FORMAT_FLOAT;
  d2.NumChannels = 1;
  d2.Flags = CUDA_ARRAY3D_SURFACE_LDST;
  CUarray a = nullptr;
  k.Ok("cuArray3DCreate(2d)", cuArray3DCreate(&a, &d2));
  CUDA_ARRAY3D_DESCRIPTOR got = {};
  k.Ok("cuArray3DGetDescriptor", cuArray3DGetDescriptor(&got, a));
  k.Check("descriptor_ok", got.Width == 64 && got.Height == 32 && got.Depth == 0 &&
                               got.Format == CU_AD_FORMAT_FLOAT && got.NumChannels == 1);
  std::vector<uint8_t> src = Pattern(4, 300 * 12), dst(200 * 10, 0);
  CUDA_MEMCPY2D c = HostToArray(src.data() + 300 + 8, 300, a, 16, 4, 128, 10);
  k.Ok("cuMemcpy2D(host->array)", cuMemcpy2D(&c));
  c = ArrayToHost(a, 16, 4, dst.data(), 200, 128, 10);
  k.Ok("cuMemcpy2D(array->host)", cuMemcpy2D(&c));
  k.Check("copy2d_host_array_ok", SameRows(src.data() + 308, 300, dst.data(), 200, 128, 10));

  // Array -> pitched device -> host; host -> pitched device -> host on a stream.
  CUdeviceptr pd = 0;
  size_t pitch = 0;
  k.Ok("cuMemAllocPitch", cuMemAllocPitch(&pd, &pitch, 256, 32, 4));
  std::vector<uint8_t> whole(8192, 0), viadev(512 * 32, 0);
  c = ArrayToHost(a, 0, 0, whole.data(), 256, 256, 32);
  k.Ok("cuMemcpy2D(array->host)", cuMemcpy2D(&c));
  c = {};
  c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  c.srcArray = a;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = pd;
  c.dstPitch = pitch;
  c.WidthInBytes = 256;
  c.Height = 32;
  k.Ok("cuMemcpy2D(array->device)", cuMemcpy2D(&c));
  c = {};
  c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = pd;
  c.srcPitch = pitch;
  c.dstMemoryType = CU_MEMORYTYPE_HOST;
  c.dstHost = viadev.data();
  c.dstPitch = 512;
  c.WidthInBytes = 256;
  c.Height = 32;
  k.Ok("cuMemcpy2DUnaligned", cuMemcpy2DUnaligned(&c));
  k.Check("copy2d_array_device_ok", SameRows(whole.data(), 256, viadev.data(), 512, 256, 32));
  std::vector<uint8_t> asrc = Pattern(5, 100 * 20), adst(120 * 20, 0);
  c = {};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = asrc.data();
  c.srcPitch = 100;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = pd;
  c.dstPitch = pitch;
  c.WidthInBytes = 90;
  c.Height = 20;
  k.Ok("cuMemcpy2DAsync(host->device)", cuMemcpy2DAsync(&c, s));
  c = {};
  c.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
  c.srcDevice = pd;
  c.srcPitch = pitch;
  c.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
  c.dstDevice = reinterpret_cast<CUdeviceptr>(adst.data());
  c.dstPitch = 120;
  c.WidthInBytes = 90;
  c.Height = 20;
  k.Ok("cuMemcpy2DAsync(unified)", cuMemcpy2DAsync(&c, s));
  k.Ok("cuStreamSynchronize", cuStreamSynchronize(s));
  k.Check("copy2d_async_unified_ok", SameRows(asrc.data(), 100, adst.data(), 120, 90, 20));

  // 3D: a 16 x 8 x 4 uchar4 array, padded host in, a sub-box to device, all of it to host async.
  CUDA_ARRAY3D_DESCRIPTOR d3 = {};
  d3.Width = 16;
  d3.Height = 8;
  d3.Depth = 4;
  d3.Format = CU_AD_FORMAT_UNSIGNED_INT8;
  d3.NumChannels = 4;
  CUarray v = nullptr;
  k.Ok("cuArray3DCreate(3d)", cuArray3DCreate(&v, &d3));
  std::vector<uint8_t> h3 = Pattern(6, 80 * 10 * 4), h3b(70 * 9 * 4, 0), h3out(64 * 4 * 2, 0);
  CUDA_MEMCPY3D m = {};
  m.srcMemoryType = CU_MEMORYTYPE_HOST;
  m.srcHost = h3.data();
  m.srcPitch = 80;
  m.srcHeight = 10;
  m.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  m.dstArray = v;
  m.WidthInBytes = 64;
  m.Height = 8;
  m.Depth = 4;
  k.Ok("cuMemcpy3D(host->array)", cuMemcpy3D(&m));
  CUdeviceptr box = 0;
  k.Ok("cuMemAlloc", cuMemAlloc(&box, h3out.size()));
  m = {};
  m.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  m.srcArray = v;
  m.srcXInBytes = 8;
  m.srcY = 2;
  m.srcZ = 1;
  m.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  m.dstDevice = box;
  m.dstPitch = 64;
  m.dstHeight = 4;
  m.WidthInBytes = 32;
  m.Height = 4;
  m.Depth = 2;
  k.Ok("cuMemcpy3D(array->device)", cuMemcpy3D(&m));
  k.Ok("cuMemcpyDtoH", cuMemcpyDtoH(h3out.data(), box, h3out.size()));
  bool same3 = true;
  for (size_t z = 0; z < 2; ++z) {
    for (size_t y = 0; y < 4; ++y) {
      same3 = same3 && memcmp(h3out.data() + (z * 4 + y) * 64,
                              h3.data() + ((z + 1) * 10 + y + 2) * 80 + 8, 32) == 0;
    }
  }
  k.Check("copy3d_ok", same3);
  m = {};
  m.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  m.srcArray = v;
  m.dstMemoryType = CU_MEMORYTYPE_HOST;
  m.dstHost = h3b.data();
  m.dstPitch = 70;
  m.dstHeight = 9;
  m.WidthInBytes = 64;
  m.Height = 8;
  m.Depth = 4;
  k.Ok("cuMemcpy3DAsync(array->host)", cuMemcpy3DAsync(&m, s));
  k.Ok("cuStreamSynchronize", cuStreamSynchronize(s));
  bool same3b = true;
  for (size_t z = 0; z < 4; ++z) {
    same3b = same3b && SameRows(h3.data() + z * 800, 80, h3b.data() + z * 630, 70, 64, 8);
  }
  k.Check("copy3d_async_ok", same3b);

  // Large: a square-ish float array of --big MiB through a padded host buffer and back.
  const size_t width = 4096, rows = big_mib * kMiB / (width * 4);
  CUDA_ARRAY_DESCRIPTOR db = {};
  db.Width = width;
  db.Height = rows;
  db.Format = CU_AD_FORMAT_FLOAT;
  db.NumChannels = 1;
  CUarray big = nullptr;
  k.Ok("cuArrayCreate(big)", cuArrayCreate(&big, &db));
  std::vector<uint8_t> bsrc = Pattern(7, (width * 4 + 64) * rows), bdst(width * 4 * rows, 0);
  const uint64_t t0 = NowNs();
  c = HostToArray(bsrc.data(), width * 4 + 64, big, 0, 0, width * 4, rows);
  k.Ok("cuMemcpy2D(big in)", cuMemcpy2D(&c));
  c = ArrayToHost(big, 0, 0, bdst.data(), width * 4, width * 4, rows);
  k.Ok("cuMemcpy2D(big out)", cuMemcpy2D(&c));
  Result("big_roundtrip_ms", (NowNs() - t0) / 1000000);
  k.Check("big_ok", SameRows(bsrc.data(), width * 4 + 64, bdst.data(), width * 4, width * 4, rows));

  // Mipmapped array: level descriptors and a copy into level 1.
  CUDA_ARRAY3D_DESCRIPTOR md = {};
  md.Width = 32;
  md.Height = 32;
  md.Format = CU_AD_FORMAT_FLOAT;
  md.NumChannels = 1;
  CUmipmappedArray mip = nullptr;
  k.Ok("cuMipmappedArrayCreate", cuMipmappedArrayCreate(&mip, &md, 3));
  CUarray lv1 = nullptr;
  k.Ok("cuMipmappedArrayGetLevel", cuMipmappedArrayGetLevel(&lv1, mip, 1));
  CUDA_ARRAY3D_DESCRIPTOR ld = {};
  k.Ok("cuArray3DGetDescriptor(level)", cuArray3DGetDescriptor(&ld, lv1));
  k.Check("mip_level_desc_ok", ld.Width == 16 && ld.Height == 16);
  std::vector<uint8_t> lin1 = Pattern(8, 64 * 16), lout(64 * 16, 0);
  c = HostToArray(lin1.data(), 64, lv1, 0, 0, 64, 16);
  k.Ok("cuMemcpy2D(level in)", cuMemcpy2D(&c));
  c = ArrayToHost(lv1, 0, 0, lout.data(), 64, 64, 16);
  k.Ok("cuMemcpy2D(level out)", cuMemcpy2D(&c));
  k.Check("mip_level_copy_ok", lin1 == lout);

  // Texture objects over each kind of resource, a surface object; descriptors read back.
  CUDA_TEXTURE_DESC td = {};
  td.addressMode[0] = CU_TR_ADDRESS_MODE_CLAMP;
  td.addressMode[1] = CU_TR_ADDRESS_MODE_CLAMP;
  td.filterMode = CU_TR_FILTER_MODE_POINT;
  CUDA_RESOURCE_DESC rd[4] = {};
  rd[0].resType = CU_RESOURCE_TYPE_ARRAY;
  rd[0].res.array.hArray = a;
  rd[1].resType = CU_RESOURCE_TYPE_MIPMAPPED_ARRAY;
  rd[1].res.mipmap.hMipmappedArray = mip;
  rd[2].resType = CU_RESOURCE_TYPE_LINEAR;
  rd[2].res.linear.devPtr = lin;
  rd[2].res.linear.format = CU_AD_FORMAT_FLOAT;
  rd[2].res.linear.numChannels = 1;
  rd[2].res.linear.sizeInBytes = 8192;
  rd[3].resType = CU_RESOURCE_TYPE_PITCH2D;
  rd[3].res.pitch2D.devPtr = pd;
  rd[3].res.pitch2D.format = CU_AD_FORMAT_FLOAT;
  rd[3].res.pitch2D.numChannels = 1;
  rd[3].res.pitch2D.width = 64;
  rd[3].res.pitch2D.height = 32;
  rd[3].res.pitch2D.pitchInBytes = pitch;
  bool tex_ok = true;
  for (auto& r : rd) {
    CUtexObject t = 0;
    if (!k.Ok("cuTexObjectCreate", cuTexObjectCreate(&t, &r, &td, nullptr))) {
      tex_ok = false;
      continue;
    }
    CUDA_RESOURCE_DESC back_rd = {};
    tex_ok = tex_ok && k.Ok("cuTexObjectGetResourceDesc", cuTexObjectGetResourceDesc(&back_rd, t)) &&
             back_rd.resType == r.resType;
    k.Ok("cuTexObjectDestroy", cuTexObjectDestroy(t));
  }
  k.Check("tex_objects_ok", tex_ok);
  CUsurfObject surf = 0;
  k.Check("surf_object_ok", k.Ok("cuSurfObjectCreate", cuSurfObjectCreate(&surf, &rd[0])) &&
                                k.Ok("cuSurfObjectDestroy", cuSurfObjectDestroy(surf)));

  // Refused copies: outside the array, past a device allocation.
  c = HostToArray(src.data(), 300, a, 200, 0, 128, 2);
  k.Refused("refused_2d_outside_array", cuMemcpy2D(&c));
  m = {};
  m.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  m.srcArray = v;
  m.srcZ = 3;
  m.dstMemoryType = CU_MEMORYTYPE_HOST;
  m.dstHost = h3b.data();
  m.dstPitch = 70;
  m.dstHeight = 9;
  m.WidthInBytes = 32;
  m.Height = 4;
  m.Depth = 2;
  k.Refused("refused_3d_outside_array", cuMemcpy3D(&m));
  k.Refused("refused_atoh_past_end", cuMemcpyAtoH(out.data(), a1, 8000, 400));
  std::vector<uint8_t> after(8192, 0);
  k.Ok("cuMemcpyAtoH(after)", cuMemcpyAtoH(after.data(), a1, 0, after.size()));
  k.Check("after_refusals_ok", memcmp(after.data() + 256, dv.data() + 512, 4096) == 0);

  k.Ok("cuMipmappedArrayDestroy", cuMipmappedArrayDestroy(mip));
  for (CUarray x : {a1, b1, a, v, big}) k.Ok("cuArrayDestroy", cuArrayDestroy(x));
  for (CUdeviceptr p : {lin, lin2, pd, box}) k.Ok("cuMemFree", cuMemFree(p));
  k.Ok("cuStreamDestroy", cuStreamDestroy(s));
  Result("failed_checks", static_cast<uint64_t>(k.failed));
  Result("verdict", k.failed == 0 ? "PASS" : "FAIL");
  return k.failed == 0 ? 0 : 1;
}

}  // namespace tf::gpu
