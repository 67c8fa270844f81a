// VRAM tiering in the GPU region: the owner's policy per vGPU, freeze and thaw requests, the host
// tier's budget. The swapping itself happens in the limiter of each process (src/limiter/tiering.cc).
#include <unistd.h>

#include "limiter/core/gpu_region.h"

namespace tf::limiter {

void ResetVgpuTier(VgpuTier* t) {
  t->enabled.store(0, std::memory_order_relaxed);
  t->idle_swap_ms.store(0, std::memory_order_relaxed);
  t->idle_disk_ms.store(0, std::memory_order_relaxed);
  t->api_freeze_gen.store(0, std::memory_order_relaxed);
  t->api_thaw_gen.store(0, std::memory_order_relaxed);
  t->idle_zero_ms.store(0, std::memory_order_relaxed);
  t->api_zero_gen.store(0, std::memory_order_relaxed);
  // A new vGPU has no zero request pending.
  t->zero_done_gen.store(t->zero_gen.load(std::memory_order_relaxed), std::memory_order_relaxed);
  t->held.store(0, std::memory_order_relaxed);
  // The generations keep counting: a process still holding an old value never mistakes a new
  // vGPU's first request for one it already handled.
}

void ResetProcessTier(ProcessTier* t) {
  t->state.store(kTierOff, std::memory_order_relaxed);
  t->last_error.store(0, std::memory_order_relaxed);
  t->last_active_ns.store(0, std::memory_order_relaxed);
  t->movable_bytes.store(0, std::memory_order_relaxed);
  t->host_bytes.store(0, std::memory_order_relaxed);
  t->fixed_bytes.store(0, std::memory_order_relaxed);
  t->swaps_out.store(0, std::memory_order_relaxed);
  t->swaps_in.store(0, std::memory_order_relaxed);
  t->last_out_us.store(0, std::memory_order_relaxed);
  t->last_in_us.store(0, std::memory_order_relaxed);
}

const char* TierStateLabel(uint32_t s) {
  switch (s) {
    case kTierResident: return "resident";
    case kTierSwappingOut: return "swapping out";
    case kTierSwapped: return "swapped";
    case kTierSwappingIn: return "swapping in";
    case kTierOnDisk: return "on disk";
    case kTierCheckpointed: return "checkpointed";
    default: return "off";
  }
}

uint64_t DefaultHostTierBudget(uint64_t total_vram_bytes) {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGESIZE);
  uint64_t half = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 2 : 0;
  return total_vram_bytes < half ? total_vram_bytes : half;
}

VgpuTier* GpuRegion::TierOfVgpu(uint32_t vgpu_index) const {
  if (base_ == nullptr || vgpu_index >= kMaxVgpus) return nullptr;
  return reinterpret_cast<VgpuTier*>(base_ + kVgpuTierOffset + vgpu_index * sizeof(VgpuTier));
}

ProcessTier* GpuRegion::TierOfProcess(uint32_t slot) const {
  if (base_ == nullptr || slot >= kMaxProcesses) return nullptr;
  return reinterpret_cast<ProcessTier*>(base_ + kProcessTierOffset + slot * sizeof(ProcessTier));
}

RegionError GpuRegion::SetTierPolicy(uint32_t vgpu_index, bool enabled, uint64_t idle_swap_ms,
                                     uint64_t idle_disk_ms) {
  VgpuTier* t = TierOfVgpu(vgpu_index);
  if (t == nullptr) return RegionError::kInvalidArgument;
  if (vgpu(vgpu_index)->state.load(std::memory_order_acquire) != kSlotActive) return RegionError::kNotFound;
  t->idle_swap_ms.store(enabled ? idle_swap_ms : 0, std::memory_order_relaxed);
  t->idle_disk_ms.store(enabled ? idle_disk_ms : 0, std::memory_order_relaxed);
  if (!enabled) t->idle_zero_ms.store(0, std::memory_order_relaxed);
  t->enabled.store(enabled ? 1 : 0, std::memory_order_release);
  return RegionError::kOk;
}

RegionError GpuRegion::SetHold(uint32_t vgpu_index, bool held) {
  VgpuTier* t = TierOfVgpu(vgpu_index);
  if (t == nullptr) return RegionError::kInvalidArgument;
  if (vgpu(vgpu_index)->state.load(std::memory_order_acquire) != kSlotActive) return RegionError::kNotFound;
  t->held.store(held ? 1 : 0, std::memory_order_release);
  return RegionError::kOk;
}

RegionError GpuRegion::SetIdleZero(uint32_t vgpu_index, uint64_t idle_zero_ms) {
  VgpuTier* t = TierOfVgpu(vgpu_index);
  if (t == nullptr) return RegionError::kInvalidArgument;
  if (vgpu(vgpu_index)->state.load(std::memory_order_acquire) != kSlotActive) return RegionError::kNotFound;
  if (t->enabled.load(std::memory_order_acquire) == 0) return RegionError::kInvalidArgument;
  t->idle_zero_ms.store(idle_zero_ms, std::memory_order_relaxed);
  return RegionError::kOk;
}

RegionError GpuRegion::RequestZero(uint32_t vgpu_index) {
  VgpuTier* t = TierOfVgpu(vgpu_index);
  if (t == nullptr) return RegionError::kInvalidArgument;
  if (vgpu(vgpu_index)->state.load(std::memory_order_acquire) != kSlotActive) return RegionError::kNotFound;
  if (t->enabled.load(std::memory_order_acquire) == 0) return RegionError::kInvalidArgument;
  t->zero_gen.fetch_add(1, std::memory_order_acq_rel);
  return RegionError::kOk;
}

void GpuRegion::SetHostTierBudget(uint64_t bytes) {
  if (base_ != nullptr) tier_header()->host_budget_bytes.store(bytes, std::memory_order_relaxed);
}

namespace {
RegionError Bump(const GpuRegion& r, uint32_t vgpu_index, bool freeze, uint32_t* gen_out, bool pressure = false) {
  VgpuTier* t = r.TierOfVgpu(vgpu_index);
  if (t == nullptr) return RegionError::kInvalidArgument;
  if (t->enabled.load(std::memory_order_acquire) == 0) return RegionError::kInvalidArgument;
  std::atomic<uint32_t>& g = freeze ? t->freeze_gen : t->thaw_gen;
  // Before the bump, so that a process acting on it already sees why (a request racing it may be
  // reported as pressure too: both were made).
  if (pressure) t->pressure_freeze_gen.store(g.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  uint32_t gen = g.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (gen_out != nullptr) *gen_out = gen;
  return RegionError::kOk;
}
}  // namespace

RegionError GpuRegion::RequestFreeze(uint32_t vgpu_index, uint32_t* gen_out) {
  if (vgpu_index >= kMaxVgpus || base_ == nullptr) return RegionError::kInvalidArgument;
  if (vgpu(vgpu_index)->state.load(std::memory_order_acquire) != kSlotActive) return RegionError::kNotFound;
  return Bump(*this, vgpu_index, true, gen_out);
}

RegionError GpuRegion::RequestPressureFreeze(uint32_t vgpu_index, uint32_t* gen_out) {
  if (vgpu_index >= kMaxVgpus || base_ == nullptr) return RegionError::kInvalidArgument;
  if (vgpu(vgpu_index)->state.load(std::memory_order_acquire) != kSlotActive) return RegionError::kNotFound;
  return Bump(*this, vgpu_index, true, gen_out, true);
}

RegionError GpuRegion::RequestThaw(uint32_t vgpu_index, uint32_t* gen_out) {
  if (vgpu_index >= kMaxVgpus || base_ == nullptr) return RegionError::kInvalidArgument;
  if (vgpu(vgpu_index)->state.load(std::memory_order_acquire) != kSlotActive) return RegionError::kNotFound;
  return Bump(*this, vgpu_index, false, gen_out);
}

bool GpuRegion::ReserveHostTier(uint64_t bytes) {
  if (base_ == nullptr) return false;
  TierHeader* h = tier_header();
  uint64_t budget = h->host_budget_bytes.load(std::memory_order_relaxed);
  uint64_t used = h->host_used_bytes.load(std::memory_order_relaxed);
  do {
    if (bytes > budget || used > budget - bytes) return false;
  } while (!h->host_used_bytes.compare_exchange_weak(used, used + bytes, std::memory_order_acq_rel));
  return true;
}

void GpuRegion::ReleaseHostTier(uint64_t bytes) {
  if (base_ == nullptr || bytes == 0) return;
  TierHeader* h = tier_header();
  uint64_t used = h->host_used_bytes.load(std::memory_order_relaxed);
  while (!h->host_used_bytes.compare_exchange_weak(used, used >= bytes ? used - bytes : 0,
                                                   std::memory_order_acq_rel)) {
  }
}

void GpuRegion::SetHostKept(uint32_t slot, uint64_t bytes) {
  if (!ValidActiveProcess(slot)) return;
  process(slot)->host_kept_bytes.store(bytes, std::memory_order_relaxed);
}

void GpuRegion::RequestHostReclaim(uint64_t need_bytes) {
  if (base_ == nullptr) return;
  uint64_t mib = (need_bytes + (1u << 20) - 1) >> 20;
  tier_header()->reclaim_need_mib.store(mib > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(mib),
                                        std::memory_order_relaxed);
  tier_header()->reclaim_gen.fetch_add(1, std::memory_order_acq_rel);
}

bool GpuRegion::HostReclaimStillShort() const {
  if (base_ == nullptr) return false;
  const TierHeader* h = tier_header();
  uint64_t budget = h->host_budget_bytes.load(std::memory_order_relaxed);
  uint64_t used = h->host_used_bytes.load(std::memory_order_relaxed);
  uint64_t need = static_cast<uint64_t>(h->reclaim_need_mib.load(std::memory_order_relaxed)) << 20;
  return used > budget || budget - used < need;
}

uint32_t GpuRegion::HostReclaimGen() const {
  return base_ == nullptr ? 0 : tier_header()->reclaim_gen.load(std::memory_order_acquire);
}

}  // namespace tf::limiter
