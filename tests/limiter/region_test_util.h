// Test helpers for the shared GPU region: a private directory per test, forked children that
// report back through a pipe, and raw access to the mapped layout for fault injection.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "limiter/core/gpu_region.h"

namespace tf::limiter::testing {

inline constexpr const char* kUuid = "GPU-00000000-1111-2222-3333-444444444444";
inline constexpr uint64_t kMiB = 1ULL << 20;
inline constexpr uint64_t kGiB = 1ULL << 30;

class RegionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/tf-region-test-XXXXXX";
    char tmpl_tmp[] = "/tmp/tf-region-test-XXXXXX";
    char* d = mkdtemp(tmpl);
    if (d == nullptr) d = mkdtemp(tmpl_tmp);
    ASSERT_NE(d, nullptr);
    root_ = d;
    dir_ = root_ + "/tensorfusion";
    ASSERT_EQ(GpuRegion::Create(dir_.c_str(), kUuid, "Test GPU", 80 * kGiB, 989'000'000, &region_),
              RegionError::kOk);
  }
  void TearDown() override {
    region_.Detach();
    std::string cmd = "rm -rf '" + root_ + "'";
    ASSERT_EQ(system(cmd.c_str()), 0);
  }
  std::string RegionFile() const { return dir_ + "/gpu-" + kUuid + ".region"; }

  std::string root_;
  std::string dir_;
  GpuRegion region_;
};

// Forks; the child runs fn(write_fd) and _exits with its return value. Returns the pid and the
// parent's read end of a pipe the child may write results into.
template <typename Fn>
pid_t ForkChild(Fn fn, int* read_fd = nullptr) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    int rc = fn(fds[1]);
    _exit(rc);
  }
  close(fds[1]);
  if (read_fd != nullptr) {
    *read_fd = fds[0];
  } else {
    close(fds[0]);
  }
  return pid;
}

inline int WaitExit(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

template <typename T>
bool ReadAll(int fd, T* out) {
  size_t got = 0;
  auto* p = reinterpret_cast<char*>(out);
  while (got < sizeof(T)) {
    ssize_t n = read(fd, p + got, sizeof(T) - got);
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return true;
}

template <typename T>
void WriteAll(int fd, const T& v) {
  ssize_t n = write(fd, &v, sizeof(T));
  (void)n;
}

// Maps the region file raw (for fault injection that the API cannot express).
struct RawRegion {
  explicit RawRegion(const std::string& path) {
    int fd = open(path.c_str(), O_RDWR);
    base = static_cast<uint8_t*>(mmap(nullptr, kRegionTotalSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
  }
  ~RawRegion() { munmap(base, kRegionTotalSize); }
  RegionHeader* header() { return reinterpret_cast<RegionHeader*>(base); }
  VgpuSlot* vgpu(uint32_t i) { return reinterpret_cast<VgpuSlot*>(base + kVgpuArrayOffset) + i; }
  ProcessSlot* process(uint32_t i) { return reinterpret_cast<ProcessSlot*>(base + kProcessArrayOffset) + i; }
  LeaseBlock* lease() { return reinterpret_cast<LeaseBlock*>(base + kLeaseOffset); }
  ShareBlock* share() { return reinterpret_cast<ShareBlock*>(base + kShareOffset); }
  uint8_t* base;
};

}  // namespace tf::limiter::testing
