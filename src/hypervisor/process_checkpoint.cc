// Scale to zero with the driver's process checkpoint: see process_checkpoint.h.
#include "hypervisor/process_checkpoint.h"

#include <cuda.h>
#include <dlfcn.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <iterator>

#include <chrono>
#include <cstdio>

#include "hypervisor/quota_regions.h"
#include "hypervisor/remote_sessions.h"
#include "limiter/core/process_identity.h"

namespace tf::hypervisor {
namespace {

using limiter::ProcessZero;

int64_t NowUs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000 + ts.tv_nsec / 1'000;
}

uint32_t ClampUs(int64_t us) { return us < 0 ? 0 : us > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(us); }

// The pid of an active process slot, 0 when the slot is free or out of range, or when the pid it
// names is not a tenant of the region (IsTenantOfRegion: the pid and start time a tenant could
// have written there, and the vGPU its environment was started for, are checked against /proc
// before the driver is asked to lock anything). `raw`, when given: the pid the slot names,
// unverified (0: free).
int SlotPid(const limiter::GpuRegion& region, uint32_t slot, int* raw = nullptr) {
  auto snap = std::make_unique<limiter::RegionSnapshot>();
  region.Snapshot(snap.get());
  if (raw != nullptr) *raw = 0;
  for (uint32_t i = 0; i < snap->process_count; ++i) {
    const limiter::ProcessInfo& p = snap->processes[i];
    if (p.slot != slot) continue;
    if (raw != nullptr) *raw = p.pid;
    for (uint32_t k = 0; k < snap->vgpu_count; ++k) {
      if (snap->vgpus[k].index != p.vgpu_index) continue;
      // The id its environment must name; a worker session's environment is its worker's.
      const std::string vgpu = SessionOfVgpu(snap->vgpus[k].id) > 0 ? "" : snap->vgpus[k].id;
      return IsTenantOfRegion(p.pid, p.start_time_ticks, region.path(), vgpu) ? p.pid : 0;
    }
    return 0;  // its vGPU is not in the table
  }
  return 0;
}

// This process as an actor of ProcessZero::actor: its pid and the inode of its PID namespace.
uint64_t OwnActor() {
  static const uint64_t ns = [] {
    struct stat st {};
    return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino & 0xffffffffu) : 0;
  }();
  return ns << 32 | static_cast<uint32_t>(getpid());
}

// True only when `actor` names a process of our PID namespace that is gone (or a zombie): an
// actor of another namespace, or none known (0, an older build), is never judged. Existence is
// asked of the kernel (kill 0: our namespace, whatever /proc's hidepid hides); /proc only tells a
// zombie, where it can be read.
bool ActorGone(uint64_t actor) {
  if (actor == 0 || actor >> 32 != OwnActor() >> 32 || (OwnActor() >> 32) == 0) return false;
  const pid_t pid = static_cast<pid_t>(actor & 0xffffffffu);
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0) return errno == ESRCH;
  limiter::ProcessStat st;
  return limiter::ReadProcessStat(pid, &st) && (st.state == 'Z' || st.state == 'X');
}

// The word judged: an older build acting on the slot writes actor_pid (its pid while it
// checkpoints or restores, 0 otherwise) but never `actor`; a word whose pid is not actor_pid is
// stale (left by a new build killed outright) and is not judged.
bool ActorCorroborated(const limiter::ProcessZero* z, uint64_t actor) {
  return z->actor_pid.load(std::memory_order_acquire) == static_cast<int32_t>(actor & 0xffffffffu);
}

// Claims the slot's actor word for this process (after winning the state's compare-and-swap).
void SetActor(limiter::ProcessZero* z) {
  z->actor.store(OwnActor(), std::memory_order_release);
  z->actor_pid.store(getpid(), std::memory_order_relaxed);
}

// Ours only: a party that claimed the slot since (its terminal state was published) keeps its word.
void ClearActor(limiter::ProcessZero* z) {
  uint64_t own = OwnActor();
  if (z->actor.compare_exchange_strong(own, 0, std::memory_order_acq_rel))
    z->actor_pid.store(0, std::memory_order_relaxed);
}

// Ctrl-C (and SIGTERM, SIGHUP, SIGQUIT) wait while a process (`tfusion freeze`, `thaw`) hands a
// tenant to the driver or back: killed between two driver calls, it would leave the tenant locked
// or half-done. A signal whose action is the default (death) is caught meanwhile and raised again
// once the tenant's state is whole; the driver's own threads would take a blocked one, so it is
// caught rather than blocked. A process that handles these signals itself (the node agent,
// `tfusion run`) keeps its handlers: it does not die of them mid-way.
std::atomic<int> g_deferred_signal{0};
extern "C" void DeferSignal(int sig) { g_deferred_signal.store(sig, std::memory_order_relaxed); }

class TerminationDeferred {
 public:
  TerminationDeferred() {
    for (size_t i = 0; i < std::size(kSignals); ++i) {
      struct sigaction now {};
      if (sigaction(kSignals[i], nullptr, &now) != 0 || now.sa_handler != SIG_DFL) continue;
      struct sigaction defer {};
      defer.sa_handler = DeferSignal;
      defer.sa_flags = SA_RESTART;  // the driver's calls in flight go on, unaware
      sigemptyset(&defer.sa_mask);
      caught_[i] = sigaction(kSignals[i], &defer, &old_[i]) == 0;
    }
  }
  ~TerminationDeferred() {
    for (size_t i = 0; i < std::size(kSignals); ++i)
      if (caught_[i]) sigaction(kSignals[i], &old_[i], nullptr);
    if (const int sig = g_deferred_signal.exchange(0, std::memory_order_relaxed); sig != 0) {
      std::fflush(stdout);
      std::fprintf(stderr, "interrupted (signal %d): the checkpoint or restore in progress was finished first\n", sig);
      raise(sig);
    }
  }
  TerminationDeferred(const TerminationDeferred&) = delete;
  TerminationDeferred& operator=(const TerminationDeferred&) = delete;

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  struct sigaction old_[std::size(kSignals)] {};
  bool caught_[std::size(kSignals)] = {};
};

// The driver side of a restore, whatever an earlier attempt left: checkpointed -> restore;
// locked -> unlock; running: nothing. CUresult.
int PutBackInDriver(CheckpointDriver& driver, int pid) {
  int state = -1;
  int e = driver.State(pid, &state);
  if (e == CUDA_SUCCESS && state == CU_PROCESS_STATE_CHECKPOINTED) {
    e = driver.Restore(pid);
    if (e == CUDA_SUCCESS) e = driver.State(pid, &state);
  }
  if (e == CUDA_SUCCESS && state == CU_PROCESS_STATE_LOCKED) e = driver.Unlock(pid);
  else if (e == CUDA_SUCCESS && state != CU_PROCESS_STATE_RUNNING) e = CUDA_ERROR_ILLEGAL_STATE;
  return e;
}

// A restore's end, by the party that claimed `z` in state restoring: running again (0), or still
// checkpointed with the driver's error for the waiting call. `wake` is the wake_gen read before.
void FinishRestore(limiter::ProcessZero* z, int e, uint32_t wake, int64_t t0_us);

template <typename Fn>
bool Resolve(void* handle, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(handle, name));
  return *out != nullptr;
}

}  // namespace

StatusOr<std::unique_ptr<CheckpointDriver>> CheckpointDriver::Load(const std::string& libcuda_path) {
  void* handle = dlopen(libcuda_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return Unavailable("cannot load " + libcuda_path + ": " + dlerror());
  std::unique_ptr<CheckpointDriver> d(new CheckpointDriver());
  d->handle_ = handle;
  int (*init)(unsigned) = nullptr;
  if (!Resolve(handle, "cuInit", &init) || !Resolve(handle, "cuCheckpointProcessLock", &d->lock_) ||
      !Resolve(handle, "cuCheckpointProcessCheckpoint", &d->checkpoint_) ||
      !Resolve(handle, "cuCheckpointProcessRestore", &d->restore_) ||
      !Resolve(handle, "cuCheckpointProcessUnlock", &d->unlock_) ||
      !Resolve(handle, "cuCheckpointProcessGetState", &d->state_)) {
    return Unavailable(libcuda_path + " has no process checkpoint API (it needs driver 550 or newer)");
  }
  if (int e = init(0); e != CUDA_SUCCESS) {
    return Unavailable("the driver " + libcuda_path + " did not initialise (CUDA error " + std::to_string(e) + ")");
  }
  return d;
}

CheckpointDriver::~CheckpointDriver() {
  // The driver is never unloaded: its threads may outlive this object.
}

int CheckpointDriver::Lock(int pid, unsigned timeout_ms) {
  CUcheckpointLockArgs args{};
  args.timeoutMs = timeout_ms;
  return lock_(pid, &args);
}

int CheckpointDriver::Checkpoint(int pid) {
  CUcheckpointCheckpointArgs args{};
  return checkpoint_(pid, &args);
}

int CheckpointDriver::Restore(int pid) {
  CUcheckpointRestoreArgs args{};
  return restore_(pid, &args);
}

int CheckpointDriver::Unlock(int pid) {
  CUcheckpointUnlockArgs args{};
  return unlock_(pid, &args);
}

int CheckpointDriver::State(int pid, int* state) { return state_(pid, state); }

CheckpointOutcome CheckpointProcess(const limiter::GpuRegion& region, uint32_t slot, CheckpointDriver& driver,
                                    int64_t park_timeout_ms) {
  CheckpointOutcome out;
  out.pid = SlotPid(region, slot);
  ProcessZero* z = region.ZeroOfProcess(slot);
  if (out.pid == 0 || z == nullptr) {
    out.why = "the process is gone";
    return out;
  }
  const TerminationDeferred deferred;
  // What a checkpointer or restorer killed outright left: put back first.
  if (int e = RecoverFromGoneActor(region, slot, &driver); e > 0) {
    out.error = static_cast<uint32_t>(e);
    out.why = "a killed checkpointer or restorer left it locked, and the driver refused to put it back (CUDA error " +
              std::to_string(e) + ")";
    return out;
  }
  uint32_t expect = limiter::kZeroNone;
  if (!z->state.compare_exchange_strong(expect, limiter::kZeroParkRequested, std::memory_order_acq_rel)) {
    out.why = expect == limiter::kZeroCheckpointed ? "it is checkpointed already" : "another checkpoint or restore is under way";
    return out;
  }
  SetActor(z);
  const int64_t t0 = NowUs();
  uint32_t st = limiter::kZeroParkRequested;
  while (st == limiter::kZeroParkRequested && NowUs() - t0 < park_timeout_ms * 1000) {
    usleep(1'000);
    st = z->state.load(std::memory_order_acquire);
  }
  out.park_ms = (NowUs() - t0) / 1000.0;
  if (st != limiter::kZeroParked) {
    expect = limiter::kZeroParkRequested;
    if (!z->state.compare_exchange_strong(expect, limiter::kZeroNone, std::memory_order_acq_rel) &&
        expect == limiter::kZeroParked) {
      // Parked just as the wait ran out: withdrawn from there too (it would stay parked for good).
      expect = limiter::kZeroParked;
      z->state.compare_exchange_strong(expect, limiter::kZeroNone, std::memory_order_acq_rel);
      st = limiter::kZeroNone;
    }
    ClearActor(z);
    out.why = st == limiter::kZeroNone ? "its limiter refused (it is not swapped out or not quiet; its log says why)"
                                       : "its limiter did not answer within " + std::to_string(park_timeout_ms) + " ms";
    return out;
  }
  expect = limiter::kZeroParked;
  if (!z->state.compare_exchange_strong(expect, limiter::kZeroCheckpointing, std::memory_order_acq_rel)) {
    out.why = "its state changed under us";
    return out;  // taken over: the actor is no longer ours to clear
  }
  const int64_t t1 = NowUs();
  int e = driver.Lock(out.pid, 10'000);
  if (e == CUDA_SUCCESS) {
    e = driver.Checkpoint(out.pid);
    if (e != CUDA_SUCCESS) driver.Unlock(out.pid);
  }
  out.checkpoint_ms = (NowUs() - t1) / 1000.0;
  if (e != CUDA_SUCCESS) {
    out.error = static_cast<uint32_t>(e);
    out.why = "the driver refused (CUDA error " + std::to_string(e) + ")";
    z->last_error.store(out.error, std::memory_order_relaxed);
    z->state.store(limiter::kZeroNone, std::memory_order_release);  // unparked: it resumes as usual
    ClearActor(z);
    return out;
  }
  z->last_error.store(0, std::memory_order_relaxed);
  z->last_checkpoint_us.store(ClampUs(NowUs() - t1), std::memory_order_relaxed);
  z->checkpoints.fetch_add(1, std::memory_order_relaxed);
  z->state.store(limiter::kZeroCheckpointed, std::memory_order_release);
  ClearActor(z);
  out.ok = true;
  return out;
}

namespace {

void FinishRestore(ProcessZero* z, int e, uint32_t wake, int64_t t0_us) {
  if (e == CUDA_SUCCESS) {
    z->last_error.store(0, std::memory_order_relaxed);
    z->last_restore_us.store(ClampUs(NowUs() - t0_us), std::memory_order_relaxed);
    z->restores.fetch_add(1, std::memory_order_relaxed);
    z->state.store(limiter::kZeroNone, std::memory_order_release);
  } else {
    z->last_error.store(static_cast<uint32_t>(e), std::memory_order_relaxed);
    z->state.store(limiter::kZeroCheckpointed, std::memory_order_release);
  }
  ClearActor(z);
  z->wake_done_gen.store(wake, std::memory_order_release);  // after the state: see ZeroWait
}

}  // namespace

int RecoverFromGoneActor(const limiter::GpuRegion& region, uint32_t slot, CheckpointDriver* driver) {
  ProcessZero* z = region.ZeroOfProcess(slot);
  if (z == nullptr) return -1;
  const uint32_t judged = z->state.load(std::memory_order_acquire);
  if (judged != limiter::kZeroParkRequested && judged != limiter::kZeroParked && judged != limiter::kZeroCheckpointing &&
      judged != limiter::kZeroRestoring)
    return -1;
  uint64_t gone = z->actor.load(std::memory_order_acquire);
  if (!ActorCorroborated(z, gone) || !ActorGone(gone)) return -1;
  const bool driver_touched = judged == limiter::kZeroCheckpointing || judged == limiter::kZeroRestoring;
  if (driver_touched && driver == nullptr) return -1;  // left for a party with the driver
  // The tenant as this party can tell it. One it cannot verify (another user's, whose /proc it may
  // not read) but that lives is left to a party that can: it would be marked running while the
  // driver still holds it.
  int pid = 0;
  if (driver_touched) {
    int raw = 0;
    pid = SlotPid(region, slot, &raw);
    if (pid == 0 && raw > 0 && (kill(raw, 0) == 0 || errno == EPERM)) return -1;
  }
  const TerminationDeferred deferred;
  // One party takes the slot over: the one whose compare-and-swap of the whole word wins.
  if (!z->actor.compare_exchange_strong(gone, OwnActor(), std::memory_order_acq_rel)) return -1;
  z->actor_pid.store(getpid(), std::memory_order_release);
  if (!driver_touched) {
    // Parked (or asked to, and its limiter may park it meanwhile): the driver was not touched;
    // back to none, and its calls go on.
    for (uint32_t parked : {limiter::kZeroParkRequested, limiter::kZeroParked}) {
      uint32_t expect = parked;
      if (z->state.compare_exchange_strong(expect, limiter::kZeroNone, std::memory_order_acq_rel)) {
        ClearActor(z);
        return CUDA_SUCCESS;
      }
    }
    ClearActor(z);  // its limiter answered meanwhile (refused: none)
    return -1;
  }
  // Only the state judged: one that moved since was not left by a dead actor.
  uint32_t expect = judged;
  if (!z->state.compare_exchange_strong(expect, limiter::kZeroRestoring, std::memory_order_acq_rel)) {
    ClearActor(z);
    return -1;
  }
  const uint32_t wake = z->wake_gen.load(std::memory_order_acquire);
  const int64_t t0 = NowUs();
  const int e = pid == 0 ? CUDA_SUCCESS : PutBackInDriver(*driver, pid);  // gone: nothing to put back
  FinishRestore(z, e, wake, t0);
  return e;
}

int RestoreProcess(const limiter::GpuRegion& region, uint32_t slot, CheckpointDriver& driver) {
  ProcessZero* z = region.ZeroOfProcess(slot);
  const int pid = SlotPid(region, slot);
  if (z == nullptr || pid == 0) return CUDA_SUCCESS;
  const TerminationDeferred deferred;
  // What a checkpointer or restorer killed outright left: its recovery is this restore.
  if (int e = RecoverFromGoneActor(region, slot, &driver); e >= 0) return e;
  const uint32_t wake = z->wake_gen.load(std::memory_order_acquire);
  uint32_t expect = limiter::kZeroCheckpointed;
  if (!z->state.compare_exchange_strong(expect, limiter::kZeroRestoring, std::memory_order_acq_rel)) {
    return expect == limiter::kZeroNone ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_STATE;
  }
  SetActor(z);
  const int64_t t0 = NowUs();
  const int e = PutBackInDriver(driver, pid);
  FinishRestore(z, e, wake, t0);
  return e;
}

ZeroRestorer::ZeroRestorer(std::string libcuda_path, std::vector<std::string> region_paths, std::string only_vgpu,
                           std::string vgpu_prefix, std::string log_prefix)
    : libcuda_path_(std::move(libcuda_path)), region_paths_(std::move(region_paths)), only_vgpu_(std::move(only_vgpu)),
      vgpu_prefix_(std::move(vgpu_prefix)), log_prefix_(std::move(log_prefix)) {}

ZeroRestorer::~ZeroRestorer() { Stop(); }

void ZeroRestorer::Start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] {
    int64_t next_policy = 0;
    while (!stop_.load(std::memory_order_relaxed)) {
      PollOnce();
      const int64_t now = NowUs() * 1000;
      if (now >= next_policy) {
        PolicyOnce(now);
        next_policy = NowUs() * 1000 + 100'000'000;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
}

void ZeroRestorer::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void ZeroRestorer::AttachLazily() { AttachRegionsOnce(region_paths_, &regions_); }

bool ZeroRestorer::Wanted(const char* vgpu_id) const {
  if (!only_vgpu_.empty() && only_vgpu_ != vgpu_id) return false;
  return vgpu_prefix_.empty() || std::string(vgpu_id).rfind(vgpu_prefix_, 0) == 0;
}

CheckpointDriver* ZeroRestorer::Driver() {
  if (!driver_ && !driver_failed_) {
    auto loaded = CheckpointDriver::Load(libcuda_path_);
    if (loaded.ok()) {
      driver_ = std::move(*loaded);
    } else {
      driver_failed_ = true;
      std::fprintf(stderr, "%s: cannot checkpoint or restore processes (scale to zero): %s\n", log_prefix_.c_str(),
                   loaded.status().message().c_str());
    }
  }
  return driver_.get();
}

int ZeroRestorer::PollOnce() {
  AttachLazily();
  int attempted = 0;
  for (auto& region : regions_) {
    if (!region->attached()) continue;
    const bool filtered = !only_vgpu_.empty() || !vgpu_prefix_.empty();
    std::unique_ptr<limiter::RegionSnapshot> snap;  // taken only when a wake request needs the filter
    auto mine = [&](uint32_t slot) {
      if (!filtered) return true;
      if (!snap) {
        snap = std::make_unique<limiter::RegionSnapshot>();
        region->Snapshot(snap.get());
      }
      bool found = false;
      for (uint32_t i = 0; i < snap->process_count && !found; ++i) {
        if (snap->processes[i].slot != slot) continue;
        for (uint32_t v = 0; v < snap->vgpu_count; ++v)
          found = found || (snap->vgpus[v].index == snap->processes[i].vgpu_index && Wanted(snap->vgpus[v].id));
      }
      return found;
    };
    for (uint32_t slot = 0; slot < limiter::kMaxProcesses; ++slot) {
      ProcessZero* z = region->ZeroOfProcess(slot);
      // Cheap checks first: nearly every slot is free or not checkpointed.
      const uint32_t st = z->state.load(std::memory_order_acquire);
      if (st != limiter::kZeroNone && st != limiter::kZeroCheckpointed &&
          ActorGone(z->actor.load(std::memory_order_acquire)) && mine(slot)) {
        // Mid-way with an actor: taken over when that actor was killed outright.
        const bool needs_driver = st == limiter::kZeroCheckpointing || st == limiter::kZeroRestoring;
        const int e = RecoverFromGoneActor(*region, slot, needs_driver ? Driver() : nullptr);
        if (e >= 0) {
          ++attempted;
          std::fprintf(stderr, "%s: a checkpointer or restorer was killed mid-way: process slot %u put back%s\n",
                       log_prefix_.c_str(), slot,
                       e == CUDA_SUCCESS ? "" : (" failed (CUDA error " + std::to_string(e) + ")").c_str());
        }
        continue;
      }
      if (st != limiter::kZeroCheckpointed) continue;
      if (z->wake_gen.load(std::memory_order_acquire) == z->wake_done_gen.load(std::memory_order_acquire)) continue;
      if (!mine(slot)) continue;
      ++attempted;
      CheckpointDriver* driver = Driver();
      if (driver == nullptr) {
        uint32_t expect = limiter::kZeroCheckpointed;
        if (z->state.compare_exchange_strong(expect, limiter::kZeroRestoring)) {
          z->last_error.store(CUDA_ERROR_NOT_SUPPORTED, std::memory_order_relaxed);
          const uint32_t wake = z->wake_gen.load(std::memory_order_acquire);
          z->state.store(limiter::kZeroCheckpointed, std::memory_order_release);
          z->wake_done_gen.store(wake, std::memory_order_release);
        }
        continue;
      }
      int e = RestoreProcess(*region, slot, *driver);
      if (e != CUDA_SUCCESS) {
        std::fprintf(stderr, "%s: restoring a checkpointed process failed (CUDA error %d)\n", log_prefix_.c_str(), e);
      }
    }
  }
  return attempted;
}

int ZeroRestorer::PolicyOnce(int64_t now_ns) {
  AttachLazily();
  int attempted = 0;
  for (size_t r = 0; r < regions_.size(); ++r) {
    limiter::GpuRegion& region = *regions_[r];
    if (!region.attached()) continue;
    // Cheap check first: a vGPU with tiering that has a policy or a request to act on.
    bool any = false;
    for (uint32_t v = 0; v < limiter::kMaxVgpus && !any; ++v) {
      const limiter::VgpuTier* t = region.TierOfVgpu(v);
      any = t->enabled.load(std::memory_order_relaxed) != 0;
    }
    if (!any) continue;
    auto snap = std::make_unique<limiter::RegionSnapshot>();
    region.Snapshot(snap.get());
    for (uint32_t vi = 0; vi < snap->vgpu_count; ++vi) {
      const limiter::VgpuInfo& v = snap->vgpus[vi];
      if (!v.tier_enabled || !Wanted(v.id)) continue;
      limiter::VgpuTier* t = region.TierOfVgpu(v.index);
      const uint32_t zero_gen = t->zero_gen.load(std::memory_order_acquire);
      const bool zero_wanted = zero_gen != t->zero_done_gen.load(std::memory_order_acquire);
      const uint32_t freeze_gen = t->freeze_gen.load(std::memory_order_acquire);
      const uint32_t thaw_gen = t->thaw_gen.load(std::memory_order_acquire);
      ZeroRequest* req = nullptr;
      if (zero_wanted) {
        req = &zero_requests_[{r, v.index}];
        if (req->gen != zero_gen || req->since_ns == 0) *req = ZeroRequest{zero_gen, now_ns, {}};
      }
      bool pending = false;
      for (uint32_t k = 0; k < snap->process_count; ++k) {
        const limiter::ProcessInfo& p = snap->processes[k];
        if (p.vgpu_index != v.index || p.tier_state == limiter::kTierOff) continue;
        const limiter::ProcessTier* pt = region.TierOfProcess(p.slot);
        const bool swapped = p.tier_state == limiter::kTierSwapped || p.tier_state == limiter::kTierOnDisk;
        // A thaw asked of a checkpointed process: restore it, its limiter then swaps in.
        if (p.zero_state == limiter::kZeroCheckpointed && !v.held &&
            pt->thaw_done_gen.load(std::memory_order_acquire) != thaw_gen) {
          ++attempted;
          if (CheckpointDriver* d = Driver(); d != nullptr) {
            int e = RestoreProcess(region, p.slot, *d);
            std::fprintf(stderr, e == CUDA_SUCCESS ? "%s: vGPU %s: process %d restored for a thaw\n"
                                                   : "%s: vGPU %s: process %d: restore for a thaw failed\n",
                         log_prefix_.c_str(), v.id, p.pid);
          }
          continue;
        }
        if (p.zero_state != limiter::kZeroNone || v.held) continue;
        if (req != nullptr) {
          if (pt->freeze_done_gen.load(std::memory_order_acquire) != freeze_gen ||
              p.tier_state == limiter::kTierSwappingOut) {
            pending = true;  // its swap-out is not done yet
          } else if (swapped && req->tried.insert(p.pid).second) {
            ++attempted;
            if (CheckpointDriver* d = Driver(); d != nullptr) {
              CheckpointOutcome o = CheckpointProcess(region, p.slot, *d);
              if (o.ok) {
                std::fprintf(stderr, "%s: vGPU %s: process %d checkpointed on request (park %.1f ms, checkpoint %.1f ms)\n",
                             log_prefix_.c_str(), v.id, p.pid, o.park_ms, o.checkpoint_ms);
              } else {
                std::fprintf(stderr, "%s: vGPU %s: process %d not checkpointed: %s\n", log_prefix_.c_str(), v.id,
                             p.pid, o.why.c_str());
              }
            }
          }
          continue;
        }
        if (v.idle_zero_ms == 0 || !swapped || p.last_active_ns <= 0) continue;
        const int64_t idle_ns = static_cast<int64_t>(v.idle_zero_ms) * 1'000'000;
        if (now_ns - p.last_active_ns < idle_ns) continue;
        auto key = std::make_tuple(r, p.slot, p.pid);
        if (auto it = idle_attempts_.find(key); it != idle_attempts_.end() && now_ns - it->second < idle_ns) continue;
        idle_attempts_[key] = now_ns;
        ++attempted;
        CheckpointDriver* d = Driver();
        if (d == nullptr) continue;
        CheckpointOutcome o = CheckpointProcess(region, p.slot, *d);
        if (o.ok) {
          std::fprintf(stderr, "%s: vGPU %s: process %d idle %.0f s: checkpointed (park %.1f ms, checkpoint %.1f ms)\n",
                       log_prefix_.c_str(), v.id, p.pid, (now_ns - p.last_active_ns) / 1e9, o.park_ms, o.checkpoint_ms);
        } else {
          std::fprintf(stderr, "%s: vGPU %s: process %d idle: not checkpointed: %s\n", log_prefix_.c_str(), v.id,
                       p.pid, o.why.c_str());
        }
      }
      if (req != nullptr && (!pending || now_ns - req->since_ns > 60'000'000'000LL)) {
        if (pending) {
          std::fprintf(stderr, "%s: vGPU %s: zero request given up: its processes did not swap out within 60 s\n",
                       log_prefix_.c_str(), v.id);
        }
        t->zero_done_gen.store(zero_gen, std::memory_order_release);
        zero_requests_.erase({r, v.index});
      }
    }
    // Forget the idle attempts of processes that are gone or awake.
    for (auto it = idle_attempts_.begin(); it != idle_attempts_.end();) {
      bool keep = false;
      if (std::get<0>(it->first) == r) {
        for (uint32_t k = 0; k < snap->process_count && !keep; ++k)
          keep = snap->processes[k].slot == std::get<1>(it->first) && snap->processes[k].pid == std::get<2>(it->first) &&
                 snap->processes[k].tier_state != limiter::kTierResident;
      } else {
        keep = true;
      }
      it = keep ? std::next(it) : idle_attempts_.erase(it);
    }
  }
  return attempted;
}

}  // namespace tf::hypervisor
