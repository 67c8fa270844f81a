#include "client/parallel_copy.h"

#include <pthread.h>
#include <emmintrin.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace tf::client {
namespace {

constexpr int kMaxHelpers = 3;

struct CopySettings {
  int threads = 0;        // copying threads in all, the caller included; 0: from the CPU count
  bool streaming = true;  // StreamCopy for the parts of large copies
};

const CopySettings& Settings() {
  static CopySettings settings = [] {
    CopySettings c;
    // TFUSION_COPY_THREADS=N (1..4) copies on N threads in all; 1 turns the helpers off.
    if (const char* v = getenv("TFUSION_COPY_THREADS");
        v != nullptr && v[0] >= '1' && v[0] <= '4' && v[1] == '\0') {
      c.threads = v[0] - '0';
    }
    if (const char* v = getenv("TFUSION_COPY_NT"); v != nullptr && v[0] == '0' && v[1] == '\0') {
      c.streaming = false;
    }
    return c;
  }();
  return settings;
}

struct Part {
  uint8_t* dst = nullptr;
  const uint8_t* src = nullptr;
  size_t n = 0;
};

struct Pool {
  pthread_mutex_t use = PTHREAD_MUTEX_INITIALIZER;  // one caller at a time drives the helpers
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t work = PTHREAD_COND_INITIALIZER;
  pthread_cond_t done = PTHREAD_COND_INITIALIZER;
  Part parts[kMaxHelpers];
  uint64_t generation = 0;  // bumped per copy; helper i works when its part is non-empty
  int pending = 0;          // helpers still copying for this generation
  int helpers = -1;         // -1: not started yet
  ParallelCopyStats stats;  // under use
};

Pool& P() {
  static auto* p = new Pool();  // never destroyed: helpers may outlive static destructors
  return *p;
}

void CopyPart(void* dst, const void* src, size_t n) {
  if (Settings().streaming) StreamCopy(dst, src, n);
  else memcpy(dst, src, n);
}

void* HelperMain(void* arg) {
  const int id = static_cast<int>(reinterpret_cast<intptr_t>(arg));
  Pool& p = P();
  uint64_t seen = 0;
  pthread_mutex_lock(&p.mu);
  for (;;) {
    while (p.generation == seen) pthread_cond_wait(&p.work, &p.mu);
    seen = p.generation;
    Part part = p.parts[id];
    if (part.n == 0) continue;
    pthread_mutex_unlock(&p.mu);
    CopyPart(part.dst, part.src, part.n);
    pthread_mutex_lock(&p.mu);
    if (--p.pending == 0) pthread_cond_signal(&p.done);
  }
  return nullptr;
}

// A detached helper thread with `stack` bytes of stack (0: the default size); pthread_create's
// result.
int SpawnHelper(void* id, size_t stack) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (stack) pthread_attr_setstacksize(&attr, stack);
  pthread_t t;
  const int rc = pthread_create(&t, &attr, &HelperMain, id);
  pthread_attr_destroy(&attr);
  return rc;
}

// Called with p.use held.
int StartHelpers(Pool& p) {
  if (p.helpers >= 0) return p.helpers;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int want = static_cast<int>(std::clamp<long>(cpus / 2, 0, kMaxHelpers));
  if (Settings().threads > 0) want = Settings().threads - 1;
  int started = 0;
  for (int i = 0; i < want; ++i) {
    // Helpers must not take signals meant for the application's threads.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    void* id = reinterpret_cast<void*>(static_cast<intptr_t>(i));
    // The stack also holds the static TLS of every library in the program (glibc puts it there),
    // which can be large in a framework's process; the stack is only reserved, not touched. If
    // the program's static TLS outgrew even that, the default stack size.
    int rc = SpawnHelper(id, 2u << 20);
    if (rc == EINVAL) rc = SpawnHelper(id, 0);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (rc != 0) {
      p.stats.start_error = rc;
      break;
    }
    ++started;
  }
  p.helpers = started;
  p.stats.helpers = started;
  return started;
}

struct ForkReset {
  ForkReset() {
    pthread_atfork(nullptr, nullptr, [] {
      Pool& p = P();
      pthread_mutex_init(&p.use, nullptr);
      pthread_mutex_init(&p.mu, nullptr);
      pthread_cond_init(&p.work, nullptr);
      pthread_cond_init(&p.done, nullptr);
      p.pending = 0;
      p.helpers = -1;  // the child has none of the parent's threads
    });
  }
} g_fork_reset;

}  // namespace

void StreamCopy(void* dst, const void* src, size_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  auto* s = static_cast<const uint8_t*>(src);
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
  if (n < head + 256) {
    memcpy(d, s, n);
    return;
  }
  memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  const size_t body = n & ~size_t{63};
  for (size_t i = 0; i < body; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  _mm_sfence();  // the streamed lines are visible before whoever waits on this copy reads them
  memcpy(d + body, s + body, n - body);
}

void ParallelCopy(void* dst, const void* src, size_t n) {
  if (n < kParallelCopyMin) {
    memcpy(dst, src, n);
    return;
  }
  Pool& p = P();
  if (pthread_mutex_trylock(&p.use) != 0) {  // another thread drives the helpers: copy alone
    CopyPart(dst, src, n);
    return;
  }
  const int helpers = StartHelpers(p);
  if (helpers == 0) {
    pthread_mutex_unlock(&p.use);
    CopyPart(dst, src, n);
    return;
  }
  // Parts of whole cache lines; the caller takes the first, the helpers the rest.
  const int ways = helpers + 1;
  const size_t chunk = ((n / ways) + 63) & ~size_t{63};
  auto* d = static_cast<uint8_t*>(dst);
  auto* s = static_cast<const uint8_t*>(src);
  const size_t mine = std::min(chunk, n);
  pthread_mutex_lock(&p.mu);
  int pending = 0;
  for (int i = 0; i < kMaxHelpers; ++i) {
    const size_t off = mine + static_cast<size_t>(i) * chunk;
    Part part;
    if (i < helpers && off < n) part = {d + off, s + off, std::min(chunk, n - off)};
    p.parts[i] = part;
    if (part.n) ++pending;
  }
  p.pending = pending;
  ++p.generation;
  pthread_cond_broadcast(&p.work);
  pthread_mutex_unlock(&p.mu);
  timespec t0, t1, t2;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  CopyPart(d, s, mine);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  pthread_mutex_lock(&p.mu);
  while (p.pending > 0) pthread_cond_wait(&p.done, &p.mu);
  pthread_mutex_unlock(&p.mu);
  clock_gettime(CLOCK_MONOTONIC, &t2);
  auto ns = [](const timespec& a, const timespec& b) {
    return static_cast<uint64_t>((b.tv_sec - a.tv_sec) * 1000000000ll + (b.tv_nsec - a.tv_nsec));
  };
  ++p.stats.calls;
  p.stats.own_ns += ns(t0, t1);
  p.stats.wait_ns += ns(t1, t2);
  pthread_mutex_unlock(&p.use);
}

ParallelCopyStats GetParallelCopyStats() {
  Pool& p = P();
  pthread_mutex_lock(&p.use);
  ParallelCopyStats s = p.stats;
  pthread_mutex_unlock(&p.use);
  return s;
}

}  // namespace tf::client
