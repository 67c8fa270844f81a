// Process identity and time helpers for the shared region: who is alive, and what time it is.
//
// A pid alone is not an identity (pids are reused), so a process slot records the pid together
// with the process start time from /proc/<pid>/stat (field 22, clock ticks since boot). All
// functions are thread-safe and allocation-free; none is meant for a per-launch hot path except
// MonotonicNowNs (one vDSO clock_gettime, ~20 ns).
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace tf::limiter {

// CLOCK_MONOTONIC in nanoseconds. System-wide, so values compare across processes.
int64_t MonotonicNowNs();

struct ProcessStat {
  uint64_t start_time_ticks = 0;  // /proc/<pid>/stat field 22
  char state = '?';               // field 3: R, S, D, Z (zombie), X (dead), ...
  pid_t parent = 0;               // field 4
};

// Reads /proc/<pid>/stat. Returns false (errno set: ENOENT/ESRCH when the process is gone) when
// it cannot be read or parsed. Cost: open+read+close, a few microseconds.
bool ReadProcessStat(pid_t pid, ProcessStat* out);

// True when `pid` still names the process that started at `start_time_ticks`: it exists, is not
// a zombie, and its start time matches. When /proc cannot be read for another reason (EACCES
// under hidepid) it falls back to kill(pid, 0) and only ESRCH counts as dead.
// The pid is interpreted in the caller's PID namespace.
bool ProcessAlive(pid_t pid, uint64_t start_time_ticks);

}  // namespace tf::limiter
