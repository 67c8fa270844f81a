// VRAM tiering in the tenant process: movable ranges, swap-out to pinned host memory, swap-in on
// the first call that needs the GPU, and the tier thread that acts on freeze/thaw requests and
// the idle timeout. See tiering.h.
#include "limiter/tiering.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "limiter/allocation_table.h"
#include "limiter/cond_deadline.h"
#include "limiter/core/process_identity.h"
#include "limiter/export_support.h"
#include "limiter/guest_log.h"
#include "limiter/in_context.h"
#include "limiter/movable_ipc.h"
#include "limiter/runtime.h"
#include "limiter/tier_pools.h"
#include "limiter/tier_vmm.h"

namespace tf::limiter {

bool g_tiering = false;
std::atomic<int64_t> g_tier_inflight{0};
std::atomic<uint32_t> g_tier_blocked{0};
std::atomic<uint32_t> g_tier_touched{0};
std::atomic<int32_t> g_tier_captures{0};
std::atomic<int64_t> g_zero_inflight{0};

namespace {

constexpr size_t kCopyPiece = 64ull << 20;   // one async copy
constexpr int kCopyStreams = 4;              // copies in flight
constexpr int64_t kTickNs = 10'000'000;      // tier thread period
constexpr int64_t kQuiesceTimeoutNs = 30'000'000'000;
// Host copies are anonymous memory with transparent huge pages, populated and pinned
// (cuMemHostRegister) kHostChunk at a time by worker threads while the copies of the pieces
// already pinned run: pinning fresh memory is bound by the kernel zeroing pages, which scales
// with threads, while registering populated memory is fast.
constexpr size_t kHostChunk = 256ull << 20;
// Pressure eviction: how long to wait for one tenant to swap out (a first swap-out of tens of GiB
// populates fresh host memory: seconds), and for one allocation in all.
constexpr int64_t kEvictWaitNs = 30'000'000'000;
constexpr int64_t kEvictDeadlineNs = 60'000'000'000;
// A tenant of the same QoS that made a GPU call this recently is serving: the requester waits for
// it to go idle instead of freezing it mid-burst (a lower QoS is frozen at once).
constexpr int64_t kBusyNs = 500'000'000;
constexpr int64_t kBudgetWaitNs = 5'000'000'000;
constexpr int64_t kGraphReadNs = 1'000'000'000;  // resident: how often graph memory is read
constexpr int kMaxHostWorkers = 8;
// Scale to zero: how long parking waits for the calls inside the driver to return, and how long a
// call of a parked or checkpointed process waits for a restorer before it fails (by default;
// TFUSION_TIER_ZERO_TIMEOUT=SECONDS in the tenant's environment, 1 to 3600, changes it).
constexpr int64_t kParkQuietNs = 2'000'000'000;
constexpr int64_t kZeroWaitNs = 60'000'000'000;
int64_t ZeroWaitNs() {
  static const int64_t ns = [] {
    const char* v = getenv("TFUSION_TIER_ZERO_TIMEOUT");
    long long sec = v != nullptr ? atoll(v) : 0;
    return sec >= 1 && sec <= 3600 ? static_cast<int64_t>(sec) * 1'000'000'000 : kZeroWaitNs;
  }();
  return ns;
}

struct Range {
  size_t size = 0;                        // reserved and mapped bytes (granularity multiple)
  CUmemGenericAllocationHandle handle = 0;  // 0 while swapped
  int device = 0;
  CUcontext ctx = nullptr;
  void* host = nullptr;                   // the swapped copy, nullptr while resident
  std::vector<uint8_t> registered;        // per kHostChunk piece of `host`: pinned with the driver
  bool budgeted = false;                  // `host` is counted in the host tier's budget
  // Resident with a kept copy: the pinned host memory of its last swap (stale contents, counted
  // in the budget) reused by its next swap-out, which then only copies.
  void* kept = nullptr;
  std::vector<uint8_t> kept_registered;
  int fd = -1;                            // disk tier: an unnamed file holding the copy
  uint32_t crc = 0;                       // CRC-32C of the copy on disk
  bool resident = true;
  int64_t seen_ns = 0;                    // pinning ahead: when the tier thread first saw it
  // A handle the tenant created itself (TenantVmm), keyed by our handle value: its physical memory,
  // mappings and copy address are TenantVmm's.
  bool tenant = false;
};

struct State {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;   // everything below
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;     // tier thread stop
  Binding* binding = nullptr;
  std::map<CUdeviceptr, Range> ranges;
  // cuMemAlloc ranges exported with cuIpcGetMemHandle: another process may map their physical
  // memory, so they stay resident until freed (charged, not movable: counted as fixed).
  std::map<CUdeviceptr, Range> exported;
  uint32_t state = kTierResident;
  uint64_t movable = 0;
  uint64_t host = 0;
  bool thread_started = false;
  bool stop = false;
  pthread_t thread{};
  int64_t last_active_ns = 0;
  uint32_t freeze_done = 0;
  uint32_t thaw_done = 0;
  // Host copies no longer needed after a swap-in: freed by the tier thread, off the tenant's path
  // (unpinning takes about as long as copying). Their budget is returned when freed.
  std::vector<Range> to_free;
  uint64_t disk = 0;                      // bytes of copies on the disk tier
  uint64_t kept = 0;                      // bytes of kept copies (Range::kept)
  // Host budget reserved for copies being made now (pinning ahead, a swap-out's copy): counted
  // with `kept` in the slot's host_kept_bytes, so that a process killed meanwhile gives it back
  // when its slot is reaped.
  uint64_t pinning = 0;
  uint32_t reclaim_seen = 0;              // TierHeader::reclaim_gen acted on
  int64_t disk_attempt_ns = 0;            // the last move to the disk tier tried
  int64_t prepared_for_ns = -1;           // the idle period (its last_active_ns) already prepared
  int64_t hold_retry_ns = 0;              // preemption hold: when a failed swap-out is tried again
  int64_t held_since_ns = 0;              // preemption hold: when a call first waited on it; 0 = none
  int64_t pin_ahead_next_ns = 0;          // pinning ahead: the next look at the ranges
  // Graph memory (the driver's graph memory pool of each device our ranges' contexts use), as last
  // read from the driver: reserved (held on the GPU, counted as fixed) and used by live graph
  // allocations. Until a first reading the limiter's charges for graph allocations stand in.
  bool graph_read = false;
  uint64_t graph_reserved = 0;
  uint64_t graph_used = 0;
  int64_t graph_next_ns = 0;              // the tier thread's next reading while resident
};

// The disk tier's directory (TFUSION_TIER_DIR), empty when there is none.
char g_tier_dir[256] = {};

State& S() {
  static State* s = new State();  // never destroyed: tenant threads may run during exit
  return *s;
}

bool IsSwapped(uint32_t state) { return state == kTierSwapped || state == kTierOnDisk; }

int64_t Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

ProcessTier* MyTier(State& s) {
  Binding* b = s.binding != nullptr ? Bound() : nullptr;
  return b != nullptr ? b->region.TierOfProcess(b->slot) : nullptr;
}

// REQUIRES s.mu. What stays on the GPU when the movable ranges leave: the charged VRAM that
// cannot move, where graph memory counts as what the driver holds for it (its reserve can exceed
// the charges of live graph nodes, or be trimmed below them) once it has been read.
uint64_t FixedBytes(State& s) {
  AllocationTable& table = AllocationTable::Instance();
  const uint64_t graph_charged = table.Bytes(AllocKind::kGraphNode) + table.Bytes(AllocKind::kGraphPtr);
  const uint64_t charged = s.binding->region.ProcessBytes(s.binding->slot);
  const uint64_t other = charged > s.movable + graph_charged ? charged - s.movable - graph_charged : 0;
  return other + (s.graph_read ? s.graph_reserved : graph_charged);
}

// REQUIRES s.mu. The slot's kept bytes: kept copies and the reservation of copies being made.
void PublishKept(State& s) { s.binding->region.SetHostKept(s.binding->slot, s.kept + s.pinning); }

// REQUIRES s.mu. Mirrors the process-local state into its region slot.
void Publish(State& s) {
  ProcessTier* t = MyTier(s);
  if (t == nullptr) return;
  t->state.store(s.state, std::memory_order_relaxed);
  t->movable_bytes.store(s.movable, std::memory_order_relaxed);
  t->host_bytes.store(s.host, std::memory_order_relaxed);
  t->fixed_bytes.store(FixedBytes(s), std::memory_order_relaxed);
  t->last_active_ns.store(s.last_active_ns, std::memory_order_relaxed);
}

size_t Granularity(int device) {
  static std::atomic<size_t> cached{0};
  size_t g = cached.load(std::memory_order_relaxed);
  if (g != 0) return g;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  if (g_real.cuMemGetAllocationGranularity == nullptr ||
      g_real.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
      g == 0) {
    g = 2ull << 20;
  }
  cached.store(g, std::memory_order_relaxed);
  return g;
}

// Movable ranges' chunks are created exportable to a file descriptor, so that legacy IPC can hand
// them to another process (movable_ipc.h). A driver that refuses the handle type gets plain chunks
// from then on (said once; an export then fails with the driver's error).
std::atomic<bool> g_plain_chunks{false};

// Physical memory for `r` at its address, readable and writable by its device. REQUIRES s.mu
// for a tenant's handle.
CUresult MapPhysical(CUdeviceptr base, Range* r) {
  if (r->tenant) {
    CUresult e = TenantVmm::Instance().RestoreLocked(base);
    if (e == CUDA_SUCCESS) r->resident = true;
    return e;
  }
  const auto& d = g_real;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = r->device;
  CUmemGenericAllocationHandle h = 0;
  const bool exportable = !g_plain_chunks.load(std::memory_order_relaxed);
  prop.requestedHandleTypes = exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  CUresult e = d.cuMemCreate(&h, r->size, &prop, 0);
  if (exportable && (e == CUDA_ERROR_NOT_SUPPORTED || e == CUDA_ERROR_INVALID_VALUE)) {
    if (!g_plain_chunks.exchange(true)) {
      GuestLog("the driver creates no exportable device memory (%d): legacy IPC of movable memory is off",
               static_cast<int>(e));
    }
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    e = d.cuMemCreate(&h, r->size, &prop, 0);
  }
  if (e != CUDA_SUCCESS) return e;
  e = d.cuMemMap(base, r->size, 0, h, 0);
  if (e != CUDA_SUCCESS) {
    d.cuMemRelease(h);
    return e;
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  e = d.cuMemSetAccess(base, r->size, &access, 1);
  if (e != CUDA_SUCCESS) {
    d.cuMemUnmap(base, r->size);
    d.cuMemRelease(h);
    return e;
  }
  r->handle = h;
  r->resident = true;
  return CUDA_SUCCESS;
}

bool Reached(uint32_t done, uint32_t gen) { return static_cast<int32_t>(done - gen) >= 0; }

// ---- Preemption hold (VgpuTier::held) ----

// Whether the vGPU's allocation is suspended by a preemption.
bool Held(const State& s) {
  Binding* b = s.binding != nullptr ? Bound() : nullptr;
  VgpuTier* v = b != nullptr ? b->region.TierOfVgpu(b->vgpu) : nullptr;
  return v != nullptr && v->held.load(std::memory_order_acquire) != 0;
}

// TFUSION_TIER_HOLD_TIMEOUT (seconds, in the tenant's environment): how long one call waits on a
// hold before it fails with CUDA_ERROR_LAUNCH_TIMEOUT. Unset or 0: as long as the hold lasts.
int64_t HoldTimeoutNs() {
  static const int64_t ns = [] {
    const char* v = getenv("TFUSION_TIER_HOLD_TIMEOUT");
    long long sec = v != nullptr ? atoll(v) : 0;
    return sec > 0 ? static_cast<int64_t>(sec) * 1'000'000'000 : int64_t{0};
  }();
  return ns;
}

// REQUIRES s.mu (released while it sleeps). A call that needs the GPU (or new VRAM) waits here
// while the vGPU is held, so the tenant never takes the GPU back from its preemptor. The ways out:
// the hold ends (the controller resumed the allocation), the process is killed (the allocation
// deleted: the node agent stops it), or TFUSION_TIER_HOLD_TIMEOUT passes.
CUresult WaitWhileHeldLocked(State& s) {
  if (!Held(s)) return CUDA_SUCCESS;
  const int64_t t0 = Now();
  if (s.held_since_ns == 0) {
    s.held_since_ns = t0;
    GuestLog("vGPU '%s' is suspended (preempted by a higher QoS): its GPU calls wait until it resumes",
             s.binding->vgpu_id);
  }
  const int64_t limit = HoldTimeoutNs();
  while (Held(s)) {
    if (limit > 0 && Now() - t0 >= limit) {
      GuestLog("vGPU '%s': a GPU call waited %.0f s on the suspension (TFUSION_TIER_HOLD_TIMEOUT): "
               "CUDA_ERROR_LAUNCH_TIMEOUT", s.binding->vgpu_id, limit / 1e9);
      return CUDA_ERROR_LAUNCH_TIMEOUT;
    }
    timespec until;
    AbsDeadline(&until, kTickNs);
    pthread_cond_timedwait(&s.cv, &s.mu, &until);
  }
  if (s.held_since_ns != 0) {
    GuestLog("vGPU '%s' resumed after %.1f s suspended", s.binding->vgpu_id, (Now() - s.held_since_ns) / 1e9);
    s.held_since_ns = 0;
  }
  return CUDA_SUCCESS;
}

// Pressure eviction: VRAM this process needs is held by other tenants of the GPU. Freezes the
// coldest other vGPU with tiering whose QoS is not above ours and is not critical, and waits (at
// most 10 s) until its processes are swapped out. `tried` (a vGPU bit mask) keeps one request from
// asking the same vGPU twice. True when a vGPU was frozen: the caller retries its allocation.
bool EvictOther(Binding* b, uint64_t* tried) {
  if (b == nullptr) return false;
  auto snap = std::make_unique<RegionSnapshot>();
  b->region.Snapshot(snap.get());
  uint32_t my_qos = kMaxQos;
  for (uint32_t i = 0; i < snap->vgpu_count; ++i) {
    if (snap->vgpus[i].index == b->vgpu) my_qos = snap->vgpus[i].qos;
  }
  int best = -1;
  int64_t best_active = 0;
  uint64_t best_bytes = 0;
  for (uint32_t i = 0; i < snap->vgpu_count; ++i) {
    const VgpuInfo& v = snap->vgpus[i];
    if (v.index == b->vgpu || !v.tier_enabled || v.qos > my_qos || v.qos >= kMaxQos) continue;
    if ((*tried >> v.index) & 1) continue;
    uint64_t resident = 0;
    int64_t active = 0;
    for (uint32_t k = 0; k < snap->process_count; ++k) {
      const ProcessInfo& p = snap->processes[k];
      if (p.vgpu_index != v.index || p.tier_state != kTierResident) continue;
      resident += p.movable_bytes - p.host_bytes;
      if (p.last_active_ns > active) active = p.last_active_ns;
    }
    if (resident == 0) continue;
    if (best < 0 || active < best_active) {
      best = static_cast<int>(i);
      best_active = active;
      best_bytes = resident;
    }
  }
  if (best >= 0 && snap->vgpus[best].qos == my_qos && Now() - best_active < kBusyNs) {
    timespec pause{0, 20'000'000};
    nanosleep(&pause, nullptr);
    return true;  // try again: the coldest one may be idle by then, or memory freed
  }
  if (best < 0) {
    // Nobody resident to freeze: memory may still be on its way out (another tenant swapping out,
    // for its idle timeout or for someone else's request). Wait for that, then try again.
    auto swapping = [&] {
      b->region.Snapshot(snap.get());
      for (uint32_t k = 0; k < snap->process_count; ++k) {
        if (snap->processes[k].vgpu_index != b->vgpu && snap->processes[k].tier_state == kTierSwappingOut) return true;
      }
      return false;
    };
    if (!swapping()) return false;
    const int64_t until = Now() + kEvictWaitNs;
    while (Now() < until && swapping()) {
      timespec pause{0, 2'000'000};
      nanosleep(&pause, nullptr);
    }
    return true;
  }
  const VgpuInfo& victim = snap->vgpus[best];
  *tried |= 1ull << victim.index;
  uint32_t gen = 0;
  if (b->region.RequestPressureFreeze(victim.index, &gen) != RegionError::kOk) return true;
  GuestLog("vGPU '%s': VRAM is held by other tenants: freezing vGPU '%s' (%llu MiB resident, idle %.1f s)",
           b->vgpu_id, victim.id, static_cast<unsigned long long>(best_bytes >> 20),
           best_active > 0 ? (Now() - best_active) / 1e9 : 0.0);
  const int64_t deadline = Now() + kEvictWaitNs;
  while (Now() < deadline) {
    bool pending = false;
    for (uint32_t k = 0; k < snap->process_count; ++k) {
      const ProcessInfo& p = snap->processes[k];
      if (p.vgpu_index != victim.index || p.tier_state == kTierOff) continue;
      ProcessTier* t = b->region.TierOfProcess(p.slot);
      if (t->state.load(std::memory_order_acquire) != kTierOff &&
          !Reached(t->freeze_done_gen.load(std::memory_order_acquire), gen)) {
        pending = true;
      }
    }
    if (!pending) break;
    timespec pause{0, 1'000'000};
    nanosleep(&pause, nullptr);
  }
  return true;
}

// `allocate`, freezing colder tenants of the GPU while the driver is out of memory (for at most
// kEvictDeadlineNs in all).
template <typename Allocate>
CUresult Evicting(Binding* b, Allocate&& allocate) {
  uint64_t tried = 0;
  const int64_t deadline = Now() + kEvictDeadlineNs;
  for (;;) {
    CUresult e = allocate();
    if (e != CUDA_ERROR_OUT_OF_MEMORY || Now() > deadline || !EvictOther(b, &tried)) return e;
  }
}

CUresult MapPhysicalEvicting(Binding* b, CUdeviceptr base, Range* r) {
  return Evicting(b, [&] { return MapPhysical(base, r); });
}

void UnmapPhysical(CUdeviceptr base, Range* r) {
  if (r->tenant) {
    TenantVmm::Instance().ReleasePhysicalLocked(base);
    r->resident = false;
    return;
  }
  g_real.cuMemUnmap(base, r->size);
  g_real.cuMemRelease(r->handle);
  r->handle = 0;
  r->resident = false;
}

void FreeHostCopy(Range* r) {
  char* host = static_cast<char*>(r->host);
  if (host == nullptr) return;
  bool any = false;
  for (uint8_t reg : r->registered) any = any || reg;
  if (any) {
    InContext(r->ctx, [r, host] {
      for (size_t i = 0; i < r->registered.size(); ++i) {
        if (r->registered[i]) g_real.cuMemHostUnregister(host + i * kHostChunk);
      }
      return CUDA_SUCCESS;
    });
  }
  munmap(host, r->size);
  r->host = nullptr;
  r->registered.clear();
}

// Unpins and unmaps a range's kept copy; returning its budget is the caller's.
void DropKept(Range* r) {
  Range copy;
  copy.size = r->size;
  copy.ctx = r->ctx;
  copy.host = r->kept;
  copy.registered = std::move(r->kept_registered);
  FreeHostCopy(&copy);
  r->kept = nullptr;
  r->kept_registered.clear();
}

// REQUIRES s.mu. Frees every kept copy. Their budget is returned first, so that other keepers
// asked to free theirs see it and keep their own.
void FreeKeptLocked(State& s) {
  if (s.kept == 0) return;
  const uint64_t bytes = s.kept;
  s.kept = 0;
  PublishKept(s);
  s.binding->region.ReleaseHostTier(bytes);
  for (auto& [base, r] : s.ranges) {
    if (r.kept != nullptr) DropKept(&r);
  }
}

// Whether swap-ins keep their pinned host copies for the next swap-out (TFUSION_TIER_KEEP_HOST,
// default on): a later swap-out then only copies, at copy-engine speed.
bool KeepHostCopies() {
  static const bool keep = [] {
    const char* v = getenv("TFUSION_TIER_KEEP_HOST");
    return v == nullptr || strcmp(v, "0") != 0;
  }();
  return keep;
}

// Anonymous memory for a range's host copy (not yet populated), or nullptr.
void* MapHost(size_t size) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  madvise(p, size, MADV_HUGEPAGE);
  return p;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

// Faults in [at, at+len) writable. False when the memory is not there (ENOMEM).
bool Populate(char* at, size_t len) {
  if (madvise(at, len, MADV_POPULATE_WRITE) == 0) return true;
  if (errno != EINVAL) return false;
  // Kernels before 5.14: touch every page.
  volatile char* v = at;
  for (size_t o = 0; o < len; o += 4096) v[o] = 0;
  return true;
}

// One kHostChunk piece of one range's host copy.
struct HostJob {
  Range* r = nullptr;
  CUdeviceptr base = 0;
  size_t index = 0;
  int state = 0;  // 0 pending, 1 pinned, 2 failed (under HostPipeline::mu)
  CUresult err = CUDA_SUCCESS;
};

struct HostPipeline {
  std::vector<HostJob> jobs;
  std::atomic<size_t> next{0};
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
};

void* HostWorker(void* arg) {
  auto* p = static_cast<HostPipeline*>(arg);
  // Pinning may run beside the tenant's own threads (ahead of a freeze): a registration made
  // here must never invalidate a graph capture in progress on one of them.
  if (g_real.cuThreadExchangeStreamCaptureMode != nullptr) {
    CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
    g_real.cuThreadExchangeStreamCaptureMode(&relaxed);
  }
  for (;;) {
    size_t i = p->next.fetch_add(1, std::memory_order_relaxed);
    if (i >= p->jobs.size()) break;
    HostJob& j = p->jobs[i];
    if (j.state != 0) continue;  // a kept copy: pinned before the workers started
    char* at = static_cast<char*>(j.r->host) + j.index * kHostChunk;
    size_t len = j.r->size - j.index * kHostChunk < kHostChunk ? j.r->size - j.index * kHostChunk : kHostChunk;
    CUresult e = CUDA_ERROR_OUT_OF_MEMORY;
    if (Populate(at, len)) {
      e = InContext(j.r->ctx, [at, len] { return g_real.cuMemHostRegister_v2(at, len, 0); });
    }
    pthread_mutex_lock(&p->mu);
    if (e == CUDA_SUCCESS) j.r->registered[j.index] = 1;
    j.err = e;
    j.state = e == CUDA_SUCCESS ? 1 : 2;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
  }
  return nullptr;
}

// Fresh host memory for `r`'s copy (not yet populated), with one pending job of `p` per
// kHostChunk piece. False when the memory cannot be mapped.
bool MapHostCopy(Range* r, CUdeviceptr base, HostPipeline* p) {
  r->host = MapHost(r->size);
  if (r->host == nullptr) return false;
  size_t chunks = (r->size + kHostChunk - 1) / kHostChunk;
  r->registered.assign(chunks, 0);
  for (size_t i = 0; i < chunks; ++i) p->jobs.push_back(HostJob{r, base, i, 0, CUDA_SUCCESS});
  return true;
}

// Starts the workers of `p` (half the CPUs, at most `max_workers` and kMaxHostWorkers, no more
// than its pending pieces) and returns how many run; with none it does the work on this thread.
int StartHostWorkers(HostPipeline* p, pthread_t* threads, int max_workers = kMaxHostWorkers) {
  size_t pending = 0;
  for (const HostJob& j : p->jobs) pending += j.state == 0 ? 1 : 0;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int workers = static_cast<int>(cpus > 2 ? cpus / 2 : 1);
  if (workers > kMaxHostWorkers) workers = kMaxHostWorkers;
  if (workers > max_workers) workers = max_workers;
  if (static_cast<size_t>(workers) > pending) workers = static_cast<int>(pending);
  int started = 0;
  for (; started < workers; ++started) {
    if (pthread_create(&threads[started], nullptr, &HostWorker, p) != 0) break;
  }
  if (started == 0 && pending > 0) HostWorker(p);  // no thread could start: do it here
  return started;
}

// The copies of a swap: issued in the context of their range (made current on this thread), on
// kCopyStreams streams of that context in turn. Moving to another context drains the streams of
// the one before; Finish drains and releases everything. `err` keeps the first error.
struct CopyLanes {
  CUresult err = CUDA_SUCCESS;
  CUcontext current = nullptr;
  CUstream streams[kCopyStreams] = {};
  int made = 0;
  int next = 0;

  // True when copies may be issued in `ctx`.
  bool Enter(CUcontext ctx) {
    if (ctx == current && made > 0) return err == CUDA_SUCCESS;
    Finish();
    if (err != CUDA_SUCCESS) return false;
    err = g_real.cuCtxPushCurrent_v2(ctx);
    if (err != CUDA_SUCCESS) return false;
    current = ctx;
    for (; made < kCopyStreams; ++made) {
      err = g_real.cuStreamCreate(&streams[made], CU_STREAM_NON_BLOCKING);
      if (err != CUDA_SUCCESS) return false;
    }
    return true;
  }
  CUstream Next() { return streams[next++ % made]; }
  void Finish() {
    for (int i = 0; i < made; ++i) {
      CUresult e = g_real.cuStreamSynchronize(streams[i]);
      if (err == CUDA_SUCCESS) err = e;
      g_real.cuStreamDestroy_v2(streams[i]);
    }
    made = 0;
    if (current != nullptr) {
      CUcontext popped = nullptr;
      g_real.cuCtxPopCurrent_v2(&popped);
      current = nullptr;
    }
  }
};

// Copies every resident range to a new host copy: workers populate and pin the host memory piece
// by piece; each piece is copied (kCopyStreams streams, per context) as soon as it is pinned.
// On failure the host copies made so far stay attached to their ranges (the caller frees them).
CUresult CopyOut(State& s) {
  auto p = std::make_unique<HostPipeline>();
  for (auto& [base, r] : s.ranges) {
    if (!r.resident) continue;
    CUdeviceptr at = base;  // where its contents are read
    if (r.tenant) {
      CUresult e = TenantVmm::Instance().CopyAddressLocked(base, &at);
      if (e != CUDA_SUCCESS) return e;
    }
    if (r.kept != nullptr) {  // pinned already: copied without waiting for a worker
      r.host = r.kept;
      r.registered = std::move(r.kept_registered);
      r.kept = nullptr;
      r.kept_registered.clear();
      r.budgeted = true;
      size_t chunks = (r.size + kHostChunk - 1) / kHostChunk;
      for (size_t i = 0; i < chunks; ++i) p->jobs.push_back(HostJob{&r, at, i, 1, CUDA_SUCCESS});
      continue;
    }
    if (!MapHostCopy(&r, at, p.get())) return CUDA_ERROR_OUT_OF_MEMORY;
    r.budgeted = true;
  }
  pthread_t threads[kMaxHostWorkers];
  const int started = StartHostWorkers(p.get(), threads);
  CopyLanes lanes;
  for (HostJob& j : p->jobs) {
    pthread_mutex_lock(&p->mu);
    while (j.state == 0) pthread_cond_wait(&p->cv, &p->mu);
    const CUresult je = j.state == 2 ? j.err : CUDA_SUCCESS;
    pthread_mutex_unlock(&p->mu);
    if (je != CUDA_SUCCESS) {
      lanes.err = je;
      break;
    }
    if (!lanes.Enter(j.r->ctx)) break;
    const size_t start = j.index * kHostChunk;
    const size_t end = start + kHostChunk < j.r->size ? start + kHostChunk : j.r->size;
    for (size_t off = start; off < end && lanes.err == CUDA_SUCCESS; off += kCopyPiece) {
      size_t n = end - off < kCopyPiece ? end - off : kCopyPiece;
      lanes.err = g_real.cuMemcpyDtoHAsync_v2(static_cast<char*>(j.r->host) + off, j.base + off, n, lanes.Next());
    }
    if (lanes.err != CUDA_SUCCESS) break;
  }
  p->next.store(p->jobs.size(), std::memory_order_relaxed);  // on failure: stop claiming pieces
  lanes.Finish();
  for (int i = 0; i < started; ++i) pthread_join(threads[i], nullptr);
  return lanes.err;
}

// REQUIRES s.mu. Copies every mapped range that has a host copy back to its address, and waits.
CUresult CopyIn(State& s) {
  CopyLanes lanes;
  for (auto& [base, r] : s.ranges) {
    if (r.host == nullptr || !r.resident) continue;
    if (!lanes.Enter(r.ctx)) break;
    CUdeviceptr at = base;  // where its contents are written
    if (r.tenant) lanes.err = TenantVmm::Instance().CopyAddressLocked(base, &at);
    for (size_t off = 0; off < r.size && lanes.err == CUDA_SUCCESS; off += kCopyPiece) {
      size_t n = r.size - off < kCopyPiece ? r.size - off : kCopyPiece;
      lanes.err = g_real.cuMemcpyHtoDAsync_v2(at + off, static_cast<char*>(r.host) + off, n, lanes.Next());
    }
    if (lanes.err != CUDA_SUCCESS) break;
  }
  lanes.Finish();
  TenantVmm::Instance().DropWindowsLocked();
  return lanes.err;
}

uint32_t Micros(int64_t ns) {
  return ns / 1000 > static_cast<int64_t>(UINT32_MAX) ? UINT32_MAX : static_cast<uint32_t>(ns / 1000);
}

// A completed swap event, for the node agent's log (ProcessTierLog). `cause`: TierEventCause.
void RecordEvent(State& s, uint32_t kind, uint32_t cause, int64_t ns, uint64_t host_bytes, uint64_t disk_bytes) {
  Binding* b = s.binding != nullptr ? Bound() : nullptr;
  if (b == nullptr) return;
  TierEvent e;
  e.kind = kind;
  e.cause = cause;
  e.duration_us = Micros(ns);
  e.host_bytes = host_bytes;
  e.disk_bytes = disk_bytes;
  b->region.RecordTierEvent(b->slot, e);
}

// `disk_bytes` (a swap-in): of `bytes`, those read back from the disk tier.
void CountSwap(State& s, bool out, uint64_t bytes, int64_t ns, CUresult err, uint32_t cause = kTierCauseUnknown,
               uint64_t disk_bytes = 0) {
  Binding* b = s.binding;
  ProcessTier* t = MyTier(s);
  if (b == nullptr || t == nullptr) return;
  TierHeader* h = b->region.tier_header();
  if (err != CUDA_SUCCESS) {
    t->last_error.store(static_cast<uint32_t>(err), std::memory_order_relaxed);
    h->swap_failures_total.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  t->last_error.store(0, std::memory_order_relaxed);
  uint32_t us = Micros(ns);
  (out ? t->swaps_out : t->swaps_in).fetch_add(1, std::memory_order_relaxed);
  (out ? t->last_out_us : t->last_in_us).store(us, std::memory_order_relaxed);
  (out ? h->swaps_out_total : h->swaps_in_total).fetch_add(1, std::memory_order_relaxed);
  (out ? h->bytes_out_total : h->bytes_in_total).fetch_add(bytes, std::memory_order_relaxed);
  RecordEvent(s, out ? kTierEventSwapOut : kTierEventSwapIn, cause, ns, bytes - std::min(bytes, disk_bytes), disk_bytes);
}

// ---- the disk tier: each host copy moves to an unnamed file (O_TMPFILE) in the tier directory,
// so nothing is left behind when the tenant dies and no other process can open or replace it. A
// 4 KiB header (magic, owner pid, address, size, CRC-32C of the data, CRC of the header) precedes
// the data; a copy whose header or data does not check out is refused at resume.

constexpr size_t kDiskHeader = 4096;
constexpr char kDiskMagic[8] = {'T', 'F', 'S', 'W', 'A', 'P', '0', '1'};

struct DiskHeader {
  char magic[8];
  uint64_t pid;
  uint64_t base;
  uint64_t size;
  uint32_t data_crc;
  uint32_t header_crc;  // of the bytes before it
};

__attribute__((target("sse4.2"))) uint32_t Crc32cHw(const unsigned char* p, size_t n, uint32_t crc) {
  uint64_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = __builtin_ia32_crc32qi(c32, *p);
  return ~c32;
}

uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0) {
  const auto* p = static_cast<const unsigned char*>(data);
  if (__builtin_cpu_supports("sse4.2")) return Crc32cHw(p, n, crc);
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

// pwrite (write) or pread the whole of [p, p+n) at file offset `at`, kCopyPiece at a time.
bool TransferAll(bool write, int fd, char* p, size_t n, off_t at) {
  while (n > 0) {
    size_t step = n < kCopyPiece ? n : kCopyPiece;
    ssize_t done = write ? pwrite(fd, p, step, at) : pread(fd, p, step, at);
    if (done <= 0) {
      if (done < 0 && errno == EINTR) continue;
      return false;
    }
    p += done;
    n -= static_cast<size_t>(done);
    at += done;
  }
  return true;
}

// An unnamed file in the tier directory, with direct I/O where the file system offers it.
int OpenDiskFile() {
  int fd = open(g_tier_dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    // A file system without unnamed files: a private file, unlinked at once.
    char path[sizeof(g_tier_dir) + 32];
    snprintf(path, sizeof(path), "%s/.tfusion-swap-XXXXXX", g_tier_dir);
    fd = mkostemp(path, O_CLOEXEC);
    if (fd >= 0) unlink(path);
  }
  if (fd < 0) return -1;
  int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags | O_DIRECT);  // refused on tmpfs: buffered then
  return fd;
}

// REQUIRES s.mu, s.state == kTierSwapped. Moves every host copy to the disk tier; a copy that
// cannot be written (no space, I/O error) stays in host memory and the process stays swapped.
void ToDiskLocked(State& s) {
  if (g_tier_dir[0] == '\0' || s.state != kTierSwapped) return;
  int64_t t0 = Now();
  uint64_t moved = 0, released = 0;
  for (auto& [base, r] : s.ranges) {
    if (r.host == nullptr || r.fd >= 0 || r.resident) continue;
    int fd = OpenDiskFile();
    if (fd < 0) {
      GuestLog("vGPU '%s': cannot create a swap file in %s: %s", s.binding->vgpu_id, g_tier_dir, strerror(errno));
      break;
    }
    alignas(4096) static char header_block[kDiskHeader];
    memset(header_block, 0, sizeof(header_block));
    DiskHeader h{};
    memcpy(h.magic, kDiskMagic, sizeof(h.magic));
    h.pid = static_cast<uint64_t>(getpid());
    h.base = base;
    h.size = r.size;
    h.data_crc = Crc32c(r.host, r.size);
    h.header_crc = Crc32c(&h, offsetof(DiskHeader, header_crc));
    memcpy(header_block, &h, sizeof(h));
    if (!TransferAll(true, fd, header_block, kDiskHeader, 0) ||
        !TransferAll(true, fd, static_cast<char*>(r.host), r.size, static_cast<off_t>(kDiskHeader))) {
      GuestLog("vGPU '%s': writing %llu MiB to the disk tier failed (%s): it stays in host memory",
               s.binding->vgpu_id, static_cast<unsigned long long>(r.size >> 20), strerror(errno));
      close(fd);
      break;
    }
    r.fd = fd;
    r.crc = h.data_crc;
    if (r.budgeted) released += r.size;
    FreeHostCopy(&r);
    r.budgeted = false;
    moved += r.size;
  }
  s.binding->region.ReleaseHostTier(released);
  s.host -= released;
  s.disk += moved;
  if (s.host == 0 && s.disk > 0) s.state = kTierOnDisk;
  Publish(s);
  if (moved > 0) {
    RecordEvent(s, kTierEventToDisk, kTierCauseIdle, Now() - t0, 0, moved);
    GuestLog("vGPU '%s': moved %llu MiB to the disk tier in %.1f ms", s.binding->vgpu_id,
             static_cast<unsigned long long>(moved >> 20), (Now() - t0) / 1e6);
  }
}

// REQUIRES s.mu. Reads a range's copy back from the disk tier into new host memory, checking it.
CUresult FromDisk(State& s, CUdeviceptr base, Range* r) {
  alignas(4096) static char header_block[kDiskHeader];
  DiskHeader h{};
  if (!TransferAll(false, r->fd, header_block, kDiskHeader, 0)) return CUDA_ERROR_OPERATING_SYSTEM;
  memcpy(&h, header_block, sizeof(h));
  if (memcmp(h.magic, kDiskMagic, sizeof(kDiskMagic)) != 0 ||
      h.header_crc != Crc32c(&h, offsetof(DiskHeader, header_crc)) || h.base != base || h.size != r->size ||
      h.data_crc != r->crc) {
    GuestLog("vGPU '%s': the swap file of 0x%llx is not ours or is damaged: refused", s.binding->vgpu_id,
             static_cast<unsigned long long>(base));
    return CUDA_ERROR_ECC_UNCORRECTABLE;
  }
  r->host = MapHost(r->size);
  if (r->host == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  r->budgeted = false;
  r->registered.assign((r->size + kHostChunk - 1) / kHostChunk, 0);
  if (!TransferAll(false, r->fd, static_cast<char*>(r->host), r->size, static_cast<off_t>(kDiskHeader))) {
    FreeHostCopy(r);
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  if (Crc32c(r->host, r->size) != r->crc) {
    GuestLog("vGPU '%s': the swap file of 0x%llx is damaged (checksum): refused", s.binding->vgpu_id,
             static_cast<unsigned long long>(base));
    FreeHostCopy(r);
    return CUDA_ERROR_ECC_UNCORRECTABLE;
  }
  char* host = static_cast<char*>(r->host);
  return InContext(r->ctx, [r, host] {
    for (size_t i = 0; i < r->registered.size(); ++i) {
      size_t off = i * kHostChunk;
      size_t len = r->size - off < kHostChunk ? r->size - off : kHostChunk;
      CUresult e = g_real.cuMemHostRegister_v2(host + off, len, 0);
      if (e != CUDA_SUCCESS) return e;
      r->registered[i] = 1;
    }
    return CUDA_SUCCESS;
  });
}

// REQUIRES s.mu, s.state == kTierSwapped. `cause`: TierEventCause.
CUresult SwapInLocked(State& s, uint32_t cause) {
  int64_t t0 = Now();
  s.state = kTierSwappingIn;
  Publish(s);
  uint64_t bytes = 0, from_disk = 0;
  CUresult e = CUDA_SUCCESS;
  for (auto& [base, r] : s.ranges) {
    if (r.resident || r.fd < 0 || r.host != nullptr) continue;
    e = FromDisk(s, base, &r);
    if (e != CUDA_SUCCESS) break;
    from_disk += r.size;
  }
  int64_t t_loaded = Now();
  for (auto& [base, r] : s.ranges) {
    if (e != CUDA_SUCCESS) break;
    if (r.resident) continue;
    e = MapPhysicalEvicting(s.binding, base, &r);
    if (e != CUDA_SUCCESS) break;
    bytes += r.size;
  }
  int64_t t_mapped = Now();
  if (e == CUDA_SUCCESS) {
    e = CopyIn(s);
  }
  if (e != CUDA_SUCCESS) {
    // Back to swapped, the host copies untouched: the next call tries again.
    for (auto& [base, r] : s.ranges) {
      if (r.resident && r.host != nullptr) UnmapPhysical(base, &r);
    }
    s.state = s.host == 0 && s.disk > 0 ? kTierOnDisk : kTierSwapped;
    CountSwap(s, false, 0, 0, e);
    Publish(s);
    GuestLog("vGPU '%s': resume failed (CUDA error %d); the swapped copy is kept",
             s.binding->vgpu_id, static_cast<int>(e));
    return e;
  }
  int64_t t_copied = Now();
  const bool keep = KeepHostCopies();
  uint64_t kept = 0;
  for (auto& [base, r] : s.ranges) {
    if (r.fd >= 0) {
      close(r.fd);  // an unnamed file: gone with its descriptor
      r.fd = -1;
      s.disk -= r.size;
    }
    if (r.host == nullptr) continue;
    if (keep && r.budgeted) {  // pinned and within the budget: kept for the next swap-out
      r.kept = r.host;
      r.kept_registered = std::move(r.registered);
      s.host -= r.size;
      kept += r.size;
    } else {
      s.to_free.push_back(r);  // still counted in s.host (and so in the region) until freed
    }
    r.host = nullptr;
    r.registered.clear();
    r.budgeted = false;
  }
  s.state = kTierResident;
  int64_t ns = Now() - t0;
  CountSwap(s, false, bytes, ns, CUDA_SUCCESS, cause, from_disk);
  s.last_active_ns = Now();
  Publish(s);  // host_bytes down before host_kept_bytes up: a death in between leaks, never doubles
  if (kept != 0) {
    s.kept += kept;
    PublishKept(s);
  }
  g_tier_blocked.fetch_and(~kBlockedSwap, std::memory_order_seq_cst);
  pthread_cond_broadcast(&s.cv);  // the tier thread frees the host copies
  if (TraceEnabled() || bytes >= (64ull << 20)) {
    GuestLog("vGPU '%s': resumed %llu MiB in %.1f ms (disk %.1f, map %.1f, copy %.1f)", s.binding->vgpu_id,
             static_cast<unsigned long long>(bytes >> 20), ns / 1e6, (t_loaded - t0) / 1e6,
             (t_mapped - t_loaded) / 1e6, (t_copied - t_mapped) / 1e6);
  }
  return CUDA_SUCCESS;
}

// REQUIRES s.mu. Frees host copies left by swap-ins and returns their budget.
void FreePendingLocked(State& s) {
  uint64_t bytes = 0;
  for (Range& r : s.to_free) {
    if (r.budgeted) bytes += r.size;
    FreeHostCopy(&r);
  }
  s.to_free.clear();
  if (bytes != 0) {
    s.binding->region.ReleaseHostTier(bytes);
    s.host -= bytes;
    Publish(s);
  }
}

// REQUIRES s.mu. Undoes a swap-out that failed before any range was released.
CUresult AbortSwapOut(State& s, CUresult e, const char* why) {
  for (auto& [base, r] : s.ranges) {
    if (r.resident && r.host != nullptr) FreeHostCopy(&r);
  }
  TenantVmm::Instance().DropWindowsLocked();
  s.state = kTierResident;
  g_tier_blocked.fetch_and(~kBlockedSwap, std::memory_order_seq_cst);
  CountSwap(s, true, 0, 0, e);
  Publish(s);
  GuestLog("vGPU '%s': swap-out abandoned, the tenant stays resident: %s (CUDA error %d)",
           s.binding->vgpu_id, why, static_cast<int>(e));
  return e;
}

// REQUIRES s.mu. Reads the graph memory the driver holds on the devices of our ranges' contexts
// into s.graph_*, after giving back what no graph uses when `trim`. False (nothing read) when the
// driver lacks the calls, no range tells a context, or a reading failed.
bool ReadGraphMemoryLocked(State& s, bool trim) {
  const auto& d = g_real;
  if (d.cuDeviceGetGraphMemAttribute == nullptr || (trim && d.cuDeviceGraphMemTrim == nullptr)) return false;
  std::vector<CUcontext> contexts;
  std::vector<CUdevice> devices;
  uint64_t reserved = 0, used = 0;
  for (auto& [base, r] : s.ranges) {
    if (r.ctx == nullptr || std::find(contexts.begin(), contexts.end(), r.ctx) != contexts.end()) continue;
    contexts.push_back(r.ctx);
    CUresult e = InContext(r.ctx, [&] {
      CUdevice dev = 0;
      CUresult e = d.cuCtxGetDevice(&dev);
      if (e != CUDA_SUCCESS || std::find(devices.begin(), devices.end(), dev) != devices.end()) return e;
      devices.push_back(dev);
      if (trim) d.cuDeviceGraphMemTrim(dev);  // a failed trim leaves what the reading shows
      cuuint64_t res = 0, use = 0;
      e = d.cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &res);
      if (e == CUDA_SUCCESS) e = d.cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &use);
      reserved += res;
      used += use;
      return e;
    });
    if (e != CUDA_SUCCESS) return false;
  }
  if (contexts.empty()) return false;
  s.graph_read = true;
  s.graph_reserved = reserved;
  s.graph_used = used;
  return true;
}

// REQUIRES s.mu. `cause`: TierEventCause.
CUresult SwapOutLocked(State& s, uint32_t cause) {
  if (s.state != kTierResident) return CUDA_SUCCESS;
  FreePendingLocked(s);
  uint64_t bytes = 0;
  for (auto& [base, r] : s.ranges) bytes += r.resident ? r.size : 0;
  if (bytes == 0) return CUDA_SUCCESS;
  int64_t t0 = Now();
  // Quiesce: hold new GPU calls, let the ones inside the driver return, drain queued work.
  g_tier_blocked.fetch_or(kBlockedSwap, std::memory_order_seq_cst);
  s.state = kTierSwappingOut;
  Publish(s);
  while (g_tier_inflight.load(std::memory_order_seq_cst) != 0) {
    if (Now() - t0 > kQuiesceTimeoutNs) {
      return AbortSwapOut(s, CUDA_ERROR_TIMEOUT, "a call into the driver did not return within 30 s");
    }
    timespec pause{0, 50'000};
    nanosleep(&pause, nullptr);
  }
  int64_t t_quiet = Now();
  std::vector<CUcontext> synced;
  for (auto& [base, r] : s.ranges) {
    bool seen = false;
    for (CUcontext c : synced) seen = seen || c == r.ctx;
    if (seen) continue;
    synced.push_back(r.ctx);
    CUresult e = InContext(r.ctx, [] { return g_real.cuCtxSynchronize(); });
    if (e != CUDA_SUCCESS) return AbortSwapOut(s, e, "its queued work failed");
  }
  // Graph memory nodes (stream-ordered allocations made during a capture) belong to the driver
  // and cannot move; it gives back what it keeps of them unused for the graphs' next launches.
  const uint64_t graph_before = ReadGraphMemoryLocked(s, false) ? s.graph_reserved : 0;
  if (ReadGraphMemoryLocked(s, true) && graph_before != 0) {
    const auto mib = [](uint64_t b) { return static_cast<unsigned long long>(b >> 20); };
    if (s.graph_used != 0) {
      GuestLog("vGPU '%s': graph memory: %llu MiB trimmed, %llu MiB stay resident (fixed): graph allocations "
               "of %llu MiB are live (allocated by a graph launch and not freed yet)", s.binding->vgpu_id,
               mib(graph_before - std::min(graph_before, s.graph_reserved)), mib(s.graph_reserved),
               mib(s.graph_used));
    } else {
      GuestLog("vGPU '%s': graph memory: %llu MiB trimmed, %llu MiB stay resident (fixed)", s.binding->vgpu_id,
               mib(graph_before - std::min(graph_before, s.graph_reserved)), mib(s.graph_reserved));
    }
  }
  int64_t t_synced = Now();
  // Kept copies are reserved already. The rest of the budget may be held by host copies other
  // processes are about to free (after their resume) or keep for their next swap-out (asked to
  // free them): wait for it a little before giving up.
  const uint64_t reused = s.kept;
  const uint64_t need = bytes - reused;
  bool reserved = need == 0 || s.binding->region.ReserveHostTier(need);
  if (!reserved) {
    s.binding->region.RequestHostReclaim(need);
    s.reclaim_seen = s.binding->region.HostReclaimGen();  // not addressed to our own kept copies
  }
  for (const int64_t until = Now() + kBudgetWaitNs; !reserved && Now() < until;) {
    timespec pause{0, 5'000'000};
    nanosleep(&pause, nullptr);
    reserved = s.binding->region.ReserveHostTier(need);
  }
  if (!reserved) return AbortSwapOut(s, CUDA_ERROR_OUT_OF_MEMORY, "the host tier's budget is exhausted");
  // While it copies, the whole reservation is in the slot's kept bytes: a process killed meanwhile
  // gives it back when its slot is reaped (it leaked for good before).
  s.pinning += need;  // added to, not set: a pin ahead may be pinning unlocked meanwhile
  PublishKept(s);
  int64_t t_pinned = Now();
  CUresult e = CopyOut(s);  // takes over the kept copies
  int64_t t_copied = Now();
  s.kept = 0;
  s.pinning -= need;
  if (e != CUDA_SUCCESS) {
    // Copies it took over are freed with the swap-out (AbortSwapOut); kept copies of ranges it
    // did not reach stay kept, with their budget (released with the rest, they would have been
    // released twice: again when they are freed).
    for (auto& [base, r] : s.ranges)
      if (r.kept != nullptr) s.kept += r.size;
    PublishKept(s);  // a death in between leaks, never doubles
    s.binding->region.ReleaseHostTier(bytes - std::min(bytes, s.kept));
    return AbortSwapOut(s, e, e == CUDA_ERROR_OUT_OF_MEMORY ? "host memory could not be allocated or pinned"
                                                            : "copying to host memory failed");
  }
  // From kept bytes to host bytes: the same reservation, counted in one of the two at a time.
  s.host += bytes;
  PublishKept(s);
  if (ProcessTier* t = MyTier(s)) t->host_bytes.store(s.host, std::memory_order_relaxed);
  for (auto& [base, r] : s.ranges) {
    if (r.resident) UnmapPhysical(base, &r);
  }
  s.state = kTierSwapped;
  int64_t ns = Now() - t0;
  CountSwap(s, true, bytes, ns, CUDA_SUCCESS, cause);
  Publish(s);
  if (TraceEnabled() || bytes >= (64ull << 20)) {
    GuestLog("vGPU '%s': swapped out %llu MiB in %.1f ms (quiesce %.1f, drain %.1f, pin and copy %.1f, "
             "release %.1f; %llu MiB into kept pinned copies); %llu MiB stay resident (fixed)", s.binding->vgpu_id,
             static_cast<unsigned long long>(bytes >> 20), ns / 1e6, (t_quiet - t0) / 1e6,
             (t_synced - t_quiet) / 1e6, (t_copied - t_pinned) / 1e6, (Now() - t_copied) / 1e6,
             static_cast<unsigned long long>(reused >> 20), static_cast<unsigned long long>(FixedBytes(s) >> 20));
  }
  return CUDA_SUCCESS;
}

// Preparing an idle tenant's swap-out (TFUSION_TIER_PREPARE, the fraction of its idle timeout
// after which it starts; default 0.5, "0" or "off" never): most of a first swap-out's time goes
// into faulting in and pinning fresh host memory, not into the copy. From that point of an idle
// period the tier thread pins the host copies in the background, as kept copies (counted in the
// host tier's budget, taken only if the budget has room now: preparing never waits or asks others
// to free theirs), so the swap-out at the timeout only copies. A tenant that wakes up keeps them
// for its next swap-out, as after a swap-in.
double PrepareFraction() {
  static const double f = [] {
    const char* v = getenv("TFUSION_TIER_PREPARE");
    if (v == nullptr || *v == 0) return 0.5;
    if (strcmp(v, "off") == 0) return 0.0;
    char* end = nullptr;
    double x = strtod(v, &end);
    if (end == v || *end != 0 || !(x >= 0 && x <= 1)) {
      GuestLog("TFUSION_TIER_PREPARE=%s is not a fraction from 0 to 1 (or off): using 0.5", v);
      return 0.5;
    }
    return x;
  }();
  return f;
}

// Why host copies are pinned while the tenant is resident (the log says which).
enum class PrepareFor { kIdle, kAhead };

// REQUIRES s.mu (released while the host memory is pinned). Pins a kept copy for every resident
// range that has none and that the tier thread first saw at or before `seen_by` (pinning ahead:
// old enough), with at most `max_workers` threads. False when nothing was tried (nothing to pin,
// or no room in the budget now); true when it pinned or failed (host memory short).
bool PrepareLocked(State& s, PrepareFor why, int64_t seen_by = INT64_MAX, int max_workers = kMaxHostWorkers) {
  std::vector<Range> fresh;  // host copies being made, by the bases below
  std::vector<CUdeviceptr> bases;
  uint64_t need = 0;
  for (auto& [base, r] : s.ranges) {
    if (!r.resident || r.kept != nullptr || r.seen_ns > seen_by) continue;
    Range c;
    c.size = r.size;
    c.ctx = r.ctx;
    fresh.push_back(c);
    bases.push_back(base);
    need += r.size;
  }
  if (need == 0 || !s.binding->region.ReserveHostTier(need)) return false;
  // Counted in the slot's kept bytes while it pins: a process killed meanwhile gives the
  // reservation back when its slot is reaped (it leaked for good before).
  s.pinning += need;
  PublishKept(s);
  const int64_t t0 = Now();
  auto p = std::make_unique<HostPipeline>();
  bool mapped = true;
  for (size_t k = 0; k < fresh.size() && mapped; ++k) {
    mapped = MapHostCopy(&fresh[k], bases[k], p.get());
  }
  pthread_mutex_unlock(&s.mu);  // the tenant allocates and frees meanwhile
  pthread_t threads[kMaxHostWorkers];
  const int started = mapped ? StartHostWorkers(p.get(), threads, max_workers) : 0;
  for (int i = 0; i < started; ++i) pthread_join(threads[i], nullptr);
  pthread_mutex_lock(&s.mu);
  bool ok = mapped;
  for (const HostJob& j : p->jobs) ok = ok && j.state == 1;
  uint64_t attached = 0, returned = 0;
  for (size_t k = 0; k < fresh.size(); ++k) {
    auto it = s.ranges.find(bases[k]);
    Range* r = it == s.ranges.end() ? nullptr : &it->second;
    if (ok && r != nullptr && r->resident && r->kept == nullptr && r->size == fresh[k].size &&
        s.state == kTierResident) {
      r->kept = fresh[k].host;
      r->kept_registered = std::move(fresh[k].registered);
      attached += r->size;
    } else {  // failed, freed meanwhile, or swapped meanwhile
      FreeHostCopy(&fresh[k]);
      returned += fresh[k].size;
    }
  }
  s.kept += attached;
  s.pinning -= need;
  PublishKept(s);  // before the release: a death in between leaks, never doubles
  if (returned != 0) s.binding->region.ReleaseHostTier(returned);
  if (attached != 0) {
    GuestLog(why == PrepareFor::kIdle ? "vGPU '%s': idle: pinned %llu MiB of host copies in %.1f ms ahead of its swap-out"
                                      : "vGPU '%s': pinned %llu MiB of host copies in %.1f ms ahead of a freeze",
             s.binding->vgpu_id, static_cast<unsigned long long>(attached >> 20), (Now() - t0) / 1e6);
  } else if (!ok) {
    GuestLog("vGPU '%s': pinning %llu MiB of host copies ahead failed (host memory short): a swap-out "
             "pins them then", s.binding->vgpu_id, static_cast<unsigned long long>(need >> 20));
  }
  return true;
}

// Pinning ahead (TFUSION_TIER_PIN_AHEAD, seconds; default 2, "off" never): a tenant that is never
// idle long enough to be prepared (a busy one frozen on request, by a preemption or by pressure)
// would fault in and pin fresh host memory at its first swap-out, which takes several times as
// long as the copy (the kernel zeroes every page). Instead, once a movable range has existed that
// long, the tier thread pins its host copy in the background as a kept copy: counted in the host
// tier's budget, taken only when the budget has room now and no other tenant is waiting for
// budget (HostReclaimStillShort), given back when another tenant's swap-out needs it, at exit or
// when the range is freed. The copy is anonymous memory of the tenant, as every host copy:
// nobody else's death can lose it, and the tenant's death frees it.
int64_t PinAheadNs() {
  static const int64_t ns = [] {
    const char* v = getenv("TFUSION_TIER_PIN_AHEAD");
    if (v == nullptr || *v == 0) return int64_t{2'000'000'000};
    if (strcmp(v, "off") == 0) return int64_t{-1};
    char* end = nullptr;
    double sec = strtod(v, &end);
    if (end == v || *end != 0 || !(sec >= 0 && sec <= 86400)) {
      GuestLog("TFUSION_TIER_PIN_AHEAD=%s is not a number of seconds from 0 to 86400 (or off): using 2", v);
      return int64_t{2'000'000'000};
    }
    return static_cast<int64_t>(sec * 1e9);
  }();
  return ns;
}

constexpr int64_t kPinAheadLookNs = 250'000'000;   // how often the tier thread looks for due ranges
constexpr int64_t kPinAheadRetryNs = 30'000'000'000;  // after a failure (host memory short)
constexpr int kPinAheadWorkers = 2;                 // beside a busy tenant: a small share of the CPUs

// REQUIRES s.mu, s.state == kTierResident. Pins ahead the host copies of the ranges old enough.
void PinAheadLocked(State& s, int64_t now) {
  const int64_t age = PinAheadNs();
  if (age < 0 || !KeepHostCopies() || now < s.pin_ahead_next_ns) return;
  s.pin_ahead_next_ns = now + kPinAheadLookNs;
  bool due = false;
  for (auto& [base, r] : s.ranges) {
    if (r.seen_ns == 0) r.seen_ns = now;
    due = due || (r.resident && r.kept == nullptr && now - r.seen_ns >= age);
  }
  if (!due || s.binding->region.HostReclaimStillShort()) return;
  const uint64_t kept_before = s.kept;
  if (PrepareLocked(s, PrepareFor::kAhead, now - age, kPinAheadWorkers) && s.kept == kept_before) {
    s.pin_ahead_next_ns = Now() + kPinAheadRetryNs;
  }
}

ProcessZero* MyZero() {
  Binding* b = Bound();
  return b != nullptr ? b->region.ZeroOfProcess(b->slot) : nullptr;
}

bool Parked() { return (g_tier_blocked.load(std::memory_order_seq_cst) & kBlockedParked) != 0; }

// REQUIRES s.mu. Scale to zero, on the tier thread: acts on a checkpointer's park request and says
// whether the process must stay away from the driver (parked, checkpointing, checkpointed,
// restoring). The park bit is set and cleared only under s.mu, and cleared only once the state is
// back to none, so a caller never slips into the driver between a park and the checkpoint.
bool ZeroHeldLocked(State& s) {
  ProcessZero* z = MyZero();
  if (z == nullptr) return false;
  uint32_t st = z->state.load(std::memory_order_acquire);
  if (st == kZeroNone) {
    if (Parked()) g_tier_blocked.fetch_and(~kBlockedParked, std::memory_order_seq_cst);
    return false;
  }
  if (st != kZeroParkRequested) return true;
  const char* refused = nullptr;
  if (!IsSwapped(s.state)) refused = "it is not swapped out";
  else if (g_tier_captures.load(std::memory_order_acquire) > 0) refused = "a stream capture is in progress";
  if (refused == nullptr) {
    FreePendingLocked(s);
    // From here no call enters the driver: guarded calls and the others wait in ZeroWait. The ones
    // already inside return (the tier mutex is not held meanwhile: a hook may need it to finish).
    g_tier_blocked.fetch_or(kBlockedParked, std::memory_order_seq_cst);
    pthread_mutex_unlock(&s.mu);
    bool quiet = false;
    for (const int64_t until = Now() + kParkQuietNs; !quiet && Now() < until;) {
      quiet = g_zero_inflight.load(std::memory_order_seq_cst) == 0 &&
              g_tier_inflight.load(std::memory_order_seq_cst) == 0;
      if (!quiet) {
        timespec pause{0, 100'000};
        nanosleep(&pause, nullptr);
      }
    }
    pthread_mutex_lock(&s.mu);
    if (!quiet) refused = "a call into the driver did not return within 2 s";
    else if (!IsSwapped(s.state)) refused = "it is not swapped out";
  }
  uint32_t expect = kZeroParkRequested;
  if (refused == nullptr && z->state.compare_exchange_strong(expect, kZeroParked, std::memory_order_acq_rel)) {
    return true;
  }
  expect = kZeroParkRequested;
  z->state.compare_exchange_strong(expect, kZeroNone, std::memory_order_acq_rel);
  if (z->state.load(std::memory_order_acquire) == kZeroNone) {
    g_tier_blocked.fetch_and(~kBlockedParked, std::memory_order_seq_cst);
  }
  if (refused != nullptr) {
    GuestLog("vGPU '%s': not handed to the driver's checkpoint: %s", s.binding->vgpu_id, refused);
  }
  return false;
}

// The tier thread: requests, idle timeout, activity.
void* TierThread(void*) {
  // A swap file that the tenant's file size limit (RLIMIT_FSIZE) stops must fail its write with
  // EFBIG, not kill the tenant: the kernel sends SIGXFSZ to the writing thread, this one, where it
  // stays blocked.
  sigset_t xfsz;
  sigemptyset(&xfsz);
  sigaddset(&xfsz, SIGXFSZ);
  pthread_sigmask(SIG_BLOCK, &xfsz, nullptr);
  State& s = S();
  pthread_mutex_lock(&s.mu);
  while (!s.stop) {
    timespec until;
    AbsDeadline(&until, kTickNs);  // s.cv waits on CLOCK_REALTIME
    if (s.to_free.empty()) pthread_cond_timedwait(&s.cv, &s.mu, &until);
    if (s.stop) break;
    if (ZeroHeldLocked(s)) continue;  // not one driver call until a restorer brought it back
    FreePendingLocked(s);
    if (s.kept != 0 && s.binding != nullptr) {
      uint32_t gen = s.binding->region.HostReclaimGen();
      // Another process is short of host-tier budget (and still is: others may have freed enough).
      if (gen != s.reclaim_seen) {
        s.reclaim_seen = gen;
        if (s.binding->region.HostReclaimStillShort()) {
          const uint64_t kept = s.kept;
          FreeKeptLocked(s);
          // The requester reserves the freed budget on its next look: pinning ahead again before
          // then would take it back (the request is acted on once), so wait as long as it waits.
          s.pin_ahead_next_ns = Now() + kBudgetWaitNs;
          GuestLog("vGPU '%s': freed %llu MiB of kept host copies: another tenant needs the host tier",
                   s.binding->vgpu_id, static_cast<unsigned long long>(kept >> 20));
        }
      }
    }
    int64_t now = Now();
    if (g_tier_touched.exchange(0, std::memory_order_relaxed) != 0 ||
        g_tier_inflight.load(std::memory_order_relaxed) != 0) {
      s.last_active_ns = now;
    }
    Binding* b = Bound();
    if (b == nullptr) continue;
    VgpuTier* v = b->region.TierOfVgpu(b->vgpu);
    ProcessTier* t = b->region.TierOfProcess(b->slot);
    uint32_t freeze = v->freeze_gen.load(std::memory_order_acquire);
    uint32_t thaw = v->thaw_gen.load(std::memory_order_acquire);
    // A stream capture in progress: the drain and copies of a swap-out are calls a capture in
    // global mode forbids from any thread (they would invalidate it). Requests wait for its end.
    const bool capturing = g_tier_captures.load(std::memory_order_acquire) > 0;
    if (freeze != s.freeze_done && !capturing) {
      // Another tenant short of VRAM asked for one of the requests acted on now.
      const uint32_t pressure = v->pressure_freeze_gen.load(std::memory_order_acquire);
      const bool by_pressure = Reached(freeze, pressure) && !Reached(s.freeze_done, pressure);
      SwapOutLocked(s, by_pressure ? kTierCausePressure : kTierCauseFreeze);
      s.freeze_done = freeze;
      t->freeze_done_gen.store(freeze, std::memory_order_release);
    }
    // Preemption: a held vGPU stays swapped out; a thaw waits for the hold's end.
    const bool held = v->held.load(std::memory_order_acquire) != 0;
    if (held && !capturing && s.state == kTierResident && now >= s.hold_retry_ns) {
      if (SwapOutLocked(s, kTierCausePreemption) != CUDA_SUCCESS) s.hold_retry_ns = now + 1'000'000'000;
    }
    if (thaw != s.thaw_done && !held) {
      if (IsSwapped(s.state)) SwapInLocked(s, kTierCauseThaw);
      s.thaw_done = thaw;
      t->thaw_done_gen.store(thaw, std::memory_order_release);
    }
    if (!held && !capturing && s.state == kTierResident) {
      PinAheadLocked(s, now);
      if (now >= s.graph_next_ns) {  // graph launches grow the driver's graph memory: follow it
        s.graph_next_ns = now + kGraphReadNs;
        ReadGraphMemoryLocked(s, false);
      }
      now = Now();
    }
    uint64_t disk_ms = v->idle_disk_ms.load(std::memory_order_relaxed);
    if (disk_ms > 0 && s.state == kTierSwapped && now - s.last_active_ns >= static_cast<int64_t>(disk_ms) * 1'000'000 &&
        now - s.disk_attempt_ns >= static_cast<int64_t>(disk_ms) * 1'000'000) {
      s.disk_attempt_ns = now;  // a failed move waits another period
      ToDiskLocked(s);
    }
    uint64_t idle_ms = v->idle_swap_ms.load(std::memory_order_relaxed);
    const double prepare = KeepHostCopies() ? PrepareFraction() : 0.0;
    if (idle_ms > 0 && prepare > 0 && s.state == kTierResident && s.prepared_for_ns != s.last_active_ns &&
        now - s.last_active_ns >= static_cast<int64_t>(prepare * static_cast<double>(idle_ms) * 1e6)) {
      s.prepared_for_ns = s.last_active_ns;  // once per idle period, whatever the outcome
      PrepareLocked(s, PrepareFor::kIdle);
      now = Now();
      if (g_tier_touched.load(std::memory_order_relaxed) != 0) continue;  // woke up meanwhile
    }
    if (idle_ms > 0 && !capturing && s.state == kTierResident && now - s.last_active_ns >= static_cast<int64_t>(idle_ms) * 1'000'000) {
      // A failed attempt waits for another idle period rather than retrying every tick.
      if (SwapOutLocked(s, kTierCauseIdle) != CUDA_SUCCESS) s.last_active_ns = now;
    }
    Publish(s);
  }
  pthread_mutex_unlock(&s.mu);
  return nullptr;
}

// REQUIRES s.mu.
void StartThreadLocked(State& s) {
  if (s.thread_started) return;
  Binding* b = Bound();
  if (b == nullptr) return;
  VgpuTier* v = b->region.TierOfVgpu(b->vgpu);
  ProcessTier* t = b->region.TierOfProcess(b->slot);
  // Requests made before this process started are not addressed to it.
  s.freeze_done = v->freeze_gen.load(std::memory_order_acquire);
  s.thaw_done = v->thaw_gen.load(std::memory_order_acquire);
  t->freeze_done_gen.store(s.freeze_done, std::memory_order_release);
  t->thaw_done_gen.store(s.thaw_done, std::memory_order_release);
  s.last_active_ns = Now();
  s.reclaim_seen = b->region.HostReclaimGen();
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_JOINABLE);
  if (pthread_create(&s.thread, &attr, &TierThread, nullptr) == 0) s.thread_started = true;
  pthread_attr_destroy(&attr);
}

}  // namespace

Tiering& Tiering::Instance() {
  static Tiering t;
  return t;
}

void Tiering::Configure(Binding* b) {
  if (b == nullptr) return;
  VgpuTier* v = b->region.TierOfVgpu(b->vgpu);
  if (v == nullptr || v->enabled.load(std::memory_order_acquire) == 0) return;
  const auto& d = g_real;
  if (!d.cuMemCreate || !d.cuMemMap || !d.cuMemUnmap || !d.cuMemSetAccess || !d.cuMemAddressReserve ||
      !d.cuMemAddressFree || !d.cuMemRelease || !d.cuMemHostRegister_v2 || !d.cuMemHostUnregister ||
      !d.cuMemcpyDtoHAsync_v2 || !d.cuMemcpyHtoDAsync_v2 || !d.cuCtxPushCurrent_v2 ||
      !d.cuCtxPopCurrent_v2 || !d.cuStreamCreate || !d.cuStreamDestroy_v2 || !d.cuCtxGetDevice) {
    GuestLog("vGPU '%s': the driver lacks virtual memory management: VRAM tiering is off", b->vgpu_id);
    return;
  }
  S().binding = b;
  g_tiering = true;
  if (const char* dir = getenv("TFUSION_TIER_DIR"); dir != nullptr && *dir) {
    if (strlen(dir) < sizeof(g_tier_dir) && access(dir, W_OK) == 0) {
      snprintf(g_tier_dir, sizeof(g_tier_dir), "%s", dir);
    } else {
      GuestLog("vGPU '%s': TFUSION_TIER_DIR=%s is not a writable folder: no disk tier", b->vgpu_id, dir);
    }
  }
}

CUresult Tiering::Allocate(CUdeviceptr* dptr, size_t bytes, size_t* mapped) {
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (Held(S())) {  // new VRAM while suspended would take the preemptor's
    pthread_mutex_lock(&S().mu);
    CUresult held = WaitWhileHeldLocked(S());
    pthread_mutex_unlock(&S().mu);
    if (held != CUDA_SUCCESS) return held;
  }
  const auto& d = g_real;
  Range r;
  CUresult e = d.cuCtxGetCurrent(&r.ctx);
  if (e != CUDA_SUCCESS) return e;
  if (r.ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  CUdevice dev = 0;
  e = d.cuCtxGetDevice(&dev);
  if (e != CUDA_SUCCESS) return e;
  r.device = dev;
  size_t g = Granularity(dev);
  if (bytes > SIZE_MAX - g) return CUDA_ERROR_OUT_OF_MEMORY;
  r.size = (bytes + g - 1) / g * g;
  CUdeviceptr base = 0;
  e = d.cuMemAddressReserve(&base, r.size, 0, 0, 0);
  if (e != CUDA_SUCCESS) return e;
  e = MapPhysicalEvicting(S().binding, base, &r);
  if (e != CUDA_SUCCESS) {
    d.cuMemAddressFree(base, r.size);
    return e;
  }
  State& s = S();
  pthread_mutex_lock(&s.mu);
  s.ranges[base] = r;
  s.movable += r.size;
  StartThreadLocked(s);
  Publish(s);
  pthread_mutex_unlock(&s.mu);
  *dptr = base;
  if (mapped != nullptr) *mapped = r.size;
  return CUDA_SUCCESS;
}

namespace {
// REQUIRES s.mu. `r`, taken out of the table, is gone: its host, kept and disk copies go with their
// budget, and the process is resident again when it was its last swapped range.
void ForgetCopiesLocked(State& s, Range* r) {
  if (r->host != nullptr) {
    if (r->budgeted) {
      s.host -= r->size;
      Publish(s);  // host_bytes down before the release: a death in between leaks, never doubles
      s.binding->region.ReleaseHostTier(r->size);
    }
    FreeHostCopy(r);
  }
  if (r->kept != nullptr) {
    s.kept -= r->size;
    PublishKept(s);
    s.binding->region.ReleaseHostTier(r->size);
    DropKept(r);
  }
  if (r->fd >= 0) {
    close(r->fd);
    r->fd = -1;
    s.disk -= r->size;
  }
  if ((s.state == kTierSwapped || s.state == kTierOnDisk) && s.host == 0 && s.disk == 0) {
    // The last swapped range is gone: nothing left to restore.
    s.state = kTierResident;
    g_tier_blocked.fetch_and(~kBlockedSwap, std::memory_order_seq_cst);
  }
}
}  // namespace

bool Tiering::Free(CUdeviceptr dptr, CUresult* result, bool drain) {
  State& s = S();
  pthread_mutex_lock(&s.mu);
  if (auto x = s.exported.find(dptr); x != s.exported.end()) {
    Range r = x->second;
    s.exported.erase(x);
    CUresult e = drain ? InContext(r.ctx, [] { return g_real.cuCtxSynchronize(); }) : CUDA_SUCCESS;
    // Importers that mapped it keep its physical memory until they close it (VMM semantics).
    IpcExports::Instance().Forget(dptr);
    UnmapPhysical(dptr, &r);
    g_real.cuMemAddressFree(dptr, r.size);
    Publish(s);
    pthread_mutex_unlock(&s.mu);
    *result = e == CUDA_ERROR_INVALID_CONTEXT ? CUDA_SUCCESS : e;
    return true;
  }
  auto it = s.ranges.find(dptr);
  if (it == s.ranges.end() || it->second.tenant) {  // a tenant handle's key is no address
    pthread_mutex_unlock(&s.mu);
    return false;
  }
  Range r = it->second;
  s.ranges.erase(it);
  s.movable -= r.size;
  CUresult e = CUDA_SUCCESS;
  if (r.resident) {
    // As the driver's own free: work already queued that reads the memory completes first.
    if (drain) e = InContext(r.ctx, [] { return g_real.cuCtxSynchronize(); });
    UnmapPhysical(dptr, &r);
  }
  ForgetCopiesLocked(s, &r);
  g_real.cuMemAddressFree(dptr, r.size);
  Publish(s);
  pthread_mutex_unlock(&s.mu);
  *result = e == CUDA_ERROR_INVALID_CONTEXT ? CUDA_SUCCESS : e;
  return true;
}

bool Tiering::ExportIpc(CUipcMemHandle* handle, CUdeviceptr dptr, CUresult* result) {
  // Stream-ordered memory: the driver refuses legacy IPC on a pool's memory (cuMemPoolExportPointer
  // is the way), and so do we for the pools we serve.
  CUmemoryPool pool = nullptr;
  if (StreamOrderedPools::Instance().PoolOf(dptr, &pool)) {
    *result = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  if (handle == nullptr) {
    *result = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  State& s = S();
  pthread_mutex_lock(&s.mu);
  // Exported already: the same export (resident, fixed).
  auto x = s.exported.upper_bound(dptr);
  if (x != s.exported.begin() && dptr < (--x)->first + x->second.size) {
    *result = IpcExports::Instance().Export(x->first, x->second.size, x->second.handle, dptr, handle);
    pthread_mutex_unlock(&s.mu);
    return true;
  }
  auto it = s.ranges.upper_bound(dptr);
  if (it == s.ranges.begin() || (--it)->second.tenant || dptr >= it->first + it->second.size) {
    pthread_mutex_unlock(&s.mu);
    return false;  // not a movable cuMemAlloc range of ours: the driver's answer
  }
  const CUdeviceptr base = it->first;
  // Its physical memory must be there to be shared (the wait for a hold releases the mutex).
  // The driver gives no legacy IPC handle for VMM memory (driver 580 refuses it), which movable
  // ranges are, so the handle is always ours: one path whatever the driver would say.
  CUresult e = WaitWhileHeldLocked(s);
  if (e == CUDA_SUCCESS && IsSwapped(s.state)) e = SwapInLocked(s, kTierCauseCall);
  if (e == CUDA_SUCCESS) {
    it = s.ranges.find(base);
    if (it == s.ranges.end() || !it->second.resident) {
      e = CUDA_ERROR_INVALID_VALUE;  // freed by another thread while this one waited
    } else {
      e = IpcExports::Instance().Export(base, it->second.size, it->second.handle, dptr, handle);
    }
    static std::atomic<bool> told{false};
    if (e != CUDA_SUCCESS && !told.exchange(true)) {
      GuestLog("vGPU '%s': cuIpcGetMemHandle of movable memory -> %d: no handle given",
               s.binding != nullptr ? s.binding->vgpu_id : "?", static_cast<int>(e));
    }
  }
  if (e == CUDA_SUCCESS) {
    Range r = it->second;
    s.ranges.erase(it);
    s.movable -= r.size;
    ForgetCopiesLocked(s, &r);  // a kept copy pinned ahead is of no use any more
    r.seen_ns = 0;
    s.exported[base] = r;
    Publish(s);
    GuestLog("vGPU '%s': %llu MiB of cuMemAlloc memory at 0x%llx stay resident (fixed) from now on: exported with "
             "cuIpcGetMemHandle (another process may map it)", s.binding != nullptr ? s.binding->vgpu_id : "?",
             static_cast<unsigned long long>(r.size >> 20), static_cast<unsigned long long>(base));
  }
  pthread_mutex_unlock(&s.mu);
  *result = e;
  return true;
}

TierLock::TierLock() { pthread_mutex_lock(&S().mu); }
TierLock::~TierLock() { pthread_mutex_unlock(&S().mu); }

CUresult TierResidentLocked() {
  State& s = S();
  CUresult e = WaitWhileHeldLocked(s);
  if (e == CUDA_SUCCESS && IsSwapped(s.state)) e = SwapInLocked(s, kTierCauseCall);
  return e;
}

CUresult TierHeldWaitLocked() { return WaitWhileHeldLocked(S()); }

void TierAddTenantRangeLocked(uint64_t key, size_t size, int device, CUcontext ctx) {
  State& s = S();
  Range r;
  r.size = size;
  r.device = device;
  r.ctx = ctx;
  r.tenant = true;
  s.ranges[key] = r;
  s.movable += size;
  StartThreadLocked(s);
  Publish(s);
}

void TierDropTenantRangeLocked(uint64_t key) {
  State& s = S();
  auto it = s.ranges.find(key);
  if (it == s.ranges.end() || !it->second.tenant) return;
  Range r = it->second;
  s.ranges.erase(it);
  s.movable -= r.size;
  ForgetCopiesLocked(s, &r);
  Publish(s);
}

CUresult RetryWithEviction(CUresult first, const std::function<CUresult()>& allocate) {
  if (first != CUDA_ERROR_OUT_OF_MEMORY) return first;
  Binding* b = Bound();
  if (b == nullptr) return first;
  uint64_t tried = 0;
  if (!EvictOther(b, &tried)) return first;
  return Evicting(b, allocate);
}

CUresult TierWait() {
  State& s = S();
  for (;;) {
    if (Parked()) {
      CUresult w = ZeroWait();
      if (w != CUDA_SUCCESS) return w;
      continue;
    }
    pthread_mutex_lock(&s.mu);
    if (Parked()) {  // parked meanwhile: the swap-in waits for the restore
      pthread_mutex_unlock(&s.mu);
      continue;
    }
    CUresult e = WaitWhileHeldLocked(s);  // preempted: wait until the controller resumes it
    if (e == CUDA_SUCCESS && Parked()) {   // parked while it waited: the restore comes first
      pthread_mutex_unlock(&s.mu);
      continue;
    }
    if (e == CUDA_SUCCESS && IsSwapped(s.state)) e = SwapInLocked(s, kTierCauseCall);
    pthread_mutex_unlock(&s.mu);
    return e;
  }
}

CUresult ZeroWait() {
  State& s = S();
  ProcessZero* z = MyZero();
  if (z == nullptr) {
    g_tier_blocked.fetch_and(~kBlockedParked, std::memory_order_seq_cst);
    return CUDA_SUCCESS;
  }
  uint32_t gen = z->wake_gen.fetch_add(1, std::memory_order_acq_rel) + 1;
  const int64_t until = Now() + ZeroWaitNs();
  long pause_ns = 50'000;
  for (;;) {
    // The restorer writes the state, then wake_done_gen: read them in the other order, so that a
    // wake seen done comes with the state it left (not the checkpointed state read before it).
    const uint32_t done = z->wake_done_gen.load(std::memory_order_acquire);
    uint32_t st = z->state.load(std::memory_order_acquire);
    if (st == kZeroNone) {
      pthread_mutex_lock(&s.mu);
      if (z->state.load(std::memory_order_acquire) == kZeroNone) {
        g_tier_blocked.fetch_and(~kBlockedParked, std::memory_order_seq_cst);
      }
      pthread_mutex_unlock(&s.mu);
      return CUDA_SUCCESS;
    }
    if (st == kZeroCheckpointed && Reached(done, gen)) {
      uint32_t e = z->last_error.load(std::memory_order_relaxed);
      if (e == 0) {  // restored, then checkpointed again before this thread looked: ask again
        gen = z->wake_gen.fetch_add(1, std::memory_order_acq_rel) + 1;
        continue;
      }
      GuestLog("vGPU '%s': the driver could not restore this process (CUDA error %u); it stays checkpointed "
               "and the next call asks again", s.binding != nullptr ? s.binding->vgpu_id : "?", e);
      return static_cast<CUresult>(e);
    }
    if (Now() > until) {
      GuestLog("vGPU '%s': checkpointed and nobody restored it within %.0f s (is tfusion run or the node "
               "agent running?): the call fails", s.binding != nullptr ? s.binding->vgpu_id : "?", ZeroWaitNs() / 1e9);
      return CUDA_ERROR_TIMEOUT;
    }
    timespec pause{0, pause_ns};
    nanosleep(&pause, nullptr);
    if (pause_ns < 2'000'000) pause_ns *= 2;
  }
}

void Tiering::Shutdown() {
  State& s = S();
  pthread_mutex_lock(&s.mu);
  bool started = s.thread_started;
  s.stop = true;
  pthread_cond_broadcast(&s.cv);
  pthread_mutex_unlock(&s.mu);
  if (started && !pthread_equal(pthread_self(), s.thread)) pthread_join(s.thread, nullptr);
  pthread_mutex_lock(&s.mu);
  s.thread_started = false;
  // The process is going away: nothing is unpinned or unmapped (exit releases both). A driver
  // call here could block inside a parked or checkpointed driver, or find per-thread state of the
  // driver or of another library already destroyed (exit runs the main thread's thread_local
  // destructors before atexit handlers). The budget of the kept and pending copies goes back when
  // the process's slot is detached right after this (GpuRegion::FreeProcessSlotLocked), or at the
  // reap.
  pthread_mutex_unlock(&s.mu);
}

void Tiering::ResetAfterFork() {
  // The child has none of the parent's threads or device memory.
  State& s = S();
  pthread_mutex_init(&s.mu, nullptr);
  pthread_cond_init(&s.cv, nullptr);
  for (auto& [base, r] : s.ranges) {
    if (r.fd >= 0) close(r.fd);
  }
  s.ranges.clear();
  s.exported.clear();
  TenantVmm::Instance().ResetAfterFork();
  s.to_free.clear();
  s.movable = s.host = s.disk = s.kept = s.pinning = 0;
  s.state = kTierResident;
  s.thread_started = false;
  s.stop = false;
  g_tier_inflight.store(0);
  g_tier_blocked.store(0);
  g_zero_inflight.store(0);
}

}  // namespace tf::limiter
