// Scale to zero of remote sessions: the zero keeper of `tfusion worker --tiering`
// (worker::WorkerOptions::keeper). It checkpoints and restores the worker's own session processes
// (vGPUs "remote-<session pid>") with the driver's process checkpoint API: on a session's wake
// request (its next call from the client), on the vGPU's idle-zero timeout (--idle-zero), and for
// a thaw request; `tfusion freeze remote-PID --zero` checkpoints from the CLI's process.
#pragma once

#include <atomic>
#include <string>

namespace tf::cli {

// Runs a hypervisor::ZeroRestorer over every GPU region of this machine (RegionDir(), listed
// again each second: a region appears with the first session of its GPU), restricted to the
// worker's vGPUs, until `stop`. `libcuda_path`: the real driver (loaded at the first checkpoint
// or restore).
void RunWorkerZeroKeeper(const std::string& libcuda_path, const std::atomic<bool>& stop);

}  // namespace tf::cli
