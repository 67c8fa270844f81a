// `tfusion worker`: the vGPU each session gets and what a pool allocation changes about it. A
// client from `tfusion run --controller` placed on this node sends its allocation's id and tier
// idle timeouts (limits record version 5); the session's vGPU is then bound to the allocation
// ("remote-PID@a-...", hypervisor/remote_sessions.h) and takes those timeouts instead of the
// worker's own, the idle zero timeout included.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "cli/run_command.h"
#include "common/status.h"
#include "worker/worker.h"

namespace tf::cli {

// Fills `ro` (already holding the worker's --tiering, --idle-swap and --idle-zero) with what the
// client's allocation asks for, and `vgpu_id` with the session's vGPU id. Without tiering the
// timeouts change nothing. Refused (InvalidArgument, naming the field and the value): an
// allocation id that is not one, an idle timeout that is not a duration of at most 30 days, an
// idle zero timeout not longer than the session's swap timeout. `has_keeper`: the worker runs a
// zero keeper (else an idle zero timeout is kept but logged as not carried out).
Status ApplyClientAllocation(const worker::SessionLimits& l, pid_t session, bool has_keeper, RunOptions* ro,
                             std::string* vgpu_id);

// After PrepareVgpu made it: a bound session's vGPU is marked so that the node agent adopts the
// allocation's earlier tier requests instead of carrying them out.
Status FinishSessionVgpu(const std::string& region_path, const std::string& vgpu_id);

// Removes the vGPU of session `session` (bound or not) from every GPU region, once it has exited,
// unless its lock is held (a live session of another worker with the same pid in another PID
// namespace); then RemoveEndedSessionVgpus.
void RemoveSessionVgpus(pid_t session);

// hypervisor::RemoveEndedSessionVgpus of this machine's region folder.
std::vector<std::string> RemoveEndedSessionVgpus();

}  // namespace tf::cli
