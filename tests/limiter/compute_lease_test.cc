#include <time.h>

#include <cmath>

#include "limiter/core/process_identity.h"
#include "tests/limiter/region_test_util.h"

namespace tf::limiter::testing {
namespace {

constexpr int64_t kMs = 1'000'000;

struct BusyReport {
  int64_t busy_ns;
  int64_t wall_ns;
  int64_t leases;
};

// One tenant process: acquire -> "run kernels" for the quantum (sleep; the measured time is the
// busy time, as event timings would be) -> release, in a loop. Busy time is counted only inside
// [warmup_end, end) so the initial full bucket does not inflate the result.
int LeaseLoop(const std::string& file, uint32_t vgpu, int64_t warmup_ns, int64_t measure_ns, int out) {
  GpuRegion r;
  if (GpuRegion::Attach(file.c_str(), &r) != RegionError::kOk) return 10;
  uint32_t slot;
  if (r.AttachProcess(vgpu, getpid(), &slot) != RegionError::kOk) return 11;
  const int64_t quantum = 2 * kMs;
  const int64_t t0 = MonotonicNowNs();
  const int64_t from = t0 + warmup_ns, end = from + measure_ns;
  BusyReport rep{0, measure_ns, 0};
  for (int64_t now = t0; now < end; now = MonotonicNowNs()) {
    LeaseGrant g = r.TryAcquireLease(slot, now, quantum);
    if (g.error != RegionError::kOk) return 12;
    if (!g.granted) {
      r.WaitForLease(slot, 20 * kMs);
      continue;
    }
    timespec until{static_cast<time_t>(g.deadline_ns / 1'000'000'000), static_cast<long>(g.deadline_ns % 1'000'000'000)};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, nullptr);
    int64_t done = MonotonicNowNs();
    int64_t a = now > from ? now : from, b = done < end ? done : end;
    if (b > a) rep.busy_ns += b - a;
    ++rep.leases;
    r.ReleaseLease(slot, done - now, done);
  }
  WriteAll(out, rep);
  r.DetachProcess(slot);
  return 0;
}

class ComputeLeaseTest : public RegionTest {};

TEST_F(ComputeLeaseTest, SharesOf30And70AreEnforcedBetweenTwoProcesses) {
  uint32_t a = 0, b = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("a", kGiB, 300'000, &a), RegionError::kOk);
  ASSERT_EQ(region_.CreateOrUpdateVgpu("b", kGiB, 700'000, &b), RegionError::kOk);
  const std::string file = RegionFile();
  int fa = -1, fb = -1;
  pid_t ka = ForkChild([&](int out) { return LeaseLoop(file, a, 300 * kMs, 2000 * kMs, out); }, &fa);
  pid_t kb = ForkChild([&](int out) { return LeaseLoop(file, b, 300 * kMs, 2000 * kMs, out); }, &fb);
  BusyReport ra{}, rb{};
  ASSERT_TRUE(ReadAll(fa, &ra));
  ASSERT_TRUE(ReadAll(fb, &rb));
  close(fa);
  close(fb);
  EXPECT_EQ(WaitExit(ka), 0);
  EXPECT_EQ(WaitExit(kb), 0);
  double fa_busy = static_cast<double>(ra.busy_ns) / static_cast<double>(ra.wall_ns);
  double fb_busy = static_cast<double>(rb.busy_ns) / static_cast<double>(rb.wall_ns);
  printf("busy fraction: a (30%%) %.3f over %lld leases, b (70%%) %.3f over %lld leases\n", fa_busy,
         static_cast<long long>(ra.leases), fb_busy, static_cast<long long>(rb.leases));
  EXPECT_NEAR(fa_busy, 0.30, 0.04);
  EXPECT_NEAR(fb_busy, 0.70, 0.04);
  EXPECT_LE(fa_busy + fb_busy, 1.0 + 1e-3);  // one holder at a time: never more than the GPU
  RegionSnapshot* snap = new RegionSnapshot;
  region_.Snapshot(snap);
  EXPECT_GT(snap->vgpus[0].throttled_ns_total, 0u);
  EXPECT_GT(snap->vgpus[1].throttled_ns_total, 0u);
  EXPECT_GT(snap->vgpus[0].busy_ns_total, 0u);
  delete snap;
}

TEST_F(ComputeLeaseTest, SingleVgpuAt50PercentAloneGetsHalf) {
  uint32_t a = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("a", kGiB, 500'000, &a), RegionError::kOk);
  const std::string file = RegionFile();
  int fa = -1;
  pid_t ka = ForkChild([&](int out) { return LeaseLoop(file, a, 300 * kMs, 1500 * kMs, out); }, &fa);
  BusyReport ra{};
  ASSERT_TRUE(ReadAll(fa, &ra));
  close(fa);
  EXPECT_EQ(WaitExit(ka), 0);
  double f = static_cast<double>(ra.busy_ns) / static_cast<double>(ra.wall_ns);
  printf("busy fraction alone at 50%%: %.3f\n", f);
  EXPECT_NEAR(f, 0.50, 0.04);
}

TEST_F(ComputeLeaseTest, UnthrottledVgpuNeverTouchesTheLease) {
  uint32_t a = 0, slot = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("whole", kGiB, 1'000'000, &a), RegionError::kOk);
  ASSERT_EQ(region_.AttachProcess(a, getpid(), &slot), RegionError::kOk);
  LeaseGrant g = region_.TryAcquireLease(slot, MonotonicNowNs(), kMs);
  EXPECT_TRUE(g.granted);
  EXPECT_TRUE(g.unthrottled);
  RegionSnapshot* snap = new RegionSnapshot;
  region_.Snapshot(snap);
  EXPECT_EQ(snap->lease_owner_slot, -1);
  delete snap;
  EXPECT_EQ(region_.WaitForLease(slot, 10 * kMs), 0);
}

TEST_F(ComputeLeaseTest, LeaseIsExclusiveAndEmptyBucketSaysWhenToRetry) {
  uint32_t a = 0, b = 0, sa = 0, sb = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("a", kGiB, 100'000, &a), RegionError::kOk);  // 10%: burst 10 ms
  ASSERT_EQ(region_.CreateOrUpdateVgpu("b", kGiB, 100'000, &b), RegionError::kOk);
  ASSERT_EQ(region_.AttachProcess(a, getpid(), &sa), RegionError::kOk);
  ASSERT_EQ(region_.AttachProcess(b, getpid(), &sb), RegionError::kOk);
  int64_t now = MonotonicNowNs();
  LeaseGrant ga = region_.TryAcquireLease(sa, now, 5 * kMs);
  ASSERT_TRUE(ga.granted);
  EXPECT_EQ(ga.deadline_ns, now + 5 * kMs);
  LeaseGrant gb = region_.TryAcquireLease(sb, now, 5 * kMs);
  EXPECT_FALSE(gb.granted);
  EXPECT_EQ(gb.denial, LeaseDenial::kHeld);
  EXPECT_GT(gb.retry_after_ns, 0);
  // a used 30 ms of GPU in that lease: 20 ms of debt at 10% takes ~200 ms to repay.
  ASSERT_EQ(region_.ReleaseLease(sa, 30 * kMs, now), RegionError::kOk);
  LeaseGrant again = region_.TryAcquireLease(sa, now, 5 * kMs);
  EXPECT_FALSE(again.granted);
  EXPECT_EQ(again.denial, LeaseDenial::kNoTokens);
  EXPECT_NEAR(static_cast<double>(again.retry_after_ns), 200.0 * kMs, 1.0 * kMs);
  EXPECT_TRUE(region_.TryAcquireLease(sb, now, 5 * kMs).granted);
  EXPECT_EQ(region_.ReleaseLease(sa, 0, now), RegionError::kNotHolder);
}

TEST_F(ComputeLeaseTest, DeadHoldersLeaseIsStolen) {
  uint32_t a = 0, mine = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("a", kGiB, 500'000, &a), RegionError::kOk);
  ASSERT_EQ(region_.AttachProcess(a, getpid(), &mine), RegionError::kOk);
  const std::string file = RegionFile();
  int fd = -1;
  pid_t kid = ForkChild([&](int out) {
    GpuRegion r;
    uint32_t slot;
    if (GpuRegion::Attach(file.c_str(), &r) != RegionError::kOk) return 10;
    if (r.AttachProcess(a, getpid(), &slot) != RegionError::kOk) return 11;
    char granted = r.TryAcquireLease(slot, MonotonicNowNs(), 5 * kMs).granted ? 1 : 0;
    WriteAll(out, granted);
    pause();
    return 0;
  }, &fd);
  char granted = 0;
  ASSERT_TRUE(ReadAll(fd, &granted));
  close(fd);
  ASSERT_EQ(granted, 1);
  EXPECT_EQ(region_.TryAcquireLease(mine, MonotonicNowNs(), kMs).denial, LeaseDenial::kHeld);
  kill(kid, SIGKILL);
  EXPECT_EQ(WaitExit(kid), 128 + SIGKILL);
  // A waiter is woken within the holder's quantum + 1 ms and then takes the lease over.
  int64_t t0 = MonotonicNowNs();
  LeaseGrant g;
  while (!(g = region_.TryAcquireLease(mine, MonotonicNowNs(), kMs)).granted && MonotonicNowNs() - t0 < 100 * kMs) {
    region_.WaitForLease(mine, 50 * kMs);
  }
  EXPECT_TRUE(g.granted);
  EXPECT_LT(MonotonicNowNs() - t0, 20 * kMs);
  RegionSnapshot* snap = new RegionSnapshot;
  region_.Snapshot(snap);
  EXPECT_EQ(snap->lease_steals_total, 1u);
  delete snap;
}

TEST_F(ComputeLeaseTest, LiveHolderIsStolenFromOnlyOneSecondPastItsDeadline) {
  uint32_t a = 0, b = 0, sa = 0, sb = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("a", kGiB, 500'000, &a), RegionError::kOk);
  ASSERT_EQ(region_.CreateOrUpdateVgpu("b", kGiB, 500'000, &b), RegionError::kOk);
  ASSERT_EQ(region_.AttachProcess(a, getpid(), &sa), RegionError::kOk);
  ASSERT_EQ(region_.AttachProcess(b, getpid(), &sb), RegionError::kOk);  // alive: it is us
  int64_t now = MonotonicNowNs();
  ASSERT_TRUE(region_.TryAcquireLease(sa, now, kMs).granted);
  EXPECT_FALSE(region_.TryAcquireLease(sb, now + 900 * kMs, kMs).granted);  // late but alive
  EXPECT_TRUE(region_.TryAcquireLease(sb, now + 1100 * kMs, kMs).granted);  // > 1 s overdue
  EXPECT_EQ(region_.ReleaseLease(sa, kMs, now + 1100 * kMs), RegionError::kNotHolder);
}

TEST_F(ComputeLeaseTest, ReleaserHandsTheLeaseToTheLongestWaiter) {
  uint32_t a = 0, b = 0, sa = 0, sb = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("a", kGiB, 500'000, &a), RegionError::kOk);
  ASSERT_EQ(region_.CreateOrUpdateVgpu("b", kGiB, 500'000, &b), RegionError::kOk);
  ASSERT_EQ(region_.AttachProcess(a, getpid(), &sa), RegionError::kOk);
  ASSERT_EQ(region_.AttachProcess(b, getpid(), &sb), RegionError::kOk);
  int64_t now = MonotonicNowNs();
  ASSERT_TRUE(region_.TryAcquireLease(sa, now, 50 * kMs).granted);
  region_.WaitForLease(sb, kMs);  // b is now a waiter (times out: a holds the lease)
  int64_t t = MonotonicNowNs();
  ASSERT_EQ(region_.ReleaseLease(sa, 2 * kMs, t), RegionError::kOk);
  LeaseGrant again = region_.TryAcquireLease(sa, t, kMs);  // the releaser may not jump the queue
  EXPECT_FALSE(again.granted);
  EXPECT_EQ(again.denial, LeaseDenial::kHandoff);
  EXPECT_TRUE(region_.TryAcquireLease(sb, t, kMs).granted);
  ASSERT_EQ(region_.ReleaseLease(sb, kMs, t), RegionError::kOk);
  EXPECT_TRUE(region_.TryAcquireLease(sa, t, kMs).granted);  // no waiter: no hint
}

// Costs per call, single process, uncontended (a number for docs, not a pass/fail timing).
TEST_F(ComputeLeaseTest, CostPerCall) {
  uint32_t a = 0, slot = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("a", 1ULL << 50, 500'000, &a), RegionError::kOk);
  ASSERT_EQ(region_.AttachProcess(a, getpid(), &slot), RegionError::kOk);
  constexpr int kN = 200'000;
  int64_t t0 = MonotonicNowNs();
  for (int i = 0; i < kN; ++i) {
    region_.Reserve(slot, 2 * kMiB);
    region_.Release(slot, 2 * kMiB);
  }
  int64_t t1 = MonotonicNowNs();
  for (int i = 0; i < kN; ++i) {
    int64_t now = MonotonicNowNs();
    region_.TryAcquireLease(slot, now, kMs);
    region_.ReleaseLease(slot, 0, now);
  }
  int64_t t2 = MonotonicNowNs();
  printf("Reserve+Release: %.1f ns/pair; MonotonicNowNs+TryAcquireLease+ReleaseLease: %.1f ns/cycle\n",
         static_cast<double>(t1 - t0) / kN, static_cast<double>(t2 - t1) / kN);
  EXPECT_EQ(region_.Used(a), 0u);
}

}  // namespace
}  // namespace tf::limiter::testing

namespace tf::limiter::testing {
namespace {

class LeaseRenewalTest : public ComputeLeaseTest {};

TEST_F(LeaseRenewalTest, AloneTheHolderRenewsAndTheChargeIsReconciled) {
  uint32_t a = 0, sa = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("solo", kGiB, 500'000, &a), RegionError::kOk);  // 50%: burst 50 ms
  ASSERT_EQ(region_.AttachProcess(a, getpid(), &sa), RegionError::kOk);
  int64_t now = MonotonicNowNs();
  ASSERT_TRUE(region_.TryAcquireLease(sa, now, 10 * kMs).granted);
  // Nobody else wants the GPU: the lease runs on, and 10 ms of wall time is debited at once.
  LeaseGrant r = region_.ExtendLease(sa, now, 10 * kMs, 10 * kMs);
  ASSERT_TRUE(r.granted);
  EXPECT_EQ(r.deadline_ns, now + 10 * kMs);
  RegionSnapshot* snap = new RegionSnapshot;
  region_.Snapshot(snap);
  int64_t after_renewal = snap->vgpus[0].tokens_ns;
  // Releasing with 8 ms measured credits back the 2 ms the provisional charge over-counted.
  ASSERT_EQ(region_.ReleaseLease(sa, 8 * kMs, now, 10 * kMs), RegionError::kOk);
  region_.Snapshot(snap);
  EXPECT_EQ(snap->vgpus[0].tokens_ns, after_renewal + 2 * kMs);
  EXPECT_EQ(snap->vgpus[0].busy_ns_total, static_cast<uint64_t>(8 * kMs));
  delete snap;
  // A renewal is refused when the bucket cannot cover the provisional charge.
  ASSERT_TRUE(region_.TryAcquireLease(sa, now, 10 * kMs).granted);
  EXPECT_FALSE(region_.ExtendLease(sa, now, 10 * kMs, 500 * kMs).granted);
}

TEST_F(LeaseRenewalTest, AWaitingTenantWithBudgetGetsItsTurnInstead) {
  uint32_t a = 0, b = 0, sa = 0, sb = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("a", kGiB, 500'000, &a), RegionError::kOk);
  ASSERT_EQ(region_.CreateOrUpdateVgpu("b", kGiB, 500'000, &b), RegionError::kOk);
  ASSERT_EQ(region_.AttachProcess(a, getpid(), &sa), RegionError::kOk);
  ASSERT_EQ(region_.AttachProcess(b, getpid(), &sb), RegionError::kOk);
  int64_t now = MonotonicNowNs();
  ASSERT_TRUE(region_.TryAcquireLease(sa, now, 10 * kMs).granted);
  EXPECT_FALSE(region_.TryAcquireLease(sb, now, 10 * kMs).granted);
  region_.WaitForLease(sb, 1 * kMs);  // b is now a waiter with tokens
  LeaseGrant r = region_.ExtendLease(sa, MonotonicNowNs(), 10 * kMs, 1 * kMs);
  EXPECT_FALSE(r.granted);
  EXPECT_EQ(r.denial, LeaseDenial::kHandoff);
  // Only the holder may renew.
  EXPECT_EQ(region_.ExtendLease(sb, now, 10 * kMs, 0).error, RegionError::kNotHolder);
}

// ---- A region another tenant scribbled (any process can write any byte of it) ----

class ScribbledLeaseTest : public ComputeLeaseTest {};

TEST_F(ScribbledLeaseTest, AWaiterWithAVgpuIndexOutOfRangeIsSkippedAndTheHolderRenewsAndReleases) {
  uint32_t a = 0, sa = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("a", kGiB, 500'000, &a), RegionError::kOk);
  ASSERT_EQ(region_.AttachProcess(a, getpid(), &sa), RegionError::kOk);
  RawRegion raw(RegionFile());
  for (uint32_t ghost : {sa + 1, sa + 2}) {
    raw.process(ghost)->state.store(kSlotActive);
    raw.process(ghost)->pid.store(getpid());
    raw.process(ghost)->wait_since_ns.store(1);  // waiting longest of all
  }
  raw.process(sa + 1)->vgpu_index.store(0xFFFFFFFF);  // past the mapping
  raw.process(sa + 2)->vgpu_index.store(kMaxVgpus);   // the first index past the vGPU array
  raw.lease()->wanting.store(2);
  int64_t now = MonotonicNowNs();
  ASSERT_TRUE(region_.TryAcquireLease(sa, now, 10 * kMs).granted);
  EXPECT_TRUE(region_.ExtendLease(sa, now, 10 * kMs, kMs).granted) << "no real waiter to hand over to";
  ASSERT_EQ(region_.ReleaseLease(sa, kMs, now, kMs), RegionError::kOk);
  EXPECT_TRUE(region_.TryAcquireLease(sa, now, kMs).granted) << "no hint for a slot that is no waiter";
}

TEST_F(ScribbledLeaseTest, ALeaseWordOwnedByNoProcessSlotIsTakenAtOnce) {
  uint32_t a = 0, sa = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("a", kGiB, 500'000, &a), RegionError::kOk);
  ASSERT_EQ(region_.AttachProcess(a, getpid(), &sa), RegionError::kOk);
  RawRegion raw(RegionFile());
  const int64_t now = MonotonicNowNs();
  // Owner bits 1023 (slot 1022: there are 512), a deadline 10 s ahead and 10 ms past.
  for (int64_t deadline : {now + 10'000 * kMs, now - 10 * kMs}) {
    const uint64_t ms = (static_cast<uint64_t>(deadline) / 1'000'000) & ((1ULL << 22) - 1);
    raw.lease()->word.store((1023ULL << 54) | (ms << 32) | 7);
    LeaseGrant g = region_.TryAcquireLease(sa, now, kMs);
    EXPECT_TRUE(g.granted) << static_cast<int>(g.denial);
    ASSERT_EQ(region_.ReleaseLease(sa, 0, now), RegionError::kOk);
  }
  EXPECT_EQ(region_.WaitForLease(sa, 50 * kMs), 0) << "nobody holds it: no wait";
}

TEST_F(ScribbledLeaseTest, BucketWordsNearTheInt64LimitsAreReadAsAFullOrEmptyBucket) {
  uint32_t a = 0, sa = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("a", kGiB, 500'000, &a), RegionError::kOk);
  ASSERT_EQ(region_.AttachProcess(a, getpid(), &sa), RegionError::kOk);
  RawRegion raw(RegionFile());
  VgpuSlot* v = raw.vgpu(a);
  int64_t now = MonotonicNowNs();
  // Nearly INT64_MAX tokens and a refill due: a full bucket (its burst), not a wrapped-around debt.
  v->tokens_ns.store(INT64_MAX - 10);
  v->last_refill_ns.store(now - 1000 * kMs);
  ASSERT_TRUE(region_.TryAcquireLease(sa, now, kMs).granted);
  EXPECT_EQ(v->tokens_ns.load(), 50 * kMs) << "the burst of 50%";
  ASSERT_EQ(region_.ReleaseLease(sa, 0, now), RegionError::kOk);
  // A last refill at INT64_MIN: the longest refill there is, a full bucket again.
  v->tokens_ns.store(0);
  v->last_refill_ns.store(INT64_MIN);
  ASSERT_TRUE(region_.TryAcquireLease(sa, now, kMs).granted);
  EXPECT_EQ(v->tokens_ns.load(), 50 * kMs);
  ASSERT_EQ(region_.ReleaseLease(sa, 0, now), RegionError::kOk);
  // INT64_MIN tokens and no refill due: a debt to wait out, for a positive (capped) time.
  v->tokens_ns.store(INT64_MIN);
  v->last_refill_ns.store(now);
  LeaseGrant g = region_.TryAcquireLease(sa, now, kMs);
  EXPECT_EQ(g.denial, LeaseDenial::kNoTokens);
  EXPECT_GT(g.retry_after_ns, 0);
  EXPECT_GT(region_.WaitForLease(sa, kMs), 0) << "waits its timeout out";
  // A provisional charge beyond what INT64_MIN tokens leave is refused, not wrapped into credit.
  v->tokens_ns.store(kMs);
  ASSERT_TRUE(region_.TryAcquireLease(sa, now, kMs).granted);
  v->tokens_ns.store(INT64_MIN + 5);
  EXPECT_EQ(region_.ExtendLease(sa, now, kMs, 10).denial, LeaseDenial::kNoTokens);
}

}  // namespace
}  // namespace tf::limiter::testing
