// remote_rtt_copy: the two numbers a remote transport's cost shows in, measured through whatever
// libcuda.so.1 the loader gives it (the client stub, the fake driver, a real driver):
//   - round trip: cuStreamQuery on an idle stream (a synchronous call with nothing to wait for),
//     --trips timed calls after 200 untimed ones; p50 and p99 in microseconds;
//   - bandwidth: one synchronous cuMemcpyHtoD and one cuMemcpyDtoH of --mib MiB (default 1024)
//     from pageable memory, after a 64 MiB warm-up copy each way; GB/s = 10^9 bytes/s. --repeat
//     copies each way, the best one counted.
// Output: "RESULT key=value" lines. Exit 1 on a CUDA error, 2 on a bad command line.
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

#define CHECK(call)                                                              \
  do {                                                                           \
    CUresult r_ = (call);                                                        \
    if (r_ != CUDA_SUCCESS) {                                                    \
      std::fprintf(stderr, "%s failed: %d\n", #call, static_cast<int>(r_));      \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  long trips = 5000, mib = 1024, repeat = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    long v = std::strtol(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--trips")) trips = v;
    else if (!std::strcmp(argv[i], "--mib")) mib = v;
    else if (!std::strcmp(argv[i], "--repeat")) repeat = v;
    else v = -1;
    if (v <= 0) {
      std::fprintf(stderr, "usage: remote_rtt_copy [--trips N] [--mib M] [--repeat R]\n");
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr, "usage: remote_rtt_copy [--trips N] [--mib M] [--repeat R]\n");
    return 2;
  }
  CHECK(cuInit(0));
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  for (int i = 0; i < 200; ++i) CHECK(cuStreamQuery(s));
  std::vector<double> us(static_cast<size_t>(trips));
  for (auto& t : us) {
    auto a = std::chrono::steady_clock::now();
    CHECK(cuStreamQuery(s));
    t = Seconds(a, std::chrono::steady_clock::now()) * 1e6;
  }
  std::sort(us.begin(), us.end());
  std::printf("RESULT rtt_p50_us=%.1f\nRESULT rtt_p99_us=%.1f\n", us[us.size() / 2],
              us[us.size() * 99 / 100]);

  const size_t bytes = static_cast<size_t>(mib) << 20;
  std::vector<unsigned char> host(bytes);
  for (size_t i = 0; i < bytes; i += 4096) host[i] = static_cast<unsigned char>(i >> 12);
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, bytes));
  const size_t warm = std::min<size_t>(bytes, 64u << 20);
  CHECK(cuMemcpyHtoD(d, host.data(), warm));
  CHECK(cuMemcpyDtoH(host.data(), d, warm));
  double best_htod = 1e30, best_dtoh = 1e30;
  for (long r = 0; r < repeat; ++r) {
    auto a = std::chrono::steady_clock::now();
    CHECK(cuMemcpyHtoD(d, host.data(), bytes));
    auto b = std::chrono::steady_clock::now();
    CHECK(cuMemcpyDtoH(host.data(), d, bytes));
    auto c = std::chrono::steady_clock::now();
    best_htod = std::min(best_htod, Seconds(a, b));
    best_dtoh = std::min(best_dtoh, Seconds(b, c));
  }
  bool intact = true;
  for (size_t i = 0; i < bytes; i += 4096) intact &= host[i] == static_cast<unsigned char>(i >> 12);
  std::printf("RESULT copy_mib=%ld\nRESULT htod_gbps=%.2f\nRESULT dtoh_gbps=%.2f\nRESULT copy_intact=%d\n",
              mib, bytes / best_htod / 1e9, bytes / best_dtoh / 1e9, intact ? 1 : 0);
  CHECK(cuMemFree(d));
  CHECK(cuStreamDestroy(s));
  CHECK(cuDevicePrimaryCtxRelease(dev));
  return intact ? 0 : 1;
}
