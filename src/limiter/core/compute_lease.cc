// The compute lease: time-slice arbitration of one physical GPU between throttled vGPUs.
//
// Only the process holding the lease submits kernels while any throttled vGPU is active, so the
// GPU time measured with events during a lease belongs to that process alone. Each vGPU has a
// token bucket of GPU-busy nanoseconds refilled at share x wall time (lock-free, from any of its
// processes); a lease is granted only while the bucket is positive, and its measured busy time is
// debited on release (debt carries over). Unthrottled vGPUs (share >= 100%) never touch it.
//
// Fairness rule (handoff): on release, the releaser picks, among processes waiting in
// WaitForLease whose vGPU has tokens, the one that has waited longest, and publishes it in
// `handoff` with a 200 us expiry before freeing the word. Until the hint expires, TryAcquireLease
// denies everyone but the target. So a releaser cannot immediately re-take the lease from an
// eligible waiter, and eligible waiters are served in order of waiting time; the cost of a target
// that has gone away is at most 200 us of idle lease.
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <bit>
#include <climits>

#include "limiter/core/gpu_region.h"
#include "limiter/core/process_identity.h"
#include "limiter/core/share_bucket.h"

namespace tf::limiter {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the futex word is the low half of LeaseBlock::word");

constexpr int64_t kStealOverdueMs = 1'000;            // steal from a live holder this late
constexpr int64_t kHandoffHoldNs = 200'000;           // fairness hint lifetime
constexpr int64_t kOverdueRecheckNs = 1'000'000;      // waiters re-check a late holder every 1 ms
constexpr uint64_t kDeadlineMask = (1ULL << 22) - 1;
constexpr uint64_t kHandoffExpiryMask = (1ULL << 48) - 1;

uint32_t OwnerOf(uint64_t w) { return static_cast<uint32_t>(w >> 54); }
uint32_t GenOf(uint64_t w) { return static_cast<uint32_t>(w); }
uint64_t DeadlineMsOf(uint64_t w) { return (w >> 32) & kDeadlineMask; }
uint64_t MakeWord(uint32_t owner_plus1, int64_t deadline_ns, uint32_t gen) {
  uint64_t ms = owner_plus1 == 0 ? 0 : (static_cast<uint64_t>(deadline_ns) / 1'000'000) & kDeadlineMask;
  return (static_cast<uint64_t>(owner_plus1) << 54) | (ms << 32) | gen;
}
// now - deadline in ms, from the 22-bit wrapped deadline (exact for |difference| < ~35 min).
int64_t OverdueMs(uint64_t w, int64_t now_ns) {
  uint64_t now_ms = (static_cast<uint64_t>(now_ns) / 1'000'000) & kDeadlineMask;
  uint64_t d = (now_ms - DeadlineMsOf(w)) & kDeadlineMask;
  return d < (1ULL << 21) ? static_cast<int64_t>(d) : static_cast<int64_t>(d) - (1LL << 22);
}

uint32_t HandoffTarget(uint64_t h) { return static_cast<uint32_t>(h >> 48); }
int64_t HandoffExpiryNs(uint64_t h) { return static_cast<int64_t>(h & kHandoffExpiryMask) * 1000; }
uint64_t MakeHandoff(uint32_t target_plus1, int64_t expiry_ns) {
  return (static_cast<uint64_t>(target_plus1) << 48) |
         (static_cast<uint64_t>(expiry_ns / 1000) & kHandoffExpiryMask);
}

using bucket::BurstNs;
using bucket::ClampShare;
using bucket::ElapsedNs;
using bucket::RefillAmount;
using bucket::SaneTokens;
// Nanoseconds of wall time until a bucket at `tokens` (<= 0) is positive again.
int64_t NsUntilPositive(int64_t tokens, int64_t share_ppm) {
  return bucket::NsUntilPositive(tokens, share_ppm, INT64_MAX / 2);
}

uint32_t* FutexWord(std::atomic<uint64_t>* w) { return reinterpret_cast<uint32_t*>(w); }

void FutexWait(std::atomic<uint64_t>* w, uint32_t expected_gen, int64_t timeout_ns) {
  timespec ts{static_cast<time_t>(timeout_ns / 1'000'000'000), static_cast<long>(timeout_ns % 1'000'000'000)};
  // Shared (not FUTEX_PRIVATE_FLAG): waiters and wakers are different processes.
  syscall(SYS_futex, FutexWord(w), FUTEX_WAIT, expected_gen, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint64_t>* w) {
  syscall(SYS_futex, FutexWord(w), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

int64_t GpuRegion::RefillTokens(VgpuSlot* v, int64_t now_ns) {
  int64_t share = ClampShare(v->compute_share_ppm.load(std::memory_order_relaxed));
  int64_t burst = BurstNs(share);
  int64_t last = v->last_refill_ns.load(std::memory_order_acquire);
  while (now_ns > last) {
    // Whoever moves last_refill_ns forward owns the refill of [last, now): no time is credited twice.
    if (v->last_refill_ns.compare_exchange_weak(last, now_ns, std::memory_order_acq_rel)) {
      int64_t add = RefillAmount(share, ElapsedNs(now_ns, last));
      int64_t t = v->tokens_ns.load(std::memory_order_relaxed);
      int64_t nt;
      do {
        nt = t < burst - add ? t + add : burst;  // t + add < burst, without overflow whatever t holds
      } while (!v->tokens_ns.compare_exchange_weak(t, nt, std::memory_order_relaxed));
      break;
    }
  }
  return v->tokens_ns.load(std::memory_order_relaxed);
}

LeaseGrant GpuRegion::TryAcquireLease(uint32_t slot, int64_t now_ns, int64_t quantum_ns) {
  LeaseGrant g;
  uint32_t vi = 0;
  if (!ValidActiveProcess(slot, &vi) || quantum_ns <= 0) {
    g.denial = LeaseDenial::kError;
    g.error = RegionError::kInvalidArgument;
    return g;
  }
  ProcessSlot* p = process(slot);
  VgpuSlot* v = vgpu(vi);
  uint64_t share_ppm = v->compute_share_ppm.load(std::memory_order_relaxed);
  if (share_ppm >= kShareWholeGpuPpm) {
    g.granted = true;
    g.unthrottled = true;
    g.deadline_ns = kNoDeadline;
    return g;
  }
  int64_t tokens = RefillTokens(v, now_ns);
  if (tokens <= 0) {
    g.denial = LeaseDenial::kNoTokens;
    g.retry_after_ns = NsUntilPositive(tokens, ClampShare(share_ppm));
    return g;
  }
  LeaseBlock* l = lease();
  const uint32_t me = slot + 1;
  uint64_t w = l->word.load(std::memory_order_acquire);
  uint32_t owner = OwnerOf(w);
  if (owner == me) {  // already ours (a repeated call)
    g.granted = true;
    g.deadline_ns = l->lease_deadline_ns.load(std::memory_order_relaxed);
    return g;
  }
  uint64_t h = 0;
  if (owner == 0) {
    // The releaser stores the hint before freeing the word, so it is visible here.
    h = l->handoff.load(std::memory_order_acquire);
    if (h != 0) {
      int64_t expiry = HandoffExpiryNs(h);
      if (now_ns < expiry && HandoffTarget(h) != me) {
        g.denial = LeaseDenial::kHandoff;
        g.retry_after_ns = expiry - now_ns;
        return g;
      }
    }
  } else {
    int64_t overdue = OverdueMs(w, now_ns);
    bool steal = false;
    if (overdue > kStealOverdueMs || owner > kMaxProcesses) {
      // Far overdue, or an owner that is no process slot (a scribbled word: 10 bits hold up to
      // 1023) and so no holder at all.
      steal = true;
    } else if (overdue > 0) {  // late: is the holder still alive? (a /proc read, rare)
      const ProcessSlot* hp = process(owner - 1);
      steal = hp->state.load(std::memory_order_acquire) != kSlotActive ||
              !ProcessAlive(hp->pid.load(std::memory_order_relaxed),
                            hp->start_time_ticks.load(std::memory_order_relaxed));
    }
    if (!steal) {
      g.denial = LeaseDenial::kHeld;
      int64_t left = -overdue * 1'000'000;
      g.retry_after_ns = left > 0 ? left : 0;
      return g;
    }
  }
  // A steal bumps the generation: it wakes waiters and makes the old holder's release fail.
  uint64_t nw = MakeWord(me, now_ns + quantum_ns, owner == 0 ? GenOf(w) : GenOf(w) + 1);
  if (!l->word.compare_exchange_strong(w, nw, std::memory_order_acq_rel)) {
    g.denial = LeaseDenial::kHeld;  // lost a race; the winner's deadline is unknown here
    return g;
  }
  if (owner != 0) {
    l->steals_total.fetch_add(1, std::memory_order_relaxed);
    if (l->waiters.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&l->word);
  }
  if (h != 0) l->handoff.compare_exchange_strong(h, 0, std::memory_order_relaxed);  // consumed or expired
  l->lease_start_ns.store(now_ns, std::memory_order_relaxed);
  l->lease_deadline_ns.store(now_ns + quantum_ns, std::memory_order_relaxed);
  ClearWaiting(p);
  v->leases_total.fetch_add(1, std::memory_order_relaxed);
  g.granted = true;
  g.deadline_ns = now_ns + quantum_ns;
  return g;
}

int32_t GpuRegion::PickHandoffTarget(uint32_t releaser, int64_t now_ns) const {
  int32_t best = -1;
  int64_t best_since = INT64_MAX;
  for (uint32_t i = 0; i < kMaxProcesses; ++i) {
    const ProcessSlot* p = process(i);
    if (i == releaser || p->state.load(std::memory_order_acquire) != kSlotActive) continue;
    int64_t since = p->wait_since_ns.load(std::memory_order_relaxed);
    if (since == 0 || since >= best_since) continue;
    // Loaded once and checked: a slot's index is written by a tenant (the region is world-writable)
    // and one out of range would address memory outside the vGPU array. Such a slot is no waiter.
    const uint32_t vi = p->vgpu_index.load(std::memory_order_relaxed);
    if (vi >= kMaxVgpus) continue;
    const VgpuSlot* v = vgpu(vi);
    int64_t share = ClampShare(v->compute_share_ppm.load(std::memory_order_relaxed));
    int64_t last = v->last_refill_ns.load(std::memory_order_relaxed);
    int64_t tokens = v->tokens_ns.load(std::memory_order_relaxed);
    // Refilled only when empty (all that matters is whether it is positive), so that the sum cannot
    // overflow whatever the bucket's words hold.
    if (tokens <= 0 && now_ns > last) tokens = SaneTokens(tokens) + RefillAmount(share, ElapsedNs(now_ns, last));
    if (tokens <= 0) continue;  // it could not use the lease now anyway
    best = static_cast<int32_t>(i);
    best_since = since;
  }
  return best;
}

LeaseGrant GpuRegion::ExtendLease(uint32_t slot, int64_t now_ns, int64_t quantum_ns,
                                  int64_t provisional_ns) {
  LeaseGrant g;
  uint32_t vi = 0;
  if (!ValidActiveProcess(slot, &vi) || quantum_ns <= 0 || provisional_ns < 0) {
    g.denial = LeaseDenial::kError;
    g.error = RegionError::kInvalidArgument;
    return g;
  }
  LeaseBlock* l = lease();
  const uint32_t me = slot + 1;
  uint64_t w = l->word.load(std::memory_order_acquire);
  if (OwnerOf(w) != me) {
    g.denial = LeaseDenial::kError;
    g.error = RegionError::kNotHolder;
    return g;
  }
  if (l->wanting.load(std::memory_order_relaxed) > 0 && PickHandoffTarget(slot, now_ns) >= 0) {
    g.denial = LeaseDenial::kHandoff;  // someone else can use the GPU: take turns
    return g;
  }
  VgpuSlot* v = vgpu(vi);
  int64_t tokens = RefillTokens(v, now_ns);
  if (tokens <= provisional_ns) {
    g.denial = LeaseDenial::kNoTokens;
    return g;
  }
  uint64_t nw = MakeWord(me, now_ns + quantum_ns, GenOf(w));
  if (!l->word.compare_exchange_strong(w, nw, std::memory_order_acq_rel)) {
    g.denial = LeaseDenial::kError;  // stolen meanwhile
    g.error = RegionError::kNotHolder;
    return g;
  }
  v->tokens_ns.fetch_sub(provisional_ns, std::memory_order_relaxed);
  l->lease_deadline_ns.store(now_ns + quantum_ns, std::memory_order_relaxed);
  g.granted = true;
  g.deadline_ns = now_ns + quantum_ns;
  return g;
}

RegionError GpuRegion::ReleaseLease(uint32_t slot, int64_t measured_busy_ns, int64_t now_ns,
                                    int64_t already_charged_ns) {
  uint32_t vi = 0;
  if (!ValidActiveProcess(slot, &vi)) return RegionError::kInvalidArgument;
  VgpuSlot* v = vgpu(vi);
  if (measured_busy_ns < 0) measured_busy_ns = 0;
  if (already_charged_ns < 0) already_charged_ns = 0;
  v->busy_ns_total.fetch_add(static_cast<uint64_t>(measured_busy_ns), std::memory_order_relaxed);
  if (v->compute_share_ppm.load(std::memory_order_relaxed) >= kShareWholeGpuPpm) return RegionError::kOk;
  v->tokens_ns.fetch_sub(measured_busy_ns - already_charged_ns, std::memory_order_relaxed);
  LeaseBlock* l = lease();
  uint64_t w = l->word.load(std::memory_order_acquire);
  if (OwnerOf(w) != slot + 1) return RegionError::kNotHolder;
  int32_t target = l->wanting.load(std::memory_order_relaxed) > 0 ? PickHandoffTarget(slot, now_ns) : -1;
  if (target >= 0) {
    l->handoff.store(MakeHandoff(static_cast<uint32_t>(target) + 1, now_ns + kHandoffHoldNs),
                     std::memory_order_release);
  }
  l->lease_deadline_ns.store(kNoDeadline, std::memory_order_relaxed);
  if (!l->word.compare_exchange_strong(w, MakeWord(0, 0, GenOf(w) + 1), std::memory_order_seq_cst)) {
    return RegionError::kNotHolder;  // stolen between the load and here
  }
  if (l->waiters.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&l->word);
  return RegionError::kOk;
}

void GpuRegion::FreeLeaseIfHeldBy(uint32_t slot) {
  LeaseBlock* l = lease();
  uint64_t w = l->word.load(std::memory_order_acquire);
  if (OwnerOf(w) != slot + 1) return;
  l->lease_deadline_ns.store(kNoDeadline, std::memory_order_relaxed);
  if (l->word.compare_exchange_strong(w, MakeWord(0, 0, GenOf(w) + 1), std::memory_order_seq_cst) &&
      l->waiters.load(std::memory_order_seq_cst) > 0) {
    FutexWakeAll(&l->word);
  }
}

int64_t GpuRegion::WaitForLease(uint32_t slot, int64_t timeout_ns) {
  uint32_t vi = 0;
  if (!ValidActiveProcess(slot, &vi) || timeout_ns <= 0) return 0;
  ProcessSlot* p = process(slot);
  VgpuSlot* v = vgpu(vi);
  uint64_t share_ppm = v->compute_share_ppm.load(std::memory_order_relaxed);
  if (share_ppm >= kShareWholeGpuPpm) return 0;
  LeaseBlock* l = lease();
  const int64_t start = MonotonicNowNs();
  int64_t expected = 0;
  if (p->wait_since_ns.compare_exchange_strong(expected, start, std::memory_order_relaxed)) {
    l->wanting.fetch_add(1, std::memory_order_relaxed);
  }

  // Announce ourselves before sampling the word: a releaser that frees the word after this
  // sample sees waiters > 0 and wakes us; one that freed it before changed the generation, and
  // FUTEX_WAIT then returns at once.
  l->waiters.fetch_add(1, std::memory_order_seq_cst);
  uint64_t w = l->word.load(std::memory_order_seq_cst);
  int64_t wait = timeout_ns;
  int64_t tokens = RefillTokens(v, start);
  if (tokens <= 0) {
    int64_t until = NsUntilPositive(tokens, ClampShare(share_ppm));
    if (until < wait) wait = until;
  }
  uint32_t owner = OwnerOf(w);
  if (owner != 0 && owner != slot + 1 && owner <= kMaxProcesses) {
    // Until the release; a late holder is re-checked (for stealing) every kOverdueRecheckNs.
    int64_t left = -OverdueMs(w, start) * 1'000'000;
    int64_t until = (left > 0 ? left : 0) + kOverdueRecheckNs;
    if (until < wait) wait = until;
  } else if (tokens > 0) {
    // Free (or ours) and we have tokens: only a handoff hint for someone else keeps us out.
    uint64_t h = l->handoff.load(std::memory_order_acquire);
    int64_t until = h != 0 && HandoffTarget(h) != slot + 1 ? HandoffExpiryNs(h) - start : 0;
    if (until < wait) wait = until;
  }
  if (wait > 0) FutexWait(&l->word, GenOf(w), wait);
  l->waiters.fetch_sub(1, std::memory_order_seq_cst);
  int64_t waited = wait > 0 ? MonotonicNowNs() - start : 0;
  if (waited > 0) {
    p->throttled_ns.fetch_add(static_cast<uint64_t>(waited), std::memory_order_relaxed);
    v->throttled_ns_total.fetch_add(static_cast<uint64_t>(waited), std::memory_order_relaxed);
  }
  return waited;
}

void GpuRegion::ClearWaiting(ProcessSlot* p) {
  if (p->wait_since_ns.load(std::memory_order_relaxed) != 0 &&
      p->wait_since_ns.exchange(0, std::memory_order_relaxed) != 0) {
    lease()->wanting.fetch_sub(1, std::memory_order_relaxed);
  }
}

void GpuRegion::CancelWait(uint32_t slot) {
  if (ValidActiveProcess(slot)) ClearWaiting(process(slot));
}

void GpuRegion::CountLaunches(uint32_t slot, uint64_t n) {
  uint32_t vi = 0;
  if (ValidActiveProcess(slot, &vi)) vgpu(vi)->launches_total.fetch_add(n, std::memory_order_relaxed);
}

}  // namespace tf::limiter
