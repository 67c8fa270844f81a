// Samples of the remote surface: stream memory operations, batched copies and prefetches, peer
// copies between two contexts of one device, the device's current pool, stream attribute copies
// (src/client/client_memops.cc, src/worker/session_memops.cc, the generated calls of
// api/remote_surface.tsv). Each runs in milliseconds; no kernel is launched.
#include <cstring>
#include <vector>

#include "samples.h"

namespace {

CUcontext Primary(tf_samples::Outcome& o) {
  CUcontext c = nullptr;
  o.Rt(cudaFree(nullptr), "cudaFree(0)");  // cudart binds the primary context
  o.Drv(cuCtxGetCurrent(&c), "cuCtxGetCurrent");
  return c;
}

}  // namespace

// A wait-value on one stream holds it until another stream writes the word; then it runs on.
TF_SAMPLE(memops_wait_write_value) {
  Primary(o);
  cudaStream_t a, b;
  RT(o, cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  RT(o, cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  CUdeviceptr w = 0;
  DRV(o, cuMemAlloc(&w, 64));
  DRV(o, cuMemsetD8(w, 0, 64));
  DRV(o, cuStreamWaitValue32(a, w, 1, CU_STREAM_WAIT_VALUE_EQ));
  DRV(o, cuStreamWriteValue32(a, w + 4, 7, 0));
  DRV(o, cuStreamWaitValue64(a, w + 8, 0x500000000ull, CU_STREAM_WAIT_VALUE_GEQ));
  DRV(o, cuStreamWriteValue64(a, w + 16, 0x1234567890ull, 0));
  const int before = static_cast<int>(cuStreamQuery(a));
  DRV(o, cuStreamWriteValue32(b, w, 1, 0));
  DRV(o, cuStreamWriteValue64(b, w + 8, 0x500000001ull, 0));
  RT(o, cudaStreamSynchronize(a));
  uint64_t got[3] = {};
  DRV(o, cuMemcpyDtoH(got, w, sizeof(got)));
  if (before != CUDA_ERROR_NOT_READY) o.Fail("the waiting stream was done before the write");
  if (got[2] != 0x1234567890ull || (got[0] >> 32) != 7) o.Fail("values after the wait");
  o.Result(&before, sizeof(before));
  o.Result(got, sizeof(got));
  cuMemFree(w);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

// cuStreamBatchMemOp: two writes and a wait on the first one.
TF_SAMPLE(memops_batch_mem_op) {
  Primary(o);
  cudaStream_t s;
  RT(o, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUdeviceptr w = 0;
  DRV(o, cuMemAlloc(&w, 64));
  DRV(o, cuMemsetD8(w, 0, 64));
  CUstreamBatchMemOpParams ops[3];
  std::memset(ops, 0, sizeof(ops));
  ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  ops[0].writeValue.address = w;
  ops[0].writeValue.value = 0xfeed;
  ops[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
  ops[1].writeValue.address = w + 8;
  ops[1].writeValue.value64 = 0xabcdef0123ull;
  ops[2].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  ops[2].waitValue.address = w;
  ops[2].waitValue.value = 0xfeed;
  ops[2].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
  DRV(o, cuStreamBatchMemOp(s, 3, ops, 0));
  RT(o, cudaStreamSynchronize(s));
  uint64_t got[2] = {};
  DRV(o, cuMemcpyDtoH(got, w, sizeof(got)));
  if (got[0] != 0xfeed || got[1] != 0xabcdef0123ull) o.Fail("batch values");
  o.Result(got, sizeof(got));
  cuMemFree(w);
  cudaStreamDestroy(s);
}

// cuMemcpyBatchAsync: 8 buffers from pageable host memory, device to device, and back.
TF_SAMPLE(memops_copy_batch) {
  Primary(o);
  constexpr int kN = 8;
  constexpr size_t kWords = 4096;
  cudaStream_t s;
  RT(o, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<std::vector<float>> host(kN, std::vector<float>(kWords)), back(kN, std::vector<float>(kWords));
  CUdeviceptr d1[kN], d2[kN], hsrc[kN], hdst[kN];
  size_t sizes[kN];
  for (int i = 0; i < kN; ++i) {
    for (size_t j = 0; j < kWords; ++j) host[i][j] = tf_samples::Input(j, i);
    sizes[i] = (kWords - 16 * i) * sizeof(float);
    DRV(o, cuMemAlloc(&d1[i], kWords * sizeof(float)));
    DRV(o, cuMemAlloc(&d2[i], kWords * sizeof(float)));
    hsrc[i] = reinterpret_cast<CUdeviceptr>(host[i].data());
    hdst[i] = reinterpret_cast<CUdeviceptr>(back[i].data());
  }
  CUmemcpyAttributes attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  size_t idx = 0;
  DRV(o, cuMemcpyBatchAsync(d1, hsrc, sizes, kN, &attr, &idx, 1, s));
  DRV(o, cuMemcpyBatchAsync(d2, d1, sizes, kN, &attr, &idx, 1, s));
  DRV(o, cuMemcpyBatchAsync(hdst, d2, sizes, kN, &attr, &idx, 1, s));
  RT(o, cudaStreamSynchronize(s));
  for (int i = 0; i < kN; ++i) {
    if (std::memcmp(back[i].data(), host[i].data(), sizes[i]) != 0) o.Fail("a buffer differs after the round trip");
    o.Result(back[i].data(), kWords * sizeof(float));
    cuMemFree(d1[i]);
    cuMemFree(d2[i]);
  }
  cudaStreamDestroy(s);
}

// cuMemcpyPeer(Async) from a second context of the device into the primary one; peer access
// between two contexts of one device answers what the driver answers.
TF_SAMPLE(memops_peer_copy) {
  CUcontext primary = Primary(o);
  CUdevice dev = 0;
  DRV(o, cuCtxGetDevice(&dev));
  CUcontext other = nullptr;
  DRV(o, cuCtxCreate(&other, nullptr, 0, dev));
  CUdeviceptr src = 0;
  DRV(o, cuMemAlloc(&src, 1 << 16));
  DRV(o, cuMemsetD32(src, 0xc0ffee, (1 << 16) / 4));
  DRV(o, cuCtxSynchronize());
  DRV(o, cuCtxSetCurrent(primary));
  CUdeviceptr dst = 0;
  DRV(o, cuMemAlloc(&dst, 1 << 16));
  DRV(o, cuMemsetD32(dst, 0, (1 << 16) / 4));
  DRV(o, cuMemcpyPeer(dst, primary, src, other, 1 << 15));
  cudaStream_t s;
  RT(o, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  DRV(o, cuMemcpyPeerAsync(dst + (1 << 15), primary, src, other, 1 << 14, s));
  RT(o, cudaStreamSynchronize(s));
  std::vector<uint32_t> got((1 << 16) / 4);
  DRV(o, cuMemcpyDtoH(got.data(), dst, 1 << 16));
  if (got[0] != 0xc0ffee || got[(3 << 14) / 4 - 1] != 0xc0ffee || got[(3 << 14) / 4] != 0) o.Fail("peer copy");
  o.Result(got.data(), got.size() * 4);
  const int enable = static_cast<int>(cuCtxEnablePeerAccess(other, 0));
  o.Result(&enable, sizeof(enable));
  cudaStreamDestroy(s);
  cuMemFree(dst);
  cuCtxSetCurrent(other);
  cuMemFree(src);
  cuCtxDestroy(other);
  cuCtxSetCurrent(primary);
}

// The device's current pool: the default one, then a pool of ours that cudaMallocAsync uses.
TF_SAMPLE(memops_current_pool) {
  Primary(o);
  CUdevice dev = 0;
  DRV(o, cuCtxGetDevice(&dev));
  CUmemoryPool def = nullptr, cur = nullptr, mine = nullptr;
  DRV(o, cuDeviceGetDefaultMemPool(&def, dev));
  DRV(o, cuDeviceGetMemPool(&cur, dev));
  const int starts_default = cur == def;
  CUmemPoolProps props;
  std::memset(&props, 0, sizeof(props));
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = dev;
  DRV(o, cuMemPoolCreate(&mine, &props));
  DRV(o, cuDeviceSetMemPool(dev, mine));
  DRV(o, cuDeviceGetMemPool(&cur, dev));
  const int now_mine = cur == mine;
  void* p = nullptr;
  RT(o, cudaMallocAsync(&p, 4096, nullptr));
  CUmemoryPool from = nullptr;
  DRV(o, cuPointerGetAttribute(&from, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, reinterpret_cast<CUdeviceptr>(p)));
  RT(o, cudaFreeAsync(p, nullptr));
  RT(o, cudaDeviceSynchronize());
  DRV(o, cuDeviceSetMemPool(dev, def));
  const int answers[3] = {starts_default, now_mine, from == mine};
  if (!answers[0] || !answers[1] || !answers[2]) o.Fail("current pool");
  o.Result(answers, sizeof(answers));
  cuMemPoolDestroy(mine);
}

// cuMemPrefetchBatchAsync of managed memory: the data is unchanged.
TF_SAMPLE(memops_prefetch_batch) {
  Primary(o);
  CUdevice dev = 0;
  DRV(o, cuCtxGetDevice(&dev));
  float* m[2] = {};
  RT(o, cudaMallocManaged(&m[0], 1 << 16));
  RT(o, cudaMallocManaged(&m[1], 1 << 17));
  for (size_t i = 0; i < (1 << 14); ++i) m[0][i] = tf_samples::Input(i, 1);
  for (size_t i = 0; i < (1 << 15); ++i) m[1][i] = tf_samples::Input(i, 2);
  cudaStream_t s;
  RT(o, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUdeviceptr ptrs[2] = {reinterpret_cast<CUdeviceptr>(m[0]), reinterpret_cast<CUdeviceptr>(m[1])};
  size_t sizes[2] = {1 << 16, 1 << 17};
  CUmemLocation loc;
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = dev;
  size_t idx = 0;
  DRV(o, cuMemPrefetchBatchAsync(ptrs, sizes, 2, &loc, &idx, 1, 0, s));
  RT(o, cudaStreamSynchronize(s));
  o.Result(m[0], 1 << 16);
  o.Result(m[1], 1 << 17);
  cudaFree(m[0]);
  cudaFree(m[1]);
  cudaStreamDestroy(s);
}

// cuStreamCopyAttributes: what the destination stream answers afterwards.
TF_SAMPLE(memops_stream_copy_attributes) {
  Primary(o);
  cudaStream_t hi, lo;
  RT(o, cudaStreamCreateWithPriority(&hi, cudaStreamNonBlocking, -1));
  RT(o, cudaStreamCreateWithPriority(&lo, cudaStreamNonBlocking, 0));
  DRV(o, cuStreamCopyAttributes(lo, hi));
  int prio = 9;
  DRV(o, cuStreamGetPriority(lo, &prio));
  o.Result(&prio, sizeof(prio));
  cudaStreamDestroy(hi);
  cudaStreamDestroy(lo);
}

// VMM queries: the access a mapping was given, the properties of its handle, and the handle
// retained from an address (whose properties match; it owes one more release).
TF_SAMPLE(memops_vmm_queries) {
  Primary(o);
  CUdevice dev = 0;
  DRV(o, cuCtxGetDevice(&dev));
  CUmemAllocationProp prop;
  std::memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  size_t gran = 0;
  DRV(o, cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle h = 0, again = 0;
  DRV(o, cuMemCreate(&h, gran, &prop, 0));
  CUdeviceptr va = 0;
  DRV(o, cuMemAddressReserve(&va, gran, 0, 0, 0));
  DRV(o, cuMemMap(va, gran, 0, h, 0));
  CUmemAccessDesc access;
  std::memset(&access, 0, sizeof(access));
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  DRV(o, cuMemSetAccess(va, gran, &access, 1));
  unsigned long long flags = 0;
  DRV(o, cuMemGetAccess(&flags, &prop.location, va + 256));
  CUmemAllocationProp got, got_again;
  std::memset(&got, 0, sizeof(got));
  std::memset(&got_again, 0, sizeof(got_again));
  DRV(o, cuMemGetAllocationPropertiesFromHandle(&got, h));
  DRV(o, cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(va + 512)));
  DRV(o, cuMemGetAllocationPropertiesFromHandle(&got_again, again));
  DRV(o, cuMemsetD32(va, 0x600dd00d, gran / 4));
  uint32_t word = 0;
  DRV(o, cuMemcpyDtoH(&word, va + gran - 4, 4));
  const int answers[6] = {static_cast<int>(flags), static_cast<int>(got.type),
                          static_cast<int>(got.location.type), static_cast<int>(got_again.type),
                          got_again.location.id == dev, word == 0x600dd00du};
  if (flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE || !answers[4] || !answers[5]) o.Fail("VMM queries");
  o.Result(answers, sizeof(answers));
  DRV(o, cuMemUnmap(va, gran));
  DRV(o, cuMemRelease(again));
  DRV(o, cuMemRelease(h));
  DRV(o, cuMemAddressFree(va, gran));
}

// Pools by location: the default and current pool of the device, a pool of ours set as current
// and used by cudaMallocAsync, and the access the pool gives its own device.
TF_SAMPLE(memops_pool_by_location) {
  Primary(o);
  CUdevice dev = 0;
  DRV(o, cuCtxGetDevice(&dev));
  CUmemLocation loc;
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = dev;
  CUmemoryPool def = nullptr, by_dev = nullptr, cur = nullptr, mine = nullptr;
  DRV(o, cuMemGetDefaultMemPool(&def, &loc, CU_MEM_ALLOCATION_TYPE_PINNED));
  DRV(o, cuDeviceGetDefaultMemPool(&by_dev, dev));
  DRV(o, cuMemGetMemPool(&cur, &loc, CU_MEM_ALLOCATION_TYPE_PINNED));
  const int starts = def == by_dev && cur == def;
  CUmemPoolProps props;
  std::memset(&props, 0, sizeof(props));
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location = loc;
  DRV(o, cuMemPoolCreate(&mine, &props));
  DRV(o, cuMemSetMemPool(&loc, CU_MEM_ALLOCATION_TYPE_PINNED, mine));
  DRV(o, cuMemGetMemPool(&cur, &loc, CU_MEM_ALLOCATION_TYPE_PINNED));
  const int set = cur == mine;
  void* p = nullptr;
  RT(o, cudaMallocAsync(&p, 4096, nullptr));
  CUmemoryPool from = nullptr;
  DRV(o, cuPointerGetAttribute(&from, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, reinterpret_cast<CUdeviceptr>(p)));
  RT(o, cudaFreeAsync(p, nullptr));
  RT(o, cudaDeviceSynchronize());
  CUmemAccess_flags own = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  DRV(o, cuMemPoolGetAccess(&own, mine, &loc));
  DRV(o, cuMemSetMemPool(&loc, CU_MEM_ALLOCATION_TYPE_PINNED, def));
  const int answers[4] = {starts, set, from == mine, static_cast<int>(own)};
  if (!starts || !set || from != mine || own != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) o.Fail("pools by location");
  o.Result(answers, sizeof(answers));
  cuMemPoolDestroy(mine);
}

// CU_POINTER_ATTRIBUTE_SYNC_MEMOPS set and read back; the device's atomic capabilities with the
// host (the driver's answer, the same natively and remotely).
TF_SAMPLE(memops_sync_memops_atomics) {
  Primary(o);
  CUdevice dev = 0;
  DRV(o, cuCtxGetDevice(&dev));
  void* p = nullptr;
  RT(o, cudaMalloc(&p, 4096));
  unsigned one = 1;
  int sync = 0;
  DRV(o, cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, reinterpret_cast<CUdeviceptr>(p)));
  DRV(o, cuPointerGetAttribute(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, reinterpret_cast<CUdeviceptr>(p)));
  if (sync != 1) o.Fail("SYNC_MEMOPS not kept");
  CUatomicOperation ops[3] = {CU_ATOMIC_OPERATION_INTEGER_ADD, CU_ATOMIC_OPERATION_CAS,
                              CU_ATOMIC_OPERATION_FLOAT_ADD};
  unsigned caps[3] = {0, 0, 0};
  DRV(o, cuDeviceGetHostAtomicCapabilities(caps, ops, 3, dev));
  o.Result(&sync, sizeof(sync));
  o.Result(caps, sizeof(caps));
  cudaFree(p);
}

// cuMemcpy3DPeer(Async) between a context of ours and the primary context of the one device.
TF_SAMPLE(memops_3d_peer_copy) {
  CUcontext primary = Primary(o);
  CUdevice dev = 0;
  DRV(o, cuCtxGetDevice(&dev));
  CUcontext other = nullptr;
  DRV(o, cuCtxCreate(&other, nullptr, 0, dev));
  CUdeviceptr src = 0;
  DRV(o, cuMemAlloc(&src, 1 << 14));
  std::vector<uint32_t> in((1 << 14) / 4);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint32_t>(i * 2654435761u);
  DRV(o, cuMemcpyHtoD(src, in.data(), 1 << 14));
  DRV(o, cuCtxSetCurrent(primary));
  CUdeviceptr dst = 0;
  DRV(o, cuMemAlloc(&dst, 1 << 15));
  DRV(o, cuMemsetD32(dst, 0, (1 << 15) / 4));
  CUDA_MEMCPY3D_PEER box;
  std::memset(&box, 0, sizeof(box));
  box.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  box.srcDevice = src;
  box.srcPitch = 256;
  box.srcHeight = 8;
  box.srcContext = other;
  box.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  box.dstDevice = dst;
  box.dstPitch = 512;
  box.dstHeight = 8;
  box.dstContext = primary;
  box.WidthInBytes = 200;
  box.Height = 8;
  box.Depth = 4;
  DRV(o, cuMemcpy3DPeer(&box));
  cudaStream_t s;
  RT(o, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  box.dstXInBytes = 256;
  DRV(o, cuMemcpy3DPeerAsync(&box, s));
  RT(o, cudaStreamSynchronize(s));
  std::vector<uint32_t> got((1 << 15) / 4);
  DRV(o, cuMemcpyDtoH(got.data(), dst, 1 << 15));
  if (got[0] != in[0] || got[64] != in[0] || got[50] != 0) o.Fail("3D peer copy");
  o.Result(got.data(), got.size() * 4);
  cudaStreamDestroy(s);
  cuMemFree(dst);
  cuCtxSetCurrent(other);
  cuMemFree(src);
  cuCtxDestroy(other);
  cuCtxSetCurrent(primary);
}

// cuMemcpy3DBatchAsync: a box from pageable host memory into pitched device memory, device to
// device, and back into host memory tightly packed.
TF_SAMPLE(memops_3d_batch_copy) {
  Primary(o);
  cudaStream_t s;
  RT(o, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  constexpr size_t kW = 200, kH = 6, kD = 3;  // bytes, rows, layers
  std::vector<uint8_t> host(kW * kH * kD), back(kW * kH * kD, 0);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 13 + 5);
  CUdeviceptr a = 0, b = 0;
  DRV(o, cuMemAlloc(&a, 256 * 8 * kD));
  DRV(o, cuMemAlloc(&b, 256 * 8 * kD));
  DRV(o, cuMemsetD8(b, 0, 256 * 8 * kD));
  CUDA_MEMCPY3D_BATCH_OP ops[2];
  std::memset(ops, 0, sizeof(ops));
  ops[0].src.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  ops[0].src.op.ptr.ptr = reinterpret_cast<CUdeviceptr>(host.data());
  ops[0].dst.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  ops[0].dst.op.ptr.ptr = a;
  ops[0].dst.op.ptr.rowLength = 256;
  ops[0].dst.op.ptr.layerHeight = 8;
  ops[0].extent = {kW, kH, kD};
  ops[0].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  DRV(o, cuMemcpy3DBatchAsync(1, &ops[0], 0, s));
  ops[1] = ops[0];
  ops[1].src.op.ptr = ops[0].dst.op.ptr;
  ops[1].dst.op.ptr.ptr = b;
  DRV(o, cuMemcpy3DBatchAsync(1, &ops[1], 0, s));
  CUDA_MEMCPY3D_BATCH_OP out = ops[1];
  out.src.op.ptr = ops[1].dst.op.ptr;
  std::memset(&out.dst, 0, sizeof(out.dst));
  out.dst.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  out.dst.op.ptr.ptr = reinterpret_cast<CUdeviceptr>(back.data());
  DRV(o, cuMemcpy3DBatchAsync(1, &out, 0, s));
  RT(o, cudaStreamSynchronize(s));
  uint8_t pad = 9;
  DRV(o, cuMemcpyDtoH(&pad, b + 256 * 8 + 230, 1));
  if (back != host || pad != 0) o.Fail("3D batch copy");
  o.Result(back.data(), back.size());
  o.Result(&pad, 1);
  cuMemFree(a);
  cuMemFree(b);
  cudaStreamDestroy(s);
}
