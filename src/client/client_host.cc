// Page-locked host memory.
//
// Over a transport that can share host memory (shared memory today) with a worker that accepts
// host regions (kFeatureHostRegions), cuMemAllocHost/cuMemHostAlloc memory is a memfd mapped here
// and offered to the worker, which maps it too (at the same virtual address when it can) and
// registers it with its driver (cuMemHostRegister): a copy between it and device memory sends
// only addresses (kOpHostRegionCopy) and is real DMA on the worker; async copies are
// fire-and-forget in stream order, and data copied to it appears here once the stream has
// reached the copy (after a synchronizing call, as in CUDA). Each allocation is its own memfd,
// sized to the request (page-rounded): nothing is preallocated.
//
// Otherwise (TCP, TFUSION_HOST_REGIONS=0, a worker whose driver cannot register host memory) the
// memory is plain memory of this process and copies from and to it are staged like pageable
// ones. cuMemHostRegister only records the range: existing memory cannot be shared afterwards.
// Where the worker accepts mirrors (client_mirror.cc), memory a kernel may be given is mirrored
// instead: cuMemHostAlloc with DEVICEMAP, cuMemHostRegister with DEVICEMAP, and other page-locked
// memory the first time its device pointer is asked for (not before: every mirror costs each call
// a compare, and PyTorch's pinned allocator never asks). Page-locked memory is then placed in the
// region window, where the worker can almost always map the same address.
//
// Managed memory (cuMemAllocManaged) is a host region mapped at the same address with a device
// pointer equal to it, or a mirror: the device pointer is the host pointer.
//
// Device pointers (cuMemHostGetDevicePointer): for a region mapped at the same address, the
// worker driver's device pointer (the host address under unified addressing); a region the worker
// had to map elsewhere is refused (its address differs between the two processes); plain memory
// gets the host address, which kernels on the worker cannot dereference (docs/remote.md).
#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "client/client_internal.h"
#include "tf_client_impl.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

namespace tf::client {
namespace {

using transport::Writer;

std::mutex g_host_mu;  // guards HostRanges(); taken after State().mu, never before it
std::map<uint64_t, HostRange>& HostRanges() {
  static auto* m = new std::map<uint64_t, HostRange>();  // never destroyed
  return *m;
}

// The span of page-locked memory that lives only in this process (no region, no mirror), grown as
// ranges are recorded and never shrunk: a launch looks up only kernel arguments inside it
// (MirrorKernelPointers). lo >= hi: none.
std::atomic<uint64_t> g_plain_lo{~0ull}, g_plain_hi{0};

// Records a range. REQUIRES g_host_mu.
void StoreLocked(const HostRange& h) {
  HostRanges()[h.base] = h;
  if (h.region_id != 0 || h.mirror || h.size == 0) return;
  if (h.base < g_plain_lo.load(std::memory_order_relaxed)) g_plain_lo.store(h.base, std::memory_order_relaxed);
  if (h.base + h.size > g_plain_hi.load(std::memory_order_relaxed)) {
    g_plain_hi.store(h.base + h.size, std::memory_order_relaxed);
  }
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

uint64_t PageRound(uint64_t n) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

// Regions are placed in a window of the address space that neither this process's allocator nor
// the worker's (whose mappings sit near the top, below the stack) normally reaches, so that the
// worker's MAP_FIXED_NOREPLACE at the same address almost always succeeds. Addresses are not
// reused; the window holds 32 TiB.
constexpr uint64_t kRegionWindowBase = 0x4f0000000000ull;
constexpr uint64_t kRegionWindowEnd = 0x6f0000000000ull;
constexpr uint64_t kRegionAlignment = 2ull << 20;
std::atomic<uint64_t> g_window_next{kRegionWindowBase};

// fd < 0: anonymous private memory (to be mirrored).
void* MapRegion(int fd, uint64_t len) {
  const uint64_t span = (len + kRegionAlignment - 1) / kRegionAlignment * kRegionAlignment;
  const int kind = fd < 0 ? MAP_PRIVATE | MAP_ANONYMOUS : MAP_SHARED;
  for (int attempt = 0; attempt < 16; ++attempt) {
    const uint64_t at = g_window_next.fetch_add(span);
    if (at + span > kRegionWindowEnd) break;
    void* p = mmap(reinterpret_cast<void*>(at), len, PROT_READ | PROT_WRITE,
                   kind | MAP_FIXED_NOREPLACE, fd, 0);
    if (p == MAP_FAILED) {
      if (errno == EEXIST) continue;
      break;
    }
    if (H(p) == at) return p;
    munmap(p, len);  // a kernel without MAP_FIXED_NOREPLACE took the address as a hint
    break;
  }
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, kind, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// Asks s's worker to unmap a host region (nothing may use it any more); the memory stays mapped
// here until it has.
CUresult UnmapRegion(Session* s, uint64_t id) {
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(id);
  return CallSync(s, remote::kOpHostRegionUnmap, w, nullptr);
}

// Mirrors [h->base, + h->size) with s's worker and marks h so. Memory the stub mapped itself
// (everything but cuMemHostRegister's) is private anonymous memory.
CUresult MirrorRange(Session* s, HostRange* h, uint32_t kind) {
  CUresult r = MirrorMap(s, h->base, h->size, kind, !h->registered);
  if (r != CUDA_SUCCESS) return r;
  h->mirror = true;
  h->owner = s;
  h->same_address = true;
  h->device_ptr = h->base;
  return CUDA_SUCCESS;
}

// Allocates `bytes` as a host region shared with the worker. CUDA_ERROR_NOT_SUPPORTED when the
// memory cannot be shared (the caller falls back to plain memory); other errors are the worker's.
CUresult AllocRegion(Session* s, size_t bytes, unsigned flags, HostRange* h, void** pp) {
  const uint64_t len = PageRound(bytes);
  if (len > remote::kMaxHostRegionBytes) return CUDA_ERROR_NOT_SUPPORTED;
  int fd = memfd_create("tfusion-pinned", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_NOT_SUPPORTED;
  if (ftruncate(fd, static_cast<off_t>(len)) != 0) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  void* p = MapRegion(fd, len);
  if (p == nullptr) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const uint64_t id = s->next_region_id++;
  transport::TransportStatus st = s->transport->OfferHostMemory(id, fd);
  close(fd);  // the offer carries its own reference to the file
  if (!st.ok()) {
    munmap(p, len);
    return LoseConnection(s, st);
  }
  uint8_t buf[32];
  Writer w(buf, sizeof(buf));
  w.U64(id);
  w.U64(H(p));
  w.U64(len);
  w.U32(flags);
  ReplyView rv;
  CUresult r = CallSync(s, remote::kOpHostRegionMap, w, &rv);
  uint8_t same = 0;
  uint64_t dptr = 0;
  if (r == CUDA_SUCCESS) {
    rv.reader.U8(&same);
    if (!rv.reader.U64(&dptr)) r = CUDA_ERROR_UNKNOWN;
  }
  if (r != CUDA_SUCCESS) {
    munmap(p, len);
    return r;
  }
  h->region_id = id;
  h->owner = s;
  h->mapped = len;
  h->same_address = same != 0;
  h->device_ptr = dptr;
  *pp = p;
  return CUDA_SUCCESS;
}

// Whether every page of [p, p + n) is private anonymous memory of this process (heap or anonymous
// mmap, not a file and not shared), from /proc/self/maps.
bool PrivateAnonymous(uint64_t p, uint64_t n) {
  FILE* f = fopen("/proc/self/maps", "re");
  if (f == nullptr) return false;
  char line[512];
  uint64_t covered = p;  // [p, covered) seen so far, in order
  bool ok = true;
  while (ok && covered < p + n && fgets(line, sizeof(line), f)) {
    unsigned long long lo = 0, hi = 0, off = 0, inode = 0;
    char perms[8] = {}, dev[16] = {}, path[256] = {};
    const int got = sscanf(line, "%llx-%llx %7s %llx %15s %llu %255s", &lo, &hi, perms, &off, dev,
                           &inode, path);
    if (got < 6 || hi <= covered || lo >= p + n) continue;
    ok = lo <= covered && perms[3] == 'p' && inode == 0 &&
         (got == 6 || strcmp(path, "[heap]") == 0);
    covered = hi;
  }
  fclose(f);
  return ok && covered >= p + n;
}

// Over shared memory, memory registered with DEVICEMAP becomes a host region: its pages are
// replaced, contents kept, by a shared mapping of a memfd at the same address (one mremap, so
// the range is never unmapped), which the worker maps and registers too. Copies with it are then
// DMA on both sides, and nothing needs comparing (a mirror of it cost every call a compare of the
// whole range). Only for page-aligned private anonymous ranges; CUDA_ERROR_NOT_SUPPORTED leaves
// the memory as it was. REQUIRES State().mu with the context prepared.
CUresult ShareRegistered(Session* s, HostRange* h) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (h->base % page != 0 || h->size % page != 0 || h->size > remote::kMaxHostRegionBytes ||
      !PrivateAnonymous(h->base, h->size)) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  int fd = memfd_create("tfusion-registered", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_NOT_SUPPORTED;
  void* tmp = ftruncate(fd, static_cast<off_t>(h->size)) == 0
                  ? mmap(nullptr, h->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
  if (tmp == MAP_FAILED) {
    close(fd);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  void* at = reinterpret_cast<void*>(h->base);
  memcpy(tmp, at, h->size);
  if (mremap(tmp, h->size, h->size, MREMAP_MAYMOVE | MREMAP_FIXED, at) != at) {
    munmap(tmp, h->size);
    close(fd);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  const uint64_t id = s->next_region_id++;
  transport::TransportStatus st = s->transport->OfferHostMemory(id, fd);
  close(fd);
  if (!st.ok()) return LoseConnection(s, st);
  uint8_t buf[32];
  Writer w(buf, sizeof(buf));
  w.U64(id);
  w.U64(h->base);
  w.U64(h->size);
  w.U32(h->flags & (CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
  ReplyView rv;
  CUresult r = CallSync(s, remote::kOpHostRegionMap, w, &rv);
  uint8_t same = 0;
  uint64_t dptr = 0;
  if (r == CUDA_SUCCESS) {
    rv.reader.U8(&same);
    if (!rv.reader.U64(&dptr)) r = CUDA_ERROR_UNKNOWN;
  }
  if (r != CUDA_SUCCESS) return r;  // the memory stays shared here, with its contents: harmless
  h->region_id = id;
  h->owner = s;
  h->mapped = h->size;
  h->same_address = same != 0;
  h->device_ptr = dptr;
  return CUDA_SUCCESS;
}

// Gives a shared registered range its private anonymous pages back, contents kept.
void UnshareRegistered(const HostRange& h) {
  void* tmp = mmap(nullptr, h.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (tmp == MAP_FAILED) return;  // stays shared with nobody: still the program's bytes
  void* at = reinterpret_cast<void*>(h.base);
  memcpy(tmp, at, h.size);
  if (mremap(tmp, h.size, h.size, MREMAP_MAYMOVE | MREMAP_FIXED, at) != at) munmap(tmp, h.size);
}

// A new host range of the calling thread's context (false: the thread has none).
bool StartHostRange(Session* s, uint64_t bytes, unsigned flags, HostRange* h) {
  const uint64_t ctx = CurrentContext();
  auto c = s->contexts.find(ctx);
  if (c == s->contexts.end()) return false;
  h->size = bytes;
  h->flags = flags;
  h->ctx = ctx;
  h->device = c->second;
  return true;
}

CUresult AllocHost(void** pp, size_t bytes, unsigned flags) {
  if (pp == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  TF_LOCK(l);
  Session* s = l.session();
  HostRange h;
  if (!StartHostRange(s, bytes, flags, &h)) return CUDA_ERROR_INVALID_CONTEXT;
  void* p = nullptr;
  CUresult r = CUDA_ERROR_NOT_SUPPORTED;
  if (s->host_regions || s->mirrors) {
    TF_CTX(l);  // the worker registers the region or mirror in the caller's context
  }
  if (s->host_regions) {
    r = AllocRegion(s, bytes, flags, &h, &p);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_SUPPORTED) return r;
  }
  if (r == CUDA_ERROR_NOT_SUPPORTED) {
    h.mapped = PageRound(bytes);
    if (s->mirrors) {
      p = MapRegion(-1, h.mapped);  // where the worker can mirror it later
      if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    } else {
      p = mmap(nullptr, h.mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    }
    h.base = H(p);
    if (s->mirrors && (flags & CU_MEMHOSTALLOC_DEVICEMAP)) {
      r = MirrorRange(s, &h, remote::kMirrorMapped);
      if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_SUPPORTED) {
        munmap(p, h.mapped);
        return r;
      }
    }
  }
  h.base = H(p);
  std::lock_guard<std::mutex> g(g_host_mu);
  StoreLocked(h);
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

bool InHostRegion(Session* s, uint64_t p, uint64_t n) {
  HostRange h;
  return n > 0 && FindHostRange(p, &h) && h.region_id != 0 && h.owner == s &&
         n <= h.size - (p - h.base);
}

bool InMirroredHostRange(Session* s, uint64_t p, uint64_t n) {
  HostRange h;
  return n > 0 && FindHostRange(p, &h) && h.mirror && h.owner == s && n <= h.size - (p - h.base);
}

CUresult HostRegionCopy(Session* s, uint8_t direction, uint64_t dptr, uint64_t host, uint64_t n,
                        uint64_t stream, bool async) {
  uint8_t buf[40];
  Writer w(buf, sizeof(buf));
  w.U8(direction);
  w.U8(async ? 0 : 1);
  w.U64(dptr);
  w.U64(host);
  w.U64(n);
  w.U64(stream);
  return async ? SendAsync(s, remote::kOpHostRegionCopy, w)
               : CallSync(s, remote::kOpHostRegionCopy, w, nullptr);
}

CUresult Impl_cuMemAllocHost_v2(void** pp, size_t bytesize) { return AllocHost(pp, bytesize, 0); }
CUresult Impl_cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
  return AllocHost(pp, bytesize, flags);
}

CUresult Impl_cuMemFreeHost(void* p) {
  TF_LOCK(l);
  HostRange h;
  {
    std::lock_guard<std::mutex> g(g_host_mu);
    auto it = HostRanges().find(H(p));
    if (it == HostRanges().end() || it->second.registered) return CUDA_ERROR_INVALID_VALUE;
    h = it->second;
  }
  if (h.managed) return CUDA_ERROR_INVALID_VALUE;  // cuMemFree frees managed memory
  if (h.region_id != 0 && h.owner == l.session()) {
    // The worker unregisters and unmaps first; the memory stays mapped here until it has.
    if (CUresult r = UnmapRegion(l.session(), h.region_id); r != CUDA_SUCCESS) return r;
  }
  if (h.mirror && h.owner == l.session()) {
    if (CUresult r = MirrorUnmap(l.session(), h.base); r != CUDA_SUCCESS) return r;
  }
  {
    std::lock_guard<std::mutex> g(g_host_mu);
    HostRanges().erase(H(p));
  }
  munmap(p, h.mapped);
  return CUDA_SUCCESS;
}

CUresult Impl_cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int flags) {
  if (p == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                CU_MEMHOSTREGISTER_READ_ONLY)) {
    return CUDA_ERROR_NOT_SUPPORTED;  // IOMEMORY: device memory of another device
  }
  TF_LOCK(l);
  Session* s = l.session();
  uint64_t ctx = CurrentContext();
  auto c = s->contexts.find(ctx);
  if (c == s->contexts.end()) return CUDA_ERROR_INVALID_CONTEXT;
  {
    std::lock_guard<std::mutex> g(g_host_mu);
    if (OverlapsLocked(H(p), bytesize)) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  HostRange h;
  h.base = H(p);
  h.size = bytesize;
  h.flags = flags;
  h.registered = true;
  h.ctx = ctx;
  h.device = c->second;
  CUresult shared = CUDA_ERROR_NOT_SUPPORTED;
  if (s->host_regions && (flags & CU_MEMHOSTREGISTER_DEVICEMAP)) {
    TF_CTX(l);
    shared = ShareRegistered(s, &h);
    if (shared != CUDA_SUCCESS && shared != CUDA_ERROR_NOT_SUPPORTED) return shared;
  }
  if (shared != CUDA_SUCCESS && s->mirrors && (flags & CU_MEMHOSTREGISTER_DEVICEMAP)) {
    // The worker maps the range at the same address; the bytes already here go with the next
    // call (both twins start zeroed). Memory it cannot map stays recorded only.
    TF_CTX(l);
    CUresult r = MirrorRange(s, &h, remote::kMirrorMapped);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_SUPPORTED) return r;
  }
  std::lock_guard<std::mutex> g(g_host_mu);  // State().mu held throughout: nothing overlapped since
  StoreLocked(h);
  return CUDA_SUCCESS;
}

CUresult Impl_cuMemHostUnregister(void* p) {
  TF_LOCK(l);
  HostRange h;
  {
    std::lock_guard<std::mutex> g(g_host_mu);
    auto it = HostRanges().find(H(p));
    if (it == HostRanges().end() || !it->second.registered) {
      return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    }
    h = it->second;
  }
  if (h.mirror && h.owner == l.session()) {
    if (CUresult r = MirrorUnmap(l.session(), h.base); r != CUDA_SUCCESS) return r;
  }
  if (h.region_id != 0) {
    // The worker lets go first (after its context finished with it), then the pages become
    // private again. A region of a session since lost is only unshared here.
    if (h.owner == l.session()) {
      if (CUresult r = UnmapRegion(l.session(), h.region_id); r != CUDA_SUCCESS) return r;
    }
    UnshareRegistered(h);
  }
  std::lock_guard<std::mutex> g(g_host_mu);
  HostRanges().erase(H(p));
  return CUDA_SUCCESS;
}

namespace {

// Mirrors plain page-locked memory of this process with s's worker from now on (h is updated).
// REQUIRES State().mu with the context prepared.
CUresult MirrorForDeviceUse(Session* s, HostRange* h) {
  CUresult r = MirrorRange(s, h, remote::kMirrorMapped);
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> g(g_host_mu);
  StoreLocked(*h);
  return CUDA_SUCCESS;
}

}  // namespace

void MirrorIfUsedAsDevice(Session* s, uint64_t p) {
  if (!s->mirrors || FindDeviceAlloc(s, p) != nullptr) return;
  HostRange h;
  if (!FindHostRange(p, &h) || h.region_id != 0 || h.mirror) return;
  if (MirrorForDeviceUse(s, &h) != CUDA_SUCCESS) return;  // the worker refuses the call as before
}

void MirrorKernelPointers(Session* s, const FunctionInfo& fi, void** params) {
  if (!s->mirrors || params == nullptr || !fi.layout_known) return;
  const uint64_t lo = g_plain_lo.load(std::memory_order_relaxed);
  const uint64_t hi = g_plain_hi.load(std::memory_order_relaxed);
  if (lo >= hi) return;
  for (size_t i = 0; i < fi.sizes.size(); ++i) {
    if (fi.sizes[i] != sizeof(uint64_t) || params[i] == nullptr) continue;
    uint64_t v = 0;
    memcpy(&v, params[i], sizeof(v));
    if (v >= lo && v < hi) MirrorIfUsedAsDevice(s, v);
  }
}

CUresult Impl_cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int flags) {
  if (pdptr == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  Session* s = l.session();
  HostRange h;
  if (!FindHostRange(H(p), &h)) return CUDA_ERROR_INVALID_VALUE;
  if (h.region_id == 0 && !h.mirror && s->mirrors) {
    // Mirrored from now on (the first time a kernel may be given this memory).
    TF_CTX(l);
    if (CUresult r = MirrorForDeviceUse(s, &h); r != CUDA_SUCCESS) return r;
  }
  if (h.mirror && h.owner == s) {
    *pdptr = H(p);
    return CUDA_SUCCESS;
  }
  if (h.region_id == 0 || h.owner != s) {
    // Plain memory of this process (TCP, registered memory, a region of another connection):
    // no kernel on the worker can reach it, and the device reports CAN_MAP_HOST_MEMORY 0.
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
      ClientLog("cuMemHostGetDevicePointer: this page-locked memory lives only in this process "
                "(no shared-memory connection to the worker, or registered with "
                "cuMemHostRegister), so kernels cannot use it (CUDA_ERROR_NOT_SUPPORTED); copies "
                "to and from it still work");
    }
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (!h.same_address) {
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
      ClientLog("cuMemHostGetDevicePointer: the worker could not map this page-locked memory at "
                "the same address, so kernels cannot use it (zero-copy access refused: "
                "CUDA_ERROR_NOT_SUPPORTED); copies to and from it still work");
    }
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (h.device_ptr == 0) return CUDA_ERROR_INVALID_VALUE;
  *pdptr = h.device_ptr + (H(p) - h.base);
  return CUDA_SUCCESS;
}

CUresult AllocManaged(Session* s, size_t bytes, unsigned flags, uint64_t* out) {
  HostRange h;
  if (!StartHostRange(s, bytes, flags, &h)) return CUDA_ERROR_INVALID_CONTEXT;
  h.managed = true;
  void* p = nullptr;
  CUresult r = CUDA_ERROR_NOT_SUPPORTED;
  if (s->host_regions) {
    r = AllocRegion(s, bytes,
                    CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                        (s->managed_regions ? remote::kRegionManaged : 0),
                    &h, &p);
    if (r == CUDA_SUCCESS && (!h.same_address || h.device_ptr != H(p))) {
      // Kernels would see it at another address than the program: not managed memory.
      (void)UnmapRegion(s, h.region_id);
      munmap(p, h.mapped);
      r = CUDA_ERROR_NOT_SUPPORTED;
    }
  } else if (s->mirrors) {
    h.mapped = PageRound(bytes);
    p = MapRegion(-1, h.mapped);
    if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    h.base = H(p);
    r = MirrorRange(s, &h, remote::kMirrorManaged);
    if (r != CUDA_SUCCESS) munmap(p, h.mapped);
  }
  if (r != CUDA_SUCCESS) {
    if (r == CUDA_ERROR_NOT_SUPPORTED) {
      static std::atomic<bool> logged{false};
      if (!logged.exchange(true)) {
        ClientLog("cuMemAllocManaged: the worker cannot map host memory at this process's "
                  "addresses on this connection, so there is no managed memory "
                  "(CUDA_ERROR_NOT_SUPPORTED)");
      }
    }
    return r;
  }
  h.base = H(p);
  std::lock_guard<std::mutex> g(g_host_mu);
  StoreLocked(h);
  *out = h.base;
  return CUDA_SUCCESS;
}

CUresult FreeManaged(Session* s, uint64_t p) {
  HostRange h;
  {
    std::lock_guard<std::mutex> g(g_host_mu);
    auto it = HostRanges().find(p);
    if (it == HostRanges().end() || !it->second.managed) return CUDA_ERROR_INVALID_VALUE;
    h = it->second;
  }
  if (h.owner == s) {
    CUresult r = h.mirror ? MirrorUnmap(s, h.base) : UnmapRegion(s, h.region_id);
    if (r != CUDA_SUCCESS) return r;
  }
  {
    std::lock_guard<std::mutex> g(g_host_mu);
    HostRanges().erase(p);
  }
  munmap(reinterpret_cast<void*>(p), h.mapped);
  return CUDA_SUCCESS;
}

std::vector<HostRange> HostMemoryFreedByReset(Session* s, uint64_t ctx) {
  std::vector<HostRange> freed;
  std::lock_guard<std::mutex> g(g_host_mu);
  for (const auto& [base, h] : HostRanges()) {
    if (h.registered) continue;
    if (h.owner == s || (h.region_id == 0 && !h.mirror && h.ctx == ctx)) freed.push_back(h);
  }
  return freed;
}

void HostMemoryAfterReset(Session* s, const std::vector<HostRange>& freed) {
  ForgetMirrors(s);
  std::lock_guard<std::mutex> g(g_host_mu);
  for (const HostRange& h : freed) {
    HostRanges().erase(h.base);
    if (h.managed) ForgetManagedAdvice(h.base);
    munmap(reinterpret_cast<void*>(h.base), h.mapped);
  }
  for (auto& [base, h] : HostRanges()) {
    if (!h.mirror || h.owner != s) continue;
    h.mirror = false;  // registered memory: the program's again, as before it was mirrored
    h.owner = nullptr;
    h.same_address = false;
    h.device_ptr = 0;
    StoreLocked(h);  // within the span MirrorKernelPointers looks at
  }
}

CUresult Impl_cuMemHostGetFlags(unsigned int* flags, void* p) {
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  HostRange h;
  if (!FindHostRange(H(p), &h)) return CUDA_ERROR_INVALID_VALUE;
  if (h.managed) return CUDA_ERROR_INVALID_VALUE;
  *flags = h.flags;
  return CUDA_SUCCESS;
}

}  // namespace tf::client
