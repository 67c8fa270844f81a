// Usage of pools and GPUs as the console shows it: now (TakeUsageSnapshot, GET /v1/usage) and
// over the last hour (UsageHistory, filled every few seconds by a UsageSampler, GET /v1/history).
//
// Units: compute in FP16 dense TFLOPS, memory in MiB, times in ms of the controller's Clock.
// "Allocated" is the sum of the requests placed on a GPU; "schedulable" (virtual) capacity is what
// placement counts them against: physical x the pool's oversell ratio for TFLOPS, physical x (100 +
// host + disk expansion) / 100 for VRAM (sched::GpuSchedulableCapacity, the scheduler's own rule).
// "Use" is what the node agents last reported: GPU utilization and VRAM used by processes.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "controller/clock.h"
#include "controller/controller.h"
#include "controller/periodic_thread.h"

namespace tf::controller {

struct GpuUsage {
  std::string uuid, node, pool, model;
  int index = 0;
  bool schedulable = true;  // false while its node is lost
  double tflops = 0, used_tflops = 0, schedulable_tflops = 0;
  int64_t vram_mib = 0, used_vram_mib = 0, schedulable_vram_mib = 0;
  double utilization_percent = 0;  // last heartbeat sample
  int64_t memory_used_mib = 0;     // last heartbeat sample
  int64_t sampled_ms = 0;          // when that sample arrived; 0: none yet
};

struct PoolUsage {
  std::string name;
  int gpus = 0;
  double tflops = 0, used_tflops = 0, schedulable_tflops = 0;
  int64_t vram_mib = 0, used_vram_mib = 0, schedulable_vram_mib = 0;
  double utilization_percent = 0;  // mean over its GPUs, weighted by their TFLOPS
  int64_t memory_used_mib = 0;
};

struct UsageSnapshot {
  int64_t t_ms = 0;
  std::vector<PoolUsage> pools;  // by name
  std::vector<GpuUsage> gpus;    // by pool, node, index
};

// The controller's pools and GPUs now. Reads the controller's state, changes nothing.
UsageSnapshot TakeUsageSnapshot(const Controller& c, int64_t now_ms);

nlohmann::json ToJson(const PoolUsage& p);
nlohmann::json ToJson(const GpuUsage& g);

// A bounded ring of usage samples: the newest `capacity` are kept, older ones dropped. A sample
// keeps, per pool, the PoolUsage and, per GPU, what changes over time (allocated TFLOPS and VRAM,
// utilization, VRAM used); names are shared between samples. Thread-safe.
class UsageHistory {
 public:
  UsageHistory(int64_t interval_ms, int64_t retention_ms);

  int64_t interval_ms() const { return interval_ms_; }
  int64_t retention_ms() const { return retention_ms_; }
  size_t capacity() const { return capacity_; }

  void Add(const UsageSnapshot& s);
  size_t size() const;
  // {"interval_ms", "retention_ms", "samples": [{"t_ms", "pools": [...], "gpus": [...]}]}, the
  // samples taken after `since_ms`, oldest first. `pool` empty: every pool and no per-GPU series
  // (so the answer stays small on a large fleet); else that pool and its GPUs only.
  nlohmann::json ToJson(int64_t since_ms, const std::string& pool) const;

 private:
  using Name = std::shared_ptr<const std::string>;
  struct GpuPoint {
    Name uuid, pool;
    float utilization_percent = 0;
    double used_tflops = 0;
    int64_t used_vram_mib = 0, memory_used_mib = 0;
  };
  struct Sample {
    int64_t t_ms = 0;
    std::vector<PoolUsage> pools;
    std::vector<GpuPoint> gpus;
  };
  Name InternLocked(const std::string& s);

  const int64_t interval_ms_, retention_ms_;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::deque<Sample> samples_;
  std::unordered_map<std::string, Name> names_;  // pruned of names no sample uses
};

// Adds a snapshot of `controller` to `history` every history->interval_ms() on its own thread,
// while the controller serves (a standby has no state to sample: its history has a gap).
class UsageSampler {
 public:
  // All three must outlive the sampler.
  UsageSampler(const Controller* controller, UsageHistory* history, const Clock* clock);
  ~UsageSampler();
  void SampleOnce();
  void Start();
  void Stop();

 private:
  const Controller* const controller_;
  UsageHistory* const history_;
  const Clock* const clock_;
  PeriodicThread thread_;
};

}  // namespace tf::controller
