#include "hypervisor/busy_correction.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "hypervisor/quota_regions.h"
#include "limiter/core/process_identity.h"

namespace tf::hypervisor {

BusyCorrection::BusyCorrection(GpuSource* source, std::vector<std::string> region_paths, std::string log_prefix,
                               std::function<void(const std::string&)> sink)
    : source_(source), region_paths_(std::move(region_paths)), log_prefix_(std::move(log_prefix)),
      sink_(std::move(sink)) {}

BusyCorrection::~BusyCorrection() { Stop(); }

void BusyCorrection::Start() {
  if (thread_.joinable() || source_ == nullptr) return;
  stop_ = false;
  thread_ = std::thread([this] {
    while (!stop_.load(std::memory_order_relaxed)) {
      CorrectOnce(limiter::MonotonicNowNs());
      std::this_thread::sleep_for(std::chrono::nanoseconds(kPeriodNs));
    }
  });
}

void BusyCorrection::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void BusyCorrection::Emit(const std::string& line) {
  if (sink_) {
    sink_(line);
  } else {
    std::fprintf(stderr, "%s: %s\n", log_prefix_.c_str(), line.c_str());
  }
}

uint32_t BusyCorrection::LastFactorPpm(size_t i) const {
  return i < gpus_.size() ? gpus_[i].factor_ppm : limiter::kShareWholeGpuPpm;
}

int BusyCorrection::CorrectOnce(int64_t now_ns) {
  AttachRegionsOnce(region_paths_, &regions_);
  gpus_.resize(regions_.size());
  StatusOr<std::vector<GpuUtilization>> samples = source_->Sample();
  if (!samples.ok()) return 0;  // no reading: the settings expire and charges are the time shares
  int written = 0;
  for (size_t i = 0; i < regions_.size(); ++i) {
    limiter::GpuRegion& region = *regions_[i];
    if (!region.attached()) continue;
    Gpu& g = gpus_[i];
    const uint64_t raw = region.RawChargedNsTotal();
    const GpuUtilization* u = nullptr;
    for (const GpuUtilization& s : *samples)
      if (s.uuid == region.gpu_uuid()) u = &s;
    if (!g.seen || now_ns <= g.last_ns || raw < g.last_raw || u == nullptr) {
      g.seen = u != nullptr;  // a counter that went back (a new region file) starts over
      g.last_raw = raw;
      g.last_ns = now_ns;
      continue;
    }
    const int64_t dt = now_ns - g.last_ns;
    const double charged = std::min(1.5, static_cast<double>(raw - g.last_raw) / static_cast<double>(dt));
    const double busy = std::clamp(u->gpu_percent / 100.0, 0.0, 1.0);
    const double a = std::min(1.0, static_cast<double>(dt) / static_cast<double>(kAverageNs));
    if (!g.averaged) {
      g.charged = charged;
      g.busy = busy;
      g.averaged = true;
    } else {
      g.charged += a * (charged - g.charged);
      g.busy += a * (busy - g.busy);
    }
    g.last_raw = raw;
    g.last_ns = now_ns;
    // No correction while little is charged, or without a reading (0%: NVML's answer where it has
    // no sample, and the fake driver's).
    double factor = 1.0;
    if (g.charged >= kMinCharged && g.busy > 0) factor = std::min(1.0, g.busy / g.charged / kSaturatedRatio);
    const uint32_t ppm = std::max<uint32_t>(limiter::kMinBusyCorrectionPpm,
                                            static_cast<uint32_t>(factor * limiter::kShareWholeGpuPpm + 0.5));
    g.factor_ppm = std::min<uint32_t>(ppm, limiter::kShareWholeGpuPpm);
    if (!region.SetBusyCorrection(g.factor_ppm, static_cast<int32_t>(getpid()), now_ns, kTtlNs)) {
      if (!g.told_writer) Emit(std::string("busy correction of GPU ") + region.gpu_uuid() + ": another process writes it");
      g.told_writer = true;
      continue;
    }
    ++written;
    // Logged as it starts and stops applying (below 0.9; at 0.97 or more again).
    const bool on = g.told_on ? g.factor_ppm < limiter::kShareWholeGpuPpm * 97 / 100
                              : g.factor_ppm < limiter::kShareWholeGpuPpm * 90 / 100;
    if (on != g.told_on) {
      char line[256];
      std::snprintf(line, sizeof line,
                    on ? "busy correction of GPU %s: kernels ran %.0f%% of the time, the tenants were charged %.0f%%: "
                         "charges x %.2f"
                       : "busy correction of GPU %s: kernels ran %.0f%% of the time, the tenants were charged %.0f%%: "
                         "charges are time shares again",
                    region.gpu_uuid(), g.busy * 100, g.charged * 100, g.factor_ppm / 1e6);
      Emit(line);
      g.told_on = on;
    }
  }
  return written;
}

}  // namespace tf::hypervisor
