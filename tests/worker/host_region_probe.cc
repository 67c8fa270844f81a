// A driver-API program for the host-region and bulk-copy tests: page-locked memory (cuMemAllocHost,
// cuMemHostAlloc) and copies through it, and large pageable copies. Run directly on tests/fakecuda
// or through the client stub and a worker; it prints "key=value" lines the tests compare.
//
// Modes: pinned [--no-zero-copy] (kernels writing through cuMemHostGetDevicePointer are skipped:
// over TCP page-locked memory is client memory the worker cannot reach), pageable, hold (allocates
// page-locked memory, prints ready=1 and waits to be killed), bench [MiB] [reps] (copy bandwidth;
// no kernels, so it runs on a real driver too).
#include <cuda.h>

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

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* mode = argc > 1 ? argv[1] : "pinned";
  if (!strcmp(mode, "pinned")) return Pinned(!(argc > 2 && !strcmp(argv[2], "--no-zero-copy")));
  if (!strcmp(mode, "pageable")) return Pageable();
  if (!strcmp(mode, "hold")) return Hold();
  if (!strcmp(mode, "bench")) {
    return Bench(argc > 2 ? strtoul(argv[2], nullptr, 10) : 256, argc > 3 ? atoi(argv[3]) : 5);
  }
  std::fprintf(stderr, "unknown mode %s\n", mode);
  return 2;
}
