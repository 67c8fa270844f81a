#include "limiter/core/gpu_region.h"

#include <sys/stat.h>

#include <atomic>
#include <cstddef>
#include <string>
#include <thread>

#include "limiter/core/process_identity.h"
#include "tests/limiter/region_test_util.h"

namespace tf::limiter::testing {
namespace {

TEST_F(RegionTest, CreateThenAttachSeesTheSameGpu) {
  EXPECT_STREQ(region_.gpu_uuid(), kUuid);
  EXPECT_STREQ(region_.gpu_name(), "Test GPU");
  EXPECT_EQ(region_.total_vram_bytes(), 80 * kGiB);
  EXPECT_EQ(region_.capacity_mtflops(), 989'000'000u);

  GpuRegion other;
  ASSERT_EQ(GpuRegion::Attach(RegionFile().c_str(), &other), RegionError::kOk);
  EXPECT_STREQ(other.gpu_uuid(), kUuid);
  uint32_t v = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("tenant-a", 8 * kGiB, 300'000, &v), RegionError::kOk);
  uint32_t found = 99;
  ASSERT_EQ(other.FindVgpu("tenant-a", &found), RegionError::kOk);
  EXPECT_EQ(found, v);
  EXPECT_EQ(other.Limit(found), 8 * kGiB);

  struct stat st;
  ASSERT_EQ(stat(RegionFile().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u);
  ASSERT_EQ(stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 01777u);
}

TEST_F(RegionTest, CreateAgainOpensTheExistingRegionAndKeepsItsVgpus) {
  uint32_t v = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("tenant-a", kGiB, 500'000, &v), RegionError::kOk);
  GpuRegion again;
  ASSERT_EQ(GpuRegion::Create(dir_.c_str(), kUuid, "Test GPU", 80 * kGiB, 1'000, &again), RegionError::kOk);
  EXPECT_EQ(again.FindVgpu("tenant-a", nullptr), RegionError::kOk);
  EXPECT_EQ(region_.capacity_mtflops(), 1'000u);  // capacity follows the latest catalog value
}

TEST_F(RegionTest, CreateForADifferentGpuSizeIsRefused) {
  GpuRegion other;
  RegionErrorDetail why;
  EXPECT_EQ(GpuRegion::Create(dir_.c_str(), kUuid, "Test GPU", 40 * kGiB, 1, &other, &why),
            RegionError::kIncompatibleGpu);
  EXPECT_NE(strstr(why.message, kUuid), nullptr) << why.message;
  EXPECT_FALSE(other.attached());
}

TEST_F(RegionTest, VersionMismatchIsRefusedWithAClearError) {
  {
    RawRegion raw(RegionFile());
    raw.header()->layout_version = kLayoutVersion + 1;
  }
  GpuRegion other;
  RegionErrorDetail why;
  EXPECT_EQ(GpuRegion::Attach(RegionFile().c_str(), &other, &why), RegionError::kVersionMismatch);
  EXPECT_NE(strstr(why.message, ("layout_version " + std::to_string(kLayoutVersion + 1)).c_str()), nullptr)
      << why.message;
  EXPECT_FALSE(other.attached());
  // Create must not paper over it either.
  EXPECT_EQ(GpuRegion::Create(dir_.c_str(), kUuid, "Test GPU", 80 * kGiB, 1, &other),
            RegionError::kVersionMismatch);
}

TEST_F(RegionTest, SlotSizeMismatchIsRefused) {
  {
    RawRegion raw(RegionFile());
    raw.header()->vgpu_slot_size = 128;
  }
  GpuRegion other;
  EXPECT_EQ(GpuRegion::Attach(RegionFile().c_str(), &other), RegionError::kLayoutMismatch);
}

TEST_F(RegionTest, TruncatedFileIsRefused) {
  ASSERT_EQ(truncate(RegionFile().c_str(), kRegionTotalSize - 64), 0);
  GpuRegion other;
  RegionErrorDetail why;
  EXPECT_EQ(GpuRegion::Attach(RegionFile().c_str(), &other, &why), RegionError::kTruncated);
  ASSERT_EQ(truncate(RegionFile().c_str(), 100), 0);
  EXPECT_EQ(GpuRegion::Attach(RegionFile().c_str(), &other, &why), RegionError::kTruncated);
  EXPECT_FALSE(other.attached());
}

TEST_F(RegionTest, ForeignFileAndMissingFileAreRefused) {
  std::string junk = dir_ + "/junk";
  int fd = open(junk.c_str(), O_CREAT | O_WRONLY, 0600);
  char zeros[1024] = {'x'};
  ASSERT_EQ(write(fd, zeros, sizeof(zeros)), static_cast<ssize_t>(sizeof(zeros)));
  close(fd);
  GpuRegion other;
  EXPECT_EQ(GpuRegion::Attach(junk.c_str(), &other), RegionError::kBadMagic);
  EXPECT_EQ(GpuRegion::Attach((dir_ + "/nope").c_str(), &other), RegionError::kNotFound);
}

TEST_F(RegionTest, ConcurrentCreatorsAllEndUpOnOneRegion) {
  std::string dir2 = root_ + "/race";
  pid_t kids[4];
  for (pid_t& k : kids) {
    k = ForkChild([&](int) {
      GpuRegion r;
      if (GpuRegion::Create(dir2.c_str(), kUuid, "Test GPU", kGiB, 1, &r) != RegionError::kOk) return 1;
      uint32_t v;
      return r.CreateOrUpdateVgpu("shared", kGiB, 1'000'000, &v) == RegionError::kOk ? 0 : 2;
    });
  }
  for (pid_t k : kids) EXPECT_EQ(WaitExit(k), 0);
  GpuRegion r;
  ASSERT_EQ(GpuRegion::Create(dir2.c_str(), kUuid, "Test GPU", kGiB, 1, &r), RegionError::kOk);
  RegionSnapshot* snap = new RegionSnapshot;
  r.Snapshot(snap);
  EXPECT_EQ(snap->vgpu_count, 1u);  // all four saw the same region, not four private ones
  delete snap;
}

TEST_F(RegionTest, VgpuTableCreateUpdateFindRemove) {
  uint32_t a = 0, b = 0, again = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("a", kGiB, 250'000, &a), RegionError::kOk);
  ASSERT_EQ(region_.CreateOrUpdateVgpu("b", 2 * kGiB, 1'000'000, &b), RegionError::kOk);
  EXPECT_NE(a, b);
  ASSERT_EQ(region_.CreateOrUpdateVgpu("a", 3 * kGiB, 250'000, &again), RegionError::kOk);
  EXPECT_EQ(again, a);
  EXPECT_EQ(region_.Limit(a), 3 * kGiB);
  EXPECT_EQ(region_.CreateOrUpdateVgpu("", kGiB, 1, nullptr), RegionError::kInvalidArgument);
  EXPECT_EQ(region_.CreateOrUpdateVgpu("z", kGiB, 0, nullptr), RegionError::kInvalidArgument);
  EXPECT_EQ(region_.CreateOrUpdateVgpu(std::string(64, 'x').c_str(), kGiB, 1, nullptr),
            RegionError::kInvalidArgument);

  uint32_t slot = 0;
  ASSERT_EQ(region_.AttachProcess(a, getpid(), &slot), RegionError::kOk);
  EXPECT_EQ(region_.RemoveVgpu(a), RegionError::kBusy);  // a live process still uses it
  ASSERT_EQ(region_.DetachProcess(slot), RegionError::kOk);
  EXPECT_EQ(region_.RemoveVgpu(a), RegionError::kOk);
  EXPECT_EQ(region_.FindVgpu("a", nullptr), RegionError::kNotFound);
  EXPECT_EQ(region_.FindVgpu("b", nullptr), RegionError::kOk);
  // An index looked up for "a" whose slot another vGPU took since: left alone when the id is given.
  uint32_t c = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("c", kGiB, 250'000, &c), RegionError::kOk);
  EXPECT_EQ(c, a) << "the freed slot is reused";
  EXPECT_EQ(region_.RemoveVgpu(a, "a"), RegionError::kNotFound);
  EXPECT_EQ(region_.FindVgpu("c", nullptr), RegionError::kOk);
  EXPECT_EQ(region_.RemoveVgpu(c, "c"), RegionError::kOk);
  EXPECT_EQ(region_.FindVgpu("c", nullptr), RegionError::kNotFound);
}

TEST_F(RegionTest, VgpuTableIsFullAt64) {
  for (uint32_t i = 0; i < kMaxVgpus; ++i) {
    ASSERT_EQ(region_.CreateOrUpdateVgpu(("v" + std::to_string(i)).c_str(), kGiB, 1000, nullptr),
              RegionError::kOk);
  }
  EXPECT_EQ(region_.CreateOrUpdateVgpu("one-more", kGiB, 1000, nullptr), RegionError::kFull);
}

TEST_F(RegionTest, AttachProcessRefusesUnknownPidAndReusesReapedSlots) {
  uint32_t v = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("a", kGiB, 1'000'000, &v), RegionError::kOk);
  pid_t child = ForkChild([](int) { return 0; });
  ASSERT_EQ(WaitExit(child), 0);
  EXPECT_EQ(region_.AttachProcess(v, child, nullptr), RegionError::kNotFound);

  // Fill the table with one live process, then make every entry but one dead by forging
  // start times (pid reuse): a full table reaps and retries.
  RawRegion raw(RegionFile());
  for (uint32_t i = 0; i < kMaxProcesses; ++i) {
    ASSERT_EQ(region_.AttachProcess(v, getpid(), nullptr), RegionError::kOk);
  }
  EXPECT_EQ(region_.AttachProcess(v, getpid(), nullptr), RegionError::kFull);
  for (uint32_t i = 1; i < kMaxProcesses; ++i) raw.process(i)->start_time_ticks.store(1);
  uint32_t slot = 0;
  ASSERT_EQ(region_.AttachProcess(v, getpid(), &slot), RegionError::kOk);
  EXPECT_NE(slot, 0u);
  RegionSnapshot* snap = new RegionSnapshot;
  region_.Snapshot(snap);
  EXPECT_EQ(snap->process_count, 2u);
  delete snap;
}

TEST_F(RegionTest, SnapshotListsVgpusAndProcesses) {
  uint32_t v = 0, slot = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("tenant-a", 4 * kGiB, 400'000, &v), RegionError::kOk);
  ASSERT_EQ(region_.AttachProcess(v, getpid(), &slot), RegionError::kOk);
  ASSERT_EQ(region_.Reserve(slot, 3 * kMiB), RegionError::kOk);
  region_.CountLaunches(slot, 7);
  RegionSnapshot* snap = new RegionSnapshot;
  region_.Snapshot(snap);
  EXPECT_STREQ(snap->gpu_uuid, kUuid);
  ASSERT_EQ(snap->vgpu_count, 1u);
  EXPECT_STREQ(snap->vgpus[0].id, "tenant-a");
  EXPECT_EQ(snap->vgpus[0].vram_used_bytes, 3 * kMiB);
  EXPECT_EQ(snap->vgpus[0].vram_limit_bytes, 4 * kGiB);
  EXPECT_EQ(snap->vgpus[0].compute_share_ppm, 400'000u);
  EXPECT_EQ(snap->vgpus[0].launches_total, 7u);
  EXPECT_EQ(snap->vgpus[0].process_count, 1u);
  ASSERT_EQ(snap->process_count, 1u);
  EXPECT_EQ(snap->processes[0].pid, getpid());
  EXPECT_EQ(snap->processes[0].vram_bytes, 3 * kMiB);
  EXPECT_EQ(snap->lease_owner_slot, -1);
  delete snap;
}

// Any tenant can write any byte of the region. A dead slot whose vgpu_index is past the vGPU array
// (0xFFFFFFFF: outside the mapping; 100: inside it, over the process array) is freed by the reap of
// a full table, without locking or writing anything at that index.
TEST_F(RegionTest, AFullTableReapsSlotsScribbledWithAVgpuIndexOutOfRangeWithoutTouchingThatIndex) {
  uint32_t v = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("a", kGiB, 1'000'000, &v), RegionError::kOk);
  RawRegion raw(RegionFile());
  for (uint32_t i = 0; i < kMaxProcesses; ++i) ASSERT_EQ(region_.AttachProcess(v, getpid(), nullptr), RegionError::kOk);
  // vGPU 100's vram_used_bytes would be a word of another process slot.
  uint8_t* used_100 = raw.base + kVgpuArrayOffset + 100 * sizeof(VgpuSlot) + offsetof(VgpuSlot, vram_used_bytes);
  const uint64_t victim = 12345;
  memcpy(used_100, &victim, sizeof(victim));
  for (uint32_t slot : {7u, 9u}) {
    raw.process(slot)->pid.store(0);
    raw.process(slot)->vram_bytes.store(5 * kMiB);
  }
  raw.process(7)->vgpu_index.store(100);
  raw.process(9)->vgpu_index.store(0xFFFFFFFF);

  uint32_t slot = 0;
  ASSERT_EQ(region_.AttachProcess(v, getpid(), &slot), RegionError::kOk);
  EXPECT_TRUE(slot == 7 || slot == 9) << slot;
  uint64_t after = 0;
  memcpy(&after, used_100, sizeof(after));
  EXPECT_EQ(after, victim) << "the reap wrote through the scribbled index";
  RegionSnapshot* snap = new RegionSnapshot;
  region_.Snapshot(snap);
  EXPECT_EQ(snap->process_count, kMaxProcesses - 1) << "both scribbled slots freed, one reused";
  delete snap;
  EXPECT_EQ(region_.ReapDead(), 0u);
}

// A tenant flipping another process's slot between its vGPU and an index out of range: the
// victim's calls each see one index (valid: they work; not: kInvalidArgument), never a checked
// one and then the other. The victim runs in a child so that a crash is reported, not suffered.
TEST_F(RegionTest, AProcessWhoseSlotIsFlippedToAnIndexOutOfRangeSurvivesEveryCall) {
  uint32_t v = 0, w = 0;
  ASSERT_EQ(region_.CreateOrUpdateVgpu("victim", kGiB, 300'000, 600'000, kDefaultQos, &v), RegionError::kOk);
  ASSERT_EQ(region_.CreateOrUpdateVgpu("lease", kGiB, 300'000, &w), RegionError::kOk);
  const std::string file = RegionFile();
  std::atomic<bool> stop{false};
  int fd = -1;
  pid_t kid = ForkChild([&](int out) {
    GpuRegion r;
    if (GpuRegion::Attach(file.c_str(), &r) != RegionError::kOk) return 10;
    uint32_t share_slot = 0, lease_slot = 0;
    if (r.AttachProcess(v, getpid(), &share_slot) != RegionError::kOk) return 11;
    if (r.AttachProcess(w, getpid(), &lease_slot) != RegionError::kOk) return 12;
    WriteAll(out, share_slot);
    WriteAll(out, lease_slot);
    ShareTurn turn{25'000'000, 100'000'000};
    const int64_t end = MonotonicNowNs() + 400'000'000;
    for (int64_t now = MonotonicNowNs(); now < end; now = MonotonicNowNs()) {
      for (uint32_t s : {share_slot, lease_slot}) {
        if (r.Reserve(s, kMiB) == RegionError::kOk) r.Release(s, kMiB);
        r.CountLaunches(s, 1);
        r.ShareTick(s, now, 500'000, 500'000, true, false, &turn);
        LeaseGrant g = r.TryAcquireLease(s, now, 1'000'000);
        if (g.granted) {
          r.ExtendLease(s, now, 1'000'000, 0);
          r.ReleaseLease(s, 1000, now);
        } else {
          r.WaitForLease(s, 1000);
          r.CancelWait(s);
        }
      }
    }
    return 0;
  }, &fd);
  uint32_t share_slot = 0, lease_slot = 0;
  ASSERT_TRUE(ReadAll(fd, &share_slot));
  ASSERT_TRUE(ReadAll(fd, &lease_slot));
  close(fd);
  RawRegion raw(RegionFile());
  std::thread flipper([&] {
    std::atomic<uint32_t>* a = &raw.process(share_slot)->vgpu_index;
    std::atomic<uint32_t>* b = &raw.process(lease_slot)->vgpu_index;
    while (!stop.load(std::memory_order_relaxed)) {
      a->store(0xFFFFFFFF, std::memory_order_relaxed);
      b->store(0xFFFFFFFF, std::memory_order_relaxed);
      a->store(v, std::memory_order_relaxed);
      b->store(w, std::memory_order_relaxed);
    }
  });
  const int rc = WaitExit(kid);
  stop = true;
  flipper.join();
  EXPECT_EQ(rc, 0) << "the victim died of signal " << rc - 128;
}

}  // namespace
}  // namespace tf::limiter::testing
