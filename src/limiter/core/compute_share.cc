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
// Turns (saturating tenants). Time slicing between processes costs the GPU the switches: two
// saturating processes together get about 91% of the kernel time one gets alone, and the switching
// time lands on both charges, so an uneven split comes out short for the smaller tenant. A process
// of a hard slice (request = limit) whose work has been queued (or held) at least 95% of the last
// ~10 ms is saturating; saturating vGPUs that contend take turns of ShareTurn::turn_ns (25 ms,
// measured best; TFUSION_SHARE_TURN_MS per process, 0 = off): the one holding the turn submits,
// the others hold (kTurn) while tenants that leave gaps (inference, launch-bound work) keep running
// beside it as before. A burstable vGPU (request < limit) takes turns at its request, paid from its
// request bucket, only while the requests of the vGPUs that want the GPU fill it (nothing left to
// lend: its request is its share); otherwise it counts as one that leaves gaps, so what the
// requests leave is lent by time slicing, higher QoS first.
// While any such tenant wants the GPU nobody takes turns: beside one turn holder instead of all the
// saturating ones it would be charged several times as much and held at its request (it kept 0.39
// of its solo throughput that way on an H200, 0.57 without turns).
// A holder that left the GPU idle more than 5% of a 5 ms window of its turn
// is not saturating after all: it leaves turns for kShareGappyNs. A capped vGPU takes a turn only
// with a turn's worth of tokens, so a small share is not switched in for a sliver. A turn is given
// up when its holder is held by its buckets or stops saturating, and may be taken by anyone once it
// is turn_ns old: a holder that dies stops counting after one turn (or the demand TTL).
// Planned turns (ShareTurn::period_ns, the default) replace the last three rules: a turn is the
// vGPU's share of the period, taken with tokens for most of it, and handed over on time
// (PlannedTurns below).
//
// Turns that do not pay. "Queued 95% of the time" does not mean the process fills the GPU: a
// batch-1 inference process keeps a kernel or two queued all the time, yet several of them run
// side by side on the GPU (four ResNet-50 b1 processes natively deliver 2.6 times what one does
// alone), while a turn charges its holder the whole wall time for a fraction of the GPU (the same
// four at 25% each delivered 0.31 of native with planned turns on an H100). So each saturating
// process checks that turns pay: it adds up its launches and its charge while it saturates beside
// others, with turns applying to it and without, tick by tick (saturation flickers for launch-bound
// work). It first measures
// without turns (a probe of kTurnsPayProbeNs as it starts contending, which stops turns for
// everyone while it wants the GPU; one that saturated less than half of its probe, while others
// wanted the GPU, saturates only now and then, and stays out of turns for kShareGappyNs before it
// probes afresh), then with them, and after kTurnsPayWindowNs with turns (whole
// cycles of its turns with the per-second rule: TurnsPayWindowNs) compares
// its launches per charged GPU ns: work per unit of its share (launches stand for work: the same
// process, the same loop; per charge rather than per second, so that a tenant served more than its
// share without turns does not count that as turns not paying). Doing more than
// kTurnsPayPermille/1000 times as much per charge without turns, it leaves turns for
// kTurnsUnpaidNs (as a gappy holder does), unless the spell's last comparison kept turns and this
// one is narrowly against it (below kTurnsPayConfirmPermille): then it compares once more first.
// Out of turns so, it tries them again only once its work per charge without them falls toward
// what it did with them (StillUnpaid; where the per-second rule below left them, once that rule no
// longer holds either), or kTurnsUnpaidMaxNs after that comparison.
// Otherwise it keeps them and compares again after kTurnsPayRecheckNs (after
// kTurnsPayFirstRecheckNs when a spell's first comparison read far below the switching loss: the
// tenants' start-up may have fallen in its probe). Saturating spin kernels do
// about 0.91 times as much per charge without turns (the switching loss), so they keep them. Per
// charge, a launch-bound holder's idle gaps are not charged, so two batch-1 tenants may keep turns
// that halve what they do per second. So (ShareTurn::turns_per_second, the governor's default;
// TFUSION_SHARE_TURNS_PER_SECOND=0 turns it off) such a tenant also leaves turns when it did a
// little more per charge (kTurnsPayFloorPermille) and clearly more per second
// (kTurnsPayWallPermille) without them.
//
// Faults: nothing here is exclusive. A process killed mid-kernel stops adding raw time (its
// window contribution ends with it) and its activity marks expire after kDemandTtlNs, so it holds
// nobody back for longer than that.
#include <algorithm>
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
constexpr int64_t kBusyAvgWindowNs = 10'000'000;
constexpr int64_t kTurnWindowNs = 5'000'000;
constexpr uint32_t kGappyWindows = 3;
constexpr int64_t kGappyChainNs = 1'000'000'000;
constexpr int64_t kSaturatedPpm = 950'000;
constexpr uint64_t kTurnTimeMask = (1ULL << 56) - 1;

// An active vGPU one of whose processes had work in flight or was held within the demand TTL.
// (demand is compared, not subtracted: any tenant may have written any value into it.)
bool Wanting(const VgpuSlot* u, int64_t now_ns) {
  int64_t demand = u->last_demand_ns.load(std::memory_order_relaxed);
  return u->state.load(std::memory_order_acquire) == kSlotActive && demand != 0 && demand >= now_ns - kDemandTtlNs;
}

uint64_t TurnWord(uint32_t vgpu, int64_t now_ns) {
  return (static_cast<uint64_t>(vgpu + 1) << 56) | ((static_cast<uint64_t>(now_ns) >> 10) & kTurnTimeMask);
}
// How long ago the turn in `word` was taken, saturated (bucket::ElapsedNs). Any tenant may have
// written the word: a time more than kMaxRefillGapNs ahead of ours is no time of this boot and
// counts as a turn long over.
int64_t TurnAgeNs(uint64_t word, int64_t now_ns) {
  const int64_t age = bucket::ElapsedNs(now_ns, static_cast<int64_t>((word & kTurnTimeMask) << 10));
  return age > -bucket::kMaxRefillGapNs ? age : bucket::kMaxRefillGapNs;
}

using bucket::BurstNs;
using bucket::ClampShare;
using bucket::ElapsedNs;
using bucket::RefillAmount;
using bucket::SaneTokens;
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

// The bucket a vGPU's turns are paid from, and its rate: a hard slice's limit bucket at its limit;
// a burstable vGPU's (request < limit) request bucket at its request, which is what it is owed
// while others contend (its limit only bounds what it borrows while nobody else wants the GPU).
struct TurnBucket {
  const std::atomic<int64_t>* tokens;
  int64_t ppm;
};
TurnBucket TurnBucketOf(const VgpuSlot* u) {
  const int64_t req = ClampShare(u->compute_share_ppm.load(std::memory_order_relaxed));
  const int64_t lim = ClampShare(LimitPpm(u));
  if (req < lim) return {&u->request_tokens_ns, req};
  return {&u->tokens_ns, lim};
}

// Planned turns. A vGPU at `ppm` runs max(turn_ns, ppm x period_ns) per turn.
int64_t TurnLengthNs(const ShareTurn& t, int64_t ppm) {
  if (t.period_ns <= 0) return t.turn_ns;
  const int64_t l = ppm * t.period_ns / 1'000'000;
  return l > t.turn_ns ? l : t.turn_ns;
}
// What a whole turn costs a capped vGPU's bucket (it refills at its share while it runs). Its
// buckets may hold this much while it saturates, beyond their usual burst: tokens saved while it
// waits for the others' turns (held by them, not by its own limit).
int64_t TurnSpendNs(const ShareTurn& t, int64_t ppm) {
  if (ppm >= static_cast<int64_t>(kShareWholeGpuPpm)) return 0;
  return TurnLengthNs(t, ppm) * (static_cast<int64_t>(kShareWholeGpuPpm) - ppm) / 1'000'000;
}
// It takes a turn with 90% of that: the slack lets a holder's bucket run dry just as the next one
// is ready, so that the turns are bounded by the buckets and nobody waits with the GPU idle.
int64_t TurnNeedNs(const ShareTurn& t, int64_t ppm) { return TurnSpendNs(t, ppm) * 9 / 10; }
// A saturating vGPU's turn bucket now, counting the refill since its last tick (capped as its
// own ticks cap it, with this process's view of planned turns).
int64_t TurnTokensNow(const VgpuSlot* u, int64_t now_ns, const ShareTurn& t) {
  const TurnBucket b = TurnBucketOf(u);
  const int64_t lim = b.ppm;
  const int64_t last = u->last_refill_ns.load(std::memory_order_relaxed);
  const int64_t stored = SaneTokens(b.tokens->load(std::memory_order_relaxed));
  int64_t cap = std::max(BurstNs(lim), TurnSpendNs(t, lim));
  if (stored > cap) cap = stored;
  return std::min(cap, stored + RefillAmount(lim, now_ns > last ? ElapsedNs(now_ns, last) : 0));
}
// The turn holder's turn bucket now: it has been running alone since its last tick (which
// charged and refilled it), so it spends net (1 - share) of the time since.
int64_t HolderTokensNow(const VgpuSlot* h, int64_t now_ns) {
  const TurnBucket b = TurnBucketOf(h);
  const int64_t last = h->last_refill_ns.load(std::memory_order_relaxed);
  const int64_t gap = now_ns > last ? std::min<int64_t>(ElapsedNs(now_ns, last), 1'000'000'000) : 0;
  return SaneTokens(b.tokens->load(std::memory_order_relaxed)) -
         gap * (static_cast<int64_t>(kShareWholeGpuPpm) - b.ppm) / 1'000'000;
}
// How long a capped vGPU running alone takes to empty a bucket at `tokens`.
int64_t DryInNs(int64_t tokens, int64_t ppm) {
  if (tokens <= 0) return 0;
  if (ppm >= static_cast<int64_t>(kShareWholeGpuPpm)) return INT64_MAX / 4;
  return static_cast<int64_t>(static_cast<__int128>(tokens) * 1'000'000 / (1'000'000 - ppm));
}
void ClampDown(std::atomic<int64_t>* bucket, int64_t cap) {
  int64_t t = bucket->load(std::memory_order_relaxed);
  while (t > cap && !bucket->compare_exchange_weak(t, cap, std::memory_order_relaxed)) {
  }
}

}  // namespace

const char* ShareHoldName(ShareHold h) {
  switch (h) {
    case ShareHold::kRun: return "run";
    case ShareHold::kAtLimit: return "at_limit";
    case ShareHold::kOwedElsewhere: return "owed_elsewhere";
    case ShareHold::kHigherQos: return "higher_qos";
    case ShareHold::kTurn: return "turn";
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
                                  bool in_flight, bool held, ShareTurn* turn) {
  ShareVerdict out;
  uint32_t mine = 0;
  if (!ValidActiveProcess(slot, &mine) || tick_ns < 0 || raw_busy_ns < 0) {
    out.error = RegionError::kInvalidArgument;
    return out;
  }
  ProcessSlot* p = process(slot);
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
  // With planned turns a saturating hard slice may save up to a whole turn's cost while it waits
  // for the others' turns; once it stops saturating its buckets go back to the usual burst.
  // (A burstable vGPU's turns are paid from its request bucket: only that one may save more.)
  const bool burstable = req < lim;
  int64_t cap_l = BurstNs(lim), cap_r = BurstNs(req);
  // With a limit window (TFUSION_SHARE_LIMIT_WINDOW_MS), a capped vGPU out of turns (not
  // saturating, out of turns that did not pay, or turns off) may save its share of that window:
  // beside tenants that leave gaps its charge rises whenever they pause (it is charged alone then),
  // and it is held for exceeding its share over the window rather than over 100 ms.
  const bool window = turn != nullptr && turn->limit_window_ns > 0 && lim < static_cast<int64_t>(kShareWholeGpuPpm);
  const bool in_turns = turn != nullptr && turn->turn_ns > 0 && turn->saturating;
  if (window && !in_turns) cap_l = std::max(cap_l, lim * (turn->limit_window_ns / 1'000'000));
  if (turn != nullptr && turn->turn_ns > 0 && turn->period_ns > 0) {
    // Out of turns for a probe, it keeps what it saved for its next turn: the probe is over
    // within a period, and then it takes its turn as it would have.
    if (turn->saturating || now_ns < turn->probe_until_ns) {
      if (!burstable) cap_l = std::max(cap_l, TurnSpendNs(*turn, lim));
      cap_r = std::max(cap_r, TurnSpendNs(*turn, req));
    } else {
      ClampDown(&v->tokens_ns, cap_l);
      ClampDown(&v->request_tokens_ns, cap_r);
    }
  }
  if (window && in_turns) ClampDown(&v->tokens_ns, cap_l);  // what it saved out of turns, fixed turns too
  int64_t last = v->last_refill_ns.load(std::memory_order_acquire);
  while (now_ns > last) {
    if (v->last_refill_ns.compare_exchange_weak(last, now_ns, std::memory_order_acq_rel)) {
      const int64_t gap = ElapsedNs(now_ns, last);
      AddCapped(&v->tokens_ns, RefillAmount(lim, gap), cap_l);
      AddCapped(&v->request_tokens_ns, RefillAmount(req, gap), cap_r);
      break;
    }
  }

  // Who else wants the GPU now, and is any of them owed or of higher QoS?
  bool others_want = false, owed_elsewhere = false, higher_qos_borrowing = false;
  int64_t others_req = 0;  // the requests of the others that want the GPU
  for (uint32_t i = 0; i < kMaxVgpus; ++i) {
    if (i == mine) continue;
    const VgpuSlot* u = vgpu(i);
    if (!Wanting(u, now_ns)) continue;
    others_want = true;
    int64_t u_req = ClampShare(u->compute_share_ppm.load(std::memory_order_relaxed));
    others_req += u_req;
    int64_t u_lim = ClampShare(LimitPpm(u));
    int64_t u_last = u->last_refill_ns.load(std::memory_order_relaxed);
    int64_t gap = now_ns > u_last ? ElapsedNs(now_ns, u_last) : 0;
    int64_t u_rt = SaneTokens(u->request_tokens_ns.load(std::memory_order_relaxed)) + RefillAmount(u_req, gap);
    int64_t u_lt = SaneTokens(u->tokens_ns.load(std::memory_order_relaxed)) + RefillAmount(u_lim, gap);
    bool u_can_run = u_lim >= static_cast<int64_t>(kShareWholeGpuPpm) || u_lt > 0;
    if (!u_can_run) continue;  // at its own ceiling: it cannot use what we would leave
    // Owed only while it has work queued now: what it leaves between its kernels is lent.
    if (u_rt > 0 && (in_flight_mask >> i) & 1) owed_elsewhere = true;
    else if (u->qos.load(std::memory_order_relaxed) > my_qos) higher_qos_borrowing = true;
  }

  out.others_want = others_want;
  if (out.charged_ns > 0) {
    v->tokens_ns.fetch_sub(out.charged_ns, std::memory_order_relaxed);
    if (others_want) {
      // Debt is bounded at one burst: a tenant over its request is held until it repays that.
      int64_t t = v->request_tokens_ns.load(std::memory_order_relaxed);
      int64_t floor = -BurstNs(req);
      int64_t nt;
      do {
        nt = t < floor + out.charged_ns ? floor : t - out.charged_ns;  // no overflow whatever t holds
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
    // Why: the verdict it was held on (the last one this tick's caller was given).
    const uint32_t why = p->last_hold.load(std::memory_order_relaxed);
    std::atomic<uint64_t>* by = why == static_cast<uint32_t>(ShareHold::kTurn)      ? &v->held_turn_ns_total
                                : why == static_cast<uint32_t>(ShareHold::kAtLimit) ? &v->held_limit_ns_total
                                                                                    : &v->held_others_ns_total;
    // Release after the throttled add: a reader that loads the reasons (acquire) before the
    // throttled total never sees them add up to more than it (GpuRegion::Snapshot).
    by->fetch_add(static_cast<uint64_t>(tick_ns), std::memory_order_release);
  }
  if (in_flight || raw_busy_ns > 0 || held) v->last_demand_ns.store(now_ns, std::memory_order_relaxed);

  const int64_t lt = SaneTokens(v->tokens_ns.load(std::memory_order_relaxed));
  const int64_t rt = SaneTokens(v->request_tokens_ns.load(std::memory_order_relaxed));
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
  if (turn != nullptr && turn->turn_ns > 0) {
    // A burstable vGPU takes turns (at its request) only while the requests of the vGPUs that want
    // the GPU fill it: then there is nothing to borrow and its request is its share. Otherwise what
    // the requests leave is lent by time slicing, higher QoS first, and it does not take turns.
    const int64_t requests = others_req + (Wanting(v, now_ns) ? req : 0);
    const bool eligible = !burstable || requests >= static_cast<int64_t>(kShareWholeGpuPpm) * 99 / 100;
    TakeTurns(mine, now_ns, tick_ns, in_flight, held, eligible, burstable ? rt : lt, burstable ? req : lim, turn,
              &out);
  }
  if (out.hold != ShareHold::kRun && !held) v->leases_total.fetch_add(1, std::memory_order_relaxed);
  p->last_hold.store(static_cast<uint32_t>(out.hold), std::memory_order_relaxed);
  return out;
}

void GpuRegion::TakeTurns(uint32_t mine, int64_t now_ns, int64_t tick_ns, bool in_flight, bool held, bool eligible,
                          int64_t limit_tokens, int64_t limit_ppm, ShareTurn* turn, ShareVerdict* out) {
  const int64_t w = tick_ns < kBusyAvgWindowNs ? tick_ns : kBusyAvgWindowNs;
  const int64_t x = in_flight || held ? static_cast<int64_t>(kShareWholeGpuPpm) : 0;
  turn->busy_avg_ppm += (x - turn->busy_avg_ppm) * w / kBusyAvgWindowNs;

  ShareBlock* sb = share();
  uint64_t word = sb->turn.load(std::memory_order_acquire);
  const uint64_t holder = word >> 56;  // vGPU index + 1; 0 = free
  const int64_t age = TurnAgeNs(word, now_ns);
  const bool mine_now = holder == mine + 1;
  bool alive = false;  // another vGPU holds the turn and still wants the GPU
  if (holder != 0 && !mine_now && holder <= kMaxVgpus) alive = Wanting(vgpu(static_cast<uint32_t>(holder - 1)), now_ns);
  const bool expired = age >= turn->turn_ns;

  // Holding the turn (the other saturating vGPUs wait): does it keep the GPU busy after all?
  if (mine_now && word != turn->held_word) {  // a turn it took, or one handed to it
    turn->held_word = word;
    turn->turn_held_ns = turn->turn_busy_ns = 0;
  }
  if (mine_now && !held) {
    turn->turn_held_ns += tick_ns;
    if (in_flight) turn->turn_busy_ns += tick_ns;
    if (turn->turn_held_ns >= kTurnWindowNs) {
      // Gappy in kGappyWindows windows held, each within kGappyChainNs of the one before (over
      // several turns: a tenant that leaves gaps gives each turn up early): one stall of the host
      // (a few ms, as a noisy VM has) empties a queue once, and would otherwise stop everyone's
      // turns for 5 s.
      if (turn->turn_busy_ns * static_cast<int64_t>(kShareWholeGpuPpm) < kSaturatedPpm * turn->turn_held_ns) {
        if (now_ns - turn->last_gappy_window_ns > kGappyChainNs) turn->gappy_windows = 0;
        turn->last_gappy_window_ns = now_ns;
        if (++turn->gappy_windows >= kGappyWindows) {
          turn->gappy_until_ns = now_ns + kShareGappyNs;
          turn->gappy_windows = 0;
        }
      }
      turn->turn_held_ns = turn->turn_busy_ns = 0;
    }
  }
  // Out of turns that did not pay: stay out while its work has not changed (decided before it
  // counts as saturating, so that the others do not see it take turns for a tick).
  if (turn->unpaid_since_ns != 0 && now_ns >= turn->gappy_until_ns && !StillUnpaid(now_ns, turn)) {
    turn->unpaid_since_ns = 0;  // try turns again, then compare (CheckTurnsPay)
  }
  turn->saturating = eligible && turn->busy_avg_ppm >= kSaturatedPpm && now_ns >= turn->gappy_until_ns;
  const uint64_t bit = 1ULL << mine;
  uint64_t mask = sb->saturating.load(std::memory_order_relaxed);
  if (turn->saturating != ((mask & bit) != 0)) {
    mask = turn->saturating ? sb->saturating.fetch_or(bit, std::memory_order_relaxed) | bit
                            : sb->saturating.fetch_and(~bit, std::memory_order_relaxed) & ~bit;
  }

  // Turns are for saturating tenants among themselves: while any other vGPU that wants the GPU is
  // not saturating (inference leaving gaps, a burstable slice), nobody takes turns. Taking them
  // then would time-slice that tenant against one saturating process instead of all of them,
  // charging it twice or more and holding it at its request (docs/compute-sharing.md).
  // Looked at only by a saturating process that may run (the scan reads every vGPU slot).
  auto others_gappy = [&] { return OthersWantUnsaturated(mine, mask, now_ns); };
  // Turns apply to it now when it is saturating and nobody wanting the GPU is not (whether it holds
  // the turn, waits for one, or waits for the tokens of its next one).
  if (eligible && turn->busy_avg_ppm >= kSaturatedPpm) {
    bool others_want = false, others_unsaturated = false;  // one scan for both
    ScanOthers(mine, mask, now_ns, &others_want, &others_unsaturated);
    CheckTurnsPay(now_ns, tick_ns, out->charged_ns, limit_ppm, others_want, turn->saturating && !others_unsaturated,
                  turn);
  }
  if (turn->period_ns > 0) {
    PlannedTurns(mine, now_ns, limit_tokens, limit_ppm, mask, word, alive, turn, out);
    return;
  }

  if (mine_now) {
    // Given up when held by its buckets, no longer saturating, or beside a tenant that is not;
    // otherwise kept until taken.
    if (out->hold != ShareHold::kRun || !turn->saturating || others_gappy()) {
      sb->turn.compare_exchange_strong(word, 0, std::memory_order_acq_rel);
    }
    return;
  }
  if (!turn->saturating || out->hold != ShareHold::kRun || others_gappy()) return;
  // Another saturating vGPU that still wants the GPU? (A dead process's bit has no fresh demand.)
  bool contended = false;
  for (uint64_t m = mask & ~bit; m != 0 && !contended; m &= m - 1) {
    contended = Wanting(vgpu(static_cast<uint32_t>(__builtin_ctzll(m))), now_ns);
  }
  if (!contended && !alive) return;
  // A capped vGPU takes a turn only with a turn's worth of tokens, so that it is not switched in
  // for a sliver (its share is unchanged: it waits while its bucket fills); a live holder keeps
  // the turn for turn_ns.
  bool enough = true;
  if (limit_ppm < static_cast<int64_t>(kShareWholeGpuPpm)) {
    int64_t need = BurstNs(limit_ppm) / 2;
    if (need > turn->turn_ns) need = turn->turn_ns;
    enough = limit_tokens >= need;
  }
  if (!enough || (alive && !expired)) {
    out->hold = ShareHold::kTurn;
    int64_t left = alive ? turn->turn_ns - age : 0;
    out->retry_after_ns = left > 0 && left < kMaxHoldRetryNs ? left : 1'000'000;
    return;
  }
  if (sb->turn.compare_exchange_strong(word, TurnWord(mine, now_ns), std::memory_order_acq_rel)) {
    sb->turns_total.fetch_add(1, std::memory_order_relaxed);
    turn->turn_held_ns = turn->turn_busy_ns = 0;
  }
}

void GpuRegion::ScanOthers(uint32_t mine, uint64_t mask, int64_t now_ns, bool* want, bool* unsaturated) const {
  for (uint32_t i = 0; i < kMaxVgpus && !(*want && *unsaturated); ++i) {
    if (i == mine || !Wanting(vgpu(i), now_ns)) continue;
    *want = true;
    if (((mask >> i) & 1) == 0) *unsaturated = true;
  }
}

namespace {
void ClearWithTurns(ShareTurn* turn) {
  turn->with_turns_ns = turn->with_turns_launches = turn->with_turns_charged_ns = 0;
}
void ClearWithoutTurns(ShareTurn* turn) {
  turn->without_ns = turn->without_launches = turn->without_charged_ns = 0;
  turn->probe_span_ns = turn->probe_alone_ns = 0;
}
void ClearTurnsPaySums(ShareTurn* turn) {
  ClearWithTurns(turn);
  ClearWithoutTurns(turn);
}

// Launches per unit (charged ns, or ns) without turns against with them, cross-multiplied
// (charges and times below a minute of ns, launches below a few million: no overflow in 128 bits),
// and their ratio x 1000 (0 when there is nothing to divide by).
struct Rates {
  __int128 without = 0, with = 0;
  int64_t permille = 0;
};
Rates CompareRates(int64_t without_launches, int64_t without_units, int64_t with_launches, int64_t with_units) {
  Rates r;
  r.without = static_cast<__int128>(without_launches) * with_units;
  r.with = static_cast<__int128>(with_launches) * without_units;
  if (r.with > 0) {
    const __int128 ratio = r.without * 1000 / r.with;
    r.permille = ratio > INT64_MAX ? INT64_MAX : static_cast<int64_t>(ratio);
  }
  return r;
}

// The time in which a vGPU at limit_ppm earns `ns` of GPU time (0 when it is not capped).
int64_t AtShareNs(int64_t ns, int64_t limit_ppm) {
  if (ns <= 0 || limit_ppm <= 0 || limit_ppm >= static_cast<int64_t>(kShareWholeGpuPpm)) return 0;
  const __int128 t = static_cast<__int128>(ns) * kShareWholeGpuPpm / limit_ppm;
  return t < INT64_MAX ? static_cast<int64_t>(t) : INT64_MAX;
}

// How long the comparison measures with turns: kTurnsPayWindowNs, or, for the per-second rule
// (ShareTurn::turns_per_second) with planned turns, whole cycles of its turns (the fewest that last
// that long, at most kTurnsPayCycleMaxNs). A saturating hard slice runs one turn a period, or, when
// its share of a period is shorter than a turn, one every turn / share (250 ms for 10% of 200 ms
// periods with 25 ms turns): over whole cycles it gets its share of the time at whatever phase the
// window starts. Over 300 ms of a 200 ms period one tenant of a 50/50 pair of spin tenants gets
// two turns and the other one, and their work per second with turns reads 1.4 and 0.7 times what
// it is (as on an H200: 1.37-1.38 and 0.69-0.70). Work per charge does not depend on the phase.
int64_t TurnsPayWindowNs(const ShareTurn& turn, int64_t limit_ppm) {
  if (!turn.turns_per_second || turn.period_ns <= 0) return kTurnsPayWindowNs;
  const int64_t cycle = std::max(turn.period_ns, AtShareNs(turn.turn_ns, limit_ppm));
  if (cycle >= kTurnsPayWindowNs) return std::min(cycle, kTurnsPayCycleMaxNs);
  return (kTurnsPayWindowNs + cycle - 1) / cycle * cycle;
}

// Work per second is counted over the time a capped tenant took to earn what it was charged, when
// that is longer than the time measured: a tenant that comes to a probe with its bucket full (the
// small one of an uneven split, waiting for the tokens of its next turn) runs on them for a while,
// and would read up to 1.7 times its work per second without turns.
int64_t EarnedOverNs(int64_t ns, int64_t charged_ns, int64_t limit_ppm) {
  return std::max(ns, AtShareNs(charged_ns, limit_ppm));
}

// The per-second rule (ShareTurn::turns_per_second): at least kTurnsPayFloorPermille / 1000 times
// as much per charge and kTurnsPayWallPermille / 1000 times as much per second without turns.
bool PerSecondRuleHolds(const Rates& charge, const Rates& wall) {
  return charge.without * 1000 >= charge.with * kTurnsPayFloorPermille &&
         wall.without * 1000 >= wall.with * kTurnsPayWallPermille;
}
}  // namespace

// Out of turns that did not pay, at the end of kTurnsUnpaidNs: does its work without turns (the
// sums of the current spell of contention) still leave turns, against what the comparison that
// left them measured with them? By far per charge (kTurnsPayConfirmPermille), or, when the
// per-second rule held at that comparison, that rule again (kTurnsPayFloorPermille per charge and
// kTurnsPayWallPermille per second). Then it stays out another kTurnsUnpaidNs (up to
// kTurnsUnpaidMaxNs after that comparison) rather than paying for turns to learn the same again.
bool GpuRegion::StillUnpaid(int64_t now_ns, ShareTurn* turn) {
  const int64_t with_ns = turn->last_with[0], with_launches = turn->last_with[1], with_charged = turn->last_with[2];
  if (now_ns - turn->unpaid_since_ns >= kTurnsUnpaidMaxNs || turn->without_ns < kTurnsPayWindowNs ||
      turn->without_charged_ns <= 0 || with_ns <= 0 || with_launches <= 0 || with_charged <= 0) {
    return false;
  }
  const Rates r = CompareRates(turn->without_launches, turn->without_charged_ns, with_launches, with_charged);
  turn->last_extend_permille = r.permille;
  const Rates wall = CompareRates(turn->without_launches, turn->without_ns, with_launches, with_ns);
  turn->last_extend_wall_permille = wall.permille;
  const bool by_charge = r.without * 1000 >= r.with * kTurnsPayConfirmPermille;
  const bool by_second = turn->unpaid_by_second && PerSecondRuleHolds(r, wall);
  if (!by_charge && !by_second) return false;
  turn->gappy_until_ns = now_ns + kTurnsUnpaidNs;
  ++turn->unpaid_extended;
  ClearWithoutTurns(turn);
  return true;
}

void GpuRegion::CheckTurnsPay(int64_t now_ns, int64_t tick_ns, int64_t charged_ns, int64_t limit_ppm,
                              bool others_want, bool turns_apply, ShareTurn* turn) {
  const int64_t launches = turn->tick_launches > 0 ? turn->tick_launches : 0;
  turn->tick_launches = 0;
  if (!others_want) {
    // Alone: neither rate is about sharing. (In a probe: time the probe does not judge it by.)
    if (now_ns < turn->probe_until_ns) turn->probe_alone_ns += tick_ns;
    return;
  }
  if (now_ns - turn->last_contended_ns > kTurnsPaySpellGapNs) {
    // A new spell of contention (other tenants than before, perhaps): compare afresh.
    turn->spell_checks = 0;
    turn->next_probe_ns = 0;
    turn->last_check_paid = false;
    turn->thinning = false;
    turn->reprobe = false;
    ClearTurnsPaySums(turn);
  }
  turn->last_contended_ns = now_ns;
  if (turns_apply) {
    // Sums with turns from before a recheck's interval without them are another time's (the
    // tenants it waited for to take turns again left them meanwhile, and it waited minutes): start
    // them afresh. (Shorter gaps, such as a tenant's own bursts, are summed across.)
    if (now_ns - turn->last_with_tick_ns > kTurnsPayRecheckNs) ClearWithTurns(turn);
    turn->last_with_tick_ns = now_ns;
    turn->with_turns_ns += tick_ns;
    turn->with_turns_launches += launches;
    turn->with_turns_charged_ns += charged_ns;
  } else {
    turn->without_ns += tick_ns;
    turn->without_launches += launches;
    turn->without_charged_ns += charged_ns;
  }
  if (now_ns < turn->gappy_until_ns || now_ns < turn->next_probe_ns) return;
  if (turn->reprobe) {
    turn->reprobe = false;
    ClearWithoutTurns(turn);
  }
  const bool whole_period = turn->period_ns >= 100'000'000 && turn->period_ns <= kTurnsPayProbeNs;
  const int64_t probe_ns = turn->spell_checks == 0 ? kTurnsPayProbeNs
                           : whole_period          ? turn->period_ns
                                                   : kTurnsPayRecheckProbeNs;
  if (turn->without_ns < probe_ns / 2) {
    // The probes summed in without_ns (none yet, one, or more when one was mostly alone), less
    // their time alone.
    const int64_t contended_ns = turn->probe_span_ns - std::min(turn->probe_alone_ns, turn->probe_span_ns);
    if (turn->without_ns < contended_ns / 2) {
      // It had work queued less than half of the probe it just made, while others wanted the GPU:
      // a tenant that saturates only now and then (GPT-2 b1 pairs on an H200), whose turns would
      // be taken in the moments both happen to and stop the other for a turn its own work does not
      // fill. Out of turns as a holder that leaves gaps, then probed afresh (what it did meanwhile
      // without turns is not a probe: it would let it take turns whenever it saturates again).
      // (A tenant that saturated throughout beside one that wanted the GPU in bursts is judged by
      // the contended part: out of turns, it would stop them for everyone.)
      turn->reprobe = true;
      turn->gappy_until_ns = now_ns + kShareGappyNs;
      ++turn->probes_unsaturated;
      return;
    }
    // No rate without turns yet (a process that just started contending, or a recheck): leave
    // turns for a probe, which stops them for everyone while it wants the GPU.
    turn->gappy_until_ns = turn->probe_until_ns = now_ns + probe_ns;
    turn->probe_span_ns += probe_ns;
    return;
  }
  const int64_t window_ns = TurnsPayWindowNs(*turn, limit_ppm);
  if (turn->with_turns_ns < window_ns) return;
  // Launches per charged GPU ns, and per ns (per second).
  if (turn->with_turns_charged_ns > 0 && turn->without_charged_ns > 0 && turn->with_turns_launches > 0) {
    const Rates charge = CompareRates(turn->without_launches, turn->without_charged_ns, turn->with_turns_launches,
                                      turn->with_turns_charged_ns);
    const int64_t without_earned_ns = EarnedOverNs(turn->without_ns, turn->without_charged_ns, limit_ppm);
    const int64_t with_earned_ns = EarnedOverNs(turn->with_turns_ns, turn->with_turns_charged_ns, limit_ppm);
    const Rates wall_rates =
        CompareRates(turn->without_launches, without_earned_ns, turn->with_turns_launches, with_earned_ns);
    const __int128 without = charge.without, with = charge.with;
    turn->last_ratio_permille = charge.permille;
    turn->last_wall_permille = wall_rates.permille;
    // Charged with turns less than half its limit's share of `ns`.
    auto under_half_share = [&](int64_t ns) {
      return static_cast<__int128>(turn->with_turns_charged_ns) * (2 * kShareWholeGpuPpm) <
             static_cast<__int128>(limit_ppm) * ns;
    };
    // Thin: charged with turns less than half its limit's share of the window. A narrow verdict on
    // so few kernels waits for more of them (the sums with turns go on) up to kTurnsPayThinMaxNs.
    const bool thin = under_half_share(window_ns);
    // Work per second says nothing about turns of a tenant that ran on its saved tokens in the
    // probe (charged more than its share of the time without turns) and then on few with turns
    // (less than half its share of the time, still so after a thin sample's wait): the 25% tenant
    // of a 25/75 spin pair on an H100 read 3.54 times as much per second without turns so. A
    // tenant charged little with turns that did not run ahead without them is one whose turns
    // leave the GPU idle, which is what the rule is for (ResNet-50 b1 pairs at 50% on an H200
    // were charged 35-49% of the time with turns, and 47-48% without).
    const bool ran_ahead = static_cast<__int128>(turn->without_charged_ns) * kShareWholeGpuPpm >
                           static_cast<__int128>(limit_ppm) * turn->without_ns;
    const bool ran_little = ran_ahead && under_half_share(turn->with_turns_ns);
    const bool unpaid_per_second =
        turn->turns_per_second && !ran_little && PerSecondRuleHolds(charge, wall_rates);
    const bool unpaid_per_charge = without * 1000 > with * kTurnsPayPermille;
    // Narrow: per charge, and below kTurnsPayConfirmPermille (a verdict of the per-second rule alone
    // is not made again).
    const bool narrow = unpaid_per_charge && without * 1000 < with * kTurnsPayConfirmPermille;
    const bool unpaid = unpaid_per_charge || unpaid_per_second;
    if (unpaid && narrow && thin && turn->with_turns_ns < kTurnsPayThinMaxNs) {
      if (!turn->thinning) ++turn->thin_waits;
      turn->thinning = true;
      return;
    }
    turn->thinning = false;
    if (unpaid && narrow && turn->last_check_paid) {
      // Narrowly against the last comparison: compare once more before leaving turns for a minute.
      turn->last_check_paid = false;
      turn->next_probe_ns = now_ns + kTurnsPayConfirmNs;
      ++turn->checks_repeated;
    } else if (unpaid) {
      turn->gappy_until_ns = now_ns + kTurnsUnpaidNs;
      turn->unpaid_since_ns = now_ns;
      turn->unpaid_by_second = unpaid_per_second;
      turn->last_check_paid = false;
      ++turn->turns_unpaid;
    } else {
      // A spell's first comparison reading far below the switching loss may be the tenants'
      // start-up: made again soon. Any other stands until the usual recheck.
      const bool start_up = turn->spell_checks == 0 && charge.permille < kTurnsPayStartUpPermille;
      turn->next_probe_ns = now_ns + (start_up ? kTurnsPayFirstRecheckNs : kTurnsPayRecheckNs);
      turn->last_check_paid = true;
      ++turn->turns_paid;
    }
  } else {
    turn->next_probe_ns = now_ns + kTurnsPayRecheckNs;  // nothing counted in one of them: keep turns
  }
  ++turn->spell_checks;
  ++turn->comparisons;
  const int64_t with[3] = {turn->with_turns_ns, turn->with_turns_launches, turn->with_turns_charged_ns};
  const int64_t without[3] = {turn->without_ns, turn->without_launches, turn->without_charged_ns};
  std::copy(with, with + 3, turn->last_with);
  std::copy(without, without + 3, turn->last_without);
  ClearTurnsPaySums(turn);
}

bool GpuRegion::OthersWantUnsaturated(uint32_t mine, uint64_t mask, int64_t now_ns) const {
  for (uint32_t i = 0; i < kMaxVgpus; ++i) {
    if (i != mine && ((mask >> i) & 1) == 0 && Wanting(vgpu(i), now_ns)) return true;
  }
  return false;
}

// Planned turns: each saturating hard slice runs one turn of its share of the period (at least
// turn_ns), taken once its bucket holds most of what that turn costs, so the GPU changes hands a
// few times a second instead of dozens; and the hand-over is timed rather than noticed. The
// holder knows when its turn ends (its length, or its bucket running dry) and ticks then; at that
// tick it hands the turn to the waiting vGPU that has been ready longest and holds itself at once.
// The waiters compute the same end from the region (the holder's share and bucket) and tick then
// too, so the next holder starts submitting as the previous one stops: the previous holder's
// queued kernels drain while the next one's first kernels queue behind them, and the GPU is never
// left without work between turns. Each tick's charge stays what the region measures (raw time /
// processes with work queued), so the drain is charged to whoever had work queued during it.
void GpuRegion::PlannedTurns(uint32_t mine, int64_t now_ns, int64_t lt, int64_t lim, uint64_t mask, uint64_t word,
                             bool alive, ShareTurn* turn, ShareVerdict* out) {
  ShareBlock* sb = share();
  const uint64_t holder = word >> 56;
  const int64_t age = TurnAgeNs(word, now_ns);
  const bool mine_now = holder == mine + 1;
  const bool may_run = turn->saturating && out->hold == ShareHold::kRun;
  const uint64_t bit = 1ULL << mine;

  // The other saturating vGPU that wants the GPU, has the tokens for its turn and has had them
  // longest (-1: none ready). `soonest` gets how long until the first one not yet ready is.
  auto successor = [&](int64_t* soonest) -> int {
    int best = -1;
    int64_t best_ready_for = -1;
    for (uint64_t m = mask & ~bit; m != 0; m &= m - 1) {
      const uint32_t i = static_cast<uint32_t>(__builtin_ctzll(m));
      int64_t ready_for = 0;  // < 0: not ready for that long
      if (!ReadyFor(i, now_ns, *turn, &ready_for)) continue;
      if (ready_for >= 0 && ready_for > best_ready_for) {
        best = static_cast<int>(i);
        best_ready_for = ready_for;
      } else if (ready_for < 0 && soonest != nullptr && -ready_for < *soonest) {
        *soonest = -ready_for;
      }
    }
    return best;
  };
  auto hand_over = [&](int next) {
    if (sb->turn.compare_exchange_strong(word, next >= 0 ? TurnWord(static_cast<uint32_t>(next), now_ns) : 0,
                                         std::memory_order_acq_rel) &&
        next >= 0) {
      sb->turns_total.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    return false;
  };
  auto tick_in = [&](int64_t ns) {
    if (ns < 50'000) ns = 50'000;
    if (out->retry_after_ns <= 0 || ns < out->retry_after_ns) out->retry_after_ns = std::min(ns, kMaxHoldRetryNs);
  };

  if (mine_now) {
    if (!may_run) {
      // Held by its buckets (the bucket ran dry: the planned end) or no longer saturating.
      hand_over(turn->saturating ? successor(nullptr) : -1);
      return;
    }
    if (OthersWantUnsaturated(mine, mask, now_ns)) {
      hand_over(-1);  // turns stop while such a tenant wants the GPU
      return;
    }
    const int64_t to_end = TurnLengthNs(*turn, lim) - age;  // until its planned end (<= 0: past it)
    int64_t soonest = INT64_MAX;
    // A hard slice whose bucket ran dry is held above; a burstable one is not (its limit is
    // higher), so its turn also ends when its request bucket does.
    const bool dry = lim < static_cast<int64_t>(kShareWholeGpuPpm) && lt <= 0;
    if (to_end <= 0 || dry) {
      const int next = successor(&soonest);
      if (next >= 0 && hand_over(next)) {
        out->hold = ShareHold::kTurn;
        return;
      }
    }
    // Tick again at the planned end: the turn is over, its bucket runs dry, or (past its end)
    // the first waiter becomes ready.
    int64_t left = to_end > 0 ? to_end : soonest;
    if (lim < static_cast<int64_t>(kShareWholeGpuPpm)) left = std::min(left, DryInNs(lt, lim));
    if (left < INT64_MAX) tick_in(left);
    return;
  }
  if (!may_run || OthersWantUnsaturated(mine, mask, now_ns)) return;
  bool contended = false;
  for (uint64_t m = mask & ~bit; m != 0 && !contended; m &= m - 1) {
    contended = Wanting(vgpu(static_cast<uint32_t>(__builtin_ctzll(m))), now_ns);
  }
  if (!contended && !alive) return;
  // Ready: tokens for most of a whole turn of its own (a capped vGPU).
  const bool capped = lim < static_cast<int64_t>(kShareWholeGpuPpm);
  const int64_t need = capped ? TurnNeedNs(*turn, lim) : 0;
  const int64_t not_ready_ns = lt >= need ? 0 : NsUntilPositive(lt - need, lim);
  // When the live holder's turn ends as it sees it: its length, or its bucket running dry.
  int64_t holder_left = 0;
  if (alive) {
    const VgpuSlot* h = vgpu(static_cast<uint32_t>(holder - 1));
    const int64_t h_lim = TurnBucketOf(h).ppm;
    holder_left = TurnLengthNs(*turn, h_lim) - age;
    if (h_lim < static_cast<int64_t>(kShareWholeGpuPpm)) {
      holder_left = std::min(holder_left, DryInNs(HolderTokensNow(h, now_ns), h_lim));
    }
  }
  // Just after its probe nobody holds the turn, and nobody may be ready for one (the probe left
  // every bucket as it was, one turn cut short): rather than leave the GPU idle until one is, the
  // waiter nearest to ready takes it with what it has. (Only then: in steady turns the hand-over
  // is planned, and short turns taken whenever the turn is free made the shares per second uneven.)
  const bool after_probe = now_ns < turn->probe_until_ns + kTurnsPayRecheckProbeNs;
  const bool take_short = after_probe && not_ready_ns > 0 && !alive && lt > 0 && lim > 0 &&
                          NearestToReady(mine, lt - need, lim, mask, now_ns, *turn);
  if (!take_short && (not_ready_ns > 0 || holder_left > 0)) {
    out->hold = ShareHold::kTurn;
    tick_in(std::max(not_ready_ns, holder_left));
    return;
  }
  if (sb->turn.compare_exchange_strong(word, TurnWord(mine, now_ns), std::memory_order_acq_rel)) {
    sb->turns_total.fetch_add(1, std::memory_order_relaxed);
    turn->turn_held_ns = turn->turn_busy_ns = 0;
  }
}

bool GpuRegion::ReadyFor(uint32_t i, int64_t now_ns, const ShareTurn& turn, int64_t* ready_for) const {
  const VgpuSlot* u = vgpu(i);
  if (!Wanting(u, now_ns)) return false;
  const int64_t u_lim = TurnBucketOf(u).ppm;
  if (u_lim <= 0) return false;
  *ready_for = (TurnTokensNow(u, now_ns, turn) - TurnNeedNs(turn, u_lim)) * 1'000'000 / u_lim;
  return true;
}

bool GpuRegion::NearestToReady(uint32_t mine, int64_t have, int64_t lim, uint64_t mask, int64_t now_ns,
                               const ShareTurn& turn) const {
  const int64_t mine_for = have * 1'000'000 / lim;
  for (uint64_t m = mask & ~(1ULL << mine); m != 0; m &= m - 1) {
    const uint32_t i = static_cast<uint32_t>(__builtin_ctzll(m));
    int64_t u_for = 0;
    if (!ReadyFor(i, now_ns, turn, &u_for)) continue;
    if (u_for > mine_for || (u_for == mine_for && i < mine)) return false;
  }
  return true;
}

void GpuRegion::ShareIdle(uint32_t slot) {
  if (ValidActiveProcess(slot)) process(slot)->active_until_ns.store(0, std::memory_order_relaxed);
}

}  // namespace tf::limiter
