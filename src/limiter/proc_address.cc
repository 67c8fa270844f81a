// cuGetProcAddress and cuGetProcAddress_v2: route every lookup to our own export of the exact
// variant the real driver would return for (name, cudaVersion, flags), so that cudart, cuBLAS
// and Triton, which resolve the driver this way, land on the limiter exactly as direct callers do.
#include <cstring>

#include "driver/procaddress.h"
#include "limiter/export_support.h"
#include "limiter/guest_log.h"

namespace tf::limiter {
namespace {

int ExportIdOfRealPointer(void* p) {
  if (p == nullptr) return -1;
  for (int i = 0; i < driver::kFunctionCount; ++i) {
    if (g_real.by_id[i] == p) return i;
  }
  return -1;
}

CUresult Resolve(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                 CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  const auto& real = Real();
  driver::ProcLookup hit = driver::LookupProcAddress(symbol, cuda_version, flags);
  if (hit.fn >= 0) {
    *pfn = OwnExport(hit.fn);
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
  }
  // Outside the probed table (a newer cudaVersion or a name this build does not know): ask the
  // installed driver, then hand back our export of whatever variant it chose.
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  void* p = nullptr;
  CUresult r = real.cuGetProcAddress_v2 ? real.cuGetProcAddress_v2(symbol, &p, cuda_version, flags, &st)
                                        : CUDA_ERROR_NOT_FOUND;
  if (r == CUDA_SUCCESS && p != nullptr) {
    int id = ExportIdOfRealPointer(p);
    if (id >= 0) {
      *pfn = OwnExport(id);
    } else {
      // An entry point the driver does not export by name: nothing of ours can stand in for it.
      GuestLog("cuGetProcAddress(%s): the driver returned an unexported entry point; passed through",
               symbol);
      *pfn = p;
    }
  } else if (hit.needs_newer_version && r == CUDA_SUCCESS) {
    st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
  }
  if (status) *status = st;
  return r;
}

}  // namespace

CUresult Hook_cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult* symbolStatus) {
  return Resolve(symbol, pfn, cudaVersion, flags, symbolStatus);
}

CUresult Hook_cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  return Resolve(symbol, pfn, cudaVersion, flags, nullptr);
}

}  // namespace tf::limiter
