// A driver-API program for the host-region and bulk-copy tests: page-locked memory (cuMemAllocHost,
// cuMemHostAlloc) and copies through it, and large pageable copies. Run directly on tests/fakecuda
// or through the client stub and a worker; it prints "key=value" lines the tests compare.
//
// Modes: pinned [--no-zero-copy] (kernels writing through cuMemHostGetDevicePointer are skipped:
// without host regions or mirrors page-locked memory is client memory the worker cannot reach),
// pageable, odd (copies of odd sizes and offsets), copy-results (a large copy each way, results
// printed: the tests cut the connection), hold (allocates page-locked memory, prints ready=1
// and waits to be killed), bench
// [MiB] [reps] (copy bandwidth; no kernels, so it runs on a real driver too), mapped (zero-copy
// memory written by kernels, copies, host functions and the host, in both directions: mirrors
// over TCP), managed (cuMemAllocManaged and the calls about it), steps KIND MiB N (allocates N
// allocations of MiB each of KIND: managed, pinned (cuMemAllocHost) or mapped (cuMemHostAlloc with
// DEVICEMAP), stopping at the first refusal; then frees one and allocates again, and checks what
// the host, kernels and copies wrote into every allocation; with a fifth argument "memset", memsets
// write instead of kernels, so that it runs on a real driver).
#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "probe_util.h"

namespace {

using tf_probe::Fill;
using tf_probe::Kernel;
using tf_probe::Setup;


using Clock = std::chrono::steady_clock;


void Sleep(CUfunction sleep, unsigned us, CUstream s) {
  void* params[] = {&us};
  CHECK(cuLaunchKernel(sleep, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr));
}

uint32_t Pattern(size_t i, uint32_t seed) { return static_cast<uint32_t>(i * 2654435761u) ^ seed; }

int Pinned(bool zero_copy) {
  Setup();
  CUfunction fill = Kernel("fill_u32");
  CUfunction sleep = Kernel("sleep_us");
  constexpr size_t kBytes = 1 << 20, kWords = kBytes / 4;
  void* in_p = nullptr;
  void* out_p = nullptr;
  CHECK(cuMemHostAlloc(&in_p, kBytes, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  CHECK(cuMemAllocHost(&out_p, kBytes));
  auto* in = static_cast<uint32_t*>(in_p);
  auto* out = static_cast<uint32_t*>(out_p);
  unsigned type = 0, flags = 0;
  size_t range = 0;
  CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                              reinterpret_cast<CUdeviceptr>(in) + 100));
  CHECK(cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                              reinterpret_cast<CUdeviceptr>(in)));
  CHECK(cuMemHostGetFlags(&flags, in));
  std::printf("pinned_type=%u\npinned_range=%zu\npinned_flags=%u\n", type, range, flags);

  if (zero_copy) {
    // A kernel on the device writes page-locked memory through its device pointer; this process
    // sees the words at once after the synchronize.
    CUdeviceptr dptr = 0;
    CHECK(cuMemHostGetDevicePointer(&dptr, in, 0));
    std::printf("dptr_is_host=%d\n", dptr == reinterpret_cast<CUdeviceptr>(in));
    Fill(fill, dptr + 4096, 0xabcu, 16, nullptr);
    CHECK(cuCtxSynchronize());
    std::printf("kernel_wrote_pinned=%x,%x,%x\n", in[1023], in[1024], in[1024 + 15]);
  }

  // Async copies through page-locked memory keep stream order: behind a 100 ms kernel the copies
  // have not run yet when the calls return, and after the synchronize the data is there.
  for (size_t i = 0; i < kWords; ++i) in[i] = Pattern(i, 1);
  memset(out, 0, kBytes);
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, kBytes));
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  Sleep(sleep, 100000, s);
  auto t0 = Clock::now();
  CHECK(cuMemcpyHtoDAsync(d, in, kBytes, s));
  Fill(fill, d, 5, 4, s);
  CHECK(cuMemcpyDtoHAsync(out, d, kBytes, s));
  double call_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  std::printf("async_calls_returned_early=%d\n", call_ms < 50.0);
  std::printf("query_while_busy=%d\n", static_cast<int>(cuStreamQuery(s)));
  std::printf("not_landed_yet=%u\n", out[kWords - 1]);
  CHECK(cuStreamSynchronize(s));
  bool equal = true;
  for (size_t i = 4; i < kWords; ++i) equal = equal && out[i] == Pattern(i, 1);
  std::printf("async_roundtrip=%u,%u,%d\n", out[0], out[3], equal);

  // Synchronous copies, partial ranges inside the regions, and the unified cuMemcpy.
  for (size_t i = 0; i < kWords; ++i) in[i] = Pattern(i, 2);
  CHECK(cuMemcpyHtoD(d, in, kBytes));
  memset(out, 0, kBytes);
  CHECK(cuMemcpyDtoH(out, d, kBytes));
  std::printf("sync_equal=%d\n", memcmp(in, out, kBytes) == 0);
  CHECK(cuMemcpyHtoD(d + 64, in + 1000, 4000));
  CHECK(cuMemcpyDtoH(out + 7, d + 64, 4000));
  std::printf("partial_equal=%d\n", memcmp(out + 7, in + 1000, 4000) == 0);
  CHECK(cuMemcpy(reinterpret_cast<CUdeviceptr>(out), d + 64, 64));
  std::printf("unified_equal=%d\n", memcmp(out, in + 1000, 64) == 0);

  // Sizes from a few bytes to many MiB, as a caching host allocator asks for them.
  bool small_ok = true;
  std::vector<void*> many;
  for (size_t size : {1ul, 3ul, 100ul, 4096ul, 4097ul, 65536ul, 1ul << 20, 48ul << 20}) {
    void* p = nullptr;
    CHECK(cuMemHostAlloc(&p, size, 0));
    memset(p, 0x5a, size);
    CHECK(cuMemcpyHtoD(d, p, size < kBytes ? size : kBytes));
    uint8_t b = 0;
    CHECK(cuMemcpyDtoH(&b, d, 1));
    small_ok = small_ok && b == 0x5a;
    many.push_back(p);
  }
  for (void* p : many) CHECK(cuMemFreeHost(p));
  std::printf("sizes_ok=%d\n", small_ok);

  CHECK(cuMemFreeHost(in));
  std::printf("free_twice=%d\n", static_cast<int>(cuMemFreeHost(in)));
  CHECK(cuMemFreeHost(out));
  CHECK(cuStreamDestroy(s));
  CHECK(cuMemFree(d));
  std::printf("done=1\n");
  return 0;
}

// Large pageable copies: data equality both ways, synchronous and asynchronous, odd sizes.
int Pageable() {
  Setup();
  constexpr size_t kBytes = 256u << 20;
  std::vector<uint64_t> src(kBytes / 8), back(kBytes / 8);
  for (size_t i = 0; i < src.size(); ++i) src[i] = i * 0x9E3779B97F4A7C15ull;
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, kBytes));
  auto t0 = Clock::now();
  CHECK(cuMemcpyHtoD(d, src.data(), kBytes));
  auto t1 = Clock::now();
  CHECK(cuMemcpyDtoH(back.data(), d, kBytes));
  auto t2 = Clock::now();
  std::printf("pageable_sync_equal=%d\n", src == back);
  auto gibps = [](auto a, auto b) {
    return (kBytes / double(1 << 30)) / std::chrono::duration<double>(b - a).count();
  };
  std::fprintf(stderr, "pageable 256 MiB: HtoD %.2f GiB/s, DtoH %.2f GiB/s\n", gibps(t0, t1),
               gibps(t1, t2));
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  for (size_t i = 0; i < src.size(); ++i) src[i] = ~src[i];
  std::fill(back.begin(), back.end(), 0);
  CHECK(cuMemcpyHtoDAsync(d, src.data(), kBytes, s));
  CHECK(cuMemcpyDtoHAsync(back.data(), d, kBytes, s));
  CHECK(cuStreamSynchronize(s));
  std::printf("pageable_async_equal=%d\n", src == back);
  // Odd length and offsets: slices that do not line up with anything.
  const size_t n = kBytes - 12345;
  auto* bytes = reinterpret_cast<uint8_t*>(src.data());
  auto* bytes_back = reinterpret_cast<uint8_t*>(back.data());
  CHECK(cuMemsetD8(d, 0, kBytes));
  CHECK(cuMemcpyHtoD(d + 3, bytes + 7, n));
  std::fill(back.begin(), back.end(), 0);
  CHECK(cuMemcpyDtoH(bytes_back + 5, d + 3, n));
  std::printf("pageable_odd_equal=%d\n", memcmp(bytes_back + 5, bytes + 7, n) == 0);
  CHECK(cuStreamDestroy(s));
  CHECK(cuMemFree(d));
  std::printf("done=1\n");
  return 0;
}

// Copies of odd sizes at odd offsets, around the sizes where copies are cut into slices (4 MiB
// pipelined slices, the transport's bulk limit), from and to pageable and page-locked memory,
// synchronous and asynchronous: every byte must come back. Prints odd_copies=N and
// odd_mismatch=0 (or the first failing copy).
int OddCopies() {
  Setup();
  constexpr size_t kMiB = 1 << 20;
  const size_t sizes[] = {1, 7, 4095, 65537, 4 * kMiB - 1, 4 * kMiB + 1, 12 * kMiB + 5,
                          16 * kMiB - 3, 16 * kMiB + 13, 37 * kMiB + 11};
  const size_t kMax = 37 * kMiB + 11 + 64;
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, kMax));
  std::vector<uint8_t> pageable_src(kMax), pageable_dst(kMax);
  void* pinned_src = nullptr;
  void* pinned_dst = nullptr;
  CHECK(cuMemAllocHost(&pinned_src, kMax));
  CHECK(cuMemAllocHost(&pinned_dst, kMax));
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  int copies = 0;
  uint32_t seed = 1;
  for (int pinned = 0; pinned < 2; ++pinned) {
    auto* src = pinned ? static_cast<uint8_t*>(pinned_src) : pageable_src.data();
    auto* dst = pinned ? static_cast<uint8_t*>(pinned_dst) : pageable_dst.data();
    for (int async = 0; async < 2; ++async) {
      for (size_t n : sizes) {
        const size_t src_off = seed % 61, dev_off = (seed * 7) % 53, dst_off = (seed * 13) % 59;
        for (size_t i = 0; i < n; ++i) src[src_off + i] = static_cast<uint8_t>(Pattern(i, seed) >> 7);
        memset(dst, 0xee, kMax);
        if (async) {
          CHECK(cuMemcpyHtoDAsync(d + dev_off, src + src_off, n, s));
          CHECK(cuMemcpyDtoHAsync(dst + dst_off, d + dev_off, n, s));
          CHECK(cuStreamSynchronize(s));
        } else {
          CHECK(cuMemcpyHtoD(d + dev_off, src + src_off, n));
          CHECK(cuMemcpyDtoH(dst + dst_off, d + dev_off, n));
        }
        const bool body = memcmp(dst + dst_off, src + src_off, n) == 0;
        const bool edges = (dst_off == 0 || dst[dst_off - 1] == 0xee) &&
                           (dst_off + n >= kMax || dst[dst_off + n] == 0xee);
        if (!body || !edges) {
          std::printf("odd_mismatch=%s %s %zu bytes (src+%zu dev+%zu dst+%zu)%s\n",
                      pinned ? "pinned" : "pageable", async ? "async" : "sync", n, src_off, dev_off,
                      dst_off, body ? ": bytes outside the copy changed" : "");
          return 1;
        }
        ++copies;
        seed = seed * 1103515245u + 12345u;
      }
    }
  }
  CHECK(cuStreamDestroy(s));
  CHECK(cuMemFreeHost(pinned_src));
  CHECK(cuMemFreeHost(pinned_dst));
  CHECK(cuMemFree(d));
  std::printf("odd_copies=%d\nodd_mismatch=0\n", copies);
  return 0;
}

// A 256 MiB copy each way with the results printed rather than checked (htod_result=,
// dtoh_result=): the tests cut the connection in the middle of one of them.
int CopyResults() {
  Setup();
  constexpr size_t kBytes = 256u << 20;
  std::vector<uint8_t> buf(kBytes, 3);
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, kBytes));
  std::printf("htod_result=%d\n", static_cast<int>(cuMemcpyHtoD(d, buf.data(), kBytes)));
  std::fflush(stdout);
  std::printf("dtoh_result=%d\n", static_cast<int>(cuMemcpyDtoH(buf.data(), d, kBytes)));
  std::printf("done=1\n");
  return 0;
}

// Warm copy bandwidth (stderr, GiB/s; median of `reps`), pageable and page-locked, both ways.
// Needs no kernels, so it also runs on a real driver: `host_region_probe bench [MiB] [reps]`.
int Bench(size_t mib, int reps) {
  Setup();
  const size_t n = mib << 20;
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, n));
  std::vector<uint8_t> pageable(n, 1);
  void* pinned = nullptr;
  CHECK(cuMemAllocHost(&pinned, n));
  memset(pinned, 2, n);
  auto measure = [&](const char* what, auto copy) {
    copy();  // warm up: first touch of every page
    std::vector<double> gibps;
    for (int i = 0; i < reps; ++i) {
      auto t0 = Clock::now();
      copy();
      gibps.push_back((n / double(1 << 30)) / std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::sort(gibps.begin(), gibps.end());
    std::printf("bench_%s_gibps=%.2f\n", what, gibps[gibps.size() / 2]);
  };
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  measure("pageable_htod", [&] { CHECK(cuMemcpyHtoD(d, pageable.data(), n)); });
  measure("pageable_dtoh", [&] { CHECK(cuMemcpyDtoH(pageable.data(), d, n)); });
  measure("pinned_htod", [&] { CHECK(cuMemcpyHtoD(d, pinned, n)); });
  measure("pinned_dtoh", [&] { CHECK(cuMemcpyDtoH(pinned, d, n)); });
  measure("pinned_htod_async", [&] {
    CHECK(cuMemcpyHtoDAsync(d, pinned, n, s));
    CHECK(cuStreamSynchronize(s));
  });
  measure("pinned_dtoh_async", [&] {
    CHECK(cuMemcpyDtoHAsync(pinned, d, n, s));
    CHECK(cuStreamSynchronize(s));
  });
  CHECK(cuStreamDestroy(s));
  CHECK(cuMemFreeHost(pinned));
  CHECK(cuMemFree(d));
  std::printf("done=1\n");
  return 0;
}

// Entry points the fake driver may not export: looked up at run time ("na" when absent).
template <class F>
F Sym(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

void ReadWordLater(void* arg) {
  // A host function: sees what the stream's kernels wrote into mapped memory before it, and what
  // it writes is seen by the stream's work after it.
  auto* w = static_cast<uint32_t*>(arg);
  w[1] = w[0];
  w[2] = 0x77;
}

int Mapped() {
  Setup();
  CUfunction fill = Kernel("fill_u32");
  int can_map = -1;
  CHECK(cuDeviceGetAttribute(&can_map, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 0));
  std::printf("attr_map_host=%d\n", can_map);
  constexpr size_t kBytes = 1 << 20;
  void* mp = nullptr;
  CHECK(cuMemHostAlloc(&mp, kBytes, CU_MEMHOSTALLOC_DEVICEMAP));
  auto* m = static_cast<uint32_t*>(mp);
  CUdeviceptr dm = 0;
  CHECK(cuMemHostGetDevicePointer(&dm, mp, 0));
  std::printf("mapped_dptr_is_host=%d\n", dm == reinterpret_cast<CUdeviceptr>(mp));
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, kBytes));

  // The host writes, a kernel writes other words (some in the same page), the host sees both.
  for (int i = 0; i < 1000; ++i) m[i] = Pattern(i, 3);
  tf_probe::Fill(fill, dm + 4096, 0xabcu, 16, nullptr);
  m[3000] = 7;
  tf_probe::Fill(fill, dm + 3001 * 4, 9, 1, nullptr);
  CHECK(cuCtxSynchronize());
  bool kept = true;
  for (int i = 0; i < 1000; ++i) kept = kept && m[i] == Pattern(i, 3);
  std::printf("kernel_wrote_mapped=%x,%x,%x\nhost_words_kept=%d\nsame_page=%u,%u\n", m[1023],
              m[1024], m[1039], kept, m[3000], m[3001]);
  // A device-side copy reads what the host wrote, and writes into mapped memory.
  m[2000] = 0x1234;
  m[2001] = 0x5678;
  uint32_t back[2] = {};
  CHECK(cuMemcpyDtoD(d, dm + 8000, 8));
  CHECK(cuMemcpyDtoH(back, d, 8));
  std::printf("copy_saw_host_write=%x,%x\n", back[0], back[1]);
  CHECK(cuMemsetD32(d + 64, 0x42, 4));
  CHECK(cuMemcpyDtoD(dm + 12000, d + 64, 16));
  std::printf("copy_wrote_mapped=%x,%x\n", m[3000], m[3003]);
  // Host functions see the stream's writes before them; their writes reach the work after them.
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  tf_probe::Fill(fill, dm + 16000, 0x99, 1, s);
  CHECK(cuLaunchHostFunc(s, &ReadWordLater, m + 4000));
  CHECK(cuMemcpyDtoDAsync(d + 128, dm + 16008, 4, s));
  CHECK(cuStreamSynchronize(s));
  uint32_t after = 0;
  CHECK(cuMemcpyDtoH(&after, d + 128, 4));
  std::printf("host_func_saw=%x\nafter_host_func=%x\n", m[4001], after);

  // Existing memory registered with DEVICEMAP: its bytes reach the device, kernels write it.
  const size_t reg_bytes = 64 * 1024;
  auto* reg = static_cast<uint32_t*>(aligned_alloc(4096, reg_bytes));
  for (size_t i = 0; i < reg_bytes / 4; ++i) reg[i] = Pattern(i, 4);
  CHECK(cuMemHostRegister(reg, reg_bytes, CU_MEMHOSTREGISTER_DEVICEMAP));
  CUdeviceptr dreg = 0;
  CHECK(cuMemHostGetDevicePointer(&dreg, reg, 0));
  std::vector<uint32_t> seen(reg_bytes / 4);
  CHECK(cuMemcpyDtoD(d, dreg, reg_bytes));
  CHECK(cuMemcpyDtoH(seen.data(), d, reg_bytes));
  bool pushed = true;
  for (size_t i = 0; i < seen.size(); ++i) pushed = pushed && seen[i] == Pattern(i, 4);
  tf_probe::Fill(fill, dreg + 400, 0xcafe, 3, nullptr);
  CHECK(cuCtxSynchronize());
  std::printf("registered_pushed=%d\nregistered_kernel=%x,%x,%d\n", pushed, reg[100], reg[102],
              reg[103] == Pattern(103, 4));
  // Scattered changes both ways (simpleStreams): the host adds to every int (a byte in four
  // changes), the device sees it; a copy writes the ints back with another small addition, the
  // host sees exactly that (masked runs over TCP).
  for (size_t i = 0; i < reg_bytes / 4; ++i) reg[i] += 3;
  CHECK(cuMemcpyDtoD(d, dreg, reg_bytes));
  CHECK(cuMemcpyDtoH(seen.data(), d, reg_bytes));
  bool up = true;
  for (size_t i = 0; i < seen.size(); ++i) up = up && seen[i] == reg[i];
  for (size_t i = 0; i < seen.size(); ++i) seen[i] += 5;
  CHECK(cuMemcpyHtoD(d, seen.data(), reg_bytes));
  CHECK(cuMemcpyDtoD(dreg, d, reg_bytes));
  CHECK(cuCtxSynchronize());
  bool down = true;
  for (size_t i = 0; i < seen.size(); ++i) down = down && reg[i] == seen[i];
  std::printf("scattered_changes=%d,%d\n", up, down);
  std::printf("unregister=%d\n", static_cast<int>(cuMemHostUnregister(reg)));
  free(reg);

  // Plain page-locked memory becomes reachable when its device pointer is asked for.
  void* pp = nullptr;
  CHECK(cuMemAllocHost(&pp, 8192));
  static_cast<uint32_t*>(pp)[10] = 31;
  CUdeviceptr dp = 0;
  std::printf("plain_dptr_rc=%d\n", static_cast<int>(cuMemHostGetDevicePointer(&dp, pp, 0)));
  if (dp != 0) {
    tf_probe::Fill(fill, dp + 4, 5, 2, nullptr);
    CHECK(cuCtxSynchronize());
    auto* w = static_cast<uint32_t*>(pp);
    std::printf("plain_kernel=%u,%u,%u\n", w[1], w[2], w[10]);
  }
  CHECK(cuMemFreeHost(pp));
  CHECK(cuStreamDestroy(s));
  CHECK(cuMemFreeHost(mp));
  CHECK(cuMemFree(d));
  std::printf("done=1\n");
  return 0;
}

int Managed() {
  Setup();
  CUfunction fill = Kernel("fill_u32");
  int managed = -1, concurrent = -1;
  CHECK(cuDeviceGetAttribute(&managed, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 0));
  CHECK(cuDeviceGetAttribute(&concurrent, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0));
  std::printf("attr_managed=%d\nattr_concurrent=%d\n", managed, concurrent);
  CUdeviceptr p = 0;
  std::printf("bad_flags=%d\n", static_cast<int>(cuMemAllocManaged(&p, 4096, 3)));
  std::printf("zero_size=%d\n", static_cast<int>(cuMemAllocManaged(&p, 0, CU_MEM_ATTACH_GLOBAL)));
  constexpr size_t kWords = (1 << 18) + 25;
  CHECK(cuMemAllocManaged(&p, kWords * 4, CU_MEM_ATTACH_GLOBAL));
  auto* w = reinterpret_cast<uint32_t*>(p);
  for (size_t i = 0; i < kWords; ++i) w[i] = static_cast<uint32_t>(i * 3);
  tf_probe::Fill(fill, p + 40, 0xdead, 6, nullptr);  // words 10..15
  CHECK(cuCtxSynchronize());
  uint64_t sum = 0;
  for (size_t i = 0; i < kWords; ++i) sum = sum * 31 + w[i];
  std::printf("managed_words=%u,%x,%x,%u\nmanaged_checksum=%llx\n", w[9], w[10], w[15], w[16],
              static_cast<unsigned long long>(sum));
  uint32_t out[4] = {};
  CHECK(cuMemcpyDtoH(out, p + 64, 16));  // words 16..19, written by the host
  std::printf("managed_dtoh=%u,%u\n", out[0], out[3]);
  CHECK(cuMemsetD32(p + 80, 0x55, 2));  // words 20, 21
  CHECK(cuCtxSynchronize());
  std::printf("managed_memset=%x,%x,%u\n", w[20], w[21], w[22]);
  unsigned type = 0;
  int is_managed = -1;
  void* host = nullptr;
  CUdeviceptr dev = 0;
  size_t range = 0;
  CHECK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p + 8));
  CHECK(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p + 8));
  CHECK(cuPointerGetAttribute(&host, CU_POINTER_ATTRIBUTE_HOST_POINTER, p + 8));
  CHECK(cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, p + 8));
  CHECK(cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 8));
  std::printf("managed_attrs=%u,%d,%d,%d,%zu\n", type, is_managed,
              host == reinterpret_cast<void*>(p + 8), dev == p + 8, range);
  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK(cuMemGetAddressRange(&base, &size, p + 100));
  std::printf("address_range=%d,%zu\n", base == p, size);
  // Advice, prefetches and range attributes (entry points the fake driver lacks: "na").
  using AdviseFn = CUresult (*)(CUdeviceptr, size_t, CUmem_advise, CUmemLocation);
  using PrefetchFn = CUresult (*)(CUdeviceptr, size_t, CUmemLocation, unsigned, CUstream);
  using RangeFn = CUresult (*)(void*, size_t, CUmem_range_attribute, CUdeviceptr, size_t);
  using AttachFn = CUresult (*)(CUstream, CUdeviceptr, size_t, unsigned);
  auto advise = Sym<AdviseFn>("cuMemAdvise_v2");
  auto prefetch = Sym<PrefetchFn>("cuMemPrefetchAsync_v2");
  auto range_attr = Sym<RangeFn>("cuMemRangeGetAttribute");
  auto attach = Sym<AttachFn>("cuStreamAttachMemAsync");
  if (advise && prefetch && range_attr && attach) {
    CUmemLocation dev0{CU_MEM_LOCATION_TYPE_DEVICE, 0};
    CUmemLocation cpu{CU_MEM_LOCATION_TYPE_HOST, 0};
    int v[4] = {-9, -9, -9, -9};
    CHECK(range_attr(&v[0], 4, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, p, 4096));
    CHECK(range_attr(&v[1], 4, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, p, 4096));
    std::printf("advice_before=%d,%d\n", v[0], v[1]);
    CHECK(advise(p, kWords * 4, CU_MEM_ADVISE_SET_READ_MOSTLY, dev0));
    CHECK(advise(p, kWords * 4, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, cpu));
    CHECK(advise(p, kWords * 4, CU_MEM_ADVISE_SET_ACCESSED_BY, dev0));
    CHECK(prefetch(p, kWords * 4, dev0, 0, nullptr));
    CHECK(range_attr(&v[0], 4, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, p, 4096));
    CHECK(range_attr(&v[1], 4, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, p, 4096));
    CHECK(range_attr(&v[2], 4, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, p, 4096));
    int by[3] = {};
    CHECK(range_attr(by, sizeof(by), CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, p, 4096));
    std::printf("advice_after=%d,%d,%d\naccessed_by=%d,%d,%d\n", v[0], v[1], v[2], by[0], by[1],
                by[2]);
    std::printf("advise_device_memory=%d\n",
                static_cast<int>(advise(0x1000, 16, CU_MEM_ADVISE_SET_READ_MOSTLY, dev0)));
    std::printf("attach=%d\n", static_cast<int>(attach(nullptr, p, 0, CU_MEM_ATTACH_HOST)));
    CHECK(cuCtxSynchronize());
  } else {
    std::printf("advice=na\n");
  }
  CHECK(cuMemFree(p));
  std::printf("attr_after_free=%d\n",
              static_cast<int>(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p)));
  std::printf("done=1\n");
  return 0;
}

// Allocates `kind` memory of `mib` MiB each up to `n` times or until a refusal, timing each call;
// every allocation gets host-written words at its start and end, kernel-written words (managed and
// mapped memory) and words copied from device memory. Then, after a refusal, frees the last
// allocation and allocates it again (the memory came back), tries one more (refused again), and
// checks every word that was written.
int Steps(const char* kind, size_t mib, int n, bool kernels) {
  Setup();
  CUfunction fill = kernels ? Kernel("fill_u32") : nullptr;
  auto set = [&](CUdeviceptr p, unsigned v, size_t words) {
    if (fill != nullptr) Fill(fill, p, v, words, nullptr);
    else CHECK(cuMemsetD32(p, v, words));
  };
  const size_t bytes = mib << 20, words = bytes / 4;
  const bool device_access = strcmp(kind, "pinned") != 0;
  auto alloc = [&](uint32_t** out) {
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (!strcmp(kind, "managed")) {
      CUdeviceptr p = 0;
      r = cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL);
      *out = reinterpret_cast<uint32_t*>(p);
    } else {
      void* p = nullptr;
      r = !strcmp(kind, "mapped") ? cuMemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_DEVICEMAP)
                                  : cuMemAllocHost(&p, bytes);
      *out = static_cast<uint32_t*>(p);
    }
    return r;
  };
  auto release = [&](uint32_t* p) {
    return !strcmp(kind, "managed") ? cuMemFree(reinterpret_cast<CUdeviceptr>(p)) : cuMemFreeHost(p);
  };
  CUdeviceptr d = 0;
  CHECK(cuMemAlloc(&d, 64));
  // Writes allocation i's words: the host's at both ends, a kernel's and a copy's near the start.
  auto write = [&](uint32_t* p, uint32_t i) {
    for (size_t k = 0; k < 16; ++k) {
      p[k] = Pattern(k, i);
      p[words - 1 - k] = Pattern(words - 1 - k, i);
    }
    set(d, 0xc0de0000u + i, 16);
    CHECK(cuMemcpyDtoH(p + 32, d, 64));
    if (device_access) {
      CUdeviceptr dp = reinterpret_cast<CUdeviceptr>(p);  // managed: the same pointer
      if (strcmp(kind, "managed") != 0) CHECK(cuMemHostGetDevicePointer(&dp, p, 0));
      set(dp + 64, 0xfeed0000u + i, 16);
    }
  };
  auto check = [&](uint32_t* p, uint32_t i) {
    for (size_t k = 0; k < 16; ++k) {
      if (p[k] != Pattern(k, i) || p[words - 1 - k] != Pattern(words - 1 - k, i)) return false;
      if (p[32 + k] != 0xc0de0000u + i) return false;
      if (device_access && p[16 + k] != 0xfeed0000u + i) return false;
    }
    return true;
  };
  std::vector<uint32_t*> held;
  CUresult refused = CUDA_SUCCESS;
  double max_ms = 0;
  const auto start = Clock::now();
  for (int i = 0; i < n; ++i) {
    uint32_t* p = nullptr;
    const auto t0 = Clock::now();
    CUresult r = alloc(&p);
    max_ms = std::max(max_ms, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    if (r != CUDA_SUCCESS) {
      refused = r;
      break;
    }
    held.push_back(p);
  }
  const double alloc_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  for (size_t i = 0; i < held.size(); ++i) write(held[i], static_cast<uint32_t>(i));
  CHECK(cuCtxSynchronize());
  const double total_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  std::printf("steps_ok=%zu\nsteps_refused=%d\nstep_ms_max=%.0f\nsteps_alloc_ms=%.0f\n"
              "steps_total_ms=%.0f\n", held.size(), static_cast<int>(refused), max_ms, alloc_ms,
              total_ms);
  if (refused != CUDA_SUCCESS && !held.empty()) {
    CHECK(release(held.back()));
    held.pop_back();
    uint32_t* p = nullptr;
    std::printf("again_after_free=%d\n", static_cast<int>(alloc(&p)));
    if (p != nullptr) {
      write(p, static_cast<uint32_t>(held.size()));
      held.push_back(p);
      uint32_t* q = nullptr;
      std::printf("one_more=%d\n", static_cast<int>(alloc(&q)));
      if (q != nullptr) CHECK(release(q));
    }
  }
  // What the session can still do at its limit: a device allocation, a kernel, copies.
  CUdeviceptr e = 0;
  CHECK(cuMemAlloc(&e, 4096));
  set(e, 7, 4);
  uint32_t seven[4] = {};
  CHECK(cuMemcpyDtoH(seven, e, sizeof(seven)));
  CHECK(cuMemFree(e));
  CHECK(cuCtxSynchronize());
  bool ok = seven[3] == 7;
  for (size_t i = 0; i < held.size(); ++i) ok = check(held[i], static_cast<uint32_t>(i)) && ok;
  std::printf("data_ok=%d\n", ok ? 1 : 0);
  for (uint32_t* p : held) CHECK(release(p));
  CHECK(cuMemFree(d));
  std::printf("done=1\n");
  return 0;
}

int Hold() {
  Setup();
  void* p[3];
  for (void*& q : p) CHECK(cuMemHostAlloc(&q, 1 << 20, 0));
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, 1 << 20));
  CHECK(cuMemcpyHtoD(d, p[0], 1 << 20));
  std::printf("ready=1\n");
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
}

}  // namespace

int RegisteredCopies(size_t mib, int reps);  // registered_copy_probe.cc

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* mode = argc > 1 ? argv[1] : "pinned";
  if (!strcmp(mode, "pinned")) return Pinned(!(argc > 2 && !strcmp(argv[2], "--no-zero-copy")));
  if (!strcmp(mode, "pageable")) return Pageable();
  if (!strcmp(mode, "hold")) return Hold();
  if (!strcmp(mode, "mapped")) return Mapped();
  if (!strcmp(mode, "managed")) return Managed();
  if (!strcmp(mode, "odd")) return OddCopies();
  if (!strcmp(mode, "copy-results")) return CopyResults();
  if (!strcmp(mode, "steps") && argc > 4) {
    return Steps(argv[2], strtoul(argv[3], nullptr, 10), atoi(argv[4]),
                 !(argc > 5 && !strcmp(argv[5], "memset")));
  }
  if (!strcmp(mode, "registered")) {
    return RegisteredCopies(argc > 2 ? strtoul(argv[2], nullptr, 10) : 64, argc > 3 ? atoi(argv[3]) : 5);
  }
  if (!strcmp(mode, "bench")) {
    return Bench(argc > 2 ? strtoul(argv[2], nullptr, 10) : 256, argc > 3 ? atoi(argv[3]) : 5);
  }
  std::fprintf(stderr, "unknown mode %s\n", mode);
  return 2;
}
