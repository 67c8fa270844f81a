// The tenant's own VMM handles under VRAM tiering: our handle values, the book of mappings and
// access descriptors, and what a swap needs to move them. See tier_vmm.h.
#include "limiter/tier_vmm.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "limiter/export_support.h"
#include "limiter/guest_log.h"
#include "limiter/in_context.h"
#include "limiter/runtime.h"
#include "limiter/tiering.h"

namespace tf::limiter {
namespace {

// PyTorch asks for GPUDirect RDMA capability on every expandable segment where the device offers
// it, so the flag alone says nothing about a NIC. A registration through a dma-buf export is seen
// (cuMemGetHandleForAddressRange: fixed); one made by nvidia-peermem is not. Nodes whose NICs
// register tenant memory that way set TFUSION_TIER_FIX_RDMA=1 to keep RDMA-capable handles resident.
bool FixRdmaCapable() {
  static const bool fix = [] {
    const char* v = getenv("TFUSION_TIER_FIX_RDMA");
    return v != nullptr && strcmp(v, "1") == 0;
  }();
  return fix;
}

// Our handle values: far above any user-space address, where the driver's handles (addresses of
// its own objects) do not fall; 16 apart.
constexpr uint64_t kFirstValue = 0xF5F5000000000000ull;
constexpr uint64_t kLastValue = 0xF5F5FFFFFFFFFFF0ull;

bool OurValue(uint64_t v) { return v >= kFirstValue && v <= kLastValue; }

// One cuMemSetAccess of the tenant, clipped to one mapping: the flags last set per location.
struct AccessRecord {
  CUdeviceptr at = 0;
  size_t size = 0;
  std::vector<CUmemAccessDesc> descs;
};

struct Mapping {
  size_t size = 0;
  size_t offset = 0;     // into the handle
  uint64_t handle = 0;   // our value
  std::vector<AccessRecord> access;  // in the order the tenant set them
};

struct Handle {
  CUmemGenericAllocationHandle real = 0;  // the driver's; 0 while swapped out
  size_t size = 0;
  CUmemAllocationProp prop{};
  unsigned long long flags = 0;
  CUcontext ctx = nullptr;       // current at its creation: the copies run in it
  int refs = 1;                  // the tenant's: creation or import, retains, less releases
  std::vector<CUdeviceptr> at;   // its mappings
  const char* fixed = nullptr;   // why it cannot move; nullptr: a movable range of Tiering's table
  CUdeviceptr window = 0;        // a temporary mapping of ours for its copies; 0 none
};

// REQUIRES the tier mutex, for everything in it.
struct Book {
  std::map<uint64_t, Handle> handles;       // by our value
  std::map<CUdeviceptr, Mapping> mappings;  // by address
  uint64_t next = kFirstValue;
  std::vector<const char*> logged;          // reasons already logged
};

Book& B() {
  static Book* b = new Book();  // never destroyed: tenant threads may run during exit
  return *b;
}

Handle* Find(uint64_t v) {
  auto it = B().handles.find(v);
  return it == B().handles.end() ? nullptr : &it->second;
}

// Our value for a new handle (held by the book from then on).
uint64_t NewValue(Handle h) {
  Book& b = B();
  uint64_t v = b.next;
  b.next = b.next >= kLastValue ? kFirstValue : b.next + 16;
  b.handles[v] = std::move(h);
  return v;
}

// The mapping containing `p`, or end().
std::map<CUdeviceptr, Mapping>::iterator MappingAt(CUdeviceptr p) {
  auto& m = B().mappings;
  auto it = m.upper_bound(p);
  if (it == m.begin()) return m.end();
  --it;
  return p < it->first + it->second.size ? it : m.end();
}

// Every mapping that intersects [p, p+n), in address order.
template <typename Fn>
void ForEachMappingIn(CUdeviceptr p, size_t n, Fn&& fn) {
  auto& m = B().mappings;
  auto it = MappingAt(p);
  if (it == m.end()) it = m.lower_bound(p);
  for (; it != m.end() && it->first < p + n; ++it) fn(it->first, it->second);
}

bool AnyMappingIn(CUdeviceptr p, size_t n) {
  bool any = false;
  ForEachMappingIn(p, n, [&](CUdeviceptr, Mapping&) { any = true; });
  return any;
}

void DropWindow(Handle* h) {
  if (h->window == 0) return;
  const CUdeviceptr w = h->window;
  const size_t size = h->size;
  InContext(h->ctx, [w, size] {
    g_real.cuMemUnmap(w, size);
    g_real.cuMemAddressFree(w, size);
    return CUDA_SUCCESS;
  });
  h->window = 0;
}

const char* VgpuName() {
  Binding* b = Bound();
  return b != nullptr ? b->vgpu_id : "?";
}

// Logs the first handle of each reason that stays resident.
void LogFixed(const Handle& h, const char* why) {
  for (const char* seen : B().logged) {
    if (seen == why) return;
  }
  B().logged.push_back(why);
  GuestLog("vGPU '%s': %llu MiB of the tenant's own VMM memory stay resident (fixed): %s "
           "(logged once for this reason)", VgpuName(), static_cast<unsigned long long>(h.size >> 20), why);
}

// A handle that can no longer move: its range leaves Tiering's table (it is resident: every caller
// made the process resident first), its kept copy goes.
void Fix(uint64_t v, const char* why) {
  Handle* h = Find(v);
  if (h == nullptr || h->fixed != nullptr) return;
  TierDropTenantRangeLocked(v);
  DropWindow(h);
  h->fixed = why;
  LogFixed(*h, why);
}

// The tenant's last reference and last mapping are gone: so is the handle.
void Forget(uint64_t v) {
  Handle* h = Find(v);
  if (h == nullptr) return;
  if (h->fixed == nullptr) TierDropTenantRangeLocked(v);
  DropWindow(h);
  if (h->real != 0) g_real.cuMemRelease(h->real);
  B().handles.erase(v);
}

// The mappings that start in [p, p+n) are gone (the driver unmapped them).
void ForgetMappings(CUdeviceptr p, size_t n) {
  auto& m = B().mappings;
  std::vector<uint64_t> orphans;
  for (auto it = m.lower_bound(p); it != m.end() && it->first < p + n;) {
    Handle* h = Find(it->second.handle);
    if (h != nullptr) {
      for (size_t i = 0; i < h->at.size(); ++i) {
        if (h->at[i] == it->first) {
          h->at.erase(h->at.begin() + static_cast<long>(i));
          break;
        }
      }
      if (h->refs == 0 && h->at.empty()) orphans.push_back(it->second.handle);
    }
    it = m.erase(it);
  }
  for (uint64_t v : orphans) Forget(v);
}

// Merges one cuMemSetAccess into the record of [at, at+size) of `m`.
void RecordAccess(Mapping* m, CUdeviceptr at, size_t size, const CUmemAccessDesc* desc, size_t count) {
  AccessRecord* rec = nullptr;
  for (AccessRecord& r : m->access) {
    if (r.at == at && r.size == size) rec = &r;
  }
  if (rec == nullptr) {
    m->access.push_back(AccessRecord{at, size, {}});
    rec = &m->access.back();
  }
  for (size_t i = 0; i < count; ++i) {
    bool merged = false;
    for (CUmemAccessDesc& d : rec->descs) {
      if (d.location.type == desc[i].location.type && d.location.id == desc[i].location.id) {
        d.flags = desc[i].flags;
        merged = true;
      }
    }
    if (!merged) rec->descs.push_back(desc[i]);
  }
}

// Whether the tenant gave its handle's own device read-write access to all of mapping `m`.
bool ReadWrite(const Mapping& m, CUdeviceptr base, int device) {
  for (const AccessRecord& r : m.access) {
    if (r.at != base || r.size != m.size) continue;
    for (const CUmemAccessDesc& d : r.descs) {
      if (d.location.type == CU_MEM_LOCATION_TYPE_DEVICE && d.location.id == device &&
          d.flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        return true;
      }
    }
  }
  return false;
}

// REQUIRES the tier mutex. Makes the process resident (a call that changes the GPU's page tables),
// then finds the handle again: the wait may have let other threads change the book.
CUresult Resident(uint64_t v, Handle** h) {
  CUresult e = TierResidentLocked();
  if (e != CUDA_SUCCESS) return e;
  *h = Find(v);
  if (*h == nullptr || (*h)->refs == 0) return CUDA_ERROR_INVALID_VALUE;
  return (*h)->real != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace

TenantVmm& TenantVmm::Instance() {
  static TenantVmm t;
  return t;
}

CUresult TenantVmm::Create(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                           unsigned long long flags, decltype(&cuMemCreate) fn) {
  if (handle == nullptr || prop == nullptr) return fn(handle, size, prop, flags);
  const bool device = prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
  if (device) {  // new VRAM while suspended would take the preemptor's
    TierLock lock;
    CUresult held = TierHeldWaitLocked();
    if (held != CUDA_SUCCESS) return held;
  }
  CUmemGenericAllocationHandle real = 0;
  CUresult e = fn(&real, size, prop, flags);
  if (e == CUDA_ERROR_OUT_OF_MEMORY && device) {
    e = RetryWithEviction(e, [&] { return fn(&real, size, prop, flags); });
  }
  if (e != CUDA_SUCCESS) return e;
  Handle h;
  h.real = real;
  h.size = size;
  h.prop = *prop;
  h.flags = flags;
  CUdevice ctx_device = -1;
  if (g_real.cuCtxGetCurrent(&h.ctx) != CUDA_SUCCESS) h.ctx = nullptr;
  if (h.ctx != nullptr && g_real.cuCtxGetDevice(&ctx_device) != CUDA_SUCCESS) ctx_device = -1;
  if (!device) h.fixed = "host memory";
  else if (flags != 0) h.fixed = "created with flags";
  else if (prop->allocFlags.usage != 0) h.fixed = "created for a tile pool or hardware decompression";
  else if (prop->allocFlags.gpuDirectRDMACapable != 0 && FixRdmaCapable()) {
    h.fixed = "GPUDirect RDMA capable, and TFUSION_TIER_FIX_RDMA=1 (a NIC may hold its pages)";
  }
  else if (h.ctx == nullptr) h.fixed = "created without a current context";
  else if (ctx_device != prop->location.id) h.fixed = "created while another device's context was current";
  TierLock lock;
  const char* fixed = h.fixed;
  const uint64_t v = NewValue(std::move(h));
  if (fixed == nullptr) {
    TierAddTenantRangeLocked(v, size, prop->location.id, Find(v)->ctx);
  } else if (device) {
    LogFixed(*Find(v), fixed);
  }
  *handle = v;
  return CUDA_SUCCESS;
}

bool TenantVmm::Release(CUmemGenericAllocationHandle handle, bool* last, CUresult* result) {
  *last = false;
  if (!OurValue(handle)) return false;
  TierLock lock;
  Handle* h = Find(handle);
  if (h == nullptr || h->refs == 0) {
    *result = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  *last = --h->refs == 0;
  // Still mapped: the memory lives until the last unmap, as with the driver.
  if (*last && h->at.empty()) Forget(handle);
  *result = CUDA_SUCCESS;
  return true;
}

bool TenantVmm::Map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                    unsigned long long flags, decltype(&cuMemMap) fn, CUresult* result) {
  if (!OurValue(handle)) return false;
  TierLock lock;
  Handle* h = nullptr;
  *result = Resident(handle, &h);
  if (*result != CUDA_SUCCESS) return true;
  *result = fn(ptr, size, offset, h->real, flags);
  if (*result == CUDA_SUCCESS) {
    B().mappings[ptr] = Mapping{size, offset, handle, {}};
    h->at.push_back(ptr);
  }
  g_tier_touched.store(1, std::memory_order_relaxed);
  return true;
}

bool TenantVmm::Unmap(CUdeviceptr ptr, size_t size, decltype(&cuMemUnmap) fn, CUresult* result) {
  TierLock lock;
  if (!AnyMappingIn(ptr, size)) return false;
  *result = TierResidentLocked();
  if (*result != CUDA_SUCCESS) return true;
  *result = fn(ptr, size);
  if (*result == CUDA_SUCCESS) ForgetMappings(ptr, size);
  g_tier_touched.store(1, std::memory_order_relaxed);
  return true;
}

bool TenantVmm::SetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count,
                          decltype(&cuMemSetAccess) fn, CUresult* result) {
  TierLock lock;
  if (!AnyMappingIn(ptr, size)) return false;
  *result = TierResidentLocked();
  if (*result != CUDA_SUCCESS) return true;
  *result = fn(ptr, size, desc, count);
  if (*result == CUDA_SUCCESS && desc != nullptr) {
    ForEachMappingIn(ptr, size, [&](CUdeviceptr base, Mapping& m) {
      const CUdeviceptr lo = base > ptr ? base : ptr;
      const CUdeviceptr hi = base + m.size < ptr + size ? base + m.size : ptr + size;
      RecordAccess(&m, lo, hi - lo, desc, count);
    });
  }
  g_tier_touched.store(1, std::memory_order_relaxed);
  return true;
}

bool TenantVmm::GetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr,
                          CUresult* result) {
  if (flags == nullptr || location == nullptr) return false;
  TierLock lock;
  auto it = MappingAt(ptr);
  if (it == B().mappings.end()) return false;
  Handle* h = Find(it->second.handle);
  if (h == nullptr || h->real != 0) return false;  // resident: the driver answers
  unsigned long long f = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  for (const AccessRecord& r : it->second.access) {
    if (ptr < r.at || ptr >= r.at + r.size) continue;
    for (const CUmemAccessDesc& d : r.descs) {
      if (d.location.type == location->type && d.location.id == location->id) f = d.flags;
    }
  }
  *flags = f;
  *result = CUDA_SUCCESS;
  return true;
}

bool TenantVmm::Retain(CUmemGenericAllocationHandle* handle, void* addr, CUresult* result) {
  TierLock lock;
  auto it = MappingAt(reinterpret_cast<CUdeviceptr>(addr));
  if (it == B().mappings.end()) return false;
  Handle* h = Find(it->second.handle);
  if (handle == nullptr || h == nullptr) {
    *result = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  ++h->refs;
  *handle = it->second.handle;
  *result = CUDA_SUCCESS;
  return true;
}

bool TenantVmm::GetProperties(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle,
                              decltype(&cuMemGetAllocationPropertiesFromHandle) fn, CUresult* result) {
  if (!OurValue(handle)) return false;
  TierLock lock;
  Handle* h = Find(handle);
  if (prop == nullptr || h == nullptr || h->refs == 0) {
    *result = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  if (h->real != 0) {
    *result = fn(prop, h->real);
  } else {  // swapped out: what it was created with (it comes back the same)
    *prop = h->prop;
    *result = CUDA_SUCCESS;
  }
  return true;
}

bool TenantVmm::Export(void* shareable, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type,
                       unsigned long long flags, decltype(&cuMemExportToShareableHandle) fn, CUresult* result) {
  if (!OurValue(handle)) return false;
  TierLock lock;
  Handle* h = nullptr;
  *result = Resident(handle, &h);
  if (*result != CUDA_SUCCESS) return true;
  *result = fn(shareable, h->real, type, flags);
  if (*result == CUDA_SUCCESS) Fix(handle, "exported to a shareable handle");
  return true;
}

CUresult TenantVmm::Import(CUmemGenericAllocationHandle* handle, void* os_handle, CUmemAllocationHandleType type,
                           decltype(&cuMemImportFromShareableHandle) fn) {
  if (handle == nullptr) return fn(handle, os_handle, type);
  CUmemGenericAllocationHandle real = 0;
  CUresult e = fn(&real, os_handle, type);
  if (e != CUDA_SUCCESS) return e;
  Handle h;
  h.real = real;
  h.fixed = "imported from another process";  // its owner's memory: not charged here either
  if (g_real.cuMemGetAllocationPropertiesFromHandle != nullptr) {
    g_real.cuMemGetAllocationPropertiesFromHandle(&h.prop, real);
  }
  TierLock lock;
  *handle = NewValue(std::move(h));
  return CUDA_SUCCESS;
}

bool TenantVmm::MulticastBindMem(CUmemGenericAllocationHandle mc, size_t mc_offset,
                                 CUmemGenericAllocationHandle handle, size_t mem_offset, size_t size,
                                 unsigned long long flags, decltype(&cuMulticastBindMem) fn, CUresult* result) {
  if (!OurValue(handle)) return false;
  TierLock lock;
  Handle* h = nullptr;
  *result = Resident(handle, &h);
  if (*result != CUDA_SUCCESS) return true;
  *result = fn(mc, mc_offset, h->real, mem_offset, size, flags);
  if (*result == CUDA_SUCCESS) Fix(handle, "bound to a multicast object");
  return true;
}

namespace {
// REQUIRES the tier mutex. `call` reaches the tenant's mappings in [ptr, ptr+size) by address:
// false when there are none; else the process is made resident, the call made, and on success the
// handles mapped there fixed for `why`.
template <typename Call>
bool FixingByAddress(CUdeviceptr ptr, size_t size, const char* why, Call&& call, CUresult* result) {
  if (!AnyMappingIn(ptr, size)) return false;
  *result = TierResidentLocked();
  if (*result != CUDA_SUCCESS) return true;
  *result = call();
  if (*result == CUDA_SUCCESS) {
    std::vector<uint64_t> handles;
    ForEachMappingIn(ptr, size, [&](CUdeviceptr, Mapping& m) { handles.push_back(m.handle); });
    for (uint64_t v : handles) Fix(v, why);
  }
  return true;
}
}  // namespace

bool TenantVmm::MulticastBindAddr(CUmemGenericAllocationHandle mc, size_t mc_offset, CUdeviceptr ptr, size_t size,
                                  unsigned long long flags, decltype(&cuMulticastBindAddr) fn, CUresult* result) {
  TierLock lock;
  return FixingByAddress(ptr, size, "bound to a multicast object",
                         [&] { return fn(mc, mc_offset, ptr, size, flags); }, result);
}

bool TenantVmm::HandleForAddressRange(void* handle, CUdeviceptr ptr, size_t size, CUmemRangeHandleType type,
                                      unsigned long long flags, decltype(&cuMemGetHandleForAddressRange) fn,
                                      CUresult* result) {
  TierLock lock;
  return FixingByAddress(ptr, size, "exported as a dma-buf",
                         [&] { return fn(handle, ptr, size, type, flags); }, result);
}

bool TenantVmm::AddressFree(CUdeviceptr ptr, size_t size, decltype(&cuMemAddressFree) fn, CUresult* result) {
  TierLock lock;
  if (!AnyMappingIn(ptr, size)) return false;
  // Its mappings must be in place for the driver to judge the call as it would have.
  *result = TierResidentLocked();
  if (*result != CUDA_SUCCESS) return true;
  *result = fn(ptr, size);
  if (*result == CUDA_SUCCESS) ForgetMappings(ptr, size);
  return true;
}

bool TenantVmm::MapArray(CUarrayMapInfo* list, unsigned count, CUstream stream,
                         CUresult (*fn)(CUarrayMapInfo*, unsigned, CUstream), CUresult* result) {
  if (list == nullptr) return false;
  bool ours = false;
  for (unsigned i = 0; i < count; ++i) {
    ours = ours || (list[i].memHandleType == CU_MEM_HANDLE_TYPE_GENERIC && OurValue(list[i].memHandle.memHandle));
  }
  if (!ours) return false;
  TierLock lock;
  *result = TierResidentLocked();
  if (*result != CUDA_SUCCESS) return true;
  std::vector<CUarrayMapInfo> translated(list, list + count);
  std::vector<uint64_t> handles;
  for (CUarrayMapInfo& m : translated) {
    if (m.memHandleType != CU_MEM_HANDLE_TYPE_GENERIC || !OurValue(m.memHandle.memHandle)) continue;
    Handle* h = Find(m.memHandle.memHandle);
    if (h == nullptr || h->real == 0) {
      *result = CUDA_ERROR_INVALID_VALUE;
      return true;
    }
    handles.push_back(m.memHandle.memHandle);
    m.memHandle.memHandle = h->real;
  }
  *result = fn(translated.data(), count, stream);
  if (*result == CUDA_SUCCESS) {
    for (uint64_t v : handles) Fix(v, "mapped into a sparse array");
  }
  return true;
}

CUresult TenantVmm::RestoreLocked(uint64_t key) {
  Handle* h = Find(key);
  if (h == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (h->real != 0) return CUDA_SUCCESS;
  CUmemGenericAllocationHandle real = 0;
  CUresult e = g_real.cuMemCreate(&real, h->size, &h->prop, h->flags);
  if (e != CUDA_SUCCESS) return e;
  auto& mappings = B().mappings;
  size_t mapped = 0;
  for (; mapped < h->at.size() && e == CUDA_SUCCESS; ++mapped) {
    const Mapping& m = mappings[h->at[mapped]];
    e = g_real.cuMemMap(h->at[mapped], m.size, m.offset, real, 0);
    if (e != CUDA_SUCCESS) break;
  }
  for (size_t i = 0; i < h->at.size() && e == CUDA_SUCCESS; ++i) {
    for (const AccessRecord& r : mappings[h->at[i]].access) {
      e = g_real.cuMemSetAccess(r.at, r.size, r.descs.data(), r.descs.size());
      if (e != CUDA_SUCCESS) break;
    }
  }
  if (e != CUDA_SUCCESS) {
    for (size_t i = 0; i < mapped; ++i) g_real.cuMemUnmap(h->at[i], mappings[h->at[i]].size);
    g_real.cuMemRelease(real);
    return e;
  }
  h->real = real;
  return CUDA_SUCCESS;
}

void TenantVmm::ReleasePhysicalLocked(uint64_t key) {
  Handle* h = Find(key);
  if (h == nullptr || h->real == 0) return;
  DropWindow(h);
  for (CUdeviceptr a : h->at) g_real.cuMemUnmap(a, B().mappings[a].size);
  g_real.cuMemRelease(h->real);
  h->real = 0;
}

CUresult TenantVmm::CopyAddressLocked(uint64_t key, CUdeviceptr* at) {
  Handle* h = Find(key);
  if (h == nullptr || h->real == 0) return CUDA_ERROR_INVALID_VALUE;
  if (h->window != 0) {
    *at = h->window;
    return CUDA_SUCCESS;
  }
  for (CUdeviceptr a : h->at) {
    const Mapping& m = B().mappings[a];
    if (m.offset == 0 && m.size == h->size && ReadWrite(m, a, h->prop.location.id)) {
      *at = a;
      return CUDA_SUCCESS;
    }
  }
  // Not mapped whole with read-write access for its device: a mapping of our own for the copies.
  const size_t size = h->size;
  const CUmemGenericAllocationHandle real = h->real;
  const int device = h->prop.location.id;
  CUdeviceptr w = 0;
  CUresult e = InContext(h->ctx, [&] {
    CUresult r = g_real.cuMemAddressReserve(&w, size, 0, 0, 0);
    if (r != CUDA_SUCCESS) return r;
    r = g_real.cuMemMap(w, size, 0, real, 0);
    if (r == CUDA_SUCCESS) {
      CUmemAccessDesc access{};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = device;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      r = g_real.cuMemSetAccess(w, size, &access, 1);
      if (r != CUDA_SUCCESS) g_real.cuMemUnmap(w, size);
    }
    if (r != CUDA_SUCCESS) g_real.cuMemAddressFree(w, size);
    return r;
  });
  if (e != CUDA_SUCCESS) return e;
  h->window = w;
  *at = w;
  return CUDA_SUCCESS;
}

void TenantVmm::DropWindowsLocked() {
  for (auto& [v, h] : B().handles) DropWindow(&h);
}

void TenantVmm::ResetAfterFork() {
  Book& b = B();
  b.handles.clear();
  b.mappings.clear();
}

}  // namespace tf::limiter
