// Scale to zero in the GPU region: the per-process block through which a checkpointer, the
// process's own limiter and a restorer hand a swapped process to the driver's checkpoint and back
// (protocol in region_layout.h, ZeroState).
#include "limiter/core/gpu_region.h"

namespace tf::limiter {

void ResetProcessZero(ProcessZero* z) {
  if (z == nullptr) return;
  z->state.store(kZeroNone, std::memory_order_relaxed);
  z->last_error.store(0, std::memory_order_relaxed);
  z->actor_pid.store(0, std::memory_order_relaxed);
  z->actor.store(0, std::memory_order_relaxed);
  z->checkpoints.store(0, std::memory_order_relaxed);
  z->restores.store(0, std::memory_order_relaxed);
  z->last_checkpoint_us.store(0, std::memory_order_relaxed);
  z->last_restore_us.store(0, std::memory_order_relaxed);
  // wake_gen and wake_done_gen keep counting, as the tier generations do.
  z->wake_done_gen.store(z->wake_gen.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

void FillZeroInfo(const ProcessZero* z, ProcessInfo* out) {
  out->zero_state = z->state.load(std::memory_order_relaxed);
  out->zero_last_error = z->last_error.load(std::memory_order_relaxed);
  out->checkpoints = z->checkpoints.load(std::memory_order_relaxed);
  out->restores = z->restores.load(std::memory_order_relaxed);
  out->last_checkpoint_us = z->last_checkpoint_us.load(std::memory_order_relaxed);
  out->last_restore_us = z->last_restore_us.load(std::memory_order_relaxed);
  // Mid-way in or out of the driver's checkpoint counts as checkpointed: the driver holds it.
  if (out->zero_state == kZeroCheckpointed || out->zero_state == kZeroCheckpointing ||
      out->zero_state == kZeroRestoring)
    out->tier_state = kTierCheckpointed;
}

ProcessZero* GpuRegion::ZeroOfProcess(uint32_t slot) const {
  if (base_ == nullptr || slot >= kMaxProcesses) return nullptr;
  return reinterpret_cast<ProcessZero*>(base_ + kProcessZeroOffset + slot * sizeof(ProcessZero));
}

}  // namespace tf::limiter
