// MPS where an operator runs it: `tfusion run --mps-pipe-dir DIR` (or TFUSION_MPS_PIPE_DIRECTORY,
// or what the node agent published) starts the tenant with the MPS client environment derived
// from its vGPU's limits. Asserted on what the tenant sees (its environment) with the fake driver
// and NVML; the "daemon" is a folder holding a FIFO named control (nvidia-cuda-mps-control -d
// leaves a socket of that name; either is accepted). No MPS daemon runs here: whether the driver
// honours the variables is for a GPU host (tests/gpu/colocation.sh --mps).
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "cli_test_util.h"

namespace {

using tf::cli::testing::ReadFile;
using tf::cli::testing::Result;
using tf::cli::testing::Shell;

class MpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tf-mps-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    env_ = "TFUSION_SHM_DIR=" + dir_ + "/shm FAKECUDA_SHM_NAME=/tf-mps-" + std::to_string(getpid()) + " ";
    pipe_ = dir_ + "/mps-pipe";
    ASSERT_EQ(Shell("mkdir -p " + pipe_ + " " + dir_ + "/shm && mkfifo " + pipe_ + "/control").rc, 0);
  }
  void TearDown() override {
    if (up_ > 0) {
      kill(up_, SIGTERM);
      waitpid(up_, nullptr, 0);
    }
    Shell("rm -rf '" + dir_ + "'");
    tf::cli::testing::RemoveFakeDriverShm("tf-mps-" + std::to_string(getpid()));
  }
  // `tfusion run FLAGS -- sh -c 'env'` on the fake GPU: the tenant's CUDA_MPS_* variables, one
  // per line, then "ran" (so a refused run is told apart from a run without MPS).
  Result RunEnv(const std::string& flags, const std::string& extra_env = "") {
    return Shell(env_ + extra_env + " " + TF_TFUSION + " run --driver " + TF_FAKECUDA + " --nvml " + TF_FAKENVML +
                 " " + flags + " -- sh -c 'env | grep ^CUDA_MPS_ | sort; echo ran'");
  }
  // Starts `tfusion up` (controller and node agent on the fake NVML) with `flags`; its URL.
  std::string StartUp(const std::string& flags) {
    up_ = fork();
    if (up_ == 0) {
      if (chdir(dir_.c_str()) != 0) _exit(126);
      std::string cmd = "exec env " + env_ + "LD_LIBRARY_PATH=" + TF_FAKECUDA_DIR + " " + TF_TFUSION +
                        " up --port 0 --metrics-port 0 " + flags + " > up.log 2>&1";
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    std::regex url_re("http://127\\.0\\.0\\.1:[0-9]+");
    for (int i = 0; i < 200; ++i) {
      std::smatch m;
      std::string log = ReadFile(dir_ + "/up.log");
      if (std::regex_search(log, m, url_re) && log.find("registered") != std::string::npos) return m.str();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return "";
  }
  std::string dir_, env_, pipe_;
  pid_t up_ = -1;
};

TEST_F(MpsTest, TheTenantRunsUnderTheOperatorsDaemonWithItsLimits) {
  // The limit (12.5%) rounded up is the active thread percentage; the VRAM limit is the pinned
  // device memory limit of the tenant's only device.
  Result r = RunEnv("--mps-pipe-dir " + pipe_ + " --vram 1GiB --percent 10 --percent-limit 12.5");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=13\nCUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M\n"
                       "CUDA_MPS_PIPE_DIRECTORY=" + pipe_ + "\nran"),
            std::string::npos)
      << r.out;
  // A request alone is its limit; no compute flag: the whole GPU (and its VRAM: 16 GiB).
  Result hard = RunEnv("--vram 512MiB --percent 25", "TFUSION_MPS_PIPE_DIRECTORY=" + pipe_);
  ASSERT_EQ(hard.rc, 0) << hard.out;
  EXPECT_NE(hard.out.find("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25\nCUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=512M\n"),
            std::string::npos)
      << hard.out;
  Result whole = RunEnv("--mps-pipe-dir " + pipe_);
  ASSERT_EQ(whole.rc, 0) << whole.out;
  EXPECT_NE(whole.out.find("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100\nCUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=16384M\n"),
            std::string::npos)
      << whole.out;
  // A tiny share still gets 1%, never 0 (which MPS would refuse).
  Result tiny = RunEnv("--mps-pipe-dir " + pipe_ + " --percent 0.001");
  EXPECT_NE(tiny.out.find("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=1\n"), std::string::npos) << tiny.out;
  // Without MPS nothing is set: time-sharing as before.
  Result plain = RunEnv("--vram 1GiB --percent 25");
  ASSERT_EQ(plain.rc, 0) << plain.out;
  EXPECT_EQ(plain.out.find("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="), std::string::npos) << plain.out;
  EXPECT_NE(plain.out.find("ran"), std::string::npos) << plain.out;
  // The tenant's CUDA still works under the limiter (the fake driver ignores the MPS variables).
  Result probe = Shell(env_ + TF_TFUSION + " run --driver " + TF_FAKECUDA + " --nvml " + TF_FAKENVML +
                       " --mps-pipe-dir " + pipe_ + " --vram 1GiB -- " + TF_PROBE + " alloc");
  ASSERT_EQ(probe.rc, 0) << probe.out;
  EXPECT_NE(probe.out.find("allocated_mib=1024"), std::string::npos) << probe.out;
}

// Pipe directories that are no daemon's (under dir, which holds "empty" and "file"): the flags or
// environment, and what the refusal says.
struct BadPipeDirectory {
  std::string flags, extra_env, says;
};
std::vector<BadPipeDirectory> BadPipeDirectories(const std::string& dir) {
  return {
      {"--mps-pipe-dir " + dir + "/none", "", "--mps-pipe-dir " + dir + "/none: No such file or directory"},
      {"--mps-pipe-dir " + dir + "/file", "", "--mps-pipe-dir " + dir + "/file: not a directory"},
      {"--mps-pipe-dir " + dir + "/empty", "", "no MPS control pipe (" + dir + "/empty/control)"},
      {"--mps-pipe-dir mps-pipe", "", "--mps-pipe-dir mps-pipe: give the MPS pipe directory as an absolute path"},
      {"", "TFUSION_MPS_PIPE_DIRECTORY=" + dir + "/empty", "TFUSION_MPS_PIPE_DIRECTORY " + dir + "/empty: no MPS"},
  };
}

TEST_F(MpsTest, APipeDirectoryWithoutADaemonIsRefusedAndChangesNothing) {
  ASSERT_EQ(Shell("mkdir -p " + dir_ + "/empty && touch " + dir_ + "/file").rc, 0);
  for (const BadPipeDirectory& c : BadPipeDirectories(dir_)) {
    Result r = RunEnv("--vram 1GiB --vgpu kept " + c.flags, c.extra_env);
    EXPECT_EQ(r.rc, 2) << c.flags << c.extra_env << "\n" << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.flags << c.extra_env << "\n" << r.out;
    EXPECT_EQ(r.out.find("ran"), std::string::npos) << "the command must not run\n" << r.out;
  }
  Result smi = Shell(env_ + TF_TFUSION + " smi");
  EXPECT_EQ(smi.out.find("kept"), std::string::npos) << "no vGPU was made\n" << smi.out;
  // A remote session runs on the worker's host: its MPS is that operator's.
  Result remote = Shell(env_ + TF_TFUSION + " run --remote 127.0.0.1:1 --mps-pipe-dir " + pipe_ + " -- true");
  EXPECT_EQ(remote.rc, 2) << remote.out;
  EXPECT_NE(remote.out.find("--mps-pipe-dir names an MPS daemon of this machine"), std::string::npos) << remote.out;
  // The node agent checks it the same way before it starts.
  Result agent = Shell(env_ + TF_TFUSION + " hypervisor --token t --mps-pipe-dir " + dir_ + "/empty");
  EXPECT_EQ(agent.rc, 2) << agent.out;
  EXPECT_NE(agent.out.find("no MPS control pipe"), std::string::npos) << agent.out;
}

// The node agent's --mps-pipe-dir reaches the tenants started on its machine, pooled or not,
// while it runs; a stale or foreign setting is not followed.
TEST_F(MpsTest, TheNodeAgentsDaemonReachesEveryTenantOfItsMachine) {
  const std::string url = StartUp("--mps-pipe-dir " + pipe_);
  ASSERT_FALSE(url.empty()) << ReadFile(dir_ + "/up.log");
  EXPECT_NE(ReadFile(dir_ + "/up.log").find("MPS: tenants run under the MPS daemon of " + pipe_), std::string::npos)
      << ReadFile(dir_ + "/up.log");
  Result local = RunEnv("--vram 1GiB --percent 30");
  ASSERT_EQ(local.rc, 0) << local.out;
  EXPECT_NE(local.out.find("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30\nCUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M\n"
                           "CUDA_MPS_PIPE_DIRECTORY=" + pipe_ + "\n"),
            std::string::npos)
      << local.out;
  std::string token = ReadFile(dir_ + "/.tfusion/token");
  while (!token.empty() && token.back() == '\n') token.pop_back();
  Result pooled = RunEnv("--controller " + url + " --token " + token + " --vram 2GiB --percent 20 --percent-limit 40");
  ASSERT_EQ(pooled.rc, 0) << pooled.out;
  EXPECT_NE(pooled.out.find("allocation a-"), std::string::npos) << pooled.out;
  EXPECT_NE(pooled.out.find("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40\nCUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M\n"),
            std::string::npos)
      << pooled.out;
  // The daemon went away while the agent still points at it: the tenant runs without MPS.
  ASSERT_EQ(Shell("rm " + pipe_ + "/control").rc, 0);
  Result stale = RunEnv("--vram 1GiB");
  ASSERT_EQ(stale.rc, 0) << stale.out;
  EXPECT_NE(stale.out.find("no MPS control pipe"), std::string::npos) << stale.out;
  EXPECT_NE(stale.out.find("running without MPS"), std::string::npos) << stale.out;
  EXPECT_EQ(stale.out.find("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="), std::string::npos) << stale.out;
  // The agent stops: its setting goes with it.
  ASSERT_EQ(Shell("mkfifo " + pipe_ + "/control").rc, 0);
  kill(up_, SIGTERM);
  waitpid(up_, nullptr, 0);
  up_ = -1;
  Result after = RunEnv("--vram 1GiB");
  ASSERT_EQ(after.rc, 0) << after.out;
  EXPECT_EQ(after.out.find("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="), std::string::npos) << after.out;
  // A setting anybody could have written (the region folder is open to every user) is ignored.
  ASSERT_EQ(Shell("echo " + pipe_ + " > " + dir_ + "/shm/mps-pipe-directory && chmod 666 " + dir_ +
                  "/shm/mps-pipe-directory").rc,
            0);
  Result foreign = RunEnv("--vram 1GiB");
  ASSERT_EQ(foreign.rc, 0) << foreign.out;
  EXPECT_NE(foreign.out.find("ignoring the node agent's MPS setting"), std::string::npos) << foreign.out;
  EXPECT_EQ(foreign.out.find("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="), std::string::npos) << foreign.out;
}

// `tfusion worker --mps-pipe-dir DIR` (or TFUSION_MPS_PIPE_DIRECTORY, or the node agent's): each
// remote session that gets a vGPU runs under the daemon with its limits. Asserted on what the
// session's driver sees at cuInit (the fake driver's FAKECUDA_ENV_LOG: the real driver reads the
// MPS variables there); the session's pid is the worker's "remote-PID" vGPU.
class WorkerMpsTest : public MpsTest {
 protected:
  void TearDown() override {
    if (worker_ > 0) {
      kill(worker_, SIGTERM);
      waitpid(worker_, nullptr, 0);
    }
    MpsTest::TearDown();
  }
  std::string WorkerCommand(const std::string& flags, const std::string& extra_env) {
    return env_ + extra_env + " FAKECUDA_ENV_LOG=" + dir_ + "/env.log exec " + TF_TFUSION + " worker --listen unix:" +
           dir_ + "/w.sock --token t --driver " + TF_FAKECUDA + " --nvml " + TF_FAKENVML + " --ready-file " + dir_ +
           "/ready " + flags + " > " + dir_ + "/worker.log 2>&1";
  }
  // Starts the worker and waits until it listens; false (and the log) when it did not.
  bool StartWorker(const std::string& flags, const std::string& extra_env = "") {
    const std::string cmd = WorkerCommand(flags, extra_env);
    worker_ = fork();
    if (worker_ == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 200 && access((dir_ + "/ready").c_str(), F_OK) != 0; ++i) usleep(50000);
    return access((dir_ + "/ready").c_str(), F_OK) == 0;
  }
  // A remote client with `flags`; the line the session's driver logged at cuInit ("" if none).
  std::string SessionSaw(const std::string& flags) {
    Shell("rm -f " + dir_ + "/env.log");
    Result r = Shell(env_ + "timeout 60 " + TF_TFUSION + " run --remote unix:" + dir_ + "/w.sock --token t " + flags +
                     " -- " + TF_REMOTE_PROBE + " basic");
    EXPECT_EQ(r.rc, 0) << flags << "\n" << r.out << ReadFile(dir_ + "/worker.log");
    std::string log = ReadFile(dir_ + "/env.log");
    EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << "one session, one cuInit:\n" << log;
    while (!log.empty() && log.back() == '\n') log.pop_back();
    return log;
  }
  pid_t worker_ = -1;
};

TEST_F(WorkerMpsTest, ASessionWithAVgpuRunsUnderTheWorkersDaemonWithItsLimits) {
  ASSERT_TRUE(StartWorker("--mps-pipe-dir " + pipe_)) << ReadFile(dir_ + "/worker.log");
  EXPECT_NE(ReadFile(dir_ + "/worker.log").find("MPS: sessions with a vGPU run under the MPS daemon of " + pipe_),
            std::string::npos)
      << ReadFile(dir_ + "/worker.log");
  const std::string saw = SessionSaw("--percent 25 --vram 1GiB");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(saw, m, std::regex("pid=([0-9]+) (.*)"))) << saw;
  EXPECT_EQ(m[2].str(), "CUDA_MPS_PIPE_DIRECTORY=" + pipe_ +
                            " CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M");
  // That process was the session of the client's vGPU "remote-PID", not the worker itself.
  EXPECT_NE(std::stoi(m[1].str()), worker_);
  EXPECT_NE(ReadFile(dir_ + "/worker.log").find("session " + m[1].str() + " runs under the MPS daemon of " + pipe_),
            std::string::npos)
      << ReadFile(dir_ + "/worker.log");
  // The limit, not the request, is the active thread percentage.
  EXPECT_NE(SessionSaw("--vram 2GiB --percent 10 --percent-limit 40")
                .find(" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M"),
            std::string::npos);
  // A session without a vGPU gets no MPS environment: it has the whole GPU, time-sliced.
  const std::string plain = SessionSaw("");
  EXPECT_TRUE(std::regex_match(plain, std::regex("pid=[0-9]+"))) << plain;
  // The daemon went away: sessions run without MPS, and the worker says why.
  ASSERT_EQ(Shell("rm " + pipe_ + "/control").rc, 0);
  const std::string gone = SessionSaw("--percent 25 --vram 1GiB");
  EXPECT_TRUE(std::regex_match(gone, std::regex("pid=[0-9]+"))) << gone;
  const std::string log = ReadFile(dir_ + "/worker.log");
  EXPECT_NE(log.find("no MPS control pipe (" + pipe_ + "/control)"), std::string::npos) << log;
  EXPECT_NE(log.find("; running without MPS\n"), std::string::npos) << log;
}

TEST_F(WorkerMpsTest, TheEnvironmentsOrTheNodeAgentsDaemonIsUsedAsByTfusionRun) {
  ASSERT_TRUE(StartWorker("", "TFUSION_MPS_PIPE_DIRECTORY=" + pipe_)) << ReadFile(dir_ + "/worker.log");
  EXPECT_NE(SessionSaw("--percent 50 --vram 512MiB")
                .find(" CUDA_MPS_PIPE_DIRECTORY=" + pipe_ +
                      " CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=512M"),
            std::string::npos);
  kill(worker_, SIGTERM);
  waitpid(worker_, nullptr, 0);
  worker_ = -1;
  Shell("rm -f " + dir_ + "/ready");
  // No flag, no environment: a worker started before the node agent follows it once it publishes
  // its daemon (the file `tfusion hypervisor --mps-pipe-dir` writes), and stops when it is gone.
  ASSERT_TRUE(StartWorker("")) << ReadFile(dir_ + "/worker.log");
  EXPECT_TRUE(std::regex_match(SessionSaw("--percent 25"), std::regex("pid=[0-9]+")));
  ASSERT_EQ(Shell("echo " + pipe_ + " > " + dir_ + "/shm/mps-pipe-directory").rc, 0);
  EXPECT_NE(SessionSaw("--percent 25 --vram 1GiB").find(" CUDA_MPS_PIPE_DIRECTORY=" + pipe_ +
                                                        " CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25"),
            std::string::npos);
  ASSERT_EQ(Shell("rm " + dir_ + "/shm/mps-pipe-directory").rc, 0);
  EXPECT_TRUE(std::regex_match(SessionSaw("--percent 25"), std::regex("pid=[0-9]+")));
}

TEST_F(WorkerMpsTest, ABadPipeDirectoryIsRefusedAndNothingListens) {
  ASSERT_EQ(Shell("mkdir -p " + dir_ + "/empty && touch " + dir_ + "/file").rc, 0);
  for (const BadPipeDirectory& c : BadPipeDirectories(dir_)) {
    Result r = Shell("timeout 20 sh -c '" + WorkerCommand(c.flags, c.extra_env) + "'");
    EXPECT_EQ(r.rc, 2) << c.flags << c.extra_env;
    const std::string log = ReadFile(dir_ + "/worker.log");
    EXPECT_NE(log.find("tfusion worker: "), std::string::npos) << log;
    EXPECT_NE(log.find(c.says), std::string::npos) << c.flags << c.extra_env << "\n" << log;
    EXPECT_NE(access((dir_ + "/w.sock").c_str(), F_OK), 0) << "nothing listens";
    EXPECT_NE(access((dir_ + "/ready").c_str(), F_OK), 0);
  }
}

}  // namespace
