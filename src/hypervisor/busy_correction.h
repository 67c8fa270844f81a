// The busy correction: the GPU's own utilization, read through NVML, corrects what the governors
// charge their vGPUs (docs/compute-sharing.md, "The busy correction").
//
// A governor charges each tick with work queued as a time share (the tick divided by the processes
// with work queued). Launch-bound tenants keep a kernel queued most of the time while the GPU runs
// their kernels a fraction of it, so their time shares add up to far more than the time the GPU
// ran kernels, and hard caps bind that the tenants' kernels never reach. Every 100 ms this writes,
// per GPU region, the factor the charges are multiplied by: the GPU's utilization over the time
// share charged (both averaged over about half a second), divided by kSaturatedRatio and at most 1.
// While the GPU runs kernels at least 80% of the time the tenants are charged for, nothing changes.
//
// One writer per GPU at a time (GpuRegion::SetBusyCorrection claims the region's word): the node
// agent, or each `tfusion run` of a governed vGPU, whichever comes first; the others keep their
// averages and take over when the writer's setting expires (kTtlNs after its last write).
//
// Thread safety: Start/Stop from one thread; CorrectOnce from the thread (or a test) only.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hypervisor/gpu_source.h"
#include "limiter/core/gpu_region.h"

namespace tf::hypervisor {

class BusyCorrection {
 public:
  static constexpr int64_t kPeriodNs = 100'000'000;  // one pass every 100 ms
  static constexpr int64_t kAverageNs = 500'000'000; // time constant of both averages
  static constexpr int64_t kTtlNs = 1'000'000'000;   // a setting lasts 1 s after its write
  static constexpr double kSaturatedRatio = 0.8;     // utilization / time share at which it stops
  static constexpr double kMinCharged = 0.05;        // below this share charged: nothing to correct

  // `source` (not owned) samples the GPUs' utilization; `region_paths` are the GPU regions to
  // correct. `sink` receives each log line without its newline (default: stderr with the prefix).
  BusyCorrection(GpuSource* source, std::vector<std::string> region_paths, std::string log_prefix,
                 std::function<void(const std::string&)> sink = nullptr);
  ~BusyCorrection();  // stops the thread
  void Start();
  void Stop();
  // One pass at now_ns (CLOCK_MONOTONIC): one utilization sample, then each region's factor.
  // Returns the number of regions whose factor this pass wrote.
  int CorrectOnce(int64_t now_ns);
  // The factor (ppm) the last pass computed for region i (1,000,000 before the first).
  uint32_t LastFactorPpm(size_t i) const;

 private:
  struct Gpu {
    bool seen = false;
    uint64_t last_raw = 0;
    int64_t last_ns = 0;
    double charged = 0;   // time share charged per ns of wall time, averaged
    double busy = 0;      // utilization (0..1), averaged
    bool averaged = false;
    uint32_t factor_ppm = limiter::kShareWholeGpuPpm;
    bool told_on = false;
    bool told_writer = false;
  };
  void Emit(const std::string& line);

  GpuSource* source_;
  std::vector<std::string> region_paths_;
  std::string log_prefix_;
  std::function<void(const std::string&)> sink_;
  std::vector<std::unique_ptr<limiter::GpuRegion>> regions_;
  std::vector<Gpu> gpus_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tf::hypervisor
