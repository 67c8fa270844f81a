// Initialisation, the driver version, entry-point lookup and error texts (api/remote_surface.tsv,
// class local): answered in the client, before and after it connects to the worker.
#include <pthread.h>

#include <cstdlib>
#include <cstring>

#include "client/client_internal.h"
#include "driver/procaddress.h"
#include "tf_client_impl.h"

namespace tf::client {

CUresult Impl_cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  ClientState& st = State();
  pthread_mutex_lock(&st.mu);
  CUresult r = CUDA_SUCCESS;
  if (st.session == nullptr) {
    r = ConnectLocked();
    st.init_called = r == CUDA_SUCCESS;
    st.init_result = r;
  }
  pthread_mutex_unlock(&st.mu);
  return r;
}

CUresult Impl_cuDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Answerable before cuInit in CUDA: the version this stub's tables were built for, replaced by
  // the worker's once connected.
  ClientState& st = State();
  pthread_mutex_lock(&st.mu);
  *version = st.session ? st.session->driver_version : CUDA_VERSION;
  pthread_mutex_unlock(&st.mu);
  return CUDA_SUCCESS;
}

namespace {
CUresult Resolve(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                 CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  driver::ProcLookup hit = driver::LookupProcAddress(symbol, cuda_version, flags);
  int id = hit.fn;
  if (id < 0 && !hit.known_base) id = driver::FunctionId(symbol);  // an exact exported name
  if (id >= 0) {
    *pfn = OwnExport(id);
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
  }
  if (status) {
    *status = hit.needs_newer_version ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                      : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  }
  // Under any TFUSION_CLIENT_TRACE: which names a library looked for and did without.
  static const bool trace = [] {
    const char* v = getenv("TFUSION_CLIENT_TRACE");
    return v != nullptr && v[0] != '\0' && strcmp(v, "0") != 0;
  }();
  if (trace) {
    ClientLog("cuGetProcAddress(\"%s\", cudaVersion=%d, flags=%llu): %s -> CUDA_ERROR_NOT_FOUND",
              symbol, cuda_version, static_cast<unsigned long long>(flags),
              hit.needs_newer_version ? "needs a newer CUDA version" : "no such entry point");
  }
  return CUDA_ERROR_NOT_FOUND;
}

struct ErrorEntry {
  const char* name;
  int value;
};
const ErrorEntry kErrors[] = {
#define X(name, value) {#name, value},
#include "tf_client_errors.inc"
#undef X
};

// "CUDA_ERROR_INVALID_VALUE" -> "invalid value" (stable storage, built once per entry).
const char* Describe(size_t i) {
  static char texts[sizeof(kErrors) / sizeof(kErrors[0])][96];
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, [] {
    for (size_t k = 0; k < sizeof(kErrors) / sizeof(kErrors[0]); ++k) {
      const char* n = kErrors[k].name;
      if (strncmp(n, "CUDA_ERROR_", 11) == 0) n += 11;
      else if (strncmp(n, "CUDA_", 5) == 0) n += 5;
      size_t j = 0;
      for (; n[j] && j + 1 < sizeof(texts[k]); ++j) {
        char c = n[j];
        texts[k][j] = c == '_' ? ' ' : (c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c);
      }
      texts[k][j] = '\0';
    }
  });
  return texts[i];
}
}  // namespace

CUresult Impl_cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult* symbolStatus) {
  return Resolve(symbol, pfn, cudaVersion, flags, symbolStatus);
}
CUresult Impl_cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  return Resolve(symbol, pfn, cudaVersion, flags, nullptr);
}

CUresult Impl_cuGetErrorName(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& e : kErrors) {
    if (e.value == static_cast<int>(error)) {
      *pStr = e.name;
      return CUDA_SUCCESS;
    }
  }
  *pStr = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult Impl_cuGetErrorString(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof(kErrors) / sizeof(kErrors[0]); ++i) {
    if (kErrors[i].value == static_cast<int>(error)) {
      *pStr = Describe(i);
      return CUDA_SUCCESS;
    }
  }
  *pStr = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

}  // namespace tf::client
