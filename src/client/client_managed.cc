// Managed memory (cuMemAllocManaged) and the calls about it, answered in the client.
//
// Managed memory is host memory that kernels on the worker reach at the same address: a host
// region over shared memory, a mirror over TCP (client_host.cc AllocManaged). The device reports
// CONCURRENT_MANAGED_ACCESS 0, so a program touches it on the host only after synchronizing,
// which is when the mirror has brought the device's writes back. Nothing migrates: prefetches,
// advice and stream attachment change nothing a program can observe except the range attributes,
// which are kept here per allocation (advising part of an allocation advises all of it) and
// answered as the driver would. Pointers that are not managed memory get the driver's errors.
#include <cstring>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

// A location as the v2 calls name it; the v1 calls use a CUdevice with CU_DEVICE_CPU for the host.
struct Location {
  int type = CU_MEM_LOCATION_TYPE_INVALID;
  int id = 0;
  bool operator<(const Location& o) const { return std::tie(type, id) < std::tie(o.type, o.id); }
  int AsDevice() const {
    if (type == CU_MEM_LOCATION_TYPE_DEVICE) return id;
    if (type == CU_MEM_LOCATION_TYPE_INVALID) return CU_DEVICE_INVALID;
    return CU_DEVICE_CPU;
  }
};

struct Advice {
  bool read_mostly = false;
  Location preferred;
  std::set<Location> accessed_by;
  Location last_prefetch;
};

// Managed allocation base -> its advice. Guarded by State().mu.
std::map<uint64_t, Advice>& AdviceTable() {
  static auto* m = new std::map<uint64_t, Advice>();  // never destroyed
  return *m;
}

// The managed allocation holding [p, p + n) (n > 0) of this session, or false.
bool FindManaged(Session* s, uint64_t p, uint64_t n, HostRange* h) {
  if (n == 0 || !FindHostRange(p, h) || !h->managed || h->owner != s) return false;
  return n <= h->size - (p - h->base);
}

bool ValidDevice(Session* s, int d) { return d >= 0 && static_cast<size_t>(d) < s->devices.size(); }

// A v1 device argument (a device ordinal or CU_DEVICE_CPU) as a location.
bool FromDevice(Session* s, int d, Location* out) {
  if (d == CU_DEVICE_CPU) {
    *out = Location{CU_MEM_LOCATION_TYPE_HOST, 0};
    return true;
  }
  if (!ValidDevice(s, d)) return false;
  *out = Location{CU_MEM_LOCATION_TYPE_DEVICE, d};
  return true;
}

bool FromLocation(Session* s, const CUmemLocation& l, Location* out) {
  switch (l.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (!ValidDevice(s, l.id)) return false;
      *out = Location{l.type, l.id};
      return true;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
      *out = Location{l.type, 0};
      return true;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      if (l.id < 0) return false;
      *out = Location{l.type, l.id};
      return true;
    default:
      return false;
  }
}

bool KnownStream(Session* s, CUstream st) {
  const uint64_t h = H(st);
  return h <= 2 || s->streams.count(h) != 0;
}

CUresult Advise(CUdeviceptr p, size_t count, CUmem_advise advice, bool v2, int device,
                const CUmemLocation& loc) {
  TF_LOCK(l);
  Session* s = l.session();
  HostRange h;
  if (!FindManaged(s, p, count, &h)) return CUDA_ERROR_INVALID_VALUE;
  Location where;
  const bool needs_location = advice != CU_MEM_ADVISE_SET_READ_MOSTLY &&
                              advice != CU_MEM_ADVISE_UNSET_READ_MOSTLY &&
                              advice != CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION;
  if (needs_location && !(v2 ? FromLocation(s, loc, &where) : FromDevice(s, device, &where))) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  Advice& a = AdviceTable()[h.base];
  switch (advice) {
    case CU_MEM_ADVISE_SET_READ_MOSTLY: a.read_mostly = true; break;
    case CU_MEM_ADVISE_UNSET_READ_MOSTLY: a.read_mostly = false; break;
    case CU_MEM_ADVISE_SET_PREFERRED_LOCATION: a.preferred = where; break;
    case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION: a.preferred = Location{}; break;
    case CU_MEM_ADVISE_SET_ACCESSED_BY: a.accessed_by.insert(where); break;
    case CU_MEM_ADVISE_UNSET_ACCESSED_BY: a.accessed_by.erase(where); break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult Prefetch(CUdeviceptr p, size_t count, const Location& to, CUstream st) {
  TF_LOCK(l);
  Session* s = l.session();
  HostRange h;
  if (!FindManaged(s, p, count, &h)) return CUDA_ERROR_INVALID_VALUE;
  if (!KnownStream(s, st)) return CUDA_ERROR_INVALID_HANDLE;
  AdviceTable()[h.base].last_prefetch = to;
  return CUDA_SUCCESS;
}

// One range attribute into data (size bytes), as cuMemRangeGetAttribute answers it.
CUresult RangeAttribute(const Advice& a, void* data, size_t size, CUmem_range_attribute attr) {
  auto put = [&](int v) {
    if (size != sizeof(int)) return CUDA_ERROR_INVALID_VALUE;
    memcpy(data, &v, sizeof(v));
    return CUDA_SUCCESS;
  };
  switch (attr) {
    case CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY: return put(a.read_mostly ? 1 : 0);
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION: return put(a.preferred.AsDevice());
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION: return put(a.last_prefetch.AsDevice());
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE: return put(a.preferred.type);
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID: return put(a.preferred.id);
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE: return put(a.last_prefetch.type);
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID: return put(a.last_prefetch.id);
    case CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY: {
      // Devices (CU_DEVICE_CPU for the host) that have the advice, then CU_DEVICE_INVALID.
      if (size == 0 || size % sizeof(int) != 0) return CUDA_ERROR_INVALID_VALUE;
      const size_t n = size / sizeof(int);
      size_t i = 0;
      auto* out = static_cast<int*>(data);
      for (const Location& loc : a.accessed_by) {
        if (i < n) out[i++] = loc.AsDevice();
      }
      for (; i < n; ++i) out[i] = CU_DEVICE_INVALID;
      return CUDA_SUCCESS;
    }
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // namespace

void ForgetManagedAdvice(uint64_t base) { AdviceTable().erase(base); }

CUresult Impl_cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  uint64_t p = 0;
  CUresult r = AllocManaged(l.session(), bytesize, flags, &p);
  if (r != CUDA_SUCCESS) return r;
  AdviceTable().erase(p);
  *dptr = p;
  return CUDA_SUCCESS;
}

// Answered from the client's allocation table (its own allocations, stream-ordered and graph
// ones, mapped VMM ranges, opened IPC memory) and its managed memory; other pointers (module
// globals) are asked of the worker, which answers only for ranges of its session.
CUresult Impl_cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  TF_LOCK(l);
  Session* s = l.session();
  uint64_t base = 0;
  if (const DeviceAlloc* a = FindDeviceAlloc(s, dptr, &base)) {
    if (pbase) *pbase = base;
    if (psize) *psize = a->size;
    return CUDA_SUCCESS;
  }
  HostRange h;
  if (FindManaged(s, dptr, 1, &h)) {
    if (pbase) *pbase = h.base;
    if (psize) *psize = h.size;
    return CUDA_SUCCESS;
  }
  TF_CTX(l);
  uint8_t buf[8];
  transport::Writer w(buf, sizeof(buf));
  w.U64(dptr);
  ReplyView rv;
  CUresult r = CallSync(s, remote::Op(driver::Fn::cuMemGetAddressRange_v2), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t b = 0, n = 0;
  rv.reader.U64(&b);
  if (!rv.reader.U64(&n)) return CUDA_ERROR_UNKNOWN;
  if (pbase != nullptr) *pbase = b;
  if (psize != nullptr) *psize = n;
  return CUDA_SUCCESS;
}

CUresult Impl_cuMemAdvise(CUdeviceptr p, size_t count, CUmem_advise advice, CUdevice device) {
  return Advise(p, count, advice, false, device, CUmemLocation{});
}

CUresult Impl_cuMemAdvise_v2(CUdeviceptr p, size_t count, CUmem_advise advice,
                             CUmemLocation location) {
  return Advise(p, count, advice, true, 0, location);
}

CUresult Impl_cuMemPrefetchAsync(CUdeviceptr p, size_t count, CUdevice to, CUstream st) {
  Location where;
  {
    TF_LOCK(l);
    if (!FromDevice(l.session(), to, &where)) return CUDA_ERROR_INVALID_DEVICE;
  }
  return Prefetch(p, count, where, st);
}

CUresult Impl_cuMemPrefetchAsync_v2(CUdeviceptr p, size_t count, CUmemLocation location,
                                    unsigned int flags, CUstream st) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Location where;
  {
    TF_LOCK(l);
    if (!FromLocation(l.session(), location, &where)) return CUDA_ERROR_INVALID_DEVICE;
  }
  return Prefetch(p, count, where, st);
}

CUresult Impl_cuStreamAttachMemAsync(CUstream st, CUdeviceptr p, size_t length, unsigned int flags) {
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST && flags != CU_MEM_ATTACH_SINGLE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  TF_LOCK(l);
  Session* s = l.session();
  if (!KnownStream(s, st)) return CUDA_ERROR_INVALID_HANDLE;
  HostRange h;
  // Without concurrent managed access the whole allocation is attached (length 0 or its size).
  if (!FindManaged(s, p, 1, &h) || p != h.base || (length != 0 && length != h.size)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (flags == CU_MEM_ATTACH_SINGLE && H(st) == 0) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

CUresult Impl_cuMemRangeGetAttribute(void* data, size_t size, CUmem_range_attribute attribute,
                                     CUdeviceptr p, size_t count) {
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  HostRange h;
  if (!FindManaged(l.session(), p, count, &h)) return CUDA_ERROR_INVALID_VALUE;
  auto it = AdviceTable().find(h.base);
  return RangeAttribute(it == AdviceTable().end() ? Advice{} : it->second, data, size, attribute);
}

CUresult Impl_cuMemRangeGetAttributes(void** data, size_t* sizes, CUmem_range_attribute* attributes,
                                      size_t n, CUdeviceptr p, size_t count) {
  if (data == nullptr || sizes == nullptr || attributes == nullptr || n == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  TF_LOCK(l);
  HostRange h;
  if (!FindManaged(l.session(), p, count, &h)) return CUDA_ERROR_INVALID_VALUE;
  auto it = AdviceTable().find(h.base);
  const Advice a = it == AdviceTable().end() ? Advice{} : it->second;
  for (size_t i = 0; i < n; ++i) {
    if (data[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = RangeAttribute(a, data[i], sizes[i], attributes[i]); r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}

// ---- batches (CUDA 12.8+): every range is checked first (a bad one fails the call and changes
// nothing), then prefetched as cuMemPrefetchAsync_v2 would be. A discard keeps the data: nothing
// migrates, and after a discard CUDA promises no particular contents.

namespace {

CUresult ManagedBatch(CUdeviceptr* dptrs, size_t* sizes, size_t count, CUmemLocation* locs,
                      size_t* loc_idxs, size_t num_locs, unsigned long long flags, CUstream st,
                      bool prefetch) {
  if (count == 0 || dptrs == nullptr || sizes == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (prefetch && (locs == nullptr || !BatchIndexList(count, loc_idxs, num_locs))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  TF_LOCK(l);
  Session* s = l.session();
  std::vector<Location> where(prefetch ? num_locs : 0);
  for (size_t i = 0; i < where.size(); ++i) {
    if (!FromLocation(s, locs[i], &where[i])) return CUDA_ERROR_INVALID_DEVICE;
  }
  HostRange h;
  for (size_t i = 0; i < count; ++i) {
    if (!FindManaged(s, dptrs[i], sizes[i], &h)) return CUDA_ERROR_INVALID_VALUE;
  }
  if (!KnownStream(s, st)) return CUDA_ERROR_INVALID_HANDLE;
  size_t loc = 0;
  for (size_t i = 0; prefetch && i < count; ++i) {
    if (loc + 1 < num_locs && loc_idxs[loc + 1] == i) ++loc;
    FindManaged(s, dptrs[i], sizes[i], &h);
    AdviceTable()[h.base].last_prefetch = where[loc];
  }
  return CUDA_SUCCESS;
}

}  // namespace

CUresult Impl_cuMemPrefetchBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                      CUmemLocation* locs, size_t* loc_idxs, size_t num_locs,
                                      unsigned long long flags, CUstream st) {
  return ManagedBatch(dptrs, sizes, count, locs, loc_idxs, num_locs, flags, st, true);
}

CUresult Impl_cuMemDiscardBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                     unsigned long long flags, CUstream st) {
  return ManagedBatch(dptrs, sizes, count, nullptr, nullptr, 0, flags, st, false);
}

CUresult Impl_cuMemDiscardAndPrefetchBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                                CUmemLocation* locs, size_t* loc_idxs,
                                                size_t num_locs, unsigned long long flags,
                                                CUstream st) {
  return ManagedBatch(dptrs, sizes, count, locs, loc_idxs, num_locs, flags, st, true);
}

}  // namespace tf::client
