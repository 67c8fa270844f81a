// The remote worker's TCP listener, authenticated and encrypted, end to end on the fake driver:
// remote_probe through the client stub and a tfusion-worker, with a relay in between that records
// every byte each side sends (what someone on the network would see). Asserted: the token and a
// ticket's secret part never cross the wire, a wrong one is refused, a captured handshake cannot
// be replayed, a version 1 client is told why it is refused, TLS with the right CA runs copies
// and kernels and hides them, a wrong CA, a plaintext client and a missing OpenSSL fail with a
// message that says so, and a plaintext worker off loopback warns at start.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "child_process.h"
#include "controller/self_signed_ca.h"
#include "transport/handshake.h"
#include "transport/tcp_transport.h"
#include "transport/wire.h"
#include "worker/session_ticket.h"

namespace {

using tf::testing::Child;
using tf::testing::ParseKv;
using tf::testing::Result;
namespace tp = tf::transport;

constexpr const char* kToken = "worker-token-5e4f8a";

int ConnectTo(const std::string& host_port) {
  tp::HostPort hp;
  if (!tp::ParseHostPort(host_port.c_str(), &hp).ok()) return -1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(hp.port);
  inet_pton(AF_INET, hp.host, &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Listens on 127.0.0.1 and relays each connection to `target`, keeping a copy of what each side
// sent.
class Relay {
 public:
  explicit Relay(std::string target) : target_(std::move(target)) {
    lfd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(lfd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(lfd_, 8);
    socklen_t len = sizeof(a);
    getsockname(lfd_, reinterpret_cast<sockaddr*>(&a), &len);
    address_ = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    thread_ = std::thread([this] { Run(); });
  }
  ~Relay() {
    stop_ = true;
    thread_.join();
    close(lfd_);
  }
  const std::string& address() const { return address_; }
  std::string from_client() {
    std::lock_guard<std::mutex> l(mu_);
    return up_;
  }
  std::string from_worker() {
    std::lock_guard<std::mutex> l(mu_);
    return down_;
  }

 private:
  void Run() {
    std::vector<std::pair<int, int>> pairs;  // client, worker
    while (!stop_) {
      std::vector<pollfd> p{{lfd_, POLLIN, 0}};
      for (auto& [c, w] : pairs) {
        p.push_back({c, POLLIN, 0});
        p.push_back({w, POLLIN, 0});
      }
      if (poll(p.data(), p.size(), 20) <= 0) continue;
      if (p[0].revents & POLLIN) {
        int c = accept4(lfd_, nullptr, nullptr, SOCK_CLOEXEC);
        int w = ConnectTo(target_);
        if (c >= 0 && w >= 0) pairs.emplace_back(c, w);
      }
      for (size_t i = 0; i < pairs.size(); ++i) {
        auto [c, w] = pairs[i];
        for (int dir = 0; dir < 2; ++dir) {
          if (!(p[1 + 2 * i + dir].revents & (POLLIN | POLLHUP | POLLERR))) continue;
          char buf[1 << 16];
          ssize_t n = read(dir == 0 ? c : w, buf, sizeof(buf));
          if (n <= 0) {
            shutdown(dir == 0 ? w : c, SHUT_WR);
            continue;
          }
          {
            std::lock_guard<std::mutex> l(mu_);
            (dir == 0 ? up_ : down_).append(buf, static_cast<size_t>(n));
          }
          for (ssize_t off = 0; off < n;) {
            ssize_t m = write(dir == 0 ? w : c, buf + off, static_cast<size_t>(n - off));
            if (m <= 0) break;
            off += m;
          }
        }
      }
    }
    for (auto& [c, w] : pairs) {
      close(c);
      close(w);
    }
  }

  std::string target_, address_;
  int lfd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::string up_, down_;
};

class RemoteAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tf-remote-auth-XXXXXX";
    dir_ = mkdtemp(tmpl);
    // One fake device board per test: TearDown removes it, and a later test of this process must not
    // read the removed one through the fake NVML it keeps loaded.
    static int tests = 0;
    shm_name_ = "/tf-ra-" + std::to_string(getpid()) + "-" + std::to_string(++tests);
  }
  void TearDown() override {
    StopWorker();
    std::string cmd = "rm -rf '" + dir_ + "' /dev/shm" + shm_name_ + "*";
    EXPECT_EQ(system(cmd.c_str()), 0);
  }

  // A CA and a server certificate for 127.0.0.1 in dir_/name (what `tfusion up --tls` makes).
  tf::controller::SelfSignedTls MakeTls(const std::string& name) {
    auto tls = tf::controller::EnsureSelfSignedTls(dir_ + "/" + name, {"127.0.0.1", "localhost"},
                                                   time(nullptr));
    EXPECT_TRUE(tls.ok()) << tls.status().message();
    return *tls;
  }

  void StartWorker(const std::string& listen, const std::vector<std::string>& extra = {}) {
    std::string ready = dir_ + "/ready";
    std::vector<std::string> argv = {TF_WORKER, "--listen", listen, "--token", kToken, "--driver",
                                     TF_FAKECUDA, "--ready-file", ready};
    argv.insert(argv.end(), extra.begin(), extra.end());
    worker_.Start(argv, {"FAKECUDA_SHM_NAME=" + shm_name_});
    for (int i = 0; i < 500; ++i) {
      std::ifstream in(ready);
      std::string kind, addr;
      if (in >> kind >> addr) {
        tcp_ = addr;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    FAIL() << "the worker did not become ready: " << worker_.out;
  }
  void StopWorker() {
    if (worker_.pid > 0) {
      kill(worker_.pid, SIGTERM);
      if (worker_.Wait(5000) < 0) kill(worker_.pid, SIGKILL);
    }
  }
  // A port on 0.0.0.0 is dialled on loopback.
  std::string Dialled() const {
    return tcp_.rfind("0.0.0.0:", 0) == 0 ? "127.0.0.1:" + tcp_.substr(8) : tcp_;
  }

  // remote_probe with the stub injected by hand.
  Result Probe(const std::string& addr, const std::string& mode, const std::string& token,
               const std::vector<std::string>& env = {}) {
    Child c;
    std::vector<std::string> e = {std::string("LD_LIBRARY_PATH=") + TF_CLIENT_INJECT,
                                  "TFUSION_REMOTE=" + addr, "TFUSION_TOKEN=" + token};
    e.insert(e.end(), env.begin(), env.end());
    c.Start({TF_PROBE, mode}, e);
    Result r;
    r.rc = c.Wait(60000);
    r.out = c.out;
    ParseKv(&r);
    return r;
  }

  std::string dir_, shm_name_, tcp_;
  Child worker_;
};

bool Contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// The frames at the start of a byte stream (header + payload each).
std::vector<std::string> Frames(const std::string& bytes, size_t count) {
  std::vector<std::string> out;
  size_t off = 0;
  while (out.size() < count && off + tp::kFrameHeaderSize <= bytes.size()) {
    tp::FrameHeader h;
    if (tp::DecodeFrameHeader(reinterpret_cast<const uint8_t*>(bytes.data() + off),
                              tp::kFrameHeaderSize, &h) != tp::WireError::kOk) {
      break;
    }
    const size_t n = tp::kFrameHeaderSize + h.payload_length;
    out.push_back(bytes.substr(off, n));
    off += n;
  }
  return out;
}

// Reads one handshake frame from fd (blocking, with a timeout).
bool ReadFrame(int fd, tp::FrameHeader* h, std::string* payload) {
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  uint8_t hdr[tp::kFrameHeaderSize];
  if (recv(fd, hdr, sizeof(hdr), MSG_WAITALL) != static_cast<ssize_t>(sizeof(hdr))) return false;
  if (tp::DecodeFrameHeader(hdr, sizeof(hdr), h) != tp::WireError::kOk) return false;
  payload->resize(h->payload_length);
  return h->payload_length == 0 ||
         recv(fd, payload->data(), h->payload_length, MSG_WAITALL) ==
             static_cast<ssize_t>(h->payload_length);
}

TEST_F(RemoteAuthTest, TheTokenNeverCrossesTheWireAndAWrongOneIsRefused) {
  StartWorker("127.0.0.1:0");
  Relay relay(tcp_);
  Result wrong = Probe(relay.address(), "init", "wrong-token-77c1");
  EXPECT_EQ(wrong.kv["init"], "800") << wrong.out;  // CUDA_ERROR_NOT_PERMITTED
  EXPECT_TRUE(Contains(wrong.out, "bad_token")) << wrong.out;
  Result right = Probe(relay.address(), "basic", kToken);
  ASSERT_EQ(right.rc, 0) << right.out;
  EXPECT_EQ(right.kv["done"], "1");
  const std::string sent = relay.from_client() + relay.from_worker();
  ASSERT_GT(sent.size(), 1000u);
  EXPECT_FALSE(Contains(sent, "wrong-token-77c1"));
  EXPECT_FALSE(Contains(sent, kToken));
}

TEST_F(RemoteAuthTest, ASessionTicketsSecretPartNeverCrossesTheWire) {
  StartWorker("127.0.0.1:0");
  Relay relay(tcp_);
  const std::string ticket = tf::worker::MintSessionTicket(kToken, time(nullptr) + 600);
  const std::string mac = ticket.substr(ticket.rfind('.') + 1);
  Result r = Probe(relay.address(), "init", ticket);
  EXPECT_EQ(r.kv["init"], "0") << r.out;
  EXPECT_TRUE(Contains(relay.from_client(), ticket.substr(0, ticket.rfind('.'))))
      << "the ticket's id is what the client names";
  EXPECT_FALSE(Contains(relay.from_client() + relay.from_worker(), mac));
  // An expired ticket is refused.
  Result old = Probe(tcp_, "init", tf::worker::MintSessionTicket(kToken, time(nullptr) - 1));
  EXPECT_EQ(old.kv["init"], "800") << old.out;
  EXPECT_TRUE(Contains(old.out, "session ticket")) << old.out;
}

TEST_F(RemoteAuthTest, ReplayingACapturedHandshakeIsRefused) {
  StartWorker("127.0.0.1:0");
  Relay relay(tcp_);
  Result r = Probe(relay.address(), "init", kToken);
  ASSERT_EQ(r.kv["init"], "0") << r.out;
  std::vector<std::string> frames = Frames(relay.from_client(), 2);  // hello, proof
  ASSERT_EQ(frames.size(), 2u);

  int fd = ConnectTo(tcp_);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, frames[0].data(), frames[0].size()), static_cast<ssize_t>(frames[0].size()));
  tp::FrameHeader h;
  std::string payload;
  ASSERT_TRUE(ReadFrame(fd, &h, &payload));
  EXPECT_EQ(h.opcode, static_cast<uint16_t>(tp::Opcode::kAuthChallenge)) << "a fresh challenge";
  ASSERT_EQ(write(fd, frames[1].data(), frames[1].size()), static_cast<ssize_t>(frames[1].size()));
  ASSERT_TRUE(ReadFrame(fd, &h, &payload));
  ASSERT_EQ(h.opcode, static_cast<uint16_t>(tp::Opcode::kHandshakeRefused));
  tp::Refusal refusal;
  ASSERT_EQ(tp::DecodeRefusal(reinterpret_cast<const uint8_t*>(payload.data()), payload.size(),
                              &refusal),
            tp::WireError::kOk);
  EXPECT_EQ(refusal.reason, static_cast<uint16_t>(tp::RefusalReason::kBadToken));
  EXPECT_TRUE(Contains(std::string(refusal.message, refusal.message_length), "replayed"));
  close(fd);
  EXPECT_TRUE(worker_.WaitFor("authentication failed", 5000)) << worker_.out;
}

TEST_F(RemoteAuthTest, AVersion1ClientIsToldWhyItIsRefused) {
  StartWorker("127.0.0.1:0");
  // What a client of protocol version 1 sent: its range [1, 1] and the token itself.
  uint8_t body[256];
  tp::Writer w(body, sizeof(body));
  w.U16(1);
  w.U16(1);
  w.U64(tp::kKnownFeatures);
  w.U64(0);
  w.Blob(kToken, static_cast<uint32_t>(strlen(kToken)));
  w.U32(static_cast<uint32_t>(getpid()));
  w.Blob("old-host", 8);
  tp::FrameHeader fh;
  fh.version = 1;
  fh.opcode = static_cast<uint16_t>(tp::Opcode::kClientHello);
  fh.payload_length = static_cast<uint32_t>(w.size());
  std::string frame(tp::kFrameHeaderSize, '\0');
  tp::EncodeFrameHeader(fh, reinterpret_cast<uint8_t*>(frame.data()));
  frame.append(reinterpret_cast<const char*>(body), w.size());
  int fd = ConnectTo(tcp_);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, frame.data(), frame.size()), static_cast<ssize_t>(frame.size()));
  tp::FrameHeader h;
  std::string payload;
  ASSERT_TRUE(ReadFrame(fd, &h, &payload));
  close(fd);
  EXPECT_EQ(h.version, 1) << "a version 1 client can read the header";
  ASSERT_EQ(h.opcode, static_cast<uint16_t>(tp::Opcode::kHandshakeRefused));
  tp::Refusal refusal;
  ASSERT_EQ(tp::DecodeRefusal(reinterpret_cast<const uint8_t*>(payload.data()), payload.size(),
                              &refusal),
            tp::WireError::kOk);
  EXPECT_EQ(refusal.reason, static_cast<uint16_t>(tp::RefusalReason::kVersionMismatch));
  const std::string msg(refusal.message, refusal.message_length);
  EXPECT_TRUE(Contains(msg, "client speaks [1, 1], server speaks [2, 2]")) << msg;
}

TEST_F(RemoteAuthTest, TlsWithTheRightCaRunsCopiesAndKernelsAndHidesThem) {
  auto tls = MakeTls("tls");
  StartWorker("127.0.0.1:0", {"--tls-cert", tls.cert_file, "--tls-key", tls.key_file});
  Relay relay(tcp_);
  Result r = Probe(relay.address(), "basic", kToken, {"TFUSION_CA_FILE=" + tls.ca_file});
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.kv["done"], "1");
  EXPECT_EQ(r.kv["kernel_fill_ok"], "1");
  EXPECT_EQ(r.kv["htod_dtod_dtoh_equal"], "1");
  EXPECT_EQ(r.kv["device_name"], "Fake GPU H100");
  const std::string up = relay.from_client(), down = relay.from_worker();
  ASSERT_GT(up.size(), 4u << 20) << "the copies went through the relay";
  EXPECT_EQ(static_cast<uint8_t>(up[0]), 0x16) << "the client starts TLS";
  EXPECT_FALSE(Contains(up.substr(0, 4096), "TFRM")) << "no frame in clear";
  EXPECT_FALSE(Contains(down, "Fake GPU H100")) << "the session info is encrypted";
  EXPECT_TRUE(worker_.WaitFor("via tls (TLSv1.3", 5000)) << worker_.out;
}

TEST_F(RemoteAuthTest, TlsWithAWrongCaIsRefusedWithAClearError) {
  auto tls = MakeTls("tls");
  auto other = MakeTls("other");
  StartWorker("127.0.0.1:0", {"--tls-cert", tls.cert_file, "--tls-key", tls.key_file});
  Result r = Probe(tcp_, "init", kToken, {"TFUSION_CA_FILE=" + other.ca_file});
  EXPECT_EQ(r.kv["init"], "100") << r.out;  // CUDA_ERROR_NO_DEVICE
  EXPECT_TRUE(Contains(r.out, "the worker's certificate is not trusted")) << r.out;
  EXPECT_TRUE(Contains(r.out, other.ca_file)) << r.out;
  // The certificate must also name what the client dialled.
  Result by_name = Probe("localhost:" + tcp_.substr(tcp_.rfind(':') + 1), "init", kToken,
                         {"TFUSION_CA_FILE=" + tls.ca_file});
  EXPECT_EQ(by_name.kv["init"], "0") << by_name.out;
}

TEST_F(RemoteAuthTest, APlaintextClientOfATlsWorkerIsToldToUseTls) {
  auto tls = MakeTls("tls");
  StartWorker("127.0.0.1:0", {"--tls-cert", tls.cert_file, "--tls-key", tls.key_file});
  Result r = Probe(tcp_, "init", kToken);
  EXPECT_EQ(r.kv["init"], "100") << r.out;
  EXPECT_TRUE(Contains(r.out, "tls_required")) << r.out;
  EXPECT_TRUE(Contains(r.out, "TFUSION_CA_FILE")) << r.out;
}

TEST_F(RemoteAuthTest, ATlsClientOfAPlaintextWorkerOrWithoutOpenSslFailsClearly) {
  auto tls = MakeTls("tls");
  StartWorker("127.0.0.1:0");
  Result r = Probe(tcp_, "init", kToken, {"TFUSION_CA_FILE=" + tls.ca_file});
  EXPECT_EQ(r.kv["init"], "100") << r.out;
  EXPECT_TRUE(Contains(r.out, "--tls-cert")) << r.out;
  Result no_ssl = Probe(tcp_, "init", kToken,
                        {"TFUSION_CA_FILE=" + tls.ca_file, "TFUSION_LIBSSL=" + dir_ + "/libssl.so.3"});
  EXPECT_EQ(no_ssl.kv["init"], "100") << no_ssl.out;
  EXPECT_TRUE(Contains(no_ssl.out, "TLS needs OpenSSL 3")) << no_ssl.out;
}

TEST_F(RemoteAuthTest, APlaintextWorkerOffLoopbackWarnsAtStart) {
  StartWorker("0.0.0.0:0");
  EXPECT_TRUE(worker_.WaitFor("is reachable from the network and served without TLS", 5000))
      << worker_.out;
  Result r = Probe(Dialled(), "init", kToken);
  EXPECT_EQ(r.kv["init"], "0") << r.out;
  StopWorker();
  worker_ = Child();
  auto tls = MakeTls("tls");
  StartWorker("0.0.0.0:0", {"--tls-cert", tls.cert_file, "--tls-key", tls.key_file});
  EXPECT_TRUE(worker_.WaitFor("(TLS)", 5000)) << worker_.out;
  EXPECT_FALSE(Contains(worker_.out, "without TLS")) << worker_.out;
  StopWorker();
  worker_ = Child();
  StartWorker("127.0.0.1:0");
  EXPECT_TRUE(worker_.WaitFor("listening on", 5000)) << worker_.out;
  EXPECT_FALSE(Contains(worker_.out, "without TLS")) << worker_.out;
}

// A TCP connection to host_port from source address `from` (any 127.x.y.z is this machine).
int ConnectFrom(const char* from, const std::string& host_port) {
  tp::HostPort hp;
  if (!tp::ParseHostPort(host_port.c_str(), &hp).ok()) return -1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in src{};
  src.sin_family = AF_INET;
  inet_pton(AF_INET, from, &src.sin_addr);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(hp.port);
  inet_pton(AF_INET, hp.host, &a.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// True when the worker closes fd within timeout_ms (it reads end-of-file or a reset).
bool ClosedByPeerWithin(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return false;
  char c;
  return recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

// Peers that connect and never say anything (no token needed) hold up no other client: handshakes
// run in parallel (up to 64), and once half of them are under way a peer with 4 already has its
// further connections closed at once, and the worker says so. Before, a single spare shook hands
// with one connection at a time, and five silent connections kept every client out.
TEST_F(RemoteAuthTest, SilentConnectionsHoldUpNoOtherClient) {
  StartWorker("127.0.0.1:0");
  const auto first = std::chrono::steady_clock::now();
  std::vector<int> silent;
  for (int i = 0; i < 40; ++i) {
    int fd = ConnectFrom("127.0.0.2", tcp_);
    ASSERT_GE(fd, 0);
    silent.push_back(fd);
  }
  const auto t0 = std::chrono::steady_clock::now();
  Result r = Probe(tcp_, "basic", kToken);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.kv["done"], "1") << r.out;
  EXPECT_LT(took, 3.0) << "a client waited behind silent connections";
  // Until well before the handshakes' timeout (5 s), exactly the 8 beyond the first 32 are closed.
  std::set<int> turned_away;
  while (std::chrono::steady_clock::now() < first + std::chrono::milliseconds(3500)) {
    for (int fd : silent)
      if (!turned_away.count(fd) && ClosedByPeerWithin(fd, 0)) turned_away.insert(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(turned_away.size(), 8u) << "32 handshakes wait for their hello, the peer's others are closed";
  EXPECT_TRUE(worker_.WaitFor("turned away a connection from 127.0.0.2", 2000)) << worker_.out;
  // The silent ones run out at the handshake's timeout, and the peer may try again.
  int ended = 0;
  for (int fd : silent) ended += ClosedByPeerWithin(fd, 8000) ? 1 : 0;
  EXPECT_EQ(ended, 40);
  for (int fd : silent) close(fd);
  int again = ConnectFrom("127.0.0.2", tcp_);
  ASSERT_GE(again, 0);
  EXPECT_FALSE(ClosedByPeerWithin(again, 500)) << "the peer's handshakes were not given back";
  close(again);
}

// Connections that close at once (a port scanner, a health check, a flood) cost the worker no
// process each: the spare that accepted one goes on accepting. 300 of them make far fewer than
// 300 processes on the whole machine (the kernel's count of forks, /proc/stat), and a client's
// session starts as quickly afterwards.
TEST_F(RemoteAuthTest, ConnectionsThatCloseAtOnceCostNoProcessEach) {
  StartWorker("127.0.0.1:0");
  auto forks = [] {
    std::ifstream in("/proc/stat");
    std::string key;
    long long value = 0;
    while (in >> key) {
      if (key == "processes" && in >> value) return value;
      in.ignore(1 << 20, '\n');
    }
    return value;
  };
  const long long before = forks();
  for (int i = 0; i < 300; ++i) {
    int fd = ConnectFrom("127.0.0.3", tcp_);
    ASSERT_GE(fd, 0);
    close(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LT(forks() - before, 150) << worker_.out;
  const auto t0 = std::chrono::steady_clock::now();
  Result r = Probe(tcp_, "basic", kToken);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);
}

TEST_F(RemoteAuthTest, ABadCertificateOrKeyStopsTheWorkerAtStart) {
  auto tls = MakeTls("tls");
  auto other = MakeTls("other");
  Child w;
  w.Start({TF_WORKER, "--listen", "127.0.0.1:0", "--driver", TF_FAKECUDA, "--tls-cert",
           tls.cert_file, "--tls-key", other.key_file},
          {});
  EXPECT_EQ(w.Wait(10000), 2);
  EXPECT_TRUE(Contains(w.out, "does not belong to the certificate")) << w.out;
}

}  // namespace
