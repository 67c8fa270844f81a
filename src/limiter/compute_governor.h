// ComputeGovernor: the shared (concurrent) compute mode of a vGPU, the default.
//
// Tenants submit kernels at the same time; nobody waits for a turn. Each process measures what
// its own kernels use and its governor thread reports it to the per-GPU region every tick
// (GpuRegion::ShareTick, compute_share.cc), which charges the vGPU's request and limit buckets and
// says whether this process must hold back: only when its vGPU is at its limit, or over its
// request while another vGPU that wants the GPU is still within its own (or is of higher QoS).
//
// Measurement: per stream, a span opens with a "begin" event recorded before the first launch
// into an idle stream, and a marker event is recorded after every launch. The governor pops
// completed markers in order and adds the GPU time from the span's origin (begin or the previous
// completed marker) to the process's raw busy time; when the last marker has completed and no
// launch is between its two halves, the stream is idle and the span closes. Times are the GPU's
// own event timestamps, so a single huge kernel is charged in full when it completes (and then
// paid back by holding); overlap with other tenants' time slices is removed by the region's
// contention scale. Launches into a capturing stream are not measured (they do not run).
//
// Hot path (governed vGPU, stream already known to this thread, not held): a capture-status
// query, one uncontended mutex, one cuEventRecord (plus one on an idle stream). No syscall: the
// governor is woken only when it went to sleep after 10 ms of idleness. An ungoverned vGPU
// (request and limit >= 100%) or an unbound process skips it all with one predictable branch.
//
// Failure: never fails a launch and never blocks without bound: a hold is re-decided at least
// every 20 ms, and launchers go through unheld when the governor has not ticked for 200 ms or the
// process is exiting. Thread safety: Before/After from any number of threads; one governor thread.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>

#include "tf_driver_api.h"

namespace tf::limiter {

struct Binding;

class ComputeGovernor {
 public:
  struct Track;

  static ComputeGovernor& Instance();

  // Once at initialisation (nullptr: no vGPU). Governs when the vGPU's request or limit is below
  // a whole GPU and shared mode is selected (`exclusive` false).
  void Configure(Binding* binding, bool exclusive);
  bool governed() const { return governed_; }
  void ResetAfterFork();
  // At exit: stops the governor thread (bounded wait) and lets launchers through.
  void Shutdown();
  // Before a stream (stream != nullptr) or every stream of a context (context_destroyed) goes
  // away: forgets its measurement state and destroys its events.
  void Forget(CUstream stream, bool context_destroyed);

  // Brackets one submission to `stream` (per_thread: a _ptsz entry point). Before waits while
  // the process is held and opens a busy span on an idle stream; it returns the track to pass
  // to After (nullptr: not measured). After records the completion marker.
  Track* Before(CUstream stream, bool per_thread);
  void After(Track* track, CUresult launch_result);

  // Governor tick period while the process has GPU work (ns).
  static constexpr int64_t kTickNs = 500'000;

 private:
  Track* Lookup(CUstream stream, bool per_thread);
  void WaitWhileHeld();
  void EnsureThreadLocked();
  static void* Main(void* self);
  void Tick(int64_t now, int64_t dt);
  void WakeIfSleeping();

  Binding* binding_ = nullptr;
  bool governed_ = false;
  std::atomic<bool> hold_{false};
  std::atomic<bool> sleeping_{false};
  std::atomic<int64_t> last_tick_ns_{0};
  std::atomic<uint64_t> generation_{1};   // bumped when tracks are forgotten (thread caches)
  std::atomic<uint64_t> launches_{0};      // since the last tick

  pthread_mutex_t mu_ = PTHREAD_MUTEX_INITIALIZER;  // thread state, track table registration
  pthread_cond_t cv_ = PTHREAD_COND_INITIALIZER;    // hold lifted / governor wake-up
  bool thread_started_ = false;
  bool exiting_ = false;                            // guarded by mu_
  int64_t next_tick_ns_ = kTickNs;                  // guarded by mu_
  int64_t pending_raw_ns_ = 0;                      // guarded by mu_: measured on forgotten streams
  int64_t idle_ticks_ = 0;                          // governor thread only
};

}  // namespace tf::limiter
