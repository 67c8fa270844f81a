// Stream-ordered allocation on movable memory: the per-pool books of used, pending and idle
// ranges. See tier_pools.h.
#include "limiter/tier_pools.h"

#include <pthread.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "limiter/export_support.h"
#include "limiter/runtime.h"
#include "limiter/tiering.h"

namespace tf::limiter {
namespace {

// An idle range is reused for a request of at least half its size (best fit).
constexpr uint64_t kReuseFactor = 2;
// Events kept for later frees, beyond which completed ones are destroyed.
constexpr size_t kSpareEvents = 64;

enum class RangeState : uint8_t { kUsed, kPending, kIdle };

struct PoolRange {
  size_t size = 0;      // mapped bytes (what the pool reserves)
  uint64_t charge = 0;  // bytes charged to the vGPU's quota
  RangeState state = RangeState::kUsed;
};

// A cuMemFreeAsync whose stream has not reached the free yet.
struct PendingFree {
  CUdeviceptr base = 0;
  CUevent done = nullptr;
  CUcontext ctx = nullptr;
};

struct PoolBook {
  CUmemoryPool handle = nullptr;
  bool movable = false;  // served here; false: the driver's (exported, imported, host)
  bool live = true;      // false once destroyed: its ranges go back as soon as they are idle
  uint64_t max_size = 0;  // CUmemPoolProps::maxSize; 0: none
  std::map<CUdeviceptr, PoolRange> ranges;
  std::vector<PendingFree> pending;
  std::multimap<size_t, CUdeviceptr> idle;  // by size, for best fit
  uint64_t reserved = 0, used = 0, reserved_high = 0, used_high = 0;
};

struct Books {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;  // everything below
  std::map<uint64_t, PoolBook> books;              // by id: a destroyed pool's handle may come back
  std::map<CUmemoryPool, uint64_t> live;           // live pool handle -> book id
  std::map<CUdeviceptr, uint64_t> owner;           // every range of every book -> book id
  std::vector<std::pair<CUcontext, CUevent>> spare_events;
  uint64_t next_id = 1;
};

Books& B() {
  static Books* b = new Books();  // never destroyed: tenant threads may run during exit
  return *b;
}

void NoteHighs(PoolBook& p) {
  if (p.reserved > p.reserved_high) p.reserved_high = p.reserved;
  if (p.used > p.used_high) p.used_high = p.used;
}

// REQUIRES mu. Gives one idle range back to the driver and its charge to the quota.
void ReleaseIdle(Books& k, PoolBook& p, std::multimap<size_t, CUdeviceptr>::iterator it) {
  const CUdeviceptr base = it->second;
  p.idle.erase(it);
  auto r = p.ranges.find(base);
  CUresult ignored = CUDA_SUCCESS;
  Tiering::Instance().Free(base, &ignored, /*drain=*/false);  // its free event completed
  if (Binding* b = Bound(); b != nullptr && r->second.charge != 0) b->region.Release(b->slot, r->second.charge);
  p.reserved -= r->second.size;
  p.ranges.erase(r);
  k.owner.erase(base);
}

// REQUIRES mu. Releases idle ranges, largest first, while the pool reserves more than `keep`.
void TrimIdle(Books& k, PoolBook& p, uint64_t keep) {
  while (p.reserved > keep && !p.idle.empty()) ReleaseIdle(k, p, std::prev(p.idle.end()));
}

// REQUIRES mu. What the driver's pool does at its synchronization points: idle memory beyond the
// release threshold goes back.
void TrimOverThreshold(Books& k, PoolBook& p) {
  if (p.idle.empty()) return;
  cuuint64_t threshold = 0;
  if (!p.live || g_real.cuMemPoolGetAttribute == nullptr ||
      g_real.cuMemPoolGetAttribute(p.handle, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold) != CUDA_SUCCESS) {
    threshold = 0;
  }
  TrimIdle(k, p, threshold);
}

void RecycleEvent(Books& k, CUcontext ctx, CUevent e) {
  if (k.spare_events.size() < kSpareEvents) {
    k.spare_events.emplace_back(ctx, e);
  } else if (g_real.cuEventDestroy_v2 != nullptr) {
    g_real.cuEventDestroy_v2(e);
  }
}

// REQUIRES mu. Pending frees whose stream reached them become idle (reusable).
void Collect(Books& k, PoolBook& p) {
  for (size_t i = 0; i < p.pending.size();) {
    PendingFree& f = p.pending[i];
    if (g_real.cuEventQuery(f.done) != CUDA_SUCCESS) {  // not reached (or the stream failed)
      ++i;
      continue;
    }
    auto r = p.ranges.find(f.base);
    r->second.state = RangeState::kIdle;
    p.idle.emplace(r->second.size, f.base);
    RecycleEvent(k, f.ctx, f.done);
    p.pending[i] = p.pending.back();
    p.pending.pop_back();
  }
}

// REQUIRES mu. Collects every pool; destroyed pools give their idle ranges back and are forgotten
// when nothing of them is left.
void CollectAll(Books& k) {
  for (auto it = k.books.begin(); it != k.books.end();) {
    PoolBook& p = it->second;
    if (!p.pending.empty()) Collect(k, p);
    if (!p.live) {
      TrimIdle(k, p, 0);
      if (p.ranges.empty()) {
        it = k.books.erase(it);
        continue;
      }
    }
    ++it;
  }
}

// REQUIRES mu. The book of a live pool, made on first sight: a pool we did not see created is
// movable only if it is a device's default pool (else it was imported from another process).
PoolBook& BookOf(Books& k, CUmemoryPool pool) {
  auto it = k.live.find(pool);
  if (it != k.live.end()) return k.books[it->second];
  bool is_default = false;
  int count = 0;
  if (g_real.cuDeviceGetCount != nullptr && g_real.cuDeviceGetDefaultMemPool != nullptr &&
      g_real.cuDeviceGetCount(&count) == CUDA_SUCCESS) {
    for (int d = 0; d < count && !is_default; ++d) {
      CUmemoryPool def = nullptr;
      is_default = g_real.cuDeviceGetDefaultMemPool(&def, d) == CUDA_SUCCESS && def == pool;
    }
  }
  const uint64_t id = k.next_id++;
  PoolBook& p = k.books[id];
  p.handle = pool;
  p.movable = is_default;
  k.live[pool] = id;
  return p;
}

// REQUIRES mu. Records an event of the current context `ctx` on `stream` (a spare one when there
// is one: a spare that no longer records, its context destroyed and its handle reused, is
// replaced by a new event).
CUresult RecordFree(Books& k, CUcontext ctx, CUstream stream, bool per_thread, CUevent* e) {
  auto record = per_thread ? g_real.cuEventRecord_ptsz : g_real.cuEventRecord;
  for (size_t i = k.spare_events.size(); i-- > 0;) {
    if (k.spare_events[i].first != ctx) continue;
    *e = k.spare_events[i].second;
    k.spare_events.erase(k.spare_events.begin() + static_cast<std::ptrdiff_t>(i));
    if (record(*e, stream) == CUDA_SUCCESS) return CUDA_SUCCESS;
    if (g_real.cuEventDestroy_v2 != nullptr) g_real.cuEventDestroy_v2(*e);
    break;
  }
  CUresult r = g_real.cuEventCreate(e, CU_EVENT_DISABLE_TIMING);
  if (r != CUDA_SUCCESS) return r;
  r = record(*e, stream);
  if (r != CUDA_SUCCESS && g_real.cuEventDestroy_v2 != nullptr) g_real.cuEventDestroy_v2(*e);
  return r;
}

class Locked {
 public:
  explicit Locked(Books& k) : k_(k) { pthread_mutex_lock(&k_.mu); }
  ~Locked() { pthread_mutex_unlock(&k_.mu); }
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;

 private:
  Books& k_;
};

bool ReserveQuota(uint64_t bytes) {
  Binding* b = Bound();
  return b == nullptr || b->region.Reserve(b->slot, bytes) == RegionError::kOk;
}

void ReleaseQuota(uint64_t bytes) {
  if (Binding* b = Bound(); b != nullptr && bytes != 0) b->region.Release(b->slot, bytes);
}

// REQUIRES mu. Gives back every pool's idle ranges (they hold VRAM and quota nobody uses).
void TrimAllIdle(Books& k) {
  for (auto& [id, p] : k.books) TrimIdle(k, p, 0);
}

}  // namespace

StreamOrderedPools& StreamOrderedPools::Instance() {
  static StreamOrderedPools pools;
  return pools;
}

bool StreamOrderedPools::Allocate(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream stream,
                                  bool per_thread, CUresult* result, bool* captured) {
  const auto& d = g_real;
  if (dptr == nullptr || bytes == 0 || bytes > (UINT64_MAX >> 2)) return false;  // the driver's answer
  auto is_capturing = per_thread ? d.cuStreamIsCapturing_ptsz : d.cuStreamIsCapturing;
  auto record = per_thread ? d.cuEventRecord_ptsz : d.cuEventRecord;
  if (is_capturing == nullptr || record == nullptr || d.cuEventCreate == nullptr || d.cuEventQuery == nullptr) {
    return false;  // a driver that cannot order our frees keeps its own pools
  }
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult e = is_capturing(stream, &capture);
  if (e != CUDA_SUCCESS) {  // not a stream of the current context, or no context
    *result = e;
    return true;
  }
  if (capture != CU_STREAM_CAPTURE_STATUS_NONE) {  // a graph memory node: the driver's
    if (captured != nullptr) *captured = true;
    return false;
  }
  if (pool == nullptr) {
    CUdevice dev = 0;
    if (d.cuCtxGetDevice(&dev) != CUDA_SUCCESS || d.cuDeviceGetMemPool == nullptr ||
        d.cuDeviceGetMemPool(&pool, dev) != CUDA_SUCCESS) {
      return false;
    }
  }
  Books& k = B();
  const uint64_t need = RoundToGranule(bytes);
  uint64_t id = 0;
  {
    Locked lock(k);
    PoolBook& p = BookOf(k, pool);
    if (!p.movable) return false;
    CollectAll(k);
    auto fit = p.idle.lower_bound(need);
    if (fit != p.idle.end() && fit->first <= need * kReuseFactor) {
      const CUdeviceptr base = fit->second;
      p.idle.erase(fit);
      PoolRange& r = p.ranges[base];
      r.state = RangeState::kUsed;
      p.used += r.size;
      NoteHighs(p);
      TrimOverThreshold(k, p);
      *dptr = base;
      *result = CUDA_SUCCESS;
      return true;
    }
    if (p.max_size != 0 && p.reserved + need > p.max_size) {
      TrimIdle(k, p, need > p.max_size ? 0 : p.max_size - need);
      if (p.reserved + need > p.max_size) {
        *result = CUDA_ERROR_OUT_OF_MEMORY;
        return true;
      }
    }
    id = k.live[pool];
  }
  // A new movable range, outside the books' lock (it may wait for an eviction). Idle ranges of
  // every pool hold quota and VRAM: they go back before the allocation is refused.
  if (!ReserveQuota(need)) {
    {
      Locked lock(k);
      TrimAllIdle(k);
    }
    if (!ReserveQuota(need)) {
      *result = CUDA_ERROR_OUT_OF_MEMORY;
      return true;
    }
  }
  size_t mapped = 0;
  CUdeviceptr base = 0;
  e = Tiering::Instance().Allocate(&base, bytes, &mapped);
  if (e == CUDA_ERROR_OUT_OF_MEMORY) {
    {
      Locked lock(k);
      TrimAllIdle(k);
    }
    e = Tiering::Instance().Allocate(&base, bytes, &mapped);
  }
  if (e != CUDA_SUCCESS) {
    ReleaseQuota(need);
    *result = e;
    return true;
  }
  Locked lock(k);
  auto book = k.books.find(id);
  if (book == k.books.end() || !book->second.live) {  // destroyed meanwhile by another thread
    CUresult ignored = CUDA_SUCCESS;
    Tiering::Instance().Free(base, &ignored, false);
    ReleaseQuota(need);
    *result = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  PoolBook& p = book->second;
  p.ranges[base] = PoolRange{mapped, need, RangeState::kUsed};
  k.owner[base] = id;
  p.reserved += mapped;
  p.used += mapped;
  NoteHighs(p);
  *dptr = base;
  *result = CUDA_SUCCESS;
  return true;
}

bool StreamOrderedPools::FreeAsync(CUdeviceptr dptr, CUstream stream, bool per_thread, CUresult* result) {
  Books& k = B();
  Locked lock(k);
  auto o = k.owner.find(dptr);
  if (o == k.owner.end()) return false;
  PoolBook& p = k.books[o->second];
  PoolRange& r = p.ranges[dptr];
  if (r.state != RangeState::kUsed) {  // freed twice
    *result = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  CUcontext ctx = nullptr;
  CUresult e = g_real.cuCtxGetCurrent(&ctx);
  if (e == CUDA_SUCCESS && ctx == nullptr) e = CUDA_ERROR_INVALID_CONTEXT;
  CUevent done = nullptr;
  if (e == CUDA_SUCCESS) e = RecordFree(k, ctx, stream, per_thread, &done);
  if (e != CUDA_SUCCESS) {  // a bad stream: the memory stays allocated, as with the driver
    *result = e;
    return true;
  }
  r.state = RangeState::kPending;
  p.used -= r.size;
  p.pending.push_back(PendingFree{dptr, done, ctx});
  Collect(k, p);
  TrimOverThreshold(k, p);
  *result = CUDA_SUCCESS;
  return true;
}

bool StreamOrderedPools::FreeNow(CUdeviceptr dptr, CUresult* result) {
  Books& k = B();
  Locked lock(k);
  auto o = k.owner.find(dptr);
  if (o == k.owner.end()) return false;
  PoolBook& p = k.books[o->second];
  auto r = p.ranges.find(dptr);
  if (r->second.state != RangeState::kUsed) {
    *result = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  Tiering::Instance().Free(dptr, result, /*drain=*/true);
  ReleaseQuota(r->second.charge);
  p.used -= r->second.size;
  p.reserved -= r->second.size;
  p.ranges.erase(r);
  k.owner.erase(o);
  return true;
}

bool StreamOrderedPools::TrimTo(CUmemoryPool pool, size_t keep, CUresult* result) {
  Books& k = B();
  Locked lock(k);
  PoolBook& p = BookOf(k, pool);
  if (!p.movable) return false;
  Collect(k, p);
  TrimIdle(k, p, keep);
  *result = g_real.cuMemPoolTrimTo(pool, keep);  // the driver's own (empty) pool; checks the handle
  return true;
}

bool StreamOrderedPools::GetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value, CUresult* result) {
  if (attr != CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT && attr != CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH &&
      attr != CU_MEMPOOL_ATTR_USED_MEM_CURRENT && attr != CU_MEMPOOL_ATTR_USED_MEM_HIGH) {
    return false;  // the driver keeps the settings
  }
  Books& k = B();
  Locked lock(k);
  PoolBook& p = BookOf(k, pool);
  if (!p.movable) return false;
  if (value == nullptr) {
    *result = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  Collect(k, p);
  TrimOverThreshold(k, p);
  cuuint64_t v = attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT ? p.reserved
                 : attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH  ? p.reserved_high
                 : attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT   ? p.used
                                                              : p.used_high;
  *static_cast<cuuint64_t*>(value) = v;
  *result = CUDA_SUCCESS;
  return true;
}

bool StreamOrderedPools::PoolOf(CUdeviceptr ptr, CUmemoryPool* pool) {
  Books& k = B();
  Locked lock(k);
  auto o = k.owner.upper_bound(ptr);
  if (o == k.owner.begin()) return false;
  --o;
  PoolBook& p = k.books[o->second];
  const PoolRange& r = p.ranges[o->first];
  if (ptr - o->first >= r.size || r.state != RangeState::kUsed) return false;
  *pool = p.handle;
  return true;
}

void StreamOrderedPools::Created(CUmemoryPool pool, const CUmemPoolProps* props) {
  Books& k = B();
  Locked lock(k);
  const uint64_t id = k.next_id++;
  PoolBook& p = k.books[id];
  p.handle = pool;
  p.movable = props != nullptr && props->handleTypes == CU_MEM_HANDLE_TYPE_NONE &&
              props->allocType == CU_MEM_ALLOCATION_TYPE_PINNED &&
              props->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
  p.max_size = props != nullptr ? props->maxSize : 0;
  k.live[pool] = id;
}

void StreamOrderedPools::Destroyed(CUmemoryPool pool) {
  Books& k = B();
  Locked lock(k);
  auto it = k.live.find(pool);
  if (it == k.live.end()) return;
  k.books[it->second].live = false;
  k.live.erase(it);
  CollectAll(k);  // what is idle goes now; used and pending ranges when they are freed
}

void StreamOrderedPools::AttributeSet(CUmemoryPool pool, CUmemPool_attribute attr) {
  Books& k = B();
  Locked lock(k);
  auto it = k.live.find(pool);
  if (it == k.live.end()) return;
  PoolBook& p = k.books[it->second];
  if (!p.movable) return;
  // The driver accepts only 0 for the high-water marks: they restart from the current figure.
  if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) p.reserved_high = p.reserved;
  if (attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH) p.used_high = p.used;
  if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) {
    Collect(k, p);
    TrimOverThreshold(k, p);
  }
}

void StreamOrderedPools::ResetAfterFork() {
  Books& k = B();
  pthread_mutex_init(&k.mu, nullptr);
  k.books.clear();
  k.live.clear();
  k.owner.clear();
  k.spare_events.clear();
}

}  // namespace tf::limiter
