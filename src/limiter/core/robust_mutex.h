// Robust, process-shared pthread mutexes living in the shared region.
//
// A holder killed with kill -9 leaves the mutex in EOWNERDEAD state; the next locker runs a
// recovery function that rebuilds whatever the mutex guards from data that is always
// self-consistent (see the invariants in region_layout.h), then marks the mutex consistent.
#pragma once

#include <pthread.h>

#include "limiter/core/region_error.h"

namespace tf::limiter {

// Initialises *m in place as PTHREAD_PROCESS_SHARED + PTHREAD_MUTEX_ROBUST. Only the region's
// creator calls this, before the region is visible to anyone else.
bool InitRobustMutex(pthread_mutex_t* m);

// Called with the mutex held after its previous owner died; must restore the guarded invariant.
using RecoverFn = void (*)(void* ctx);

// Locks *m, waiting at most kRobustLockTimeoutNs (a stopped or wedged holder never hangs the
// tenant: kBusy instead). On EOWNERDEAD runs recover(ctx) (when non-null) and makes the mutex
// consistent. Returns kOk with the mutex held, kBusy on timeout, kUnrecoverable when the mutex is
// ENOTRECOVERABLE. Thread-safe; not async-signal-safe.
RegionError LockRobust(pthread_mutex_t* m, RecoverFn recover, void* ctx);

inline constexpr long long kRobustLockTimeoutNs = 2'000'000'000LL;

// RAII unlock for a mutex locked with LockRobust returning kOk.
class RobustGuard {
 public:
  explicit RobustGuard(pthread_mutex_t* m) : m_(m) {}
  ~RobustGuard() { pthread_mutex_unlock(m_); }
  RobustGuard(const RobustGuard&) = delete;
  RobustGuard& operator=(const RobustGuard&) = delete;

 private:
  pthread_mutex_t* m_;
};

}  // namespace tf::limiter
