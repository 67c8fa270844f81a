// Helpers of the tests that run the `tfusion` binary: run a shell command and collect its output,
// read a file.
#pragma once

#include <dirent.h>
#include <stdio.h>
#include <sys/mman.h>
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

// Removes the fake driver's shared-memory objects of FAKECUDA_SHM_NAME `name` (with or without
// its leading '/'): its boards (NAME-devN) and its checkpoint table (NAME-ckpt). The fake leaves
// them for the next process of the same name; a test's name is its own, so its teardown removes
// them.
inline void RemoveFakeDriverShm(std::string name) {
  while (!name.empty() && name[0] == '/') name.erase(0, 1);
  if (name.empty()) return;
  const std::string prefix = name + "-";
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    const std::string entry = e->d_name;
    if (entry.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = entry.substr(prefix.size());
    if (rest == "ckpt" || (rest.size() > 3 && rest.compare(0, 3, "dev") == 0 &&
                           rest.find_first_not_of("0123456789", 3) == std::string::npos)) {
      shm_unlink(("/" + entry).c_str());
    }
  }
  closedir(d);
}

}  // namespace tf::cli::testing
