// Scale to zero: after our swap-out, the rest of a tenant process (its context and the VRAM that
// cannot move) is checkpointed by the driver (cuCheckpointProcess*, driver 550 and newer), and
// restored when one of its calls needs the GPU again. The driver requires these calls to come from
// another process than the tenant: `tfusion freeze --zero` checkpoints; `tfusion run` (the parent
// that waits for its command), the node agent and `tfusion thaw` restore.
//
// The handshake with the tenant's limiter goes through the process's ProcessZero block in its GPU
// region (states and who moves them: limiter/core/region_layout.h). The limiter parks the process
// first (every call held at our layer, none inside the driver), so that no call of the tenant can
// block inside the driver; a held call asks for the restore (wake_gen) and waits for it.
#pragma once

#include <atomic>
#include <map>
#include <set>
#include <tuple>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "limiter/core/gpu_region.h"

namespace tf::hypervisor {

// The checkpoint entry points of the real libcuda (loaded with dlopen, cuInit(0), no context).
// Thread-compatible: calls may come from any one thread at a time.
class CheckpointDriver {
 public:
  // `libcuda_path`: the real driver, never the limiter. Unavailable when it cannot be loaded, has
  // no checkpoint API (drivers before 550) or does not initialise.
  static StatusOr<std::unique_ptr<CheckpointDriver>> Load(const std::string& libcuda_path);
  ~CheckpointDriver();

  // CUresult values; the argument structures are zeroed (no GPU remapping at restore).
  int Lock(int pid, unsigned timeout_ms);
  int Checkpoint(int pid);
  int Restore(int pid);
  int Unlock(int pid);
  // CUprocessState: 0 running, 1 locked, 2 checkpointed, 3 failed.
  int State(int pid, int* state);

 private:
  CheckpointDriver() = default;
  void* handle_ = nullptr;
  int (*lock_)(int, void*) = nullptr;
  int (*checkpoint_)(int, void*) = nullptr;
  int (*restore_)(int, void*) = nullptr;
  int (*unlock_)(int, void*) = nullptr;
  int (*state_)(int, int*) = nullptr;
};

struct CheckpointOutcome {
  int pid = 0;
  bool ok = false;
  uint32_t error = 0;     // CUresult of the driver's refusal, 0 when the failure was ours
  std::string why;        // on failure
  double park_ms = 0;     // until the limiter held every call
  double checkpoint_ms = 0;  // lock + checkpoint
};

// Hands process slot `slot` (swapped out, of a vGPU with tiering) to the driver's checkpoint: asks
// its limiter to park (waits at most park_timeout_ms), then locks and checkpoints it. On any
// failure the process is left swapped and running (its next GPU call resumes it as usual).
CheckpointOutcome CheckpointProcess(const limiter::GpuRegion& region, uint32_t slot, CheckpointDriver& driver,
                                    int64_t park_timeout_ms = 5'000);

// Restores and unlocks process slot `slot` if it is checkpointed (claims it first, so several
// restorers never act on one process twice). CUDA_SUCCESS (0) when it runs again or was not
// checkpointed; the driver's error otherwise, recorded in the region for the waiting call (the
// process stays checkpointed).
int RestoreProcess(const limiter::GpuRegion& region, uint32_t slot, CheckpointDriver& driver);

// When the checkpointer or restorer acting on process slot `slot` is gone (killed outright: its
// actor no longer exists in our PID namespace) and left it parked, checkpointing or restoring,
// takes the slot over and puts the process back: unparked when the driver was not touched, else
// restored and unlocked as the driver's state requires (`driver` may be null only for the first
// case; otherwise the slot is left for a party that has one). Returns -1 when there was nothing
// to take over, else the CUresult of putting it back (recorded as for RestoreProcess).
int RecoverFromGoneActor(const limiter::GpuRegion& region, uint32_t slot, CheckpointDriver* driver);

// The zero keeper of a set of GPU regions, on its own thread: it restores the processes whose
// calls asked for it (a 5 ms scan of the regions' process tables) and, every 100 ms, carries out
// the vGPUs' scale-to-zero policy:
//  - a zero request (VgpuTier::zero_gen, made with a freeze): once every process of the vGPU has
//    acted on the freeze, each swapped one is checkpointed (given up after 60 s);
//  - idle_zero_ms: a process swapped and idle that long (ProcessTier::last_active_ns) is
//    checkpointed; a refused or failed attempt waits another idle period;
//  - a thaw request (VgpuTier::thaw_gen) restores the checkpointed processes that have not acted on
//    it, so that their limiter can swap in.
// Checkpoints run on the keeper's thread (the park takes up to 5 s), so a restore may wait behind
// one. The driver is loaded at the first checkpoint or restore; a driver that cannot be loaded is
// reported once and each restore request then fails with CUDA_ERROR_NOT_SUPPORTED for the waiting
// call (and nothing is checkpointed).
class ZeroRestorer {
 public:
  // `region_paths`: the GPU regions to watch; `only_vgpu`: a vGPU id to restrict to (empty: all);
  // `vgpu_prefix`: restrict to vGPUs whose id starts with it (the node agent: "a-", its
  // allocations').
  ZeroRestorer(std::string libcuda_path, std::vector<std::string> region_paths, std::string only_vgpu = "",
               std::string vgpu_prefix = "", std::string log_prefix = "tfusion");
  ~ZeroRestorer();  // stops the thread
  void Start();
  void Stop();
  // One scan of the wake requests; returns the restores attempted. For the thread and for tests.
  int PollOnce();
  // One pass of the policy (zero requests, idle_zero_ms, thaws) at CLOCK_MONOTONIC `now_ns`;
  // returns the checkpoints and restores attempted. For the thread and for tests.
  int PolicyOnce(int64_t now_ns);

 private:
  void AttachLazily();
  bool Wanted(const char* vgpu_id) const;
  hypervisor::CheckpointDriver* Driver();

  std::string libcuda_path_;
  std::vector<std::string> region_paths_;
  std::string only_vgpu_;
  std::string vgpu_prefix_;
  std::string log_prefix_;
  std::vector<std::unique_ptr<limiter::GpuRegion>> regions_;  // attached lazily
  std::unique_ptr<CheckpointDriver> driver_;
  bool driver_failed_ = false;
  // Idle policy: (region, slot, pid) -> CLOCK_MONOTONIC ns of the last checkpoint attempt.
  std::map<std::tuple<size_t, uint32_t, int32_t>, int64_t> idle_attempts_;
  // Zero requests: (region, vGPU) -> (zero_gen being carried out, ns first seen, pids tried).
  struct ZeroRequest {
    uint32_t gen = 0;
    int64_t since_ns = 0;
    std::set<int32_t> tried;
  };
  std::map<std::pair<size_t, uint32_t>, ZeroRequest> zero_requests_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tf::hypervisor
