// What the driver-API probe programs of the remote tests (remote_probe, host_region_probe) share:
// CHECK (a failed call prints "error=CALL:CODE" and exits 3), the primary context of device 0,
// and the fake driver's built-in kernels.
#pragma once

#include <cuda.h>

#include <cstdio>
#include <cstdlib>

namespace tf_probe {

#define CHECK(call)                                                        \
  do {                                                                     \
    CUresult r_ = (call);                                                  \
    if (r_ != CUDA_SUCCESS) {                                              \
      std::printf("error=%s:%d\n", #call, static_cast<int>(r_));           \
      std::fflush(stdout);                                                 \
      std::exit(3);                                                        \
    }                                                                      \
  } while (0)

inline CUcontext Setup() {
  CHECK(cuInit(0));
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  return ctx;
}

inline CUfunction Kernel(const char* name) {
  CUmodule mod;
  CHECK(cuModuleLoadData(&mod, "fakecuda:builtin"));
  CUfunction f;
  CHECK(cuModuleGetFunction(&f, mod, name));
  return f;
}

inline void Fill(CUfunction fill, CUdeviceptr dst, unsigned value, size_t count, CUstream s) {
  void* params[] = {&dst, &value, &count};
  CHECK(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr));
}

}  // namespace tf_probe
