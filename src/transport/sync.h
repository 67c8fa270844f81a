// pthread mutex and condition variable wrappers for the data plane (internal): no exceptions, no
// std::mutex (whose failure paths throw), timed waits on CLOCK_MONOTONIC.
#pragma once

#include <pthread.h>

#include <cstdint>

namespace tf::transport::internal {

// A pause for spin-wait loops (the shared-memory futex wait, the TCP receiver and flusher).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

class Mutex {
 public:
  Mutex() { pthread_mutex_init(&mu_, nullptr); }
  ~Mutex() { pthread_mutex_destroy(&mu_); }
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;
  void Lock() { pthread_mutex_lock(&mu_); }
  void Unlock() { pthread_mutex_unlock(&mu_); }
  pthread_mutex_t* native() { return &mu_; }

 private:
  pthread_mutex_t mu_;
};

class MutexLock {
 public:
  explicit MutexLock(Mutex* mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* mu_;
};

class CondVar {
 public:
  CondVar();
  ~CondVar() { pthread_cond_destroy(&cv_); }
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;
  void Signal() { pthread_cond_signal(&cv_); }
  void Broadcast() { pthread_cond_broadcast(&cv_); }
  void Wait(Mutex* mu) { pthread_cond_wait(&cv_, mu->native()); }
  // REQUIRES: mu held. Returns false once deadline_ns (CLOCK_MONOTONIC) has passed.
  bool WaitUntil(Mutex* mu, int64_t deadline_ns);

 private:
  pthread_cond_t cv_;
};

}  // namespace tf::transport::internal
