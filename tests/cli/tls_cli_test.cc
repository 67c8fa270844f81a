// TLS as a user meets it, with the real binaries: `tfusion controller` serving HTTPS with a test
// CA made here by the openssl command; the client commands with and without that CA; bad TLS
// files at start; the plaintext warning; a node agent registering and heartbeating over TLS
// through a kill -9 of the controller; and `tfusion up --tls` (one flag) with `tfusion run
// --controller` over it.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "../common/test_ca.h"
#include "cli_test_util.h"
#include "controller/http_client.h"
#include "controller/self_signed_ca.h"

namespace {

using nlohmann::json;
using tf::cli::testing::ReadFile;
using tf::cli::testing::Result;
using tf::cli::testing::Shell;
using tf::controller::HttpClient;

bool Has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// Runs `cmd` through sh in the background, its output appended to `log`.
pid_t Background(const std::string& cmd, const std::string& log) {
  pid_t pid = fork();
  if (pid == 0) {
    std::string line = "exec " + cmd + " >> '" + log + "' 2>&1";
    execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// The first match of `re` in the file `path` (waits up to `ms`), or "".
std::string WaitForMatch(const std::string& path, const std::regex& re, int ms = 15000, size_t from = 0) {
  for (int t = 0; t < ms; t += 50) {
    std::smatch m;
    std::string text = ReadFile(path);
    if (text.size() > from) text = text.substr(from);
    else text.clear();
    if (std::regex_search(text, m, re)) return m.size() > 1 ? m.str(1) : m.str();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "";
}

void Stop(pid_t& pid, int sig = SIGTERM) {
  if (pid <= 0) return;
  kill(pid, sig);
  waitpid(pid, nullptr, 0);
  pid = -1;
}

class TlsControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tf-tls-XXXXXX";
    dir_ = mkdtemp(tmpl);
    // A test CA and a server certificate for 127.0.0.1/localhost; and a CA nobody used.
    const std::string made = tf::testing::MakeTestCa(dir_);
    ASSERT_EQ(made, "");
  }
  void TearDown() override {
    Stop(agent_);
    Stop(controller_);
    EXPECT_EQ(system(("rm -rf '" + dir_ + "'").c_str()), 0);
    tf::cli::testing::RemoveFakeDriverShm("tf-tls-" + std::to_string(getpid()));
  }
  // Starts the controller with TLS on `port` (0: any) and returns its https URL.
  std::string StartController(int port, const std::string& extra = "") {
    const std::string log = dir_ + "/controller.log";
    const size_t from = ReadFile(log).size();
    controller_ = Background(std::string(TF_TFUSION) + " controller --port " + std::to_string(port) +
                                 " --token tok --store sqlite:" + dir_ + "/state.db --tls-cert " + dir_ +
                                 "/server.pem --tls-key " + dir_ + "/server.key " + extra,
                             log);
    return WaitForMatch(log, std::regex("https://127\\.0\\.0\\.1:[0-9]+"), 15000, from);
  }
  Result Tf(const std::string& args) const { return Shell("env -u TFUSION_CA_FILE " + std::string(TF_TFUSION) + " " + args); }

  std::string dir_;
  pid_t controller_ = -1, agent_ = -1;
};

TEST_F(TlsControllerTest, ClientCommandsWorkWithTheCaAndFailClearlyWithoutIt) {
  const std::string url = StartController(0);
  ASSERT_FALSE(url.empty()) << ReadFile(dir_ + "/controller.log");
  EXPECT_FALSE(Has(ReadFile(dir_ + "/controller.log"), "WARNING"));

  Result ok = Tf("node ls --url " + url + " --token tok --ca-file " + dir_ + "/ca.pem");
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_EQ(ok.out.rfind("NODE", 0), 0u) << ok.out;
  Result env = Shell("TFUSION_CA_FILE=" + dir_ + "/ca.pem " + TF_TFUSION + " pool ls --url " + url + " --token tok");
  EXPECT_EQ(env.rc, 0) << env.out;
  EXPECT_TRUE(Has(env.out, "default")) << env.out;

  Result none = Tf("node ls --url " + url + " --token tok");
  EXPECT_EQ(none.rc, 1) << none.out;
  EXPECT_TRUE(Has(none.out, url + "/v1/nodes")) << none.out;
  EXPECT_TRUE(Has(none.out, "not accepted")) << none.out;
  EXPECT_TRUE(Has(none.out, "system's trust store")) << none.out;

  Result other = Tf("ps --url " + url + " --token tok --ca-file " + dir_ + "/other.pem");
  EXPECT_EQ(other.rc, 1) << other.out;
  EXPECT_TRUE(Has(other.out, "not accepted")) << other.out;
  EXPECT_TRUE(Has(other.out, dir_ + "/other.pem")) << other.out;

  Result missing = Tf("ps --url " + url + " --token tok --ca-file " + dir_ + "/absent.pem");
  EXPECT_NE(missing.rc, 0) << missing.out;
  EXPECT_TRUE(Has(missing.out, "cannot read the CA file " + dir_ + "/absent.pem")) << missing.out;

  // Plain HTTP to the TLS port: no answer, and the client says to use https://.
  const std::string plain = "http://" + url.substr(8);
  Result http = Tf("node ls --url " + plain + " --token tok");
  EXPECT_EQ(http.rc, 1) << http.out;
  EXPECT_TRUE(Has(http.out, "use an https:// URL")) << http.out;
  EXPECT_FALSE(Has(http.out, "NODE")) << http.out;
}

TEST_F(TlsControllerTest, BadTlsFilesStopTheControllerAtStartAndChangeNothing) {
  // An expired certificate: issued by our generator as if 400 days ago (valid 365 days).
  auto old = tf::controller::EnsureSelfSignedTls(dir_ + "/old", {"127.0.0.1"},
                                                 static_cast<int64_t>(std::time(nullptr)) - 400 * 86400);
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  struct Case {
    std::string flags, message;
  };
  const std::string d = dir_ + "/";
  for (const Case& c : {Case{"--tls-cert " + d + "server.pem --tls-key " + d + "absent.key",
                             "cannot read the private key file " + d + "absent.key"},
                        Case{"--tls-cert " + d + "server.pem --tls-key " + d + "other.key",
                             "does not belong to the certificate"},
                        Case{"--tls-cert " + d + "server.key --tls-key " + d + "server.key", "no PEM certificate"},
                        Case{"--tls-cert " + old->cert_file + " --tls-key " + old->key_file, "expired on"},
                        Case{"--tls-cert " + d + "server.pem", "--tls-cert needs --tls-key"}}) {
    Result r = Tf("controller --port 0 --token tok --store sqlite:" + d + "never.db " + c.flags);
    EXPECT_EQ(r.rc, 2) << c.flags << "\n" << r.out;
    EXPECT_TRUE(Has(r.out, c.message)) << c.flags << "\n" << r.out;
    EXPECT_FALSE(Has(r.out, "listening")) << r.out;
    EXPECT_NE(access((d + "never.db").c_str(), F_OK), 0) << "the store was opened: " << c.flags;
  }
}

TEST_F(TlsControllerTest, PlaintextOffLoopbackIsRefusedUnlessAllowedAndThenWarned) {
  // Without TLS and without --insecure-listen: refused at start, before the store is opened.
  Result r = Tf("controller --listen 0.0.0.0 --port 0 --token tok --store sqlite:" + dir_ + "/plain.db");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, "refusing to serve the API on 0.0.0.0 without TLS")) << r.out;
  EXPECT_TRUE(Has(r.out, "--insecure-listen")) << r.out;
  EXPECT_NE(access((dir_ + "/plain.db").c_str(), F_OK), 0) << "the store was opened";
  r = Tf("up --listen 0.0.0.0 --port 0 --state-dir " + dir_ + "/up-state");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(Has(r.out, "tfusion up: refusing to serve the API on 0.0.0.0 without TLS")) << r.out;

  // Allowed knowingly: it starts, and says at every start that tokens cross in clear.
  const std::string log = dir_ + "/insecure.log";
  pid_t plain = Background(std::string(TF_TFUSION) + " controller --listen 0.0.0.0 --port 0 --token tok --store sqlite:" +
                               dir_ + "/insecure.db --insecure-listen",
                           log);
  ASSERT_FALSE(WaitForMatch(log, std::regex("listening on http://0\\.0\\.0\\.0")).empty()) << ReadFile(log);
  Stop(plain);
  EXPECT_TRUE(Has(ReadFile(log), "WARNING: the API listens on 0.0.0.0 without TLS")) << ReadFile(log);
  EXPECT_TRUE(Has(ReadFile(log), "cross the network in clear")) << ReadFile(log);

  // With TLS, or on loopback: no warning.
  for (const std::string& flags : {"--listen 0.0.0.0 --tls-cert " + dir_ + "/server.pem --tls-key " + dir_ + "/server.key",
                                   std::string("--listen 127.0.0.1")}) {
    const std::string quiet = dir_ + "/quiet.log";
    std::remove(quiet.c_str());
    pid_t p = Background(std::string(TF_TFUSION) + " controller --port 0 --token tok --store sqlite:" + dir_ +
                             "/quiet.db " + flags,
                         quiet);
    ASSERT_FALSE(WaitForMatch(quiet, std::regex("listening on")).empty()) << ReadFile(quiet);
    Stop(p);
    EXPECT_FALSE(Has(ReadFile(quiet), "WARNING")) << flags << "\n" << ReadFile(quiet);
  }
}

// The node agent registers and heartbeats over TLS. The controller is killed with -9 while a
// tenant allocates over TLS with its own token and request ids, and restarted on the same port:
// the agent carries on with the new process (heartbeats, its vGPUs kept, no tenant signalled),
// every acknowledged allocation is still there, retrying every request makes no second
// allocation, and GPU usage equals the allocations'.
TEST_F(TlsControllerTest, AnAgentOverTlsReconnectsAfterKillNineAndNothingIsLost) {
  std::string url = StartController(0);
  ASSERT_FALSE(url.empty()) << ReadFile(dir_ + "/controller.log");
  const int port = std::stoi(url.substr(url.rfind(':') + 1));
  const std::string ca = dir_ + "/ca.pem";
  const std::string agent_log = dir_ + "/agent.log";
  agent_ = Background("env TFUSION_SHM_DIR=" + dir_ + "/shm FAKECUDA_SHM_NAME=/tf-tls-" + std::to_string(getpid()) +
                          " LD_LIBRARY_PATH=" + TF_FAKECUDA_DIR + " " + TF_TFUSION + " hypervisor --controller " + url +
                          " --ca-file " + ca + " --token tok --node tls-node --metrics-port 0 --credential-file " +
                          dir_ + "/credential",
                      agent_log);
  const std::string metrics_url = WaitForMatch(agent_log, std::regex("metrics at (http://127\\.0\\.0\\.1:[0-9]+)"));
  ASSERT_FALSE(metrics_url.empty()) << ReadFile(agent_log);
  ASSERT_FALSE(WaitForMatch(agent_log, std::regex("node tls-node registered with https://")).empty())
      << ReadFile(agent_log);
  HttpClient metrics(metrics_url, "");  // the agent's metrics stay plain HTTP
  auto counter = [&](const std::string& name) -> long {
    auto r = metrics.Get("/metrics");
    if (!r.ok()) return -1;
    std::smatch m;
    if (!std::regex_search(r->body, m, std::regex(name + " ([0-9]+)"))) return -1;
    return std::stol(m.str(1));
  };

  // The first heartbeat (every 5 s) over TLS, before the kill.
  long beats_before = -1;
  for (int i = 0; i < 160 && beats_before < 1; ++i) {
    beats_before = counter("tf_node_heartbeats_total\\{[^}]*result=\"ok\"[^}]*\\}");
    if (beats_before < 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(beats_before, 1) << ReadFile(agent_log);

  // A tenant (its own token, role and quota checked on every call) allocates with a request id,
  // as `tfusion run --controller` does.
  std::string tenant_token;
  {
    HttpClient admin(url, "tok", 5000, ca);
    auto q = admin.Put("/v1/quotas/kill9", R"({"max_tflops":100000,"max_vram_mib":100000000,"max_gpus":0})");
    ASSERT_TRUE(q.ok() && q->status == 200) << (q.ok() ? q->body : q.status().ToString());
    auto t = admin.Post("/v1/tokens", R"({"role":"tenant","tenant":"kill9","description":"kill -9 test"})");
    ASSERT_TRUE(t.ok() && t->status == 201) << (t.ok() ? t->body : t.status().ToString());
    tenant_token = json::parse(t->body)["token"].get<std::string>();
  }
  auto body_for = [](const std::string& key) {
    return std::string(R"({"percent":1,"vram_mib":16,"request_id":")") + key + "\"}";
  };
  std::map<std::string, std::string> acked_by_key;  // request id -> allocation id
  std::set<std::string> acked, unanswered;           // allocation ids; request ids without an answer
  std::mutex mu;
  std::atomic<bool> stop{false};
  std::thread allocator([&] {
    HttpClient client(url, tenant_token, 2000, ca);
    for (int n = 0; !stop.load(); ++n) {
      const std::string key = "kill9-" + std::to_string(n);
      auto r = client.Post("/v1/allocations", body_for(key));
      std::lock_guard<std::mutex> lock(mu);
      if (r.ok() && r->status == 201) {
        const std::string id = json::parse(r->body)["id"].get<std::string>();
        acked.insert(id);
        acked_by_key[key] = id;
      } else if (!r.ok()) {
        unanswered.insert(key);  // the write may or may not have landed
      }
    }
  });
  for (int i = 0; i < 400; ++i) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (acked.size() >= 15) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Stop(controller_, SIGKILL);
  stop.store(true);
  allocator.join();
  ASSERT_GE(acked.size(), 15u) << ReadFile(dir_ + "/controller.log");
  beats_before = counter("tf_node_heartbeats_total\\{[^}]*result=\"ok\"[^}]*\\}");

  url = StartController(port);
  ASSERT_FALSE(url.empty()) << ReadFile(dir_ + "/controller.log");
  HttpClient client(url, "tok", 5000, ca);
  auto listed = client.Get("/v1/allocations");
  ASSERT_TRUE(listed.ok() && listed->status == 200) << (listed.ok() ? listed->body : listed.status().ToString());
  std::set<std::string> stored;
  double used_by_allocations = 0;
  const json allocations = json::parse(listed->body)["allocations"];
  for (const json& a : allocations) {
    stored.insert(a["id"].get<std::string>());
    for (const json& v : a["vgpus"]) used_by_allocations += v["tflops"].get<double>();
  }
  for (const std::string& id : acked) EXPECT_TRUE(stored.count(id)) << id << " was acknowledged but lost";
  // Retrying every request (acknowledged or not) with its id duplicates nothing: an acknowledged
  // one replays its allocation, an unanswered one either replays what landed or makes it once.
  {
    HttpClient tenant(url, tenant_token, 5000, ca);
    std::set<std::string> after_retry;
    for (const auto& [key, id] : acked_by_key) {
      auto r = tenant.Post("/v1/allocations", body_for(key));
      ASSERT_TRUE(r.ok() && r->status == 200) << key << ": " << (r.ok() ? r->body : r.status().ToString());
      EXPECT_EQ(json::parse(r->body)["id"].get<std::string>(), id) << key;
      EXPECT_TRUE(json::parse(r->body).value("replayed", false)) << r->body;
      after_retry.insert(id);
    }
    for (const std::string& key : unanswered) {
      auto r = tenant.Post("/v1/allocations", body_for(key));
      ASSERT_TRUE(r.ok()) << key << ": " << r.status().ToString();
      if (r->status == 200 || r->status == 201) {
        after_retry.insert(json::parse(r->body)["id"].get<std::string>());
      } else {  // it never landed, and the GPUs are full by now
        EXPECT_NE(r->body.find("has room"), std::string::npos) << key << ": " << r->body;
      }
    }
    auto mine = tenant.Get("/v1/allocations");
    ASSERT_TRUE(mine.ok() && mine->status == 200);
    const size_t n = json::parse(mine->body)["allocations"].size();
    EXPECT_EQ(n, after_retry.size()) << "one allocation per request id, none twice";
    listed = client.Get("/v1/allocations");
    ASSERT_TRUE(listed.ok() && listed->status == 200);
    stored.clear();
    used_by_allocations = 0;
    const json relisted = json::parse(listed->body)["allocations"];
    for (const json& a : relisted) {
      stored.insert(a["id"].get<std::string>());
      for (const json& v : a["vgpus"]) used_by_allocations += v["tflops"].get<double>();
    }
  }
  double used_on_gpus = 0;
  const json gpus = json::parse(client.Get("/v1/gpus")->body)["gpus"];
  for (const json& g : gpus) used_on_gpus += g["used_tflops"].get<double>();
  EXPECT_NEAR(used_on_gpus, used_by_allocations, 1e-6);

  // The agent heartbeats to the new process over TLS and keeps one vGPU per allocation.
  bool beat = false;
  for (int i = 0; i < 240 && !beat; ++i) {
    beat = counter("tf_node_heartbeats_total\\{[^}]*result=\"ok\"[^}]*\\}") > beats_before;
    if (!beat) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(beat) << ReadFile(agent_log);
  auto node = client.Get("/v1/nodes/tls-node");
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(json::parse(node->body).value("state", ""), "ready") << node->body;
  bool synced = false;
  for (int i = 0; i < 100 && !synced; ++i) {
    synced = counter("tf_node_vgpus\\{[^}]*\\}") == static_cast<long>(stored.size());
    if (!synced) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(synced) << "agent vGPUs " << counter("tf_node_vgpus\\{[^}]*\\}") << ", allocations " << stored.size();
  // No tenant was signalled (the family has no SIGTERM series at all, or a zero one).
  EXPECT_LE(counter("tf_node_process_signals_total\\{[^}]*signal=\"SIGTERM\"[^}]*\\}"), 0);
  EXPECT_FALSE(Has(ReadFile(agent_log), "not accepted")) << ReadFile(agent_log);
}

// `tfusion up --tls`: one flag gives this machine an HTTPS API; the banner names the CA, client
// commands and `tfusion run --controller` work with it and refuse without it (no fallback), and
// a restart keeps the CA.
TEST(UpTls, OneFlagServesHttpsAndRunWorksOverIt) {
  char tmpl[] = "/tmp/tf-uptls-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string env = "TFUSION_SHM_DIR=" + dir + "/shm FAKECUDA_SHM_NAME=/tf-uptls-" + std::to_string(getpid()) + " ";
  auto start = [&] {
    pid_t pid = fork();
    if (pid == 0) {
      if (chdir(dir.c_str()) != 0) _exit(126);
      std::string cmd = "exec env " + env + "LD_LIBRARY_PATH=" + TF_FAKECUDA_DIR + " " + TF_TFUSION +
                        " up --tls --port 0 --metrics-port 0 >> up.log 2>&1";
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    return pid;
  };
  pid_t up = start();
  const std::string url = WaitForMatch(dir + "/up.log", std::regex("controller: (https://127\\.0\\.0\\.1:[0-9]+)"));
  ASSERT_FALSE(url.empty()) << ReadFile(dir + "/up.log");
  const std::string ca = dir + "/.tfusion/tls/ca.pem";
  EXPECT_TRUE(Has(ReadFile(dir + "/up.log"), "ca:         " + ca)) << ReadFile(dir + "/up.log");
  EXPECT_TRUE(Has(ReadFile(dir + "/up.log"), "made the CA")) << ReadFile(dir + "/up.log");
  const std::string in_dir = "cd '" + dir + "' && env -u TFUSION_TOKEN -u TFUSION_CA_FILE " + env;
  bool ready = false;
  for (int i = 0; i < 200 && !ready; ++i) {
    Result r = Shell(in_dir + TF_TFUSION + " node ls --url " + url + " --ca-file " + ca);
    ready = Has(r.out, "ready") && Has(r.out, "989.4");
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(ready) << ReadFile(dir + "/up.log");

  auto pooled = [&](const std::string& ca_flag) {
    std::string token = ReadFile(dir + "/.tfusion/token");
    while (!token.empty() && token.back() == '\n') token.pop_back();
    return Shell(in_dir + TF_TFUSION + " run --controller " + url + " --token " + token + " " + ca_flag +
                 " --driver " + TF_FAKECUDA + " --nvml " + TF_FAKENVML + " --vram 1GiB --percent 50 -- " + TF_PROBE +
                 " alloc");
  };
  Result r = pooled("--ca-file " + ca);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(Has(r.out, "allocated_mib=1024")) << r.out;
  EXPECT_TRUE(Has(r.out, "allocation a-")) << r.out;
  Result refused = pooled("");
  EXPECT_NE(refused.rc, 0) << refused.out;
  EXPECT_TRUE(Has(refused.out, "not accepted")) << refused.out;
  EXPECT_FALSE(Has(refused.out, "using a local vGPU")) << refused.out;
  EXPECT_FALSE(Has(refused.out, "allocated_mib")) << "the command ran anyway: " << refused.out;

  // A restart keeps the CA (clients keep their --ca-file) and the server certificate.
  const std::string ca_pem = ReadFile(ca);
  kill(up, SIGTERM);
  waitpid(up, nullptr, 0);
  const size_t from = ReadFile(dir + "/up.log").size();
  up = start();
  const std::string url2 =
      WaitForMatch(dir + "/up.log", std::regex("controller: (https://127\\.0\\.0\\.1:[0-9]+)"), 15000, from);
  ASSERT_FALSE(url2.empty()) << ReadFile(dir + "/up.log");
  const std::string second = ReadFile(dir + "/up.log").substr(from);
  EXPECT_TRUE(Has(second, "using the CA")) << second;
  EXPECT_TRUE(Has(second, "kept the server certificate")) << second;
  EXPECT_EQ(ReadFile(ca), ca_pem);
  Result again = Shell(in_dir + TF_TFUSION + " ps --url " + url2 + " --ca-file " + ca);
  EXPECT_EQ(again.rc, 0) << again.out;
  kill(up, SIGTERM);
  waitpid(up, nullptr, 0);
  EXPECT_EQ(system(("rm -rf '" + dir + "'").c_str()), 0);
  tf::cli::testing::RemoveFakeDriverShm("tf-uptls-" + std::to_string(getpid()));
}

}  // namespace
