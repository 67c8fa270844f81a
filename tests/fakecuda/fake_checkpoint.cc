// The driver's process checkpoint (cuCheckpointProcess*) across processes, on host memory.
//
// Every process that initialises the fake owns one slot of a shared table (a POSIX shared-memory
// object "<FAKECUDA_SHM_NAME or fakecuda-<uid>>-ckpt") and runs one restore thread, as the real
// driver does: another process locks it (its API calls then block at entry, and each one that
// arrives is counted, so tests can prove that nothing called the driver meanwhile), asks the
// restore thread to checkpoint it (queued work completes, the contents of its device memory are
// copied aside and the memory released: its pages are dropped and NVML stops counting them),
// to restore it (the contents come back at the same addresses) and unlocks it.
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fake_driver.h"

namespace fakecuda {
namespace {

constexpr uint32_t kTableMagic = 0xfa4ec4e7;
constexpr int kCkptSlots = 256;
enum Request : uint32_t { kNoRequest = 0, kDoCheckpoint = 1, kDoRestore = 2 };

struct CkptSlot {
  int32_t pid;                  // 0: free
  uint32_t state;               // CUprocessState; the futex word blocked callers sleep on
  uint32_t request;             // Request
  uint32_t request_seq;         // bumped by the requester; the futex word of the restore thread
  uint32_t done_seq;            // the restore thread: the request it finished; requesters sleep on it
  int32_t result;               // CUresult of that request
  int32_t restore_tid;          // the restore thread's id
  uint32_t calls_while_locked;  // entry points called while not running
  uint64_t saved_bytes;         // device memory held aside by the last checkpoint
};
struct CkptTable {
  uint32_t magic;
  uint32_t pad;
  CkptSlot slots[kCkptSlots];
};

long Futex(uint32_t* word, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, word, op, value, timeout, nullptr, 0);
}
void WakeAll(uint32_t* word) { Futex(word, FUTEX_WAKE, INT32_MAX, nullptr); }

CkptTable* Table() {
  static CkptTable* table = [] () -> CkptTable* {
    const char* prefix = std::getenv("FAKECUDA_SHM_NAME");
    char name[256];
    if (prefix != nullptr && *prefix != '\0') {
      std::snprintf(name, sizeof(name), "/%s-ckpt", prefix);
    } else {
      std::snprintf(name, sizeof(name), "/fakecuda-%u-ckpt", static_cast<unsigned>(getuid()));
    }
    int fd = shm_open(name, O_RDWR | O_CREAT, 0600);
    if (fd < 0) return nullptr;
    if (ftruncate(fd, sizeof(CkptTable)) != 0) {
      close(fd);
      return nullptr;
    }
    void* mem = mmap(nullptr, sizeof(CkptTable), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (mem == MAP_FAILED) return nullptr;
    auto* t = static_cast<CkptTable*>(mem);
    uint32_t expected = 0;
    __atomic_compare_exchange_n(&t->magic, &expected, kTableMagic, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return __atomic_load_n(&t->magic, __ATOMIC_SEQ_CST) == kTableMagic ? t : nullptr;
  }();
  return table;
}

bool Alive(int32_t pid) { return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH); }

CkptSlot* FindSlot(int pid) {
  CkptTable* t = Table();
  if (t == nullptr || pid <= 0) return nullptr;
  for (CkptSlot& s : t->slots) {
    if (__atomic_load_n(&s.pid, __ATOMIC_SEQ_CST) == pid) return Alive(pid) ? &s : nullptr;
  }
  return nullptr;
}

CkptSlot* g_own = nullptr;         // this process's slot (set once at cuInit)
pid_t g_own_pid = 0;
thread_local bool t_restore_thread = false;

// Device memory held aside while checkpointed (restore thread only).
struct Saved {
  void* at = nullptr;   // linear or array memory
  int fd = -1;          // VMM physical memory
  std::vector<unsigned char> bytes;
};
std::vector<Saved> g_saved;
std::vector<std::pair<int, uint64_t>> g_uncharged;  // device, bytes NVML stopped counting

CUresult DoCheckpoint() {
  Driver& d = Driver::Get();
  std::vector<Context*> contexts;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    contexts.assign(d.contexts.begin(), d.contexts.end());
  }
  for (Context* c : contexts) SynchronizeContextStreams(c, false);  // queued work completes first
  std::lock_guard<std::mutex> lock(d.mu);
  uint64_t total = 0;
  for (auto& [base, a] : d.allocations) {
    if ((a.kind != MemoryKind::kDevice && a.kind != MemoryKind::kManaged) || a.mapped == 0) continue;
    Saved s;
    s.at = reinterpret_cast<void*>(base);
    s.bytes.assign(static_cast<unsigned char*>(s.at), static_cast<unsigned char*>(s.at) + a.size);
    madvise(s.at, a.mapped, MADV_DONTNEED);  // released: the pages go, the range reads zeros
    total += a.size;
    g_saved.push_back(std::move(s));
  }
  for (auto& [key, p] : d.physical) {
    if (p->released || p->fd < 0) continue;
    Saved s;
    s.fd = p->fd;
    s.bytes.resize(p->size);
    if (pread(p->fd, s.bytes.data(), p->size, 0) != static_cast<ssize_t>(p->size)) return CUDA_ERROR_OPERATING_SYSTEM;
    fallocate(p->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(p->size));
    total += p->size;
    g_saved.push_back(std::move(s));
  }
  for (auto& [key, arr] : d.arrays) {
    if (arr->bytes == 0 || arr->mem == nullptr) continue;
    Saved s;
    s.at = arr->mem;
    s.bytes.assign(static_cast<unsigned char*>(arr->mem), static_cast<unsigned char*>(arr->mem) + arr->bytes);
    std::memset(arr->mem, 0, arr->bytes);
    total += arr->bytes;
    g_saved.push_back(std::move(s));
  }
  for (size_t i = 0; i < d.devices.size(); ++i) {
    int physical = d.ordinal_to_physical[i];
    g_uncharged.emplace_back(physical, d.devices[i].used_bytes);
    UsageBoard::Add(physical, -static_cast<int64_t>(d.devices[i].used_bytes));
  }
  __atomic_store_n(&g_own->saved_bytes, total, __ATOMIC_SEQ_CST);
  return CUDA_SUCCESS;
}

CUresult DoRestore() {
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  for (Saved& s : g_saved) {
    if (s.fd >= 0) {
      if (pwrite(s.fd, s.bytes.data(), s.bytes.size(), 0) != static_cast<ssize_t>(s.bytes.size())) {
        return CUDA_ERROR_OPERATING_SYSTEM;
      }
    } else {
      std::memcpy(s.at, s.bytes.data(), s.bytes.size());
    }
  }
  g_saved.clear();
  for (auto [device, bytes] : g_uncharged) UsageBoard::Add(device, static_cast<int64_t>(bytes));
  g_uncharged.clear();
  return CUDA_SUCCESS;
}

void* RestoreThread(void*) {
  t_restore_thread = true;
  __atomic_store_n(&g_own->restore_tid, static_cast<int32_t>(syscall(SYS_gettid)), __ATOMIC_SEQ_CST);
  uint32_t handled = __atomic_load_n(&g_own->request_seq, __ATOMIC_SEQ_CST);
  for (;;) {
    uint32_t seq = __atomic_load_n(&g_own->request_seq, __ATOMIC_SEQ_CST);
    if (seq == handled) {
      Futex(&g_own->request_seq, FUTEX_WAIT, seq, nullptr);
      continue;
    }
    handled = seq;
    uint32_t op = __atomic_load_n(&g_own->request, __ATOMIC_SEQ_CST);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (op == kDoCheckpoint) {
      r = DoCheckpoint();
      if (r == CUDA_SUCCESS) __atomic_store_n(&g_own->state, CU_PROCESS_STATE_CHECKPOINTED, __ATOMIC_SEQ_CST);
    } else if (op == kDoRestore) {
      r = DoRestore();
      if (r == CUDA_SUCCESS) __atomic_store_n(&g_own->state, CU_PROCESS_STATE_LOCKED, __ATOMIC_SEQ_CST);
    }
    __atomic_store_n(&g_own->result, static_cast<int32_t>(r), __ATOMIC_SEQ_CST);
    __atomic_store_n(&g_own->done_seq, seq, __ATOMIC_SEQ_CST);
    WakeAll(&g_own->done_seq);
  }
  return nullptr;
}

// From another process: has the target's restore thread carry out `op`, waiting at most 60 s.
CUresult Ask(CkptSlot* s, Request op) {
  uint32_t seq = __atomic_load_n(&s->request_seq, __ATOMIC_SEQ_CST) + 1;
  __atomic_store_n(&s->request, op, __ATOMIC_SEQ_CST);
  __atomic_store_n(&s->request_seq, seq, __ATOMIC_SEQ_CST);
  WakeAll(&s->request_seq);
  for (int i = 0; i < 600; ++i) {
    uint32_t done = __atomic_load_n(&s->done_seq, __ATOMIC_SEQ_CST);
    if (done == seq) return static_cast<CUresult>(__atomic_load_n(&s->result, __ATOMIC_SEQ_CST));
    timespec tick{0, 100'000'000};
    Futex(&s->done_seq, FUTEX_WAIT, done, &tick);
  }
  return CUDA_ERROR_TIMEOUT;
}

// The target of a checkpoint call: another live process that initialised the fake.
CUresult Target(int pid, CkptSlot** out) {
  if (pid == getpid()) return CUDA_ERROR_NOT_SUPPORTED;  // the driver acts on other processes only
  *out = FindSlot(pid);
  return *out != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

bool Transition(CkptSlot* s, uint32_t from, uint32_t to) {
  return __atomic_compare_exchange_n(&s->state, &from, to, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

}  // namespace

void CheckpointRegister() {
  CkptTable* t = Table();
  if (t == nullptr || g_own != nullptr) return;
  int32_t me = getpid();
  // A slot that names this pid already was left by a process that had it before (pids are
  // reused, and the table outlives its processes): nobody answers there, and FindSlot would find
  // it first, so that a checkpoint of this process would wait for an answer that never comes.
  for (CkptSlot& s : t->slots) {
    int32_t stale = me;
    __atomic_compare_exchange_n(&s.pid, &stale, 0, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  }
  for (CkptSlot& s : t->slots) {
    int32_t holder = __atomic_load_n(&s.pid, __ATOMIC_SEQ_CST);
    if (holder != 0 && Alive(holder)) continue;
    if (!__atomic_compare_exchange_n(&s.pid, &holder, me, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) continue;
    __atomic_store_n(&s.state, CU_PROCESS_STATE_RUNNING, __ATOMIC_SEQ_CST);
    __atomic_store_n(&s.calls_while_locked, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&s.saved_bytes, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&s.done_seq, __atomic_load_n(&s.request_seq, __ATOMIC_SEQ_CST), __ATOMIC_SEQ_CST);
    g_own = &s;
    g_own_pid = me;
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_create(&thread, &attr, &RestoreThread, nullptr);
    pthread_attr_destroy(&attr);
    return;
  }
}

void CheckpointGate() {
  CkptSlot* own = g_own;
  if (own == nullptr || t_restore_thread) return;
  uint32_t state = __atomic_load_n(&own->state, __ATOMIC_SEQ_CST);
  if (__builtin_expect(state == CU_PROCESS_STATE_RUNNING, 1) || g_own_pid != getpid()) return;
  __atomic_add_fetch(&own->calls_while_locked, 1, __ATOMIC_SEQ_CST);
  while ((state = __atomic_load_n(&own->state, __ATOMIC_SEQ_CST)) != CU_PROCESS_STATE_RUNNING) {
    Futex(&own->state, FUTEX_WAIT, state, nullptr);  // as the driver: blocked until unlocked
  }
}

}  // namespace fakecuda

using fakecuda::CkptSlot;

namespace fakecuda {
namespace {

// Faults of the calling process (a checkpointer or restorer the test runs as a separate program):
// FAKECUDA_CKPT_SLOW=name:ms sleeps that long inside entry point `name` (a large checkpoint);
// FAKECUDA_CKPT_DIE_AFTER=name kills the caller outright (SIGKILL) once `name` succeeded.
void SlowIn(const char* name) {
  const char* env = std::getenv("FAKECUDA_CKPT_SLOW");
  const size_t n = std::strlen(name);
  if (env == nullptr || std::strncmp(env, name, n) != 0 || env[n] != ':') return;
  usleep(static_cast<useconds_t>(std::atoi(env + n + 1)) * 1000);
}
CUresult DieAfter(const char* name, CUresult result) {
  const char* env = std::getenv("FAKECUDA_CKPT_DIE_AFTER");
  if (result == CUDA_SUCCESS && env != nullptr && std::strcmp(env, name) == 0) raise(SIGKILL);
  return result;
}

}  // namespace
}  // namespace fakecuda

CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs* args) {
  FAKECUDA_ENTER();
  (void)args;  // the timeout: calls already inside the fake are not waited for
  CkptSlot* s = nullptr;
  if (CUresult e = fakecuda::Target(pid, &s); e != CUDA_SUCCESS) return e;
  return fakecuda::DieAfter("cuCheckpointProcessLock",
                            fakecuda::Transition(s, CU_PROCESS_STATE_RUNNING, CU_PROCESS_STATE_LOCKED)
                                ? CUDA_SUCCESS
                                : CUDA_ERROR_ILLEGAL_STATE);
}

CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs* args) {
  FAKECUDA_ENTER();
  (void)args;
  CkptSlot* s = nullptr;
  if (CUresult e = fakecuda::Target(pid, &s); e != CUDA_SUCCESS) return e;
  if (__atomic_load_n(&s->state, __ATOMIC_SEQ_CST) != CU_PROCESS_STATE_LOCKED) return CUDA_ERROR_ILLEGAL_STATE;
  fakecuda::SlowIn("cuCheckpointProcessCheckpoint");
  return fakecuda::DieAfter("cuCheckpointProcessCheckpoint", fakecuda::Ask(s, fakecuda::kDoCheckpoint));
}

CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs* args) {
  FAKECUDA_ENTER();
  (void)args;
  CkptSlot* s = nullptr;
  if (CUresult e = fakecuda::Target(pid, &s); e != CUDA_SUCCESS) return e;
  if (__atomic_load_n(&s->state, __ATOMIC_SEQ_CST) != CU_PROCESS_STATE_CHECKPOINTED) return CUDA_ERROR_ILLEGAL_STATE;
  return fakecuda::DieAfter("cuCheckpointProcessRestore", fakecuda::Ask(s, fakecuda::kDoRestore));
}

CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs* args) {
  FAKECUDA_ENTER();
  (void)args;
  CkptSlot* s = nullptr;
  if (CUresult e = fakecuda::Target(pid, &s); e != CUDA_SUCCESS) return e;
  if (!fakecuda::Transition(s, CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_RUNNING)) return CUDA_ERROR_ILLEGAL_STATE;
  fakecuda::WakeAll(&s->state);
  return CUDA_SUCCESS;
}

CUresult cuCheckpointProcessGetState(int pid, CUprocessState* state) {
  FAKECUDA_ENTER();
  if (state == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CkptSlot* s = fakecuda::FindSlot(pid);
  if (s == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *state = static_cast<CUprocessState>(__atomic_load_n(&s->state, __ATOMIC_SEQ_CST));
  return CUDA_SUCCESS;
}

CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int* tid) {
  FAKECUDA_ENTER();
  if (tid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CkptSlot* s = fakecuda::FindSlot(pid);
  if (s == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *tid = __atomic_load_n(&s->restore_tid, __ATOMIC_SEQ_CST);
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT int fakecuda_checkpoint_info(int pid, unsigned* state, unsigned* calls_while_locked,
                                             unsigned long long* saved_bytes) {
  CkptSlot* s = fakecuda::FindSlot(pid);
  if (s == nullptr) return -1;
  if (state != nullptr) *state = __atomic_load_n(&s->state, __ATOMIC_SEQ_CST);
  if (calls_while_locked != nullptr) *calls_while_locked = __atomic_load_n(&s->calls_while_locked, __ATOMIC_SEQ_CST);
  if (saved_bytes != nullptr) *saved_bytes = __atomic_load_n(&s->saved_bytes, __ATOMIC_SEQ_CST);
  return 0;
}

FAKECUDA_EXPORT int fakecuda_checkpoint_leave_stale_slot(int pid) {
  fakecuda::CkptTable* t = fakecuda::Table();
  if (t == nullptr || pid <= 0) return -1;
  for (fakecuda::CkptSlot& s : t->slots) {
    int32_t free_slot = 0;
    if (!__atomic_compare_exchange_n(&s.pid, &free_slot, pid, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) continue;
    __atomic_store_n(&s.state, CU_PROCESS_STATE_RUNNING, __ATOMIC_SEQ_CST);
    __atomic_store_n(&s.done_seq, __atomic_load_n(&s.request_seq, __ATOMIC_SEQ_CST), __ATOMIC_SEQ_CST);
    return 0;
  }
  return -1;
}
