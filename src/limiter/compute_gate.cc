#include "limiter/compute_gate.h"

#include <sched.h>
#include <time.h>

#include "limiter/cond_deadline.h"
#include "limiter/export_support.h"
#include "limiter/guest_log.h"
#include "limiter/core/process_identity.h"
#include "limiter/runtime.h"

namespace tf::limiter {
namespace {

int64_t NowNs() { return MonotonicNowNs(); }

// The stream the calling thread last registered, and in which lease: lets the hot path skip
// the stream list while a thread keeps launching into one stream.
thread_local CUstream t_last_stream = nullptr;
thread_local bool t_last_per_thread = false;
thread_local uint64_t t_last_generation = 0;

}  // namespace

ComputeGate& ComputeGate::Instance() {
  static ComputeGate* gate = new ComputeGate();  // lives until exit; the governor uses it
  return *gate;
}

void ComputeGate::Configure(Binding* binding) {
  binding_ = binding;
  throttled_ = false;
  if (binding == nullptr) return;
  RegionSnapshot* snap = new RegionSnapshot();
  binding->region.Snapshot(snap);
  for (uint32_t i = 0; i < snap->vgpu_count; ++i) {
    if (snap->vgpus[i].index == binding->vgpu) {
      throttled_ = snap->vgpus[i].compute_share_ppm < kShareWholeGpuPpm;
    }
  }
  delete snap;
  binding->unthrottled = !throttled_;
}

void ComputeGate::ResetAfterFork() {
  pthread_mutex_init(&mu_, nullptr);
  pthread_cond_init(&cv_, nullptr);
  governor_started_ = false;
  exiting_ = false;
  ending_in_progress_ = false;
  state_.store(kNoLease);
  in_launch_.store(0);
  stream_count_.store(0);
  free_event_count_[0] = free_event_count_[1] = 0;  // the parent's events are not ours
  lease_generation_.fetch_add(1);
}

bool ComputeGate::FastPathAllows(CUstream stream, bool per_thread) {
  in_launch_.fetch_add(1, std::memory_order_seq_cst);
  if (state_.load(std::memory_order_seq_cst) == kHeld &&
      t_last_generation == lease_generation_.load(std::memory_order_relaxed) &&
      t_last_stream == stream && t_last_per_thread == per_thread) {
    return true;
  }
  in_launch_.fetch_sub(1, std::memory_order_seq_cst);
  return false;
}

void ComputeGate::Enter(CUstream stream, bool per_thread) {
  if (FastPathAllows(stream, per_thread)) return;
  SlowPath(stream, per_thread);
}

void ComputeGate::SlowPath(CUstream stream, bool per_thread) {
  Binding* b = Bound();
  if (b == nullptr) {  // could not register this process: fail open rather than hang the tenant
    in_launch_.fetch_add(1, std::memory_order_seq_cst);
    return;
  }
  pthread_mutex_lock(&mu_);
  EnsureGovernorLocked();
  for (;;) {
    if (exiting_) {  // the process is exiting: never block it
      in_launch_.fetch_add(1, std::memory_order_seq_cst);
      pthread_mutex_unlock(&mu_);
      return;
    }
    int st = state_.load(std::memory_order_seq_cst);
    if (st == kHeld && NowNs() < deadline_ns_.load()) {
      if (RegisterStreamLocked(stream, per_thread)) {
        in_launch_.fetch_add(1, std::memory_order_seq_cst);
        if (state_.load(std::memory_order_seq_cst) == kHeld) {
          t_last_stream = stream;
          t_last_per_thread = per_thread;
          t_last_generation = lease_generation_.load();
          ++launches_unreported_;
          pthread_mutex_unlock(&mu_);
          return;
        }
        in_launch_.fetch_sub(1, std::memory_order_seq_cst);
      }
      continue;
    }
    if (st == kHeld || st == kEnding) {
      // Lease expired or ending: the governor is closing it; wait for it to finish.
      pthread_cond_signal(&cv_);
      timespec ts;
      AbsDeadline(&ts, 2'000'000);
      pthread_cond_timedwait(&cv_, &mu_, &ts);
      continue;
    }
    LeaseGrant g = b->region.TryAcquireLease(b->slot, NowNs(), kQuantumNs);
    if (g.unthrottled) {  // the share was raised to a whole GPU meanwhile
      throttled_ = false;
      in_launch_.fetch_add(1, std::memory_order_seq_cst);
      pthread_mutex_unlock(&mu_);
      return;
    }
    if (g.granted) {
      if (launches_unreported_ != 0) {
        b->region.CountLaunches(b->slot, launches_unreported_);
        launches_unreported_ = 0;
      }
      deadline_ns_.store(g.deadline_ns);
      segment_start_ns_ = NowNs();
      provisional_ns_ = 0;
      lease_generation_.fetch_add(1);
      stream_count_.store(0);
      state_.store(kHeld, std::memory_order_seq_cst);
      pthread_cond_broadcast(&cv_);  // wakes the governor to watch the deadline
      continue;
    }
    if (g.error != RegionError::kOk) {  // our slot vanished (reaped): fail open, logged once
      static std::atomic<bool> logged{false};
      if (!logged.exchange(true)) {
        GuestLog("compute lease unavailable (%s): launches are not throttled", RegionErrorName(g.error));
      }
      throttled_ = false;
      in_launch_.fetch_add(1, std::memory_order_seq_cst);
      pthread_mutex_unlock(&mu_);
      return;
    }
    int64_t wait = g.retry_after_ns;
    if (wait <= 0 || wait > 20'000'000) wait = 20'000'000;
    pthread_mutex_unlock(&mu_);
    b->region.WaitForLease(b->slot, wait);
    pthread_mutex_lock(&mu_);
  }
}

bool ComputeGate::RegisterStreamLocked(CUstream stream, bool per_thread) {
  int n = stream_count_.load();
  for (int i = 0; i < n; ++i) {
    if (streams_[i].stream == stream && streams_[i].per_thread == per_thread) return true;
  }
  if (n == kMaxStreams) return true;  // more streams than tracked: charged through the others
  const auto& real = Real();
  StreamUse& u = streams_[n];
  u.stream = stream;
  u.per_thread = per_thread;
  u.ctx = nullptr;
  real.cuCtxGetCurrent(&u.ctx);
  u.begin = TakeEvent(false);
  u.end = TakeEvent(true);
  if (u.begin == nullptr || u.end == nullptr) return true;
  CUresult r = per_thread ? real.cuEventRecord_ptsz(u.begin, stream) : real.cuEventRecord(u.begin, stream);
  if (r != CUDA_SUCCESS) {
    GiveEvent(u.begin, false);
    GiveEvent(u.end, true);
    return true;  // e.g. a capturing stream: nothing to time, the launch proceeds
  }
  stream_count_.store(n + 1);
  return true;
}

CUevent ComputeGate::TakeEvent(bool blocking) {
  int k = blocking ? 1 : 0;
  if (free_event_count_[k] > 0) return free_events_[k][--free_event_count_[k]];
  CUevent ev = nullptr;
  unsigned flags = blocking ? CU_EVENT_BLOCKING_SYNC : CU_EVENT_DEFAULT;
  if (Real().cuEventCreate(&ev, flags) != CUDA_SUCCESS) return nullptr;
  return ev;
}

void ComputeGate::GiveEvent(CUevent ev, bool blocking) {
  int k = blocking ? 1 : 0;
  if (ev == nullptr) return;
  if (free_event_count_[k] < kMaxStreams * 2) {
    free_events_[k][free_event_count_[k]++] = ev;
  } else {
    Real().cuEventDestroy_v2(ev);
  }
}

void ComputeGate::EnsureGovernorLocked() {
  if (governor_started_) return;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  if (pthread_create(&t, &attr, &GovernorMain, this) == 0) governor_started_ = true;
  pthread_attr_destroy(&attr);
}

void ComputeGate::Shutdown() {
  pthread_mutex_lock(&mu_);
  exiting_ = true;
  pthread_cond_broadcast(&cv_);
  int64_t give_up = NowNs() + 500'000'000;
  while (ending_in_progress_ && NowNs() < give_up) {
    timespec ts;
    AbsDeadline(&ts, 5'000'000);
    pthread_cond_timedwait(&cv_, &mu_, &ts);
  }
  pthread_mutex_unlock(&mu_);
}

void ComputeGate::Quiesce(bool context_destroyed) {
  pthread_mutex_lock(&mu_);
  int64_t give_up = NowNs() + 2'000'000'000;
  while ((state_.load() != kNoLease || ending_in_progress_) && !exiting_ && NowNs() < give_up) {
    end_now_ = true;
    pthread_cond_broadcast(&cv_);
    timespec ts;
    AbsDeadline(&ts, 1'000'000);
    pthread_cond_timedwait(&cv_, &mu_, &ts);
  }
  end_now_ = false;
  if (context_destroyed && state_.load() == kNoLease) {
    for (int k = 0; k < 2; ++k) {
      while (free_event_count_[k] > 0) Real().cuEventDestroy_v2(free_events_[k][--free_event_count_[k]]);
    }
  }
  pthread_mutex_unlock(&mu_);
}

void* ComputeGate::GovernorMain(void* self) {
  auto* gate = static_cast<ComputeGate*>(self);
  pthread_mutex_lock(&gate->mu_);
  for (;;) {
    while (gate->state_.load() != kHeld && !gate->exiting_) pthread_cond_wait(&gate->cv_, &gate->mu_);
    if (gate->exiting_) break;
    int64_t left = gate->deadline_ns_.load() - NowNs();
    if (left > 0 && !gate->end_now_) {
      timespec ts;
      AbsDeadline(&ts, left);
      pthread_cond_timedwait(&gate->cv_, &gate->mu_, &ts);
      continue;
    }
    if (!gate->end_now_ && gate->RenewLease()) continue;
    gate->EndLease();  // drops and re-takes mu_ while the GPU drains
  }
  pthread_mutex_unlock(&gate->mu_);
  return nullptr;
}

bool ComputeGate::RenewLease() {
  // REQUIRES mu_ held, state_ == kHeld. Nobody else waiting and budget left: keep the GPU fed
  // instead of draining it, charging the segment's wall time provisionally.
  Binding* b = Bound();
  if (b == nullptr) return false;
  int64_t now = NowNs();
  int64_t segment = now - segment_start_ns_;
  LeaseGrant g = b->region.ExtendLease(b->slot, now, kQuantumNs, segment > 0 ? segment : 0);
  if (!g.granted) return false;
  provisional_ns_ += segment > 0 ? segment : 0;
  segment_start_ns_ = now;
  deadline_ns_.store(g.deadline_ns);
  return true;
}

void ComputeGate::EndLease() {
  // REQUIRES mu_ held. Stop new submissions, let in-flight ones finish their driver call.
  state_.store(kEnding, std::memory_order_seq_cst);
  ending_in_progress_ = true;
  while (in_launch_.load(std::memory_order_seq_cst) != 0) {
    pthread_mutex_unlock(&mu_);
    sched_yield();
    pthread_mutex_lock(&mu_);
  }
  const auto& real = Real();
  int n = stream_count_.load();
  int recorded[kMaxStreams];
  for (int i = 0; i < n; ++i) {
    StreamUse& u = streams_[i];
    if (u.ctx) real.cuCtxSetCurrent(u.ctx);
    CUresult r = u.per_thread ? real.cuEventRecord_ptsz(u.end, u.stream) : real.cuEventRecord(u.end, u.stream);
    recorded[i] = r == CUDA_SUCCESS;
  }
  pthread_mutex_unlock(&mu_);
  // Wait for the GPU to drain what was submitted under this lease, then measure it.
  float first_begin_ms = 0, last_end_ms = 0;
  bool any = false;
  for (int i = 0; i < n; ++i) {
    if (!recorded[i]) continue;
    if (streams_[i].ctx) real.cuCtxSetCurrent(streams_[i].ctx);
    // Poll for the drain first: a blocking wait wakes up tens of microseconds late, and the GPU
    // stays idle for that long at every hand-over. Long drains fall back to blocking.
    CUresult q = CUDA_ERROR_NOT_READY;
    for (int64_t spin_until = NowNs() + 3'000'000; q == CUDA_ERROR_NOT_READY && NowNs() < spin_until;) {
      q = real.cuEventQuery(streams_[i].end);
    }
    if (q == CUDA_ERROR_NOT_READY) q = real.cuEventSynchronize(streams_[i].end);
    if (q != CUDA_SUCCESS) continue;
    float begin_ms = 0, end_ms = 0;
    if (real.cuEventElapsedTime_v2 != nullptr) {
      if (real.cuEventElapsedTime_v2(&begin_ms, streams_[0].begin, streams_[i].begin) != CUDA_SUCCESS ||
          real.cuEventElapsedTime_v2(&end_ms, streams_[0].begin, streams_[i].end) != CUDA_SUCCESS) {
        continue;
      }
    } else if (real.cuEventElapsedTime(&begin_ms, streams_[0].begin, streams_[i].begin) != CUDA_SUCCESS ||
               real.cuEventElapsedTime(&end_ms, streams_[0].begin, streams_[i].end) != CUDA_SUCCESS) {
      continue;
    }
    if (!any || begin_ms < first_begin_ms) first_begin_ms = begin_ms;
    if (!any || end_ms > last_end_ms) last_end_ms = end_ms;
    any = true;
  }
  int64_t busy_ns = any ? static_cast<int64_t>((last_end_ms - first_begin_ms) * 1e6) : 0;
  if (busy_ns < 0) busy_ns = 0;
  if (Binding* b = Bound()) b->region.ReleaseLease(b->slot, busy_ns, NowNs(), provisional_ns_);
  provisional_ns_ = 0;
  pthread_mutex_lock(&mu_);
  for (int i = 0; i < n; ++i) {
    GiveEvent(streams_[i].begin, false);
    GiveEvent(streams_[i].end, true);
  }
  stream_count_.store(0);
  state_.store(kNoLease, std::memory_order_seq_cst);
  ending_in_progress_ = false;
  pthread_cond_broadcast(&cv_);
}

}  // namespace tf::limiter
