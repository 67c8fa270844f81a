// What the generated export file (tf_limiter_exports.cc) needs from the hand-written limiter:
// the real driver table, the hook declarations, and the failure answers. Included only there
// and by the hook files.
#pragma once

#include <atomic>

#include "driver/driver_table.h"
#include "tf_driver_api.h"

#define TF_EXPORT __attribute__((visibility("default")))

namespace tf::limiter {

// The process-wide limiter state is initialised on the first call into any entry point.
// REQUIRES nothing; safe from any thread; the fast path is one acquire load.
void EnsureInit();
extern std::atomic<bool> g_ready;
extern driver::DriverTable g_real;
extern bool g_trace;
// Set once at initialisation: kernel submissions of this process go through a compute governor
// (shared mode), the compute gate (exclusive mode) or the VRAM tiering guard. False: the launch
// path is one branch.
extern bool g_launch_governed;

inline const driver::DriverTable& Real() {
  if (__builtin_expect(!g_ready.load(std::memory_order_acquire), 0)) EnsureInit();
  return g_real;
}
inline bool TraceEnabled() { return g_trace; }

// The answer for an entry point the loaded driver does not export: CUDA_ERROR_NOT_SUPPORTED,
// logged once per function.
CUresult Missing(driver::Fn fn);
// The answer for a legacy entry point the limiter refuses (it would escape the quota).
CUresult Deny(driver::Fn fn);
// Our own exported function for an entry point id (for cuGetProcAddress); nullptr if none.
void* OwnExport(int id);

// In a hook: `fn` is the real driver's entry point, or the hook answers as for a missing one.
#define TF_REAL_OR_MISSING(name)    \
  auto fn = Real().name;            \
  if (__builtin_expect(fn == nullptr, 0)) return Missing(driver::Fn::name);

#define TF_DECLARE_HOOK(name, params, args) CUresult Hook_##name params;
TF_LIMITER_HOOKED_FUNCTIONS(TF_DECLARE_HOOK)
#undef TF_DECLARE_HOOK

}  // namespace tf::limiter

// Slots for entry points without a prototype (graphics interop): filled from the real driver at
// initialisation, a "not initialised" answer before that.
extern "C" void* tf_opaque_slots[tf::driver::kFunctionCount] __attribute__((visibility("hidden")));

#define TF_STR2(x) #x
#define TF_STR(x) TF_STR2(x)
#define TF_OPAQUE_FORWARD(name, id)                                  \
  extern "C" TF_EXPORT void name();                                  \
  __asm__(".text\n.globl " #name "\n.type " #name ", @function\n" #name \
          ":\n  jmp *tf_opaque_slots+8*" #id "(%rip)\n.size " #name ", .-" #name "\n");
