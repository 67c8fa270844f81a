// What the controller benchmarks print about the process and the machine around their numbers:
// CPU time consumed (seconds) and the load average when a run starts.
#pragma once

#include <time.h>

#include <fstream>
#include <string>

namespace tf::bench {

inline double CpuSeconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}
inline double ProcessCpuSeconds() { return CpuSeconds(CLOCK_PROCESS_CPUTIME_ID); }
inline double ThreadCpuSeconds() { return CpuSeconds(CLOCK_THREAD_CPUTIME_ID); }

// "1.23 0.98": the 1- and 5-minute load averages.
inline std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five;
  in >> one >> five;
  return one + " " + five;
}

}  // namespace tf::bench
