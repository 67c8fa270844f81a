// A driver-API program for the remote tests of stream memory operations, batched copies and
// prefetches, peer copies between contexts of one device, peer access, the current memory pool
// and stream attribute copies. Run directly on tests/fakecuda or through the client stub and a
// worker, it prints "key=value" lines the tests compare.
//
// An asynchronous call with a bad argument fails either itself (natively) or the next
// synchronizing call (remotely, where it is fire-and-forget): `FIRST(call, stream)` prints the first
// non-zero result of the two, the same number either way.
#include <cuda.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "probe_util.h"

namespace {

using tf_probe::Setup;

// The call runs first, then the synchronization (a macro: function arguments have no order).
#define FIRST(call, stream)                                 \
  [&] {                                                     \
    const CUresult c_ = (call);                             \
    const CUresult s_ = cuStreamSynchronize(stream);        \
    return static_cast<int>(c_ != CUDA_SUCCESS ? c_ : s_);  \
  }()

uint64_t Sum(const std::vector<uint32_t>& v) {
  uint64_t s = 0;
  for (size_t i = 0; i < v.size(); ++i) s = s * 31 + v[i] + i;
  return s;
}

// Wait-value really waits: a stream waiting for a word that another stream writes later is not
// done before the write, and runs on after it.
void WaitAndWrite() {
  CUstream a, b;
  CHECK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  CUdeviceptr words;
  CHECK(cuMemAlloc(&words, 64));
  CHECK(cuMemsetD8(words, 0, 64));
  CHECK(cuStreamWaitValue32(a, words, 1, CU_STREAM_WAIT_VALUE_EQ));
  CHECK(cuStreamWriteValue32(a, words + 4, 7, 0));
  CHECK(cuStreamWaitValue64(a, words + 8, 0x500000000ull, CU_STREAM_WAIT_VALUE_GEQ));
  CHECK(cuStreamWriteValue64(a, words + 16, 0x1234567890ull, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER));
  const CUresult before = cuStreamQuery(a);
  CHECK(cuStreamWriteValue32(b, words, 1, 0));
  CHECK(cuStreamWriteValue64(b, words + 8, 0x500000001ull, 0));
  CHECK(cuStreamSynchronize(b));
  CHECK(cuStreamSynchronize(a));
  uint32_t w32[2];
  uint64_t w64[3];
  CHECK(cuMemcpyDtoH(w32, words, sizeof(w32)));
  CHECK(cuMemcpyDtoH(w64, words, sizeof(w64)));
  std::printf("wait_blocks=%d\n", static_cast<int>(before));
  std::printf("wait_released=%u:%u:%llx:%llx\n", w32[0], w32[1],
              static_cast<unsigned long long>(w64[1]), static_cast<unsigned long long>(w64[2]));

  // The legacy entry points (cuda.h maps the names to the _v2 forms; a library compiled against an
  // older header calls these): where the library exports them, the same operations.
  using Op32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned);
  using Op64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned);
  auto wait32 = reinterpret_cast<Op32>(dlsym(RTLD_DEFAULT, "cuStreamWaitValue32"));
  auto write32 = reinterpret_cast<Op32>(dlsym(RTLD_DEFAULT, "cuStreamWriteValue32"));
  auto wait64 = reinterpret_cast<Op64>(dlsym(RTLD_DEFAULT, "cuStreamWaitValue64"));
  auto write64 = reinterpret_cast<Op64>(dlsym(RTLD_DEFAULT, "cuStreamWriteValue64"));
  if (wait32 && write32 && wait64 && write64) {
    CUdeviceptr legacy;
    CHECK(cuMemAlloc(&legacy, 32));
    CHECK(cuMemsetD8(legacy, 0, 32));
    CHECK(write32(a, legacy, 5, 0));
    CHECK(wait32(a, legacy, 5, CU_STREAM_WAIT_VALUE_EQ));
    CHECK(write64(a, legacy + 8, 0x700000000ull, 0));
    CHECK(wait64(a, legacy + 8, 0x600000000ull, CU_STREAM_WAIT_VALUE_GEQ));
    CHECK(write32(a, legacy + 16, 6, 0));
    CHECK(cuStreamSynchronize(a));
    uint64_t l64[3];
    CHECK(cuMemcpyDtoH(l64, legacy, sizeof(l64)));
    const int bad = FIRST(write32(a, legacy + 32, 1, 0), a);  // outside: refused as by the _v2 form
    std::printf("legacy_memops=%llx:%llx:%llx:%d\n", static_cast<unsigned long long>(l64[0]),
                static_cast<unsigned long long>(l64[1]), static_cast<unsigned long long>(l64[2]), bad);
    CHECK(cuMemFree(legacy));
  } else {
    std::printf("legacy_memops=na\n");
  }

  // A batch: write, write 64, barrier, wait on what it wrote, flush, write.
  CUstreamBatchMemOpParams ops[6];
  std::memset(ops, 0, sizeof(ops));
  ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  ops[0].writeValue.address = words + 24;
  ops[0].writeValue.value = 0xfeed;
  ops[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
  ops[1].writeValue.address = words + 32;
  ops[1].writeValue.value64 = 0xabcdef0123ull;
  ops[2].memoryBarrier.operation = CU_STREAM_MEM_OP_BARRIER;
  ops[2].memoryBarrier.flags = CU_STREAM_MEMORY_BARRIER_TYPE_GPU;
  ops[3].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  ops[3].waitValue.address = words + 24;
  ops[3].waitValue.value = 0xfeed;
  ops[3].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
  ops[4].flushRemoteWrites.operation = CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES;
  ops[5].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  ops[5].writeValue.address = words + 40;
  ops[5].writeValue.value = 0x5eed;
  CHECK(cuStreamBatchMemOp(a, 6, ops, 0));
  CHECK(cuStreamSynchronize(a));
  uint32_t b32[2];
  uint64_t b64 = 0;
  CHECK(cuMemcpyDtoH(&b32[0], words + 24, 4));
  CHECK(cuMemcpyDtoH(&b64, words + 32, 8));
  CHECK(cuMemcpyDtoH(&b32[1], words + 40, 4));
  std::printf("batch=%x:%llx:%x\n", b32[0], static_cast<unsigned long long>(b64), b32[1]);

  // Bad input fails that call only (the stream is still usable after).
  std::printf("bad_wait_addr=%d\n",
              FIRST(cuStreamWaitValue32(a, 0x10, 0, 0), a));
  std::printf("bad_write_unaligned_outside=%d\n",
              FIRST(cuStreamWriteValue32(a, words + 64, 1, 0), a));
  std::printf("bad_wait_flags=%d\n",
              FIRST(cuStreamWaitValue32(a, words, 1, 0x100), a));
  std::printf("bad_write_flags=%d\n",
              FIRST(cuStreamWriteValue64(a, words, 1, 0x8), a));
  std::printf("bad_batch_count=%d\n", static_cast<int>(cuStreamBatchMemOp(a, 0, ops, 0)));
  std::printf("bad_batch_flags=%d\n", static_cast<int>(cuStreamBatchMemOp(a, 1, ops, 1)));
  CUstreamBatchMemOpParams bad = ops[0];
  bad.writeValue.address = 0x20;
  std::printf("bad_batch_addr=%d\n", FIRST(cuStreamBatchMemOp(a, 1, &bad, 0), a));
  bad = ops[0];
  bad.operation = static_cast<CUstreamBatchMemOpType>(99);
  std::printf("bad_batch_op=%d\n", FIRST(cuStreamBatchMemOp(a, 1, &bad, 0), a));
  CHECK(cuStreamWriteValue32(a, words + 44, 3, 0));
  CHECK(cuStreamSynchronize(a));
  uint32_t after = 0;
  CHECK(cuMemcpyDtoH(&after, words + 44, 4));
  std::printf("after_bad=%u\n", after);
  CHECK(cuMemFree(words));
  CHECK(cuStreamDestroy(a));
  CHECK(cuStreamDestroy(b));
}

// Eight device buffers filled from pageable host memory, copied device to device and back in one
// batch each; bad batches copy nothing.
void BatchCopies() {
  constexpr int kN = 8;
  constexpr size_t kWords = 1024;
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  std::vector<std::vector<uint32_t>> host(kN, std::vector<uint32_t>(kWords)), back(kN, std::vector<uint32_t>(kWords, 0));
  CUdeviceptr dev[kN], dev2[kN], from_host[kN], to_host[kN];
  size_t sizes[kN];
  for (int i = 0; i < kN; ++i) {
    for (size_t j = 0; j < kWords; ++j) host[i][j] = static_cast<uint32_t>(i * 100003 + j * 7);
    sizes[i] = kWords * 4 - 4 * i;  // lengths differ
    CHECK(cuMemAlloc(&dev[i], kWords * 4));
    CHECK(cuMemAlloc(&dev2[i], kWords * 4));
    CHECK(cuMemsetD32(dev2[i], 0, kWords));
    from_host[i] = reinterpret_cast<CUdeviceptr>(host[i].data());
    to_host[i] = reinterpret_cast<CUdeviceptr>(back[i].data());
  }
  CUmemcpyAttributes attrs[2];
  std::memset(attrs, 0, sizeof(attrs));
  attrs[0].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  attrs[1].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL;
  size_t idx[2] = {0, 4};
  CHECK(cuMemcpyBatchAsync(dev, from_host, sizes, kN, attrs, idx, 2, s));
  CHECK(cuMemcpyBatchAsync(dev2, dev, sizes, kN, attrs, idx, 1, s));
  CHECK(cuMemcpyBatchAsync(to_host, dev2, sizes, kN, attrs, idx, 1, s));
  CHECK(cuStreamSynchronize(s));
  uint64_t sum = 0;
  for (int i = 0; i < kN; ++i) sum = sum * 1000003 + Sum(back[i]);
  std::printf("batch_copy=%llx\n", static_cast<unsigned long long>(sum));
  std::printf("batch_copy_no_attrs=%d\n",
              static_cast<int>(cuMemcpyBatchAsync(dev2, dev, sizes, kN, attrs, idx, 0, s)));
  std::printf("batch_copy_null_stream=%d\n",
              static_cast<int>(cuMemcpyBatchAsync(dev2, dev, sizes, kN, attrs, idx, 1, nullptr)));
  CUmemcpyAttributes bad_attr = attrs[0];
  bad_attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_INVALID;
  std::printf("batch_copy_bad_order=%d\n",
              static_cast<int>(cuMemcpyBatchAsync(dev2, dev, sizes, kN, &bad_attr, idx, 1, s)));
  size_t bad_idx[2] = {0, 9};
  std::printf("batch_copy_bad_index=%d\n",
              static_cast<int>(cuMemcpyBatchAsync(dev2, dev, sizes, kN, attrs, bad_idx, 2, s)));
  for (int i = 0; i < kN; ++i) {
    CHECK(cuMemFree(dev[i]));
    CHECK(cuMemFree(dev2[i]));
  }
  CHECK(cuStreamDestroy(s));
}

// Managed memory prefetched and discarded in batches keeps its data.
void ManagedBatches() {
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr m[2];
  CHECK(cuMemAllocManaged(&m[0], 4096, CU_MEM_ATTACH_GLOBAL));
  CHECK(cuMemAllocManaged(&m[1], 8192, CU_MEM_ATTACH_GLOBAL));
  CHECK(cuMemsetD32(m[0], 0x11111111, 1024));
  CHECK(cuMemsetD32(m[1], 0x22222222, 2048));
  CHECK(cuCtxSynchronize());
  size_t sizes[2] = {4096, 8192};
  CUmemLocation locs[2];
  locs[0].type = CU_MEM_LOCATION_TYPE_DEVICE;
  locs[0].id = 0;
  locs[1].type = CU_MEM_LOCATION_TYPE_HOST;
  locs[1].id = 0;
  size_t idx[2] = {0, 1};
  CHECK(cuMemPrefetchBatchAsync(m, sizes, 2, locs, idx, 2, 0, s));
  CHECK(cuStreamSynchronize(s));
  const CUresult discard = cuMemDiscardBatchAsync(m, sizes, 2, 0, s);
  const CUresult both = cuMemDiscardAndPrefetchBatchAsync(m, sizes, 2, locs, idx, 1, 0, s);
  CHECK(cuStreamSynchronize(s));
  uint32_t a = 0, b = 0;
  CHECK(cuMemcpyDtoH(&a, m[0] + 100, 4));
  CHECK(cuMemcpyDtoH(&b, m[1] + 8000, 4));
  std::printf("managed_batch=%d:%d:%x:%x\n", static_cast<int>(discard), static_cast<int>(both), a, b);
  CUdeviceptr plain;
  CHECK(cuMemAlloc(&plain, 4096));
  CUdeviceptr not_managed[1] = {plain};
  std::printf("managed_batch_not_managed=%d\n",
              static_cast<int>(cuMemPrefetchBatchAsync(not_managed, sizes, 1, locs, idx, 1, 0, s)));
  std::printf("managed_batch_flags=%d\n", static_cast<int>(cuMemDiscardBatchAsync(m, sizes, 2, 1, s)));
  CUmemLocation bad_loc = locs[0];
  bad_loc.id = 77;
  std::printf("managed_batch_bad_device=%d\n",
              static_cast<int>(cuMemPrefetchBatchAsync(m, sizes, 2, &bad_loc, idx, 1, 0, s)));
  CHECK(cuMemFree(plain));
  CHECK(cuMemFree(m[0]));
  CHECK(cuMemFree(m[1]));
  CHECK(cuStreamDestroy(s));
}

// Two contexts of the one device: copies between them, and peer access as the driver answers it.
void Peers(CUcontext primary) {
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, 0));
  CUcontext other;
  CHECK(cuCtxCreate(&other, nullptr, 0, dev));
  CUdeviceptr src;
  CHECK(cuMemAlloc(&src, 4096));
  CHECK(cuMemsetD32(src, 0xc0ffee, 1024));
  CHECK(cuCtxSetCurrent(primary));
  CUdeviceptr dst, dst2;
  CHECK(cuMemAlloc(&dst, 4096));
  CHECK(cuMemAlloc(&dst2, 4096));
  CHECK(cuMemsetD32(dst, 0, 1024));
  CHECK(cuMemcpyPeer(dst, primary, src, other, 4096));
  CUstream s;
  CHECK(cuStreamCreate(&s, 0));
  CHECK(cuMemcpyPeerAsync(dst2 + 8, primary, src, other, 16, s));
  CHECK(cuStreamSynchronize(s));
  uint32_t got[2] = {0, 0};
  CHECK(cuMemcpyDtoH(&got[0], dst + 4092, 4));
  CHECK(cuMemcpyDtoH(&got[1], dst2 + 20, 4));
  std::printf("peer_copy=%x:%x\n", got[0], got[1]);
  std::printf("peer_copy_outside=%d\n", static_cast<int>(cuMemcpyPeer(dst, primary, src, other, 8192)));
  std::printf("peer_copy_bad_ctx=%d\n",
              static_cast<int>(cuMemcpyPeer(dst, reinterpret_cast<CUcontext>(0x4242), src, other, 16)));
  // 3D peer copies: a 32-byte wide, 4-row, 2-layer box from the other context's buffer (pitch 64)
  // into zeroed buffers of this one (pitch 128), synchronously and on a stream.
  CHECK(cuMemsetD32(dst, 0, 1024));
  CHECK(cuMemsetD32(dst2, 0, 1024));
  CUDA_MEMCPY3D_PEER box;
  std::memset(&box, 0, sizeof(box));
  box.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  box.srcDevice = src;
  box.srcPitch = 64;
  box.srcHeight = 4;
  box.srcContext = other;
  box.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  box.dstDevice = dst2;
  box.dstPitch = 128;
  box.dstHeight = 4;
  box.dstContext = primary;
  box.WidthInBytes = 32;
  box.Height = 4;
  box.Depth = 2;
  CHECK(cuMemcpy3DPeer(&box));
  box.dstDevice = dst;
  box.dstXInBytes = 16;
  CHECK(cuMemcpy3DPeerAsync(&box, s));
  CHECK(cuStreamSynchronize(s));
  uint32_t w[4] = {9, 9, 9, 9};
  CHECK(cuMemcpyDtoH(&w[0], dst2 + 128 * 4 + 128 * 3 + 28, 4));  // last word of the box
  CHECK(cuMemcpyDtoH(&w[1], dst2 + 32, 4));                       // beside the box: untouched
  CHECK(cuMemcpyDtoH(&w[2], dst + 128 * 7 + 16 + 28, 4));
  CHECK(cuMemcpyDtoH(&w[3], dst + 8, 4));
  std::printf("peer_copy_3d=%x:%x:%x:%x\n", w[0], w[1], w[2], w[3]);
  box.srcContext = reinterpret_cast<CUcontext>(0x4242);
  std::printf("peer_copy_3d_bad_ctx=%d\n", static_cast<int>(cuMemcpy3DPeer(&box)));
  box.srcContext = other;
  box.Depth = 40;  // past the end of both buffers
  std::printf("peer_copy_3d_outside=%d\n", static_cast<int>(cuMemcpy3DPeer(&box)));
  std::printf("peer_enable=%d\n", static_cast<int>(cuCtxEnablePeerAccess(other, 0)));
  std::printf("peer_enable_self=%d\n", static_cast<int>(cuCtxEnablePeerAccess(primary, 0)));
  std::printf("peer_enable_flags=%d\n", static_cast<int>(cuCtxEnablePeerAccess(other, 1)));
  std::printf("peer_disable=%d\n", static_cast<int>(cuCtxDisablePeerAccess(other)));
  CHECK(cuStreamDestroy(s));
  CHECK(cuMemFree(dst));
  CHECK(cuMemFree(dst2));
  CHECK(cuCtxSetCurrent(other));
  CHECK(cuMemFree(src));
  CHECK(cuCtxDestroy(other));
  CHECK(cuCtxSetCurrent(primary));
}

// The device's current pool: the default one until set; a pool of the session set and read back.
void Pools() {
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, 0));
  CUmemoryPool def = nullptr, cur = nullptr;
  CHECK(cuDeviceGetDefaultMemPool(&def, dev));
  CHECK(cuDeviceGetMemPool(&cur, dev));
  const bool starts_default = cur == def;
  CUmemPoolProps props;
  std::memset(&props, 0, sizeof(props));
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = dev;
  CUmemoryPool mine;
  CHECK(cuMemPoolCreate(&mine, &props));
  CHECK(cuDeviceSetMemPool(dev, mine));
  CHECK(cuDeviceGetMemPool(&cur, dev));
  const bool now_mine = cur == mine;
  CUdeviceptr p;
  CHECK(cuMemAllocAsync(&p, 4096, nullptr));
  CUmemoryPool from = nullptr;
  CHECK(cuPointerGetAttribute(&from, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p));
  CHECK(cuMemFreeAsync(p, nullptr));
  CHECK(cuCtxSynchronize());
  CHECK(cuDeviceSetMemPool(dev, def));
  CHECK(cuDeviceGetMemPool(&cur, dev));
  std::printf("pools=%d:%d:%d:%d\n", starts_default, now_mine, from == mine, cur == def);
  std::printf("pool_bad_device=%d\n", static_cast<int>(cuDeviceGetMemPool(&cur, 57)));
  std::printf("pool_set_bad_device=%d\n", static_cast<int>(cuDeviceSetMemPool(57, def)));
  CHECK(cuMemPoolDestroy(mine));
}

// cuStreamCopyAttributes: the destination answers the source's priority afterwards.
void CopyAttributes() {
  CUstream hi, lo;
  CHECK(cuStreamCreateWithPriority(&hi, 0, -1));
  CHECK(cuStreamCreateWithPriority(&lo, 0, 0));
  int before = 9, after = 9;
  CHECK(cuStreamGetPriority(lo, &before));
  CHECK(cuStreamCopyAttributes(lo, hi));
  CHECK(cuStreamGetPriority(lo, &after));
  std::printf("copy_attributes=%d:%d\n", before, after);
  std::printf("copy_attributes_bad=%d\n",
              static_cast<int>(cuStreamCopyAttributes(lo, reinterpret_cast<CUstream>(0x5a5a5a0))));
  CHECK(cuStreamDestroy(hi));
  CHECK(cuStreamDestroy(lo));
}

// VMM queries: the access a mapping was given, a handle's properties, and a handle retained from
// an address (the same handle, owing one more release).
void VmmQueries() {
  CUmemAllocationProp prop;
  std::memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle h;
  CHECK(cuMemCreate(&h, gran, &prop, 0));
  CUdeviceptr va;
  CHECK(cuMemAddressReserve(&va, 2 * gran, 0, 0, 0));
  CHECK(cuMemMap(va, gran, 0, h, 0));
  CUmemAccessDesc access;
  std::memset(&access, 0, sizeof(access));
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK(cuMemSetAccess(va, gran, &access, 1));
  unsigned long long flags = 9;
  CHECK(cuMemGetAccess(&flags, &prop.location, va + 64));
  std::printf("vmm_access=%llu\n", flags);
  std::printf("vmm_access_unmapped=%d\n", static_cast<int>(cuMemGetAccess(&flags, &prop.location, va + gran)));
  CUmemLocation bad_loc = prop.location;
  bad_loc.id = 57;
  std::printf("vmm_access_bad_device=%d\n", static_cast<int>(cuMemGetAccess(&flags, &bad_loc, va)));
  CUmemAllocationProp got;
  std::memset(&got, 0x5a, sizeof(got));
  CHECK(cuMemGetAllocationPropertiesFromHandle(&got, h));
  std::printf("vmm_props=%d:%d:%d\n", static_cast<int>(got.type), static_cast<int>(got.location.type),
              got.location.id);
  std::printf("vmm_props_bad=%d\n", static_cast<int>(cuMemGetAllocationPropertiesFromHandle(
                                        &got, static_cast<CUmemGenericAllocationHandle>(0x1234))));
  CUmemGenericAllocationHandle again = 0;
  CHECK(cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(va + 128)));
  std::printf("vmm_retain_same=%d\n", again == h ? 1 : 0);
  std::printf("vmm_retain_outside=%d\n",
              static_cast<int>(cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(va + gran + 8))));
  CHECK(cuMemUnmap(va, gran));
  const CUresult first = cuMemRelease(h);
  const CUresult second = cuMemRelease(h);
  std::printf("vmm_released=%d:%d:%d\n", static_cast<int>(first), static_cast<int>(second),
              static_cast<int>(cuMemRelease(h)));
  CHECK(cuMemAddressFree(va, 2 * gran));
}

// Pools by location: the default and current pool of the device, set and read back, and the
// access a pool gives.
void PoolsByLocation() {
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, 0));
  CUmemLocation loc;
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = dev;
  CUmemoryPool def = nullptr, by_dev = nullptr, cur = nullptr, cur_dev = nullptr;
  CHECK(cuMemGetDefaultMemPool(&def, &loc, CU_MEM_ALLOCATION_TYPE_PINNED));
  CHECK(cuDeviceGetDefaultMemPool(&by_dev, dev));
  CHECK(cuMemGetMemPool(&cur, &loc, CU_MEM_ALLOCATION_TYPE_PINNED));
  const bool starts = def == by_dev && cur == def;
  CUmemPoolProps props;
  std::memset(&props, 0, sizeof(props));
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location = loc;
  CUmemoryPool mine;
  CHECK(cuMemPoolCreate(&mine, &props));
  CHECK(cuMemSetMemPool(&loc, CU_MEM_ALLOCATION_TYPE_PINNED, mine));
  CHECK(cuMemGetMemPool(&cur, &loc, CU_MEM_ALLOCATION_TYPE_PINNED));
  CHECK(cuDeviceGetMemPool(&cur_dev, dev));
  const bool set = cur == mine && cur_dev == mine;
  CHECK(cuMemSetMemPool(&loc, CU_MEM_ALLOCATION_TYPE_PINNED, def));
  CHECK(cuMemGetMemPool(&cur, &loc, CU_MEM_ALLOCATION_TYPE_PINNED));
  std::printf("loc_pools=%d:%d:%d\n", starts, set, cur == def);
  CUmemLocation bad = loc;
  bad.id = 57;
  std::printf("loc_pool_bad_device=%d\n",
              static_cast<int>(cuMemGetMemPool(&cur, &bad, CU_MEM_ALLOCATION_TYPE_PINNED)));
  std::printf("loc_pool_bad_type=%d\n",
              static_cast<int>(cuMemGetDefaultMemPool(&cur, &loc, CU_MEM_ALLOCATION_TYPE_INVALID)));
  std::printf("loc_pool_set_bad_pool=%d\n",
              static_cast<int>(cuMemSetMemPool(&loc, CU_MEM_ALLOCATION_TYPE_PINNED,
                                               reinterpret_cast<CUmemoryPool>(0x7777))));
  CUmemAccess_flags f = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  CHECK(cuMemPoolGetAccess(&f, mine, &loc));
  CUmemAccessDesc desc;
  std::memset(&desc, 0, sizeof(desc));
  desc.location = loc;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const CUresult set_own = cuMemPoolSetAccess(mine, &desc, 1);
  std::printf("pool_access=%d:%d\n", static_cast<int>(f), static_cast<int>(set_own));
  CUmemAccessDesc bad_desc = desc;
  bad_desc.location.id = 57;
  std::printf("pool_access_bad_device=%d\n", static_cast<int>(cuMemPoolSetAccess(mine, &bad_desc, 1)));
  bad_desc = desc;
  bad_desc.flags = static_cast<CUmemAccess_flags>(2);
  std::printf("pool_access_bad_flags=%d\n", static_cast<int>(cuMemPoolSetAccess(mine, &bad_desc, 1)));
  std::printf("pool_access_bad_pool=%d\n",
              static_cast<int>(cuMemPoolGetAccess(&f, reinterpret_cast<CUmemoryPool>(0x7777), &loc)));
  if (std::getenv("TFUSION_REMOTE") != nullptr) {
    // The worker's host memory is not the tenant's: host locations are refused.
    CUmemLocation host;
    host.type = CU_MEM_LOCATION_TYPE_HOST;
    host.id = 0;
    std::printf("loc_pool_host=%d\n",
                static_cast<int>(cuMemGetMemPool(&cur, &host, CU_MEM_ALLOCATION_TYPE_PINNED)));
    // Nor are managed-memory pools (managed memory itself is).
    std::printf("loc_pool_managed=%d:%d:%d\n",
                static_cast<int>(cuMemGetDefaultMemPool(&cur, &loc, CU_MEM_ALLOCATION_TYPE_MANAGED)),
                static_cast<int>(cuMemGetMemPool(&cur, &loc, CU_MEM_ALLOCATION_TYPE_MANAGED)),
                static_cast<int>(cuMemSetMemPool(&loc, CU_MEM_ALLOCATION_TYPE_MANAGED, def)));
  } else {
    std::printf("loc_pool_host=na\nloc_pool_managed=na\n");
  }
  CHECK(cuMemPoolDestroy(mine));
}

// CU_POINTER_ATTRIBUTE_SYNC_MEMOPS set and read back; atomic capabilities with the host and peers.
void AttributesAndAtomics() {
  CUdeviceptr p;
  CHECK(cuMemAlloc(&p, 256));
  unsigned one = 1;
  int before = 7, after = 7;
  CHECK(cuPointerGetAttribute(&before, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p));
  CHECK(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p + 16));
  CHECK(cuPointerGetAttribute(&after, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p));
  std::printf("sync_memops=%d:%d\n", before, after);
  std::printf("set_attribute_other=%d\n",
              static_cast<int>(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_MAPPED, p)));
  std::printf("set_attribute_outside=%d\n",
              static_cast<int>(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, 0x40)));
  CHECK(cuMemFree(p));
  CUatomicOperation ops[3] = {CU_ATOMIC_OPERATION_INTEGER_ADD, CU_ATOMIC_OPERATION_CAS,
                              CU_ATOMIC_OPERATION_FLOAT_ADD};
  unsigned caps[3] = {0, 0, 0};
  CHECK(cuDeviceGetHostAtomicCapabilities(caps, ops, 3, 0));
  std::printf("host_atomics=%x:%x:%x\n", caps[0], caps[1], caps[2]);
  std::printf("host_atomics_bad_device=%d\n",
              static_cast<int>(cuDeviceGetHostAtomicCapabilities(caps, ops, 3, 57)));
  CUatomicOperation bad_op = CU_ATOMIC_OPERATION_MAX;
  std::printf("host_atomics_bad_op=%d\n",
              static_cast<int>(cuDeviceGetHostAtomicCapabilities(caps, &bad_op, 1, 0)));
  std::printf("host_atomics_none=%d\n", static_cast<int>(cuDeviceGetHostAtomicCapabilities(caps, ops, 0, 0)));
  std::printf("p2p_atomics_self=%d\n",
              static_cast<int>(cuDeviceGetP2PAtomicCapabilities(caps, ops, 3, 0, 0)));
  std::printf("p2p_atomics_bad_device=%d\n",
              static_cast<int>(cuDeviceGetP2PAtomicCapabilities(caps, ops, 3, 0, 57)));
}

// cuMemcpy3DBatchAsync: a 3D box from pageable host memory into device memory with a wider row,
// device to device, and back into host memory tightly packed; bad batches copy nothing.
void Batch3DCopies() {
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  constexpr size_t kW = 48, kH = 5, kD = 3;  // bytes, rows, layers
  std::vector<uint8_t> host(kW * kH * kD), back(kW * kH * kD, 0);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 7 + 3);
  CUdeviceptr a, b;
  CHECK(cuMemAlloc(&a, 64 * 8 * kD));
  CHECK(cuMemAlloc(&b, 64 * 8 * kD));
  CHECK(cuMemsetD8(a, 0, 64 * 8 * kD));
  CHECK(cuMemsetD8(b, 0, 64 * 8 * kD));
  CUDA_MEMCPY3D_BATCH_OP ops[2];
  std::memset(ops, 0, sizeof(ops));
  ops[0].src.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  ops[0].src.op.ptr.ptr = reinterpret_cast<CUdeviceptr>(host.data());
  ops[0].dst.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  ops[0].dst.op.ptr.ptr = a;
  ops[0].dst.op.ptr.rowLength = 64;
  ops[0].dst.op.ptr.layerHeight = 8;
  ops[0].extent = {kW, kH, kD};
  ops[0].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  ops[1] = ops[0];
  ops[1].src.op.ptr = ops[0].dst.op.ptr;
  ops[1].dst.op.ptr.ptr = b;
  CHECK(cuMemcpy3DBatchAsync(2, ops, 0, s));
  CUDA_MEMCPY3D_BATCH_OP out = ops[1];
  out.src.op.ptr = ops[1].dst.op.ptr;
  std::memset(&out.dst, 0, sizeof(out.dst));
  out.dst.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  out.dst.op.ptr.ptr = reinterpret_cast<CUdeviceptr>(back.data());
  CHECK(cuMemcpy3DBatchAsync(1, &out, 0, s));
  CHECK(cuStreamSynchronize(s));
  uint8_t pad = 9;
  CHECK(cuMemcpyDtoH(&pad, b + 64 * 8 + 50, 1));  // beside the box in layer 1: untouched
  std::printf("batch3d=%d:%d\n", back == host ? 1 : 0, pad);
  CUDA_MEMCPY3D_BATCH_OP bad = ops[1];
  bad.extent.depth = 0;
  std::printf("batch3d_zero_extent=%d\n", static_cast<int>(cuMemcpy3DBatchAsync(1, &bad, 0, s)));
  bad = ops[1];
  bad.dst.op.ptr.rowLength = 8;  // shorter than the width
  std::printf("batch3d_short_row=%d\n", static_cast<int>(cuMemcpy3DBatchAsync(1, &bad, 0, s)));
  std::printf("batch3d_flags=%d\n", static_cast<int>(cuMemcpy3DBatchAsync(1, ops, 1, s)));
  std::printf("batch3d_null_stream=%d\n", static_cast<int>(cuMemcpy3DBatchAsync(1, ops, 0, nullptr)));
  bad = ops[1];
  bad.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_INVALID;
  std::printf("batch3d_bad_order=%d\n", static_cast<int>(cuMemcpy3DBatchAsync(1, &bad, 0, s)));
  bad = ops[1];
  bad.src.type = CU_MEMCPY_OPERAND_TYPE_ARRAY;
  bad.src.op.array.array = reinterpret_cast<CUarray>(0x5150);
  std::printf("batch3d_bad_array=%d\n", static_cast<int>(cuMemcpy3DBatchAsync(1, &bad, 0, s)));
  CHECK(cuMemFree(a));
  CHECK(cuMemFree(b));
  CHECK(cuStreamDestroy(s));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "memops") != 0) {
    std::fprintf(stderr, "usage: memops_probe memops\n");
    return 2;
  }
  CUcontext ctx = Setup();
  WaitAndWrite();
  BatchCopies();
  ManagedBatches();
  Peers(ctx);
  Pools();
  CopyAttributes();
  VmmQueries();
  PoolsByLocation();
  AttributesAndAtomics();
  Batch3DCopies();
  std::printf("done=1\n");
  return 0;
}
