#include <time.h>

#include <random>

#include "limiter/core/process_identity.h"
#include "limiter/core/robust_mutex.h"
#include "tests/limiter/region_test_util.h"

namespace tf::limiter::testing {
namespace {

class VramLedgerTest : public RegionTest {
 protected:
  void SetUp() override {
    RegionTest::SetUp();
    ASSERT_EQ(region_.CreateOrUpdateVgpu("tenant", kLimit, 1'000'000, &vgpu_), RegionError::kOk);
  }
  static constexpr uint64_t kLimit = 64 * kMiB;
  uint32_t vgpu_ = 0;
};

TEST_F(VramLedgerTest, ReserveUpToTheLimitThenOneByteMoreIsOom) {
  uint32_t slot = 0;
  ASSERT_EQ(region_.AttachProcess(vgpu_, getpid(), &slot), RegionError::kOk);
  ASSERT_EQ(region_.Reserve(slot, kLimit - 2 * kMiB), RegionError::kOk);
  ASSERT_EQ(region_.Reserve(slot, 2 * kMiB), RegionError::kOk);
  EXPECT_EQ(region_.Used(vgpu_), kLimit);
  EXPECT_EQ(region_.Reserve(slot, 1), RegionError::kOutOfMemory);
  EXPECT_EQ(region_.Used(vgpu_), kLimit);
  ASSERT_EQ(region_.Release(slot, 2 * kMiB), RegionError::kOk);
  EXPECT_EQ(region_.Reserve(slot, 2 * kMiB + 1), RegionError::kOutOfMemory);
  EXPECT_EQ(region_.Reserve(slot, 2 * kMiB), RegionError::kOk);
  EXPECT_EQ(region_.Reserve(slot, UINT64_MAX), RegionError::kOutOfMemory);  // no overflow
  RegionSnapshot* snap = new RegionSnapshot;
  region_.Snapshot(snap);
  EXPECT_EQ(snap->vgpus[0].oom_total, 3u);
  delete snap;
}

TEST_F(VramLedgerTest, ReleaseNeverUnderflowsAndCountsDrift) {
  uint32_t slot = 0;
  ASSERT_EQ(region_.AttachProcess(vgpu_, getpid(), &slot), RegionError::kOk);
  ASSERT_EQ(region_.Reserve(slot, 10 * kMiB), RegionError::kOk);
  EXPECT_EQ(region_.Release(slot, 11 * kMiB), RegionError::kInvalidArgument);
  EXPECT_EQ(region_.Used(vgpu_), 0u);
  EXPECT_EQ(region_.ProcessBytes(slot), 0u);
  EXPECT_EQ(region_.Release(slot, 1), RegionError::kInvalidArgument);
  EXPECT_EQ(region_.Used(vgpu_), 0u);
  RegionSnapshot* snap = new RegionSnapshot;
  region_.Snapshot(snap);
  EXPECT_EQ(snap->vgpus[0].drift_events, 2u);
  delete snap;
}

TEST_F(VramLedgerTest, LoweredLimitBlocksFurtherReservations) {
  uint32_t slot = 0;
  ASSERT_EQ(region_.AttachProcess(vgpu_, getpid(), &slot), RegionError::kOk);
  ASSERT_EQ(region_.Reserve(slot, 32 * kMiB), RegionError::kOk);
  ASSERT_EQ(region_.CreateOrUpdateVgpu("tenant", 16 * kMiB, 1'000'000, nullptr), RegionError::kOk);
  EXPECT_EQ(region_.Reserve(slot, 1), RegionError::kOutOfMemory);
  ASSERT_EQ(region_.Release(slot, 32 * kMiB), RegionError::kOk);
  EXPECT_EQ(region_.Reserve(slot, 16 * kMiB), RegionError::kOk);
}

TEST_F(VramLedgerTest, DetachReturnsTheProcessesBytes) {
  uint32_t a = 0, b = 0;
  ASSERT_EQ(region_.AttachProcess(vgpu_, getpid(), &a), RegionError::kOk);
  ASSERT_EQ(region_.AttachProcess(vgpu_, getpid(), &b), RegionError::kOk);
  ASSERT_EQ(region_.Reserve(a, 10 * kMiB), RegionError::kOk);
  ASSERT_EQ(region_.Reserve(b, 20 * kMiB), RegionError::kOk);
  ASSERT_EQ(region_.DetachProcess(a), RegionError::kOk);
  EXPECT_EQ(region_.Used(vgpu_), 20 * kMiB);
  EXPECT_EQ(region_.Reserve(a, 1), RegionError::kInvalidArgument);  // slot no longer ours
}

// Children reserve and release random amounts as fast as they can; every sample of the vGPU's
// usage, taken by the children themselves and by the parent, stays within the limit, and the
// ledger ends at zero.
void HammerFromProcesses(const std::string& file, uint32_t vgpu, int nproc) {
  constexpr int kIters = 20000;
  constexpr uint64_t kLimit = 64 * kMiB;
  pid_t kids[8];
  int fds[8];
  for (int k = 0; k < nproc; ++k) {
    kids[k] = ForkChild(
        [&, k](int out) {
          GpuRegion r;
          if (GpuRegion::Attach(file.c_str(), &r) != RegionError::kOk) return 10;
          uint32_t slot;
          if (r.AttachProcess(vgpu, getpid(), &slot) != RegionError::kOk) return 11;
          std::mt19937_64 rng(static_cast<uint64_t>(k) * 7919 + 1);
          uint64_t ok = 0, over = 0;
          for (int i = 0; i < kIters; ++i) {
            uint64_t bytes = 1 + rng() % (kLimit / 3);
            if (r.Reserve(slot, bytes) == RegionError::kOk) {
              ++ok;
              if (r.Used(vgpu) > kLimit) ++over;
              if (r.Release(slot, bytes) != RegionError::kOk) return 12;
            }
            if (r.Used(vgpu) > kLimit) ++over;
          }
          WriteAll(out, ok);
          WriteAll(out, over);
          return r.DetachProcess(slot) == RegionError::kOk ? 0 : 13;
        },
        &fds[k]);
  }
  uint64_t total_ok = 0;
  for (int k = 0; k < nproc; ++k) {
    uint64_t ok = 0, over = 1;
    ASSERT_TRUE(ReadAll(fds[k], &ok));
    ASSERT_TRUE(ReadAll(fds[k], &over));
    close(fds[k]);
    EXPECT_EQ(over, 0u) << "child " << k << " saw usage above the limit";
    total_ok += ok;
    EXPECT_EQ(WaitExit(kids[k]), 0);
  }
  EXPECT_GT(total_ok, static_cast<uint64_t>(kIters));  // there was real contention and success
}

TEST_F(VramLedgerTest, TwoProcessesHammeringNeverExceedTheLimitAndEndAtZero) {
  HammerFromProcesses(RegionFile(), vgpu_, 2);
  EXPECT_EQ(region_.Used(vgpu_), 0u);
}

TEST_F(VramLedgerTest, FourProcessesHammeringNeverExceedTheLimitAndEndAtZero) {
  HammerFromProcesses(RegionFile(), vgpu_, 4);
  EXPECT_EQ(region_.Used(vgpu_), 0u);
  RegionSnapshot* snap = new RegionSnapshot;
  region_.Snapshot(snap);
  EXPECT_EQ(snap->vgpus[0].drift_events, 0u);
  EXPECT_EQ(snap->process_count, 0u);
  delete snap;
}

// kill -9 lands at a random instruction of a reserve/release loop (sometimes inside the robust
// mutex, between the two counter updates). After the reap, the ledger equals what live processes
// hold.
TEST_F(VramLedgerTest, KillNineMidReserveLeavesNoQuotaBehind) {
  uint32_t mine = 0;
  ASSERT_EQ(region_.AttachProcess(vgpu_, getpid(), &mine), RegionError::kOk);
  ASSERT_EQ(region_.Reserve(mine, 5 * kMiB), RegionError::kOk);
  std::mt19937 rng(12345);
  const std::string file = RegionFile();
  for (int round = 0; round < 40; ++round) {
    int fd = -1;
    pid_t kid = ForkChild([&](int out) {
      GpuRegion r;
      if (GpuRegion::Attach(file.c_str(), &r) != RegionError::kOk) return 10;
      uint32_t slot;
      if (r.AttachProcess(vgpu_, getpid(), &slot) != RegionError::kOk) return 11;
      char ready = 1;
      WriteAll(out, ready);
      uint64_t held[8] = {};
      for (uint64_t i = 0;; ++i) {  // keeps a changing amount reserved until killed
        uint64_t& h = held[i % 8];
        if (h != 0) r.Release(slot, h);
        h = 1 + (i * 2654435761u) % (4 * kMiB);
        if (r.Reserve(slot, h) != RegionError::kOk) h = 0;
      }
    }, &fd);
    ASSERT_GT(kid, 0);
    char ready = 0;
    ASSERT_TRUE(ReadAll(fd, &ready));
    close(fd);
    timespec ts{0, static_cast<long>(rng() % 3'000'000)};
    nanosleep(&ts, nullptr);
    kill(kid, SIGKILL);
    EXPECT_EQ(WaitExit(kid), 128 + SIGKILL);
    region_.ReapDead();
    ASSERT_EQ(region_.Used(vgpu_), 5 * kMiB) << "round " << round;
    ASSERT_EQ(region_.Reserve(mine, 1), RegionError::kOk);  // the mutex is usable again
    ASSERT_EQ(region_.Release(mine, 1), RegionError::kOk);
  }
  ASSERT_EQ(region_.Release(mine, 5 * kMiB), RegionError::kOk);
  EXPECT_EQ(region_.Used(vgpu_), 0u);
}

// The worst instant, forced: the holder dies inside the vGPU mutex after updating its process
// slot and before the vGPU total. The next locker recovers (EOWNERDEAD) from the slots.
TEST_F(VramLedgerTest, DeathInsideTheMutexIsRepairedByTheNextLocker) {
  uint32_t mine = 0;
  ASSERT_EQ(region_.AttachProcess(vgpu_, getpid(), &mine), RegionError::kOk);
  ASSERT_EQ(region_.Reserve(mine, kMiB), RegionError::kOk);
  const std::string file = RegionFile();
  uint32_t v = vgpu_;
  pid_t kid = ForkChild([&](int) {
    GpuRegion r;
    uint32_t slot;
    if (GpuRegion::Attach(file.c_str(), &r) != RegionError::kOk) return 10;
    if (r.AttachProcess(v, getpid(), &slot) != RegionError::kOk) return 11;
    if (r.Reserve(slot, 3 * kMiB) != RegionError::kOk) return 12;
    RawRegion raw(file);
    if (LockRobust(&raw.vgpu(v)->mutex, nullptr, nullptr) != RegionError::kOk) return 13;
    raw.process(slot)->vram_bytes.fetch_add(7 * kMiB);  // half of a reservation
    kill(getpid(), SIGKILL);
    return 14;
  });
  EXPECT_EQ(WaitExit(kid), 128 + SIGKILL);
  // Before reaping, the next lock recovers: the total is rebuilt from the slots (1 + 10 MiB).
  ASSERT_EQ(region_.Reserve(mine, kMiB), RegionError::kOk);
  EXPECT_EQ(region_.Used(vgpu_), 12 * kMiB);
  EXPECT_EQ(region_.ReapDead(), 1u);
  EXPECT_EQ(region_.Used(vgpu_), 2 * kMiB);
}

TEST_F(VramLedgerTest, OomReapsDeadProcessesOfTheVgpuAndRetries) {
  const std::string file = RegionFile();
  uint32_t v = vgpu_;
  pid_t kid = ForkChild([&](int) {
    GpuRegion r;
    uint32_t slot;
    if (GpuRegion::Attach(file.c_str(), &r) != RegionError::kOk) return 10;
    if (r.AttachProcess(v, getpid(), &slot) != RegionError::kOk) return 11;
    return r.Reserve(slot, kLimit) == RegionError::kOk ? 0 : 12;  // exits without releasing
  });
  ASSERT_EQ(WaitExit(kid), 0);
  EXPECT_EQ(region_.Used(vgpu_), kLimit);
  uint32_t mine = 0;
  ASSERT_EQ(region_.AttachProcess(vgpu_, getpid(), &mine), RegionError::kOk);
  EXPECT_EQ(region_.Reserve(mine, kLimit), RegionError::kOk);
}

TEST_F(VramLedgerTest, ZombieAndPidReuseCountAsDead) {
  uint32_t slot = 0;
  ASSERT_EQ(region_.AttachProcess(vgpu_, getpid(), &slot), RegionError::kOk);
  ASSERT_EQ(region_.Reserve(slot, kMiB), RegionError::kOk);
  EXPECT_EQ(region_.ReapDead(), 0u);  // we are alive
  RawRegion raw(RegionFile());
  raw.process(slot)->start_time_ticks.fetch_add(1);  // as if our pid now named another process
  EXPECT_EQ(region_.ReapDead(), 1u);
  EXPECT_EQ(region_.Used(vgpu_), 0u);

  int fd = -1;
  pid_t kid = ForkChild([](int out) {
    char c;
    WriteAll(out, c = 1);
    pause();
    return 0;
  }, &fd);
  char c;
  ASSERT_TRUE(ReadAll(fd, &c));
  close(fd);
  uint32_t kslot = 0;
  ASSERT_EQ(region_.AttachProcess(vgpu_, kid, &kslot), RegionError::kOk);
  kill(kid, SIGKILL);
  // Not yet waited for: a zombie. It must still count as dead.
  for (int i = 0; i < 200; ++i) {
    ProcessStat st;
    if (ReadProcessStat(kid, &st) && st.state == 'Z') break;
    usleep(1000);
  }
  EXPECT_EQ(region_.ReapDead(), 1u);
  WaitExit(kid);
}

}  // namespace
}  // namespace tf::limiter::testing
