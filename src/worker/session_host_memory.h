// The GPU host's memory that one session holds for its client, and its limits (docs/remote.md
// "Host memory of a session"). Page-locked memory the session pins (host regions, mirrors, the
// registered bulk arena, host-located cuMemCreate allocations) counts against the session's
// host-memory limit (`tfusion worker --session-host-mem`). Managed memory, which the session
// serves as pinned host memory too, counts against the VRAM quota of the session's vGPU when the
// driver is the limiter with a vGPU (as cuMemAllocManaged does locally), and against the
// host-memory limit otherwise. A charge that does not fit is refused with
// CUDA_ERROR_OUT_OF_MEMORY and one log line naming the limit; freeing gives the charge back.
//
// Session thread only.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "driver/driver_table.h"

namespace tf::worker {

// A quarter of this machine's physical memory: what a session may pin when the worker is given
// no --session-host-mem.
uint64_t DefaultSessionHostMemory();

class SessionHostMemory {
 public:
  enum class Pool : uint8_t { kNone, kHost, kVram };
  // What one allocation was charged, to give back with Release.
  struct Charge {
    Pool pool = Pool::kNone;
    uint64_t bytes = 0;
  };

  // limit: bytes of host memory the session may pin (0: DefaultSessionHostMemory()).
  SessionHostMemory(const driver::DriverTable& d, uint64_t limit);
  SessionHostMemory(const SessionHostMemory&) = delete;
  SessionHostMemory& operator=(const SessionHostMemory&) = delete;

  // Finds the limiter's VRAM charge in the loaded driver library (absent: no vGPU quota, and
  // managed memory counts as pinned host memory).
  void BindDriver(void* library);

  // `bytes` of pinned host memory for `what` (a short noun: "host region", "mirror"):
  // CUDA_SUCCESS and *c, or CUDA_ERROR_OUT_OF_MEMORY (logged) when it would pass the limit.
  CUresult ChargePinned(uint64_t bytes, const char* what, Charge* c);
  // `bytes` of managed memory: the vGPU's VRAM quota when there is one, else as ChargePinned.
  CUresult ChargeManaged(uint64_t bytes, Charge* c);
  // Gives a charge back (idempotent: *c is cleared).
  void Release(Charge* c);

  uint64_t used() const { return used_; }
  uint64_t limit() const { return limit_; }

 private:
  using ChargeVramFn = CUresult (*)(unsigned long long bytes, int* charged);
  using ReleaseVramFn = void (*)(unsigned long long bytes);

  const driver::DriverTable& d_;
  uint64_t limit_;
  uint64_t used_ = 0;
  ChargeVramFn charge_vram_ = nullptr;
  ReleaseVramFn release_vram_ = nullptr;
};

}  // namespace tf::worker
