// The last entry points the CUDA libraries reach that the remote vGPU forwards (natively, and
// remotely over shared memory and TCP): planes of an NV12 array, sparse properties of a sparse
// array and mipmapped array, multicast objects, and the driver's asynchronous notifications. What
// must be equal natively and remotely: the plane descriptors and the data copied through the
// planes; the sparse properties (or "unsupported" when the device has no sparse arrays); the
// result codes and granularities of the multicast calls (on one GPU without NVSwitch the driver is
// expected to answer CUDA_ERROR_NOT_SUPPORTED, which is then the result); the codes of registering
// and unregistering a notification callback (no notification is expected while it is registered).
#include <cstring>
#include <vector>

#include "samples.h"

namespace {

void Code(tf_samples::Outcome& o, CUresult r) {
  const int32_t v = static_cast<int32_t>(r);
  o.Result(&v, sizeof(v));
}

void Desc(tf_samples::Outcome& o, CUarray a) {
  CUDA_ARRAY3D_DESCRIPTOR d;
  if (!o.Drv(cuArray3DGetDescriptor(&d, a), "cuArray3DGetDescriptor")) return;
  const uint64_t v[5] = {d.Width, d.Height, d.Depth, static_cast<uint64_t>(d.Format), d.NumChannels};
  o.Result(v, sizeof(v));
}

void Sparse(tf_samples::Outcome& o, const CUDA_ARRAY_SPARSE_PROPERTIES& p) {
  const uint64_t v[6] = {p.tileExtent.width, p.tileExtent.height, p.tileExtent.depth, p.miptailFirstLevel,
                         p.miptailSize, p.flags};
  o.Result(v, sizeof(v));
}

void OnNotification(CUasyncNotificationInfo*, void* user, CUasyncCallbackHandle) {
  ++*static_cast<volatile int*>(user);
}

}  // namespace

TF_SAMPLE(nv12_array_planes) {
  RT(o, cudaFree(nullptr));
  // A plain array has no planes: refused, as natively.
  CUDA_ARRAY3D_DESCRIPTOR plain = {};
  plain.Width = 64;
  plain.Height = 32;
  plain.Format = CU_AD_FORMAT_UNSIGNED_INT8;
  plain.NumChannels = 1;
  CUarray flat, flat_plane = nullptr;
  DRV(o, cuArray3DCreate(&flat, &plain));
  Code(o, cuArrayGetPlane(&flat_plane, flat, 0));
  DRV(o, cuArrayDestroy(flat));
  // NV12: the channel count the driver takes (cudart describes it as three 8-bit channels); a
  // device that takes none records the codes as its result, equal natively and remotely.
  CUDA_ARRAY3D_DESCRIPTOR nv12 = {};
  nv12.Width = 64;
  nv12.Height = 32;
  nv12.Format = CU_AD_FORMAT_NV12;
  CUarray frame = nullptr;
  CUresult made = CUDA_ERROR_INVALID_VALUE;
  for (unsigned channels : {3u, 1u, 2u}) {
    nv12.NumChannels = channels;
    made = cuArray3DCreate(&frame, &nv12);
    Code(o, made);
    if (made == CUDA_SUCCESS) break;
  }
  if (made != CUDA_SUCCESS) return;
  CUarray planes[2], again;
  DRV(o, cuArrayGetPlane(&planes[0], frame, 0));
  DRV(o, cuArrayGetPlane(&planes[1], frame, 1));
  DRV(o, cuArrayGetPlane(&again, frame, 0));
  const int32_t same = again == planes[0];
  o.Result(&same, sizeof(same));
  Desc(o, planes[0]);
  Desc(o, planes[1]);
  CUarray none = nullptr;
  Code(o, cuArrayGetPlane(&none, frame, 2));  // out of range
  // Rows through each plane: luma 64 x 32 bytes, chroma 32 x 16 pairs.
  const size_t widths[2] = {64, 64}, heights[2] = {32, 16};
  for (int p = 0; p < 2; ++p) {
    std::vector<unsigned char> in(widths[p] * heights[p]), out(in.size());
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 5 + p);
    CUDA_MEMCPY2D up = {};
    up.srcMemoryType = CU_MEMORYTYPE_HOST;
    up.srcHost = in.data();
    up.srcPitch = widths[p];
    up.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    up.dstArray = planes[p];
    up.WidthInBytes = widths[p];
    up.Height = heights[p];
    DRV(o, cuMemcpy2D(&up));
    CUDA_MEMCPY2D down = {};
    down.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    down.srcArray = planes[p];
    down.dstMemoryType = CU_MEMORYTYPE_HOST;
    down.dstHost = out.data();
    down.dstPitch = widths[p];
    down.WidthInBytes = widths[p];
    down.Height = heights[p];
    DRV(o, cuMemcpy2D(&down));
    if (in != out) o.Fail("plane " + std::to_string(p) + " gave back other bytes");
    o.Result(out.data(), out.size());
  }
  DRV(o, cuArrayDestroy(frame));
}

TF_SAMPLE(sparse_array_properties) {
  RT(o, cudaFree(nullptr));
  int supported = 0;
  DRV(o, cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_SPARSE_CUDA_ARRAY_SUPPORTED, 0));
  if (!supported) {
    o.Result("unsupported", 11);
    return;
  }
  CUDA_ARRAY3D_DESCRIPTOR d = {};
  d.Width = 1024;
  d.Height = 1024;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  d.Flags = CUDA_ARRAY3D_SPARSE;
  CUarray a;
  DRV(o, cuArray3DCreate(&a, &d));
  CUmipmappedArray m;
  DRV(o, cuMipmappedArrayCreate(&m, &d, 11));
  CUDA_ARRAY_SPARSE_PROPERTIES p;
  DRV(o, cuArrayGetSparseProperties(&p, a));
  Sparse(o, p);
  DRV(o, cuMipmappedArrayGetSparseProperties(&p, m));
  Sparse(o, p);
  DRV(o, cuMipmappedArrayDestroy(m));
  DRV(o, cuArrayDestroy(a));
}

TF_SAMPLE(multicast_objects) {
  RT(o, cudaFree(nullptr));
  int supported = 0;
  DRV(o, cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0));
  o.Result(&supported, sizeof(supported));
  CUmulticastObjectProp prop = {};
  prop.numDevices = 1;
  prop.size = 2u << 20;
  size_t gmin = 0, grec = 0;
  CUresult r = cuMulticastGetGranularity(&gmin, &prop, CU_MULTICAST_GRANULARITY_MINIMUM);
  Code(o, r);
  Code(o, cuMulticastGetGranularity(&grec, &prop, CU_MULTICAST_GRANULARITY_RECOMMENDED));
  o.Result(&gmin, sizeof(gmin));
  o.Result(&grec, sizeof(grec));
  if (r == CUDA_SUCCESS && gmin > prop.size) prop.size = gmin;
  CUmemGenericAllocationHandle mc = 0;
  r = cuMulticastCreate(&mc, &prop);
  Code(o, r);
  if (r != CUDA_SUCCESS) return;
  Code(o, cuMulticastAddDevice(mc, 0));
  CUmemAllocationProp mp = {};
  mp.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  mp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  mp.location.id = 0;
  size_t g = 0;
  DRV(o, cuMemGetAllocationGranularity(&g, &mp, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const size_t bytes = (prop.size + g - 1) / g * g;
  CUmemGenericAllocationHandle mem = 0;
  DRV(o, cuMemCreate(&mem, bytes, &mp, 0));
  r = cuMulticastBindMem(mc, 0, mem, 0, prop.size, 0);
  Code(o, r);
  if (r == CUDA_SUCCESS) Code(o, cuMulticastUnbind(mc, 0, 0, prop.size));
  DRV(o, cuMemRelease(mem));
  DRV(o, cuMemRelease(mc));
}

TF_SAMPLE(async_notification_register) {
  RT(o, cudaFree(nullptr));
  static volatile int calls = 0;
  CUasyncCallbackHandle h = nullptr;
  CUresult r = cuDeviceRegisterAsyncNotification(0, &OnNotification, const_cast<int*>(&calls), &h);
  Code(o, r);
  if (r != CUDA_SUCCESS) return;
  Code(o, cuDeviceUnregisterAsyncNotification(0, h));
}
