// The busy correction's writer (hypervisor/busy_correction.h) against a real region file, on
// simulated time: a tenant's governor ticks charge the region, a fake GPU source reports the
// utilization, and the factor the region applies is read back through the limiter's own calls.
#include "hypervisor/busy_correction.h"

#include <stdlib.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "limiter/core/process_identity.h"

namespace tf::hypervisor {
namespace {

constexpr const char* kUuid = "GPU-00000000-aaaa-bbbb-cccc-000000000001";
constexpr int64_t kMs = 1'000'000;

class BusyCorrectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tf-busy-correction-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_EQ(limiter::GpuRegion::Create(dir_.c_str(), kUuid, "Test GPU", 80ULL << 30, 989'000'000, &region_),
              limiter::RegionError::kOk);
    uint32_t v = 0;
    ASSERT_EQ(region_.CreateOrUpdateVgpu("b1", 1ULL << 30, 250'000, 250'000, limiter::kDefaultQos, &v),
              limiter::RegionError::kOk);
    ASSERT_EQ(region_.AttachProcess(v, getpid(), &slot_), limiter::RegionError::kOk);
    DiscoveredGpu g;
    g.uuid = kUuid;
    source_ = std::make_unique<FakeGpuSource>(std::vector<DiscoveredGpu>{g});
  }
  void TearDown() override {
    region_.Detach();
    ASSERT_EQ(system(("rm -rf '" + dir_ + "'").c_str()), 0);
  }
  // `ms` of the tenant keeping work queued in `queued_of_10` ticks of 10; one correction pass per
  // 100 ms by each corrector given.
  void Run(int64_t from_ms, int64_t ms, int queued_of_10, std::vector<BusyCorrection*> correctors) {
    for (int64_t t = from_ms * kMs; t < (from_ms + ms) * kMs; t += kMs / 2) {
      const bool queued = (t / (kMs / 2)) % 10 < queued_of_10;
      region_.ShareTick(slot_, t0_ + t, kMs / 2, queued ? kMs / 2 : 0, queued, false);
      if (t % (100 * kMs) == 0)
        for (BusyCorrection* c : correctors) c->CorrectOnce(t0_ + t);
    }
  }
  uint32_t FactorAt(int64_t ms) const { return region_.BusyCorrectionPpm(t0_ + ms * kMs); }

  const int64_t t0_ = limiter::MonotonicNowNs() + 1000 * kMs;
  std::string dir_;
  limiter::GpuRegion region_;
  uint32_t slot_ = 0;
  std::unique_ptr<FakeGpuSource> source_;
};

TEST_F(BusyCorrectionTest, ChargesFollowTheTimeTheGpuRanKernels) {
  std::vector<std::string> log;
  BusyCorrection c(source_.get(), {region_.path()}, "test", [&](const std::string& l) { log.push_back(l); });
  // Queued 60% of the time, kernels 15%: charges x 0.15 / 0.6 / 0.8.
  source_->utilization_percent = 15;
  Run(0, 2000, 6, {&c});
  EXPECT_NEAR(FactorAt(2000), 312'500.0, 15'000.0);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].find("charges x 0.3"), std::string::npos) << log[0];
  // The GPU fills up (a saturating tenant arrives): back to time shares within a second.
  source_->utilization_percent = 60;
  Run(2000, 1000, 6, {&c});
  EXPECT_EQ(FactorAt(3000), limiter::kShareWholeGpuPpm);
  ASSERT_EQ(log.size(), 2u);
  EXPECT_NE(log[1].find("time shares again"), std::string::npos) << log[1];
}

TEST_F(BusyCorrectionTest, NoReadingOrLittleChargedLeavesTheTimeShares) {
  BusyCorrection c(source_.get(), {region_.path()}, "test", [](const std::string&) {});
  source_->utilization_percent = 0;  // NVML without a sample (and the fake driver)
  Run(0, 1000, 6, {&c});
  EXPECT_EQ(FactorAt(1000), limiter::kShareWholeGpuPpm);
  source_->utilization_percent = 1;  // queued 2% of the time: nothing to correct
  Run(1000, 2000, 0, {&c});
  EXPECT_EQ(FactorAt(3000), limiter::kShareWholeGpuPpm);
}

TEST_F(BusyCorrectionTest, OneWriterAtATimeAndAnotherTakesOverWhenItStops) {
  std::vector<std::string> log_a, log_b;
  BusyCorrection a(source_.get(), {region_.path()}, "a", [&](const std::string& l) { log_a.push_back(l); });
  BusyCorrection b(source_.get(), {region_.path()}, "b", [&](const std::string& l) { log_b.push_back(l); });
  source_->utilization_percent = 20;
  Run(0, 1000, 8, {&a});
  // A second corrector of this GPU (a second `tfusion run`) from the same pid would renew the
  // same setting; from another process it is refused while the first one's is in force.
  const int64_t t = t0_ + 1000 * kMs;
  EXPECT_FALSE(region_.SetBusyCorrection(900'000, getpid() + 1, t, 1000 * kMs));
  // `a` stops (its process ended): its setting lasts kTtlNs, then `b` (a live run) writes.
  Run(1000, 1000, 8, {});
  EXPECT_EQ(FactorAt(2100), limiter::kShareWholeGpuPpm) << "expired";
  Run(2000, 1000, 8, {&b});
  EXPECT_NEAR(FactorAt(3000), 0.2 / 0.8 / 0.8 * 1e6, 20'000.0);
}

TEST_F(BusyCorrectionTest, AGpuWithoutARegionOrASourceThatFailsWritesNothing) {
  BusyCorrection c(source_.get(), {dir_ + "/no-such.region"}, "test", [](const std::string&) {});
  source_->utilization_percent = 10;
  EXPECT_EQ(c.CorrectOnce(t0_), 0);
  EXPECT_EQ(c.CorrectOnce(t0_ + 100 * kMs), 0);
}

}  // namespace
}  // namespace tf::hypervisor
