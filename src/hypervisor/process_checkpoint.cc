// Scale to zero with the driver's process checkpoint: see process_checkpoint.h.
#include "hypervisor/process_checkpoint.h"

#include <cuda.h>
#include <dlfcn.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace tf::hypervisor {
namespace {

using limiter::ProcessZero;

int64_t NowUs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000 + ts.tv_nsec / 1'000;
}

uint32_t ClampUs(int64_t us) { return us < 0 ? 0 : us > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(us); }

// The pid of an active process slot, 0 when the slot is free or out of range.
int SlotPid(const limiter::GpuRegion& region, uint32_t slot) {
  auto snap = std::make_unique<limiter::RegionSnapshot>();
  region.Snapshot(snap.get());
  for (uint32_t i = 0; i < snap->process_count; ++i) {
    if (snap->processes[i].slot == slot) return snap->processes[i].pid;
  }
  return 0;
}

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
  uint32_t expect = limiter::kZeroNone;
  if (!z->state.compare_exchange_strong(expect, limiter::kZeroParkRequested, std::memory_order_acq_rel)) {
    out.why = expect == limiter::kZeroCheckpointed ? "it is checkpointed already" : "another checkpoint or restore is under way";
    return out;
  }
  const int64_t t0 = NowUs();
  uint32_t st = limiter::kZeroParkRequested;
  while (st == limiter::kZeroParkRequested && NowUs() - t0 < park_timeout_ms * 1000) {
    usleep(1'000);
    st = z->state.load(std::memory_order_acquire);
  }
  out.park_ms = (NowUs() - t0) / 1000.0;
  if (st != limiter::kZeroParked) {
    expect = limiter::kZeroParkRequested;
    z->state.compare_exchange_strong(expect, limiter::kZeroNone, std::memory_order_acq_rel);  // withdrawn
    out.why = st == limiter::kZeroNone ? "its limiter refused (it is not swapped out or not quiet; its log says why)"
                                       : "its limiter did not answer within " + std::to_string(park_timeout_ms) + " ms";
    return out;
  }
  expect = limiter::kZeroParked;
  if (!z->state.compare_exchange_strong(expect, limiter::kZeroCheckpointing, std::memory_order_acq_rel)) {
    out.why = "its state changed under us";
    return out;
  }
  z->actor_pid.store(getpid(), std::memory_order_relaxed);
  const int64_t t1 = NowUs();
  int e = driver.Lock(out.pid, 10'000);
  if (e == CUDA_SUCCESS) {
    e = driver.Checkpoint(out.pid);
    if (e != CUDA_SUCCESS) driver.Unlock(out.pid);
  }
  out.checkpoint_ms = (NowUs() - t1) / 1000.0;
  z->actor_pid.store(0, std::memory_order_relaxed);
  if (e != CUDA_SUCCESS) {
    out.error = static_cast<uint32_t>(e);
    out.why = "the driver refused (CUDA error " + std::to_string(e) + ")";
    z->last_error.store(out.error, std::memory_order_relaxed);
    z->state.store(limiter::kZeroNone, std::memory_order_release);  // unparked: it resumes as usual
    return out;
  }
  z->last_error.store(0, std::memory_order_relaxed);
  z->last_checkpoint_us.store(ClampUs(NowUs() - t1), std::memory_order_relaxed);
  z->checkpoints.fetch_add(1, std::memory_order_relaxed);
  z->state.store(limiter::kZeroCheckpointed, std::memory_order_release);
  out.ok = true;
  return out;
}

int RestoreProcess(const limiter::GpuRegion& region, uint32_t slot, CheckpointDriver& driver) {
  ProcessZero* z = region.ZeroOfProcess(slot);
  const int pid = SlotPid(region, slot);
  if (z == nullptr || pid == 0) return CUDA_SUCCESS;
  const uint32_t wake = z->wake_gen.load(std::memory_order_acquire);
  uint32_t expect = limiter::kZeroCheckpointed;
  if (!z->state.compare_exchange_strong(expect, limiter::kZeroRestoring, std::memory_order_acq_rel)) {
    return expect == limiter::kZeroNone ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_STATE;
  }
  z->actor_pid.store(getpid(), std::memory_order_relaxed);
  const int64_t t0 = NowUs();
  // Whatever an earlier attempt left: checkpointed -> restore; locked -> unlock.
  int state = -1;
  int e = driver.State(pid, &state);
  if (e == CUDA_SUCCESS && state == CU_PROCESS_STATE_CHECKPOINTED) {
    e = driver.Restore(pid);
    if (e == CUDA_SUCCESS) e = driver.State(pid, &state);
  }
  if (e == CUDA_SUCCESS && state == CU_PROCESS_STATE_LOCKED) e = driver.Unlock(pid);
  else if (e == CUDA_SUCCESS && state != CU_PROCESS_STATE_RUNNING) e = CUDA_ERROR_ILLEGAL_STATE;
  z->actor_pid.store(0, std::memory_order_relaxed);
  if (e == CUDA_SUCCESS) {
    z->last_error.store(0, std::memory_order_relaxed);
    z->last_restore_us.store(ClampUs(NowUs() - t0), std::memory_order_relaxed);
    z->restores.fetch_add(1, std::memory_order_relaxed);
    z->state.store(limiter::kZeroNone, std::memory_order_release);
  } else {
    z->last_error.store(static_cast<uint32_t>(e), std::memory_order_relaxed);
    z->state.store(limiter::kZeroCheckpointed, std::memory_order_release);
  }
  z->wake_done_gen.store(wake, std::memory_order_release);  // after the state: see ZeroWait
  return e;
}

ZeroRestorer::ZeroRestorer(std::string libcuda_path, std::vector<std::string> region_paths, std::string only_vgpu)
    : libcuda_path_(std::move(libcuda_path)), region_paths_(std::move(region_paths)), only_vgpu_(std::move(only_vgpu)) {}

ZeroRestorer::~ZeroRestorer() { Stop(); }

void ZeroRestorer::Start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] {
    while (!stop_.load(std::memory_order_relaxed)) {
      PollOnce();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
}

void ZeroRestorer::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

int ZeroRestorer::PollOnce() {
  if (regions_.size() != region_paths_.size()) {
    regions_.clear();
    for (const auto& p : region_paths_) {
      auto r = std::make_unique<limiter::GpuRegion>();
      limiter::GpuRegion::Attach(p.c_str(), r.get());
      regions_.push_back(std::move(r));
    }
  }
  int attempted = 0;
  for (auto& region : regions_) {
    if (!region->attached()) continue;
    uint32_t only = limiter::kMaxVgpus;
    if (!only_vgpu_.empty() && region->FindVgpu(only_vgpu_.c_str(), &only) != limiter::RegionError::kOk) continue;
    for (uint32_t slot = 0; slot < limiter::kMaxProcesses; ++slot) {
      ProcessZero* z = region->ZeroOfProcess(slot);
      // Cheap checks first: nearly every slot is free or not checkpointed.
      if (z->state.load(std::memory_order_acquire) != limiter::kZeroCheckpointed) continue;
      if (z->wake_gen.load(std::memory_order_acquire) == z->wake_done_gen.load(std::memory_order_acquire)) continue;
      if (only != limiter::kMaxVgpus) {
        auto snap = std::make_unique<limiter::RegionSnapshot>();
        region->Snapshot(snap.get());
        bool mine = false;
        for (uint32_t i = 0; i < snap->process_count; ++i) {
          mine = mine || (snap->processes[i].slot == slot && snap->processes[i].vgpu_index == only);
        }
        if (!mine) continue;
      }
      ++attempted;
      if (!driver_ && !driver_failed_) {
        auto loaded = CheckpointDriver::Load(libcuda_path_);
        if (loaded.ok()) {
          driver_ = std::move(*loaded);
        } else {
          driver_failed_ = true;
          std::fprintf(stderr, "tfusion: cannot restore checkpointed processes: %s\n", loaded.status().message().c_str());
        }
      }
      if (!driver_) {
        uint32_t expect = limiter::kZeroCheckpointed;
        if (z->state.compare_exchange_strong(expect, limiter::kZeroRestoring)) {
          z->last_error.store(CUDA_ERROR_NOT_SUPPORTED, std::memory_order_relaxed);
          const uint32_t wake = z->wake_gen.load(std::memory_order_acquire);
          z->state.store(limiter::kZeroCheckpointed, std::memory_order_release);
          z->wake_done_gen.store(wake, std::memory_order_release);
        }
        continue;
      }
      int e = RestoreProcess(*region, slot, *driver_);
      if (e != CUDA_SUCCESS) std::fprintf(stderr, "tfusion: restoring a checkpointed process failed (CUDA error %d)\n", e);
    }
  }
  return attempted;
}

}  // namespace tf::hypervisor
