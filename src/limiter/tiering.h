// VRAM tiering inside a tenant process (local mode): movable device memory that can leave the GPU
// and come back behind the same addresses.
//
// When the vGPU has tiering enabled (VgpuTier::enabled, set by `tfusion run --tiering` or the node
// agent), cuMemAlloc_v2 is served from a reserved address range backed by one physical chunk
// (cuMemAddressReserve + cuMemCreate + cuMemMap + cuMemSetAccess) and recorded in a range table.
// Swap-out: new GPU calls are held at our layer, the calls already inside the driver and the work
// they queued finish, every resident range is copied to pinned host memory (several copies in
// flight on separate streams), then unmapped and its physical chunk released; the addresses stay
// reserved. The first later call that needs the GPU (a launch, copy, memset, graph launch, stream
// memory operation) restores every range to its address, then proceeds. Host-only calls never wake
// the tenant. Requests (freeze/thaw) and the idle timeout come from the region and are acted on by
// one tier thread per process.
//
// Stream-ordered allocations from pools without export handle types are movable ranges too,
// handed out and taken back by StreamOrderedPools (tier_pools.h), and so are the physical
// allocations the tenant makes and maps itself (cuMemCreate: TenantVmm, tier_vmm.h). What does not
// move (memory of pools with an export handle type or imported from another process, exported or
// imported VMM handles, arrays, managed memory, graph memory nodes, module globals, the context
// itself) stays resident and is reported as fixed_bytes. Graph memory is the driver's: a swap-out
// trims what the driver keeps of it unused (cuDeviceGraphMemTrim) and counts what it still
// reserves (live graph allocations) as fixed.
//
// Thread safety: every entry point may be called from any tenant thread. The GPU-call guard is two
// atomics on a shared line; everything else takes the tier mutex.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "tf_driver_api.h"

namespace tf::limiter {

struct Binding;

// Set once at initialisation: this process allocates movable VRAM.
extern bool g_tiering;
// Guard state (fast path): calls currently inside the driver, and whether the process is not
// plainly resident: callers then go through TierWait. g_tier_blocked holds bits:
//   kBlockedSwap    swapping or swapped: calls that need the GPU restore it first;
//   kBlockedParked  scale to zero: a checkpointer asked for (or holds) the driver's checkpoint of
//                   this process, so no call may reach the driver (it would block inside it);
//                   every call waits in ZeroWait until a restorer brought the process back.
inline constexpr uint32_t kBlockedSwap = 1;
inline constexpr uint32_t kBlockedParked = 2;
extern std::atomic<int64_t> g_tier_inflight;
extern std::atomic<uint32_t> g_tier_blocked;
// Scale to zero: calls that do not need the GPU (queries, allocations, synchronization) currently
// inside the driver; the tier thread parks the process only when it is zero.
extern std::atomic<int64_t> g_zero_inflight;
extern std::atomic<uint32_t> g_tier_touched;  // set by every guarded call; the tier thread clears it
extern std::atomic<int32_t> g_tier_captures;  // stream captures in progress (no swap-out meanwhile)

// Waits out a swap-out in progress, waits while the vGPU is held by a preemption
// (VgpuTier::held; TFUSION_TIER_HOLD_TIMEOUT bounds it with CUDA_ERROR_LAUNCH_TIMEOUT), and
// restores the process if it is swapped. CUDA_SUCCESS when the caller may proceed; the restore's
// error otherwise (the swapped copy is kept).
CUresult TierWait();

// The process is parked for (or held by) the driver's checkpoint: asks a restorer to bring it
// back (ProcessZero::wake_gen) and waits, at most 60 s. CUDA_SUCCESS once it runs again; the
// restore's error (the process stays checkpointed) or CUDA_ERROR_TIMEOUT otherwise.
CUresult ZeroWait();

// For the limiter's own threads (compute governor): true when the driver may be called now;
// then ZeroLeave() afterwards. False while the process is parked: skip the driver work.
inline bool ZeroTryEnter() {
  g_zero_inflight.fetch_add(1, std::memory_order_seq_cst);
  if (__builtin_expect((g_tier_blocked.load(std::memory_order_seq_cst) & kBlockedParked) == 0, 1)) return true;
  g_zero_inflight.fetch_sub(1, std::memory_order_release);
  return false;
}
inline void ZeroLeave() { g_zero_inflight.fetch_sub(1, std::memory_order_release); }

// A bound process whose allocation the driver refused for lack of memory (`first` is
// CUDA_ERROR_OUT_OF_MEMORY), tiering or not: freezes colder tiered tenants of the GPU (QoS not
// above its own, never critical) and calls `allocate` again until it succeeds or nobody is left.
// Any other `first` is returned as it is.
CUresult RetryWithEviction(CUresult first, const std::function<CUresult()>& allocate);

// Brackets a call that needs the tenant's memory resident.
template <typename Call>
inline CUresult WithResidentMemory(Call&& call) {
  for (;;) {
    g_tier_inflight.fetch_add(1, std::memory_order_seq_cst);
    if (__builtin_expect(g_tier_blocked.load(std::memory_order_seq_cst) == 0, 1)) break;
    g_tier_inflight.fetch_sub(1, std::memory_order_release);
    CUresult w = TierWait();
    if (w != CUDA_SUCCESS) return w;
  }
  CUresult r = call();
  g_tier_touched.store(1, std::memory_order_relaxed);
  g_tier_inflight.fetch_sub(1, std::memory_order_release);
  return r;
}

// Brackets every other entry point of a tiering process: it never reaches the driver while the
// process is parked for a checkpoint.
template <typename Call>
inline CUresult OutsideCheckpoint(Call&& call) {
  while (!ZeroTryEnter()) {
    CUresult w = ZeroWait();
    if (w != CUDA_SUCCESS) return w;
  }
  CUresult r = call();
  ZeroLeave();
  return r;
}

template <typename Call>
inline CUresult TierGuarded(Call&& call) {
  if (__builtin_expect(!g_tiering, 1)) return call();
  return WithResidentMemory(call);
}

// For TenantVmm (tier_vmm.h): the tier mutex, and the tenant's own VMM handles as ranges of the
// table, keyed by our handle value. REQUIRES: the *Locked functions run under a TierLock.
class TierLock {
 public:
  TierLock();
  ~TierLock();
  TierLock(const TierLock&) = delete;
  TierLock& operator=(const TierLock&) = delete;
};
// Waits out a preemption hold and restores the process if it is swapped (the tier mutex is
// released while it waits). CUDA_SUCCESS when every range is resident.
CUresult TierResidentLocked();
// Waits out a preemption hold only (new VRAM while suspended would take the preemptor's).
CUresult TierHeldWaitLocked();
// A movable tenant handle of `size` bytes on `device`, copied in `ctx`; resident.
void TierAddTenantRangeLocked(uint64_t key, size_t size, int device, CUcontext ctx);
// The handle is gone or can no longer move: its host, kept and disk copies go with their budget.
// Its physical memory is the caller's.
void TierDropTenantRangeLocked(uint64_t key);

class Tiering {
 public:
  static Tiering& Instance();

  // At initialisation, after the binding: enables tiering when the vGPU asks for it.
  void Configure(Binding* b);
  // cuMemAlloc_v2 on a tiering vGPU: a movable range of at least `bytes`; *mapped (if given)
  // receives its size, `bytes` rounded up to the allocation granularity.
  CUresult Allocate(CUdeviceptr* dptr, size_t bytes, size_t* mapped = nullptr);
  // cuMemFree_v2: true when `dptr` is one of ours (then *result is the answer), false otherwise.
  // `drain`: first wait for the work queued in the range's context, as the driver's free does;
  // false when the caller knows that work is done (a stream-ordered free whose event completed).
  bool Free(CUdeviceptr dptr, CUresult* result, bool drain = true);
  // cuIpcGetMemHandle: true when `dptr` lies in one of our movable cuMemAlloc ranges (then
  // *result is the answer). The process is made resident first; the handle is our own
  // (IpcExports, movable_ipc.h: the driver gives none for VMM memory), and an exported range stays
  // resident until freed (another process may map it): it no longer moves and counts as fixed.
  // Memory of the stream-ordered pools we serve is refused (CUDA_ERROR_INVALID_VALUE), as the
  // driver refuses its pools' memory.
  bool ExportIpc(CUipcMemHandle* handle, CUdeviceptr dptr, CUresult* result);
  // At exit: stops the tier thread. After fork: the child holds nothing.
  void Shutdown();
  void ResetAfterFork();

 private:
  Tiering() = default;
};

}  // namespace tf::limiter
