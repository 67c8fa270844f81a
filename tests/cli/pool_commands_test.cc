// The client commands of `tfusion` (top, quota, pool) against a real controller: the test starts
// `tfusion controller` on port 0 with a SQLite store in a temporary folder and registers a node
// through the API, then runs the binary as a user would and checks what it prints.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "controller/http_client.h"

namespace {

struct Result {
  int rc = -1;
  std::string out;
};

Result Shell(const std::string& cmd) {
  Result r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

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

TEST_F(PoolCommandsTest, TopOncePrintsTheGpuTableAndExits) {
  Result r = Tf("top --once");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("GPU-top-0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ALLOC_TFLOPS"), std::string::npos) << r.out;
  EXPECT_EQ(Count(r.out, "ALLOC_TFLOPS"), 1u) << r.out;
}

TEST_F(PoolCommandsTest, TopRejectsABadIntervalClearly) {
  for (const char* bad : {"0", "-1", "abc", "0.01", "5000", "nan"}) {
    Result r = Tf(std::string("top --once --interval ") + bad);
    EXPECT_EQ(r.rc, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find("--interval"), std::string::npos) << bad << ": " << r.out;
    EXPECT_EQ(r.out.find("GPU-top-0"), std::string::npos) << bad << ": " << r.out;
  }
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

}  // namespace
