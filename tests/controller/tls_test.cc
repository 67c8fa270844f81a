// TLS of the controller's API in one process: the checks of the server's files, the CA that
// `tfusion up --tls` makes (verified with the openssl command, not with our own code), and the
// HTTPS server against the HTTP client: the right CA works, any other CA, a certificate that
// does not name the host and plain HTTP all fail, each with a message saying so.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>
#include <fstream>
#include <sstream>

#include "controller/api_server.h"
#include "controller/http_client.h"
#include "controller/self_signed_ca.h"
#include "controller/sqlite_store.h"
#include "controller/tls_files.h"
#include "test_cluster.h"

namespace tf::controller {
namespace {

constexpr int64_t kDay = 86400;

int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Output and exit status of a shell command.
std::pair<int, std::string> Sh(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[1024];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

mode_t Mode(const std::string& path) {
  struct stat st {};
  stat(path.c_str(), &st);
  return st.st_mode & 0777;
}

bool Has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

TEST(SelfSignedTls, MakesACaAndAServerCertificateThatOpensslAccepts) {
  testing::TempDir dir;
  auto made = EnsureSelfSignedTls(dir.path() + "/tls", {"localhost", "127.0.0.1", "::1", "gpu-head.example"}, Now());
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_TRUE(made->ca_created);
  EXPECT_TRUE(made->cert_issued);
  EXPECT_EQ(Mode(dir.path() + "/tls"), 0700u);
  EXPECT_EQ(Mode(dir.path() + "/tls/ca.key"), 0600u);
  EXPECT_EQ(Mode(made->key_file), 0600u);
  auto [rc, out] = Sh("openssl verify -CAfile " + made->ca_file + " " + made->cert_file);
  EXPECT_EQ(rc, 0) << out;
  auto [rc2, text] = Sh("openssl x509 -noout -ext subjectAltName,basicConstraints,extendedKeyUsage -in " + made->cert_file);
  ASSERT_EQ(rc2, 0) << text;
  for (const char* name : {"DNS:localhost", "IP Address:127.0.0.1", "IP Address:0:0:0:0:0:0:0:1", "DNS:gpu-head.example",
                           "CA:FALSE", "TLS Web Server Authentication"})
    EXPECT_TRUE(Has(text, name)) << name << "\n" << text;
  auto [rc3, ca] = Sh("openssl x509 -noout -ext basicConstraints -in " + made->ca_file);
  EXPECT_TRUE(Has(ca, "CA:TRUE")) << ca;
  EXPECT_TRUE(CheckServerTls({made->cert_file, made->key_file}, Now()).ok());
}

TEST(SelfSignedTls, KeepsTheCaAndReissuesTheServerCertificateOnlyWhenNeeded) {
  testing::TempDir dir;
  const std::string tls = dir.path() + "/tls";
  auto first = EnsureSelfSignedTls(tls, {"localhost", "127.0.0.1"}, Now());
  ASSERT_TRUE(first.ok());
  const std::string ca = Slurp(first->ca_file), cert = Slurp(first->cert_file);

  auto again = EnsureSelfSignedTls(tls, {"localhost", "127.0.0.1"}, Now());
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->ca_created);
  EXPECT_FALSE(again->cert_issued);
  EXPECT_EQ(Slurp(again->cert_file), cert);

  // A new listen address: a new server certificate from the same CA (clients keep working).
  auto moved = EnsureSelfSignedTls(tls, {"localhost", "127.0.0.1", "10.1.2.3"}, Now());
  ASSERT_TRUE(moved.ok());
  EXPECT_FALSE(moved->ca_created);
  EXPECT_TRUE(moved->cert_issued);
  EXPECT_EQ(Slurp(moved->ca_file), ca);
  EXPECT_TRUE(Has(Sh("openssl x509 -noout -ext subjectAltName -in " + moved->cert_file).second, "10.1.2.3"));
  EXPECT_EQ(Sh("openssl verify -CAfile " + moved->ca_file + " " + moved->cert_file).first, 0);

  // Less than 30 days left (as seen 340 days from now): re-issued.
  auto late = EnsureSelfSignedTls(tls, {"localhost", "127.0.0.1", "10.1.2.3"}, Now() + 340 * kDay);
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(late->cert_issued);
  EXPECT_EQ(Slurp(late->ca_file), ca);
}

TEST(SelfSignedTls, NeverReplacesABrokenCaAndRefusesBadNames) {
  testing::TempDir dir;
  const std::string tls = dir.path() + "/tls";
  auto bad = EnsureSelfSignedTls(tls, {"localhost", "no spaces/allowed"}, Now());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(bad.status().message(), "no spaces/allowed")) << bad.status().message();
  ASSERT_TRUE(EnsureSelfSignedTls(tls, {"localhost"}, Now()).ok());
  const std::string ca = Slurp(tls + "/ca.pem");
  ASSERT_EQ(std::remove((tls + "/ca.key").c_str()), 0);
  auto half = EnsureSelfSignedTls(tls, {"localhost"}, Now());
  EXPECT_EQ(half.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(half.status().message(), "ca.key")) << half.status().message();
  EXPECT_EQ(Slurp(tls + "/ca.pem"), ca);  // untouched
}

TEST(ServerNames, CoverLoopbackAndTheListenAddress) {
  auto names = ServerNamesFor("10.0.0.7");
  EXPECT_EQ(names, (std::vector<std::string>{"localhost", "127.0.0.1", "::1", "10.0.0.7"}));
  auto any = ServerNamesFor("0.0.0.0");
  EXPECT_GE(any.size(), 3u);
  for (const std::string& n : any) EXPECT_NE(n, "0.0.0.0");
}

TEST(TlsFiles, ServerFilesAreCheckedWithAClearMessage) {
  testing::TempDir dir;
  auto a = EnsureSelfSignedTls(dir.path() + "/a", {"localhost"}, Now());
  auto b = EnsureSelfSignedTls(dir.path() + "/b", {"localhost"}, Now());
  ASSERT_TRUE(a.ok() && b.ok());
  auto ok = CheckServerTls({a->cert_file, a->key_file}, Now());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(Has(*ok, "valid until")) << *ok;

  auto only_cert = CheckServerTls({a->cert_file, ""}, Now());
  EXPECT_TRUE(Has(only_cert.status().message(), "--tls-key")) << only_cert.status().message();
  auto missing = CheckServerTls({dir.path() + "/nope.pem", a->key_file}, Now());
  EXPECT_TRUE(Has(missing.status().message(), dir.path() + "/nope.pem")) << missing.status().message();
  EXPECT_TRUE(Has(missing.status().message(), "No such file")) << missing.status().message();
  auto swapped = CheckServerTls({a->key_file, a->cert_file}, Now());
  EXPECT_TRUE(Has(swapped.status().message(), "no PEM certificate")) << swapped.status().message();
  auto mismatch = CheckServerTls({a->cert_file, b->key_file}, Now());
  EXPECT_TRUE(Has(mismatch.status().message(), "does not belong")) << mismatch.status().message();
  auto expired = CheckServerTls({a->cert_file, a->key_file}, Now() + 400 * kDay);
  EXPECT_TRUE(Has(expired.status().message(), "expired")) << expired.status().message();
  auto early = CheckServerTls({a->cert_file, a->key_file}, Now() - 2 * kDay);
  EXPECT_TRUE(Has(early.status().message(), "not valid before")) << early.status().message();
  for (const auto* s : {&only_cert, &missing, &swapped, &mismatch, &expired, &early})
    EXPECT_EQ(s->status().code(), StatusCode::kInvalidArgument);

  EXPECT_TRUE(CheckCaFile(a->ca_file).ok());
  EXPECT_TRUE(Has(CheckCaFile(a->key_file).message(), "no PEM certificate"));
  EXPECT_TRUE(Has(CheckCaFile(dir.path() + "/none").message(), "--ca-file"));
}

TEST(TlsFiles, LoopbackHosts) {
  for (const char* h : {"127.0.0.1", "127.1.2.3", "::1", "localhost"}) EXPECT_TRUE(IsLoopbackHost(h)) << h;
  for (const char* h : {"0.0.0.0", "10.0.0.1", "::", "gpu-head", "128.0.0.1"}) EXPECT_FALSE(IsLoopbackHost(h)) << h;
}

// An HTTPS API server on 127.0.0.1 with a certificate from CA "a".
class HttpsApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto a = EnsureSelfSignedTls(dir_.path() + "/a", {"localhost", "127.0.0.1"}, Now());
    auto b = EnsureSelfSignedTls(dir_.path() + "/b", {"localhost", "127.0.0.1"}, Now());
    ASSERT_TRUE(a.ok() && b.ok());
    ca_ = a->ca_file;
    other_ca_ = b->ca_file;
    store_ = std::move(SqliteStore::Open(dir_.path() + "/s.db")).value();
    controller_ = std::make_unique<Controller>(store_.get(), &clock_, MakeSchedulerPlacement(), nullptr);
    ASSERT_TRUE(controller_->Rebuild().ok());
    server_ = std::make_unique<ApiServer>(controller_.get(), "tok", ServerTlsFiles{a->cert_file, a->key_file});
    auto port = server_->Bind("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    port_ = *port;
    server_->Start();
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  std::string Url(const char* scheme = "https", const char* host = "127.0.0.1") const {
    return std::string(scheme) + "://" + host + ":" + std::to_string(port_);
  }

  testing::TempDir dir_;
  std::string ca_, other_ca_;
  FakeClock clock_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<ApiServer> server_;
  int port_ = 0;
};

TEST_F(HttpsApiTest, TheRightCaWorksOnOneKeptAliveConnection) {
  HttpClient c(Url(), "tok", 5000, ca_);
  for (int i = 0; i < 3; ++i) {
    auto r = c.Get("/v1/pools");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->status, 200) << r->body;
  }
  auto created = c.Post("/v1/pools", R"({"name":"p1"})");
  ASSERT_TRUE(created.ok());
  EXPECT_LT(created->status, 300) << created->body;
  HttpClient by_name(Url("https", "localhost"), "tok", 5000, ca_);
  EXPECT_EQ(by_name.Get("/healthz")->status, 200);
}

TEST_F(HttpsApiTest, AnotherCaOrTheSystemStoreIsRefusedAndSaysWhichUrlAndCa) {
  HttpClient other(Url(), "tok", 5000, other_ca_);
  auto r = other.Get("/v1/pools");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnauthenticated);
  EXPECT_TRUE(Has(r.status().message(), Url() + "/v1/pools")) << r.status().message();
  EXPECT_TRUE(Has(r.status().message(), other_ca_)) << r.status().message();
  EXPECT_TRUE(Has(r.status().message(), "not accepted")) << r.status().message();

  unsetenv("TFUSION_CA_FILE");
  HttpClient system_store(Url(), "tok");
  auto s = system_store.Get("/v1/pools");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Has(s.status().message(), "system's trust store")) << s.status().message();

  // The environment names the CA when the caller gives none.
  setenv("TFUSION_CA_FILE", ca_.c_str(), 1);
  HttpClient from_env(Url(), "tok");
  auto e = from_env.Get("/v1/pools");
  unsetenv("TFUSION_CA_FILE");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->status, 200);
}

TEST_F(HttpsApiTest, ACertificateThatDoesNotNameTheHostIsRefused) {
  // A second server whose certificate (from a trusted CA) names only another host.
  auto c = EnsureSelfSignedTls(dir_.path() + "/c", {"gpu-head.example"}, Now());
  ASSERT_TRUE(c.ok());
  ApiServer elsewhere(controller_.get(), "tok", ServerTlsFiles{c->cert_file, c->key_file});
  auto port = elsewhere.Bind("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  elsewhere.Start();
  HttpClient wrong_host("https://127.0.0.1:" + std::to_string(*port), "tok", 5000, c->ca_file);
  auto r = wrong_host.Get("/healthz");
  elsewhere.Stop();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnauthenticated);
  EXPECT_TRUE(Has(r.status().message(), "does not name the host")) << r.status().message();
}

TEST_F(HttpsApiTest, PlainHttpToTheTlsPortGetsNothingAndAHint) {
  HttpClient plain(Url("http"), "tok");
  auto r = plain.Get("/v1/pools");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Has(r.status().message(), "https://")) << r.status().message();
  // A bad CA file fails every request before anything is sent.
  HttpClient bad(Url(), "tok", 5000, dir_.path() + "/missing.pem");
  auto b = bad.Get("/v1/pools");
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(b.status().message(), dir_.path() + "/missing.pem")) << b.status().message();
}

TEST(HttpsApi, AServerWithUnloadableFilesDoesNotBind) {
  testing::TempDir dir;
  auto store = std::move(SqliteStore::Open(dir.path() + "/s.db")).value();
  FakeClock clock;
  Controller c(store.get(), &clock, MakeSchedulerPlacement(), nullptr);
  ApiServer server(&c, "tok", ServerTlsFiles{dir.path() + "/none.pem", dir.path() + "/none.key"});
  auto port = server.Bind("127.0.0.1", 0);
  EXPECT_EQ(port.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(port.status().message(), "none.pem")) << port.status().message();
}

}  // namespace
}  // namespace tf::controller

// A server that takes the connection and never answers (a stopped process, a hung store behind
// it) is reported as that, with the time waited, not as a scheme mistake.
TEST(HttpClientErrors, ASilentServerIsReportedAsNotAnsweringNotAsTheWrongScheme) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 8), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  // The kernel completes the handshake from the backlog; nobody reads or answers.
  tf::controller::HttpClient silent(url, "t", 600);
  auto r = silent.Get("/v1/pools");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no answer within 600 ms"), std::string::npos) << r.status().message();
  EXPECT_EQ(r.status().message().find("https://"), std::string::npos) << r.status().message();
  // The client commands' replica list: a write the silent replica may have acted on is not sent
  // again to the next one (its outcome is unknown); a read moves on.
  tf::controller::ReplicaClient replicas(url + ",http://127.0.0.1:1", "t", 600, "", /*writes_once=*/true);
  auto put = replicas.Put("/v1/quotas/acme", "{}");
  ASSERT_FALSE(put.ok());
  EXPECT_NE(put.status().message().find("no answer within 600 ms"), std::string::npos) << put.status().message();
  auto get = replicas.Get("/v1/pools");
  ASSERT_FALSE(get.ok());
  EXPECT_NE(get.status().message().find("cannot connect (nothing answers at http://127.0.0.1:1"), std::string::npos)
      << get.status().message();
  shutdown(listener, SHUT_RDWR);
  close(listener);
}
