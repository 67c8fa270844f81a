// startup_probe: the smallest useful CUDA process (cuInit, primary context, one 1 MiB
// allocation, exit). run_all.sh starts 100 at once, natively and under the limiter, and compares
// the wall time until all have exited. Prints RESULT init_ms (cuInit + context + allocation).
#include "gpu_harness.h"

int main() {
  using namespace tf::gpu;
  const uint64_t start = NowNs();
  DriverSession session;
  if (!session.ok()) {
    Result("error", session.failed_call() + ":" + CuErrorName(session.rc()));
    return 1;
  }
  CUdeviceptr ptr = 0;
  const CUresult rc = cuMemAlloc(&ptr, kMiB);
  if (rc != CUDA_SUCCESS) {
    Result("error", "cuMemAlloc:" + CuErrorName(rc));
    return 1;
  }
  cuMemFree(ptr);
  ResultF("init_ms", static_cast<double>(NowNs() - start) / 1e6);
  return 0;
}
