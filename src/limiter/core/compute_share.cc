// Shared (concurrent) compute mode: tenants submit at the same time, and each process's governor
// calls ShareTick every few hundred microseconds to charge what its kernels used and to learn
// whether it must hold back.
//
// Accounting. The governor samples whether its process has work queued; a tick with work queued
// is raw busy time. Processes without MPS are time-sliced by the GPU, so each sees the others'
// slices inside its own queued time: a tick's raw time is charged divided by the number of
// processes contending, those with work queued at a tick of theirs within the last kActiveTtlNs
// (about one time slice; a process we hold stops counting at once). A lone tenant is charged
// exactly its busy time; N saturating tenants are charged a wall time each over N; an inference
// tenant pausing between batches for less than a slice does not raise the others' charge.
//
// Two buckets per vGPU (GPU-busy ns): the limit bucket refills at the limit and is charged
// always: empty means "at the ceiling", hold until it is positive again. The request bucket
// refills at the request and is charged only while another vGPU wants the GPU (capacity nobody
// else wants is lent, not owed back); empty means "over what it is owed".
//
// Arbitration (work-conserving): a process holds only when
//  - its vGPU's limit bucket is empty, or
//  - its request bucket is empty and another vGPU that wants the GPU is still within its request
//    (that one is owed: its guarantee comes first), or
//  - its request bucket is empty and a higher-QoS vGPU that wants the GPU is borrowing too.
// Otherwise it submits, concurrently with everyone else.
//
// Faults: nothing here is exclusive. A process killed mid-kernel stops adding raw time (its
// window contribution ends with it) and its activity marks expire after kDemandTtlNs, so it holds
// nobody back for longer than that.
#include <climits>

#include "limiter/core/gpu_region.h"
#include "limiter/core/process_identity.h"
#include "limiter/core/share_bucket.h"

namespace tf::limiter {
namespace {

// A process counts as contending for kActiveTtlNs after its last tick with work in flight: about
// one time slice of the GPU's scheduler, so that a tenant that submits in bursts (inference
// launching small kernels) is counted while the GPU is still switching between it and the others.
constexpr int64_t kActiveTtlNs = 2'000'000;
constexpr int64_t kMaxHoldRetryNs = 20'000'000;

using bucket::BurstNs;
using bucket::ClampShare;
using bucket::RefillAmount;
int64_t NsUntilPositive(int64_t tokens, int64_t ppm) {
  return bucket::NsUntilPositive(tokens, ppm, kMaxHoldRetryNs);
}
void AddCapped(std::atomic<int64_t>* bucket, int64_t add, int64_t cap) {
  int64_t t = bucket->load(std::memory_order_relaxed);
  int64_t nt;
  do {
    nt = t >= cap ? t : (t + add < cap ? t + add : cap);
  } while (!bucket->compare_exchange_weak(t, nt, std::memory_order_relaxed));
}
uint64_t LimitPpm(const VgpuSlot* v) {
  uint64_t req = v->compute_share_ppm.load(std::memory_order_relaxed);
  uint64_t lim = v->compute_limit_ppm.load(std::memory_order_relaxed);
  return lim > req ? lim : req;
}

}  // namespace

const char* ShareHoldName(ShareHold h) {
  switch (h) {
    case ShareHold::kRun: return "run";
    case ShareHold::kAtLimit: return "at_limit";
    case ShareHold::kOwedElsewhere: return "owed_elsewhere";
    case ShareHold::kHigherQos: return "higher_qos";
  }
  return "unknown";
}

uint32_t GpuRegion::ActiveProcesses(uint32_t self, int64_t now_ns, uint64_t* vgpus_in_flight) const {
  uint32_t k = 1;
  uint64_t mask = 0;
  for (uint32_t i = 0; i < kMaxProcesses; ++i) {
    if (i == self) continue;
    const ProcessSlot* p = process(i);
    if (p->state.load(std::memory_order_acquire) != kSlotActive) continue;
    if (p->active_until_ns.load(std::memory_order_relaxed) > now_ns) {
      ++k;
      uint32_t v = p->vgpu_index.load(std::memory_order_relaxed);
      if (v < kMaxVgpus) mask |= 1ULL << v;
    }
  }
  *vgpus_in_flight = mask;
  return k;
}

ShareVerdict GpuRegion::ShareTick(uint32_t slot, int64_t now_ns, int64_t tick_ns, int64_t raw_busy_ns,
                                  bool in_flight, bool held) {
  ShareVerdict out;
  if (!ValidActiveProcess(slot) || tick_ns < 0 || raw_busy_ns < 0) {
    out.error = RegionError::kInvalidArgument;
    return out;
  }
  ProcessSlot* p = process(slot);
  const uint32_t mine = p->vgpu_index.load(std::memory_order_relaxed);
  VgpuSlot* v = vgpu(mine);
  const int64_t req = ClampShare(v->compute_share_ppm.load(std::memory_order_relaxed));
  const int64_t lim = ClampShare(LimitPpm(v));
  const uint32_t my_qos = v->qos.load(std::memory_order_relaxed);

  // Contention: the processes with work in flight at their last tick (this one included when it
  // has some now) are time-sliced by the GPU, so this tick's raw time is charged / their number.
  // (A process we hold is not contending: its mark goes at once.)
  if (in_flight) p->active_until_ns.store(now_ns + kActiveTtlNs, std::memory_order_relaxed);
  else if (held) p->active_until_ns.store(0, std::memory_order_relaxed);
  uint64_t in_flight_mask = 0;
  const uint32_t k = ActiveProcesses(slot, now_ns, &in_flight_mask);
  out.scale_ppm = kShareWholeGpuPpm / k;
  out.charged_ns = raw_busy_ns / k;
  share()->scale_ppm.store(out.scale_ppm, std::memory_order_relaxed);
  share()->active_processes.store(in_flight ? k : k - 1, std::memory_order_relaxed);
  share()->ticks_total.fetch_add(1, std::memory_order_relaxed);

  // Refill both buckets for [last_refill, now): whoever moves last_refill_ns owns that interval.
  int64_t last = v->last_refill_ns.load(std::memory_order_acquire);
  while (now_ns > last) {
    if (v->last_refill_ns.compare_exchange_weak(last, now_ns, std::memory_order_acq_rel)) {
      AddCapped(&v->tokens_ns, RefillAmount(lim, now_ns - last), BurstNs(lim));
      AddCapped(&v->request_tokens_ns, RefillAmount(req, now_ns - last), BurstNs(req));
      break;
    }
  }

  // Who else wants the GPU now, and is any of them owed or of higher QoS?
  bool others_want = false, owed_elsewhere = false, higher_qos_borrowing = false;
  for (uint32_t i = 0; i < kMaxVgpus; ++i) {
    if (i == mine) continue;
    const VgpuSlot* u = vgpu(i);
    if (u->state.load(std::memory_order_acquire) != kSlotActive) continue;
    int64_t demand = u->last_demand_ns.load(std::memory_order_relaxed);
    if (demand == 0 || now_ns - demand > kDemandTtlNs) continue;
    others_want = true;
    int64_t u_req = ClampShare(u->compute_share_ppm.load(std::memory_order_relaxed));
    int64_t u_lim = ClampShare(LimitPpm(u));
    int64_t u_last = u->last_refill_ns.load(std::memory_order_relaxed);
    int64_t gap = now_ns > u_last ? now_ns - u_last : 0;
    int64_t u_rt = u->request_tokens_ns.load(std::memory_order_relaxed) + RefillAmount(u_req, gap);
    int64_t u_lt = u->tokens_ns.load(std::memory_order_relaxed) + RefillAmount(u_lim, gap);
    bool u_can_run = u_lim >= static_cast<int64_t>(kShareWholeGpuPpm) || u_lt > 0;
    if (!u_can_run) continue;  // at its own ceiling: it cannot use what we would leave
    // Owed only while it has work queued now: what it leaves between its kernels is lent.
    if (u_rt > 0 && (in_flight_mask >> i) & 1) owed_elsewhere = true;
    else if (u->qos.load(std::memory_order_relaxed) > my_qos) higher_qos_borrowing = true;
  }

  if (out.charged_ns > 0) {
    v->tokens_ns.fetch_sub(out.charged_ns, std::memory_order_relaxed);
    if (others_want) {
      // Debt is bounded at one burst: a tenant over its request is held until it repays that.
      int64_t t = v->request_tokens_ns.load(std::memory_order_relaxed);
      int64_t floor = -BurstNs(req);
      int64_t nt;
      do {
        nt = t - out.charged_ns < floor ? floor : t - out.charged_ns;
      } while (!v->request_tokens_ns.compare_exchange_weak(t, nt, std::memory_order_relaxed));
    } else {
      // Alone: borrowing idle capacity is not debt, the bucket only empties.
      int64_t t = v->request_tokens_ns.load(std::memory_order_relaxed);
      while (t > 0 && !v->request_tokens_ns.compare_exchange_weak(
                          t, t > out.charged_ns ? t - out.charged_ns : 0, std::memory_order_relaxed)) {
      }
    }
    v->busy_ns_total.fetch_add(static_cast<uint64_t>(out.charged_ns), std::memory_order_relaxed);
  }
  if (held && tick_ns > 0) {
    p->throttled_ns.fetch_add(static_cast<uint64_t>(tick_ns), std::memory_order_relaxed);
    v->throttled_ns_total.fetch_add(static_cast<uint64_t>(tick_ns), std::memory_order_relaxed);
  }
  if (in_flight || raw_busy_ns > 0 || held) v->last_demand_ns.store(now_ns, std::memory_order_relaxed);

  const int64_t lt = v->tokens_ns.load(std::memory_order_relaxed);
  const int64_t rt = v->request_tokens_ns.load(std::memory_order_relaxed);
  if (lim < static_cast<int64_t>(kShareWholeGpuPpm) && lt <= 0) {
    out.hold = ShareHold::kAtLimit;
    out.retry_after_ns = NsUntilPositive(lt, lim);
  } else if (req < static_cast<int64_t>(kShareWholeGpuPpm) && rt <= 0 && owed_elsewhere) {
    out.hold = ShareHold::kOwedElsewhere;
    out.retry_after_ns = NsUntilPositive(rt, req);
  } else if (req < static_cast<int64_t>(kShareWholeGpuPpm) && rt <= 0 && higher_qos_borrowing) {
    out.hold = ShareHold::kHigherQos;
    out.retry_after_ns = kDemandTtlNs;
  }
  if (out.hold != ShareHold::kRun && !held) v->leases_total.fetch_add(1, std::memory_order_relaxed);
  return out;
}

void GpuRegion::ShareIdle(uint32_t slot) {
  if (ValidActiveProcess(slot)) process(slot)->active_until_ns.store(0, std::memory_order_relaxed);
}

}  // namespace tf::limiter
