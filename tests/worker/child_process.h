// A child process for the remote end-to-end tests: argv and extra environment, stdout and stderr
// read through one pipe; its key=value lines parsed. Shared by the tests in tests/worker.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace tf::testing {

using Clock = std::chrono::steady_clock;

struct Result {
  int rc = -1;
  std::string out;
  std::map<std::string, std::string> kv;
};

inline void ParseKv(Result* r) {
  std::istringstream lines(r->out);
  std::string line;
  while (std::getline(lines, line)) {
    auto eq = line.find('=');
    if (eq != std::string::npos) r->kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
}

// A child process with extra environment and its stdout+stderr on a pipe.
struct Child {
  pid_t pid = -1;
  int out_fd = -1;
  std::string out;

  void Start(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      dup2(p[1], 1);
      dup2(p[1], 2);
      close(p[0]);
      close(p[1]);
      for (const auto& kv : env) putenv(strdup(kv.c_str()));
      std::vector<char*> a;
      for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
      a.push_back(nullptr);
      execv(a[0], a.data());
      _exit(127);
    }
    close(p[1]);
    out_fd = p[0];
  }
  // Reads until `needle` appears or the timeout passes.
  bool WaitFor(const std::string& needle, int timeout_ms) {
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (out.find(needle) == std::string::npos) {
      int left = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
      if (left <= 0) return false;
      pollfd pf{out_fd, POLLIN, 0};
      if (poll(&pf, 1, left) <= 0) continue;
      char buf[4096];
      ssize_t n = read(out_fd, buf, sizeof(buf));
      if (n <= 0) return out.find(needle) != std::string::npos;
      out.append(buf, n);
    }
    return true;
  }
  // Waits for exit (up to timeout_ms); returns the exit status or -1 on timeout.
  int Wait(int timeout_ms) {
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    int status = 0;
    for (;;) {
      pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid) break;
      if (Clock::now() > deadline) return -1;
      // Keep reading: a child with more output than the pipe holds would block otherwise.
      pollfd pf{out_fd, POLLIN, 0};
      if (poll(&pf, 1, 5) > 0) {
        char buf[65536];
        ssize_t n = read(out_fd, buf, sizeof(buf));
        if (n > 0) out.append(buf, n);
        else std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    WaitFor("\x01never", 0);
    char buf[4096];
    ssize_t n;
    fcntl(out_fd, F_SETFL, O_NONBLOCK);
    while ((n = read(out_fd, buf, sizeof(buf))) > 0) out.append(buf, n);
    close(out_fd);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};


}  // namespace tf::testing
