// `tfusion worker`'s session vGPUs and their pool allocations: see worker_sessions.h.
#include "cli/worker_sessions.h"

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "cli/compute_flags.h"
#include "cli/local_vgpu.h"
#include "cli/quantity.h"
#include "controller/model.h"
#include "hypervisor/quota_regions.h"
#include "hypervisor/remote_sessions.h"
#include "limiter/core/gpu_region.h"
#include "limiter/core/tier_defaults.h"

namespace tf::cli {

Status ApplyClientAllocation(const worker::SessionLimits& l, pid_t session, bool has_keeper, RunOptions* ro,
                             std::string* vgpu_id) {
  if (!l.allocation.empty() && !hypervisor::IsAllocationId(l.allocation)) {
    return InvalidArgument("the client's allocation '" + l.allocation +
                           "' is not an allocation id (a- and 1 to 40 of 0-9, a-z)");
  }
  *vgpu_id = hypervisor::SessionVgpuId(session, l.allocation);
  if (!ro->tiering) return Status::Ok();  // the worker's policy: no movable VRAM, nothing to time
  if (!l.idle_swap.empty()) ro->idle_swap = l.idle_swap;
  if (!l.idle_disk.empty()) ro->idle_disk = l.idle_disk;
  if (l.idle_zero.empty()) return Status::Ok();
  StatusOr<uint64_t> zero = ParseDurationMs("the allocation's idle zero timeout", l.idle_zero);
  if (!zero.ok()) return zero.status();
  uint64_t swap = 0;
  if (!ro->idle_swap.empty()) {
    StatusOr<uint64_t> s = ParseDurationMs("the allocation's idle swap timeout", ro->idle_swap);
    if (!s.ok()) return s.status();
    swap = *s;
  } else {
    StatusOr<uint32_t> qos = ParseQosFlag(ro->qos);
    if (!qos.ok()) return qos.status();
    swap = limiter::DefaultIdleSwapMs(*qos);
  }
  Status valid = controller::ValidateIdleZero("the allocation's idle zero timeout", static_cast<int64_t>(*zero),
                                              "its idle swap timeout", static_cast<int64_t>(swap));
  if (!valid.ok()) return valid;
  ro->idle_zero = l.idle_zero;  // wins over the worker's --idle-zero, "never" included
  if (*zero > 0 && !has_keeper) {
    std::fprintf(stderr, "tfusion worker: session %d: the allocation's idle zero timeout (%s) is not carried out: "
                 "this worker has no zero keeper\n", static_cast<int>(session), l.idle_zero.c_str());
  }
  return Status::Ok();
}

Status FinishSessionVgpu(const std::string& region_path, const std::string& vgpu_id) {
  if (hypervisor::BoundAllocation(vgpu_id).empty()) return Status::Ok();
  return hypervisor::MarkSessionVgpuNotAdopted(region_path, vgpu_id);
}

void RemoveSessionVgpus(pid_t session) {
  const std::string dir = RegionDir();
  auto snap = std::make_unique<limiter::RegionSnapshot>();
  for (const std::string& f : hypervisor::RegionFiles(dir)) {
    limiter::GpuRegion region;
    if (limiter::GpuRegion::Attach(f.c_str(), &region) != limiter::RegionError::kOk) continue;
    region.Snapshot(snap.get());
    for (uint32_t i = 0; i < snap->vgpu_count; ++i) {
      const std::string id = snap->vgpus[i].id;  // Snapshot ends every id
      if (!hypervisor::IsVgpuOfSession(id, session)) continue;
      // A held lock: a live session of another worker whose pid (in its own PID namespace) is the same.
      int held = -1;
      const hypervisor::SessionState state = hypervisor::SessionVgpuState(dir, id, &held);
      if (state == hypervisor::SessionState::kLive) continue;
      // No lock file of ours while our folder is usable (our sessions all take one there): not our
      // session's, but another user's worker's whose session has this pid in another PID namespace.
      if (state == hypervisor::SessionState::kUnknown && hypervisor::SessionLockDirTrusted(dir, false, nullptr))
        continue;
      hypervisor::RemoveUnusedVgpu(f, id);
      uint32_t index = 0;
      // Its lock file goes with it; while a live process still uses it (a forked child that
      // outlived the session), the file stays, so that a later sweep removes it then.
      if (region.FindVgpu(id.c_str(), &index) == limiter::RegionError::kOk) {
        if (held >= 0) close(held);
      } else {
        hypervisor::DropSessionVgpuLock(dir, id, held);
      }
    }
  }
  // Its lock file, and what sessions that died with an earlier worker left.
  RemoveEndedSessionVgpus();
}

std::vector<std::string> RemoveEndedSessionVgpus() { return hypervisor::RemoveEndedSessionVgpus(RegionDir()); }

}  // namespace tf::cli
