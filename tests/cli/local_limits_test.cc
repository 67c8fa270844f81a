// `tfusion run` on a local vGPU with a compute request and limit (--percent/--tflops and
// --percent-limit/--tflops-limit) and a QoS, in front of the fake driver: what the region holds is
// what `tfusion smi` shows (request, limit, current use, time throttled), and every bad
// combination is refused with its message and changes nothing; the vGPU a run makes for itself
// goes even when the run is killed outright.
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include "cli_test_util.h"

namespace {

using tf::cli::testing::ReadFile;
using tf::cli::testing::Result;
using tf::cli::testing::Shell;

class LocalLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tf-limits-XXXXXX";
    dir_ = mkdtemp(tmpl);
    env_ = "TFUSION_SHM_DIR=" + dir_ + " FAKECUDA_SHM_NAME=/tf-limits-" + std::to_string(getpid()) + " ";
  }
  void TearDown() override {
    for (pid_t p : background_) {
      kill(-p, SIGKILL);
      waitpid(p, nullptr, 0);
    }
    EXPECT_EQ(system(("rm -rf '" + dir_ + "'").c_str()), 0);
    tf::cli::testing::RemoveFakeDriverShm("tf-limits-" + std::to_string(getpid()));
  }
  std::string Run(const std::string& flags, const std::string& probe_args) const {
    return env_ + TF_TFUSION + " run --driver " + TF_FAKECUDA + " --nvml " + TF_FAKENVML + " " + flags + " -- " +
           TF_PROBE + " " + probe_args;
  }
  Result Smi() const { return Shell(env_ + TF_TFUSION + " smi"); }
  // Starts `cmd` in its own process group, output to `log`; waits until `log` holds `ready`.
  void Background(const std::string& cmd, const std::string& log, const std::string& ready) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      setpgid(0, 0);
      execl("/bin/sh", "sh", "-c", ("exec env " + cmd + " > " + log + " 2>&1").c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    setpgid(pid, pid);
    background_.push_back(pid);
    for (int i = 0; i < 200 && ReadFile(log).find(ready) == std::string::npos; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    ASSERT_NE(ReadFile(log).find(ready), std::string::npos) << ReadFile(log);
  }
  // The smi row of vGPU `id`: QOS, REQUEST, LIMIT, USE, THROTTLED s, TURNS s, LAUNCHES.
  struct Row {
    bool found = false;
    std::string qos, request, limit, use, tier;
    double throttled = -1, turns = -1;
    unsigned long long launches = 0;
  };
  Row SmiRow(const std::string& id) const {
    Result smi = Smi();
    std::smatch m;
    std::regex re(id + R"( +(\S+) +\S+ \S+ +\S+ \S+ +(\S+) +(\S+) +(\S+) +\d+ +[0-9.]+ +([0-9.]+) +([0-9.]+) +(\d+) +\d+ +(\S+))");
    Row r;
    if (!std::regex_search(smi.out, m, re)) return r;
    r.found = true;
    r.qos = m.str(1);
    r.request = m.str(2);
    r.limit = m.str(3);
    r.use = m.str(4);
    r.throttled = std::stod(m.str(5));
    r.turns = std::stod(m.str(6));
    r.launches = std::stoull(m.str(7));
    r.tier = m.str(8);
    return r;
  }

  std::string dir_, env_;
  std::vector<pid_t> background_;
};

TEST_F(LocalLimitsTest, SmiShowsRequestLimitUseAndThrottledTime) {
  Background(Run("--vram 1GiB --percent 25 --percent-limit 100 --qos high --vgpu burst", "launch 4"),
             dir_ + "/burst.log", "");
  Row row;
  for (int i = 0; i < 100 && !row.found; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    row = SmiRow("burst");
  }
  ASSERT_TRUE(row.found) << Smi().out;
  EXPECT_EQ(row.qos, "high");
  EXPECT_EQ(row.request, "25.0%");
  EXPECT_EQ(row.limit, "100%");
  EXPECT_GE(row.throttled, 0);
  EXPECT_EQ(row.turns, 0) << "a burstable vGPU alone never waits for turns\n" << Smi().out;
  // The probe keeps the GPU busy: two snapshots half a second apart see it use some of it.
  ASSERT_TRUE(std::regex_match(row.use, std::regex(R"([0-9.]+%)"))) << row.use;
  for (int i = 0; i < 20 && std::stod(row.use) == 0; ++i) row = SmiRow("burst");
  EXPECT_GT(std::stod(row.use), 0) << Smi().out;
  // Its launches are counted (the compute governor reports them at each tick).
  for (int i = 0; i < 20 && row.launches == 0; ++i) row = SmiRow("burst");
  EXPECT_GT(row.launches, 0u) << Smi().out;
}

TEST_F(LocalLimitsTest, ASingleValueKeepsRequestEqualToLimitAndMixedUnitsConvert) {
  Background(Run("--vram 1GiB --percent 30 --vgpu single", "hold 1"), dir_ + "/single.log", "holding=1");
  Row single = SmiRow("single");
  ASSERT_TRUE(single.found) << Smi().out;
  EXPECT_EQ(single.request, "30.0%");
  EXPECT_EQ(single.limit, "30.0%");
  EXPECT_EQ(single.qos, "medium");
  // 98.94 TFLOPS of the fake H100's 989.4 is 10%; the limit in percent of the same GPU.
  Background(Run("--vram 1GiB --tflops 98.94 --percent-limit 50 --qos low --vgpu mixed", "hold 1"),
             dir_ + "/mixed.log", "holding=1");
  Row mixed = SmiRow("mixed");
  ASSERT_TRUE(mixed.found) << Smi().out;
  EXPECT_EQ(mixed.request, "10.0%");
  EXPECT_EQ(mixed.limit, "50.0%");
  EXPECT_EQ(mixed.qos, "low");
  Background(Run("--vram 1GiB --tflops 98.94 --tflops-limit 494.7 --vgpu tf", "hold 1"), dir_ + "/tf.log",
             "holding=1");
  Row tf = SmiRow("tf");
  ASSERT_TRUE(tf.found) << Smi().out;
  EXPECT_EQ(tf.request, "10.0%");
  EXPECT_EQ(tf.limit, "50.0%");
}

// The tenant's environment never holds the token `tfusion run` was given (an admin credential
// of the controller): whoever runs inside the vGPU cannot use it against the API.
TEST_F(LocalLimitsTest, TheTenantsEnvironmentHoldsNoToken) {
  Result r = Shell("TFUSION_TOKEN=admin-secret " + env_ + TF_TFUSION + " run --driver " + TF_FAKECUDA + " --nvml " +
                   TF_FAKENVML + " --vram 1GiB -- sh -c 'echo token=${TFUSION_TOKEN:-none}; env'");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("token=none"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("admin-secret"), std::string::npos) << r.out;
}

// A child of a run whose environment lost one of the two binding variables (a launcher that
// passes only some on) fails its CUDA calls (cuInit) and says why; it used to get the whole GPU,
// unlimited, in silence. One that lost both is told it runs unlimited.
TEST_F(LocalLimitsTest, AChildThatLostItsVgpuBindingFailsItsCallsAndSaysWhy) {
  for (const char* dropped : {"TFUSION_VGPU", "TFUSION_REGION"}) {
    Result r = Shell(env_ + TF_TFUSION + " run --driver " + TF_FAKECUDA + " --nvml " + TF_FAKENVML +
                     " --vram 512MiB -- sh -c 'env -u " + dropped + " " + TF_PROBE + " alloc' 2>&1");
    EXPECT_NE(r.out.find("error=cuInit(0):304"), std::string::npos) << dropped << ": " << r.out;  // OPERATING_SYSTEM
    EXPECT_EQ(r.out.find("allocated_mib="), std::string::npos) << dropped << ": " << r.out;
    EXPECT_NE(r.out.find(std::string(" is not: no vGPU to bind to, so CUDA calls fail")), std::string::npos) << r.out;
  }
  Result both = Shell(env_ + TF_TFUSION + " run --driver " + TF_FAKECUDA + " --nvml " + TF_FAKENVML +
                      " --vram 512MiB -- sh -c 'env -u TFUSION_VGPU -u TFUSION_REGION " + TF_PROBE + " alloc' 2>&1");
  EXPECT_NE(both.out.find("this process has the whole GPU, unlimited"), std::string::npos) << both.out;
}

TEST_F(LocalLimitsTest, BadLimitsAreRefusedWithAMessageAndChangeNothing) {
  // A vGPU in use: a bad re-run of it must leave its values as they are.
  Background(Run("--vram 1GiB --percent 30 --percent-limit 60 --vgpu keep", "hold 1"), dir_ + "/keep.log",
             "holding=1");
  struct Case {
    std::string flags;
    std::string says;
  } cases[] = {
      {"--percent 30 --percent-limit 20",
       "--percent-limit 20 is below the request --percent 30: the limit is the ceiling and must be at least the "
       "request"},
      {"--tflops 200 --tflops-limit 100", "--tflops-limit 100 is below the request --tflops 200"},
      {"--tflops 200 --percent-limit 10", "--percent-limit 10 is below the request --tflops 200 (20.2% of GPU 0"},
      {"--percent 30 --percent-limit 150", "--percent-limit 150: must be at most 100"},
      {"--percent 30 --tflops-limit 2000", "--tflops-limit 2000: GPU 0"},
      {"--percent-limit 50", "--percent-limit 50 needs a request: give --percent or --tflops too"},
      {"--tflops-limit 500", "--tflops-limit 500 needs a request"},
      {"--percent 30 --percent-limit 50 --tflops-limit 500", "not both"},
      {"--percent 30 --qos urgent", "--qos: qos must be one of low, medium, high, critical"},
  };
  for (const Case& c : cases) {
    for (const std::string vgpu : {"keep", "fresh"}) {
      Result r = Shell(Run("--vram 1GiB " + c.flags + " --vgpu " + vgpu, "alloc"));
      EXPECT_EQ(r.rc, 2) << c.flags << "\n" << r.out;
      EXPECT_NE(r.out.find(c.says), std::string::npos) << c.flags << "\n" << r.out;
      EXPECT_EQ(r.out.find("allocated_mib"), std::string::npos) << "the command must not run\n" << r.out;
    }
  }
  Row keep = SmiRow("keep");
  ASSERT_TRUE(keep.found) << Smi().out;
  EXPECT_EQ(keep.request, "30.0%");
  EXPECT_EQ(keep.limit, "60.0%");
  EXPECT_FALSE(SmiRow("fresh").found) << Smi().out;
}

// A run that joins a vGPU in use (`--vgpu NAME`) takes the limits its processes were started
// under: given none, it adopts them; given others, it is refused and changes nothing (before, it
// rewrote them under every process of the vGPU, for good).
TEST_F(LocalLimitsTest, ARunJoiningAVgpuInUseTakesItsLimitsAndCannotChangeThem) {
  Background(Run("--vram 2GiB --percent 20 --qos low --vgpu shared_b", "hold 1"), dir_ + "/first.log", "holding=1");
  Result join = Shell(Run("--vgpu shared_b", "alloc"));
  ASSERT_EQ(join.rc, 0) << join.out;
  Row row = SmiRow("shared_b");
  ASSERT_TRUE(row.found) << Smi().out;
  EXPECT_EQ(row.request, "20.0%");
  EXPECT_EQ(row.limit, "20.0%");
  EXPECT_EQ(row.qos, "low");
  EXPECT_TRUE(std::regex_search(join.out, std::regex("allocated_mib=(19[0-9][0-9]|20[0-4][0-9])\n")))
      << "the joiner is held to the vGPU's 2 GiB\n" << join.out;
  for (const char* other : {"--vram 4GiB --percent 20 --qos low", "--percent 50", "--qos critical",
                            "--vram 2GiB --percent 20 --percent-limit 90 --qos low"}) {
    Result r = Shell(Run(std::string(other) + " --vgpu shared_b", "alloc"));
    EXPECT_NE(r.rc, 0) << other << "\n" << r.out;
    EXPECT_NE(r.out.find(" process(es)) with --vram 2.0 GiB, request 20.0%, limit 20.0%, qos low: a run that joins it "
                         "gives the same limits, or none to take them"),
              std::string::npos)
        << other << "\n" << r.out;
    EXPECT_EQ(r.out.find("allocated_mib"), std::string::npos) << "the command must not run\n" << r.out;
  }
  // The same limits join.
  EXPECT_EQ(Shell(Run("--vram 2GiB --percent 20 --qos low --vgpu shared_b", "alloc")).rc, 0);
  row = SmiRow("shared_b");
  EXPECT_EQ(row.request, "20.0%");
  EXPECT_EQ(row.limit, "20.0%");
  EXPECT_EQ(row.qos, "low");
  // Its tier policy too: tier flags that differ are refused and change nothing.
  for (const char* tier : {"--tiering", "--idle-swap 5s", "--idle-zero 1h"}) {
    Result r = Shell(Run(std::string(tier) + " --vgpu shared_b", "alloc"));
    EXPECT_NE(r.rc, 0) << tier << "\n" << r.out;
    EXPECT_NE(r.out.find(" process(es)) with tiering off: a run that joins it gives the same tier flags, or none to "
                         "take them"),
              std::string::npos)
        << tier << "\n" << r.out;
    EXPECT_EQ(r.out.find("allocated_mib"), std::string::npos) << "the command must not run\n" << r.out;
  }
  EXPECT_EQ(SmiRow("shared_b").tier, "-") << "tiering stays off";
}

// vGPU names are plain ASCII (they name lock files and fill tables, logs and metric labels), and
// a long one widens smi's VGPU column instead of pushing its row out of line.
TEST_F(LocalLimitsTest, VgpuNamesArePlainAndALongOneKeepsSmisColumnsAligned) {
  for (const char* bad : {"caf\xc3\xa9", "two words", "a/b", "tab\tname"}) {
    Result r = Shell(Run("--vgpu '" + std::string(bad) + "'", "alloc"));
    EXPECT_EQ(r.rc, 2) << bad << "\n" << r.out;
    EXPECT_NE(r.out.find("a vGPU name may hold only letters, digits, '.', '_' and '-'"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("allocated_mib"), std::string::npos) << "the command must not run\n" << r.out;
  }
  const std::string long_name = "a_rather_long_vgpu_name_for_the_team_x_2026";  // 43 characters
  Background(Run("--vram 1GiB --vgpu " + long_name, "hold 1"), dir_ + "/long.log", "holding=1");
  const std::string out = Smi().out;
  const size_t header = out.find("  VGPU"), row = out.find("  " + long_name);
  ASSERT_NE(header, std::string::npos) << out;
  ASSERT_NE(row, std::string::npos) << out;
  const size_t qos_column = out.find("QOS", header) - header;
  EXPECT_EQ(out.find("medium", row) - row, qos_column) << out;
}

// PROCS counts a vGPU's programs, not the `tfusion run` that holds its slot while its command runs.
TEST_F(LocalLimitsTest, SmiCountsTheProgramsOfAVgpuNotTheRunsHoldingIt) {
  auto procs = [&]() -> int {
    std::smatch m;
    const std::string out = Smi().out;
    if (!std::regex_search(out, m, std::regex(R"(procs_a +\S+ +\S+ \S+ +\S+ \S+ +\S+ +\S+ +\S+ +(\d+) )"))) return -1;
    return std::stoi(m.str(1));
  };
  Background(Run("--vram 1GiB --vgpu procs_a", "hold 1"), dir_ + "/first.log", "holding=1");
  EXPECT_EQ(procs(), 1) << Smi().out;
  Background(Run("--vgpu procs_a", "hold 1"), dir_ + "/second.log", "holding=1");
  EXPECT_EQ(procs(), 2) << Smi().out;
}

// A vGPU with tiering: a joiner without tier flags, or with the same ones, joins and leaves the
// policy as it is (as before); one asking for other timeouts is refused (it rewrote them).
TEST_F(LocalLimitsTest, ARunJoiningATieredVgpuInUseTakesItsTierPolicy) {
  Background(Run("--vram 1GiB --tiering --idle-swap 0 --vgpu tiered_b", "hold 1"), dir_ + "/first.log", "holding=1");
  ASSERT_EQ(SmiRow("tiered_b").tier, "resident") << Smi().out;
  Result join = Shell(Run("--vgpu tiered_b", "alloc"));
  EXPECT_EQ(join.rc, 0) << join.out;
  EXPECT_EQ(SmiRow("tiered_b").tier, "resident") << "a joiner without tier flags left tiering on\n" << Smi().out;
  EXPECT_EQ(Shell(Run("--tiering --idle-swap 0 --vgpu tiered_b", "alloc")).rc, 0) << "the same flags join";
  Result other = Shell(Run("--idle-swap 5s --vgpu tiered_b", "alloc"));
  EXPECT_NE(other.rc, 0) << other.out;
  EXPECT_NE(other.out.find("with --idle-swap never, --idle-disk never, --idle-zero never: a run that joins it gives "
                           "the same tier flags"),
            std::string::npos)
      << other.out;
}

// Ctrl-C in a terminal reaches the whole foreground process group, the command included: the run
// must not send it on again (a program that saves its work on the first interrupt was cut short
// by the second). One sent to the run alone still reaches the command.
TEST_F(LocalLimitsTest, CtrlCReachesTheCommandOnceAndAKillOfTheRunReachesItToo) {
  const std::string counter = "python3 -c \"import signal, time\n"
                              "n = 0\n"
                              "def on(sig, frame):\n"
                              "    global n\n"
                              "    n += 1\n"
                              "signal.signal(signal.SIGINT, on)\n"
                              "print('ready', flush=True)\n"
                              "end = time.time() + 2\n"
                              "while time.time() < end: time.sleep(0.02)\n"
                              "print('interrupts=%d' % n, flush=True)\"";
  for (const bool from_terminal : {true, false}) {
    int master = -1;
    pid_t run = forkpty(&master, nullptr, nullptr, nullptr);
    ASSERT_GE(run, 0);
    if (run == 0) {
      execl("/bin/sh", "sh", "-c",
            ("exec env " + env_ + TF_TFUSION + " run --driver " + TF_FAKECUDA + " --nvml " + TF_FAKENVML +
             " --vram 1GiB -- " + counter)
                .c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    std::string out;
    auto read_until = [&](const std::string& what, int ms) {
      for (int waited = 0; waited < ms && out.find(what) == std::string::npos; waited += 10) {
        pollfd p{master, POLLIN, 0};
        if (poll(&p, 1, 10) > 0) {
          char buf[256];
          ssize_t n = read(master, buf, sizeof(buf));
          if (n <= 0) break;
          out.append(buf, static_cast<size_t>(n));
        }
      }
      return out.find(what) != std::string::npos;
    };
    ASSERT_TRUE(read_until("ready", 10000)) << out;
    if (from_terminal) ASSERT_EQ(write(master, "\x03", 1), 1);  // Ctrl-C: the terminal signals its foreground group
    else ASSERT_EQ(kill(run, SIGINT), 0);
    EXPECT_TRUE(read_until("interrupts=", 10000)) << out;
    EXPECT_NE(out.find("interrupts=1"), std::string::npos) << (from_terminal ? "Ctrl-C" : "kill -INT of the run") << "\n"
                                                           << out;
    int status = 0;
    waitpid(run, &status, 0);
    close(master);
  }
}

// An empty value (an unset variable) is refused, not taken for "no limit"; the smallest positive
// share is one part per million, not an error of the region; a name does not make pooled runs
// share an allocation, so it is refused there.
TEST_F(LocalLimitsTest, EmptyValuesTinySharesAndNamesOfPooledRunsAreHandledPlainly) {
  for (const char* flag : {"--vram", "--percent", "--qos", "--gpu", "--vgpu", "--tflops-limit"}) {
    Result r = Shell(Run(std::string(flag) + " ''", "alloc"));
    EXPECT_EQ(r.rc, 2) << flag << "\n" << r.out;
    EXPECT_NE(r.out.find(std::string(flag) + " was given an empty value (an unset variable?)"), std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("allocated_mib"), std::string::npos) << "the command must not run\n" << r.out;
  }
  // A command that cannot run exits as a shell's would: 127 not found, 126 not runnable.
  EXPECT_EQ(Shell(env_ + TF_TFUSION + " run --driver " + TF_FAKECUDA + " --nvml " + TF_FAKENVML +
                  " --vram 1GiB -- /nonexistent/program").rc,
            127);
  EXPECT_EQ(Shell(env_ + TF_TFUSION + " run --driver " + TF_FAKECUDA + " --nvml " + TF_FAKENVML + " --vram 1GiB -- " +
                  dir_).rc,
            126)
      << "a folder";
  // Names of the pool's form are the node agent's: refused before anything is made.
  Result pool_name = Shell(Run("--vram 1GiB --vgpu a-123", "alloc"));
  EXPECT_EQ(pool_name.rc, 2) << pool_name.out;
  EXPECT_NE(pool_name.out.find("names starting with a- are the pool's allocations"), std::string::npos)
      << pool_name.out;
  Background(Run("--vram 1GiB --percent 0.00001 --vgpu tiny", "hold 1"), dir_ + "/tiny.log", "holding=1");
  EXPECT_EQ(SmiRow("tiny").request, "0.0%") << Smi().out;
  Result pooled = Shell(Run("--controller http://127.0.0.1:1 --vram 1GiB --percent 10 --vgpu team", "alloc"));
  EXPECT_EQ(pooled.rc, 2) << pooled.out;
  EXPECT_NE(pooled.out.find("--vgpu names a vGPU of this machine; a run the pool places"), std::string::npos)
      << pooled.out;
}

// The GPU list a run keeps in the region folder (so that the next one skips NVML's start-up) is
// read only when this user wrote it, for this boot, NVML library and set of GPUs: one left by an
// older version, written for another driver, or planted by another user (the folder is open to
// all) says nothing.
TEST_F(LocalLimitsTest, AGpuListLeftByAnotherBootDriverOrUserIsNotBelieved) {
  const std::string cache = dir_ + "/gpus-" + std::to_string(geteuid()) + ".tsv";
  const std::string huge = "0\tGPU-planted\tNVIDIA H100\t1099511627776\n";  // 1 TiB
  for (const std::string& text : {"# boot another nvml " + std::string(TF_FAKENVML) + " gpus\n" + huge, huge,
                                  "# boot x\n" + huge}) {
    {
      std::ofstream out(cache);
      out << text;
    }
    chmod(cache.c_str(), 0644);
    Result r = Shell(Run("--vram 100GiB", "alloc"));
    EXPECT_EQ(r.rc, 2) << text << "\n" << r.out;
    EXPECT_NE(r.out.find("--vram 100GiB is more than GPU 0"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("allocated_mib"), std::string::npos) << r.out;
  }
  // A list the run wrote itself is used, and one others may write is not.
  ASSERT_EQ(Shell(Run("--vram 1GiB", "alloc")).rc, 0);
  const std::string written = ReadFile(cache);
  EXPECT_EQ(written.rfind("# boot ", 0), 0u) << written;
  auto plant = [&](mode_t mode) {
    {
      std::ofstream out(cache);
      out << written.substr(0, written.find('\n') + 1) << huge;
    }
    ASSERT_EQ(chmod(cache.c_str(), mode), 0);
  };
  plant(0666);
  EXPECT_EQ(Shell(Run("--vram 100GiB", "alloc")).rc, 2) << "a list others may write is not read";
  plant(0644);
  Result believed = Shell(Run("--vram 100GiB", "alloc"));
  EXPECT_EQ(believed.out.find("is more than GPU 0"), std::string::npos)
      << "the same list, ours and closed: read (it names a 1 TiB GPU)\n" << believed.out;
}

TEST_F(LocalLimitsTest, RemoteAndPooledRunsSayWhatTheyCannotTake) {
  // A remote worker takes a limit (remote_limits_test.cc), checked here as far as it can be
  // without the worker's GPU.
  Result remote = Shell(env_ + TF_TFUSION + " run --remote 127.0.0.1:1 --percent 30 --percent-limit 20 -- true");
  EXPECT_EQ(remote.rc, 2) << remote.out;
  EXPECT_NE(remote.out.find("--percent-limit 20 is below the request --percent 30"), std::string::npos) << remote.out;
  Result pooled = Shell(Run("--controller http://127.0.0.1:1 --token t --vram 1GiB --tflops 100 --percent-limit 50",
                            "alloc"));
  EXPECT_EQ(pooled.rc, 2) << pooled.out;
  EXPECT_NE(pooled.out.find("give the limit in the request's unit"), std::string::npos) << pooled.out;
  EXPECT_NE(pooled.out.find("(--tflops 100 with --percent-limit)"), std::string::npos) << "the flags given\n"
                                                                                      << pooled.out;
  EXPECT_EQ(pooled.out.find("using a local vGPU"), std::string::npos) << pooled.out;
}

// `tfusion run` killed outright (SIGKILL) cannot remove the vGPU it made for itself. Its command
// holds the vGPU's lock with it, so the vGPU stays while the command runs, and the next sweep
// (`tfusion smi` here) removes it, with its lock file, once the command has ended too. Before,
// such a vGPU stayed in the region for good, taking one of its 64 slots.
TEST_F(LocalLimitsTest, TheVgpuOfARunKilledOutrightGoesOnceItsCommandHasEnded) {
  Background(Run("--vram 1GiB", "hold 1"), dir_ + "/killed.log", "holding=1");
  const pid_t run = background_.back();  // `env` and the shell exec'd into tfusion: the run's own pid
  const std::string id = "run-" + std::to_string(run);
  const std::string lock = dir_ + "/session-locks-" + std::to_string(geteuid()) + "/" + id + ".lock";
  ASSERT_TRUE(SmiRow(id).found) << Smi().out;
  EXPECT_EQ(access(lock.c_str(), F_OK), 0) << lock;
  ASSERT_EQ(kill(run, SIGKILL), 0);
  ASSERT_EQ(waitpid(run, nullptr, 0), run);
  // Its command still runs, holds the lock it inherited, and uses the vGPU: sweeps leave it.
  EXPECT_NE(Shell("flock -n '" + lock + "' true").rc, 0) << "the command holds the run's lock";
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(SmiRow(id).found) << "the command of the killed run still runs\n" << Smi().out;
  }
  kill(-run, SIGKILL);  // the command, left in the run's process group
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gone = !SmiRow(id).found;
  }
  EXPECT_TRUE(gone) << Smi().out;
  EXPECT_NE(access(lock.c_str(), F_OK), 0) << "the lock file goes with the vGPU";
  // A run that ends as usual leaves neither its vGPU nor its lock file.
  Result r = Shell(Run("--vram 1GiB", "alloc"));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(Smi().out.find("run-"), std::string::npos) << Smi().out;
  Result left = Shell("ls -A '" + dir_ + "/session-locks-" + std::to_string(geteuid()) + "'");
  EXPECT_EQ(left.out, "") << left.out;
}

// The next run of a name whose runs were all killed outright, with no sweep between, starts on a
// fresh vGPU: not on the dead runs' counters (launches, GPU time, throttling).
TEST_F(LocalLimitsTest, ARunOfANameWhoseRunsWereAllKilledStartsAfresh) {
  Background(Run("--vram 1GiB --percent 50 --vgpu team_c", "launch 10"), dir_ + "/first.log", "");
  Row row;
  for (int i = 0; i < 100 && row.launches == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    row = SmiRow("team_c");
  }
  ASSERT_GT(row.launches, 0u) << Smi().out;
  const pid_t first = background_.back();
  ASSERT_EQ(kill(first, SIGKILL), 0);
  ASSERT_EQ(waitpid(first, nullptr, 0), first);
  kill(-first, SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // No smi in between: smi sweeps, and the run must do it itself.
  Background(Run("--vram 1GiB --percent 50 --vgpu team_c", "hold 1"), dir_ + "/second.log", "holding=1");
  row = SmiRow("team_c");
  ASSERT_TRUE(row.found) << Smi().out;
  EXPECT_EQ(row.launches, 0u) << "the new run took the killed runs' counters\n" << Smi().out;
  EXPECT_EQ(row.throttled, 0) << Smi().out;
}

// The same for a vGPU that several runs share by name (`--vgpu NAME`): it stays while any run of
// that name or its command lives, and goes with its lock file once the last has ended, however
// they ended.
TEST_F(LocalLimitsTest, ANamedVgpuWhoseRunsWereAllKilledOutrightGoesWithTheirCommands) {
  const std::string lock = dir_ + "/session-locks-" + std::to_string(geteuid()) + "/vgpu-7465616d5f61.lock";  // "team_a"
  Background(Run("--vram 1GiB --vgpu team_a", "hold 1"), dir_ + "/first.log", "holding=1");
  const pid_t first = background_.back();
  Background(Run("--vram 1GiB --vgpu team_a", "hold 1"), dir_ + "/second.log", "holding=1");
  const pid_t second = background_.back();
  ASSERT_TRUE(SmiRow("team_a").found) << Smi().out;
  EXPECT_EQ(access(lock.c_str(), F_OK), 0) << lock;
  // The first run and its command killed outright: the second run still uses the vGPU.
  ASSERT_EQ(kill(first, SIGKILL), 0);
  ASSERT_EQ(waitpid(first, nullptr, 0), first);
  kill(-first, SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(SmiRow("team_a").found) << "a run of that name lives\n" << Smi().out;
  // The second run killed outright: its command still holds the lock.
  ASSERT_EQ(kill(second, SIGKILL), 0);
  ASSERT_EQ(waitpid(second, nullptr, 0), second);
  EXPECT_NE(Shell("flock -n '" + lock + "' true").rc, 0) << "the command holds the run's lock";
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(SmiRow("team_a").found) << "the command of the killed run still runs\n" << Smi().out;
  }
  kill(-second, SIGKILL);
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gone = !SmiRow("team_a").found;
  }
  EXPECT_TRUE(gone) << Smi().out;
  EXPECT_NE(access(lock.c_str(), F_OK), 0) << "the lock file goes with the vGPU";
  // A process the command left in the background keeps the vGPU (it holds the lock) until it exits,
  // though it has not started CUDA: it may yet.
  const std::string pid_file = dir_ + "/background.pid";
  Result bg = Shell(env_ + TF_TFUSION + " run --driver " + TF_FAKECUDA + " --nvml " + TF_FAKENVML +
                    " --vram 1GiB --vgpu team_a -- sh -c 'sleep 30 > /dev/null 2>&1 & echo $! > " + pid_file + "'");
  ASSERT_EQ(bg.rc, 0) << bg.out;
  const pid_t background = static_cast<pid_t>(std::stol(ReadFile(pid_file)));
  EXPECT_TRUE(SmiRow("team_a").found) << "the background process holds the lock\n" << Smi().out;
  ASSERT_EQ(kill(background, SIGKILL), 0);
  gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gone = !SmiRow("team_a").found;
  }
  EXPECT_TRUE(gone) << Smi().out;
  // Runs of a name that end as usual leave neither the vGPU nor its lock file.
  Result r = Shell(Run("--vram 1GiB --vgpu team_a", "alloc"));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_FALSE(SmiRow("team_a").found) << Smi().out;
  Result left = Shell("ls -A '" + dir_ + "/session-locks-" + std::to_string(geteuid()) + "'");
  EXPECT_EQ(left.out, "") << left.out;
}

}  // namespace
