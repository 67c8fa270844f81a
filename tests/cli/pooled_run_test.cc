// `tfusion run --controller`: the pool places the vGPU, the command runs on it, and the
// allocation is released when the command ends. Runs the real binaries: `tfusion up` (controller
// and node agent, whose NVML is the fake one) and `tfusion run` in front of the fake driver.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "controller/http_client.h"

namespace {

using tf::cli::testing::ReadFile;
using tf::cli::testing::Result;
using tf::cli::testing::Shell;

class PooledRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tf-pooled-XXXXXX";
    dir_ = mkdtemp(tmpl);
    env_ = "TFUSION_SHM_DIR=" + dir_ + "/shm FAKECUDA_SHM_NAME=/tf-pooled-" + std::to_string(getpid()) + " ";
    StartUp(0, "up.log");
  }
  // `tfusion up` in dir_ (state folder dir_/.tfusion) on `port` (0: any), its output in dir_/LOG;
  // returns once its node agent has registered the fake GPU.
  void StartUp(int port, const std::string& log) {
    up_ = fork();
    ASSERT_GE(up_, 0);
    if (up_ == 0) {
      if (chdir(dir_.c_str()) != 0) _exit(126);
      std::string cmd = "exec env " + env_ + "LD_LIBRARY_PATH=" + TF_FAKECUDA_DIR + " " + TF_TFUSION +
                        " up --port " + std::to_string(port) + " --metrics-port 0 > " + log + " 2>&1";
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    std::regex url_re("http://127\\.0\\.0\\.1:[0-9]+");
    url_.clear();
    for (int i = 0; i < 200 && url_.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::smatch m;
      std::string out = ReadFile(dir_ + "/" + log);
      if (std::regex_search(out, m, url_re)) url_ = m.str();
    }
    ASSERT_FALSE(url_.empty()) << ReadFile(dir_ + "/" + log);
    token_ = ReadFile(dir_ + "/.tfusion/token");
    while (!token_.empty() && (token_.back() == '\n' || token_.back() == ' ')) token_.pop_back();
    // Wait until the node agent has registered the fake GPU.
    bool ready = false;
    for (int i = 0; i < 200 && !ready; ++i) {
      Result r = Shell(std::string(TF_TFUSION) + " node ls --url " + url_ + " --token " + token_);
      ready = r.out.find("ready") != std::string::npos && r.out.find("989.4") != std::string::npos;
      if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(ready) << ReadFile(dir_ + "/" + log);
  }
  void TearDown() override {
    if (up_ > 0) {
      kill(up_, SIGTERM);
      waitpid(up_, nullptr, 0);
    }
    EXPECT_EQ(system(("rm -rf '" + dir_ + "'").c_str()), 0);
    tf::cli::testing::RemoveFakeDriverShm("tf-pooled-" + std::to_string(getpid()));
  }
  std::string PooledRun(const std::string& flags, const std::string& probe_args) const {
    return env_ + TF_TFUSION + " run --controller " + url_ + " --token " + token_ + " --driver " + TF_FAKECUDA +
           " --nvml " + TF_FAKENVML + " " + flags + " -- " + TF_PROBE + " " + probe_args;
  }

  // In a pool whose VRAM expands into host memory, the tier probe (`limiter_probe tier D`) under
  // `tfusion run --controller --idle-swap 0`, its output in `log`, `env` before the command; *run
  // is `tfusion run`'s pid once the probe has filled its buffers.
  void StartTierTenant(const std::string& env, const std::string& d, const std::string& log, pid_t* run) {
    tf::controller::HttpClient client(url_, token_);
    auto pool = client.Patch("/v1/pools/default", R"({"vram_expand_to_host_percent":100})");
    ASSERT_TRUE(pool.ok() && pool->status == 200) << (pool.ok() ? pool->body : pool.status().ToString());
    ASSERT_EQ(Shell("mkdir -p " + d).rc, 0);
    *run = fork();
    ASSERT_GE(*run, 0);
    if (*run == 0) {
      std::string cmd = env + PooledRun("--vram 1GiB --percent 60 --idle-swap 0", "tier " + d) + " > " + log + " 2>&1";
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    ASSERT_TRUE(WaitUntil([&] { return access((d + "/ready").c_str(), F_OK) == 0; })) << ReadFile(log);
  }
  // Polls `done` for up to 10 s.
  template <typename Done>
  static bool WaitUntil(Done&& done) {
    for (int i = 0; i < 400; ++i) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return false;
  }
  // Lets the tier probe in `d` run to its end (15 s at most): every byte must have come back.
  void ResumeToTheEndIntact(pid_t run, const std::string& d, const std::string& log) {
    for (const char* name : {"/go", "/go2", "/go3"}) ASSERT_EQ(Shell("touch " + d + name).rc, 0);
    bool ended = false;
    int status = -1;
    for (int i = 0; i < 300 && !ended; ++i) {
      ended = waitpid(run, &status, WNOHANG) == run;
      if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!ended) {
      kill(run, SIGKILL);
      waitpid(run, nullptr, 0);
    }
    const std::string out = ReadFile(log);
    // The tenant (and `tfusion run`, which passes its status on) exits cleanly: nothing at exit
    // touches a driver or a library already torn down.
    EXPECT_TRUE(ended && WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << "\n" << out;
    EXPECT_NE(out.find("first_identical=3"), std::string::npos) << out;
    EXPECT_NE(out.find("second_identical=3"), std::string::npos) << out;
  }

  std::string dir_, env_, url_, token_;
  pid_t up_ = -1;
};

TEST_F(PooledRunTest, ThePoolPlacesTheVgpuAndTheAllocationIsReleasedAfterwards) {
  Result r = Shell(PooledRun("--vram 1GiB --percent 50", "alloc"));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("allocated_mib=1024"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("total_mib=1024"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("50.0% of the GPU"), std::string::npos) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("allocation (a-[0-9a-f]+)"))) << r.out;
  Result ps = Shell(std::string(TF_TFUSION) + " ps --url " + url_ + " --token " + token_);
  EXPECT_EQ(ps.out.find(m.str(1)), std::string::npos) << "released after the command\n" << ps.out;
}

// A run that fails after the pool placed it, before its command starts, gives the allocation
// back at once (it was held until its lease ran out, a minute later).
TEST_F(PooledRunTest, ARunThatFailsBeforeItsCommandStartsReleasesItsAllocation) {
  Result r = Shell("TFUSION_HOST_TIER_BUDGET=lots " + PooledRun("--vram 1GiB --percent 50", "alloc"));
  EXPECT_EQ(r.rc, 2) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("allocation (a-[0-9a-f]+)"))) << r.out;
  EXPECT_NE(r.out.find("TFUSION_HOST_TIER_BUDGET"), std::string::npos) << r.out;
  Result ps = Shell(std::string(TF_TFUSION) + " ps --url " + url_ + " --token " + token_);
  EXPECT_EQ(ps.out.find(m.str(1)), std::string::npos) << "released at once\n" << ps.out;
}

// `--controller` takes the replicas, comma-separated, as node agents do: the run is placed by the
// one that serves, past an unreachable one and a standby (503). When only standbys answer, the
// run is refused with the reason: it used to run on a local vGPU the pool knew nothing of.
TEST_F(PooledRunTest, TheRunGoesToTheServingReplicaAndStandbysAloneRefuseIt) {
  pid_t standby = fork();
  ASSERT_GE(standby, 0);
  if (standby == 0) {
    std::string cmd = std::string("exec ") + TF_TFUSION + " controller --port 0 --store sqlite:" + dir_ +
                      "/.tfusion/state.db --token-file " + dir_ + "/.tfusion/token > " + dir_ + "/standby.log 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string standby_url;
  ASSERT_TRUE(WaitUntil([&] {
    std::smatch m;
    const std::string log = ReadFile(dir_ + "/standby.log");
    if (std::regex_search(log, m, std::regex("(http://127\\.0\\.0\\.1:[0-9]+).*standby"))) standby_url = m.str(1);
    return !standby_url.empty();
  })) << ReadFile(dir_ + "/standby.log");
  auto run = [&](const std::string& urls) {
    return Shell(env_ + TF_TFUSION + " run --controller " + urls + " --token " + token_ + " --driver " + TF_FAKECUDA +
                 " --nvml " + TF_FAKENVML + " --vram 1GiB --percent 20 -- " + TF_PROBE + " alloc");
  };
  Result placed = run("http://127.0.0.1:1," + standby_url + "," + url_);
  EXPECT_EQ(placed.rc, 0) << placed.out;
  EXPECT_TRUE(std::regex_search(placed.out, std::regex("allocation a-[0-9a-f]+ on GPU 0"))) << placed.out;
  EXPECT_NE(placed.out.find("allocated_mib=1024"), std::string::npos) << placed.out;
  EXPECT_EQ(placed.out.find("local vGPU"), std::string::npos) << placed.out;
  for (const std::string& urls : {standby_url, standby_url + ",http://127.0.0.1:1", "http://127.0.0.1:1," + standby_url}) {
    Result refused = run(urls);
    EXPECT_EQ(refused.rc, 2) << urls << ": " << refused.out;
    EXPECT_NE(refused.out.find("no replica serves now"), std::string::npos) << urls << ": " << refused.out;
    EXPECT_EQ(refused.out.find("local vGPU"), std::string::npos) << urls << ": " << refused.out;
  }
  // The client commands take the same list (--url, TFUSION_URL).
  Result ps = Shell(std::string(TF_TFUSION) + " node ls --url http://127.0.0.1:1," + standby_url + "," + url_ +
                    " --token " + token_);
  EXPECT_EQ(ps.rc, 0) << ps.out;
  EXPECT_NE(ps.out.find("ready"), std::string::npos) << ps.out;
  Result only_standby = Shell(std::string(TF_TFUSION) + " node ls --url " + standby_url + " --token " + token_);
  EXPECT_NE(only_standby.rc, 0) << only_standby.out;
  EXPECT_NE(only_standby.out.find("HTTP 503"), std::string::npos) << only_standby.out;
  // A standby on the same SQLite store names the replica that holds it (it said no leader was known).
  EXPECT_NE(only_standby.out.find("send requests to the leader, "), std::string::npos) << only_standby.out;
  kill(standby, SIGTERM);
  waitpid(standby, nullptr, 0);
}

// A vGPU made on a pool node without the controller (`tfusion run` without --controller) takes
// capacity the pool would otherwise place allocations on: its node agent reports it, and the
// controller counts it as used until it is gone. It used to be invisible: the controller placed a
// 60% allocation beside a local 60% one on the same GPU.
TEST_F(PooledRunTest, ALocalVgpuOnAPoolNodeTakesCapacityThePoolNoLongerPlaces) {
  tf::controller::HttpClient client(url_, token_);
  auto unpooled = [&] {
    auto r = client.Get("/v1/gpus");
    if (!r.ok() || r->status != 200) return -1.0;
    const auto j = nlohmann::json::parse(r->body, nullptr, false);
    return j.is_object() && !j["gpus"].empty() ? j["gpus"][0].value("unpooled_tflops", -1.0) : -1.0;
  };
  pid_t local = fork();
  ASSERT_GE(local, 0);
  if (local == 0) {
    std::string cmd = "exec env " + env_ + TF_TFUSION + " run --driver " + TF_FAKECUDA + " --nvml " + TF_FAKENVML +
                      " --vram 1GiB --percent 60 -- " + TF_PROBE + " launch 20 > " + dir_ + "/local.log 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // 60% of the fake's 989.4 TFLOPS, once the node agent's heartbeat has carried it.
  const bool counted = WaitUntil([&] { return std::abs(unpooled() - 593.64) < 0.01; });
  Result top = Shell(std::string(TF_TFUSION) + " top --once --url " + url_ + " --token " + token_);
  Result beside = Shell(PooledRun("--vram 1GiB --percent 60", "alloc"));
  Result fits = Shell(PooledRun("--vram 1GiB --percent 30", "alloc"));
  kill(local, SIGTERM);
  waitpid(local, nullptr, 0);
  ASSERT_TRUE(counted) << unpooled() << "\n" << ReadFile(dir_ + "/local.log") << ReadFile(dir_ + "/up.log");
  EXPECT_NE(top.out.find("593.6 TFLOPS, 1024 MiB"), std::string::npos) << "top's UNPOOLED column\n" << top.out;
  EXPECT_EQ(beside.rc, 2) << beside.out;
  EXPECT_NE(beside.out.find("has room"), std::string::npos) << beside.out;
  EXPECT_EQ(fits.rc, 0) << fits.out;
  EXPECT_NE(ReadFile(dir_ + "/up.log").find("vGPUs outside the pool now hold 593.6 TFLOPS and 1024 MiB"),
            std::string::npos) << ReadFile(dir_ + "/up.log");
  EXPECT_TRUE(WaitUntil([&] { return unpooled() == 0; })) << "gone with the local vGPU: " << unpooled();
}

// The allocation's processes, as the controller lists them (API, console), are its programs: the
// `tfusion run` that holds the vGPU's slot for its command is not one, as `tfusion smi` counts them.
TEST_F(PooledRunTest, TheAllocationsProcessesAreItsProgramsNotTheRunHoldingIt) {
  pid_t run = fork();
  ASSERT_GE(run, 0);
  if (run == 0) {
    std::string cmd = "exec env " + PooledRun("--vram 1GiB --percent 20", "launch 10") + " > " + dir_ + "/run.log 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  tf::controller::HttpClient client(url_, token_);
  std::vector<int> pids;
  ASSERT_TRUE(WaitUntil([&] {
    auto r = client.Get("/v1/allocations");
    if (!r.ok() || r->status != 200) return false;
    const auto j = nlohmann::json::parse(r->body, nullptr, false);
    pids.clear();
    for (const auto& a : j.value("allocations", nlohmann::json::array()))
      for (const auto& v : a.value("vgpus", nlohmann::json::array()))
        for (const auto& p : v.value("processes", nlohmann::json::array())) pids.push_back(p.value("pid", 0));
    return !pids.empty();
  })) << ReadFile(dir_ + "/run.log");
  kill(run, SIGTERM);
  waitpid(run, nullptr, 0);
  ASSERT_EQ(pids.size(), 1u) << "one program";
  EXPECT_NE(pids[0], run) << "not the tfusion run (" << run << ") that holds the slot";
}

TEST_F(PooledRunTest, ARequestThePoolCannotHoldIsRefusedClearly) {
  Result r = Shell(PooledRun("--vram 100GiB", "alloc"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("has room"), std::string::npos) << r.out;
  Result missing = Shell(PooledRun("--percent 10", "alloc"));
  EXPECT_EQ(missing.rc, 2);
  EXPECT_NE(missing.out.find("--vram is required"), std::string::npos) << missing.out;
}

// Preemption stops the victim: a low-QoS run holds VRAM until a critical request needs its room;
// the node agent then stops the run (SIGTERM), the run says why, and `tfusion ps` shows it.
TEST_F(PooledRunTest, APreemptedRunIsStoppedAndPsSaysWhy) {
  const std::string log = dir_ + "/low.log";
  pid_t low = fork();
  ASSERT_GE(low, 0);
  if (low == 0) {
    std::string cmd = PooledRun("--qos low --vram 1GiB --percent 60", "hold 256") + " > " + log + " 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  std::smatch m;
  std::string out;
  for (int i = 0; i < 400 && out.find("holding=256") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    out = ReadFile(log);
  }
  ASSERT_NE(out.find("holding=256"), std::string::npos) << out;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("allocation (a-[0-9a-f]+)"))) << out;
  const std::string victim = m.str(1);

  tf::controller::HttpClient client(url_, token_);
  auto r = client.Post("/v1/allocations", R"({"percent": 60, "vram_mib": 1024, "qos": "critical"})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_NE(r->body.find(victim), std::string::npos) << "the low run is the victim: " << r->body;
  ASSERT_TRUE(std::regex_search(r->body, m, std::regex("\"id\":\"(a-[0-9a-f]+)\""))) << r->body;
  const std::string winner = m.str(1);

  int status = 0;
  bool ended = false;
  for (int i = 0; i < 300 && !ended; ++i) {  // the agent syncs every second
    ended = waitpid(low, &status, WNOHANG) == low;
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!ended) kill(low, SIGKILL);
  ASSERT_TRUE(ended) << "the preempted run kept running\n" << ReadFile(log) << ReadFile(dir_ + "/up.log");
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM) << ReadFile(log);
  out = ReadFile(log);
  EXPECT_NE(out.find("allocation " + victim + " was preempted by " + winner), std::string::npos) << out;
  EXPECT_NE(ReadFile(dir_ + "/up.log").find("allocation " + victim + " was preempted by the controller"),
            std::string::npos);

  std::string ps;
  for (int i = 0; i < 100; ++i) {  // "stopping" until the agent reports the processes gone
    ps = Shell(std::string(TF_TFUSION) + " ps --url " + url_ + " --token " + token_).out;
    if (ps.find("preempted by " + winner + ": stopped") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(ps.find(victim), std::string::npos) << ps;
  EXPECT_NE(ps.find("preempted by " + winner + ": stopped ("), std::string::npos) << ps;
  EXPECT_NE(ps.find(winner), std::string::npos) << ps;
}

// In a pool that oversells VRAM, preemption suspends the victim instead of stopping it: the node
// agent holds its vGPU swapped out (its data in host memory), its host-only calls go on, its GPU
// calls wait while the preemptor holds the room, `tfusion ps` shows it suspended, and when the
// preemptor is released it continues with every byte as it was.
TEST_F(PooledRunTest, APreemptedRunWithTieringIsSuspendedAndContinuesWithItsBytes) {
  tf::controller::HttpClient client(url_, token_);
  auto pool = client.Patch("/v1/pools/default", R"({"vram_expand_to_host_percent":100})");
  ASSERT_TRUE(pool.ok() && pool->status == 200) << (pool.ok() ? pool->body : pool.status().ToString());
  const std::string d = dir_ + "/tenant";
  ASSERT_EQ(Shell("mkdir -p " + d).rc, 0);
  const std::string log = dir_ + "/low.log";
  pid_t low = fork();
  ASSERT_GE(low, 0);
  if (low == 0) {
    std::string cmd = PooledRun("--qos low --vram 1GiB --percent 60", "suspended " + d) + " > " + log + " 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  auto wait_file = [&](const std::string& name) {
    for (int i = 0; i < 400; ++i) {
      if (access((d + "/" + name).c_str(), F_OK) == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  };
  ASSERT_TRUE(wait_file("ready")) << ReadFile(log);
  std::smatch m;
  std::string out = ReadFile(log);
  ASSERT_TRUE(std::regex_search(out, m, std::regex("allocation (a-[0-9a-f]+)"))) << out;
  const std::string victim = m.str(1);

  auto r = client.Post("/v1/allocations", R"({"percent": 60, "vram_mib": 1024, "qos": "critical"})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_NE(r->body.find("\"preempted_suspended\":[\"" + victim + "\"]"), std::string::npos) << r->body;
  ASSERT_TRUE(std::regex_search(r->body, m, std::regex("\"id\":\"(a-[0-9a-f]+)\""))) << r->body;
  const std::string winner = m.str(1);

  // The agent (1 s sync) holds the vGPU: its 200 MiB of movable VRAM goes to host memory.
  const std::string smi = env_ + TF_TFUSION + " smi -p";
  bool swapped = false;
  for (int i = 0; i < 200 && !swapped; ++i) {
    swapped = Shell(smi).out.find("swapped") != std::string::npos;
    if (!swapped) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(swapped) << Shell(smi).out << ReadFile(log) << ReadFile(dir_ + "/up.log");
  ASSERT_EQ(Shell("touch " + d + "/go").rc, 0);
  ASSERT_TRUE(wait_file("hostonly")) << "host-only calls go on while held\n" << ReadFile(log);
  // Its GPU call waits: nothing is read back while the preemptor runs.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(waitpid(low, nullptr, WNOHANG), 0) << ReadFile(log);
  EXPECT_EQ(ReadFile(log).find("resumed_identical"), std::string::npos) << ReadFile(log);
  EXPECT_NE(Shell(smi).out.find("swapped"), std::string::npos) << Shell(smi).out;
  std::string ps = Shell(std::string(TF_TFUSION) + " ps --url " + url_ + " --token " + token_).out;
  EXPECT_NE(ps.find("suspended by " + winner), std::string::npos) << ps;

  // The preemptor goes: the controller resumes the victim, the agent lifts the hold, and the call
  // that waited completes with every byte intact.
  auto gone = client.Delete("/v1/allocations/" + winner);
  ASSERT_TRUE(gone.ok() && gone->status == 200);
  int status = 0;
  bool ended = false;
  for (int i = 0; i < 300 && !ended; ++i) {
    ended = waitpid(low, &status, WNOHANG) == low;
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!ended) kill(low, SIGKILL);
  ASSERT_TRUE(ended) << "the suspended run never resumed\n" << ReadFile(log) << ReadFile(dir_ + "/up.log");
  out = ReadFile(log);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_NE(out.find("resumed_identical=3"), std::string::npos) << out;
  EXPECT_NE(out.find("kernel_after_resume=ok"), std::string::npos) << out;
  EXPECT_NE(out.find("is suspended (preempted by a higher QoS)"), std::string::npos) << out;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("waited_ms=([0-9]+)"))) << out;
  EXPECT_GE(std::stoll(m.str(1)), 1500) << out;
  EXPECT_NE(ReadFile(dir_ + "/up.log").find("vGPU " + victim), std::string::npos) << ReadFile(dir_ + "/up.log");
  // The agent's log has the swap-out with its cause.
  EXPECT_TRUE(std::regex_search(ReadFile(dir_ + "/up.log"),
                                std::regex("vGPU " + victim + ": process [0-9]+ \\(limiter_probe\\) swapped out 200 MiB "
                                           "to host memory in [0-9.]+ ms \\(cause: preemption\\)")))
      << ReadFile(dir_ + "/up.log");
}

// Host copies pinned ahead (TFUSION_TIER_PIN_AHEAD) belong to the tenant, not to the node agent: a
// pooled tenant with tiering pins its copies, `tfusion up` (controller and node agent) is killed,
// and a freeze from the CLI still copies into them; every byte comes back.
TEST_F(PooledRunTest, HostCopiesPinnedAheadSurviveTheNodeAgentsDeath) {
  const std::string d = dir_ + "/tenant";
  const std::string log = dir_ + "/tenant.log";
  pid_t run = -1;
  StartTierTenant("TFUSION_TIER_PIN_AHEAD=0.2 ", d, log, &run);
  ASSERT_FALSE(HasFatalFailure());
  auto wait_for = [](auto&& done) { return WaitUntil(done); };
  const std::string smi = env_ + TF_TFUSION + " smi";
  ASSERT_TRUE(wait_for([&] { return Shell(smi).out.find("host tier 200 MiB of") != std::string::npos; }))
      << Shell(smi).out << ReadFile(log);
  EXPECT_NE(ReadFile(log).find("ahead of a freeze"), std::string::npos) << ReadFile(log);
  std::smatch m;
  std::string out = ReadFile(log);
  ASSERT_TRUE(std::regex_search(out, m, std::regex("allocation (a-[0-9a-f]+)"))) << out;
  const std::string vgpu = m.str(1);

  kill(up_, SIGKILL);
  waitpid(up_, nullptr, 0);
  up_ = -1;
  Result frozen = Shell(env_ + TF_TFUSION + " freeze " + vgpu);
  EXPECT_EQ(frozen.rc, 0) << frozen.out << ReadFile(log);
  EXPECT_NE(frozen.out.find("(200 MiB in host memory)"), std::string::npos) << frozen.out;
  EXPECT_NE(ReadFile(log).find("200 MiB into kept pinned copies"), std::string::npos) << ReadFile(log);
  ResumeToTheEndIntact(run, d, log);
}

// The node agent killed (with its controller: `tfusion up`, SIGKILL) while a pooled tenant is
// swapped out, and a new one started on the same state folder and port: the new agent finds the
// vGPU swapped in its region and reports it (`tfusion ps` through the controller, `tfusion smi`),
// does not repeat the freeze it passed before, and a thaw through the controller reaches the
// tenant through it: the tenant is resident again before its next call and every byte is intact.
TEST_F(PooledRunTest, ASwappedTenantOutlivesANodeAgentRestartAndTheNewAgentThawsIt) {
  const std::string d = dir_ + "/tenant";
  const std::string log = dir_ + "/tenant.log";
  pid_t run = -1;
  StartTierTenant("TFUSION_TIER_PIN_AHEAD=off ", d, log, &run);
  ASSERT_FALSE(HasFatalFailure());
  auto wait_for = [](auto&& done) { return WaitUntil(done); };
  std::smatch m;
  std::string out = ReadFile(log);
  ASSERT_TRUE(std::regex_search(out, m, std::regex("allocation (a-[0-9a-f]+)"))) << out;
  const std::string vgpu = m.str(1);
  const std::string as_client = " --url " + url_ + " --token " + token_;
  Result frozen = Shell(std::string(TF_TFUSION) + " freeze " + vgpu + " --controller" + as_client);
  ASSERT_EQ(frozen.rc, 0) << frozen.out;
  const std::string smi = env_ + TF_TFUSION + " smi -p";
  ASSERT_TRUE(wait_for([&] { return Shell(smi).out.find("swapped") != std::string::npos; })) << Shell(smi).out << ReadFile(log);

  const int port = std::stoi(url_.substr(url_.rfind(':') + 1));
  kill(up_, SIGKILL);
  waitpid(up_, nullptr, 0);
  up_ = -1;
  EXPECT_NE(Shell(smi).out.find("swapped"), std::string::npos) << "the copy lives in the tenant\n" << Shell(smi).out;
  StartUp(port, "up2.log");
  ASSERT_FALSE(HasFatalFailure());
  const std::string ps = std::string(TF_TFUSION) + " ps" + as_client;
  EXPECT_TRUE(wait_for([&] { return Shell(ps).out.find("running, swapped 200 MiB") != std::string::npos; }))
      << Shell(ps).out << ReadFile(dir_ + "/up2.log");
  EXPECT_NE(Shell(smi).out.find("swapped"), std::string::npos) << Shell(smi).out;
  EXPECT_EQ(ReadFile(log).find("resumed"), std::string::npos) << "nothing woke it\n" << ReadFile(log);

  Result thawed = Shell(std::string(TF_TFUSION) + " thaw " + vgpu + " --controller" + as_client);
  EXPECT_EQ(thawed.rc, 0) << thawed.out;
  EXPECT_TRUE(wait_for([&] { return ReadFile(log).find("resumed 200 MiB") != std::string::npos; }))
      << ReadFile(log) << ReadFile(dir_ + "/up2.log");
  EXPECT_TRUE(wait_for([&] { return Shell(ps).out.find("running, resident") != std::string::npos; })) << Shell(ps).out;
  // The new agent passes only requests made after it started: the old freeze is not repeated.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(Shell(smi).out.find("swapped"), std::string::npos) << Shell(smi).out;
  ResumeToTheEndIntact(run, d, log);
  out = ReadFile(log);
  EXPECT_EQ(out.find("resumed 200 MiB"), out.rfind("resumed 200 MiB")) << "one swap-in only: the thaw's\n" << out;
}

// The node agent logs every swap of the vGPUs in its regions, one line per completed event, with
// the vGPU, the process, the MiB per tier, the duration and the cause: an allocation's tenant
// frozen and thawed from the CLI, and a local `tfusion run` tenant swapped out by its idle timeout
// and brought back by its next GPU call.
TEST_F(PooledRunTest, TheNodeAgentLogsEachSwapWithItsCause) {
  tf::controller::HttpClient client(url_, token_);
  auto pool = client.Patch("/v1/pools/default", R"({"vram_expand_to_host_percent":100})");
  ASSERT_TRUE(pool.ok() && pool->status == 200) << (pool.ok() ? pool->body : pool.status().ToString());
  const std::string d = dir_ + "/tenant", idle = dir_ + "/idle";
  ASSERT_EQ(Shell("mkdir -p " + d + " " + idle).rc, 0);
  const std::string log = dir_ + "/tenant.log", idle_log = dir_ + "/idle.log";
  auto start = [](const std::string& cmd) {
    pid_t pid = fork();
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    return pid;
  };
  pid_t run = start(PooledRun("--vram 1GiB --percent 30 --idle-swap 0", "tier " + d) + " > " + log + " 2>&1");
  ASSERT_GT(run, 0);
  pid_t local = start(env_ + TF_TFUSION + " run --driver " + TF_FAKECUDA + " --nvml " + TF_FAKENVML +
                      " --vram 1GiB --vgpu idle --tiering --idle-swap 1s -- " + TF_PROBE + " tier " + idle + " > " +
                      idle_log + " 2>&1");
  ASSERT_GT(local, 0);
  // Up to 30 s: the tenants pin their host copies ahead at start, which took 10 s on a loaded
  // two-core CI machine.
  auto wait_for = [&](auto&& done) {
    for (int i = 0; i < 1200; ++i) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return false;
  };
  auto finish = [&](pid_t pid, const std::string& dir) {
    for (const char* name : {"/go", "/go2", "/go3"}) EXPECT_EQ(Shell("touch " + dir + name).rc, 0);
    bool ended = false;
    for (int i = 0; i < 300 && !ended; ++i) {
      ended = waitpid(pid, nullptr, WNOHANG) == pid;
      if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!ended) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  };
  ASSERT_TRUE(wait_for([&] { return access((d + "/ready").c_str(), F_OK) == 0; })) << ReadFile(log);
  ASSERT_TRUE(wait_for([&] { return access((idle + "/ready").c_str(), F_OK) == 0; })) << ReadFile(idle_log);
  std::smatch m;
  std::string out = ReadFile(log);
  ASSERT_TRUE(std::regex_search(out, m, std::regex("allocation (a-[0-9a-f]+)"))) << out;
  const std::string vgpu = m.str(1);

  Result frozen = Shell(env_ + TF_TFUSION + " freeze " + vgpu);
  EXPECT_EQ(frozen.rc, 0) << frozen.out << ReadFile(log);
  Result thawed = Shell(env_ + TF_TFUSION + " thaw " + vgpu);
  EXPECT_EQ(thawed.rc, 0) << thawed.out << ReadFile(log);
  const std::string who = "vGPU " + vgpu + ": process [0-9]+ \\(limiter_probe\\) ";
  const std::regex out_line(who + "swapped out 200 MiB to host memory in [0-9]+\\.[0-9] ms \\(cause: freeze\\)\n");
  const std::regex in_line(who + "swapped in 200 MiB \\(200 MiB from host memory, 0 MiB from the disk tier\\) in "
                           "[0-9]+\\.[0-9] ms \\(cause: thaw\\)\n");
  EXPECT_TRUE(wait_for([&] {
    const std::string up = ReadFile(dir_ + "/up.log");
    return std::regex_search(up, out_line) && std::regex_search(up, in_line);
  })) << ReadFile(dir_ + "/up.log");

  // The local tenant goes idle for 1 s: swapped out; its next GPU call brings it back.
  const std::regex idle_out("vGPU idle: process [0-9]+ \\(limiter_probe\\) swapped out 200 MiB to host memory in "
                            "[0-9]+\\.[0-9] ms \\(cause: idle\\)\n");
  EXPECT_TRUE(wait_for([&] { return std::regex_search(ReadFile(dir_ + "/up.log"), idle_out); }))
      << ReadFile(dir_ + "/up.log") << ReadFile(idle_log);
  finish(local, idle);
  const std::regex idle_in("vGPU idle: process [0-9]+ \\(limiter_probe\\) swapped in 200 MiB \\(200 MiB from host "
                           "memory, 0 MiB from the disk tier\\) in [0-9]+\\.[0-9] ms \\(cause: GPU call\\)\n");
  EXPECT_TRUE(wait_for([&] { return std::regex_search(ReadFile(dir_ + "/up.log"), idle_in); }))
      << ReadFile(dir_ + "/up.log") << ReadFile(idle_log);
  finish(run, d);
  const std::string up = ReadFile(dir_ + "/up.log");
  // One line per event, nothing per tick: the allocation's tenant (no idle timeout) has exactly the
  // freeze's and the thaw's. (The local one may go idle more than once on a loaded machine.)
  size_t lines = 0;
  const std::string mine = "vGPU " + vgpu + ": process ";
  for (size_t at = up.find(mine); at != std::string::npos; at = up.find(mine, at + 1)) ++lines;
  EXPECT_EQ(lines, 2u) << up;
  EXPECT_NE(ReadFile(log).find("first_identical=3"), std::string::npos) << ReadFile(log);
  EXPECT_NE(ReadFile(idle_log).find("second_identical=3"), std::string::npos) << ReadFile(idle_log);
}

// `tfusion run --controller --idle-swap` in a pool that oversells VRAM: the flag becomes the
// allocation's idle override, the node agent (of `tfusion up`) keeps it in the vGPU's region
// (`tfusion smi -p`), follows a change made through PATCH, and `tfusion ps` shows what it applied.
TEST_F(PooledRunTest, AnIdleSwapGivenToRunIsTheAllocationsOverrideTheAgentApplies) {
  const std::string client_flags = " --url " + url_ + " --token " + token_;
  ASSERT_EQ(Shell(std::string(TF_TFUSION) + " pool set default --vram-expand-host 100" + client_flags).rc, 0);
  const std::string log = dir_ + "/idle.log";
  pid_t run = fork();
  ASSERT_GE(run, 0);
  if (run == 0) {
    // exec: the SIGTERM below reaches `tfusion run`, which passes it on to its command.
    std::string cmd = "exec env " + PooledRun("--qos low --vram 1GiB --percent 10 --idle-swap 45s", "hold 64") +
                      " > " + log + " 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string out;
  for (int i = 0; i < 400 && out.find("holding=64") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    out = ReadFile(log);
  }
  std::smatch m;
  const bool held = out.find("holding=64") != std::string::npos &&
                    std::regex_search(out, m, std::regex("allocation (a-[0-9a-f]+)"));
  const std::string id = held ? m.str(1) : "";
  tf::controller::HttpClient client(url_, token_);
  auto got = client.Get("/v1/allocations/" + id);
  std::string smi, ps;
  if (held) {
    EXPECT_NE(got->body.find("\"idle_swap_ms\":45000"), std::string::npos) << got->body;
    const std::string smi_cmd = env_ + TF_TFUSION + " smi -p";
    smi = Shell(smi_cmd).out;
    EXPECT_TRUE(std::regex_search(smi, std::regex(id + " +45s +2m +never\n"))) << "swap: the override; disk: the low QoS default\n" << smi;
    // ps shows what the agent applied once it has heartbeated (every 5 s).
    for (int i = 0; i < 150 && ps.find("idle: swap 45s, disk 2m") == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      ps = Shell(std::string(TF_TFUSION) + " ps" + client_flags).out;
    }
    EXPECT_NE(ps.find("idle: swap 45s, disk 2m"), std::string::npos) << ps;
    // Changed on the live allocation: the agent applies it within its sync interval.
    auto patched = client.Patch("/v1/allocations/" + id, R"({"idle_swap_ms": 120000, "idle_disk_ms": 0})");
    EXPECT_EQ(patched->status, 200) << patched->body;
    for (int i = 0; i < 50 && !std::regex_search(smi, std::regex(id + " +2m +never +never\n")); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      smi = Shell(smi_cmd).out;
    }
    EXPECT_TRUE(std::regex_search(smi, std::regex(id + " +2m +never +never\n"))) << smi;
  }
  kill(run, SIGTERM);
  waitpid(run, nullptr, 0);
  ASSERT_TRUE(held) << out << ReadFile(dir_ + "/up.log");
}

// Scale to zero for the allocations of a node: the node agent (of `tfusion up`) is the zero keeper
// of every process bound to an allocation's vGPU, also one that no `tfusion run` started (here the
// probe runs with the limiter's environment set by hand).
class PooledZeroTest : public PooledRunTest {
 protected:
  void SetUp() override {
    PooledRunTest::SetUp();
    client_flags_ = " --url " + url_ + " --token " + token_;
    ASSERT_EQ(Shell(std::string(TF_TFUSION) + " pool set default --vram-expand-host 100" + client_flags_).rc, 0);
  }
  // An allocation with `fields` (JSON members); its id once the agent has made its vGPU.
  std::string Allocate(const std::string& fields) {
    tf::controller::HttpClient client(url_, token_);
    auto r = client.Post("/v1/allocations", R"({"percent":10,"vram_mib":1024,"qos":"low",)" + fields + "}");
    std::smatch m;
    if (!r.ok() || r->status != 201 || !std::regex_search(r->body, m, std::regex("\"id\":\"(a-[0-9a-f]+)\""))) {
      ADD_FAILURE() << (r.ok() ? r->body : r.status().ToString());
      return "";
    }
    const std::string id = m.str(1);
    for (int i = 0; i < 100 && Smi().find(id) == std::string::npos; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return id;
  }
  std::string Smi() const { return Shell(env_ + TF_TFUSION + " smi -p").out; }
  std::string Ps() const { return Shell(std::string(TF_TFUSION) + " ps" + client_flags_).out; }
  // limiter_probe zero DIR bound to vGPU `id`, as tfusion run would start it (but no tfusion run).
  pid_t StartBound(const std::string& id, const std::string& d) {
    std::string region = Shell("ls " + dir_ + "/shm/gpu-*.region").out;
    while (!region.empty() && region.back() == '\n') region.pop_back();
    const std::string tfusion = TF_TFUSION;
    const std::string inject = tfusion.substr(0, tfusion.rfind('/')) + "/../limiter/inject";
    const std::string cmd = "exec env " + env_ + "LD_LIBRARY_PATH=" + inject + " TFUSION_REAL_LIBCUDA=" + TF_FAKECUDA +
                            " TFUSION_REAL_LIBNVML=" + TF_FAKENVML + " TFUSION_REGION=" + region + " TFUSION_VGPU=" + id +
                            " " + TF_PROBE + " zero " + d + " > " + d + "/tenant.out 2>&1";
    Shell("mkdir -p " + d);
    pid_t pid = fork();
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    return pid;
  }
  static bool WaitFile(const std::string& path, int tenths = 200) {
    for (int i = 0; i < tenths * 2; ++i) {
      if (access(path.c_str(), F_OK) == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  bool SmiShows(const std::string& text, int tenths = 100) const {
    for (int i = 0; i < tenths; ++i) {
      if (Smi().find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  int Finish(pid_t pid) {
    int status = 0;
    for (int i = 0; i < 200; ++i) {
      if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
  }
  std::string client_flags_;
};

// idle_zero_ms on the allocation: the agent writes it into the vGPU's region, the tenant's tier
// thread swaps it out after idle_swap_ms, the agent checkpoints it after idle_zero_ms, reports it
// (tfusion ps: checkpointed), and restores it when its next call asks.
TEST_F(PooledZeroTest, TheNodeAgentCheckpointsAnIdleTenantAndRestoresItOnItsNextCall) {
  const std::string id = Allocate(R"("idle_swap_ms":300,"idle_zero_ms":1500)");
  ASSERT_FALSE(id.empty()) << ReadFile(dir_ + "/up.log");
  bool applied = false;  // the agent writes the policy right after it makes the vGPU
  for (int i = 0; i < 30 && !applied; ++i) {
    applied = std::regex_search(Smi(), std::regex(id + " +300ms +2m +1500ms\n"));
    if (!applied) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(applied) << Smi();
  const std::string d = dir_ + "/t";
  pid_t pid = StartBound(id, d);
  ASSERT_TRUE(WaitFile(d + "/ready")) << ReadFile(d + "/tenant.out");
  ASSERT_TRUE(SmiShows("checkpointed")) << Smi() << ReadFile(d + "/tenant.out") << ReadFile(dir_ + "/up.log");
  EXPECT_TRUE(std::regex_search(ReadFile(dir_ + "/up.log"),
                                std::regex("hypervisor: vGPU " + id + ": process [0-9]+ idle [0-9]+ s: checkpointed")))
      << ReadFile(dir_ + "/up.log");
  std::string ps;
  for (int i = 0; i < 80 && ps.find("checkpointed") == std::string::npos; ++i) {  // heartbeats every 5 s
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ps = Ps();
  }
  EXPECT_NE(ps.find("running, checkpointed"), std::string::npos) << ps;
  EXPECT_NE(ps.find("idle: swap 300ms, disk 2m, zero 1500ms"), std::string::npos) << ps;
  ASSERT_EQ(Shell("touch " + d + "/go").rc, 0);
  ASSERT_TRUE(WaitFile(d + "/verified")) << ReadFile(d + "/tenant.out") << ReadFile(dir_ + "/up.log");
  const std::string out = ReadFile(d + "/tenant.out");
  EXPECT_NE(out.find("first_call=0"), std::string::npos) << out;
  EXPECT_NE(out.find("zero_identical=4"), std::string::npos) << out;
  ASSERT_EQ(Shell("touch " + d + "/go3").rc, 0);
  EXPECT_EQ(Finish(pid), 0) << ReadFile(d + "/tenant.out");
}

// `tfusion freeze ID --controller --zero`: the level reaches the agent, which swaps the vGPU out,
// checkpoints its processes and restores them at their next call.
TEST_F(PooledZeroTest, AFreezeToZeroThroughTheControllerIsCarriedOutByTheAgent) {
  const std::string id = Allocate(R"("idle_swap_ms":0)");
  ASSERT_FALSE(id.empty()) << ReadFile(dir_ + "/up.log");
  const std::string d = dir_ + "/t";
  pid_t pid = StartBound(id, d);
  ASSERT_TRUE(WaitFile(d + "/ready")) << ReadFile(d + "/tenant.out");
  Result frozen = Shell(std::string(TF_TFUSION) + " freeze " + id + " --controller --zero" + client_flags_);
  ASSERT_EQ(frozen.rc, 0) << frozen.out;
  EXPECT_NE(frozen.out.find("freeze to zero of allocation " + id + " requested"), std::string::npos) << frozen.out;
  ASSERT_TRUE(SmiShows("checkpointed")) << Smi() << ReadFile(d + "/tenant.out") << ReadFile(dir_ + "/up.log");
  EXPECT_NE(ReadFile(dir_ + "/up.log").find("checkpointed on request"), std::string::npos) << ReadFile(dir_ + "/up.log");
  Result bad = Shell(std::string(TF_TFUSION) + " freeze " + id + " --controller --zero --driver /x" + client_flags_);
  EXPECT_EQ(bad.rc, 2) << bad.out;
  ASSERT_EQ(Shell("touch " + d + "/go").rc, 0);
  ASSERT_TRUE(WaitFile(d + "/verified")) << ReadFile(d + "/tenant.out") << ReadFile(dir_ + "/up.log");
  EXPECT_NE(ReadFile(d + "/tenant.out").find("zero_identical=4"), std::string::npos) << ReadFile(d + "/tenant.out");
  ASSERT_EQ(Shell("touch " + d + "/go3").rc, 0);
  EXPECT_EQ(Finish(pid), 0) << ReadFile(d + "/tenant.out");
}

// `tfusion patch`: the PATCH API from the CLI; prints the values the controller now holds, the agent
// applies them to the region; bad input is refused clearly and changes nothing.
TEST_F(PooledZeroTest, PatchChangesAnAllocationsIdleTimeoutsAndRefusesBadInput) {
  const std::string id = Allocate(R"("idle_swap_ms":60000)");
  ASSERT_FALSE(id.empty()) << ReadFile(dir_ + "/up.log");
  const std::string patch = std::string(TF_TFUSION) + " patch ";
  Result r = Shell(patch + id + " --idle-swap 30s --idle-zero 2m" + client_flags_);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("allocation " + id + ": idle swap 30s, idle disk QoS default, idle zero 2m"), std::string::npos)
      << r.out;
  bool applied = false;
  for (int i = 0; i < 50 && !applied; ++i) {
    applied = std::regex_search(Smi(), std::regex(id + " +30s +2m +2m\n"));
    if (!applied) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(applied) << Smi();
  r = Shell(patch + id + " --idle-zero 10s" + client_flags_);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("idle_zero_ms (10s) must be longer than idle_swap_ms (30s)"), std::string::npos) << r.out;
  r = Shell(patch + id + " --idle-swap 5parsecs" + client_flags_);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--idle-swap 5parsecs"), std::string::npos) << r.out;
  r = Shell(patch + id + client_flags_);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("nothing to change"), std::string::npos) << r.out;
  r = Shell(patch + "a-nosuch --idle-swap 1m" + client_flags_);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("not found"), std::string::npos) << r.out;
  tf::controller::HttpClient client(url_, token_);
  EXPECT_NE(client.Get("/v1/allocations/" + id)->body.find("\"idle_zero_ms\":120000"), std::string::npos)
      << "refusals changed nothing";
  r = Shell(patch + id + " --idle-zero default" + client_flags_);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("idle zero QoS default"), std::string::npos) << r.out;
}

}  // namespace
