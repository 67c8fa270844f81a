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
