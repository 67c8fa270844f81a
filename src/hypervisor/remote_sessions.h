// Remote worker sessions bound to a pool allocation (docs/tiering.md, "Remote sessions"). A
// `tfusion run --controller` placed on another node runs its command through that node's worker;
// the session's vGPU in the GPU region is then named "remote-<session pid>@<allocation id>", so
// that the node agent finds the sessions of each of its allocations and passes the allocation's
// tier idle timeouts and its API freeze, zero and thaw requests on to them, as it does for the
// allocation's own vGPU. The worker's zero keeper (it watches every "remote-" vGPU) carries out
// the zero requests and the idle zero timeout; the node agent only writes them into the region.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "limiter/core/gpu_region.h"

namespace tf::hypervisor {

struct VgpuAssignment;
struct LingeringVgpu;

// A valid allocation id as the controller makes them and a client may send it: "a-" followed by
// 1 to 40 of [0-9a-z].
bool IsAllocationId(const std::string& id);

// The vGPU id of a worker session: "remote-PID", or "remote-PID@ALLOCATION" when bound to an
// allocation (which must satisfy IsAllocationId).
std::string SessionVgpuId(pid_t session, const std::string& allocation);

// The allocation a session vGPU id is bound to ("" when `vgpu_id` is not one of a bound session).
std::string BoundAllocation(const std::string& vgpu_id);

// True when `vgpu_id` is the vGPU of session `session`, bound or not.
bool IsVgpuOfSession(const std::string& vgpu_id, pid_t session);
// The session pid of a session vGPU id ("remote-PID[@...]"), or -1 when `vgpu_id` is not one.
pid_t SessionOfVgpu(const std::string& vgpu_id);

// The API request generations (VgpuTier::api_freeze_gen, api_thaw_gen, api_zero_gen) of a bound
// session's vGPU before the node agent has seen it: it then takes the allocation's counts as
// already passed on, so that a session never acts on requests made before it existed.
inline constexpr uint32_t kRequestsNotAdopted = 0xFFFFFFFFu;

// Marks the freshly made vGPU `vgpu_id` of `region_path` as not adopted yet (above).
Status MarkSessionVgpuNotAdopted(const std::string& region_path, const std::string& vgpu_id);

// The worker's zero keeper holds a shared lock on this file in the region folder while it runs,
// so that the node agent can tell whether a bound session can be scaled to zero.
std::string RemoteZeroKeeperLockPath(const std::string& region_dir);
// Takes that lock (blocking; shared, so several workers' keepers may hold it) and returns the
// descriptor that holds it (closed at exit), or -1 when it cannot.
int HoldRemoteZeroKeeperLock(const std::string& region_dir);
// True while some worker's zero keeper holds the lock.
bool RemoteZeroKeeperAlive(const std::string& region_dir);

// Each session holds a shared lock on a file of its own in the region folder from before its
// vGPU is made until it exits, so that the vGPU of a session that died with its worker (a worker
// killed with SIGKILL cannot remove it) is told from a live one by any process, in any PID
// namespace that shares the folder: the kernel drops the lock with the session.
// The lock file of session vGPU `vgpu_id` ("" when `vgpu_id` is not a well-formed session id:
// "remote-PID" or "remote-PID@ALLOCATION").
std::string SessionVgpuLockPath(const std::string& region_dir, const std::string& vgpu_id);
// Takes that lock for the calling process and returns the descriptor that holds it (kept open
// until the process exits), or -1 with `why` set when it cannot (the folder or the file cannot be
// opened, or another process kept it locked for 2 s).
int HoldSessionVgpuLock(const std::string& region_dir, const std::string& vgpu_id, std::string* why);
// True when session vGPU `vgpu_id` has a lock file and no process holds it: its session is gone.
// While true, the lock stays taken (exclusively) by `*held_fd`, so that no new session of the
// same id takes it meanwhile; the caller removes the vGPU, then calls DropSessionVgpuLock. A vGPU
// without a lock file (made by an older worker, or by a session that could not take it) is never
// reported.
bool SessionVgpuEnded(const std::string& region_dir, const std::string& vgpu_id, int* held_fd);
// Removes the lock file (if `held_fd`, taken by SessionVgpuEnded, still names it) and closes `held_fd`.
void DropSessionVgpuLock(const std::string& region_dir, const std::string& vgpu_id, int held_fd);
// What a session known to have ended left of its lock: the file is removed unless a process holds
// it again (a later session of the same pid). False when it is held or there is none.
bool ReleaseEndedSessionVgpuLock(const std::string& region_dir, const std::string& vgpu_id);

// The node agent's part (QuotaRegions::Sync), for allocation `a` on region `r`: every vGPU of a
// session bound to it that a live process uses takes the allocation's idle timeouts (when it has
// tiering) and the allocation's freeze, zero and thaw requests made since the agent first saw it.
// A zero request for a session whose worker has no zero keeper (`keeper_alive` false) is refused:
// neither the freeze nor the zero reaches that session, and the agent's log says why.
// A suspended allocation (a.held) holds its sessions as its own vGPU: `held` and kHeldSharePpm
// while it lasts (a session that binds meanwhile starts held), then the allocation's compute
// request and limit again and a thaw. A session without tiering cannot be held swapped out: it
// is added to `stop` (reason "preempted"), as a victim without tiering is stopped.
Status SyncBoundSessions(limiter::GpuRegion& r, const limiter::RegionSnapshot& snap, const VgpuAssignment& a,
                         bool keeper_alive, std::vector<LingeringVgpu>* stop = nullptr);

// The live worker session process of a bound session vGPU `v` of `snap`: only the process whose
// pid is the one in the vGPU's id and that registered on that vGPU itself (its pid and start
// time as the region recorded them, still naming the same process in /proc, which has the region
// at `region_path` mapped: IsTenantOfRegion). Empty when it is gone, or when only other processes
// use the vGPU (never the session: they are left alone).
std::vector<limiter::ProcessInfo> LiveSessionProcess(const limiter::RegionSnapshot& snap, const limiter::VgpuInfo& v,
                                                     const std::string& region_path);

}  // namespace tf::hypervisor
