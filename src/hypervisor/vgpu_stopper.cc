#include "hypervisor/vgpu_stopper.h"

#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "hypervisor/remote_sessions.h"
#include "limiter/core/process_identity.h"

namespace tf::hypervisor {

namespace {

// Sends `sig` to `pid` only while it still names the process that started at `start_ticks`: the
// pid is pinned with a pidfd first, then its identity is read from /proc, then the signal goes
// through the pidfd, so a pid reused in between is never hit. Where the kernel has no pidfds
// (before 5.3), the check and kill() follow each other as closely as they can. 0, or -1 with
// errno (ESRCH: not that process any more).
int SignalSameProcess(pid_t pid, uint64_t start_ticks, int sig) {
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_send_signal)
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd >= 0) {
    int rc = -1;
    if (!limiter::ProcessAlive(pid, start_ticks)) {
      errno = ESRCH;
    } else {
      rc = static_cast<int>(syscall(SYS_pidfd_send_signal, fd, sig, nullptr, 0));
    }
    const int saved = errno;
    close(fd);
    errno = saved;
    return rc;
  }
  if (errno != ENOSYS) return -1;  // ESRCH: gone
#endif
  if (!limiter::ProcessAlive(pid, start_ticks)) {
    errno = ESRCH;
    return -1;
  }
  return kill(pid, sig);
}

}  // namespace

VgpuStopper::VgpuStopper(const controller::Clock* clock, int64_t grace_ms)
    : clock_(clock), grace_ms_(grace_ms < 0 ? 0 : grace_ms) {}

int VgpuStopper::Signal(const LingeringVgpu& v, int sig, Stop& stop) {
  int sent = 0;
  std::string pids;
  // A worker session's vGPU ("remote-PID@a-..."): only the session itself, whose pid its id names.
  const pid_t session = SessionOfVgpu(v.id);
  for (const limiter::ProcessInfo& p : v.processes) {
    if (p.pid <= 0 || (session > 0 && p.pid != session)) continue;
    if (SignalSameProcess(p.pid, p.start_time_ticks, sig) != 0) {
      if (errno == ESRCH) continue;  // gone, or its pid names another process now
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
    if (v.allocation.empty()) {
      std::fprintf(stderr, "hypervisor: allocation %s was %s by the controller but %zu process(es) still "
                   "use its vGPU: stopping them (SIGTERM, SIGKILL after %lld ms)\n", v.id.c_str(),
                   reason.c_str(), v.processes.size(), static_cast<long long>(grace_ms_));
    } else {
      std::fprintf(stderr, "hypervisor: allocation %s was %s by the controller%s: stopping the worker session "
                   "%d of its remote session vGPU %s (SIGTERM, SIGKILL after %lld ms)\n", v.allocation.c_str(),
                   v.cannot_hold ? "suspended" : reason.c_str(),
                   v.cannot_hold ? " and its remote session has no tiering to be held swapped out with" : "",
                   static_cast<int>(SessionOfVgpu(v.id)), v.id.c_str(), static_cast<long long>(grace_ms_));
    }
    Stop& stop = stopping_[v.id];
    stop.started_ms = now;
    Signal(v, grace_ms_ == 0 ? SIGKILL : SIGTERM, stop);
    stop.killed = grace_ms_ == 0;
    return;
  }
  Stop& stop = it->second;
  if (now - stop.started_ms < grace_ms_) {
    // A process that registered after the SIGTERM round (e.g. a child of the tenant) gets its own.
    LingeringVgpu late = v;
    late.processes.clear();
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
  std::fprintf(stderr, "hypervisor: vGPU %s: its %d process(es) are gone after %lld ms%s; %s\n",
               id.c_str(), n, static_cast<long long>(clock_->NowMs() - it->second.started_ms),
               it->second.killed ? " (SIGKILL needed)" : "",
               SessionOfVgpu(id) > 0 ? "its worker removes the session's vGPU" : "vGPU removed");
  stopping_.erase(it);
  return n;
}

}  // namespace tf::hypervisor
