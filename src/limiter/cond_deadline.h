// The absolute CLOCK_REALTIME deadline `delta_ns` from now, for pthread_cond_timedwait (the
// compute gate and the compute governor wait on process-private condition variables).
#pragma once

#include <time.h>

#include <cstdint>

namespace tf::limiter {

inline void AbsDeadline(timespec* ts, int64_t delta_ns) {
  clock_gettime(CLOCK_REALTIME, ts);
  int64_t ns = ts->tv_nsec + delta_ns;
  ts->tv_sec += ns / 1'000'000'000;
  ts->tv_nsec = ns % 1'000'000'000;
}

}  // namespace tf::limiter
