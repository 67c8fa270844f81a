#include "transport/sync.h"

#include <time.h>

#include "transport/transport.h"

namespace tf::transport::internal {

CondVar::CondVar() {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&cv_, &a);
  pthread_condattr_destroy(&a);
}

bool CondVar::WaitUntil(Mutex* mu, int64_t deadline_ns) {
  if (MonotonicNowNs() >= deadline_ns) return false;
  timespec ts;
  ts.tv_sec = static_cast<time_t>(deadline_ns / 1000000000);
  ts.tv_nsec = static_cast<long>(deadline_ns % 1000000000);
  pthread_cond_timedwait(&cv_, mu->native(), &ts);
  return MonotonicNowNs() < deadline_ns;
}

}  // namespace tf::transport::internal
