// The driver seam: one function pointer per entry point of the real libcuda, loaded with dlsym
// from a handle the caller opened. Production code loads the NVIDIA driver; CI loads
// tests/fakecuda. Entry points the loaded driver does not export stay nullptr, and callers turn
// that into CUDA_ERROR_NOT_SUPPORTED.
#pragma once

#include "tf_driver_api.h"

namespace tf::driver {

struct DriverTable {
#define TF_DRIVER_MEMBER(name, params, args) CUresult(*name) params = nullptr;
  TF_DRIVER_TYPED_FUNCTIONS(TF_DRIVER_MEMBER)
#undef TF_DRIVER_MEMBER
  // Every exported entry point by id (Fn), typed or not; nullptr when absent.
  void* by_id[kFunctionCount] = {};

  // Resolves every entry point from handle. Returns how many typed ones were found.
  // Thread safety: call once before publishing the table.
  int Load(void* handle);
};

}  // namespace tf::driver
