#include "limiter/core/process_identity.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <cstring>

namespace tf::limiter {

int64_t MonotonicNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

bool ReadProcessStat(pid_t pid, ProcessStat* out) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  // comm is at most 16 bytes, the rest are numbers: 1 KiB always holds field 22.
  char buf[1024];
  ssize_t n;
  do {
    n = read(fd, buf, sizeof(buf) - 1);
  } while (n < 0 && errno == EINTR);
  int saved = errno;
  close(fd);
  if (n <= 0) {
    errno = n == 0 ? ESRCH : saved;
    return false;
  }
  buf[n] = '\0';
  // comm may contain spaces and parentheses: fields resume after the LAST ')'.
  const char* p = strrchr(buf, ')');
  if (p == nullptr || p[1] != ' ') {
    errno = EINVAL;
    return false;
  }
  p += 2;
  out->state = *p;
  if (p[1] == ' ') out->parent = static_cast<pid_t>(strtol(p + 2, nullptr, 10));
  // p is at field 3; step to field 22.
  for (int field = 3; field < 22; ++field) {
    p = strchr(p, ' ');
    if (p == nullptr) {
      errno = EINVAL;
      return false;
    }
    ++p;
  }
  uint64_t v = 0;
  bool any = false;
  for (; *p >= '0' && *p <= '9'; ++p) {
    v = v * 10 + static_cast<uint64_t>(*p - '0');
    any = true;
  }
  if (!any) {
    errno = EINVAL;
    return false;
  }
  out->start_time_ticks = v;
  return true;
}

bool ProcessAlive(pid_t pid, uint64_t start_time_ticks) {
  if (pid <= 0) return false;
  ProcessStat st;
  if (ReadProcessStat(pid, &st)) {
    if (st.state == 'Z' || st.state == 'X') return false;
    return st.start_time_ticks == start_time_ticks;
  }
  if (errno == ENOENT || errno == ESRCH) return false;
  return !(kill(pid, 0) != 0 && errno == ESRCH);
}

}  // namespace tf::limiter
