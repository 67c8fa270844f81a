// QuotaRegions: the node agent's ownership of the per-GPU shared quota regions (src/limiter/core,
// docs/shm-layout.md) that the limiter inside every tenant process accounts VRAM and compute in.
//
// At start the agent creates (or re-attaches to, after a restart) one region per discovered GPU
// under `dir` (default /dev/shm/tensorfusion). Then, every time it learns the allocations the
// controller placed on this node, Sync makes each region's vGPU table match: one vGPU per
// allocation on that GPU (id = allocation id, VRAM limit in bytes, compute request and limit in
// ppm of the whole GPU, QoS; with tiering, its idle timeouts: the allocation's overrides, else the
// QoS defaults, rewritten whenever they differ), created or updated in place; vGPUs of allocations that are gone are removed. Only
// vGPUs whose id looks like an allocation id ("a-...") are ever removed, so a vGPU that
// `tfusion run` made for itself without a controller is left alone. A vGPU that a live process
// still uses is kept (RemoveVgpu says busy), reported to the caller as lingering (the node agent
// stops its processes when the controller took the allocation back: VgpuStopper) and removed by
// a later Sync once its processes have exited. A suspended allocation's vGPU is held
// (VgpuAssignment::held); the hold lives in the region, so a restarted agent finds it in place.
// The vGPUs of worker sessions bound to an allocation (remote_sessions.h) follow it: held with it,
// and their session process reported as lingering once the allocation is gone (the worker removes
// the vGPU when its session ends).
//
// Thread safety: none; the agent calls it from its one control thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "hypervisor/gpu_source.h"
#include "limiter/core/gpu_region.h"

namespace tf::hypervisor {

// The folder of the per-GPU regions on this machine: $TFUSION_SHM_DIR, else
// limiter::kDefaultRegionDir. The node agent, `tfusion run` and `tfusion smi` all use it.
std::string DefaultRegionDir();
// The region files ("gpu-<uuid>.region") in `dir`, sorted; none when it does not exist.
std::vector<std::string> RegionFiles(const std::string& dir);
// Whether process `pid` is the process that started at `start_ticks`, is not this process, has
// the region file `region_path` mapped (the same device and inode, whatever path its mount
// namespace gives it) and was started for vGPU `vgpu_id`: the first TFUSION_VGPU of its /proc
// environ is `vgpu_id` (as `tfusion run` and the admission webhook give it), or a child's is
// (`tfusion run` itself), or, having none, its nearest ancestor's (within 4) is. A worker session,
// whose environment is its worker's, is checked with an empty id: then neither it nor a child of
// it was started for any vGPU, and it is a fork without exec of its parent (the same command line).
// What a tenant of that vGPU is, by facts that another tenant cannot write into the region: the
// agent checks it before it signals or checkpoints a pid the region names. A process whose /proc
// files it cannot read (without CAP_SYS_PTRACE) fails the check, said once on stderr.
bool IsTenantOfRegion(pid_t pid, uint64_t start_ticks, const std::string& region_path,
                      const std::string& vgpu_id);
// True when `pid` is a `tfusion run` holding its vGPU's process slot for its command: its command
// line is `tfusion ... run ...` (before any `--`), whichever build of tfusion it is. A worker's
// session process (`tfusion worker`) is a program of its vGPU. False when it cannot be told
// (another user's process under hidepid).
bool IsRunWrapper(int32_t pid);
// Attaches to each of `paths` once, the first time it is called (a region that does not attach
// stays unattached: GpuRegion::attached()); later calls change nothing.
void AttachRegionsOnce(const std::vector<std::string>& paths, std::vector<std::unique_ptr<limiter::GpuRegion>>* regions);

// A vGPU of an allocation that is gone which live processes still use; or the vGPU of a worker
// session bound to such an allocation ("remote-PID@a-...", remote_sessions.h), whose one process
// is the session; or one of a suspended allocation's session that has no tiering to be held with.
struct LingeringVgpu {
  std::string gpu_uuid;
  std::string id;  // the allocation id, or the session's vGPU id
  std::vector<limiter::ProcessInfo> processes;  // the live ones (pid, start time, VRAM held)
  std::string allocation;  // a session's: the allocation it is bound to; empty: `id` is the allocation
  std::string reason;      // set when the regions know it ("preempted"); else the agent's to decide
  // A suspended allocation's session whose vGPU has no tiering (its worker runs without
  // --tiering): it cannot be held swapped out, so it is stopped (reason "preempted").
  bool cannot_hold = false;
  const std::string& allocation_id() const { return allocation.empty() ? id : allocation; }
};

// One vGPU the controller placed on this node.
struct VgpuAssignment {
  std::string id;         // the allocation id
  std::string gpu_uuid;
  uint64_t vram_limit_bytes = 0;
  uint64_t compute_share_ppm = 0;  // the request, of the whole GPU; >= 1,000,000: unthrottled
  uint64_t compute_limit_ppm = 0;  // the ceiling; 0 or below the request: the request
  uint32_t qos = limiter::kDefaultQos;  // 0 low .. 3 critical
  bool tiering = false;  // movable VRAM, swapped out after the QoS's idle timeout (oversold pools)
  uint32_t freeze_requests = 0;  // the allocation's API freeze and thaw requests so far
  uint32_t thaw_requests = 0;
  // Its allocation is suspended by a preemption: the vGPU is held (VgpuTier::held: swapped out,
  // GPU calls wait) and its compute request and limit drop to kHeldSharePpm. Cleared: the hold
  // ends and a thaw brings the VRAM back ahead of the next call.
  bool held = false;
  // Tier idle overrides of the allocation, ms (0 = never); -1: the QoS default.
  int64_t idle_swap_ms = -1;
  int64_t idle_disk_ms = -1;
  int64_t idle_zero_ms = -1;  // scale to zero after this long idle (-1 or 0: never)
  // Of freeze_requests, those at level zero: after the swap-out, the node agent's zero keeper
  // checkpoints the processes (VgpuTier::zero_gen).
  uint32_t zero_requests = 0;
};

// The compute share of a held vGPU: the least the region takes (one millionth of the GPU).
inline constexpr uint64_t kHeldSharePpm = 1;

class QuotaRegions {
 public:
  // `dir` empty: $TFUSION_SHM_DIR, else limiter::kDefaultRegionDir (the folder `tfusion run`
  // and the limiter use).
  explicit QuotaRegions(std::string dir = "");

  // Creates the region of one GPU (or attaches to a compatible existing one; the capacity is
  // then updated). `capacity_tflops` 0 (a model the catalog lacks) records capacity 0.
  Status AttachGpu(const DiscoveredGpu& gpu, double capacity_tflops);
  // Makes every attached region's vGPUs match `assignments` (entries for unknown GPUs are
  // ignored). Returns the first error; the other regions are still synced. `lingering` (may be
  // null) receives the vGPUs that are not wanted but could not be removed because live processes
  // use them.
  Status Sync(const std::vector<VgpuAssignment>& assignments,
              std::vector<LingeringVgpu>* lingering = nullptr);
  void DetachAll();

  const std::string& dir() const { return dir_; }
  std::vector<std::string> attached() const;  // GPU uuids
  // The region of one GPU, or null.
  limiter::GpuRegion* region(const std::string& gpu_uuid);

 private:
  std::string dir_;
  std::map<std::string, std::unique_ptr<limiter::GpuRegion>> regions_;  // by GPU uuid
};

// A RegionError (+ detail) as a Status.
Status RegionStatus(limiter::RegionError e, const std::string& what,
                    const limiter::RegionErrorDetail* why = nullptr);

}  // namespace tf::hypervisor
