// Against a real etcd (started here on free ports with a temp data dir; skipped without the
// binary): the store's CAS, leader election, and failover of a kill -9'd leader process.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "controller/cli_commands.h"
#include "controller/etcd_store.h"
#include "controller/http_client.h"

namespace tf::controller {
namespace {

using nlohmann::json;

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

bool WaitFor(const std::function<bool()>& cond, int timeout_ms) {
  for (int t = 0; t < timeout_ms; t += 50) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return cond();
}

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access("/usr/bin/etcd", X_OK) != 0 && system("command -v etcd >/dev/null 2>&1") != 0)
      GTEST_SKIP() << "etcd is not installed";
    char tmpl[] = "/tmp/tfetcd-XXXXXX";
    dir_ = mkdtemp(tmpl);
    int client = FreePort(), peer = FreePort();
    url_ = "http://127.0.0.1:" + std::to_string(client);
    std::string peer_url = "http://127.0.0.1:" + std::to_string(peer);
    etcd_ = fork();
    if (etcd_ == 0) {
      std::string log = dir_ + "/etcd.log";
      freopen(log.c_str(), "w", stderr);
      freopen(log.c_str(), "a", stdout);
      execlp("etcd", "etcd", "--name", "t", "--data-dir", (dir_ + "/data").c_str(),
             "--listen-client-urls", url_.c_str(), "--advertise-client-urls", url_.c_str(),
             "--listen-peer-urls", peer_url.c_str(), "--initial-advertise-peer-urls",
             peer_url.c_str(), "--initial-cluster", ("t=" + peer_url).c_str(), nullptr);
      _exit(127);
    }
    store_ = std::make_unique<EtcdStore>(url_);
    ASSERT_TRUE(WaitFor([&] { return store_->Get("/probe").ok(); }, 15000)) << "etcd did not start";
  }
  void TearDown() override {
    for (pid_t p : children_) {
      kill(p, SIGKILL);
      waitpid(p, nullptr, 0);
    }
    if (etcd_ > 0) {
      kill(etcd_, SIGKILL);
      waitpid(etcd_, nullptr, 0);
    }
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  // A controller replica in its own process (so that it can be kill -9'd).
  pid_t StartController(int port, const std::string& identity) {
    pid_t pid = fork();
    if (pid == 0) {
      ControllerOptions o;
      o.port = port;
      o.store = "etcd:" + url_;
      o.token = "tok";
      o.identity = identity;
      o.leader_ttl_seconds = 2;
      _exit(RunController(o));
    }
    children_.push_back(pid);
    return pid;
  }

  std::string dir_, url_;
  pid_t etcd_ = -1;
  std::vector<pid_t> children_;
  std::unique_ptr<EtcdStore> store_;
};

TEST_F(EtcdTest, CompareAndSwap) {
  auto r1 = store_->Commit({Compare::Absent("/k")}, {Write::Put("/k", "v1")});
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  EXPECT_EQ(store_->Commit({Compare::Absent("/k")}, {Write::Put("/k", "x")}).status().code(),
            StatusCode::kAborted);
  auto r2 = store_->Commit({Compare::At("/k", *r1)}, {Write::Put("/k", "v2"), Write::Put("/kk", "y")});
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(store_->Commit({Compare::At("/k", *r1)}, {Write::Delete("/k")}).status().code(),
            StatusCode::kAborted);
  auto kv = store_->Get("/k");
  EXPECT_EQ((*kv)->value, "v2");
  EXPECT_EQ((*kv)->mod_revision, *r2);
  auto list = store_->List("/k");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 2u);
}

TEST_F(EtcdTest, LeaderElectionHasOneLeaderAndHandsOver) {
  EtcdLeaderElection a(store_.get(), "/tf/leader", "a", 2), b(store_.get(), "/tf/leader", "b", 2);
  EXPECT_TRUE(*a.TryAcquire());
  EXPECT_FALSE(*b.TryAcquire());
  EXPECT_EQ(*b.CurrentLeader(), "a");
  // The fence stops a writer that is not the leader.
  EXPECT_TRUE(store_->Commit({*a.Fence()}, {Write::Put("/x", "1")}).ok());
  a.Resign();
  EXPECT_FALSE(a.IsLeader());
  EXPECT_TRUE(*b.TryAcquire());
  EXPECT_EQ(store_->Commit({*a.Fence()}, {Write::Put("/x", "2")}).status().code(), StatusCode::kAborted);
  EXPECT_TRUE(store_->Commit({*b.Fence()}, {Write::Put("/x", "3")}).ok());
}

TEST_F(EtcdTest, KillNineOfTheLeaderLosesAndDuplicatesNothing) {
  const int p1 = FreePort(), p2 = FreePort();
  pid_t first = StartController(p1, "first");
  std::map<int, pid_t> pids{{p1, first}};
  std::map<int, std::unique_ptr<HttpClient>> clients;
  for (int p : {p1, p2}) clients[p] = std::make_unique<HttpClient>("http://127.0.0.1:" + std::to_string(p), "tok", 2000);
  auto serving = [&](int p) {
    auto r = clients[p]->Get("/healthz");
    return r.ok() && r->status == 200 && json::parse(r->body).value("serving", false);
  };
  ASSERT_TRUE(WaitFor([&] { return serving(p1); }, 10000));
  pids[p2] = StartController(p2, "second");
  ASSERT_TRUE(WaitFor([&] { return clients[p2]->Get("/healthz").ok(); }, 10000));
  EXPECT_FALSE(serving(p2));  // a standby
  // It answers no request from its (empty) state, reads included, and names the leader.
  for (const char* path : {"/v1/allocations", "/v1/nodes", "/v1/gpus"}) {
    auto r = clients[p2]->Get(path);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->status, 503) << path << ": " << r->body;
    EXPECT_EQ(r->get_header_value("X-TF-Leader"), "first") << path;
    EXPECT_NE(r->body.find("not the leader"), std::string::npos) << r->body;
  }
  // A token made at the leader (a node agent's, a tenant's) is sent on to the leader by the
  // standby too, not refused as unknown: its holder then tries the next replica.
  auto made = clients[p1]->Post("/v1/tokens", R"({"role":"tenant","tenant":"alice"})");
  ASSERT_EQ(made->status, 201) << made->body;
  const std::string alice = json::parse(made->body)["token"].get<std::string>();
  auto sent_on = HttpClient("http://127.0.0.1:" + std::to_string(p2), alice, 2000).Get("/v1/allocations");
  ASSERT_TRUE(sent_on.ok()) << sent_on.status().ToString();
  EXPECT_EQ(sent_on->status, 503) << sent_on->body;
  EXPECT_EQ(sent_on->get_header_value("X-TF-Leader"), "") << "a token the standby cannot verify is not told the leader";
  EXPECT_NE(sent_on->body.find("not the leader: send requests to another replica"), std::string::npos)
      << sent_on->body;
  EXPECT_EQ(HttpClient("http://127.0.0.1:" + std::to_string(p1), alice, 2000).Get("/v1/allocations")->status, 200);

  json node = {{"name", "n1"}, {"gpus", json::array()}};
  for (int g = 0; g < 4; ++g)
    node["gpus"].push_back({{"uuid", "GPU-" + std::to_string(g)}, {"tflops", 100.0}, {"vram_mib", 1000}});
  ASSERT_EQ(clients[p1]->Post("/v1/nodes", node.dump())->status, 200);
  std::set<std::string> acked;
  for (int i = 0; i < 20; ++i) {
    auto r = clients[p1]->Post("/v1/allocations", R"({"tflops":10,"vram_mib":10})");
    ASSERT_EQ(r->status, 201) << r->body;
    acked.insert(json::parse(r->body)["id"].get<std::string>());
  }
  kill(first, SIGKILL);
  waitpid(first, nullptr, 0);
  children_.erase(children_.begin());
  ASSERT_TRUE(WaitFor([&] { return serving(p2); }, 15000)) << "the standby never took over";

  auto r = clients[p2]->Get("/v1/allocations");
  std::set<std::string> stored;
  const json listed = json::parse(r->body);
  for (const json& a : listed["allocations"]) stored.insert(a["id"].get<std::string>());
  EXPECT_EQ(stored, acked);
  // Fill the rest: 400 TFLOPS in all, 200 taken; exactly 20 more fit, never more.
  int granted = 0;
  for (int i = 0; i < 25; ++i) {
    auto a = clients[p2]->Post("/v1/allocations", R"({"tflops":10,"vram_mib":10})");
    if (a->status == 201) ++granted;
    else EXPECT_EQ(a->status, 409) << a->body;
  }
  EXPECT_EQ(granted, 20);
  const json gpus = json::parse(clients[p2]->Get("/v1/gpus")->body);
  for (const json& g : gpus["gpus"])
    EXPECT_LE(g["used_tflops"].get<double>(), g["tflops"].get<double>() + 1e-9);
}

}  // namespace
}  // namespace tf::controller
