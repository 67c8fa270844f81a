// Page-locked host memory, emulated on the client: cuMemAllocHost/cuMemHostAlloc give plain
// page-aligned host memory of this process, cuMemHostRegister only records the range. Copies from
// and to it travel like pageable copies (staged through the transport). The next step is the
// same-address registered arena (docs/protocol.md): host allocations placed in the shared-memory
// arena that the worker maps at the same address and registers with its driver.
//
// Device pointers of mapped host memory (cuMemHostGetDevicePointer) are the host address, as
// under unified addressing; kernels on the worker cannot dereference them (docs/remote.md).
#include <sys/mman.h>
#include <unistd.h>

#include <map>
#include <mutex>

#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

std::mutex g_host_mu;
std::map<uint64_t, HostRange>& HostRanges() {
  static auto* m = new std::map<uint64_t, HostRange>();  // never destroyed
  return *m;
}

// REQUIRES g_host_mu.
std::map<uint64_t, HostRange>::iterator FindLocked(uint64_t p) {
  auto& m = HostRanges();
  auto it = m.upper_bound(p);
  if (it == m.begin()) return m.end();
  --it;
  return p - it->first < it->second.size ? it : m.end();
}

bool OverlapsLocked(uint64_t p, uint64_t n) {
  auto& m = HostRanges();
  auto it = m.lower_bound(p);
  if (it != m.end() && it->first < p + n) return true;
  if (it == m.begin()) return false;
  --it;
  return it->first + it->second.size > p;
}

CUresult AllocHost(void** pp, size_t bytes, unsigned flags) {
  if (pp == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  TF_LOCK(l);
  uint64_t ctx = CurrentContext();
  auto c = l.session()->contexts.find(ctx);
  if (c == l.session()->contexts.end()) return CUDA_ERROR_INVALID_CONTEXT;
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t len = (bytes + page - 1) / page * page;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  HostRange h;
  h.base = H(p);
  h.size = bytes;
  h.flags = flags;
  h.ctx = ctx;
  h.device = c->second;
  std::lock_guard<std::mutex> g(g_host_mu);
  HostRanges()[h.base] = h;
  *pp = p;
  return CUDA_SUCCESS;
}

}  // namespace

bool FindHostRange(uint64_t p, HostRange* out) {
  std::lock_guard<std::mutex> g(g_host_mu);
  auto it = FindLocked(p);
  if (it == HostRanges().end()) return false;
  if (out) *out = it->second;
  return true;
}

CUresult Impl_cuMemAllocHost_v2(void** pp, size_t bytesize) { return AllocHost(pp, bytesize, 0); }
CUresult Impl_cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
  return AllocHost(pp, bytesize, flags);
}

CUresult Impl_cuMemFreeHost(void* p) {
  TF_LOCK(l);
  std::lock_guard<std::mutex> g(g_host_mu);
  auto it = HostRanges().find(H(p));
  if (it == HostRanges().end() || it->second.registered) return CUDA_ERROR_INVALID_VALUE;
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  munmap(p, (it->second.size + page - 1) / page * page);
  HostRanges().erase(it);
  return CUDA_SUCCESS;
}

CUresult Impl_cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int flags) {
  if (p == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                CU_MEMHOSTREGISTER_READ_ONLY)) {
    return CUDA_ERROR_NOT_SUPPORTED;  // IOMEMORY: device memory of another device
  }
  TF_LOCK(l);
  uint64_t ctx = CurrentContext();
  auto c = l.session()->contexts.find(ctx);
  if (c == l.session()->contexts.end()) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard<std::mutex> g(g_host_mu);
  if (OverlapsLocked(H(p), bytesize)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  HostRange h;
  h.base = H(p);
  h.size = bytesize;
  h.flags = flags;
  h.registered = true;
  h.ctx = ctx;
  h.device = c->second;
  HostRanges()[h.base] = h;
  return CUDA_SUCCESS;
}

CUresult Impl_cuMemHostUnregister(void* p) {
  TF_LOCK(l);
  std::lock_guard<std::mutex> g(g_host_mu);
  auto it = HostRanges().find(H(p));
  if (it == HostRanges().end() || !it->second.registered) {
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  }
  HostRanges().erase(it);
  return CUDA_SUCCESS;
}

CUresult Impl_cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int flags) {
  if (pdptr == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  if (!FindHostRange(H(p), nullptr)) return CUDA_ERROR_INVALID_VALUE;
  *pdptr = H(p);
  return CUDA_SUCCESS;
}

CUresult Impl_cuMemHostGetFlags(unsigned int* flags, void* p) {
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  HostRange h;
  if (!FindHostRange(H(p), &h)) return CUDA_ERROR_INVALID_VALUE;
  *flags = h.flags;
  return CUDA_SUCCESS;
}

}  // namespace tf::client
