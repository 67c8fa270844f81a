// Driver entry points that cudart calls while it starts, answered in this process (no worker
// call). Kept apart from client_impl.cc; see docs/export-tables.md.
#include <cstdlib>
#include <cstring>

#include "client/client.h"
#include "tf_client_impl.h"

namespace tf::client {

// cudart asks before it registers its fatbins. Lazy (the driver's default, and the answer unless
// the client's CUDA_MODULE_LOADING says EAGER, as the driver reads it): cudart loads a fatbin with
// cuLibraryLoadData only when a kernel of it is first needed, as it does natively. Eager: cudart
// loads every fatbin it registered at start-up; with PyTorch that is about 3,400 images shipped
// to the worker and loaded there, seconds before the first kernel runs.
CUresult Impl_cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) {
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  static const CUmoduleLoadingMode answer = [] {
    const char* v = getenv("CUDA_MODULE_LOADING");
    return v != nullptr && strcmp(v, "EAGER") == 0 ? CU_MODULE_EAGER_LOADING : CU_MODULE_LAZY_LOADING;
  }();
  *mode = answer;
  return CUDA_SUCCESS;
}

}  // namespace tf::client
