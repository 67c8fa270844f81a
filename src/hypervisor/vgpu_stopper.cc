#include "hypervisor/vgpu_stopper.h"

#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "limiter/core/process_identity.h"

namespace tf::hypervisor {

VgpuStopper::VgpuStopper(const controller::Clock* clock, int64_t grace_ms)
    : clock_(clock), grace_ms_(grace_ms < 0 ? 0 : grace_ms) {}

int VgpuStopper::Signal(const LingeringVgpu& v, int sig, Stop& stop) {
  int sent = 0;
  std::string pids;
  for (const limiter::ProcessInfo& p : v.processes) {
    if (p.pid <= 0 || !limiter::ProcessAlive(p.pid, p.start_time_ticks)) continue;
    if (kill(p.pid, sig) != 0) {
      std::fprintf(stderr, "hypervisor: cannot send %s to process %d of vGPU %s: %s\n",
                   sig == SIGKILL ? "SIGKILL" : "SIGTERM", p.pid, v.id.c_str(), std::strerror(errno));
      continue;
    }
    stop.signalled[p.pid] = p.start_time_ticks;
    pids += (pids.empty() ? "" : ", ") + std::to_string(p.pid);
    ++sent;
  }
  if (sent > 0) {
    std::fprintf(stderr, "hypervisor: vGPU %s on %s: %s sent to %d process(es) (%s)\n", v.id.c_str(),
                 v.gpu_uuid.c_str(), sig == SIGKILL ? "SIGKILL" : "SIGTERM", sent, pids.c_str());
  }
  (sig == SIGKILL ? sigkill_total_ : sigterm_total_) += static_cast<uint64_t>(sent);
  return sent;
}

void VgpuStopper::Step(const LingeringVgpu& v, const std::string& reason) {
  const int64_t now = clock_->NowMs();
  auto it = stopping_.find(v.id);
  if (it == stopping_.end()) {
    std::fprintf(stderr, "hypervisor: allocation %s was %s by the controller but %zu process(es) still "
                 "use its vGPU: stopping them (SIGTERM, SIGKILL after %lld ms)\n", v.id.c_str(),
                 reason.c_str(), v.processes.size(), static_cast<long long>(grace_ms_));
    Stop& stop = stopping_[v.id];
    stop.started_ms = now;
    Signal(v, grace_ms_ == 0 ? SIGKILL : SIGTERM, stop);
    stop.killed = grace_ms_ == 0;
    return;
  }
  Stop& stop = it->second;
  if (now - stop.started_ms < grace_ms_) {
    // A process that registered after the SIGTERM round (e.g. a child of the tenant) gets its own.
    LingeringVgpu late{v.gpu_uuid, v.id, {}};
    for (const limiter::ProcessInfo& p : v.processes)
      if (!stop.signalled.count(p.pid)) late.processes.push_back(p);
    if (!late.processes.empty()) Signal(late, SIGTERM, stop);
    return;
  }
  // Past the grace period: whatever still runs is killed, on every step until it is gone.
  Signal(v, SIGKILL, stop);
  stop.killed = true;
}

int VgpuStopper::Finish(const std::string& id) {
  auto it = stopping_.find(id);
  if (it == stopping_.end()) return -1;
  const int n = static_cast<int>(it->second.signalled.size());
  std::fprintf(stderr, "hypervisor: vGPU %s: its %d process(es) are gone after %lld ms%s; vGPU removed\n",
               id.c_str(), n, static_cast<long long>(clock_->NowMs() - it->second.started_ms),
               it->second.killed ? " (SIGKILL needed)" : "");
  stopping_.erase(it);
  return n;
}

}  // namespace tf::hypervisor
