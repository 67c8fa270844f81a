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

// The id of the vGPU that `tfusion run` (process `run`) makes for itself when given no --vgpu
// name and no pool: "run-PID". It is locked as a session's is (SessionVgpuLockPath).
std::string RunVgpuId(pid_t run);

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

// Each session holds a shared lock on a file of its own from before its vGPU is made until it
// exits, so that the vGPU of a session that died with its worker (a worker killed with SIGKILL
// cannot remove it) is told from a live one by any process of the worker's user, even
// in another PID namespace sharing the region folder, where the pid in the id means nothing: the
// kernel drops the lock with the session. `tfusion run` does the same for the vGPU it makes
// ("run-PID", or the `--vgpu` name several runs share), and its command inherits the lock, so that
// the vGPU of a run killed outright counts as live until the command and every process that kept
// the descriptor (of every run of that name) have exited. Each user has a lock folder
// of its own in the region folder, "session-locks-<uid>" (0700), so that no other user can make,
// hold or replace one of its lock files, and each user (root too) sweeps only its own folder's.
std::string SessionLockDir(const std::string& region_dir);
// True when this user's folder is a real directory (not a link), owned by this user and closed to
// everyone else; `create` makes it when missing. Else false, with `why` (if given).
bool SessionLockDirTrusted(const std::string& region_dir, bool create, std::string* why);
// The lock file of session or run vGPU `vgpu_id`: "<id>.lock" for "remote-PID",
// "remote-PID@ALLOCATION" and "run-PID", "vgpu-<id in hex>.lock" for any other name a run gives
// its vGPU (`tfusion run --vgpu NAME`; all the runs of a name hold its lock). "" for a pool
// allocation's id ("a-..."), a session id not spelt as SessionVgpuId spells it, and an id that
// cannot be a vGPU's (ids come from a region any tenant can write, and this names a file).
std::string SessionVgpuLockPath(const std::string& region_dir, const std::string& vgpu_id);
// Takes that lock for the calling process and returns the descriptor that holds it (kept open
// until the process exits), or -1 with `why` set when it cannot: the folder cannot be made or is
// not trusted, the file cannot be made, or a reaper kept it locked for 10 s.
int HoldSessionVgpuLock(const std::string& region_dir, const std::string& vgpu_id, std::string* why);

enum class SessionState {
  kUnknown,  // no lock file (a vGPU of an older worker, or of a session that never took one) or no trusted folder
  kLive,     // its lock is held (or the file is not a plain file: left alone)
  kEnded,    // its lock file is there and nobody holds it: its session is gone
};
// What the lock of session vGPU `vgpu_id` says. kEnded leaves the lock taken (exclusively) by
// `*held_fd`, so that no new session of the same id takes it meanwhile; the caller removes the
// vGPU, then calls DropSessionVgpuLock (or just closes `*held_fd` when the vGPU stays).
SessionState SessionVgpuState(const std::string& region_dir, const std::string& vgpu_id, int* held_fd);
// Removes the lock file (if `held_fd`, from SessionVgpuState, still names it) and closes `held_fd`.
void DropSessionVgpuLock(const std::string& region_dir, const std::string& vgpu_id, int held_fd);
// The session vGPU ids of the lock files in the lock folder (none when it is not trusted).
std::vector<std::string> SessionLockIds(const std::string& region_dir);

// Removes from every GPU region of `region_dir` the vGPUs of sessions and runs that have ended,
// which only a worker or a `tfusion run` killed outright (SIGKILL) leaves behind, and the lock
// files they leave: a session's lock (HoldSessionVgpuLock) is held while it lives, whatever PID
// namespace it runs in, and a run's while it or its command lives (while any run of a name does). A vGPU a live process still
// uses is kept, and so is one without a lock file (made by an older version). Nothing is done
// without a trusted lock folder (another user's, or none yet). Returns the ids of the vGPUs
// removed.
std::vector<std::string> RemoveEndedSessionVgpus(const std::string& region_dir);
// Removes vGPU `vgpu_id` from the region at `region_path` unless a live process still uses it
// (its dead processes' slots are reaped first); nothing when either is not there.
void RemoveUnusedVgpu(const std::string& region_path, const std::string& vgpu_id);
// Before a session or run takes the lock of `vgpu_id` and makes its vGPU: removes from every GPU
// region of `region_dir` a vGPU of that id that an ended session or run of this user left (its
// lock file free) and no live process uses, with its lock file, so that the new vGPU starts
// afresh instead of taking over the dead one's counters (pids are reused). False when the id is
// still taken: its lock is held, or a vGPU of that id is left (a live process uses it, or it has
// no lock file of this user's: another user's, an older version's, or made without a lock), or a
// region file could not be read.
bool ClearEndedVgpuOfId(const std::string& region_dir, const std::string& vgpu_id);

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
