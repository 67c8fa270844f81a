// ComputeGate: enforces a vGPU's compute share on every kernel-submission path of this process.
//
// Shares are caps measured in GPU-busy time. The per-GPU region grants time-slice leases so that
// only one process submits to the GPU at a time while any throttled vGPU is active; a process
// launches freely while it holds an unexpired lease. When the lease ends, the gate's governor
// thread records an end event on every stream used during the lease, waits for the GPU to drain
// them, and charges the measured busy time (first begin event to last end event) to the vGPU's
// token bucket. Because no other tenant runs during the lease, event time is exact GPU time; a
// single huge kernel or a deep queue is charged in full and paid back before the next lease.
//
// Hot path (lease held, stream already seen in this lease): two seq_cst atomics and a
// thread-local stream check; the lease's deadline is enforced by the governor, not per launch. No lock, no syscall, no driver query. An unthrottled
// vGPU (share >= 100%) or an unbound process skips the gate with one predictable branch.
//
// Thread safety: Enter/Exit from any number of launching threads; one governor thread per process.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>

#include "tf_driver_api.h"

namespace tf::limiter {

struct Binding;

class ComputeGate {
 public:
  static ComputeGate& Instance();

  // Called once at initialisation with the process's binding (nullptr: no vGPU, never throttle).
  void Configure(Binding* binding);
  // A forked child has no governor thread and holds no lease.
  void ResetAfterFork();
  // At process exit, before the driver tears itself down: stops the governor (waiting, bounded,
  // for a lease it is closing) so that no thread of ours calls into CUDA afterwards, and lets
  // launchers through unthrottled.
  void Shutdown();
  // Before a stream or context the open lease may refer to is destroyed: closes the lease (the
  // GPU drains what was submitted under it and the time is charged) and, when contexts go away,
  // drops the pooled timing events. Blocks for at most the drain of the work already queued.
  void Quiesce(bool context_destroyed);

  bool throttled() const { return throttled_; }

  // Brackets one submission to `stream` (per_thread: the call came through a _ptsz entry point,
  // so stream 0 means the per-thread default stream). Enter blocks while the vGPU is over its
  // share or another process holds the lease; it never fails. Exit must follow the submission.
  void Enter(CUstream stream, bool per_thread);
  void Exit() { in_launch_.fetch_sub(1, std::memory_order_seq_cst); }

  // Lease length: how long one process may submit before others get a turn (ns).
  static constexpr int64_t kQuantumNs = 10'000'000;

 private:
  enum State : int { kNoLease = 0, kHeld = 1, kEnding = 2 };
  struct StreamUse {
    CUstream stream;
    bool per_thread;
    CUcontext ctx;
    CUevent begin;
    CUevent end;
  };
  static constexpr int kMaxStreams = 64;

  bool FastPathAllows(CUstream stream, bool per_thread);
  void SlowPath(CUstream stream, bool per_thread);
  // REQUIRES mu_ held and state_ == kHeld.
  bool RegisterStreamLocked(CUstream stream, bool per_thread);
  void EnsureGovernorLocked();
  static void* GovernorMain(void* self);
  void EndLease();
  bool RenewLease();
  CUevent TakeEvent(bool blocking);
  void GiveEvent(CUevent ev, bool blocking);

  Binding* binding_ = nullptr;
  bool throttled_ = false;

  std::atomic<int> state_{kNoLease};
  std::atomic<int> in_launch_{0};
  std::atomic<int64_t> deadline_ns_{0};
  int64_t segment_start_ns_ = 0;   // guarded by mu_: when the lease was granted or last renewed
  int64_t provisional_ns_ = 0;     // guarded by mu_: debited by renewals, reconciled at release
  std::atomic<uint64_t> lease_generation_{0};

  pthread_mutex_t mu_ = PTHREAD_MUTEX_INITIALIZER;  // lease transitions and the stream list
  pthread_cond_t cv_ = PTHREAD_COND_INITIALIZER;    // state changes
  bool governor_started_ = false;
  bool exiting_ = false;           // guarded by mu_
  bool end_now_ = false;           // guarded by mu_: close the lease without waiting for its deadline
  bool ending_in_progress_ = false;  // guarded by mu_: EndLease is between its CUDA calls
  uint64_t launches_unreported_ = 0;

  StreamUse streams_[kMaxStreams];
  std::atomic<int> stream_count_{0};
  CUevent free_events_[2][kMaxStreams * 2];
  int free_event_count_[2] = {0, 0};
};

}  // namespace tf::limiter
