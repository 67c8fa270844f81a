// `tfusion up` (RunUp) from an empty state folder, without an NVIDIA driver: it starts the
// controller and the node agent on the embedded store, prints the URL and token, and the client
// commands (node ls, top, ps) work against it. RunUp runs in a child process (it installs signal
// handlers and runs until SIGTERM).
#include <gtest/gtest.h>
#include <signal.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "controller/cli_commands.h"
#include "controller/http_client.h"
#include "test_cluster.h"

namespace tf::controller {
namespace {

TEST(RunUp, StartsControllerAndAgentAndServesClientCommands) {
  testing::TempDir dir;
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], STDOUT_FILENO);
    UpOptions o;
    o.state_dir = dir.path() + "/state";
    o.port = 0;
    o.metrics_port = 0;
    o.nvml_library = "libnvidia-ml-absent-in-this-test.so.1";
    o.region_dir = dir.path() + "/regions";
    _exit(RunUp(o));
  }
  close(fds[1]);
  // Read stdout until the banner names the controller and the token.
  std::string out;
  char buf[512];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (out.find("token:") == std::string::npos || out.find("\n", out.find("token:")) == std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << out;
    ssize_t n = read(fds[0], buf, sizeof buf);
    ASSERT_GT(n, 0) << "tfusion up exited early: " << out;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  size_t u = out.find("controller: ");
  ASSERT_NE(u, std::string::npos) << out;
  std::string url = out.substr(u + 12, out.find('\n', u) - u - 12);
  ASSERT_EQ(url.rfind("http://127.0.0.1:", 0), 0u) << url;
  std::string token;
  std::ifstream(dir.path() + "/state/token") >> token;
  ASSERT_FALSE(token.empty());
  EXPECT_NE(out.find(token), std::string::npos);  // printed

  // The agent registers this machine (no driver: zero GPUs) shortly after the banner.
  ClientOptions client{url, token, nullptr};
  std::string nodes;
  for (int i = 0; i < 100; ++i) {
    std::ostringstream o;
    client.out = &o;
    ASSERT_EQ(NodeList(client), 0);
    nodes = o.str();
    if (nodes.find("ready") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(nodes.rfind("NODE", 0), 0u) << nodes;
  EXPECT_NE(nodes.find("default"), std::string::npos) << nodes;
  EXPECT_NE(nodes.find("ready"), std::string::npos) << nodes;
  std::ostringstream top, ps;
  client.out = &top;
  EXPECT_EQ(Top(client, {2, true}), 0);
  EXPECT_EQ(top.str().rfind("GPU", 0), 0u) << top.str();
  client.out = &ps;
  EXPECT_EQ(Ps(client), 0);
  EXPECT_EQ(ps.str().rfind("ALLOCATION", 0), 0u) << ps.str();
  ClientOptions wrong{url, "not-the-token", nullptr};
  std::ostringstream ignored;
  wrong.out = &ignored;
  EXPECT_EQ(NodeList(wrong), 1);
  // The banner names the web console, served on the API's port without a token.
  EXPECT_NE(out.find("console:    " + url + "/console/"), std::string::npos) << out;
  StatusOr<HttpResponse> page = HttpClient(url, "").Get("/console/");
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->status, 200);

  kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// `up` is the controller and this machine's agent: when the agent cannot start (its metrics port
// is taken), `up` stops and says so instead of serving on as a controller with no node.
TEST(RunUp, StopsWhenItsNodeAgentCannotStart) {
  testing::TempDir dir;
  const int busy = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(busy, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(busy, 1), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(getsockname(busy, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string err = dir.path() + "/stderr";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, STDERR_FILENO);
    UpOptions o;
    o.state_dir = dir.path() + "/state";
    o.port = 0;
    o.metrics_port = ntohs(addr.sin_port);
    o.nvml_library = "libnvidia-ml-absent-in-this-test.so.1";
    o.region_dir = dir.path() + "/regions";
    _exit(RunUp(o));
  }
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 200 && done == 0; ++i) {
    done = waitpid(pid, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  close(busy);
  std::stringstream log;
  log << std::ifstream(err).rdbuf();
  ASSERT_EQ(done, pid) << "tfusion up kept running without its agent\n" << log.str();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0);
  EXPECT_NE(log.str().find("cannot listen for metrics"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("tfusion up: this machine's node agent did not start (above): stopping"), std::string::npos)
      << log.str();
}

}  // namespace
}  // namespace tf::controller
