// Helpers of the tests that run the `tfusion` binary: run a shell command and collect its output,
// read a file.
#pragma once

#include <stdio.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>
#include <string>

namespace tf::cli::testing {

struct Result {
  int rc = -1;       // exit status; -1 when it did not exit normally
  std::string out;   // stdout and stderr together
};

inline Result Shell(const std::string& cmd) {
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

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace tf::cli::testing
