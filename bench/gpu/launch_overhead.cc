// launch_overhead: CPU cost of cuLaunchKernel for an empty kernel on one stream.
//
// Launches --n kernels (default 1,000,000) in batches of --batch; reports the wall time of the
// launch loop divided by the launches (the final synchronize is excluded), and p50/p99 of the
// per-launch time of each batch. --max-seconds ends the loop early (a throttled run), and the
// launches actually made are reported.
#include <cstdio>
#include <vector>

#include "gpu_harness.h"

extern "C" const unsigned char tf_fatbin_tier_kernels[];

namespace tf::gpu {
namespace {

int Run(const Flags& flags) {
  const uint64_t n = static_cast<uint64_t>(flags.Num("n", 1000000));
  const uint64_t batch = static_cast<uint64_t>(flags.Num("batch", 1000));
  const double max_seconds = flags.Num("max-seconds", 60);
  if (!FlagsOk(flags) || batch == 0 || n < batch) return 2;
  DriverSession session;
  if (!session.ok()) {
    Result("error", session.failed_call() + ":" + CuErrorName(session.rc()));
    return 1;
  }
  CUmodule module = nullptr;
  CUfunction empty = nullptr;
  CUstream stream = nullptr;
  if (LoadModule(tf_fatbin_tier_kernels, &module) != CUDA_SUCCESS ||
      cuModuleGetFunction(&empty, module, "tf_empty") != CUDA_SUCCESS ||
      cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    Result("error", "setup");
    return 1;
  }
  auto launch = [&] { return cuLaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, stream, nullptr, nullptr); };
  for (int i = 0; i < 10000; ++i) {
    if (launch() != CUDA_SUCCESS) return 1;
  }
  cuStreamSynchronize(stream);

  std::vector<double> per_launch_ns;
  per_launch_ns.reserve(n / batch);
  const uint64_t stop = NowNs() + static_cast<uint64_t>(max_seconds * 1e9);
  const uint64_t start = NowNs();
  uint64_t launched = 0;
  CUresult rc = CUDA_SUCCESS;
  while (launched < n && rc == CUDA_SUCCESS) {
    const uint64_t t0 = NowNs();
    for (uint64_t i = 0; i < batch && rc == CUDA_SUCCESS; ++i) rc = launch();
    const uint64_t t1 = NowNs();
    launched += batch;
    per_launch_ns.push_back(static_cast<double>(t1 - t0) / static_cast<double>(batch));
    if (t1 > stop) break;
  }
  const uint64_t loop_end = NowNs();
  const CUresult sync = cuStreamSynchronize(stream);
  const uint64_t drained = NowNs();
  Result("launch_error", CuErrorName(rc));
  Result("sync_error", CuErrorName(sync));
  Result("launches", launched);
  Result("batch", batch);
  ResultF("loop_s", static_cast<double>(loop_end - start) / 1e9);
  ResultF("sync_ms", static_cast<double>(drained - loop_end) / 1e6);
  ResultF("mean_ns", static_cast<double>(loop_end - start) / static_cast<double>(launched));
  ResultF("p50_ns", Percentile(per_launch_ns, 0.50));
  ResultF("p99_ns", Percentile(per_launch_ns, 0.99));
  ResultF("launches_per_s", static_cast<double>(launched) * 1e9 / static_cast<double>(drained - start));
  cuStreamDestroy(stream);
  cuModuleUnload(module);
  return rc == CUDA_SUCCESS && sync == CUDA_SUCCESS ? 0 : 1;
}

}  // namespace
}  // namespace tf::gpu

int main(int argc, char** argv) {
  tf::gpu::Flags flags;
  if (!flags.Parse(argc, argv, 1)) return 2;
  return tf::gpu::Run(flags);
}
