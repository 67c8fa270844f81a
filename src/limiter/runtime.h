// The limiter's process-wide state: the real driver, and this process's binding to its vGPU in
// the per-GPU shared region. Initialised once (EnsureInit), re-armed in a forked child.
#pragma once

#include <cstdint>

#include "limiter/core/gpu_region.h"

namespace tf::limiter {

// Allocation granule all VRAM charges are rounded up to (the driver's large-page size): the
// ceiling can then be exceeded by at most one granule of driver-side rounding.
inline constexpr uint64_t kVramGranule = 2ull << 20;

inline uint64_t RoundToGranule(uint64_t bytes) {
  return (bytes + kVramGranule - 1) / kVramGranule * kVramGranule;
}

struct Binding {
  bool configured = false;   // TFUSION_REGION/TFUSION_VGPU were set: this process has a vGPU
  bool failed = false;       // configured, but the region or vGPU could not be attached
  GpuRegion region;
  uint32_t vgpu = 0;
  uint32_t slot = 0;         // this process's slot; re-attached lazily after fork
  int slot_pid = 0;          // the pid that owns `slot`
  bool unthrottled = true;   // the vGPU's share is >= 100%
  char vgpu_id[64] = {};
};

// The binding for the current process, attaching a process slot first if this process (for
// example a forked child) has none yet. nullptr when the process runs without a vGPU or the
// binding failed (Failed() tells which). Not for the launch hot path.
Binding* Bound();
bool BindingFailed();
// The binding if configured, without attaching (for the launch fast path); may be nullptr.
Binding* RawBinding();

}  // namespace tf::limiter
