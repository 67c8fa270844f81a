#include "limiter/compute_governor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "limiter/cond_deadline.h"
#include "limiter/core/process_identity.h"
#include "limiter/export_support.h"
#include "limiter/guest_log.h"
#include "limiter/runtime.h"
#include "limiter/tiering.h"

namespace tf::limiter {

// One stream's measurement state. `touched` is set by launchers (relaxed); the rest is written
// under `mu` (registration, the per-thread marker, forgetting) and read by the governor under it.
struct ComputeGovernor::Track {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  bool used = false;
  CUstream stream = nullptr;
  bool per_thread = false;
  CUcontext ctx = nullptr;          // the context the stream belongs to
  pthread_t thread{};               // for a per-thread default stream: whose
  bool thread_keyed = false;
  std::atomic<bool> touched{false}; // launched into since the governor last found it idle
  bool queued = false;              // governor: work queued at the last sample
  bool answered = false;            // governor: asked since the track was (re)registered
  CUevent marker = nullptr;         // per-thread default stream: recorded after each launch

  void Reset() {  // REQUIRES mu; the context is still alive
    if (marker != nullptr) Real().cuEventDestroy_v2(marker);
    marker = nullptr;
    queued = false;
    answered = false;
    touched.store(false, std::memory_order_relaxed);
    used = false;
  }
};

namespace {

constexpr int kMaxTracks = 64;
constexpr int64_t kIdleTicksBeforeSleep = 20;        // 10 ms without GPU work
constexpr int64_t kStalledGovernorNs = 200'000'000;  // launchers stop honouring a stale hold
constexpr int64_t kMaxTickNs = 20'000'000;

ComputeGovernor::Track g_tracks[kMaxTracks];
std::atomic<int> g_track_count{0};

// The track the calling thread used last, and in which generation of the table.
thread_local CUstream t_stream = nullptr;
thread_local bool t_per_thread = false;
thread_local CUcontext t_ctx = nullptr;
thread_local uint64_t t_generation = 0;
thread_local ComputeGovernor::Track* t_track = nullptr;

bool IsSpecial(CUstream s) {
  auto v = reinterpret_cast<uintptr_t>(s);
  return v == 0 || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}
bool IsPerThreadDefault(CUstream s, bool per_thread) {
  return s == CU_STREAM_PER_THREAD || (reinterpret_cast<uintptr_t>(s) == 0 && per_thread);
}

// A whole number from the tenant's environment, in [lo, hi] units of `unit_ns`, as ns; a bad one is
// named in the log and `fallback_ns` applies (as does an unset or empty one).
int64_t EnvWhole(const char* name, const char* units, long lo, long hi, int64_t unit_ns, int64_t fallback_ns) {
  const char* env = getenv(name);
  if (env == nullptr || *env == '\0') return fallback_ns;
  char* end = nullptr;
  long v = strtol(env, &end, 10);
  if (end != nullptr && *end == '\0' && v >= lo && v <= hi) return v * unit_ns;
  GuestLog("%s=%s is not a whole number of %s in %ld..%ld: using %lld", name, env, units, lo, hi,
           static_cast<long long>(fallback_ns / unit_ns));
  return fallback_ns;
}

}  // namespace

ComputeGovernor& ComputeGovernor::Instance() {
  static ComputeGovernor* g = new ComputeGovernor();  // lives until exit; its thread uses it
  return *g;
}

void ComputeGovernor::Configure(Binding* binding, bool exclusive) {
  binding_ = binding;
  governed_ = false;
  if (binding == nullptr || exclusive) return;
  RegionSnapshot* snap = new RegionSnapshot();
  binding->region.Snapshot(snap);
  for (uint32_t i = 0; i < snap->vgpu_count; ++i) {
    const VgpuInfo& v = snap->vgpus[i];
    if (v.index != binding->vgpu) continue;
    governed_ = v.compute_share_ppm < kShareWholeGpuPpm || v.compute_limit_ppm < kShareWholeGpuPpm;
  }
  delete snap;
  if (governed_) binding->unthrottled = false;
  // At most 1 ms: the region sees a process as contending for 2 ms after its last tick with work
  // queued (kActiveTtlNs), so a slower tick hides contenders and charges each one the whole
  // GPU (a 5 ms tick held two ResNet-50 b1 tenants at 50% to 0.57 of native on an H100).
  tick_ns_ = EnvWhole("TFUSION_SHARE_TICK_US", "microseconds", 100, 1000, 1000, kTickNs);
  next_tick_ns_ = tick_ns_;
  query_every_ = static_cast<uint32_t>(EnvWhole("TFUSION_SHARE_QUERY_EVERY", "ticks", 1, 8, 1, 1));
  // Turns are on by default (25 ms): they make hard slices of saturating work exact, and they stop
  // while any tenant that leaves gaps wants the GPU (docs/compute-sharing.md). 0 turns them off.
  turn_ = ShareTurn{kShareTurnNs};
  turn_.turn_ns = EnvWhole("TFUSION_SHARE_TURN_MS", "milliseconds", 0, 100, 1'000'000, kShareTurnNs);
  // Planned turns (each its share of a 200 ms period, handed over on time); 0 = fixed turns.
  turn_.period_ns = EnvWhole("TFUSION_SHARE_TURN_PERIOD_MS", "milliseconds", 0, 1000, 1'000'000, kShareTurnPeriodNs);
  // Out of turns, a capped vGPU's limit bucket may hold its share of this window (default 100 ms,
  // as in turns: no window).
  const int64_t window = EnvWhole("TFUSION_SHARE_LIMIT_WINDOW_MS", "milliseconds", 100, 5000, 1'000'000, 100'000'000);
  turn_.limit_window_ns = window == 100'000'000 ? 0 : window;
  // The turns check also leaves turns on work per second (compute_share.cc; ShareTurn's default);
  // 0 turns that off.
  if (const char* env = getenv("TFUSION_SHARE_TURNS_PER_SECOND"); env != nullptr && *env != '\0') {
    if (strcmp(env, "1") == 0 || strcmp(env, "0") == 0) {
      turn_.turns_per_second = env[0] == '1';
    } else {
      GuestLog("TFUSION_SHARE_TURNS_PER_SECOND=%s is not 0 or 1: using 1", env);
    }
  }
}

void ComputeGovernor::ResetAfterFork() {
  pthread_mutex_init(&mu_, nullptr);
  pthread_cond_init(&cv_, nullptr);
  thread_started_ = false;
  exiting_ = false;
  hold_.store(false);
  sleeping_.store(false);
  last_tick_ns_.store(0);
  captures_.store(0);
  querying_.store(false);
  query_ticks_ = 0;
  query_all_ticks_ = 0;
  drain_since_ns_ = 0;
  // The parent's streams and events are not the child's: forget them without driver calls.
  int n = g_track_count.load();
  for (int i = 0; i < n; ++i) {
    Track& t = g_tracks[i];
    pthread_mutex_init(&t.mu, nullptr);
    t.used = false;
    t.marker = nullptr;
    t.queued = false;
    t.answered = false;
  }
  g_track_count.store(0);
  generation_.fetch_add(1);
}

void ComputeGovernor::Shutdown() {
  pthread_mutex_lock(&mu_);
  exiting_ = true;
  hold_.store(false, std::memory_order_release);
  pthread_cond_broadcast(&cv_);
  pthread_mutex_unlock(&mu_);
}

void ComputeGovernor::Forget(CUstream stream, bool context_destroyed) {
  int n = g_track_count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    Track& t = g_tracks[i];
    pthread_mutex_lock(&t.mu);
    if (t.used && (context_destroyed || t.stream == stream)) t.Reset();
    pthread_mutex_unlock(&t.mu);
  }
  generation_.fetch_add(1, std::memory_order_acq_rel);
}

void ComputeGovernor::CaptureBegins() {
  captures_.fetch_add(1, std::memory_order_seq_cst);
  // A query the governor started before it could see the count finishes first.
  while (querying_.load(std::memory_order_seq_cst)) sched_yield();
}

void ComputeGovernor::CaptureEnds() {
  if (captures_.fetch_sub(1, std::memory_order_seq_cst) <= 0) captures_.fetch_add(1);
}

ComputeGovernor::Track* ComputeGovernor::Lookup(CUstream stream, bool per_thread) {
  const auto& real = Real();
  CUcontext ctx = nullptr;
  const bool special = IsSpecial(stream);
  if (special) real.cuCtxGetCurrent(&ctx);
  const uint64_t gen = generation_.load(std::memory_order_acquire);
  if (t_track != nullptr && t_generation == gen && t_stream == stream && t_per_thread == per_thread &&
      (!special || t_ctx == ctx)) {
    return t_track;
  }
  if (!special) real.cuCtxGetCurrent(&ctx);
  const bool thread_keyed = IsPerThreadDefault(stream, per_thread);
  const pthread_t self = pthread_self();
  Track* found = nullptr;
  pthread_mutex_lock(&mu_);
  int n = g_track_count.load(std::memory_order_relaxed);
  int free_index = -1;
  for (int i = 0; i < n; ++i) {
    Track& t = g_tracks[i];
    if (!t.used) {
      if (free_index < 0) free_index = i;
      continue;
    }
    if (t.stream == stream && t.per_thread == per_thread && (!special || t.ctx == ctx) &&
        (!thread_keyed || pthread_equal(t.thread, self))) {
      found = &t;
      break;
    }
  }
  if (found == nullptr) {
    int i = free_index >= 0 ? free_index : (n < kMaxTracks ? n : -1);
    if (i >= 0) {
      Track& t = g_tracks[i];
      pthread_mutex_lock(&t.mu);
      t.used = true;
      t.stream = stream;
      t.per_thread = per_thread;
      t.ctx = ctx;
      t.thread = self;
      t.thread_keyed = thread_keyed;
      t.queued = false;
      t.answered = false;
      t.marker = nullptr;
      t.touched.store(false, std::memory_order_relaxed);
      pthread_mutex_unlock(&t.mu);
      if (i == n) g_track_count.store(n + 1, std::memory_order_release);
      found = &t;
    } else {
      static std::atomic<bool> logged{false};
      if (!logged.exchange(true)) GuestLog("more than %d streams: the rest are not measured", kMaxTracks);
    }
  }
  pthread_mutex_unlock(&mu_);
  t_track = found;
  t_generation = gen;
  t_stream = stream;
  t_per_thread = per_thread;
  t_ctx = ctx;
  return found;
}

void ComputeGovernor::WakeIfSleeping() {
  if (!sleeping_.load(std::memory_order_seq_cst)) return;
  pthread_mutex_lock(&mu_);
  EnsureThreadLocked();
  pthread_cond_broadcast(&cv_);
  pthread_mutex_unlock(&mu_);
}

void ComputeGovernor::WaitWhileHeld() {
  pthread_mutex_lock(&mu_);
  EnsureThreadLocked();
  while (hold_.load(std::memory_order_acquire) && !exiting_) {
    if (MonotonicNowNs() - last_tick_ns_.load(std::memory_order_relaxed) > kStalledGovernorNs) break;
    timespec ts;
    AbsDeadline(&ts, 2'000'000);
    pthread_cond_timedwait(&cv_, &mu_, &ts);
  }
  pthread_mutex_unlock(&mu_);
}

ComputeGovernor::Track* ComputeGovernor::Before(CUstream stream, bool per_thread) {
  if (__builtin_expect(!thread_started_, 0)) {
    pthread_mutex_lock(&mu_);
    EnsureThreadLocked();
    pthread_mutex_unlock(&mu_);
  }
  if (hold_.load(std::memory_order_acquire)) WaitWhileHeld();
  launches_.fetch_add(1, std::memory_order_seq_cst);
  WakeIfSleeping();
  Track* t = Lookup(stream, per_thread);
  if (t == nullptr) return nullptr;
  if (!t->touched.load(std::memory_order_relaxed)) t->touched.store(true, std::memory_order_relaxed);
  return t->thread_keyed ? t : nullptr;
}

void ComputeGovernor::After(Track* t, CUresult launch_result) {
  // Only per-thread default streams get here: the governor cannot query them, so it queries a
  // marker recorded behind the launch.
  if (t == nullptr || launch_result != CUDA_SUCCESS) return;
  const auto& real = Real();
  pthread_mutex_lock(&t->mu);
  if (t->used) {
    if (t->marker == nullptr && real.cuEventCreate(&t->marker, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
      t->marker = nullptr;
    }
    if (t->marker != nullptr) real.cuEventRecord_ptsz(t->marker, t->stream);
  }
  pthread_mutex_unlock(&t->mu);
}

void ComputeGovernor::EnsureThreadLocked() {
  if (thread_started_ || exiting_) return;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  pthread_t th;
  last_tick_ns_.store(MonotonicNowNs(), std::memory_order_relaxed);
  if (pthread_create(&th, &attr, &Main, this) == 0) {
    thread_started_ = true;
  } else {
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) GuestLog("cannot start the compute governor thread: not throttled");
    governed_ = false;
  }
  pthread_attr_destroy(&attr);
}

bool ComputeGovernor::SampleQueued(bool query_all) {
  const auto& real = Real();
  bool queued = false;
  // Parked for the driver's checkpoint (tiering.h): no stream may be queried, and none has work
  // (the swap-out before it drained them).
  if (g_tiering && !ZeroTryEnter()) return false;
  struct Leave {
    ~Leave() {
      if (g_tiering) ZeroLeave();
    }
  } leave;
  querying_.store(true, std::memory_order_seq_cst);
  if (captures_.load(std::memory_order_seq_cst) > 0) {
    // A capture is active: querying could invalidate it. Keep the last answer.
    querying_.store(false, std::memory_order_seq_cst);
    return last_queued_;
  }
  CUcontext current = nullptr;
  // TFUSION_SHARE_QUERY_EVERY (compute_governor.h): on the ticks between, a launched-into stream
  // keeps its last answer.
  const bool query_tick = query_all || query_every_ <= 1 || ++query_ticks_ % query_every_ == 0;
  int n = g_track_count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    Track& t = g_tracks[i];
    if (!t.touched.load(std::memory_order_relaxed) && !t.queued) continue;  // idle and untouched
    pthread_mutex_lock(&t.mu);
    if (t.used) {
      // A launched-into stream that is not asked this tick keeps its launch mark, so that the
      // next query tick asks it even if nothing is launched meanwhile.
      if (query_tick || !t.touched.load(std::memory_order_relaxed) || !t.answered) {
        t.touched.store(false, std::memory_order_relaxed);
        t.answered = true;
        CUresult q;
        if (t.thread_keyed) {
          q = t.marker != nullptr ? real.cuEventQuery(t.marker) : CUDA_SUCCESS;
        } else {
          if (t.ctx != current && real.cuCtxSetCurrent(t.ctx) == CUDA_SUCCESS) current = t.ctx;
          q = t.per_thread ? real.cuStreamQuery_ptsz(t.stream) : real.cuStreamQuery(t.stream);
        }
        t.queued = q == CUDA_ERROR_NOT_READY;
      }
      queued = queued || t.queued;
    }
    pthread_mutex_unlock(&t.mu);
  }
  querying_.store(false, std::memory_order_seq_cst);
  last_queued_ = queued;
  return queued;
}

namespace {
// TFUSION_SHARE_DEBUG in the tenant's environment: log the turns check's comparisons (read once;
// the governor ticks every half millisecond).
bool ShareDebug() {
  static const bool on = getenv("TFUSION_SHARE_DEBUG") != nullptr;
  return on;
}
}  // namespace

void ComputeGovernor::Tick(int64_t now, int64_t dt, uint64_t launches) {
  const bool queued = SampleQueued(query_all_ticks_ > 0);
  Binding* b = Bound();
  if (b == nullptr) return;
  if (launches != 0) b->region.CountLaunches(b->slot, launches);  // tfusion smi's LAUNCHES
  const bool was_held = hold_.load(std::memory_order_relaxed);
  ShareVerdict v = b->region.ShareTick(b->slot, now, dt, queued ? dt : 0, queued, was_held, &turn_);
  if (v.error != RegionError::kOk) {
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
      GuestLog("compute accounting unavailable (%s): launches are not throttled", RegionErrorName(v.error));
    }
    governed_ = false;
    hold_.store(false, std::memory_order_release);
    return;
  }
  if (turn_.turns_unpaid == 1 && !unpaid_logged_) {
    unpaid_logged_ = true;
    char also[96] = "";
    if (turn_.unpaid_by_second) {
      snprintf(also, sizeof(also), " nor %.2f times as much per share and %.2f per second",
               static_cast<double>(kTurnsPayFloorPermille) / 1000.0,
               static_cast<double>(kTurnsPayWallPermille) / 1000.0);
    }
    GuestLog("compute: this process did %.2f times as much per share (%.2f per second) beside the other tenants "
             "without turns as with them; it runs beside them without turns (it tries them again when, at the end "
             "of a %lld s spell, it no longer does %.2f times as much per share without them%s, or at the latest "
             "after %lld s)",
             static_cast<double>(turn_.last_ratio_permille) / 1000.0,
             static_cast<double>(turn_.last_wall_permille) / 1000.0,
             static_cast<long long>(kTurnsUnpaidNs / 1'000'000'000),
             static_cast<double>(kTurnsPayConfirmPermille) / 1000.0, also,
             static_cast<long long>(kTurnsUnpaidMaxNs / 1'000'000'000));
  }
  if (turn_.turns_paid == 1 && !paid_logged_) {
    paid_logged_ = true;
    if (ShareDebug()) GuestLog("compute: turns pay here (%.2f times as much per share without them)",
             static_cast<double>(turn_.last_ratio_permille) / 1000.0);
  }
  if (turn_.comparisons != logged_comparisons_ && ShareDebug()) {
    logged_comparisons_ = turn_.comparisons;
    const int64_t* w = turn_.last_with;
    const int64_t* wo = turn_.last_without;
    GuestLog("compute: turns check %u: ratio %.2f per charge, %.2f per second; without turns %lld ms, %lld launches, "
             "%lld ms charged; with turns %lld ms, %lld launches, %lld ms charged",
             turn_.comparisons, static_cast<double>(turn_.last_ratio_permille) / 1000.0,
             static_cast<double>(turn_.last_wall_permille) / 1000.0,
             static_cast<long long>(wo[0] / 1'000'000), static_cast<long long>(wo[1]),
             static_cast<long long>(wo[2] / 1'000'000), static_cast<long long>(w[0] / 1'000'000),
             static_cast<long long>(w[1]), static_cast<long long>(w[2] / 1'000'000));
  }
  if (ShareDebug() && turn_.checks_repeated != logged_repeats_) {
    logged_repeats_ = turn_.checks_repeated;
    GuestLog("compute: turns check %u found turns narrowly not paying after one that kept them: made again "
             "before leaving them", turn_.comparisons);
  }
  if (ShareDebug() && turn_.thin_waits != logged_thin_waits_) {
    logged_thin_waits_ = turn_.thin_waits;
    GuestLog("compute: turns narrowly not paying on %lld ms charged with turns: waits for more before comparing",
             static_cast<long long>(turn_.with_turns_charged_ns / 1'000'000));
  }
  if (ShareDebug() && turn_.probes_unsaturated != logged_unsaturated_) {
    logged_unsaturated_ = turn_.probes_unsaturated;
    GuestLog("compute: work queued less than half of its probe without turns: no turns for %lld s, then a "
             "fresh probe", static_cast<long long>(kShareGappyNs / 1'000'000'000));
  }
  if (ShareDebug() && turn_.unpaid_extended != logged_extended_) {
    logged_extended_ = turn_.unpaid_extended;
    GuestLog("compute: still %.2f times as much per share (%.2f per second) without turns as with them: stays out "
             "of turns",
             static_cast<double>(turn_.last_extend_permille) / 1000.0,
             static_cast<double>(turn_.last_extend_wall_permille) / 1000.0);
  }
  if (ShareDebug() && turn_.gappy_until_ns != logged_gappy_until_ns_) {
    logged_gappy_until_ns_ = turn_.gappy_until_ns;
    // A probe without turns (200-300 ms), a holder that left the GPU idle (5 s), turns that do not
    // pay (60 s): when and why a group stopped taking turns.
    GuestLog("compute: at %lld ms, out of turns for %lld ms", static_cast<long long>(now / 1'000'000),
             static_cast<long long>((turn_.gappy_until_ns - now) / 1'000'000));
  }
  const bool hold = v.hold != ShareHold::kRun;
  // Held (a turn elsewhere, or its buckets empty): the next two ticks ask about every stream, so
  // that the launches after the hold lifts are seen at once (a turn holder taken for idle at the
  // start of its turn stops turns).
  if (hold) {
    query_all_ticks_ = 2;
  } else if (query_all_ticks_ > 0) {
    --query_all_ticks_;
  }
  pthread_mutex_lock(&mu_);
  hold_.store(hold, std::memory_order_release);
  // Jittered so that sampling does not lock onto a periodic workload.
  jitter_ = jitter_ * 6364136223846793005ULL + 1442695040888963407ULL;
  int64_t next = tick_ns_ / 2 + static_cast<int64_t>((jitter_ >> 33) % static_cast<uint64_t>(tick_ns_));
  // Sooner when held and told when to look again, or when the turn it holds ends then.
  if (v.retry_after_ns > 0 && v.retry_after_ns < next) next = v.retry_after_ns;
  // Held at its limit with work still queued and nobody else wanting the GPU: the queue drains at
  // the GPU's pace while nothing is launched, and a tick is charged whole or not at all, so the
  // tick that finds it empty loses the part of its interval the drain ran. Alone, a capped tenant
  // is held that way every few ticks, and lost most of a tick each time (a lone 25% tenant of 50
  // µs kernels, eight queued, ran at 35% of an H200); looked at every kDrainPollNs until the queue
  // is empty, the drain is charged to within that. Not while others want the GPU: there the
  // arbitration and the turns were measured as they are, and polling every hold there made the
  // turns of two 50% tenants uneven from one second to the next (docs/compute-sharing.md).
  // For at most kDrainPollMaxNs per hold: a queue of long kernels (or a stream that waits on
  // something other than the GPU) would be polled for as long as it lasts, and a tick lost at the
  // end of a long drain is small beside it.
  if (v.hold == ShareHold::kAtLimit && !v.others_want && queued) {
    if (drain_since_ns_ == 0) drain_since_ns_ = now;
    if (now - drain_since_ns_ < kDrainPollMaxNs && next > kDrainPollNs) next = kDrainPollNs;
  } else {
    drain_since_ns_ = 0;
  }
  if (next < kDrainPollNs) next = kDrainPollNs;
  next_tick_ns_ = next;
  if (!hold) pthread_cond_broadcast(&cv_);
  pthread_mutex_unlock(&mu_);
  if (queued || hold) idle_ticks_ = 0;
  else ++idle_ticks_;
}

void* ComputeGovernor::Main(void* self) {
  auto* g = static_cast<ComputeGovernor*>(self);
  int64_t last = MonotonicNowNs();
  pthread_mutex_lock(&g->mu_);
  while (!g->exiting_) {
    if (g->idle_ticks_ >= kIdleTicksBeforeSleep && g->launches_.load(std::memory_order_relaxed) == 0) {
      if (Binding* b = Bound()) b->region.ShareIdle(b->slot);
      g->sleeping_.store(true, std::memory_order_seq_cst);
      if (g->launches_.load(std::memory_order_seq_cst) == 0) {
        timespec ts;
        AbsDeadline(&ts, 100'000'000);
        pthread_cond_timedwait(&g->cv_, &g->mu_, &ts);
      }
      g->sleeping_.store(false, std::memory_order_relaxed);
      last = MonotonicNowNs();
      g->last_tick_ns_.store(last, std::memory_order_relaxed);
      g->idle_ticks_ = g->launches_.load(std::memory_order_relaxed) == 0 ? g->idle_ticks_ : 0;
      continue;
    }
    timespec ts;
    AbsDeadline(&ts, g->next_tick_ns_);
    pthread_cond_timedwait(&g->cv_, &g->mu_, &ts);
    if (g->exiting_) break;
    int64_t now = MonotonicNowNs();
    int64_t dt = now - last;
    if (dt < g->next_tick_ns_ / 2) continue;  // woken early (a launch after sleep): not due yet
    if (dt > kMaxTickNs) dt = kMaxTickNs;
    last = now;
    const uint64_t launches = g->launches_.exchange(0, std::memory_order_relaxed);
    g->turn_.tick_launches = static_cast<int64_t>(launches);  // this tick's only
    pthread_mutex_unlock(&g->mu_);
    g->Tick(now, dt, launches);
    g->last_tick_ns_.store(now, std::memory_order_relaxed);
    pthread_mutex_lock(&g->mu_);
  }
  g->hold_.store(false, std::memory_order_release);
  pthread_cond_broadcast(&g->cv_);
  pthread_mutex_unlock(&g->mu_);
  return nullptr;
}

}  // namespace tf::limiter
