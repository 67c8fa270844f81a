// The VRAM ledger: per-vGPU reservations shared by all processes of the vGPU.
//
// Invariant (holds whenever a vGPU's mutex is unlocked):
//   vgpu.vram_used_bytes == sum of vram_bytes over active process slots of that vGPU.
// Every update happens under the vGPU's robust mutex and touches the process slot first, the vGPU
// total second. A holder killed between the two leaves the mutex EOWNERDEAD; RecomputeUsed (run by
// the next locker) restores the invariant from the slots, which are the source of truth. Dead
// processes' slots are then freed by Reap, returning their bytes.
#include <cstring>

#include "limiter/core/gpu_region.h"
#include "limiter/core/robust_mutex.h"

namespace tf::limiter {
namespace {

struct RecoverCtx {
  VgpuSlot* vgpu;
  ProcessSlot* processes;
  uint32_t vgpu_index;
};

void RecomputeUsed(void* arg) {
  auto* c = static_cast<RecoverCtx*>(arg);
  uint64_t sum = 0;
  for (uint32_t i = 0; i < kMaxProcesses; ++i) {
    const ProcessSlot& p = c->processes[i];
    if (p.state.load(std::memory_order_acquire) == kSlotActive &&
        p.vgpu_index.load(std::memory_order_relaxed) == c->vgpu_index) {
      sum += p.vram_bytes.load(std::memory_order_relaxed);
    }
  }
  c->vgpu->vram_used_bytes.store(sum, std::memory_order_relaxed);
}

}  // namespace

RegionError GpuRegion::LockVgpu(uint32_t vgpu_index) {
  RecoverCtx ctx{vgpu(vgpu_index), process(0), vgpu_index};
  return LockRobust(&vgpu(vgpu_index)->mutex, &RecomputeUsed, &ctx);
}

RegionError GpuRegion::Reserve(uint32_t slot, uint64_t bytes) {
  uint32_t vi = 0;
  if (!ValidActiveProcess(slot, &vi)) return RegionError::kInvalidArgument;
  ProcessSlot* p = process(slot);
  VgpuSlot* v = vgpu(vi);
  for (int attempt = 0; attempt < 2; ++attempt) {
    RegionError e = LockVgpu(vi);
    if (e != RegionError::kOk) return e;
    {
      RobustGuard guard(&v->mutex);
      if (p->state.load(std::memory_order_acquire) != kSlotActive) return RegionError::kInvalidArgument;
      uint64_t used = v->vram_used_bytes.load(std::memory_order_relaxed);
      uint64_t limit = v->vram_limit_bytes.load(std::memory_order_relaxed);
      if (bytes <= limit && used <= limit - bytes) {
        p->vram_bytes.store(p->vram_bytes.load(std::memory_order_relaxed) + bytes, std::memory_order_relaxed);
        v->vram_used_bytes.store(used + bytes, std::memory_order_relaxed);
        return RegionError::kOk;
      }
    }
    // Over the limit: a dead process of this vGPU may still hold quota. Reap (outside the vGPU
    // mutex: lock order is table before vGPU) and retry once if anything was freed.
    if (attempt == 0 && ReapDeadOfVgpu(vi) == 0) break;
  }
  v->oom_total.fetch_add(1, std::memory_order_relaxed);
  return RegionError::kOutOfMemory;
}

RegionError GpuRegion::Release(uint32_t slot, uint64_t bytes) {
  uint32_t vi = 0;
  if (!ValidActiveProcess(slot, &vi)) return RegionError::kInvalidArgument;
  ProcessSlot* p = process(slot);
  VgpuSlot* v = vgpu(vi);
  RegionError e = LockVgpu(vi);
  if (e != RegionError::kOk) return e;
  RobustGuard guard(&v->mutex);
  if (p->state.load(std::memory_order_acquire) != kSlotActive) return RegionError::kInvalidArgument;
  uint64_t held = p->vram_bytes.load(std::memory_order_relaxed);
  uint64_t r = bytes <= held ? bytes : held;
  p->vram_bytes.store(held - r, std::memory_order_relaxed);
  uint64_t used = v->vram_used_bytes.load(std::memory_order_relaxed);
  v->vram_used_bytes.store(used >= r ? used - r : 0, std::memory_order_relaxed);
  if (r != bytes || used < r) {
    v->drift_events.fetch_add(1, std::memory_order_relaxed);
    return RegionError::kInvalidArgument;
  }
  return RegionError::kOk;
}

uint64_t GpuRegion::Used(uint32_t vgpu_index) const {
  if (base_ == nullptr || vgpu_index >= kMaxVgpus) return 0;
  return vgpu(vgpu_index)->vram_used_bytes.load(std::memory_order_relaxed);
}

uint64_t GpuRegion::Limit(uint32_t vgpu_index) const {
  if (base_ == nullptr || vgpu_index >= kMaxVgpus) return 0;
  return vgpu(vgpu_index)->vram_limit_bytes.load(std::memory_order_relaxed);
}

uint64_t GpuRegion::ProcessBytes(uint32_t slot) const {
  if (base_ == nullptr || slot >= kMaxProcesses) return 0;
  return process(slot)->vram_bytes.load(std::memory_order_relaxed);
}

}  // namespace tf::limiter
