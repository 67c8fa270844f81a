// host_region_probe mode "registered MiB REPS": copies between device memory and memory the
// program registered with cuMemHostRegister(DEVICEMAP), as NVIDIA's simpleStreams does with 64 MiB
// (the memory is mirrored remotely). Checks every byte each way and prints the median time of
// each kind of copy in milliseconds.
#include <cuda.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "probe_util.h"

int RegisteredCopies(size_t mib, int reps) {
  using Clock = std::chrono::steady_clock;
  tf_probe::Setup();
  const size_t n = mib << 20;
  void* mem = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 2;
  auto* host = static_cast<uint8_t*>(mem);
  CHECK(cuMemHostRegister(host, n, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
  CUdeviceptr dev;
  CHECK(cuMemAlloc(&dev, n));
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  std::vector<double> up, down, down_async;
  int intact = 0;
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < n; i += 4096) host[i] = static_cast<uint8_t>(i / 4096 + r);
    host[n - 1] = static_cast<uint8_t>(r + 7);
    auto t0 = Clock::now();
    CHECK(cuMemcpyHtoD(dev, host, n));
    up.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    std::memset(host, 0, n);
    t0 = Clock::now();
    CHECK(cuMemcpyDtoH(host, dev, n));
    down.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    bool ok = host[n - 1] == static_cast<uint8_t>(r + 7);
    for (size_t i = 0; i < n; i += 4096) ok = ok && host[i] == static_cast<uint8_t>(i / 4096 + r);
    std::memset(host, 0, n);
    t0 = Clock::now();
    CHECK(cuMemcpyDtoHAsync(host, dev, n, s));
    CHECK(cuStreamSynchronize(s));
    down_async.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    ok = ok && host[n - 1] == static_cast<uint8_t>(r + 7);
    for (size_t i = 0; i < n; i += 4096) ok = ok && host[i] == static_cast<uint8_t>(i / 4096 + r);
    intact += ok;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("intact=%d\n", intact);
  // What a call costs with the memory registered: unchanged, then one byte per page changed.
  std::vector<double> idle, touched;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    CHECK(cuCtxSynchronize());
    idle.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    for (size_t i = 0; i < n; i += 4096) host[i] = static_cast<uint8_t>(host[i] + 1);
    t0 = Clock::now();
    CHECK(cuCtxSynchronize());
    touched.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::printf("call_ms=%.2f\ncall_after_writes_ms=%.2f\n", median(idle), median(touched));
  std::printf("htod_ms=%.2f\ndtoh_ms=%.2f\ndtoh_async_ms=%.2f\n", median(up), median(down),
              median(down_async));
  // An async copy into the memory lands there once the copy ran, without any further call
  // (natively: DMA into pinned memory). Remotely only where the memory is shared with the worker.
  std::memset(host, 0, n);
  CHECK(cuMemcpyHtoD(dev, host + 1, 1));  // device byte 0 := 0
  const uint8_t mark = 0x5c;
  CHECK(cuMemcpyHtoD(dev + 8, &mark, 1));
  CHECK(cuMemcpyDtoHAsync(host, dev, 16, s));
  bool seen = false;
  for (int i = 0; i < 200 && !seen; ++i) {
    seen = reinterpret_cast<volatile uint8_t*>(host)[8] == mark;
    if (!seen) usleep(5000);
  }
  std::printf("visible_without_call=%d\n", seen);
  CHECK(cuStreamSynchronize(s));
  host[n / 2] = 0x77;
  CHECK(cuMemHostUnregister(host));
  // The program's memory, contents and all, after unregistering; and writable.
  host[n / 2 + 1] = 0x78;
  std::printf("after_unregister=%x,%x,%x\n", host[8], host[n / 2], host[n / 2 + 1]);
  munmap(mem, n);
  return 0;
}
