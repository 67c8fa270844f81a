#include "limiter/core/robust_mutex.h"

#include <errno.h>
#include <time.h>

namespace tf::limiter {

bool InitRobustMutex(pthread_mutex_t* m) {
  pthread_mutexattr_t attr;
  if (pthread_mutexattr_init(&attr) != 0) return false;
  bool ok = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED) == 0 &&
            pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST) == 0 &&
            pthread_mutex_init(m, &attr) == 0;
  pthread_mutexattr_destroy(&attr);
  return ok;
}

RegionError LockRobust(pthread_mutex_t* m, RecoverFn recover, void* ctx) {
  int rc = pthread_mutex_trylock(m);  // the common, uncontended case: no clock read
  if (rc == EBUSY) {
    timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += kRobustLockTimeoutNs / 1'000'000'000LL;
    deadline.tv_nsec += kRobustLockTimeoutNs % 1'000'000'000LL;
    if (deadline.tv_nsec >= 1'000'000'000L) {
      deadline.tv_sec += 1;
      deadline.tv_nsec -= 1'000'000'000L;
    }
    do {
      rc = pthread_mutex_clocklock(m, CLOCK_MONOTONIC, &deadline);
    } while (rc == EINTR);
  }
  if (rc == 0) return RegionError::kOk;
  if (rc == EOWNERDEAD) {
    if (recover != nullptr) recover(ctx);
    pthread_mutex_consistent(m);
    return RegionError::kOk;
  }
  if (rc == ETIMEDOUT) return RegionError::kBusy;
  if (rc == ENOTRECOVERABLE) return RegionError::kUnrecoverable;
  return RegionError::kIo;
}

}  // namespace tf::limiter
