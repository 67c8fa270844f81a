// The node agent's log of VRAM tiering: one line per completed swap-out, swap-in and move to the
// disk tier of every process in this node's GPU regions (allocations' tenants, local `tfusion run`
// tenants and worker sessions alike), with the vGPU, the process, the cause, the MiB per tier and
// the duration. The events come from each process's ProcessTierLog in its region (a ring of the
// last kTierLogDepth; limiter/core/region_layout.h), which its limiter writes and which is read
// here as untrusted input: a record out of range is counted as unreadable, never shown.
//
// Thread safety: Start/Stop from one thread; ScanOnce from the scanning thread (or a test) only.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "limiter/core/gpu_region.h"

namespace tf::hypervisor {

class TierEventLog {
 public:
  // `region_paths`: the GPU regions to watch. `sink` receives each line without its newline
  // (default: stderr with `log_prefix`: ).
  explicit TierEventLog(std::vector<std::string> region_paths, std::string log_prefix = "hypervisor",
                        std::function<void(const std::string&)> sink = nullptr);
  ~TierEventLog();  // stops the thread
  // Scans every 100 ms on a thread of its own, so that a burst of events (a freeze and a thaw in
  // a second) is seen before the ring wraps.
  void Start();
  void Stop();
  // One pass over the regions; returns the lines written. The first pass only takes note of the
  // events already recorded (a restarted agent does not repeat them).
  int ScanOnce();

 private:
  struct Seen {
    int32_t pid = 0;
    uint64_t start_time_ticks = 0;
    uint32_t events = 0;  // events logged (or given up on) so far
  };
  void Emit(const std::string& line);
  void AttachLazily();

  std::vector<std::string> region_paths_;
  std::string log_prefix_;
  std::function<void(const std::string&)> sink_;
  std::vector<std::unique_ptr<limiter::GpuRegion>> regions_;
  std::map<std::pair<size_t, uint32_t>, Seen> seen_;  // (region, process slot)
  bool first_pass_ = true;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tf::hypervisor
