// `tfusion run --remote HOST --vram/--percent`: the worker makes the client a vGPU of its own,
// enforced by the limiter in the session, and removes it when the session ends. End to end on
// the fake driver and NVML: tfusion worker, tfusion run --remote, remote_probe.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include "cli_test_util.h"
#include "controller/http_client.h"

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
    // Two fake GPUs on the worker's machine (16 GiB each).
    env_ = "TFUSION_SHM_DIR=" + dir_ + "/shm FAKECUDA_DEVICES=2 FAKECUDA_SHM_NAME=tf-rl-" +
           std::to_string(getpid()) + " ";
    ASSERT_NO_FATAL_FAILURE(StartWorker());
  }
  // `tfusion worker` on dir_/w.sock and a TCP port, logging to dir_/worker.log.
  void StartWorker() {
    unlink((dir_ + "/ready").c_str());
    std::string cmd = env_ + "exec " + std::string(TF_TFUSION) + " worker --listen unix:" + dir_ +
                      "/w.sock --listen 127.0.0.1:0 --token t --driver " + TF_FAKECUDA + " --nvml " + TF_FAKENVML +
                      " --ready-file " + dir_ + "/ready " + WorkerFlags() + " > " + dir_ + "/worker.log 2>&1";
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
    tf::cli::testing::RemoveFakeDriverShm("tf-rl-" + std::to_string(getpid()));
  }
  virtual std::string WorkerFlags() const { return ""; }
  Result Run(const std::string& flags, const std::string& probe_mode = "fill") {
    return Shell(env_ + "timeout 60 " + TF_TFUSION + " run --remote unix:" + dir_ +
                 "/w.sock --token t " + flags + " -- " + TF_REMOTE_PROBE + " " + probe_mode);
  }
  // The worker's TCP address ("127.0.0.1:PORT") from its ready file.
  std::string TcpAddress() {
    std::string ready = ReadFile(dir_ + "/ready");
    size_t at = ready.find("tcp ");
    if (at == std::string::npos) return "";
    size_t end = ready.find('\n', at);
    return ready.substr(at + 4, end == std::string::npos ? std::string::npos : end - at - 4);
  }
  // `tfusion controller` (token t, its own store) in the background; its URL once it listens
  // (empty if it did not start).
  pid_t StartController(std::string* url) {
    pid_t controller = fork();
    if (controller == 0) {
      std::string cmd = std::string("exec ") + TF_TFUSION + " controller --port 0 --token t --store sqlite:" +
                        dir_ + "/state.db > " + dir_ + "/controller.log 2>&1";
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    std::regex url_re("http://127\\.0\\.0\\.1:[0-9]+");
    for (int i = 0; controller > 0 && i < 200 && url->empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::smatch m;
      std::string log = ReadFile(dir_ + "/controller.log");
      if (std::regex_search(log, m, url_re)) *url = m.str();
    }
    return controller;
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

// Stopping the worker ends its sessions (docs/remote.md); their vGPUs go with them, so that a
// restarted worker's machine shows no vGPU nobody uses (and the region's slots do not run out).
TEST_F(RemoteLimits, StoppingTheWorkerRemovesTheVgpusOfTheSessionsItEnds) {
  std::string cmd = env_ + "timeout 60 " + TF_TFUSION + " run --remote unix:" + dir_ + "/w.sock --token t " +
                    "--vram 64MiB --percent 25 -- " + TF_PROBE + " launch 30 > " + dir_ + "/client.out 2>&1";
  pid_t client = fork();
  ASSERT_GE(client, 0);
  if (client == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const std::regex session_vgpu("remote-[0-9]+");
  std::string smi;
  for (int i = 0; i < 200 && !std::regex_search(smi, session_vgpu); ++i) {
    usleep(50000);
    smi = Shell(env_ + TF_TFUSION + " smi").out;
  }
  ASSERT_TRUE(std::regex_search(smi, session_vgpu)) << smi << ReadFile(dir_ + "/worker.log");
  // `smi` counts the session process as the vGPU's program (it is tfusion too, but no `tfusion
  // run` wrapper: it showed PROCS 0).
  const size_t header = smi.find("  VGPU"), row = smi.find("  remote-");
  ASSERT_NE(header, std::string::npos) << smi;
  const size_t column = smi.find("PROCS", header) - header;
  EXPECT_EQ(std::stoi(smi.substr(row + column, 8)), 1) << smi;
  kill(worker_, SIGTERM);
  int status = 0;
  waitpid(worker_, &status, 0);
  worker_ = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFile(dir_ + "/worker.log");
  smi = Shell(env_ + TF_TFUSION + " smi").out;
  EXPECT_FALSE(std::regex_search(smi, session_vgpu)) << "the ended session's vGPU is gone\n" << smi;
  // The client learns that its worker is gone: an error, not a hang until `timeout` ends it (124).
  waitpid(client, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << ReadFile(dir_ + "/client.out");
  EXPECT_NE(WEXITSTATUS(status), 0) << ReadFile(dir_ + "/client.out");
  EXPECT_NE(WEXITSTATUS(status), 124) << ReadFile(dir_ + "/client.out");
}

// A worker killed outright (SIGKILL) cannot remove its sessions' vGPUs; they die with it
// (PR_SET_PDEATHSIG), and the next worker removes what they left, telling them from live sessions
// by the lock each session holds while it lives. A live session's vGPU is never taken.
TEST_F(RemoteLimits, TheNextWorkerRemovesTheVgpusOfSessionsThatDiedWithAWorkerKilledOutright) {
  auto start_client = [&](const std::string& out) {
    // --foreground: timeout stays in the client's process group (else it makes one of its own).
    std::string cmd = env_ + "exec timeout --foreground 60 " + TF_TFUSION + " run --remote unix:" + dir_ + "/w.sock --token t " +
                      "--vram 64MiB --percent 25 -- " + TF_PROBE + " launch 30 > " + out + " 2>&1";
    pid_t client = fork();
    if (client == 0) {
      setpgid(0, 0);  // a group of its own: the test ends it whole
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    setpgid(client, client);
    return client;
  };
  auto session_vgpus = [&](const std::string& smi) {
    std::set<std::string> ids;
    const std::regex id("remote-[0-9]+");
    for (auto it = std::sregex_iterator(smi.begin(), smi.end(), id); it != std::sregex_iterator(); ++it)
      ids.insert(it->str());
    return ids;
  };
  auto wait_for_vgpus = [&](size_t n) {
    std::set<std::string> ids;
    for (int i = 0; i < 200 && ids.size() < n; ++i) {
      usleep(50000);
      ids = session_vgpus(Shell(env_ + TF_TFUSION + " smi").out);
    }
    return ids;
  };
  pid_t first = start_client(dir_ + "/client1.out");
  ASSERT_GT(first, 0);
  std::set<std::string> killed = wait_for_vgpus(1);
  ASSERT_EQ(killed.size(), 1u) << ReadFile(dir_ + "/worker.log");
  kill(worker_, SIGKILL);
  waitpid(worker_, nullptr, 0);
  worker_ = -1;
  int status = 0;
  waitpid(first, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 124)
      << ReadFile(dir_ + "/client1.out");
  // The next worker removes the vGPU its dead session left and says so.
  ASSERT_NO_FATAL_FAILURE(StartWorker());
  // At its start, or at one of its next sweeps (every 10 s) should the session still be dying then.
  const std::string removed = "removed 1 vGPU(s) that ended sessions or runs left (a worker or a tfusion run killed outright, or a stop that timed out): ";
  std::string log;
  for (int i = 0; i < 500 && log.find(removed) == std::string::npos; ++i) {
    if (i > 0) usleep(50000);
    log = ReadFile(dir_ + "/worker.log");
  }
  EXPECT_NE(log.find(removed + *killed.begin()),
            std::string::npos)
      << log;
  EXPECT_TRUE(session_vgpus(Shell(env_ + TF_TFUSION + " smi").out).empty());
  // A live session of the new worker keeps its vGPU through `tfusion smi` and another worker's start.
  pid_t second = start_client(dir_ + "/client2.out");
  ASSERT_GT(second, 0);
  std::set<std::string> live = wait_for_vgpus(1);
  ASSERT_EQ(live.size(), 1u) << ReadFile(dir_ + "/worker.log");
  std::string other_cmd = env_ + "exec " + std::string(TF_TFUSION) + " worker --listen unix:" + dir_ +
                          "/w2.sock --token t --driver " + TF_FAKECUDA + " --nvml " + TF_FAKENVML + " --ready-file " +
                          dir_ + "/ready2 > " + dir_ + "/worker2.log 2>&1";
  pid_t other = fork();
  if (other == 0) {
    execl("/bin/sh", "sh", "-c", other_cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  for (int i = 0; i < 100 && access((dir_ + "/ready2").c_str(), F_OK) != 0; ++i) usleep(50000);
  EXPECT_EQ(access((dir_ + "/ready2").c_str(), F_OK), 0) << ReadFile(dir_ + "/worker2.log");
  kill(other, SIGTERM);
  waitpid(other, nullptr, 0);
  EXPECT_EQ(ReadFile(dir_ + "/worker2.log").find("vGPU(s) that ended sessions or runs left"), std::string::npos);
  EXPECT_EQ(session_vgpus(Shell(env_ + TF_TFUSION + " smi").out), live);
  // That session ends: its worker removes its vGPU and its lock file.
  kill(-second, SIGKILL);
  waitpid(second, nullptr, 0);
  std::string locks;
  for (int i = 0; i < 100; ++i) {
    locks = Shell("ls " + dir_ + "/shm/session-locks-" + std::to_string(geteuid())).out;
    if (locks.empty() && session_vgpus(Shell(env_ + TF_TFUSION + " smi").out).empty()) break;
    usleep(50000);
  }
  EXPECT_EQ(locks, "") << "the lock files of ended sessions are gone";
  EXPECT_TRUE(session_vgpus(Shell(env_ + TF_TFUSION + " smi").out).empty());
}

TEST_F(RemoteLimits, WithoutLimitsTheClientGetsTheWholeGpu) {
  Result r = Run("");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("meminfo_total_mib=16384\n"), std::string::npos) << r.out;
}

// The program of a `tfusion run --remote --vram 64MiB` holds a session ticket bound to those
// limits: a session it opens with the limits removed from its environment (which used to give it
// the whole GPU), or changed, is refused, and says why; the run's own session keeps its 64 MiB.
TEST_F(RemoteLimits, ATenantCannotShedItsLimitsByOpeningASessionOfItsOwn) {
  const std::string probe = TF_REMOTE_PROBE;
  Result r = Shell(env_ + "timeout 60 " + TF_TFUSION + " run --remote unix:" + dir_ + "/w.sock --token t --vram 64MiB -- sh -c '" +
                   probe + " fill; echo ===; env -u TFUSION_REMOTE_VRAM " + probe + " init; echo ===; TFUSION_REMOTE_VRAM=16GiB " +
                   probe + " init' 2>&1");
  const size_t a = r.out.find("==="), b = r.out.find("===", a + 1);
  ASSERT_NE(b, std::string::npos) << r.out;
  const std::string own = r.out.substr(0, a), shed = r.out.substr(a, b - a), bigger = r.out.substr(b);
  EXPECT_NE(own.find("fill_total_mib=64\n"), std::string::npos) << own;
  for (const std::string& part : {shed, bigger}) {
    EXPECT_EQ(part.find("init=0\n"), std::string::npos) << part;
    EXPECT_NE(part.find("not those its session ticket was made for"), std::string::npos) << part;
  }
  EXPECT_NE(ReadFile(dir_ + "/worker.log").find("refused: the client's limits are not those its session ticket"),
            std::string::npos);
  // A run without limits gets a ticket bound to none: its program's sessions ask for none.
  Result plain = Run("");
  EXPECT_EQ(plain.rc, 0) << plain.out;
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

// The compute request is guaranteed and the limit is the ceiling, remotely as locally
// (limiter_run_test's ARequestBelowItsLimitBurstsToTheLimitWhileAlone): alone on the worker's GPU,
// a session with request 25% and limit 100% bursts to the limit; a limit of 50% stops it there;
// a request alone stays a hard cap. The fake's kernels are 2 ms host sleeps, so each run is
// compared with an unthrottled one.
TEST_F(RemoteLimits, ARequestBelowItsLimitBurstsToTheLimitWhileAlone) {
  auto busy = [&](const std::string& flags) {
    Result r = Shell(env_ + "timeout 60 " + TF_TFUSION + " run --remote unix:" + dir_ + "/w.sock --token t " + flags +
                     " -- " + TF_PROBE + " launch 1.5");
    EXPECT_EQ(r.rc, 0) << flags << "\n" << r.out << ReadFile(dir_ + "/worker.log");
    size_t at = r.out.find("busy_fraction=");
    return at == std::string::npos ? -1.0 : std::stod(r.out.substr(at + 14));
  };
  const double full = busy("--vram 1GiB");
  const double burst = busy("--vram 1GiB --percent 25 --percent-limit 100 --qos high");
  const double capped = busy("--vram 1GiB --percent 25 --percent-limit 50");
  const double hard = busy("--vram 1GiB --percent 25");
  ASSERT_GT(full, 0.6);
  EXPECT_GT(burst / full, 0.85) << "burst " << burst << " full " << full;
  EXPECT_GT(capped / full, 0.40) << "capped " << capped << " full " << full;
  EXPECT_LT(capped / full, 0.70) << "capped " << capped << " full " << full;
  EXPECT_LT(hard / full, 0.40) << "hard " << hard << " full " << full;
  // The worker made each session's vGPU with the request, the limit and the QoS asked for.
  const std::string log = ReadFile(dir_ + "/worker.log");
  EXPECT_NE(log.find("percent 25, GPU 0, tflops limit -, percent limit 100, qos high"), std::string::npos) << log;
  EXPECT_NE(log.find("percent 25, GPU 0, tflops limit -, percent limit 50, qos medium"), std::string::npos) << log;
}

// A limit the GPU cannot give is refused by the worker, which says why; one that is malformed or
// below the request is refused by tfusion run before anything starts.
TEST_F(RemoteLimits, ALimitTheWorkerCannotGiveIsRefusedWithAReason) {
  Result big = Run("--vram 64MiB --tflops 10 --tflops-limit 100000", "basic");
  EXPECT_NE(big.rc, 0) << big.out;
  EXPECT_EQ(big.out.find("device_count="), std::string::npos) << big.out;
  EXPECT_NE(big.out.find("the worker refused the vGPU"), std::string::npos) << big.out;
  EXPECT_NE(ReadFile(dir_ + "/worker.log").find("--tflops-limit 100000: GPU 0"), std::string::npos)
      << ReadFile(dir_ + "/worker.log");
  // The client is told why too (its user may not read the GPU host's log), and not that the
  // worker's driver failed.
  EXPECT_NE(big.out.find("the worker refused the vGPU this client asked for: --tflops-limit 100000: GPU 0"),
            std::string::npos)
      << big.out;
  EXPECT_EQ(big.out.find("failed cuInit"), std::string::npos) << big.out;
  for (auto [flags, says] : {std::pair{"--percent 40 --percent-limit 30", "is below the request --percent 40"},
                             std::pair{"--percent 40 --qos urgent", "--qos: qos must be one of"},
                             std::pair{"--percent-limit 50", "needs a request"}}) {
    Result r = Run(std::string("--vram 64MiB ") + flags, "basic");
    EXPECT_EQ(r.rc, 2) << flags << "\n" << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << flags << "\n" << r.out;
  }
}

// The fake GPUs' UUIDs as the probe prints them (16 bytes in hex) and as NVML spells them.
constexpr const char* kGpu1Hex = "fa4ec0da000040008000000000000001";
constexpr const char* kGpu0Uuid = "GPU-fa4ec0da-0000-4000-8000-000000000000";
constexpr const char* kGpu1Uuid = "GPU-fa4ec0da-0000-4000-8000-000000000001";

TEST_F(RemoteLimits, TheClientRunsOnTheGpuItNamesAndSeesItAloneAsDevice0) {
  for (const std::string& gpu : {std::string("1"), std::string(kGpu1Uuid)}) {
    Result r = Run("--gpu " + gpu + " --vram 64MiB --percent 50", "basic");
    ASSERT_EQ(r.rc, 0) << gpu << ": " << r.out << ReadFile(dir_ + "/worker.log");
    EXPECT_NE(r.out.find("device_count=1\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(std::string("uuid=") + kGpu1Hex + "\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\ntotal_mib=64\n"), std::string::npos) << r.out;  // the slice, not the GPU
    // The limiter in front of GPU 1's driver holds the client to its slice.
    Result fill = Run("--gpu " + gpu + " --vram 64MiB", "fill");
    ASSERT_EQ(fill.rc, 0) << fill.out << ReadFile(dir_ + "/worker.log");
    EXPECT_NE(fill.out.find("fill_total_mib=64\n"), std::string::npos) << fill.out;
    EXPECT_NE(fill.out.find("meminfo_total_mib=64\n"), std::string::npos) << fill.out;
  }
  EXPECT_NE(ReadFile(dir_ + "/worker.log").find("percent 50, GPU 1"), std::string::npos)
      << ReadFile(dir_ + "/worker.log");
  // --gpu alone: the whole of that GPU, still the only one the client sees.
  Result whole = Run("--gpu 1", "basic");
  ASSERT_EQ(whole.rc, 0) << whole.out << ReadFile(dir_ + "/worker.log");
  EXPECT_NE(whole.out.find("device_count=1\n"), std::string::npos) << whole.out;
  EXPECT_NE(whole.out.find(std::string("uuid=") + kGpu1Hex + "\n"), std::string::npos) << whole.out;
  EXPECT_NE(whole.out.find("\ntotal_mib=16384\n"), std::string::npos) << whole.out;
  // Without --gpu nothing changes: a client that asks for nothing sees every GPU.
  Result all = Run("", "basic");
  ASSERT_EQ(all.rc, 0) << all.out;
  EXPECT_NE(all.out.find("device_count=2\n"), std::string::npos) << all.out;
}

// The client's NVML (libnvidia-ml.so.1 beside the stub) reports exactly the GPU the session
// exposes, with its UUID and the --vram slice: PyTorch takes its device count from NVML.
TEST_F(RemoteLimits, TheClientsNvmlSeesOnlyTheGpuItNamesWithItsSlice) {
  for (const std::string& via : {std::string("unix:") + dir_ + "/w.sock", TcpAddress()}) {
    Result r = Shell(env_ + "timeout 60 " + TF_TFUSION + " run --remote " + via +
                     " --token t --gpu 1 --vram 64MiB -- " + TF_NVML_PROBE + " list");
    ASSERT_EQ(r.rc, 0) << via << ": " << r.out << ReadFile(dir_ + "/worker.log");
    EXPECT_NE(r.out.find("\ncount=1\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(std::string("\nuuid_0=") + kGpu1Uuid + "\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\nmem_total_mib_0=64\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\nby_uuid_0=0\n"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("uuid_1="), std::string::npos) << r.out;
  }
  // Without --gpu: both GPUs, whole.
  Result all = Shell(env_ + "timeout 60 " + TF_TFUSION + " run --remote unix:" + dir_ +
                     "/w.sock --token t -- " + TF_NVML_PROBE + " list");
  ASSERT_EQ(all.rc, 0) << all.out;
  EXPECT_NE(all.out.find("\ncount=2\n"), std::string::npos) << all.out;
  EXPECT_NE(all.out.find(std::string("\nuuid_1=") + kGpu1Uuid + "\n"), std::string::npos) << all.out;
  EXPECT_NE(all.out.find("\nmem_total_mib_1=16384\n"), std::string::npos) << all.out;
}

TEST_F(RemoteLimits, AGpuTheWorkerDoesNotHaveIsRefusedNeverReplaced) {
  for (const char* gpu : {"2", "GPU-fa4ec0da-0000-4000-8000-0000000000ff"}) {
    Result r = Run(std::string("--gpu ") + gpu + " --vram 64MiB", "basic");
    EXPECT_NE(r.rc, 0) << r.out;
    EXPECT_EQ(r.out.find("device_count="), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("the worker refused the vGPU"), std::string::npos) << r.out;
    std::string log = ReadFile(dir_ + "/worker.log");
    EXPECT_NE(log.find(std::string("--gpu ") + gpu + ": this machine has 2 GPU(s): 0 " + kGpu0Uuid +
                       ", 1 " + kGpu1Uuid),
              std::string::npos)
        << log;
  }
  Result bad = Run("--gpu first", "basic");  // refused by tfusion run before anything starts
  EXPECT_EQ(bad.rc, 2) << bad.out;
  EXPECT_NE(bad.out.find("the GPU's index (0, 1, ...) or its UUID"), std::string::npos) << bad.out;
}

// `tfusion run --controller` placed on another node: the worker makes the vGPU on the GPU the
// pool chose (GPU 1 here: GPU 0 is registered too small for the request), not on its GPU 0.
TEST_F(RemoteLimits, APooledRunOnAnotherNodeLandsOnTheAllocationsGpu) {
  const std::string worker = TcpAddress();
  ASSERT_FALSE(worker.empty()) << ReadFile(dir_ + "/ready");
  std::string url;
  pid_t controller = StartController(&url);
  ASSERT_GE(controller, 0);
  Result r;
  if (!url.empty()) {
    tf::controller::HttpClient client(url, "t");
    auto reg = client.Post("/v1/nodes", std::string(R"({"name": "gpu-node", "worker_address": ")") + worker +
                                            R"(", "gpus": [{"uuid": ")" + kGpu0Uuid +
                                            R"(", "model": "H100", "index": 0, "tflops": 100, "vram_mib": 512},)" +
                                            R"({"uuid": ")" + kGpu1Uuid +
                                            R"(", "model": "H100", "index": 1, "tflops": 100, "vram_mib": 16384}]})");
    EXPECT_TRUE(reg.ok() && reg->status == 200) << (reg.ok() ? reg->body : reg.status().ToString());
    r = Shell(env_ + "timeout 60 " + TF_TFUSION + " run --controller " + url +
              " --token t --nvml /nonexistent/libnvidia-ml.so.1 --vram 1GiB --percent 10 -- " +
              TF_REMOTE_PROBE + " basic");
  }
  kill(controller, SIGTERM);
  waitpid(controller, nullptr, 0);
  ASSERT_FALSE(url.empty()) << ReadFile(dir_ + "/controller.log");
  ASSERT_EQ(r.rc, 0) << r.out << ReadFile(dir_ + "/worker.log");
  EXPECT_NE(r.out.find(std::string("(GPU ") + kGpu1Uuid + ")"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("device_count=1\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(std::string("uuid=") + kGpu1Hex + "\n"), std::string::npos) << r.out;
  EXPECT_NE(ReadFile(dir_ + "/worker.log").find(std::string("GPU ") + kGpu1Uuid), std::string::npos)
      << ReadFile(dir_ + "/worker.log");
}

// A pooled run placed on a node whose registered worker does not answer is refused at once with
// the reason, and its allocation released (its command's first CUDA call used to fail instead).
TEST_F(RemoteLimits, APooledRunOnANodeWhoseWorkerIsDownIsRefusedAndReleased) {
  std::string url;
  pid_t controller = StartController(&url);
  ASSERT_GE(controller, 0);
  Result r;
  std::string allocations;
  if (!url.empty()) {
    tf::controller::HttpClient client(url, "t");
    auto reg = client.Post("/v1/nodes", std::string(R"({"name": "gpu-node", "worker_address": "127.0.0.1:1", )") +
                                            R"("gpus": [{"uuid": ")" + kGpu1Uuid +
                                            R"(", "model": "H100", "index": 0, "tflops": 100, "vram_mib": 16384}]})");
    EXPECT_TRUE(reg.ok() && reg->status == 200) << (reg.ok() ? reg->body : reg.status().ToString());
    r = Shell(env_ + "timeout 60 " + TF_TFUSION + " run --controller " + url +
              " --token t --nvml /nonexistent/libnvidia-ml.so.1 --vram 1GiB --percent 10 -- " + TF_REMOTE_PROBE + " basic");
    auto list = client.Get("/v1/allocations");
    allocations = list.ok() ? list->body : list.status().ToString();
  }
  kill(controller, SIGTERM);
  waitpid(controller, nullptr, 0);
  ASSERT_FALSE(url.empty()) << ReadFile(dir_ + "/controller.log");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("whose worker does not answer (cannot connect to 127.0.0.1:1: Connection refused); the "
                       "allocation was released"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("device_count"), std::string::npos) << "the command did not start: " << r.out;
  EXPECT_EQ(allocations.find("a-"), std::string::npos) << allocations;
}

// The tenant program holds a session ticket, never the worker's token; an expired ticket opens
// nothing.
TEST_F(RemoteLimits, TheProgramGetsASessionTicketAndNeverTheWorkersToken) {
  Result env = Shell(env_ + "timeout 60 " + TF_TFUSION + " run --remote unix:" + dir_ +
                     "/w.sock --token t -- sh -c 'echo token=$TFUSION_TOKEN; exec " + TF_REMOTE_PROBE + " basic'");
  ASSERT_EQ(env.rc, 0) << env.out << ReadFile(dir_ + "/worker.log");
  EXPECT_NE(env.out.find("token=tkt2."), std::string::npos) << env.out;
  EXPECT_EQ(env.out.find("token=t\n"), std::string::npos) << env.out;
  EXPECT_NE(env.out.find("device_count="), std::string::npos) << "the ticket opened a session\n" << env.out;
  Result late = Shell(env_ + "TFUSION_TICKET_TTL=1 timeout 60 " + TF_TFUSION + " run --remote unix:" + dir_ +
                      "/w.sock --token t -- sh -c 'sleep 2.5; exec " + TF_REMOTE_PROBE + " basic'");
  EXPECT_NE(late.rc, 0) << late.out;
  EXPECT_NE(late.out.find("a session ticket that expired"), std::string::npos) << late.out;
  Result bad_ttl = Shell(env_ + "TFUSION_TICKET_TTL=forever " + TF_TFUSION + " run --remote unix:" + dir_ +
                         "/w.sock --token t -- true");
  EXPECT_EQ(bad_ttl.rc, 2) << bad_ttl.out;
  EXPECT_NE(bad_ttl.out.find("TFUSION_TICKET_TTL=forever"), std::string::npos) << bad_ttl.out;
}

// A worker with --tiering gives every session movable VRAM: `tfusion freeze remote-PID` swaps the
// session out (the session process owns the copy), and the client's next call brings every byte back.
class RemoteTiering : public RemoteLimits {
 protected:
  std::string WorkerFlags() const override { return "--tiering --idle-swap 0"; }
  // Up to 30 s: a tiered tenant pins its host copies ahead at start, which can take over 10 s on a
  // loaded two-core machine.
  bool WaitFor(const std::string& name) {
    for (int i = 0; i < 1200; ++i) {
      if (access((dir_ + "/" + name).c_str(), F_OK) == 0) return true;
      usleep(25000);
    }
    return false;
  }
};

TEST_F(RemoteTiering, AFrozenSessionGetsEveryByteBackOnTheClientsNextCall) {
  ASSERT_EQ(Shell("mkdir -p " + dir_ + "/t").rc, 0);  // the probe's handshake files
  std::string cmd = env_ + "timeout 60 " + TF_TFUSION + " run --remote unix:" + dir_ + "/w.sock --token t -- " +
                    TF_PROBE + " tier " + dir_ + "/t > " + dir_ + "/client.out 2>&1";
  pid_t client = fork();
  ASSERT_GE(client, 0);
  if (client == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_TRUE(WaitFor("t/ready")) << ReadFile(dir_ + "/client.out") << ReadFile(dir_ + "/worker.log");
  std::smatch m;
  std::string smi = Shell(env_ + TF_TFUSION + " smi").out;
  ASSERT_TRUE(std::regex_search(smi, m, std::regex("remote-[0-9]+"))) << smi;
  const std::string vgpu = m.str();
  Result frozen = Shell(env_ + TF_TFUSION + " freeze " + vgpu);
  EXPECT_EQ(frozen.rc, 0) << frozen.out << ReadFile(dir_ + "/worker.log");
  EXPECT_NE(frozen.out.find("swapped, 200 MiB movable (200 MiB in host memory)"), std::string::npos) << frozen.out;
  for (const char* f : {"/t/go", "/t/go2", "/t/go3"}) Shell("touch " + dir_ + f);
  int status = 0;
  waitpid(client, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFile(dir_ + "/client.out");
  std::string out = ReadFile(dir_ + "/client.out");
  EXPECT_NE(out.find("first_identical=3"), std::string::npos) << out;
  EXPECT_NE(out.find("kernel_after_resume=ok"), std::string::npos) << out;
  EXPECT_NE(out.find("second_identical=3"), std::string::npos) << out;
  EXPECT_NE(ReadFile(dir_ + "/worker.log").find("resumed 200 MiB"), std::string::npos) << ReadFile(dir_ + "/worker.log");
}

// Graph memory of a remote session: the session process runs the limiter, so its freeze trims the
// graph memory its driver keeps and counts live graph allocations as fixed, as locally
// (tests/limiter, GraphMemoryIsTrimmedAtAFreezeAndWhatStaysIsCountedAsFixed).
TEST_F(RemoteTiering, ASessionsGraphMemoryIsTrimmedAndItsLiveGraphAllocationStaysIntact) {
  ASSERT_EQ(Shell("mkdir -p " + dir_ + "/t").rc, 0);
  std::string cmd = env_ + "timeout 60 " + TF_TFUSION + " run --remote unix:" + dir_ + "/w.sock --token t -- " +
                    TF_PROBE + " graphmem " + dir_ + "/t > " + dir_ + "/client.out 2>&1";
  pid_t client = fork();
  ASSERT_GE(client, 0);
  if (client == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_TRUE(WaitFor("t/ready")) << ReadFile(dir_ + "/client.out") << ReadFile(dir_ + "/worker.log");
  std::smatch m;
  std::string smi = Shell(env_ + TF_TFUSION + " smi").out;
  ASSERT_TRUE(std::regex_search(smi, m, std::regex("remote-[0-9]+"))) << smi;
  const std::string vgpu = m.str();
  const std::regex fixed_re("swapped, 202 MiB movable \\(202 MiB in host memory\\), ([0-9]+) MiB fixed");
  Result frozen = Shell(env_ + TF_TFUSION + " freeze " + vgpu);
  EXPECT_EQ(frozen.rc, 0) << frozen.out << ReadFile(dir_ + "/worker.log");
  ASSERT_TRUE(std::regex_search(frozen.out, m, fixed_re)) << frozen.out;
  const int fixed_first = std::stoi(m.str(1));
  EXPECT_NE(ReadFile(dir_ + "/worker.log").find("graph memory: 32 MiB trimmed, 0 MiB stay resident (fixed)"),
            std::string::npos) << ReadFile(dir_ + "/worker.log");
  Shell("touch " + dir_ + "/t/go");
  ASSERT_TRUE(WaitFor("t/ready2")) << ReadFile(dir_ + "/client.out") << ReadFile(dir_ + "/worker.log");
  frozen = Shell(env_ + TF_TFUSION + " freeze " + vgpu);
  EXPECT_EQ(frozen.rc, 0) << frozen.out << ReadFile(dir_ + "/worker.log");
  ASSERT_TRUE(std::regex_search(frozen.out, m, fixed_re)) << frozen.out;
  EXPECT_EQ(std::stoi(m.str(1)) - fixed_first, 8) << "the live graph allocation stays, counted as fixed\n" << frozen.out;
  EXPECT_NE(ReadFile(dir_ + "/worker.log").find("8 MiB stay resident (fixed): graph allocations of 8 MiB are live"),
            std::string::npos) << ReadFile(dir_ + "/worker.log");
  Shell("touch " + dir_ + "/t/go2");
  int status = 0;
  waitpid(client, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFile(dir_ + "/client.out");
  std::string out = ReadFile(dir_ + "/client.out");
  EXPECT_NE(out.find("swapped_reserved_mib=0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("live_graph_allocation_intact=1\nsecond_identical=3\nthird_graph_output=ok\n"),
            std::string::npos) << out;
  EXPECT_NE(out.find("first_graph_output=ok"), std::string::npos) << out;
  EXPECT_NE(out.find("second_graph_output=ok"), std::string::npos) << out;
  EXPECT_NE(out.find("freed=1"), std::string::npos) << out;
}

// A pooled run placed on another node's worker --tiering: the session's vGPU takes the pool
// allocation's idle timeouts (here --idle-swap 45s given to run, and the low QoS's disk default)
// instead of the worker's --idle-swap 0, sent in version 5 of the limits record
// (with the allocation, to which the session's vGPU is bound). A disk tier folder stays local only.
TEST_F(RemoteTiering, APooledSessionTakesItsAllocationsIdleTimeouts) {
  const std::string worker = TcpAddress();
  ASSERT_FALSE(worker.empty()) << ReadFile(dir_ + "/ready");
  std::string url;
  pid_t controller = StartController(&url);
  ASSERT_GE(controller, 0);
  std::string smi;
  int status = -1;
  Result refused;
  if (!url.empty()) {
    tf::controller::HttpClient client(url, "t");
    auto reg = client.Post("/v1/nodes", std::string(R"({"name": "gpu-node", "worker_address": ")") + worker +
                                            R"(", "gpus": [{"uuid": ")" + kGpu0Uuid +
                                            R"(", "model": "H100", "index": 0, "tflops": 100, "vram_mib": 16384}]})");
    EXPECT_TRUE(reg.ok() && reg->status == 200) << (reg.ok() ? reg->body : reg.status().ToString());
    auto pool = client.Patch("/v1/pools/default", R"({"vram_expand_to_host_percent":100})");
    EXPECT_TRUE(pool.ok() && pool->status == 200);
    ASSERT_EQ(Shell("mkdir -p " + dir_ + "/t").rc, 0);
    std::string cmd = env_ + "timeout 60 " + TF_TFUSION + " run --controller " + url +
                      " --token t --nvml /nonexistent/libnvidia-ml.so.1 --vram 1GiB --percent 10 --qos low "
                      "--idle-swap 45s -- " + TF_PROBE + " tier " + dir_ + "/t > " + dir_ + "/client.out 2>&1";
    pid_t run = fork();
    if (run == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    if (WaitFor("t/ready")) smi = Shell(env_ + TF_TFUSION + " smi -p").out;
    for (const char* f : {"/t/go", "/t/go2", "/t/go3"}) Shell("touch " + dir_ + f);
    waitpid(run, &status, 0);
    // Flags that only a local vGPU can honour are refused for a run placed on another node.
    refused = Shell(env_ + TF_TFUSION + " run --controller " + url + " --token t --nvml /nonexistent/libnvidia-ml.so.1 "
                    "--vram 1GiB --percent 10 --qos low --disk-tier " + dir_ + " -- true");
  }
  kill(controller, SIGTERM);
  waitpid(controller, nullptr, 0);
  ASSERT_FALSE(url.empty()) << ReadFile(dir_ + "/controller.log");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFile(dir_ + "/client.out");
  // Bound to the allocation, whose idle zero (none: never) the session takes too.
  EXPECT_TRUE(std::regex_search(smi, std::regex("remote-[0-9]+@a-[0-9a-f]+ +45s +2m +never\n"))) << smi << ReadFile(dir_ + "/worker.log");
  EXPECT_NE(ReadFile(dir_ + "/worker.log").find("idle swap 45000ms, idle disk 120000ms"), std::string::npos)
      << ReadFile(dir_ + "/worker.log");
  EXPECT_EQ(refused.rc, 2) << refused.out;
  EXPECT_NE(refused.out.find("--disk-tier works on a local vGPU only"), std::string::npos) << refused.out;
}

// Managed memory of a remote client is pinned host memory on the worker, charged like the rest:
// against the client's --vram when it has one (as cuMemAllocManaged is locally, and not against
// the worker's --session-host-mem, 16 MiB here), against --session-host-mem when it has none.
class RemoteHostMemory : public RemoteLimits {
 protected:
  std::string WorkerFlags() const override { return "--session-host-mem 16MiB"; }
  Result Steps(const std::string& via, const std::string& flags) {
    return Shell(env_ + "timeout 60 " + TF_TFUSION + " run --remote " + via + " --token t " + flags +
                 " -- " + TF_HOST_PROBE + " steps managed 8 20");
  }
};

TEST_F(RemoteHostMemory, ManagedMemoryCountsAgainstTheClientsVramOrElseTheHostMemoryLimit) {
  for (const std::string& via : {std::string("unix:") + dir_ + "/w.sock", TcpAddress()}) {
    // 64 MiB of VRAM, 2 MiB of it the probe's device buffer (one granule): seven 8 MiB steps.
    Result r = Steps(via, "--vram 64MiB");
    ASSERT_EQ(r.rc, 0) << via << ": " << r.out << ReadFile(dir_ + "/worker.log");
    EXPECT_NE(r.out.find("steps_ok=7\n"), std::string::npos) << via << ": " << r.out;
    EXPECT_NE(r.out.find("steps_refused=2\n"), std::string::npos) << r.out;  // out of memory
    EXPECT_NE(r.out.find("again_after_free=0\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("one_more=2\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("data_ok=1\n"), std::string::npos) << r.out;
    // No vGPU: the session's 16 MiB of host memory (over shm the 64 MiB copy arena does not fit
    // and is not pinned; copies are staged).
    Result h = Steps(via, "");
    ASSERT_EQ(h.rc, 0) << via << ": " << h.out << ReadFile(dir_ + "/worker.log");
    EXPECT_NE(h.out.find("steps_ok=2\n"), std::string::npos) << via << ": " << h.out;
    EXPECT_NE(h.out.find("steps_refused=2\n"), std::string::npos) << h.out;
    EXPECT_NE(h.out.find("data_ok=1\n"), std::string::npos) << h.out;
  }
  const std::string log = ReadFile(dir_ + "/worker.log");
  EXPECT_NE(log.find("managed memory of 8 MiB refused (CUDA_ERROR_OUT_OF_MEMORY): it counts "
                     "against the VRAM limit of the session's vGPU, 64 MiB"),
            std::string::npos) << log;
  EXPECT_NE(log.find("managed memory of 8 MiB refused (CUDA_ERROR_OUT_OF_MEMORY): the session may "
                     "pin 16 MiB of host memory (tfusion worker --session-host-mem)"),
            std::string::npos) << log;
}

}  // namespace

// Scale to zero of remote sessions (worker --tiering --idle-zero): the worker's zero keeper
// checkpoints a session swapped and idle for --idle-zero with the driver (the fake's
// cuCheckpointProcess*, whose checkpoint sets the session's device memory aside and drops it),
// and restores it when the client's next call arrives. The probe ("zero" mode) holds 76 MiB of
// movable memory and a 1 MiB array, which cannot move and leaves with the checkpoint.
class RemoteZero : public RemoteLimits {
 protected:
  std::string WorkerFlags() const override { return "--tiering --idle-swap 300ms --idle-zero 1s"; }
  void SetUp() override {
    RemoteLimits::SetUp();
    shm_name_ = "tf-rl-" + std::to_string(getpid());
    setenv("FAKECUDA_SHM_NAME", shm_name_.c_str(), 1);  // the fake's checkpoint table, as the worker's
    fake_ = dlopen(TF_FAKECUDA, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(fake_, nullptr) << dlerror();
    info_ = reinterpret_cast<int (*)(int, unsigned*, unsigned*, unsigned long long*)>(
        dlsym(fake_, "fakecuda_checkpoint_info"));
    ASSERT_NE(info_, nullptr);
  }
  // Up to 30 s: a tiered tenant pins its host copies ahead at start, which can take over 10 s on a
  // loaded two-core machine.
  bool WaitFor(const std::string& name) {
    for (int i = 0; i < 1200; ++i) {
      if (access((dir_ + "/" + name).c_str(), F_OK) == 0) return true;
      usleep(25000);
    }
    return false;
  }
  // Starts the probe through `tfusion run --remote via` in a process group of its own.
  pid_t StartClient(const std::string& via) { return StartProbe("--remote " + via + " --token t"); }
  // The same under `tfusion run RUN_FLAGS`.
  pid_t StartProbe(const std::string& run_flags) {
    Shell("rm -rf " + dir_ + "/t && mkdir -p " + dir_ + "/t");
    std::string cmd = env_ + "exec timeout 60 " + TF_TFUSION + " run " + run_flags + " -- " + TF_PROBE + " zero " +
                      dir_ + "/t array > " + dir_ + "/client.out 2>&1";
    pid_t client = fork();
    if (client == 0) {
      setpgid(0, 0);
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    return client;
  }
  // The session's pid, from its vGPU "remote-PID"; 0 when there is none.
  int SessionPid() {
    std::smatch m;
    std::string smi = Shell(env_ + TF_TFUSION + " smi").out;
    return std::regex_search(smi, m, std::regex("remote-([0-9]+)")) ? std::atoi(m[1].str().c_str()) : 0;
  }
  unsigned State(int pid, unsigned* calls_while_locked = nullptr, unsigned long long* saved = nullptr) {
    unsigned state = 99;
    if (info_(pid, &state, calls_while_locked, saved) != 0) return 99;
    return state;
  }
  bool WaitCheckpointed() {
    for (int i = 0; i < 200; ++i) {
      if (Shell(env_ + TF_TFUSION + " smi -p").out.find("checkpointed") != std::string::npos) return true;
      usleep(50000);
    }
    return false;
  }
  // VRAM in use on the worker's device 0 as the fake NVML reports it (every process of this
  // test's FAKECUDA_SHM_NAME), in MiB; -1 when unreadable. Read in a child, so that this process
  // never loads the fake NVML.
  long long DeviceUsedMiB() {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    pid_t child = fork();
    if (child == 0) {
      close(fds[0]);
      struct Memory {
        unsigned long long total, free, used;
      } m = {};
      long long mib = -1;
      void* h = dlopen(TF_FAKENVML, RTLD_NOW | RTLD_LOCAL);
      auto init = h ? reinterpret_cast<int (*)()>(dlsym(h, "nvmlInit_v2")) : nullptr;
      auto by_index = h ? reinterpret_cast<int (*)(unsigned, void**)>(dlsym(h, "nvmlDeviceGetHandleByIndex_v2")) : nullptr;
      auto info = h ? reinterpret_cast<int (*)(void*, Memory*)>(dlsym(h, "nvmlDeviceGetMemoryInfo")) : nullptr;
      void* dev = nullptr;
      if (init && by_index && info && init() == 0 && by_index(0, &dev) == 0 && info(dev, &m) == 0) mib = m.used >> 20;
      ssize_t w = write(fds[1], &mib, sizeof(mib));
      _exit(w == sizeof(mib) ? 0 : 1);
    }
    close(fds[1]);
    long long mib = -1;
    if (child < 0 || read(fds[0], &mib, sizeof(mib)) != sizeof(mib)) mib = -1;
    close(fds[0]);
    if (child > 0) waitpid(child, nullptr, 0);
    return mib;
  }
  std::string Log() { return ReadFile(dir_ + "/client.out") + ReadFile(dir_ + "/worker.log"); }
  virtual std::string Logs() { return Log(); }
  // The client's next call restores the session with every byte of the probe's four buffers and
  // no call of the session reached the driver while checkpointed; then the client exits 0.
  void ExpectRestoredIntact(pid_t client, int session) {
    Shell("touch " + dir_ + "/t/go");
    ASSERT_TRUE(WaitFor("t/verified")) << Logs();
    const std::string out = ReadFile(dir_ + "/client.out");
    EXPECT_NE(out.find("first_call=0"), std::string::npos) << out;
    EXPECT_NE(out.find("zero_identical=4"), std::string::npos) << out;
    unsigned calls = 99;
    EXPECT_EQ(State(session, &calls), 0u) << "CU_PROCESS_STATE_RUNNING";
    EXPECT_EQ(calls, 0u) << "a call of the session reached the driver while it was checkpointed";
    Shell("touch " + dir_ + "/t/go3");
    int status = 0;
    waitpid(client, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << Logs();
  }
  std::string shm_name_;
  void* fake_ = nullptr;
  int (*info_)(int, unsigned*, unsigned*, unsigned long long*) = nullptr;
};

TEST_F(RemoteZero, AnIdleSessionGoesToZeroAndTheClientsNextCallBringsEveryByteBack) {
  for (const std::string& via : {std::string("unix:") + dir_ + "/w.sock", TcpAddress()}) {
    SCOPED_TRACE(via);
    pid_t client = StartClient(via);
    ASSERT_GT(client, 0);
    ASSERT_TRUE(WaitFor("t/ready")) << Log();
    const int session = SessionPid();
    ASSERT_GT(session, 0) << Shell(env_ + TF_TFUSION + " smi").out;
    ASSERT_TRUE(WaitCheckpointed()) << Shell(env_ + TF_TFUSION + " smi -p").out << Log();
    // The session swapped its movable buffers out first (it idles 300 ms before that: too soon
    // to read the device's use reliably before it).
    EXPECT_TRUE(std::regex_search(ReadFile(dir_ + "/worker.log"), std::regex("swapped out 7[0-9] MiB"))) << Log();
    unsigned long long saved = 0;
    EXPECT_EQ(State(session, nullptr, &saved), 2u) << "CU_PROCESS_STATE_CHECKPOINTED";
    EXPECT_GE(saved, 1ull << 20) << "the fixed buffer left the device with the checkpoint";
    EXPECT_LT(saved, 4ull << 20) << "the movable buffers were swapped out before";
    EXPECT_EQ(DeviceUsedMiB(), 0) << "a checkpointed session holds no VRAM";
    EXPECT_TRUE(std::regex_search(ReadFile(dir_ + "/worker.log"),
                                  std::regex("vGPU remote-" + std::to_string(session) + ": process [0-9]+ idle [0-9]+ s: checkpointed")))
        << Log();
    ExpectRestoredIntact(client, session);
  }
}

// A client that goes away while its session is checkpointed: the session's cleanup (its first
// driver call) asks the keeper to restore it, then frees everything and exits as any session
// does; the worker removes its vGPU. Nothing is left: no session process, no vGPU, no VRAM.
TEST_F(RemoteZero, AClientKilledWhileItsSessionIsCheckpointedLeavesNothingBehind) {
  pid_t client = StartClient(std::string("unix:") + dir_ + "/w.sock");
  ASSERT_GT(client, 0);
  ASSERT_TRUE(WaitFor("t/ready")) << Log();
  const int session = SessionPid();
  ASSERT_GT(session, 0);
  ASSERT_TRUE(WaitCheckpointed()) << Log();
  EXPECT_EQ(State(session), 2u);
  kill(-client, SIGKILL);
  waitpid(client, nullptr, 0);
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = kill(session, 0) != 0 && SessionPid() == 0;
    if (!gone) usleep(50000);
  }
  EXPECT_TRUE(gone) << Shell(env_ + TF_TFUSION + " smi -p").out << Log();
  EXPECT_EQ(DeviceUsedMiB(), 0) << Log();
  EXPECT_NE(ReadFile(dir_ + "/worker.log").find("session ended: freed"), std::string::npos) << Log();
}

// Explicit requests: `tfusion freeze remote-PID --zero` swaps the session out and checkpoints it
// from the CLI's process; `tfusion thaw` restores it ahead of the client's next call. A worker
// whose --idle-zero is not longer than its --idle-swap does not start.
class RemoteZeroOnRequest : public RemoteZero {
 protected:
  std::string WorkerFlags() const override { return "--tiering --idle-swap 0"; }
};

TEST_F(RemoteZeroOnRequest, FreezeZeroAndThawReachAWorkerSession) {
  pid_t client = StartClient(TcpAddress());
  ASSERT_GT(client, 0);
  ASSERT_TRUE(WaitFor("t/ready")) << Log();
  const int session = SessionPid();
  ASSERT_GT(session, 0);
  const std::string vgpu = "remote-" + std::to_string(session);
  Result frozen = Shell(env_ + TF_TFUSION + " freeze " + vgpu + " --zero --driver " + TF_FAKECUDA);
  EXPECT_EQ(frozen.rc, 0) << frozen.out << Log();
  EXPECT_NE(frozen.out.find("checkpointed"), std::string::npos) << frozen.out;
  EXPECT_EQ(State(session), 2u);
  EXPECT_EQ(DeviceUsedMiB(), 0);
  Result thawed = Shell(env_ + TF_TFUSION + " thaw " + vgpu + " --driver " + TF_FAKECUDA);
  EXPECT_EQ(thawed.rc, 0) << thawed.out << Log();
  EXPECT_EQ(State(session), 0u);
  Shell("touch " + dir_ + "/t/go");
  ASSERT_TRUE(WaitFor("t/verified")) << Log();
  EXPECT_NE(ReadFile(dir_ + "/client.out").find("zero_identical=4"), std::string::npos) << Log();
  Shell("touch " + dir_ + "/t/go3");
  int status = 0;
  waitpid(client, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << Log();
  Result bad = Shell(env_ + TF_TFUSION + " worker --listen unix:" + dir_ + "/w2.sock --tiering --idle-swap 10s --idle-zero 5s");
  EXPECT_EQ(bad.rc, 2) << bad.out;
  EXPECT_NE(bad.out.find("--idle-zero (5s) must be longer than --idle-swap (10s)"), std::string::npos) << bad.out;
}

// A pooled run placed on the worker's node (`tfusion run --controller` on a machine without the
// GPU) whose allocation oversells VRAM: the session's vGPU is bound to the allocation
// ("remote-PID@a-..."), takes its idle zero timeout instead of the worker's --idle-zero, and the
// node agent (`tfusion hypervisor`, in front of the same fake GPUs, with this worker's address)
// passes the allocation's zero freeze on to it. The worker's own timeouts (10 and 20 minutes)
// never act during the test.
class RemotePooledZero : public RemoteZero {
 protected:
  std::string WorkerFlags() const override { return "--tiering --idle-swap 10m --idle-zero 20m"; }
  void TearDown() override {
    for (pid_t p : {agent_, controller_}) {
      if (p <= 0) continue;
      kill(p, SIGTERM);
      waitpid(p, nullptr, 0);
    }
    RemoteZero::TearDown();
  }
  // The controller, and the node agent registering this machine's GPUs with the worker's TCP
  // address; the default pool then oversells VRAM (its allocations get tiering).
  bool StartControlPlane() {
    controller_ = StartController(&url_);
    if (url_.empty()) return false;
    std::string cmd = "exec env " + env_ + "LD_LIBRARY_PATH=" + TF_FAKECUDA_DIR + " TFUSION_REAL_LIBCUDA=" +
                      TF_FAKECUDA + " " + TF_TFUSION + " hypervisor --controller " + url_ +
                      " --token t --node gpu-node --metrics-port -1 --credential-file " + dir_ +
                      "/node.cred --worker-address " + TcpAddress() + " > " + dir_ + "/agent.log 2>&1";
    agent_ = fork();
    if (agent_ == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    bool ready = false;
    for (int i = 0; i < 200 && !ready; ++i) {
      ready = Shell(std::string(TF_TFUSION) + " node ls --url " + url_ + " --token t").out.find("ready") != std::string::npos;
      if (!ready) usleep(50000);
    }
    if (!PoolOversellsVram()) return ready;
    tf::controller::HttpClient client(url_, "t");
    auto pool = client.Patch("/v1/pools/default", R"({"vram_expand_to_host_percent":100})");
    return ready && pool.ok() && pool->status == 200;
  }
  virtual bool PoolOversellsVram() const { return true; }
  // The probe ("zero" mode) under `tfusion run --controller`, which finds no GPU here (no NVML)
  // and runs it through the node's worker, in a process group of its own.
  pid_t StartPooledClient(const std::string& flags) {
    return StartProbe("--controller " + url_ + " --token t --nvml /nonexistent/libnvidia-ml.so.1 --vram 1GiB "
                      "--percent 10 --qos low " + flags);
  }
  std::string AllocationId() {
    std::smatch m;
    std::string out = ReadFile(dir_ + "/client.out");
    return std::regex_search(out, m, std::regex("allocation (a-[0-9a-f]+)")) ? m.str(1) : "";
  }
  bool WaitLog(const std::string& file, const std::string& text) {
    for (int i = 0; i < 200; ++i) {
      if (ReadFile(dir_ + "/" + file).find(text) != std::string::npos) return true;
      usleep(50000);
    }
    return false;
  }
  std::string Logs() override { return Log() + "--- agent\n" + ReadFile(dir_ + "/agent.log"); }
  // The control plane, then a pooled client whose session the node agent has seen bound to its
  // allocation; `session` stays 0 when something did not start (the reason is reported).
  struct BoundSession {
    pid_t client = -1;
    int session = 0;
    std::string allocation, vgpu;
  };
  BoundSession StartBoundSession(const std::string& flags) {
    BoundSession b;
    if (!StartControlPlane()) {
      ADD_FAILURE() << "control plane\n" << Logs();
      return b;
    }
    b.client = StartPooledClient(flags);
    if (b.client <= 0 || !WaitFor("t/ready")) {
      ADD_FAILURE() << "client\n" << Logs();
      return b;
    }
    b.allocation = AllocationId();
    const int session = SessionPid();
    b.vgpu = "remote-" + std::to_string(session) + "@" + b.allocation;
    if (b.allocation.empty() || session <= 0 ||
        !WaitLog("agent.log", "remote session vGPU " + b.vgpu + " follows allocation " + b.allocation)) {
      ADD_FAILURE() << "session\n" << Shell(env_ + TF_TFUSION + " smi").out << Logs();
      return b;
    }
    b.session = session;
    return b;
  }
  // The agent ended the session (`why`: the reason its log gives): no session process, no vGPU,
  // no VRAM; then the client's next call fails (the probe says so and waits for go2), and the
  // client ends with an error.
  void ExpectSessionEndedAndTheClientsNextCallFails(const BoundSession& b, const std::string& why) {
    bool ended = false;
    for (int i = 0; i < 200 && !ended; ++i) {
      ended = kill(b.session, 0) != 0 && SessionPid() == 0;
      if (!ended) usleep(50000);
    }
    EXPECT_TRUE(ended) << Shell(env_ + TF_TFUSION + " smi -p").out << Logs();
    EXPECT_EQ(DeviceUsedMiB(), 0) << Logs();
    EXPECT_TRUE(std::regex_search(ReadFile(dir_ + "/agent.log"),
                                  std::regex("allocation " + b.allocation + " was " + why + " by the controller.*: stopping "
                                             "the worker session " + std::to_string(b.session) + " of its remote session "
                                             "vGPU " + b.vgpu)))
        << Logs();
    Shell("touch " + dir_ + "/t/go");
    ASSERT_TRUE(WaitFor("t/failed")) << Logs();
    std::smatch m;
    const std::string out = ReadFile(dir_ + "/client.out");
    ASSERT_TRUE(std::regex_search(out, m, std::regex("first_call=([0-9]+)"))) << out;
    EXPECT_NE(m.str(1), "0") << out;
    Shell("touch " + dir_ + "/t/go2");
    int status = 0;
    bool exited = false;
    for (int i = 0; i < 200 && !exited; ++i) {
      exited = waitpid(b.client, &status, WNOHANG) == b.client;
      if (!exited) usleep(50000);
    }
    if (!exited) kill(-b.client, SIGKILL);
    ASSERT_TRUE(exited) << "the client hung\n" << Logs();
    EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << Logs();
  }
  std::string url_;
  pid_t controller_ = -1, agent_ = -1;
};

TEST_F(RemotePooledZero, TheAllocationsIdleZeroCheckpointsItsRemoteSessionAndTheNextCallRestoresIt) {
  const BoundSession b = StartBoundSession("--idle-swap 1s --idle-zero 3s");
  ASSERT_GT(b.session, 0);
  const int session = b.session;
  const std::string& allocation = b.allocation;
  const std::string& vgpu = b.vgpu;
  // Bound to the allocation, with its timeouts (swap 1s, the low QoS's disk default, zero 3s).
  std::string smi = Shell(env_ + TF_TFUSION + " smi -p").out;
  EXPECT_TRUE(std::regex_search(smi, std::regex(vgpu + " +1s +2m +3s\n"))) << smi << Logs();
  ASSERT_TRUE(WaitCheckpointed()) << Shell(env_ + TF_TFUSION + " smi -p").out << Logs();
  unsigned long long saved = 0;
  EXPECT_EQ(State(session, nullptr, &saved), 2u) << "CU_PROCESS_STATE_CHECKPOINTED";
  EXPECT_GE(saved, 1ull << 20) << "the fixed buffer left the device with the checkpoint";
  EXPECT_EQ(DeviceUsedMiB(), 0) << "a checkpointed session holds no VRAM";
  EXPECT_TRUE(std::regex_search(ReadFile(dir_ + "/worker.log"),
                                std::regex("vGPU " + vgpu + ": process [0-9]+ idle [0-9]+ s: checkpointed")))
      << Logs();
  // The controller hears it from the node agent (heartbeats every 5 s): the allocation shows its
  // session checkpointed.
  std::string ps;
  for (int i = 0; i < 240 && ps.find("checkpointed") == std::string::npos; ++i) {
    ps = Shell(std::string(TF_TFUSION) + " ps --url " + url_ + " --token t").out;
    if (ps.find("checkpointed") == std::string::npos) usleep(50000);
  }
  EXPECT_TRUE(std::regex_search(ps, std::regex(allocation + ".*checkpointed"))) << ps;
  ExpectRestoredIntact(b.client, session);
}

TEST_F(RemotePooledZero, AZeroFreezeOfTheAllocationReachesItsRemoteSessionThroughTheNodeAgent) {
  const BoundSession b = StartBoundSession("--idle-swap 0");
  ASSERT_GT(b.session, 0);
  const int session = b.session;
  const std::string& allocation = b.allocation;
  const std::string& vgpu = b.vgpu;
  Result frozen = Shell(std::string(TF_TFUSION) + " freeze " + allocation + " --controller --zero --url " + url_ +
                        " --token t");
  EXPECT_EQ(frozen.rc, 0) << frozen.out;
  ASSERT_TRUE(WaitCheckpointed()) << Shell(env_ + TF_TFUSION + " smi -p").out << Logs();
  EXPECT_EQ(State(session), 2u) << "CU_PROCESS_STATE_CHECKPOINTED";
  EXPECT_EQ(DeviceUsedMiB(), 0) << "a checkpointed session holds no VRAM";
  EXPECT_NE(ReadFile(dir_ + "/agent.log").find("scale to zero of remote session vGPU " + vgpu + " requested"),
            std::string::npos) << Logs();
  ExpectRestoredIntact(b.client, session);
}

// What a client sends is checked by the worker: a timeout that is not a duration, longer than 30
// days or not longer than the session's swap timeout, or an allocation id that is not one, is
// refused with the reason in the worker's log, and no vGPU is left behind. The client here holds
// the worker's token (a session ticket would refuse any limits but its own first).
TEST_F(RemotePooledZero, AnIdleZeroOrAllocationTheWorkerCannotTakeIsRefusedWithAReason) {
  const std::string tfusion = TF_TFUSION;
  const std::string stub = "LD_LIBRARY_PATH=" + tfusion.substr(0, tfusion.rfind('/')) + "/../client/inject" +
                           " TFUSION_REMOTE=unix:" + dir_ + "/w.sock TFUSION_TOKEN=t TFUSION_REMOTE_VRAM=64MiB ";
  for (auto [env, why] : {std::pair{"TFUSION_REMOTE_IDLE_ZERO=1000h", "the allocation's idle zero timeout 1000h: at most 30 days"},
                          std::pair{"TFUSION_REMOTE_IDLE_ZERO=-5s", "the allocation's idle zero timeout -5s: give a duration"},
                          std::pair{"TFUSION_REMOTE_IDLE_ZERO=5m", "the allocation's idle zero timeout (5m) must be longer than its idle swap timeout (10m)"},
                          std::pair{"TFUSION_REMOTE_ALLOCATION=a-../x", "the client's allocation 'a-../x' is not an allocation id"}}) {
    SCOPED_TRACE(env);
    Result r = Shell(env_ + "timeout 60 env " + stub + env + " " + TF_REMOTE_PROBE + " basic 2>&1");
    EXPECT_NE(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("the worker refused the vGPU"), std::string::npos) << r.out;
    EXPECT_NE(ReadFile(dir_ + "/worker.log").find(why), std::string::npos) << ReadFile(dir_ + "/worker.log");
  }
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = !std::regex_search(Shell(env_ + TF_TFUSION + " smi").out, std::regex("remote-[0-9]+"));
    if (!gone) usleep(50000);
  }
  EXPECT_TRUE(gone) << Shell(env_ + TF_TFUSION + " smi").out;
}

// A higher-QoS request suspends the allocation (a pool that oversells VRAM): the node agent holds
// its bound session as it holds a local vGPU. The session's movable VRAM leaves the device, the
// client's next GPU call waits while the preemptor runs, and once the preemptor is deleted the
// controller resumes the allocation, the agent lifts the hold and the call completes with every
// byte of the four buffers.
TEST_F(RemotePooledZero, ASuspendedAllocationsSessionIsHeldSwappedOutAndResumesWithEveryByte) {
  const BoundSession b = StartBoundSession("--idle-swap 0");
  ASSERT_GT(b.session, 0);
  const long long before = DeviceUsedMiB();
  EXPECT_GE(before, 70) << "the probe's buffers are on the device";
  tf::controller::HttpClient client(url_, "t");
  // 95% of both GPUs of the node: it fits only without the session's 10%.
  auto r = client.Post("/v1/allocations", R"({"percent": 95, "vram_mib": 1024, "gpu_count": 2, "qos": "critical"})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_NE(r->body.find("\"preempted_suspended\":[\"" + b.allocation + "\"]"), std::string::npos) << r->body;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r->body, m, std::regex("\"id\":\"(a-[0-9a-f]+)\""))) << r->body;
  const std::string winner = m.str(1);
  ASSERT_TRUE(WaitLog("agent.log", "remote session vGPU " + b.vgpu + " suspended")) << Logs();
  // Swapped out: the 76 MiB of movable buffers leave the device; what stays is the fixed memory
  // the session reports (the 1 MiB array among it).
  long long used = -1;
  for (int i = 0; i < 200; ++i) {
    used = DeviceUsedMiB();
    if (used >= 0 && used <= before - 76) break;
    usleep(50000);
  }
  EXPECT_LE(used, before - 76) << Shell(env_ + TF_TFUSION + " smi -p").out << Logs();
  EXPECT_LE(used, 2) << Logs();
  EXPECT_GE(used, 1);
  EXPECT_TRUE(std::regex_search(ReadFile(dir_ + "/worker.log"),
                                std::regex("vGPU '" + b.vgpu + "': swapped out 7[0-9] MiB.*; " + std::to_string(used) +
                                           " MiB stay resident \\(fixed\\)")))
      << Logs();
  EXPECT_TRUE(std::regex_search(Shell(env_ + TF_TFUSION + " smi -p").out, std::regex(b.vgpu + " .*swapped")))
      << Shell(env_ + TF_TFUSION + " smi -p").out;
  // The client's next GPU call waits while held.
  Shell("touch " + dir_ + "/t/go");
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  EXPECT_EQ(ReadFile(dir_ + "/client.out").find("first_call="), std::string::npos) << Logs();
  EXPECT_EQ(waitpid(b.client, nullptr, WNOHANG), 0) << Logs();
  EXPECT_EQ(DeviceUsedMiB(), used) << "the waiting call did not swap the session in";
  std::string ps = Shell(std::string(TF_TFUSION) + " ps --url " + url_ + " --token t").out;
  EXPECT_NE(ps.find("suspended by " + winner), std::string::npos) << ps;

  // The preemptor goes: resumed, the waiting call completes with every byte.
  auto gone = client.Delete("/v1/allocations/" + winner);
  ASSERT_TRUE(gone.ok() && gone->status == 200);
  ASSERT_TRUE(WaitFor("t/verified")) << Logs();
  const std::string out = ReadFile(dir_ + "/client.out");
  EXPECT_NE(out.find("first_call=0"), std::string::npos) << out;
  EXPECT_NE(out.find("zero_identical=4"), std::string::npos) << out;
  EXPECT_NE(ReadFile(dir_ + "/agent.log").find("remote session vGPU " + b.vgpu + " resumed: hold released"),
            std::string::npos) << Logs();
  EXPECT_NE(ReadFile(dir_ + "/worker.log").find("is suspended (preempted by a higher QoS)"), std::string::npos)
      << Logs();
  Shell("touch " + dir_ + "/t/go3");
  int status = 0;
  waitpid(b.client, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << Logs();
}

// The allocation taken back (deleted here) while its session runs: the node agent ends the session
// process as it stops an allocation's local processes, the worker removes its vGPU, its VRAM is
// freed, and the client's next call fails with a CUDA error instead of hanging.
TEST_F(RemotePooledZero, DeletingTheAllocationEndsItsRemoteSessionAndTheClientsNextCallFails) {
  const BoundSession b = StartBoundSession("--idle-swap 0");
  ASSERT_GT(b.session, 0);
  EXPECT_GT(DeviceUsedMiB(), 0);
  tf::controller::HttpClient client(url_, "t");
  auto gone = client.Delete("/v1/allocations/" + b.allocation);
  ASSERT_TRUE(gone.ok() && gone->status == 200);
  ExpectSessionEndedAndTheClientsNextCallFails(b, "released");
}

// A pool that does not oversell VRAM (the default) and a worker without --tiering: the pooled
// run's session is bound to its allocation all the same, so the controller sees the session's
// process as the allocation's, and the allocation taken back stops the session (it used to run
// on, unseen, while `tfusion ps` said its eviction was done).
class RemotePooledPlain : public RemotePooledZero {
 protected:
  std::string WorkerFlags() const override { return ""; }
  bool PoolOversellsVram() const override { return false; }
};

TEST_F(RemotePooledPlain, ASessionInAPoolWithoutTieringIsTheAllocationsAndEndsWithIt) {
  const BoundSession b = StartBoundSession("");
  ASSERT_GT(b.session, 0);
  tf::controller::HttpClient client(url_, "t");
  bool seen = false;
  std::string body;
  for (int i = 0; i < 200 && !seen; ++i) {
    auto a = client.Get("/v1/allocations");  // the list carries each allocation's use and processes
    body = a.ok() ? a->body : a.status().ToString();
    seen = body.find("\"pid\":" + std::to_string(b.session)) != std::string::npos;
    if (!seen) usleep(50000);
  }
  EXPECT_TRUE(seen) << "the allocation's processes name the session: " << body << Logs();
  auto gone = client.Delete("/v1/allocations/" + b.allocation);
  ASSERT_TRUE(gone.ok() && gone->status == 200);
  ExpectSessionEndedAndTheClientsNextCallFails(b, "released");
}

// A program of two CUDA processes through the worker has a session vGPU of the allocation's size
// per process: the controller counts the second as use outside the pool, so that placement does
// not hand that capacity to someone else; gone with the program.
TEST_F(RemotePooledPlain, ASecondSessionOfOneAllocationCountsAsUnpooledUse) {
  ASSERT_TRUE(StartControlPlane()) << Logs();
  const std::string probe = TF_PROBE;
  pid_t client = fork();
  ASSERT_GE(client, 0);
  if (client == 0) {
    setpgid(0, 0);
    std::string cmd = env_ + "exec timeout 60 " + TF_TFUSION + " run --controller " + url_ +
                      " --token t --nvml /nonexistent/libnvidia-ml.so.1 --vram 1GiB --percent 10 -- sh -c '" + probe +
                      " launch 6 & " + probe + " launch 6; wait' > " + dir_ + "/client.out 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  tf::controller::HttpClient client_api(url_, "t");
  std::string body;
  bool counted = false;
  for (int i = 0; i < 200 && !counted; ++i) {
    auto g = client_api.Get("/v1/gpus");
    body = g.ok() ? g->body : g.status().ToString();
    // 10% of the fake's 989.4 TFLOPS and 1 GiB: one session's worth.
    counted = body.find("\"unpooled_tflops\":98.94") != std::string::npos &&
              body.find("\"unpooled_vram_mib\":1024") != std::string::npos;
    if (!counted) usleep(50000);
  }
  EXPECT_TRUE(counted) << body << Shell(env_ + TF_TFUSION + " smi").out << Logs();
  int status = 0;
  waitpid(client, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFile(dir_ + "/client.out");
  bool cleared = false;
  for (int i = 0; i < 200 && !cleared; ++i) {
    auto g = client_api.Get("/v1/gpus");
    body = g.ok() ? g->body : g.status().ToString();
    cleared = body.find("\"unpooled_tflops\":98.94") == std::string::npos;
    if (!cleared) usleep(50000);
  }
  EXPECT_TRUE(cleared) << body;
}

// A worker without --tiering has no zero keeper: the node agent refuses the allocation's zero
// freeze for its session (a checkpointed session with nobody to restore it would hang its
// client), says so in its log, and the session goes on untouched.
class RemotePooledNoKeeper : public RemotePooledZero {
 protected:
  std::string WorkerFlags() const override { return ""; }
};

TEST_F(RemotePooledNoKeeper, AZeroFreezeOfASessionWhoseWorkerHasNoKeeperIsRefusedAndChangesNothing) {
  const BoundSession b = StartBoundSession("--idle-swap 0");
  ASSERT_GT(b.session, 0);
  const int session = b.session;
  const std::string& allocation = b.allocation;
  const std::string& vgpu = b.vgpu;
  const long long before = DeviceUsedMiB();
  Result frozen = Shell(std::string(TF_TFUSION) + " freeze " + allocation + " --controller --zero --url " + url_ +
                        " --token t");
  EXPECT_EQ(frozen.rc, 0) << frozen.out;
  ASSERT_TRUE(WaitLog("agent.log", "scale to zero of remote session vGPU " + vgpu +
                                       " refused: its worker has no zero keeper (it runs without --tiering)"))
      << Logs();
  EXPECT_EQ(State(session), 0u) << "CU_PROCESS_STATE_RUNNING";
  EXPECT_GT(before, 0);
  EXPECT_EQ(DeviceUsedMiB(), before) << "the session kept its VRAM";
  ExpectRestoredIntact(b.client, session);
}

// Suspended while its worker has no tiering: the session cannot be held swapped out, so the node
// agent stops it, as a local victim without tiering is stopped; the client's next call fails.
TEST_F(RemotePooledNoKeeper, ASuspendedAllocationsSessionWithoutTieringIsEnded) {
  const BoundSession b = StartBoundSession("--idle-swap 0");
  ASSERT_GT(b.session, 0);
  tf::controller::HttpClient client(url_, "t");
  auto r = client.Post("/v1/allocations", R"({"percent": 95, "vram_mib": 1024, "gpu_count": 2, "qos": "critical"})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_NE(r->body.find("\"preempted_suspended\":[\"" + b.allocation + "\"]"), std::string::npos) << r->body;
  ExpectSessionEndedAndTheClientsNextCallFails(b, "suspended");
  EXPECT_NE(ReadFile(dir_ + "/agent.log").find("its remote session has no tiering to be held swapped out with"),
            std::string::npos) << Logs();
}
