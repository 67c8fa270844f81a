// Initialisation of the limiter inside a tenant process: find and load the real driver, snapshot
// the environment once, and bind the process to its vGPU.
#include "driver/guest_log.h"
#include "limiter/runtime.h"

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "limiter/compute_gate.h"
#include "limiter/compute_governor.h"
#include "limiter/export_support.h"
#include "limiter/guest_log.h"
#include "limiter/movable_ipc.h"
#include "limiter/tier_pools.h"
#include "limiter/tiering.h"

extern "C" {
void* tf_opaque_slots[tf::driver::kFunctionCount] = {};
}

// Lets `tfusion run` and tests tell this library from the real driver.
extern "C" TF_EXPORT const char* tfusion_limiter_version() { return "tensorfusion-limiter 0.1"; }

namespace tf::limiter {

std::atomic<bool> g_ready{false};
driver::DriverTable g_real;
bool g_trace = false;
bool g_launch_governed = false;

namespace {

pthread_once_t g_once = PTHREAD_ONCE_INIT;
pthread_mutex_t g_bind_mu = PTHREAD_MUTEX_INITIALIZER;
// Never destroyed: threads of the tenant (and our governor) may still use it while the process
// runs its exit-time destructors, and unmapping the region under them would crash the tenant.
Binding& g_binding = *new Binding();
std::atomic<bool> g_missing_logged[driver::kFunctionCount];

extern "C" CUresult tf_opaque_not_initialized() { return CUDA_ERROR_NOT_INITIALIZED; }

// Well-known driver locations, tried when TFUSION_REAL_LIBCUDA is not set.
const char* const kDriverCandidates[] = {
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",   "/usr/lib/wsl/lib/libcuda.so.1",
    "/lib/x86_64-linux-gnu/libcuda.so.1",     "/usr/lib/libcuda.so.1",
    "/lib/libcuda.so.1",
};

bool IsOurself(void* h) { return dlsym(h, "tfusion_limiter_version") != nullptr; }

void* OpenRealDriver() {
  const char* env = getenv("TFUSION_REAL_LIBCUDA");
  if (env && *env) {
    void* h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    if (h && !IsOurself(h)) return h;
    GuestLog("cannot load the driver named by TFUSION_REAL_LIBCUDA=%s: %s", env,
             h ? "it is the limiter itself" : dlerror());
    return nullptr;
  }
  for (const char* p : kDriverCandidates) {
    if (access(p, R_OK) != 0) continue;
    void* h = dlopen(p, RTLD_NOW | RTLD_LOCAL);
    if (h && !IsOurself(h)) return h;
  }
  GuestLog("no NVIDIA driver found (set TFUSION_REAL_LIBCUDA to the real libcuda.so.1)");
  return nullptr;
}

void InitOnce() {
  const char* trace = getenv("TFUSION_TRACE");
  g_trace = trace && *trace && strcmp(trace, "0") != 0;
  if (void* h = OpenRealDriver()) {
    g_real.Load(h);
    for (int i = 0; i < driver::kFunctionCount; ++i) {
      if (g_real.by_id[i]) tf_opaque_slots[i] = g_real.by_id[i];
    }
  }
  const char* region = getenv("TFUSION_REGION");
  const char* vgpu = getenv("TFUSION_VGPU");
  const bool has_region = region && *region, has_vgpu = vgpu && *vgpu;
  if (has_region != has_vgpu) {
    // Half a binding: an environment cut short (a launcher or wrapper that passed one variable
    // on). Unlimited would be the wrong guess: its CUDA calls fail, and the log says why.
    g_binding.configured = true;
    g_binding.failed = true;
    GuestLog("%s is set but %s is not: no vGPU to bind to, so CUDA calls fail (pass both on, as "
             "`tfusion run` sets them)", has_region ? "TFUSION_REGION" : "TFUSION_VGPU",
             has_region ? "TFUSION_VGPU" : "TFUSION_REGION");
  } else if (!has_region) {
    GuestLog("loaded with no vGPU named (TFUSION_REGION and TFUSION_VGPU are unset): this process has "
             "the whole GPU, unlimited");
  }
  if (has_region && has_vgpu) {
    g_binding.configured = true;
    RegionErrorDetail why;
    RegionError e = GpuRegion::Attach(region, &g_binding.region, &why);
    if (e == RegionError::kOk) e = g_binding.region.FindVgpu(vgpu, &g_binding.vgpu);
    if (e != RegionError::kOk) {
      g_binding.failed = true;
      GuestLog("cannot attach vGPU '%s' in %s: %s %s", vgpu, region, RegionErrorName(e), why.message);
    } else {
      snprintf(g_binding.vgpu_id, sizeof(g_binding.vgpu_id), "%s", vgpu);
    }
  }
  // Shared (concurrent) compute mode unless the operator asks for the exclusive time-slice lease.
  const char* mode = getenv("TFUSION_COMPUTE_MODE");
  const bool exclusive = mode != nullptr && strcmp(mode, "exclusive") == 0;
  if (mode != nullptr && *mode && !exclusive && strcmp(mode, "shared") != 0) {
    GuestLog("TFUSION_COMPUTE_MODE=%s is neither 'shared' nor 'exclusive': using shared", mode);
  }
  Binding* bound = g_binding.configured && !g_binding.failed ? &g_binding : nullptr;
  ComputeGate::Instance().Configure(exclusive ? bound : nullptr);
  ComputeGovernor::Instance().Configure(bound, exclusive);
  Tiering::Instance().Configure(bound);
  g_launch_governed =
      ComputeGate::Instance().throttled() || ComputeGovernor::Instance().governed() || g_tiering;
  g_ready.store(true, std::memory_order_release);
}

void AtForkChild() {
  // The child has a new pid and none of the parent's threads: it gets its own process slot on
  // first use and a fresh compute gate. The parent's slot stays the parent's.
  pthread_mutex_init(&g_bind_mu, nullptr);
  g_binding.slot_pid = 0;
  ComputeGate::Instance().ResetAfterFork();
  ComputeGovernor::Instance().ResetAfterFork();
  Tiering::Instance().ResetAfterFork();
  StreamOrderedPools::Instance().ResetAfterFork();
  IpcExports::Instance().ResetAfterFork();
  IpcImports::Instance().ResetAfterFork();
}

// Load-time set-up that touches neither CUDA nor the environment: the opaque forwarders answer
// "not initialised" until the real driver is loaded, and forked children are re-armed.
struct LoadTimeSetup {
  LoadTimeSetup() {
    for (auto& slot : tf_opaque_slots) slot = reinterpret_cast<void*>(&tf_opaque_not_initialized);
    pthread_atfork(nullptr, nullptr, &AtForkChild);
  }
} g_load_time_setup;

// At normal exit the process stops its governor and gives its VRAM and its lease back at once
// (a crash is covered by reaping dead processes). Registered with atexit after the real cuInit,
// so it runs before the driver's own exit-time teardown.
void DetachAtExit() {
  if (!g_ready.load(std::memory_order_acquire)) return;
  ComputeGate::Instance().Shutdown();
  ComputeGovernor::Instance().Shutdown();
  Tiering::Instance().Shutdown();
  if (g_binding.configured && !g_binding.failed && g_binding.slot_pid == static_cast<int>(getpid())) {
    g_binding.region.DetachProcess(g_binding.slot);
    g_binding.slot_pid = 0;
  }
}

__attribute__((destructor)) void DetachAtUnload() { DetachAtExit(); }

pthread_once_t g_exit_once = PTHREAD_ONCE_INIT;
void RegisterExitHandler() { atexit(&DetachAtExit); }

}  // namespace

void GuestLog(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tf::driver::GuestLogV("tfusion-limiter", fmt, ap);
  va_end(ap);
}

void EnsureInit() { pthread_once(&g_once, &InitOnce); }

Binding* RawBinding() {
  EnsureInit();
  return g_binding.configured && !g_binding.failed ? &g_binding : nullptr;
}

bool BindingFailed() {
  EnsureInit();
  return g_binding.failed;
}

Binding* Bound() {
  Binding* b = RawBinding();
  if (b == nullptr) return nullptr;
  int pid = static_cast<int>(getpid());
  if (__builtin_expect(b->slot_pid == pid, 1)) return b;
  pthread_mutex_lock(&g_bind_mu);
  if (b->slot_pid != pid) {
    uint32_t slot = 0;
    RegionError e = b->region.AttachProcess(b->vgpu, pid, &slot);
    if (e != RegionError::kOk) {
      GuestLog("cannot register process %d with vGPU '%s': %s", pid, b->vgpu_id, RegionErrorName(e));
      pthread_mutex_unlock(&g_bind_mu);
      return nullptr;
    }
    b->slot = slot;
    b->slot_pid = pid;
  }
  pthread_mutex_unlock(&g_bind_mu);
  return b;
}

CUresult Missing(driver::Fn fn) {
  int i = static_cast<int>(fn);
  if (!g_missing_logged[i].exchange(true)) {
    GuestLog("%s is not provided by the loaded driver: returning CUDA_ERROR_NOT_SUPPORTED",
             driver::FunctionName(fn));
  }
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult Deny(driver::Fn fn) {
  int i = static_cast<int>(fn);
  if (!g_missing_logged[i].exchange(true)) {
    GuestLog("%s is a legacy 32-bit entry point that would bypass the vGPU quota: refused",
             driver::FunctionName(fn));
  }
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult Hook_cuInit(unsigned int flags) {
  const auto& real = Real();
  if (real.cuInit == nullptr) return CUDA_ERROR_NO_DEVICE;
  if (BindingFailed()) return CUDA_ERROR_OPERATING_SYSTEM;
  CUresult r = real.cuInit(flags);
  if (r == CUDA_SUCCESS && RawBinding() != nullptr) {
    if (Bound() == nullptr) return CUDA_ERROR_OPERATING_SYSTEM;
    pthread_once(&g_exit_once, &RegisterExitHandler);
  }
  return r;
}

}  // namespace tf::limiter
