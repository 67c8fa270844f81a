// ComputeGovernor: the shared (concurrent) compute mode of a vGPU, the default.
//
// Tenants submit kernels at the same time; nobody waits for a turn. Each process's governor
// thread samples, every tick (about 500 us, jittered), whether the streams its process launched
// into still have work queued, and reports to the per-GPU region (GpuRegion::ShareTick,
// compute_share.cc): a tick with work queued counts as busy. The region divides it by the number
// of processes contending (work queued at a tick of theirs within the last 2 ms, about one time
// slice: the GPU time-slices them), charges the vGPU's
// request and limit buckets, and says whether this process must hold back: only when its vGPU is
// at its limit, or over its request while a vGPU that is still within its own has work queued (or
// a higher-QoS one borrows too). Sampling is an unbiased estimate of the busy fraction (2,000
// samples a second), costs the launch path nothing, and charges a long kernel while it runs, so a
// huge kernel pushes a tenant past its limit by at most its own duration, then holds it until the
// debt is repaid.
//
// Streams are queried with cuStreamQuery from the governor thread; never while a stream capture is
// beginning or running in this process (querying then could invalidate the capture): the capture
// hooks count captures and wait for a query in progress. A per-thread default stream cannot be
// queried from another thread: launches into it record a marker event that the governor queries.
//
// Hot path (governed vGPU, stream already known to this thread, not held): one relaxed store and
// two loads. An ungoverned vGPU (request and limit >= 100%) or an unbound process skips it all with
// one predictable branch.
//
// Failure: never fails a launch and never blocks without bound: a hold is re-decided at least
// every 20 ms, and launchers go through unheld when the governor has not ticked for 200 ms or the
// process is exiting. Thread safety: Before/After from any number of threads; one governor thread.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>

#include "limiter/core/gpu_region.h"
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
  // the process is held and marks the stream as used; it returns the track to pass to After
  // (nullptr: not measured). After records a marker for a per-thread default stream only.
  Track* Before(CUstream stream, bool per_thread);
  void After(Track* track, CUresult launch_result);

  // Around cuStreamBeginCapture*/cuStreamEndCapture*: no stream is queried while one is active.
  void CaptureBegins();
  void CaptureEnds();

  // Governor tick period while the process has GPU work (ns): kTickNs, or
  // $TFUSION_SHARE_TICK_US (100..1000) for measurements of the sampling rate's cost.
  static constexpr int64_t kTickNs = 500'000;
  static constexpr int64_t kDrainPollNs = 50'000;  // a held process's ticks until its queue is empty
  static constexpr int64_t kDrainPollMaxNs = 8'000'000;  // for at most this long per hold
  // Opt-in, for measurements of what the governor's stream queries cost (docs/compute-sharing.md):
  // $TFUSION_SHARE_QUERY_EVERY=N (1..8; default 1, every tick) asks the driver whether a stream
  // launched into since it was last asked has work queued on every Nth tick only; between, its
  // last answer stands. A stream with work queued and no launch since, and every stream in the
  // two ticks after a tick that held the process (a turn that begins), are asked on every tick.
  // This process's saturating hard slices take turns of 25 ms, or $TFUSION_SHARE_TURN_MS (0..100;
  // 0 = never), while no tenant that leaves gaps wants the GPU (compute_share.cc); planned: each
  // its share of a 200 ms period, or $TFUSION_SHARE_TURN_PERIOD_MS (0..1000; 0 = fixed turns).


 private:
  Track* Lookup(CUstream stream, bool per_thread);
  void WaitWhileHeld();
  void EnsureThreadLocked();
  static void* Main(void* self);
  void Tick(int64_t now, int64_t dt, uint64_t launches);
  // Governor thread: does any of the process's streams have work queued? `query_all`: ask the
  // driver about every stream this tick, whatever TFUSION_SHARE_QUERY_EVERY says.
  bool SampleQueued(bool query_all);
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
  int64_t tick_ns_ = kTickNs;                       // set by Configure
  int64_t next_tick_ns_ = kTickNs;                  // guarded by mu_
  int64_t idle_ticks_ = 0;                          // governor thread only
  int64_t drain_since_ns_ = 0;                      // governor thread only: when the polled drain began (0: none)
  bool last_queued_ = false;                        // governor thread only
  uint32_t query_every_ = 1;                        // set by Configure
  uint32_t query_ticks_ = 0;                        // governor thread only
  int query_all_ticks_ = 0;                         // governor thread only: ticks left to ask about all
  uint64_t jitter_ = 0x9e3779b97f4a7c15ULL;         // governor thread only
  ShareTurn turn_;                                  // governor thread only (set by Configure)
  bool unpaid_logged_ = false;                      // governor thread only
  bool paid_logged_ = false;                        // governor thread only
  uint32_t logged_comparisons_ = 0;                 // governor thread only (TFUSION_SHARE_DEBUG)
  int64_t logged_gappy_until_ns_ = 0;               // governor thread only (TFUSION_SHARE_DEBUG)
  uint32_t logged_repeats_ = 0;                     // governor thread only (TFUSION_SHARE_DEBUG)
  uint32_t logged_thin_waits_ = 0;                  // governor thread only (TFUSION_SHARE_DEBUG)
  uint32_t logged_unsaturated_ = 0;                 // governor thread only (TFUSION_SHARE_DEBUG)
  uint32_t logged_extended_ = 0;                    // governor thread only (TFUSION_SHARE_DEBUG)
  std::atomic<int> captures_{0};                    // stream captures active in this process
  std::atomic<bool> querying_{false};               // the governor is querying streams
};

}  // namespace tf::limiter
