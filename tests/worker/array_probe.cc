// A driver-API program for the remote tests of arrays, mipmapped arrays, array and 2D/3D copies,
// texture and surface objects: run directly on tests/fakecuda or through the client stub and a
// worker, it prints "key=value" lines the tests compare (remote_e2e_test.cc).
//   array_probe arrays   data round trips, descriptors, objects, refused regions, forged and
//                        stale handles
//   array_probe hold     holds arrays, a mipmapped array and objects until killed
#include <cuda.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "probe_util.h"

namespace {

using tf_probe::Setup;

// A recognisable byte for position i of a pattern `seed`.
uint8_t Pat(uint64_t seed, uint64_t i) {
  return static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 9) * 17) & 0xff);
}
std::vector<uint8_t> Pattern(uint64_t seed, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = Pat(seed, i);
  return v;
}

CUarray Array2D(size_t w, size_t h, CUarray_format f, unsigned ch) {
  CUDA_ARRAY_DESCRIPTOR d = {};
  d.Width = w;
  d.Height = h;
  d.Format = f;
  d.NumChannels = ch;
  CUarray a;
  CHECK(cuArrayCreate(&a, &d));
  return a;
}

CUarray Array3D(size_t w, size_t h, size_t depth, CUarray_format f, unsigned ch) {
  CUDA_ARRAY3D_DESCRIPTOR d = {};
  d.Width = w;
  d.Height = h;
  d.Depth = depth;
  d.Format = f;
  d.NumChannels = ch;
  CUarray a;
  CHECK(cuArray3DCreate(&a, &d));
  return a;
}

// 2D copy descriptors of one kind of operand each.
void HostSrc(CUDA_MEMCPY2D* c, const void* p, size_t pitch, size_t x = 0, size_t y = 0) {
  c->srcMemoryType = CU_MEMORYTYPE_HOST;
  c->srcHost = p;
  c->srcPitch = pitch;
  c->srcXInBytes = x;
  c->srcY = y;
}
void HostDst(CUDA_MEMCPY2D* c, void* p, size_t pitch, size_t x = 0, size_t y = 0) {
  c->dstMemoryType = CU_MEMORYTYPE_HOST;
  c->dstHost = p;
  c->dstPitch = pitch;
  c->dstXInBytes = x;
  c->dstY = y;
}
void ArraySrc(CUDA_MEMCPY2D* c, CUarray a, size_t x = 0, size_t y = 0) {
  c->srcMemoryType = CU_MEMORYTYPE_ARRAY;
  c->srcArray = a;
  c->srcXInBytes = x;
  c->srcY = y;
}
void ArrayDst(CUDA_MEMCPY2D* c, CUarray a, size_t x = 0, size_t y = 0) {
  c->dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c->dstArray = a;
  c->dstXInBytes = x;
  c->dstY = y;
}
void DeviceSrc(CUDA_MEMCPY2D* c, CUdeviceptr p, size_t pitch) {
  c->srcMemoryType = CU_MEMORYTYPE_DEVICE;
  c->srcDevice = p;
  c->srcPitch = pitch;
}
void DeviceDst(CUDA_MEMCPY2D* c, CUdeviceptr p, size_t pitch) {
  c->dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c->dstDevice = p;
  c->dstPitch = pitch;
}

// Whether rows [0, h) of width w at pitch `pa` in a equal those at pitch `pb` in b.
bool SameRows(const uint8_t* a, size_t pa, const uint8_t* b, size_t pb, size_t w, size_t h) {
  for (size_t y = 0; y < h; ++y) {
    if (memcmp(a + y * pa, b + y * pb, w) != 0) return false;
  }
  return true;
}

int Arrays() {
  Setup();
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

  // A 2D array of 64 x 32 floats (rows of 256 bytes); descriptors answered from what was made.
  CUarray a = Array2D(64, 32, CU_AD_FORMAT_FLOAT, 1);
  CUDA_ARRAY_DESCRIPTOR d2 = {};
  CHECK(cuArrayGetDescriptor(&d2, a));
  CUDA_ARRAY3D_DESCRIPTOR d3 = {};
  CHECK(cuArray3DGetDescriptor(&d3, a));
  std::printf("array_desc=%zu,%zu,%d,%u\n", d2.Width, d2.Height, static_cast<int>(d2.Format),
              d2.NumChannels);
  std::printf("array3d_desc=%zu,%zu,%zu,%u\n", d3.Width, d3.Height, d3.Depth, d3.Flags);
  CUDA_ARRAY_MEMORY_REQUIREMENTS req = {};
  CHECK(cuArrayGetMemoryRequirements(&req, a, 0));
  std::printf("array_requirements=%d\n", req.size >= 64 * 32 * 4 && req.alignment > 0);
  std::printf("array_requirements_values=%zu:%zu:%u\n", req.size, req.alignment, req.reserved[0]);
  CUarray none = nullptr;
  std::printf("create_null=%d:%d:%d\n", static_cast<int>(cuArrayCreate(&none, nullptr)),
              static_cast<int>(cuArray3DCreate(&none, nullptr)), static_cast<int>(cuArrayCreate(nullptr, &d2)));

  // Linear copies: the array's bytes in row-major order.
  std::vector<uint8_t> in = Pattern(1, 8192), out(8192, 0);
  CHECK(cuMemcpyHtoA(a, 0, in.data(), in.size()));
  CHECK(cuMemcpyAtoH(out.data(), a, 0, out.size()));
  std::printf("htoa_atoh=%d\n", in == out);
  std::vector<uint8_t> part(100, 0);
  CHECK(cuMemcpyAtoH(part.data(), a, 1000, 100));
  std::printf("atoh_offset=%d\n", memcmp(part.data(), in.data() + 1000, 100) == 0);
  std::vector<uint8_t> in2 = Pattern(2, 4096);
  CHECK(cuMemcpyHtoAAsync(a, 4096, in2.data(), in2.size(), s));
  std::vector<uint8_t> back(4096, 0);
  CHECK(cuMemcpyAtoHAsync(back.data(), a, 4096, back.size(), s));
  CHECK(cuStreamSynchronize(s));
  std::printf("async_htoa_atoh=%d\n", back == in2);

  // 2D: host (pitch 300) into a window of the array (x 16 bytes, y 4, 128 bytes x 10 rows),
  // then out to host with another pitch.
  std::vector<uint8_t> src = Pattern(3, 300 * 12), dst(200 * 10, 0);
  CUDA_MEMCPY2D c = {};
  HostSrc(&c, src.data(), 300, 8, 1);
  ArrayDst(&c, a, 16, 4);
  c.WidthInBytes = 128;
  c.Height = 10;
  CHECK(cuMemcpy2D(&c));
  c = {};
  ArraySrc(&c, a, 16, 4);
  HostDst(&c, dst.data(), 200);
  c.WidthInBytes = 128;
  c.Height = 10;
  CHECK(cuMemcpy2D(&c));
  std::printf("copy2d_host_array=%d\n", SameRows(src.data() + 300 + 8, 300, dst.data(), 200, 128, 10));

  // 2D: the whole array into pitched device memory, device to host with another pitch.
  CUdeviceptr pd;
  size_t pitch = 0;
  CHECK(cuMemAllocPitch(&pd, &pitch, 256, 32, 4));
  c = {};
  ArraySrc(&c, a);
  DeviceDst(&c, pd, pitch);
  c.WidthInBytes = 256;
  c.Height = 32;
  CHECK(cuMemcpy2D(&c));
  std::vector<uint8_t> whole(8192, 0), viadev(512 * 32, 0);
  CHECK(cuMemcpyAtoH(whole.data(), a, 0, whole.size()));
  c = {};
  DeviceSrc(&c, pd, pitch);
  HostDst(&c, viadev.data(), 512);
  c.WidthInBytes = 256;
  c.Height = 32;
  CHECK(cuMemcpy2DUnaligned(&c));
  std::printf("copy2d_array_device=%d\n", SameRows(whole.data(), 256, viadev.data(), 512, 256, 32));

  // 2D async, host -> pitched device -> host, on a stream.
  std::vector<uint8_t> asrc = Pattern(4, 100 * 20), adst(120 * 20, 0);
  c = {};
  HostSrc(&c, asrc.data(), 100);
  DeviceDst(&c, pd, pitch);
  c.WidthInBytes = 90;
  c.Height = 20;
  CHECK(cuMemcpy2DAsync(&c, s));
  c = {};
  DeviceSrc(&c, pd, pitch);
  HostDst(&c, adst.data(), 120);
  c.WidthInBytes = 90;
  c.Height = 20;
  CHECK(cuMemcpy2DAsync(&c, s));
  CHECK(cuStreamSynchronize(s));
  std::printf("copy2d_async=%d\n", SameRows(asrc.data(), 100, adst.data(), 120, 90, 20));

  // Unified operands: the driver tells host from device memory.
  std::vector<uint8_t> usrc = Pattern(5, 64 * 8), udst(64 * 8, 0);
  c = {};
  c.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
  c.srcDevice = reinterpret_cast<CUdeviceptr>(usrc.data());
  c.srcPitch = 64;
  c.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
  c.dstDevice = pd;
  c.dstPitch = pitch;
  c.WidthInBytes = 64;
  c.Height = 8;
  CHECK(cuMemcpy2D(&c));
  c = {};
  c.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
  c.srcDevice = pd;
  c.srcPitch = pitch;
  c.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
  c.dstDevice = reinterpret_cast<CUdeviceptr>(udst.data());
  c.dstPitch = 64;
  c.WidthInBytes = 64;
  c.Height = 8;
  CHECK(cuMemcpy2D(&c));
  std::printf("copy2d_unified=%d\n", usrc == udst);

  // Device <-> array <-> array.
  CUarray b = Array2D(64, 32, CU_AD_FORMAT_FLOAT, 1);
  CUdeviceptr lin, lin2;
  CHECK(cuMemAlloc(&lin, 8192));
  CHECK(cuMemAlloc(&lin2, 8192));
  std::vector<uint8_t> dv = Pattern(6, 8192), dback(8192, 0);
  CHECK(cuMemcpyHtoD(lin, dv.data(), dv.size()));
  CHECK(cuMemcpyDtoA(b, 0, lin, 8192));
  CHECK(cuMemcpyAtoA(a, 256, b, 512, 4096));
  CHECK(cuMemcpyAtoD(lin2, a, 256, 4096));
  CHECK(cuMemcpyDtoH(dback.data(), lin2, 4096));
  std::printf("dtoa_atoa_atod=%d\n", memcmp(dback.data(), dv.data() + 512, 4096) == 0);

  // 3D: a 16 x 8 x 4 array of uchar4 (rows of 64 bytes); host with padding in, a sub-box out to
  // device memory, then to host.
  CUarray v = Array3D(16, 8, 4, CU_AD_FORMAT_UNSIGNED_INT8, 4);
  std::vector<uint8_t> h3 = Pattern(7, 80 * 10 * 4);
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
  CHECK(cuMemcpy3D(&m));
  CUdeviceptr box;
  CHECK(cuMemAlloc(&box, 64 * 4 * 2));
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
  CHECK(cuMemcpy3D(&m));
  std::vector<uint8_t> h3out(64 * 4 * 2, 0);
  CHECK(cuMemcpyDtoH(h3out.data(), box, h3out.size()));
  bool same3 = true;
  for (size_t z = 0; z < 2; ++z) {
    for (size_t y = 0; y < 4; ++y) {
      same3 = same3 && memcmp(h3out.data() + (z * 4 + y) * 64,
                              h3.data() + ((z + 1) * 10 + y + 2) * 80 + 8, 32) == 0;
    }
  }
  std::printf("copy3d=%d\n", same3);
  // 3D async, array -> host with padding.
  std::vector<uint8_t> h3b(70 * 9 * 4, 0);
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
  CHECK(cuMemcpy3DAsync(&m, s));
  CHECK(cuStreamSynchronize(s));
  bool same3b = true;
  for (size_t z = 0; z < 4; ++z) {
    same3b = same3b && SameRows(h3.data() + z * 800, 80, h3b.data() + z * 630, 70, 64, 8);
  }
  std::printf("copy3d_async=%d\n", same3b);

  // Larger than a transport slice: a 16 MiB array through a pitched host buffer, and rows wider
  // than a slice (9 MiB) through pitched device memory.
  CUarray big = Array2D(4096, 1024, CU_AD_FORMAT_FLOAT, 1);
  std::vector<uint8_t> bsrc = Pattern(8, (16384 + 64) * 1024), bdst(16384 * 1024, 0);
  c = {};
  HostSrc(&c, bsrc.data(), 16384 + 64);
  ArrayDst(&c, big);
  c.WidthInBytes = 16384;
  c.Height = 1024;
  CHECK(cuMemcpy2D(&c));
  m = {};
  m.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  m.srcArray = big;
  m.dstMemoryType = CU_MEMORYTYPE_HOST;
  m.dstHost = bdst.data();
  m.dstPitch = 16384;
  m.dstHeight = 1024;
  m.WidthInBytes = 16384;
  m.Height = 1024;
  m.Depth = 1;
  CHECK(cuMemcpy3D(&m));
  const bool big_ok = SameRows(bsrc.data(), 16384 + 64, bdst.data(), 16384, 16384, 1024);
  const size_t wide = 9u << 20;
  CUdeviceptr wd;
  CHECK(cuMemAlloc(&wd, (wide + 4096) * 2));
  std::vector<uint8_t> wsrc = Pattern(9, wide * 2), wdst(wide * 2, 0);
  c = {};
  HostSrc(&c, wsrc.data(), wide);
  DeviceDst(&c, wd, wide + 4096);
  c.WidthInBytes = wide;
  c.Height = 2;
  CHECK(cuMemcpy2D(&c));
  c = {};
  DeviceSrc(&c, wd, wide + 4096);
  HostDst(&c, wdst.data(), wide);
  c.WidthInBytes = wide;
  c.Height = 2;
  CHECK(cuMemcpy2D(&c));
  std::printf("large=%d,%d\n", big_ok, wsrc == wdst);

  // Mipmapped arrays: levels are arrays of their own.
  CUDA_ARRAY3D_DESCRIPTOR md = {};
  md.Width = 32;
  md.Height = 32;
  md.Format = CU_AD_FORMAT_FLOAT;
  md.NumChannels = 1;
  CUmipmappedArray mip;
  CHECK(cuMipmappedArrayCreate(&mip, &md, 3));
  CUarray lv[3];
  std::printf("mip_levels=");
  for (unsigned i = 0; i < 3; ++i) {
    CHECK(cuMipmappedArrayGetLevel(&lv[i], mip, i));
    CUDA_ARRAY3D_DESCRIPTOR ld = {};
    CHECK(cuArray3DGetDescriptor(&ld, lv[i]));
    std::printf("%s%zux%zu", i ? "," : "", ld.Width, ld.Height);
  }
  std::printf("\n");
  std::vector<uint8_t> lin1 = Pattern(10, 16 * 16 * 4), lout(16 * 16 * 4, 0);
  CHECK(cuMemcpyHtoA(lv[1], 0, lin1.data(), lin1.size()));
  CHECK(cuMemcpyAtoH(lout.data(), lv[1], 0, lout.size()));
  std::printf("mip_level_copy=%d\n", lin1 == lout);
  CHECK(cuMipmappedArrayGetMemoryRequirements(&req, mip, 0));
  std::printf("mip_requirements=%d\n", req.size >= 32 * 32 * 4);
  std::printf("mip_requirements_values=%zu:%zu\n", req.size, req.alignment);
  // A device the program does not have: CUDA_ERROR_INVALID_DEVICE, and nothing written.
  req.size = 7;
  std::printf("requirements_bad_device=%d:%d:%zu\n", static_cast<int>(cuArrayGetMemoryRequirements(&req, a, 99)),
              static_cast<int>(cuMipmappedArrayGetMemoryRequirements(&req, mip, -1)), req.size);

  // Texture and surface objects over each kind of resource; descriptors answered back.
  CUDA_TEXTURE_DESC td = {};
  td.addressMode[0] = CU_TR_ADDRESS_MODE_CLAMP;
  td.addressMode[1] = CU_TR_ADDRESS_MODE_WRAP;
  td.filterMode = CU_TR_FILTER_MODE_POINT;
  td.flags = CU_TRSF_NORMALIZED_COORDINATES;
  td.maxMipmapLevelClamp = 2.5f;
  td.borderColor[3] = 1.0f;
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
  CUtexObject tex[4];
  bool tex_ok = true;
  for (int i = 0; i < 4; ++i) {
    CHECK(cuTexObjectCreate(&tex[i], &rd[i], &td, nullptr));
    CUDA_RESOURCE_DESC got = {};
    CHECK(cuTexObjectGetResourceDesc(&got, tex[i]));
    tex_ok = tex_ok && got.resType == rd[i].resType &&
             memcmp(&got.res, &rd[i].res, sizeof(got.res)) == 0;
  }
  CUDA_TEXTURE_DESC tgot = {};
  CHECK(cuTexObjectGetTextureDesc(&tgot, tex[0]));
  tex_ok = tex_ok && tgot.addressMode[1] == CU_TR_ADDRESS_MODE_WRAP && tgot.maxMipmapLevelClamp == 2.5f &&
           tgot.flags == CU_TRSF_NORMALIZED_COORDINATES;
  CUDA_RESOURCE_VIEW_DESC view = {};
  view.format = CU_RES_VIEW_FORMAT_FLOAT_1X32;
  view.width = 64;
  view.height = 32;
  CUtexObject tv;
  CHECK(cuTexObjectCreate(&tv, &rd[0], &td, &view));
  CUDA_RESOURCE_VIEW_DESC vgot = {};
  CHECK(cuTexObjectGetResourceViewDesc(&vgot, tv));
  tex_ok = tex_ok && vgot.width == 64 && vgot.format == CU_RES_VIEW_FORMAT_FLOAT_1X32;
  std::printf("tex_objects=%d\n", tex_ok);
  CUsurfObject surf;
  CHECK(cuSurfObjectCreate(&surf, &rd[0]));
  CUDA_RESOURCE_DESC sgot = {};
  CHECK(cuSurfObjectGetResourceDesc(&sgot, surf));
  std::printf("surf_object=%d\n", sgot.resType == CU_RESOURCE_TYPE_ARRAY && sgot.res.array.hArray == a);
  std::printf("surf_of_linear=%d\n", static_cast<int>(cuSurfObjectCreate(&surf, &rd[2])));

  // Refused: regions outside the array or the allocation, unknown handles. Each fails alone.
  c = {};
  HostSrc(&c, src.data(), 300);
  ArrayDst(&c, a, 200, 0);
  c.WidthInBytes = 128;
  c.Height = 2;
  std::printf("bad_region_2d=%d\n", static_cast<int>(cuMemcpy2D(&c)));
  m = {};
  m.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  m.srcArray = v;
  m.srcZ = 3;
  m.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  m.dstDevice = box;
  m.dstPitch = 64;
  m.dstHeight = 4;
  m.WidthInBytes = 32;
  m.Height = 4;
  m.Depth = 2;
  std::printf("bad_region_3d=%d\n", static_cast<int>(cuMemcpy3D(&m)));
  c = {};
  HostSrc(&c, src.data(), 300);
  DeviceDst(&c, lin, 1024);
  c.WidthInBytes = 256;
  c.Height = 9;  // the ninth row ends 256 bytes past the allocation's 8192
  std::printf("bad_device_rows=%d\n", static_cast<int>(cuMemcpy2D(&c)));
  c.Height = 8;
  std::printf("good_device_rows=%d\n", static_cast<int>(cuMemcpy2D(&c)));
  CUarray bogus = reinterpret_cast<CUarray>(uintptr_t{0xbad0});
  std::printf("bad_array_handle=%d\n", static_cast<int>(cuMemcpyHtoA(bogus, 0, in.data(), 16)));
  std::printf("bad_linear_offset=%d\n", static_cast<int>(cuMemcpyAtoH(out.data(), a, 8000, 400)));
  std::printf("bad_dtoa_length=%d\n", static_cast<int>(cuMemcpyDtoA(b, 0, lin, 8193)));
  CUDA_RESOURCE_DESC badlin = rd[2];
  badlin.res.linear.sizeInBytes = 8193;
  CUtexObject tb;
  std::printf("tex_bad_linear=%d\n", static_cast<int>(cuTexObjectCreate(&tb, &badlin, &td, nullptr)));
  // A resource naming no array of this program, memory it does not own, or no resource type.
  CUDA_RESOURCE_DESC forged = rd[0];
  forged.res.array.hArray = bogus;
  CUsurfObject sb;
  std::printf("tex_forged_array=%d\n", static_cast<int>(cuTexObjectCreate(&tb, &forged, &td, nullptr)));
  std::printf("surf_forged_array=%d\n", static_cast<int>(cuSurfObjectCreate(&sb, &forged)));
  CUDA_RESOURCE_DESC outside = rd[2];
  outside.res.linear.devPtr = 0x1000;
  outside.res.linear.sizeInBytes = 64;
  std::printf("tex_outside_linear=%d\n", static_cast<int>(cuTexObjectCreate(&tb, &outside, &td, nullptr)));
  CUDA_RESOURCE_DESC untyped = rd[0];
  untyped.resType = static_cast<CUresourcetype>(9);
  std::printf("tex_bad_type=%d\n", static_cast<int>(cuTexObjectCreate(&tb, &untyped, &td, nullptr)));
  std::printf("tex_destroy_bogus=%d\n", static_cast<int>(cuTexObjectDestroy(0xbad0)));
  std::printf("destroy_bogus_array=%d\n", static_cast<int>(cuArrayDestroy(bogus)));
  std::printf("destroy_level=%d\n", static_cast<int>(cuArrayDestroy(lv[1])));
  CHECK(cuMemcpyAtoH(out.data(), a, 0, out.size()));
  std::printf("after_errors=%d\n", memcmp(out.data() + 256, dv.data() + 512, 4096) == 0);

  // Teardown.
  for (CUtexObject t : tex) CHECK(cuTexObjectDestroy(t));
  CHECK(cuTexObjectDestroy(tv));
  CHECK(cuSurfObjectDestroy(surf));
  std::printf("surf_destroy_twice=%d\n", static_cast<int>(cuSurfObjectDestroy(surf)));
  CHECK(cuMipmappedArrayDestroy(mip));
  CHECK(cuArrayDestroy(a));
  CHECK(cuArrayDestroy(b));
  CHECK(cuArrayDestroy(v));
  CHECK(cuArrayDestroy(big));
  std::printf("destroy_twice=%d\n", static_cast<int>(cuArrayDestroy(a)));
  std::printf("tex_destroyed_array=%d\n", static_cast<int>(cuTexObjectCreate(&tb, &rd[0], &td, nullptr)));
  std::printf("surf_destroyed_array=%d\n", static_cast<int>(cuSurfObjectCreate(&sb, &rd[0])));
  // Destroyed arrays, a destroyed mipmapped array and its levels fail every later use.
  std::printf("stale_array_copy=%d\n", cuMemcpyAtoH(out.data(), a, 0, 16) != CUDA_SUCCESS);
  std::printf("stale_array_requirements=%d\n", cuArrayGetMemoryRequirements(&req, b, 0) != CUDA_SUCCESS);
  std::printf("stale_level_copy=%d\n", cuMemcpyAtoH(out.data(), lv[0], 0, 16) != CUDA_SUCCESS);
  CUarray stale_level = nullptr;
  std::printf("stale_mip_level=%d\n", cuMipmappedArrayGetLevel(&stale_level, mip, 0) != CUDA_SUCCESS);
  CHECK(cuMemFree(pd));
  CHECK(cuMemFree(lin));
  CHECK(cuMemFree(lin2));
  CHECK(cuMemFree(box));
  CHECK(cuMemFree(wd));
  std::printf("done=1\n");
  return 0;
}

// Holds 256 MiB of arrays, a mipmapped array and objects over them; waits to be killed.
int Hold() {
  Setup();
  CUarray a = Array2D(8192, 8192, CU_AD_FORMAT_FLOAT, 1);
  CUDA_ARRAY3D_DESCRIPTOR md = {};
  md.Width = 256;
  md.Height = 256;
  md.Format = CU_AD_FORMAT_FLOAT;
  md.NumChannels = 1;
  CUmipmappedArray mip;
  CHECK(cuMipmappedArrayCreate(&mip, &md, 4));
  CUarray level;
  CHECK(cuMipmappedArrayGetLevel(&level, mip, 2));
  CUDA_RESOURCE_DESC rd = {};
  rd.resType = CU_RESOURCE_TYPE_ARRAY;
  rd.res.array.hArray = a;
  CUDA_TEXTURE_DESC td = {};
  CUtexObject tex;
  CHECK(cuTexObjectCreate(&tex, &rd, &td, nullptr));
  CUsurfObject surf;
  CHECK(cuSurfObjectCreate(&surf, &rd));
  std::printf("ready=1\n");
  std::fflush(stdout);
  for (;;) pause();
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* mode = argc > 1 ? argv[1] : "arrays";
  if (!strcmp(mode, "arrays")) return Arrays();
  if (!strcmp(mode, "hold")) return Hold();
  std::fprintf(stderr, "unknown mode %s\n", mode);
  return 2;
}
