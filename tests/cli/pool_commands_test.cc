// The client commands of `tfusion` (top, quota, pool) against a real controller: the test starts
// `tfusion controller` on port 0 with a SQLite store in a temporary folder and registers a node
// through the API, then runs the binary as a user would and checks what it prints.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "controller/http_client.h"

namespace {

using tf::cli::testing::ReadFile;
using tf::cli::testing::Result;
using tf::cli::testing::Shell;

size_t Count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

class PoolCommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tf-poolcmd-XXXXXX";
    dir_ = mkdtemp(tmpl);
    controller_ = fork();
    ASSERT_GE(controller_, 0);
    if (controller_ == 0) {
      std::string cmd = std::string("exec ") + TF_TFUSION + " controller --port 0 --token tok --store sqlite:" +
                        dir_ + "/state.db > " + dir_ + "/controller.log 2>&1";
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    std::regex url_re("http://127\\.0\\.0\\.1:[0-9]+");
    for (int i = 0; i < 200 && url_.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::smatch m;
      std::string log = ReadFile(dir_ + "/controller.log");
      if (std::regex_search(log, m, url_re)) url_ = m.str();
    }
    ASSERT_FALSE(url_.empty()) << ReadFile(dir_ + "/controller.log");
    tf::controller::HttpClient client(url_, "tok");
    auto r = client.Post("/v1/nodes", R"({"name": "gpu-node-1", "gpus": [
        {"uuid": "GPU-top-0", "model": "H100", "index": 0, "tflops": 100, "vram_mib": 81920}]})");
    ASSERT_TRUE(r.ok() && r->status == 200) << (r.ok() ? r->body : r.status().ToString());
  }
  void TearDown() override {
    if (controller_ > 0) {
      kill(controller_, SIGTERM);
      waitpid(controller_, nullptr, 0);
    }
    EXPECT_EQ(system(("rm -rf '" + dir_ + "'").c_str()), 0);
  }
  Result Tf(const std::string& args) const {
    return Shell(std::string(TF_TFUSION) + " " + args + " --url " + url_ + " --token tok");
  }

  std::string dir_, url_;
  pid_t controller_ = -1;
};

// A registration the controller refuses as such (a bad node name: 400) will not get better by
// retrying: the agent says why and exits, instead of retrying every second for ever.
TEST_F(PoolCommandsTest, AnAgentWhoseRegistrationIsRefusedAsInvalidStops) {
  Result r = Shell("env TFUSION_SHM_DIR='" + dir_ + "/shm' timeout 30 " + TF_TFUSION + " hypervisor --controller " +
                   url_ + " --token tok --node 'bad<name>' --metrics-port -1 " +
                   "--credential-file '" + dir_ + "/credential'");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("node name 'bad<name>' may only hold [A-Za-z0-9._:-]"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("(retrying)"), std::string::npos) << r.out;
  // A node token of another node: 403, as final.
  tf::controller::HttpClient admin(url_, "tok");
  auto made = admin.Post("/v1/tokens", R"({"role":"node","node":"other-node"})");
  ASSERT_EQ(made->status, 201) << made->body;
  const std::string other = nlohmann::json::parse(made->body)["token"];
  r = Shell("env TFUSION_SHM_DIR='" + dir_ + "/shm' timeout 30 " + TF_TFUSION + " hypervisor --controller " + url_ +
            " --token " + other + " --node this-node --metrics-port -1 --credential-file '" + dir_ + "/credential2'");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("HTTP 403"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("(retrying)"), std::string::npos) << r.out;
}

TEST_F(PoolCommandsTest, TopOncePrintsTheGpuTableAndExits) {
  Result r = Tf("top --once");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("GPU-top-0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ALLOC_TFLOPS"), std::string::npos) << r.out;
  EXPECT_EQ(Count(r.out, "ALLOC_TFLOPS"), 1u) << r.out;
}

TEST_F(PoolCommandsTest, TopShowsEachVgpusRequestLimitUseAndThrottledTime) {
  tf::controller::HttpClient client(url_, "tok");
  auto a = client.Post("/v1/allocations", R"({"percent":25,"percent_limit":60,"vram_mib":1024})");
  ASSERT_TRUE(a.ok() && a->status == 201) << (a.ok() ? a->body : a.status().ToString());
  const std::string id = nlohmann::json::parse(a->body)["id"];
  auto beat = [&](int64_t busy) {
    return client.Post("/v1/nodes/gpu-node-1/heartbeat",
                       nlohmann::json{{"vgpus", {{{"allocation", id}, {"gpu", "GPU-top-0"}, {"busy_ns_total", busy},
                                                  {"throttled_ns_total", 2'500'000'000},
                                                  {"held_turn_ns_total", 1'500'000'000}}}}}.dump());
  };
  ASSERT_TRUE(beat(0).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(beat(50'000'000).ok());
  Result r = Tf("top --once");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (const char* column : {"REQ%", "LIMIT%", "USE%", "THROTTLED_S", "TURNS_S"}) EXPECT_NE(r.out.find(column), std::string::npos) << r.out;
  std::istringstream lines(r.out);
  std::string line, row;
  while (std::getline(lines, line))
    if (line.rfind(id, 0) == 0) row = line;
  ASSERT_FALSE(row.empty()) << r.out;
  std::istringstream cells(row);
  std::vector<std::string> c;
  for (std::string cell; cells >> cell;) c.push_back(cell);
  ASSERT_EQ(c.size(), 11u) << row;
  EXPECT_EQ(c[5], "25.0%") << row;
  EXPECT_EQ(c[6], "60.0%") << row;
  const double use = std::stod(c[7]);  // 50 ms busy in the ~200 ms between the two reports
  EXPECT_GT(use, 0.5) << row;  // (a slow machine stretches the interval)
  EXPECT_LT(use, 26.0) << row;
  EXPECT_EQ(c[8], "2.5") << row;    // THROTTLED_S
  EXPECT_EQ(c[9], "1.5") << row;    // TURNS_S: of those, waiting for other vGPUs' turns
}

// Client commands find the token where `tfusion up` leaves it (.tfusion/token in the current
// folder) or in --token-file, and a refused token says where it came from.
TEST_F(PoolCommandsTest, ClientsReadTheTokenFileAndA401SaysWhereTheTokenCameFrom) {
  ASSERT_EQ(system(("mkdir -p '" + dir_ + "/work/.tfusion' && echo tok > '" + dir_ + "/work/.tfusion/token'").c_str()), 0);
  Result r = Shell("cd '" + dir_ + "/work' && " + TF_TFUSION + " node ls --url " + url_);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("gpu-node-1"), std::string::npos) << r.out;
  ASSERT_EQ(system(("echo wrong > '" + dir_ + "/wrong'").c_str()), 0);
  r = Shell(std::string(TF_TFUSION) + " node ls --url " + url_ + " --token-file '" + dir_ + "/wrong'");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("401"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(dir_ + "/wrong"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(".tfusion/token"), std::string::npos) << r.out;
  r = Shell("cd / && env -u TFUSION_TOKEN " + std::string(TF_TFUSION) + " node ls --url " + url_);
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("no --token"), std::string::npos) << r.out;
}

TEST_F(PoolCommandsTest, TopRejectsABadIntervalClearly) {
  for (const char* bad : {"0", "-1", "abc", "0.01", "5000", "nan"}) {
    Result r = Tf(std::string("top --once --interval ") + bad);
    EXPECT_EQ(r.rc, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find("--interval"), std::string::npos) << bad << ": " << r.out;
    EXPECT_EQ(r.out.find("GPU-top-0"), std::string::npos) << bad << ": " << r.out;
  }
}

// A controller that is not there is named, with what to check (not just "Connection").
TEST_F(PoolCommandsTest, AControllerThatIsNotThereIsSaidPlainly) {
  Result r = Shell(std::string(TF_TFUSION) + " pool ls --url http://127.0.0.1:1 --token tok");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("cannot connect (nothing answers at http://127.0.0.1:1: is the server running there, and is "
                       "the URL right?)"),
            std::string::npos)
      << r.out;
}

// Without --once, top redraws every --interval seconds until Ctrl-C (SIGINT), then exits 0.
TEST_F(PoolCommandsTest, TopRedrawsUntilInterrupted) {
  const std::string out = dir_ + "/top.out";
  pid_t top = fork();
  ASSERT_GE(top, 0);
  if (top == 0) {
    std::string cmd = std::string("exec ") + TF_TFUSION + " top --interval 0.2 --url " + url_ +
                      " --token tok > " + out + " 2>&1";
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string text;
  for (int i = 0; i < 100 && Count(text, "ALLOC_TFLOPS") < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    text = ReadFile(out);
  }
  EXPECT_GE(Count(text, "ALLOC_TFLOPS"), 3u) << text;
  // A new allocation shows up in a later frame.
  tf::controller::HttpClient client(url_, "tok");
  auto a = client.Post("/v1/allocations", R"({"tflops": 25, "vram_mib": 1024})");
  ASSERT_TRUE(a.ok() && a->status == 201);
  for (int i = 0; i < 50 && ReadFile(out).find("25.0/100.0") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  kill(top, SIGINT);
  int status = 0;
  ASSERT_EQ(waitpid(top, &status, 0), top);
  ASSERT_TRUE(WIFEXITED(status)) << ReadFile(out);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_NE(ReadFile(out).find("25.0/100.0"), std::string::npos) << ReadFile(out);
}

TEST_F(PoolCommandsTest, QuotaSetGetAndListShowLimitsAndUse) {
  Result set = Tf("quota set acme --tflops 50 --vram 8GiB");
  ASSERT_EQ(set.rc, 0) << set.out;
  EXPECT_NE(set.out.find("acme"), std::string::npos) << set.out;
  // Unset fields keep their value: --gpus alone leaves TFLOPS and VRAM as they were.
  ASSERT_EQ(Tf("quota set acme --gpus 1").rc, 0);
  tf::controller::HttpClient client(url_, "tok");
  auto a = client.Post("/v1/allocations", R"({"tflops": 20, "vram_mib": 2048, "tenant": "acme"})");
  ASSERT_TRUE(a.ok() && a->status == 201) << (a.ok() ? a->body : "");
  Result get = Tf("quota get acme");
  ASSERT_EQ(get.rc, 0) << get.out;
  // TENANT TFLOPS MAX_TFLOPS VRAM_MIB MAX_VRAM_MIB GPUS MAX_GPUS MAX_QOS
  EXPECT_TRUE(std::regex_search(get.out, std::regex("acme +20\\.0 +50\\.0 +2048 +8192 +1 +1 +-\\n"))) << get.out;
  // `ps` says whose each allocation is.
  Result ps = Tf("ps");
  EXPECT_TRUE(std::regex_search(ps.out, std::regex("ALLOCATION +TENANT +WORKLOAD"))) << ps.out;
  EXPECT_TRUE(std::regex_search(ps.out, std::regex("a-[0-9a-f]+ +acme +- +default "))) << ps.out;
  // The quota holds: a second vGPU for acme is refused.
  auto b = client.Post("/v1/allocations", R"({"tflops": 1, "vram_mib": 1, "tenant": "acme"})");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->status, 409) << b->body;
  ASSERT_EQ(Tf("quota set other --vram 0").rc, 0);
  Result ls = Tf("quota ls");
  ASSERT_EQ(ls.rc, 0) << ls.out;
  EXPECT_NE(ls.out.find("acme"), std::string::npos);
  EXPECT_TRUE(std::regex_search(ls.out, std::regex("other +0\\.0 +- +0 +- +0 +- +-\\n"))) << ls.out;
  // --max-qos caps the QoS the tenant asks for ("any": no cap); the other limits keep their value.
  ASSERT_EQ(Tf("quota set other --max-qos high").rc, 0);
  EXPECT_TRUE(std::regex_search(Tf("quota get other").out, std::regex("other +0\\.0 +- +0 +- +0 +- +high\\n")))
      << Tf("quota get other").out;
  Result bad_qos = Tf("quota set other --max-qos urgent");
  EXPECT_EQ(bad_qos.rc, 2) << bad_qos.out;
  EXPECT_NE(bad_qos.out.find("--max-qos must be one of low, medium, high, critical, any"), std::string::npos)
      << bad_qos.out;
  ASSERT_EQ(Tf("quota set other --max-qos any").rc, 0);
  EXPECT_TRUE(std::regex_search(Tf("quota get other").out, std::regex("other +0\\.0 +- +0 +- +0 +- +-\\n")));

  // tfusion run --tenant counts against the same quota, and says so when it is full.
  Result run = Shell(std::string(TF_TFUSION) + " run --controller " + url_ +
                     " --token tok --tenant acme --nvml /nonexistent/libnvidia-ml.so.1 --vram 1GiB --percent 1 -- true");
  EXPECT_EQ(run.rc, 2) << run.out;
  EXPECT_NE(run.out.find("the controller refused the vGPU"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("acme"), std::string::npos) << run.out;
  // A QoS above the tenant's cap is refused by the controller: the run says so and stops, not
  // "controller not reachable: using a local vGPU".
  ASSERT_EQ(Tf("quota set other --max-qos low").rc, 0);
  Result capped = Shell(std::string(TF_TFUSION) + " run --controller " + url_ +
                        " --token tok --tenant other --qos high --nvml /nonexistent/libnvidia-ml.so.1 --vram 1GiB "
                        "--percent 1 -- true");
  EXPECT_EQ(capped.rc, 2) << capped.out;
  EXPECT_NE(capped.out.find("the controller refused the vGPU"), std::string::npos) << capped.out;
  EXPECT_NE(capped.out.find("may ask for QoS up to 'low'"), std::string::npos) << capped.out;
  EXPECT_EQ(capped.out.find("using a local vGPU"), std::string::npos) << capped.out;

  Result missing = Tf("quota get nobody");
  EXPECT_EQ(missing.rc, 1);
  EXPECT_NE(missing.out.find("tenant 'nobody' has no quota"), std::string::npos) << missing.out;

  // quota rm removes the row; the tenant's allocations stay, and new ones are not limited.
  Result rm = Tf("quota rm acme");
  ASSERT_EQ(rm.rc, 0) << rm.out;
  EXPECT_NE(rm.out.find("quota of tenant acme removed"), std::string::npos) << rm.out;
  EXPECT_EQ(Tf("quota ls").out.find("acme"), std::string::npos) << Tf("quota ls").out;
  EXPECT_EQ(client.Get("/v1/allocations/" + nlohmann::json::parse(a->body)["id"].get<std::string>())->status, 200);
  auto c = client.Post("/v1/allocations", R"({"tflops": 1, "vram_mib": 1, "tenant": "acme"})");
  EXPECT_EQ(c->status, 201) << c->body;
  Result again = Tf("quota rm acme");
  EXPECT_EQ(again.rc, 1);
  EXPECT_NE(again.out.find("tenant 'acme' has no quota"), std::string::npos) << again.out;
  // Not a tenant token's to remove.
  auto t = client.Post("/v1/tokens", R"({"role":"tenant","tenant":"other"})");
  ASSERT_EQ(t->status, 201);
  tf::controller::HttpClient tenant(url_, nlohmann::json::parse(t->body)["token"].get<std::string>());
  EXPECT_EQ(tenant.Delete("/v1/quotas/other")->status, 403);
  EXPECT_NE(Tf("quota ls").out.find("other"), std::string::npos);
}

TEST_F(PoolCommandsTest, QuotaInputIsValidatedBeforeAnythingChanges) {
  struct Case {
    const char* args;
    const char* says;
  } cases[] = {{"quota set acme --tflops -5", "--tflops -5"},
               {"quota set acme --tflops lots", "--tflops lots: not a number"},
               {"quota set acme --vram 12XB", "--vram 12XB"},
               {"quota set acme --vram 0x10GiB", "--vram 0x10GiB: not a size"},  // hex is not a size
               {"quota set acme --tflops 0x32", "--tflops 0x32: not a number"},
               {"quota set acme --gpus 1.5", "--gpus 1.5: not a whole number"},
               {"quota set acme", "nothing to set"},
               {"quota set bad/name --gpus 1", "may only hold"}};
  for (const Case& c : cases) {
    Result r = Tf(c.args);
    EXPECT_NE(r.rc, 0) << c.args;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << ": " << r.out;
  }
  Result ls = Tf("quota ls");
  EXPECT_EQ(ls.out.find("acme"), std::string::npos) << ls.out;
}

TEST_F(PoolCommandsTest, PoolSetChangesModeAndOversellAndKeepsTheRest) {
  ASSERT_EQ(Tf("pool create train --mode CompactFirst").rc, 0);
  Result set = Tf("pool set train --oversell 1.5");
  ASSERT_EQ(set.rc, 0) << set.out;
  EXPECT_NE(set.out.find("placement mode CompactFirst, TFLOPS oversell ratio 1.5"), std::string::npos) << set.out;
  ASSERT_EQ(Tf("pool set train --mode FragAware").rc, 0);
  Result ls = Tf("pool ls");
  EXPECT_TRUE(std::regex_search(ls.out, std::regex("train +FragAware +1\\.50"))) << ls.out;
  // The default pool's oversell ratio lets vGPUs of 140 TFLOPS in all onto the 100-TFLOPS GPU.
  ASSERT_EQ(Tf("pool set default --oversell 1.5").rc, 0);
  tf::controller::HttpClient client(url_, "tok");
  for (int i = 0; i < 2; ++i) {
    auto a = client.Post("/v1/allocations", R"({"tflops": 70, "vram_mib": 1024})");
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a->status, 201) << a->body;
  }

  struct Case {
    const char* args;
    const char* says;
  } cases[] = {{"pool set train --oversell 0.5", "--oversell 0.5: must be at least 1"},
               {"pool set train --oversell 101", "--oversell 101: must be at most 100"},
               {"pool set train --oversell x", "--oversell x: not a number"},
               {"pool set train --mode Tetris", "Tetris"},
               {"pool set train", "nothing to change"},
               {"pool set nosuchpool --mode BestFit", "pool 'nosuchpool' not found"}};
  for (const Case& c : cases) {
    Result r = Tf(c.args);
    EXPECT_NE(r.rc, 0) << c.args;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << ": " << r.out;
  }
  ls = Tf("pool ls");
  EXPECT_TRUE(std::regex_search(ls.out, std::regex("train +FragAware +1\\.50"))) << ls.out;
}

TEST_F(PoolCommandsTest, APoolThatExpandsVramIntoHostMemoryOversellsItWithTiering) {
  tf::controller::HttpClient client(url_, "tok");
  // 48 GiB twice on an 80 GiB GPU: the second does not fit physical VRAM.
  auto first = client.Post("/v1/allocations", R"({"percent": 10, "vram_mib": 49152})");
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->status, 201) << first->body;
  EXPECT_NE(first->body.find("\"tiering\":false"), std::string::npos) << first->body;
  auto refused = client.Post("/v1/allocations", R"({"percent": 10, "vram_mib": 49152})");
  ASSERT_TRUE(refused.ok());
  EXPECT_NE(refused->status, 201) << refused->body;
  Result set = Tf("pool set default --vram-expand-host 50 --vram-expand-disk 25");
  ASSERT_EQ(set.rc, 0) << set.out;
  EXPECT_NE(set.out.find("VRAM expanded 50% into host memory and 25% onto disk"), std::string::npos) << set.out;
  EXPECT_TRUE(std::regex_search(Tf("pool ls").out, std::regex("default +\\S+ +1\\.00 +50 +25 "))) << Tf("pool ls").out;
  // 80 GiB x 1.75 = 140 GiB schedulable: the second fits now, and its vGPU gets tiering.
  auto second = client.Post("/v1/allocations", R"({"percent": 10, "vram_mib": 49152})");
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->status, 201) << second->body;
  EXPECT_NE(second->body.find("\"tiering\":true"), std::string::npos) << second->body;
  auto third = client.Post("/v1/allocations", R"({"percent": 10, "vram_mib": 49152})");
  ASSERT_TRUE(third.ok());
  EXPECT_NE(third->status, 201) << "144 GiB is more than 140 GiB: " << third->body;
  // Freeze and thaw through the API: counted on the allocation for its node's agent.
  const std::string tiered = nlohmann::json::parse(second->body)["id"];
  const std::string plain = nlohmann::json::parse(first->body)["id"];
  auto frozen = client.Post("/v1/allocations/" + tiered + "/freeze", "{}");
  ASSERT_TRUE(frozen.ok());
  EXPECT_EQ(frozen->status, 202) << frozen->body;
  EXPECT_NE(frozen->body.find("\"freeze_requests\":1"), std::string::npos) << frozen->body;
  auto not_tiered = client.Post("/v1/allocations/" + plain + "/thaw", "{}");
  ASSERT_TRUE(not_tiered.ok());
  EXPECT_EQ(not_tiered->status, 409) << not_tiered->body;
  EXPECT_NE(not_tiered->body.find("no VRAM tiering"), std::string::npos) << not_tiered->body;
  auto unknown = client.Post("/v1/allocations/a-nosuch/freeze", "{}");
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->status, 404) << unknown->body;
  Result thaw = Tf("thaw " + tiered + " --controller");
  EXPECT_EQ(thaw.rc, 0) << thaw.out;
  EXPECT_NE(thaw.out.find("thaw of allocation " + tiered + " requested (node gpu-node-1)"), std::string::npos)
      << thaw.out;
  Result no_tier = Tf("freeze " + plain + " --controller");
  EXPECT_NE(no_tier.rc, 0);
  EXPECT_NE(no_tier.out.find("no VRAM tiering"), std::string::npos) << no_tier.out;

  struct Case {
    const char* args;
    const char* says;
  } cases[] = {{"pool set default --vram-expand-host 401", "--vram-expand-host 401"},
               {"pool set default --vram-expand-disk -5", "--vram-expand-disk"},
               {"pool set default --vram-expand-host 1.5", "--vram-expand-host 1.5"}};
  for (const Case& c : cases) {
    Result r = Tf(c.args);
    EXPECT_NE(r.rc, 0) << c.args;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << ": " << r.out;
  }
  auto bad = client.Patch("/v1/pools/default", R"({"vram_expand_to_host_percent": 1e9})");
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->status, 400) << bad->body;
  EXPECT_NE(bad->body.find("vram_expand_to_host_percent"), std::string::npos) << bad->body;
}

// Roles: a tenant token manages its own allocations within its quota namespace and nothing else;
// a node token speaks for its own node; tokens are listed without secrets and can be revoked.
TEST_F(PoolCommandsTest, TenantAndNodeTokensReachOnlyWhatTheyOwn) {
  auto token = [&](const std::string& args) {
    Result r = Tf("token create " + args);
    std::smatch m;
    EXPECT_EQ(r.rc, 0) << r.out;
    return std::regex_search(r.out, m, std::regex("tft_[0-9a-f]{16}_[0-9a-f]{64}")) ? m.str() : std::string();
  };
  const std::string acme = token("--role tenant --tenant acme --description 'acme CI'");
  const std::string other = token("--role tenant --tenant other");
  const std::string node = token("--role node --node gpu-node-1");
  ASSERT_FALSE(acme.empty() || other.empty() || node.empty());
  tf::controller::HttpClient as_acme(url_, acme), as_other(url_, other), as_node(url_, node);

  // A tenant allocates for itself only.
  auto mine = as_acme.Post("/v1/allocations", R"({"percent": 10, "vram_mib": 1024})");
  ASSERT_TRUE(mine.ok());
  ASSERT_EQ(mine->status, 201) << mine->body;
  EXPECT_NE(mine->body.find("\"tenant\":\"acme\""), std::string::npos) << mine->body;
  const std::string id = nlohmann::json::parse(mine->body)["id"];
  auto forged = as_acme.Post("/v1/allocations", R"({"percent": 10, "vram_mib": 1024, "tenant": "other"})");
  ASSERT_TRUE(forged.ok());
  EXPECT_EQ(forged->status, 403) << forged->body;
  // Another tenant neither sees nor releases it, and changes nothing of the cluster.
  auto seen = as_other.Get("/v1/allocations");
  ASSERT_TRUE(seen.ok());
  EXPECT_EQ(seen->body.find(id), std::string::npos) << seen->body;
  auto del = as_other.Delete("/v1/allocations/" + id);
  ASSERT_TRUE(del.ok());
  EXPECT_EQ(del->status, 404) << del->body;
  for (auto [method, path, body] : {std::tuple{"PATCH", "/v1/pools/default", R"({"tflops_oversell_ratio": 2})"},
                                    std::tuple{"POST", "/v1/nodes", R"({"name": "fake", "gpus": []})"},
                                    std::tuple{"PUT", "/v1/quotas/other", R"({"max_gpus": 100})"},
                                    std::tuple{"GET", "/v1/tokens", ""},
                                    std::tuple{"DELETE", "/v1/nodes/gpu-node-1", ""}}) {
    auto r = std::string(method) == "GET"      ? as_other.Get(path)
             : std::string(method) == "DELETE" ? as_other.Delete(path)
             : std::string(method) == "PUT"    ? as_other.Put(path, body)
             : std::string(method) == "PATCH"  ? as_other.Patch(path, body)
                                               : as_other.Post(path, body);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->status, 403) << method << " " << path << ": " << r->body;
    EXPECT_NE(r->body.find("tenant 'other'"), std::string::npos) << r->body;
  }
  // The owner releases it.
  auto released = as_acme.Delete("/v1/allocations/" + id);
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(released->status, 200) << released->body;

  // A node token: its own node's heartbeat and allocation list; nothing of another node's.
  auto hb = as_node.Post("/v1/nodes/gpu-node-1/heartbeat", R"({"gpus": []})");
  ASSERT_TRUE(hb.ok());
  EXPECT_NE(hb->status, 403) << hb->body;
  auto other_hb = as_node.Post("/v1/nodes/gpu-node-2/heartbeat", R"({"gpus": []})");
  ASSERT_TRUE(other_hb.ok());
  EXPECT_EQ(other_hb->status, 403) << other_hb->body;
  auto claim = as_node.Post("/v1/nodes", R"({"name": "gpu-node-2", "gpus": []})");
  ASSERT_TRUE(claim.ok());
  EXPECT_EQ(claim->status, 403) << claim->body;
  auto alloc = as_node.Post("/v1/allocations", R"({"percent": 10, "vram_mib": 1024})");
  ASSERT_TRUE(alloc.ok());
  EXPECT_EQ(alloc->status, 403) << alloc->body;

  // Listed without secrets (not even their hashes); revoked tokens stop working at once.
  Result ls = Tf("token ls");
  EXPECT_EQ(ls.rc, 0) << ls.out;
  EXPECT_EQ(Count(ls.out, " tenant "), 2u) << ls.out;
  EXPECT_NE(ls.out.find("acme CI"), std::string::npos) << ls.out;
  EXPECT_TRUE(std::regex_search(ls.out, std::regex(" 20[0-9]{2}-[01][0-9]-[0-3][0-9] [0-2][0-9]:[0-5][0-9]:[0-5][0-9] ")))
      << "created as a UTC time, not epoch milliseconds\n" << ls.out;
  EXPECT_EQ(ls.out.find(acme.substr(21)), std::string::npos) << "no secret in the list";
  auto listed = tf::controller::HttpClient(url_, "tok").Get("/v1/tokens");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->body.find("sha256"), std::string::npos) << listed->body;
  EXPECT_EQ(ReadFile(dir_ + "/state.db").find(acme.substr(21)), std::string::npos) << "stored hashed";
  ASSERT_EQ(Tf("token rm " + acme.substr(4, 16)).rc, 0);
  auto after = as_acme.Get("/v1/pools");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->status, 401) << after->body;

  struct Case {
    const char* args;
    const char* says;
  } cases[] = {{"token create --role root", "role must be one of admin, tenant, node"},
               {"token create --role tenant", "token create --role tenant needs --tenant NAME"},
               {"token create --role node", "token create --role node needs --node NAME"},
               {"token create --role admin --tenant acme", "an admin token names no tenant"},
               {"token rm 0000000000000000", "not found"}};
  for (const Case& c : cases) {
    Result r = Tf(c.args);
    EXPECT_NE(r.rc, 0) << c.args;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << ": " << r.out;
  }
}

// `tfusion run --controller` from a machine whose GPUs are not the ones the pool chose: the node
// that holds the vGPU runs it through its worker, or the run is refused when it has none or its
// worker does not answer. The command here (`true`) makes no CUDA call, so the worker only needs
// to take a connection (a listening socket stands in for it): what is tested is which path the run
// takes, what it says, and that the allocation is released either way.
TEST_F(PoolCommandsTest, RunPlacedOnAnotherNodeGoesThroughItsWorkerOrSaysWhyNot) {
  const std::string run = std::string(TF_TFUSION) + " run --controller " + url_ +
                          " --token tok --nvml /nonexistent/libnvidia-ml.so.1 --vram 1GiB --percent 10 -- true";
  Result refused = Shell(run);
  EXPECT_EQ(refused.rc, 2) << refused.out;
  EXPECT_NE(refused.out.find("placed this vGPU on node gpu-node-1 (GPU GPU-top-0), not on this machine, and "
                             "that node has no worker address registered"),
            std::string::npos)
      << refused.out;
  EXPECT_NE(refused.out.find("--worker-address HOST:PORT"), std::string::npos) << refused.out;
  EXPECT_EQ(Tf("ps").out.find("running"), std::string::npos) << "released after the refusal";

  tf::controller::HttpClient client(url_, "tok");
  auto r = client.Post("/v1/nodes", R"({"name": "gpu-node-1", "worker_address": "127.0.0.1:1", "gpus": [
      {"uuid": "GPU-top-0", "model": "H100", "index": 0, "tflops": 100, "vram_mib": 81920}]})");
  ASSERT_TRUE(r.ok() && r->status == 200);
  EXPECT_NE(Tf("node ls").out.find("127.0.0.1:1"), std::string::npos);
  Result down = Shell(run);
  EXPECT_EQ(down.rc, 2) << down.out;
  EXPECT_NE(down.out.find("whose worker does not answer (cannot connect to 127.0.0.1:1"), std::string::npos) << down.out;
  EXPECT_EQ(Tf("ps").out.find("running"), std::string::npos) << "released after the refusal";

  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 8), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string worker = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  r = client.Post("/v1/nodes", R"({"name": "gpu-node-1", "worker_address": ")" + worker + R"(", "gpus": [
      {"uuid": "GPU-top-0", "model": "H100", "index": 0, "tflops": 100, "vram_mib": 81920}]})");
  ASSERT_TRUE(r.ok() && r->status == 200) << (r.ok() ? r->body : r.status().ToString());
  Result remote = Shell(run);
  close(listener);
  EXPECT_EQ(remote.rc, 0) << remote.out;
  EXPECT_TRUE(std::regex_search(remote.out, std::regex("allocation a-[0-9a-f]+ on node gpu-node-1 \\(GPU GPU-top-0\\): "
                                                       "1\\.0 GiB VRAM, 10\\.0% of the GPU; running remotely through "
                                                       "its worker " + worker)))
      << remote.out;
  EXPECT_EQ(Tf("ps").out.find("running"), std::string::npos) << "released when the command ended";

  auto bad = client.Post("/v1/nodes", R"({"name": "gpu-node-2", "worker_address": "nohost"})");
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("must be HOST:PORT"), std::string::npos) << bad->body;
}

// A pool's VRAM expansion is bounded by each node's tier budgets as its agent reports them
// (registration and heartbeats, here sent as an agent sends them): a vGPU that fits only with
// expansion goes to the node whose host tier can hold it, is refused with the reason where no
// node's can, and `tfusion node ls` / `pool ls` show the VRAM placement counts.
TEST_F(PoolCommandsTest, NodeTierBudgetsBoundAPoolsVramExpansion) {
  tf::controller::HttpClient client(url_, "tok");
  ASSERT_EQ(Tf("pool create tiered --vram-expand-host 100 --vram-expand-disk 50").rc, 0);
  // 16 GiB GPUs: with a 2 GiB host tier and no disk tier, the small node offers 18 GiB.
  auto small = client.Post("/v1/nodes", R"({"name": "tier-small", "pool": "tiered", "disk_tier_budget_mib": 0,
      "gpus": [{"uuid": "GPU-small-0", "model": "L4", "tflops": 100, "vram_mib": 16384, "host_tier_budget_mib": 2048}]})");
  ASSERT_TRUE(small.ok() && small->status == 200) << (small.ok() ? small->body : small.status().ToString());
  auto refused = client.Post("/v1/allocations", R"({"pool": "tiered", "percent": 10, "vram_mib": 20000})");
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->status, 409) << refused->body;
  EXPECT_NE(refused->body.find("host tier budget"), std::string::npos) << refused->body;
  EXPECT_NE(refused->body.find("18432 MiB"), std::string::npos) << refused->body;
  Result nodes = Tf("node ls");
  EXPECT_TRUE(std::regex_search(nodes.out, std::regex("tier-small +tiered +ready +1 .* 18432 +2048 +0\n"))) << nodes.out;
  EXPECT_TRUE(std::regex_search(nodes.out, std::regex("gpu-node-1 .* 81920 +- +-\n"))) << "no budgets reported: "
                                                                                        << nodes.out;
  EXPECT_TRUE(std::regex_search(Tf("pool ls").out, std::regex("tiered .* 18432\n"))) << Tf("pool ls").out;

  // A node whose host tier holds 16 GiB and whose disk tier 4 GiB offers 16 + 16 + 4 GiB.
  auto big = client.Post("/v1/nodes", R"({"name": "tier-big", "pool": "tiered", "disk_tier_budget_mib": 4096,
      "gpus": [{"uuid": "GPU-big-0", "model": "L4", "tflops": 100, "vram_mib": 16384, "host_tier_budget_mib": 16384}]})");
  ASSERT_TRUE(big.ok() && big->status == 200) << (big.ok() ? big->body : big.status().ToString());
  EXPECT_TRUE(std::regex_search(Tf("node ls").out, std::regex("tier-big .* 36864 +16384 +4096\n"))) << Tf("node ls").out;
  auto placed = client.Post("/v1/allocations", R"({"pool": "tiered", "percent": 10, "vram_mib": 20000})");
  ASSERT_TRUE(placed.ok());
  ASSERT_EQ(placed->status, 201) << placed->body;
  nlohmann::json a = nlohmann::json::parse(placed->body);
  EXPECT_EQ(a["node"], "tier-big");
  EXPECT_EQ(a["tiering"], true);

  // The small node's agent reports a larger host tier with its heartbeat: now it has room too.
  auto beat = client.Post("/v1/nodes/tier-small/heartbeat", R"({"disk_tier_budget_mib": 0,
      "gpus": [{"uuid": "GPU-small-0", "utilization_percent": 0, "memory_used_mib": 0, "host_tier_budget_mib": 8192}]})");
  ASSERT_TRUE(beat.ok() && beat->status == 200) << (beat.ok() ? beat->body : beat.status().ToString());
  EXPECT_TRUE(std::regex_search(Tf("node ls").out, std::regex("tier-small .* 24576 +8192 +0\n"))) << Tf("node ls").out;
  auto second = client.Post("/v1/allocations", R"({"pool": "tiered", "percent": 10, "vram_mib": 20000})");
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->status, 201) << second->body;
  EXPECT_EQ(nlohmann::json::parse(second->body)["node"], "tier-small");

  // Budgets that are not sizes are refused and change nothing.
  for (const char* body : {R"({"name": "tier-bad", "pool": "tiered", "gpus": [{"uuid": "GPU-bad-0", "model": "L4",
                               "tflops": 100, "vram_mib": 16384, "host_tier_budget_mib": -5}]})",
                           R"({"name": "tier-bad", "pool": "tiered", "disk_tier_budget_mib": "lots", "gpus": []})"}) {
    auto bad = client.Post("/v1/nodes", body);
    ASSERT_TRUE(bad.ok());
    EXPECT_EQ(bad->status, 400) << bad->body;
    EXPECT_NE(bad->body.find("tier_budget_mib"), std::string::npos) << bad->body;
  }
  EXPECT_EQ(client.Get("/v1/nodes/tier-bad")->status, 404);
  auto bad_beat = client.Post("/v1/nodes/tier-small/heartbeat", R"({"disk_tier_budget_mib": -7})");
  ASSERT_TRUE(bad_beat.ok());
  EXPECT_EQ(bad_beat->status, 400) << bad_beat->body;
  EXPECT_TRUE(std::regex_search(Tf("node ls").out, std::regex("tier-small .* 24576 +8192 +0\n"))) << Tf("node ls").out;
}

// Trial 44, F2: `tfusion node cordon` keeps new work off a node that keeps its allocations, `node ls`
// shows it cordoned with how many it still holds (drained at 0), `node uncordon` undoes it; a tenant
// cannot; an unknown node is named.
TEST_F(PoolCommandsTest, NodeCordonAndUncordonForMaintenance) {
  tf::controller::HttpClient client(url_, "tok");
  auto a = client.Post("/v1/allocations", R"({"tflops": 40, "vram_mib": 1000})");
  ASSERT_TRUE(a.ok() && a->status == 201) << (a.ok() ? a->body : a.status().ToString());
  const std::string id = nlohmann::json::parse(a->body)["id"];
  Result r = Tf("node cordon gpu-node-1");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("node gpu-node-1 cordoned: it takes no new allocations and keeps its 1 allocation(s)"),
            std::string::npos) << r.out;
  r = Tf("node ls");
  EXPECT_NE(r.out.find(" ALLOCS "), std::string::npos) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("gpu-node-1 +default +ready,cordoned +1 +1 "))) << r.out;
  auto refused = client.Post("/v1/allocations", R"({"tflops": 10, "vram_mib": 100})");
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->status, 409) << refused->body;
  // Drained: its last allocation released, `node ls` shows 0.
  ASSERT_EQ(client.Delete("/v1/allocations/" + id)->status, 200);
  EXPECT_TRUE(std::regex_search(Tf("node ls").out, std::regex("gpu-node-1 +default +ready,cordoned +1 +0 ")))
      << Tf("node ls").out;
  // A tenant token may not uncordon; an unknown node is a clear 404.
  auto made = client.Post("/v1/tokens", R"({"role":"tenant","tenant":"acme"})");
  ASSERT_EQ(made->status, 201) << made->body;
  const std::string acme = nlohmann::json::parse(made->body)["token"];
  r = Shell(std::string(TF_TFUSION) + " node uncordon gpu-node-1 --url " + url_ + " --token " + acme);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("403"), std::string::npos) << r.out;
  r = Tf("node cordon no-such-node");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("node 'no-such-node' is not registered"), std::string::npos) << r.out;
  r = Tf("node uncordon gpu-node-1");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("node gpu-node-1 uncordoned"), std::string::npos) << r.out;
  EXPECT_TRUE(std::regex_search(Tf("node ls").out, std::regex("gpu-node-1 +default +ready +1 +0 "))) << Tf("node ls").out;
  auto placed = client.Post("/v1/allocations", R"({"tflops": 10, "vram_mib": 100})");
  EXPECT_EQ(placed->status, 201) << placed->body;
  r = Tf("node --help");
  EXPECT_NE(r.out.find("cordon"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("uncordon"), std::string::npos) << r.out;
}

// Trial 44, F2: an agent whose GPU now reports less than its allocations hold (here a catalog
// override) is refused with a 409; it says why and keeps retrying, it does not give up silently,
// and the controller keeps the GPU as it was.
TEST_F(PoolCommandsTest, AnAgentRefusedForAShrunkenBusyGpuSaysWhyAndKeepsRetrying) {
  const std::string shm = "/tf-poolcmd-" + std::to_string(getpid());
  const std::string agent = "env TFUSION_SHM_DIR='" + dir_ + "/shm' FAKECUDA_SHM_NAME=" + shm +
                            " FAKECUDA_DEVICES=1 LD_LIBRARY_PATH=" + TF_FAKECUDA_DIR + " timeout 5 " + TF_TFUSION +
                            " hypervisor --controller " + url_ + " --token tok --node shrink-node --metrics-port -1" +
                            " --credential-file '" + dir_ + "/credential'";
  Result r = Shell(agent);  // registers, then runs until the timeout
  ASSERT_EQ(r.rc, 124) << r.out;
  tf::controller::HttpClient client(url_, "tok");
  auto a = client.Post("/v1/allocations", R"({"tflops": 500, "vram_mib": 1000, "node": "shrink-node"})");
  ASSERT_TRUE(a.ok() && a->status == 201) << (a.ok() ? a->body : a.status().ToString());
  {
    std::ofstream overrides(dir_ + "/overrides");
    overrides << "H100 100\n";
  }
  r = Shell(agent + " --catalog-overrides '" + dir_ + "/overrides'");
  EXPECT_EQ(r.rc, 124) << "the agent gave up: " << r.out;
  EXPECT_NE(r.out.find("HTTP 409: GPU "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("holds allocations of 500 TFLOPS and 1000 MiB but now reports 100 TFLOPS"), std::string::npos)
      << r.out;
  EXPECT_GE(Count(r.out, "(retrying)"), 2u) << r.out;
  auto gpus = nlohmann::json::parse(client.Get("/v1/gpus?limit=100")->body)["gpus"];
  bool seen = false;
  for (const auto& g : gpus) {
    if (g["node"] != "shrink-node") continue;
    seen = true;
    EXPECT_EQ(g["tflops"], 989.4);
  }
  EXPECT_TRUE(seen) << gpus.dump();
  tf::cli::testing::RemoveFakeDriverShm(shm);
}

}  // namespace
