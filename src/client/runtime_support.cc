// Driver entry points that cudart calls while it starts, answered in this process (no worker
// call). Kept apart from client_impl.cc; see docs/export-tables.md.
#include "client/client.h"
#include "tf_client_impl.h"

namespace tf::client {

// cudart asks before it registers its fatbins. Eager: every module is loaded when cudart loads it
// (through CUDART_INTERFACE or cuModuleLoadData), the path this stub forwards; CUDA_MODULE_LOADING
// on the client is not consulted.
CUresult Impl_cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) {
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *mode = CU_MODULE_EAGER_LOADING;
  return CUDA_SUCCESS;
}

}  // namespace tf::client
