// Swap events in the GPU region (layout 7): each process's limiter records its completed swap-outs,
// swap-ins and moves to the disk tier in a small ring of its own (ProcessTierLog), and the node
// agent reads them to log one line per event. The reader treats every record as untrusted.
#include "limiter/core/gpu_region.h"

namespace tf::limiter {

namespace {
constexpr uint32_t kEventNumberMask = 0xFFFFFF;

uint32_t ClampMib(uint64_t bytes) {
  const uint64_t mib = (bytes + (1u << 20) - 1) >> 20;
  return mib > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(mib);
}
}  // namespace

void ResetProcessTierLog(ProcessTierLog* l) {
  if (l == nullptr) return;
  for (TierEventRecord& r : l->ring) r.tag.store(0, std::memory_order_relaxed);
  l->events.store(0, std::memory_order_release);
}

const char* TierEventCauseLabel(uint32_t cause) {
  switch (cause) {
    case kTierCauseIdle: return "idle";
    case kTierCauseFreeze: return "freeze";
    case kTierCausePressure: return "pressure";
    case kTierCausePreemption: return "preemption";
    case kTierCauseThaw: return "thaw";
    case kTierCauseCall: return "GPU call";
    default: return "unknown";
  }
}

ProcessTierLog* GpuRegion::TierLogOfProcess(uint32_t slot) const {
  if (base_ == nullptr || slot >= kMaxProcesses) return nullptr;
  return reinterpret_cast<ProcessTierLog*>(base_ + kProcessTierLogOffset + slot * sizeof(ProcessTierLog));
}

void GpuRegion::RecordTierEvent(uint32_t slot, const TierEvent& e) {
  ProcessTierLog* l = TierLogOfProcess(slot);
  if (l == nullptr) return;
  // One writer per slot (the owning process, under its tier mutex).
  const uint32_t n = l->events.load(std::memory_order_relaxed) + 1;
  TierEventRecord& r = l->ring[(n - 1) % kTierLogDepth];
  r.tag.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  r.duration_us.store(e.duration_us, std::memory_order_relaxed);
  r.host_mib.store(ClampMib(e.host_bytes), std::memory_order_relaxed);
  r.disk_mib.store(ClampMib(e.disk_bytes), std::memory_order_relaxed);
  r.tag.store(((n & kEventNumberMask) << 8) | ((e.cause & 0xF) << 4) | (e.kind & 0xF), std::memory_order_release);
  l->events.store(n, std::memory_order_release);
}

uint32_t GpuRegion::TierEventCount(uint32_t slot) const {
  const ProcessTierLog* l = TierLogOfProcess(slot);
  return l == nullptr ? 0 : l->events.load(std::memory_order_acquire);
}

bool GpuRegion::ReadTierEvent(uint32_t slot, uint32_t n, TierEventRead* out) const {
  const ProcessTierLog* l = TierLogOfProcess(slot);
  if (l == nullptr || n == 0 || out == nullptr) return false;
  const TierEventRecord& r = l->ring[(n - 1) % kTierLogDepth];
  const uint32_t tag = r.tag.load(std::memory_order_acquire);
  TierEventRead e;
  e.duration_us = r.duration_us.load(std::memory_order_relaxed);
  e.host_mib = r.host_mib.load(std::memory_order_relaxed);
  e.disk_mib = r.disk_mib.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (r.tag.load(std::memory_order_relaxed) != tag) return false;  // rewritten meanwhile
  if (tag == 0 || (tag >> 8) != (n & kEventNumberMask)) return false;  // not event n (overwritten)
  e.kind = tag & 0xF;
  e.cause = (tag >> 4) & 0xF;
  // Written by another process: anything out of range is refused, not shown.
  if (e.kind < kTierEventSwapOut || e.kind > kTierEventToDisk || e.cause > kTierCauseMax) return false;
  const uint64_t vram_mib = header()->total_vram_bytes >> 20;
  if (vram_mib != 0 && (e.host_mib > vram_mib || e.disk_mib > vram_mib)) return false;
  *out = e;
  return true;
}

}  // namespace tf::limiter
