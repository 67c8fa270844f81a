// `tfusion run --remote HOST --vram/--percent`: the worker makes the client a vGPU of its own,
// enforced by the limiter in the session, and removes it when the session ends. End to end on
// the fake driver and NVML: tfusion worker, tfusion run --remote, remote_probe.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>

#include "cli_test_util.h"

namespace {

using tf::cli::testing::ReadFile;
using tf::cli::testing::Result;
using tf::cli::testing::Shell;

class RemoteLimits : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tf-remote-limits.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    env_ = "TFUSION_SHM_DIR=" + dir_ + "/shm ";
    std::string cmd = env_ + "exec " + std::string(TF_TFUSION) + " worker --listen unix:" + dir_ +
                      "/w.sock --token t --driver " + TF_FAKECUDA + " --nvml " + TF_FAKENVML +
                      " --ready-file " + dir_ + "/ready > " + dir_ + "/worker.log 2>&1";
    worker_ = fork();
    ASSERT_GE(worker_, 0);
    if (worker_ == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 100 && access((dir_ + "/ready").c_str(), F_OK) != 0; ++i) usleep(50000);
    ASSERT_EQ(access((dir_ + "/ready").c_str(), F_OK), 0) << ReadFile(dir_ + "/worker.log");
  }
  void TearDown() override {
    if (worker_ > 0) {
      kill(worker_, SIGTERM);
      waitpid(worker_, nullptr, 0);
    }
    Shell("rm -rf " + dir_);
  }
  Result Run(const std::string& flags) {
    return Shell(env_ + "timeout 60 " + TF_TFUSION + " run --remote unix:" + dir_ +
                 "/w.sock --token t " + flags + " -- " + TF_REMOTE_PROBE + " fill");
  }
  std::string dir_, env_;
  pid_t worker_ = -1;
};

TEST_F(RemoteLimits, TheClientGetsTheVramItAskedForAndTheVgpuGoesWithTheSession) {
  Result r = Run("--vram 64MiB --percent 50");
  ASSERT_EQ(r.rc, 0) << r.out << ReadFile(dir_ + "/worker.log");
  EXPECT_NE(r.out.find("fill_total_mib=64\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fill_error=2\n"), std::string::npos) << r.out;  // out of memory
  EXPECT_NE(r.out.find("meminfo_total_mib=64\n"), std::string::npos) << r.out;
  // The session's vGPU is removed once the session process is gone.
  std::string smi;
  for (int i = 0; i < 40; ++i) {
    smi = Shell(env_ + TF_TFUSION + " smi").out;
    if (smi.find("remote-") == std::string::npos) break;
    usleep(100000);
  }
  EXPECT_EQ(smi.find("remote-"), std::string::npos) << smi;
}

TEST_F(RemoteLimits, WithoutLimitsTheClientGetsTheWholeGpu) {
  Result r = Run("");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("meminfo_total_mib=16384\n"), std::string::npos) << r.out;
}

TEST_F(RemoteLimits, LimitsTheGpuCannotGiveAreRefusedWithAReason) {
  Result r = Run("--vram 9000TiB");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("the worker refused the vGPU"), std::string::npos) << r.out;
  EXPECT_NE(ReadFile(dir_ + "/worker.log").find("is more than GPU 0"), std::string::npos);
  Result bad = Run("--vram lots");  // refused by tfusion run before anything starts
  EXPECT_EQ(bad.rc, 2) << bad.out;
  Result both = Run("--tflops 10 --percent 10");
  EXPECT_EQ(both.rc, 2) << both.out;
  EXPECT_NE(both.out.find("not both"), std::string::npos) << both.out;
}

}  // namespace
