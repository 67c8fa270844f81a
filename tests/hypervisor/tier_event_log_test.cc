// The node agent's log of swaps (TierEventLog) read from a real GPU region: one line per event
// with its cause and MiB per tier, a burst beyond the ring said as such, and records that another
// process wrote out of range refused rather than shown.
#include "hypervisor/tier_event_log.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <regex>
#include <string>
#include <vector>

namespace tf::hypervisor {
namespace {

class TierEventLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tf-tierlog-XXXXXX";
    dir_ = mkdtemp(tmpl);
    ASSERT_EQ(limiter::GpuRegion::Create(dir_.c_str(), "GPU-log", "Test GPU", 80ull << 30, 1'000, &region_),
              limiter::RegionError::kOk);
    uint32_t index = 0;
    ASSERT_EQ(region_.CreateOrUpdateVgpu("a-17", 8ull << 30, 500'000, &index), limiter::RegionError::kOk);
    ASSERT_EQ(region_.AttachProcess(index, getpid(), &slot_), limiter::RegionError::kOk);
  }
  void TearDown() override {
    region_.DetachProcess(slot_);
    region_.Detach();
    EXPECT_EQ(system(("rm -rf '" + dir_ + "'").c_str()), 0);
  }
  void Record(uint32_t kind, uint32_t cause, uint32_t us, uint64_t host_mib, uint64_t disk_mib) {
    limiter::TierEvent e;
    e.kind = kind;
    e.cause = cause;
    e.duration_us = us;
    e.host_bytes = host_mib << 20;
    e.disk_bytes = disk_mib << 20;
    region_.RecordTierEvent(slot_, e);
  }

  std::string dir_;
  limiter::GpuRegion region_;
  uint32_t slot_ = 0;
};

TEST_F(TierEventLogTest, LogsEachEventOnceWithItsCauseAndRefusesWhatIsOutOfRange) {
  std::vector<std::string> lines;
  TierEventLog log({region_.path()}, "hypervisor", [&](const std::string& l) { lines.push_back(l); });
  Record(limiter::kTierEventSwapOut, limiter::kTierCauseIdle, 5'000, 64, 0);
  EXPECT_EQ(log.ScanOnce(), 0) << "events from before the agent's first look are not repeated";

  Record(limiter::kTierEventSwapOut, limiter::kTierCausePressure, 12'345, 200, 0);
  Record(limiter::kTierEventSwapIn, limiter::kTierCauseCall, 2'500'000, 150, 50);
  EXPECT_EQ(log.ScanOnce(), 2);
  EXPECT_EQ(log.ScanOnce(), 0) << "nothing per tick";
  ASSERT_EQ(lines.size(), 2u);
  const std::string who = "vGPU a-17: process " + std::to_string(getpid()) + " \\([^)]+\\) ";
  EXPECT_TRUE(std::regex_match(lines[0], std::regex(who + "swapped out 200 MiB to host memory in 12\\.3 ms "
                                                          "\\(cause: pressure\\)")))
      << lines[0];
  EXPECT_TRUE(std::regex_match(lines[1], std::regex(who + "swapped in 200 MiB \\(150 MiB from host memory, 50 MiB "
                                                          "from the disk tier\\) in 2500\\.0 ms \\(cause: GPU call\\)")))
      << lines[1];

  // Five more before the next look: the ring holds three.
  for (int i = 0; i < 5; ++i) Record(limiter::kTierEventToDisk, limiter::kTierCauseIdle, 1'000, 0, 10 + i);
  lines.clear();
  EXPECT_EQ(log.ScanOnce(), 4);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_NE(lines[0].find("2 swap event(s) not logged (more than 3 since the last look)"), std::string::npos)
      << lines[0];
  EXPECT_NE(lines[3].find("moved 14 MiB from host memory to the disk tier in 1.0 ms (cause: idle)"),
            std::string::npos) << lines[3];

  // Records written by another process are input: an unknown cause, or more MiB than the GPU has.
  Record(limiter::kTierEventSwapOut, 9, 1'000, 64, 0);
  Record(limiter::kTierEventSwapOut, limiter::kTierCauseFreeze, 1'000, 100u << 10, 0);
  lines.clear();
  EXPECT_EQ(log.ScanOnce(), 2);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("swap event 9 unreadable (overwritten or invalid)"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("swap event 10 unreadable (overwritten or invalid)"), std::string::npos) << lines[1];
}

}  // namespace
}  // namespace tf::hypervisor
