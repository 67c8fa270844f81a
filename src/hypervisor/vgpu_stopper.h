// VgpuStopper: stops the tenant processes that still run on a vGPU whose allocation the
// controller took back (preempted for a higher QoS, released with its lost node, or released by
// request while in use). Without it a preempted tenant would keep computing on capacity that now
// belongs to someone else.
//
// The processes are the ones registered on the vGPU in the GPU's shared quota region (the limiter
// registers every process that uses the vGPU; `tfusion run` registers itself too). The first Step
// sends SIGTERM to each; a Step `grace_ms` or more after that sends SIGKILL to those still alive.
// A process is signalled only while its pid still names the process that registered (pid and
// start time, ProcessAlive), so a reused pid is never hit. Pids are those of the agent's PID
// namespace: the agent must share the tenants' (on Kubernetes: hostPID).
//
// Thread safety: none; the node agent calls it from its control thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "controller/clock.h"
#include "hypervisor/quota_regions.h"

namespace tf::hypervisor {

class VgpuStopper {
 public:
  // `clock` must outlive the stopper. grace_ms >= 0.
  VgpuStopper(const controller::Clock* clock, int64_t grace_ms);

  // One enforcement step for a vGPU whose allocation is gone while `v.processes` still run on
  // it. `reason` ("preempted", "node-lost", "released") goes into the log.
  void Step(const LingeringVgpu& v, const std::string& reason);
  // Whether Step has begun stopping vGPU `id`.
  bool Stopping(const std::string& id) const { return stopping_.count(id) != 0; }
  // The vGPU `id` has no process left: forgets it and returns how many distinct processes were
  // signalled, or -1 when it was never being stopped.
  int Finish(const std::string& id);

  size_t stopping_count() const { return stopping_.size(); }
  uint64_t sigterm_total() const { return sigterm_total_; }
  uint64_t sigkill_total() const { return sigkill_total_; }
  int64_t grace_ms() const { return grace_ms_; }

 private:
  struct Stop {
    int64_t started_ms = 0;
    bool killed = false;  // SIGKILL sent
    std::map<int32_t, uint64_t> signalled;  // pid -> start time
  };
  // Sends `sig` to every live process of `v`, recording them; returns how many were signalled.
  int Signal(const LingeringVgpu& v, int sig, Stop& stop);

  const controller::Clock* const clock_;
  const int64_t grace_ms_;
  std::map<std::string, Stop> stopping_;  // by vGPU (allocation) id
  uint64_t sigterm_total_ = 0;
  uint64_t sigkill_total_ = 0;
};

}  // namespace tf::hypervisor
