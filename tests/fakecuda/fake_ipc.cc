// Fake driver IPC: memory and event handles that another process opens (cuIpcGetMemHandle,
// cuIpcOpenMemHandle_v2, cuIpcCloseMemHandle, cuIpcGetEventHandle, cuIpcOpenEventHandle).
//
// Fake device memory is a private anonymous mapping, so another process cannot see it. The first
// cuIpcGetMemHandle of an allocation moves it into a memfd mapped at the same address (its
// contents copied), and the handle names that memfd by the exporter's pid and descriptor number;
// the opener maps /proc/PID/fd/FD, after checking that the descriptor still is the memfd the
// handle was made for (its name carries a serial number). An interprocess event keeps its record
// counters in a page of a memfd from its creation on, named the same way. So both work between
// processes of one user on one host, which is what IPC between sessions of one worker needs, and
// nothing else (no sockets, no helper process).
//
// Memory mapped with cuMemMap (VMM memory: cuMemCreate + cuMemMap, what the limiter's movable
// ranges make of a cudaMalloc) is refused with CUDA_ERROR_INVALID_VALUE, as driver 580 refuses it
// on an H100: legacy IPC is for cuMemAlloc memory; VMM memory is shared through
// cuMemExportToShareableHandle (fake_memory.cc).
//
// Handle layout (64 bytes): 8 bytes magic ("FKCUIPCM" memory, "FKCUIPCE" event), u32 pid, i32 fd,
// u64 serial, u64 size (memory: bytes requested), u64 mapped bytes, the rest zero; native byte
// order (a handle never leaves the host).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <thread>

#include "fake_driver.h"

namespace fakecuda {
namespace {

constexpr char kMemMagic[8] = {'F', 'K', 'C', 'U', 'I', 'P', 'C', 'M'};
constexpr char kEventMagic[8] = {'F', 'K', 'C', 'U', 'I', 'P', 'C', 'E'};
constexpr size_t kPage = 4096;

std::atomic<uint64_t> g_next_serial{1};

struct HandleFields {
  uint32_t pid = 0;
  int32_t fd = -1;
  uint64_t serial = 0;
  uint64_t size = 0;
  uint64_t mapped = 0;
};

void EncodeHandle(char* out, const char (&magic)[8], const HandleFields& f) {
  memset(out, 0, CU_IPC_HANDLE_SIZE);
  memcpy(out, magic, 8);
  memcpy(out + 8, &f.pid, 4);
  memcpy(out + 12, &f.fd, 4);
  memcpy(out + 16, &f.serial, 8);
  memcpy(out + 24, &f.size, 8);
  memcpy(out + 32, &f.mapped, 8);
}

bool DecodeHandle(const char* in, const char (&magic)[8], HandleFields* f) {
  if (memcmp(in, magic, 8) != 0) return false;
  memcpy(&f->pid, in + 8, 4);
  memcpy(&f->fd, in + 12, 4);
  memcpy(&f->serial, in + 16, 8);
  memcpy(&f->size, in + 24, 8);
  memcpy(&f->mapped, in + 32, 8);
  return f->pid != 0 && f->fd >= 0;
}

std::string MemfdName(const char* kind, uint32_t pid, uint64_t serial) {
  char name[96];
  snprintf(name, sizeof(name), "fakecuda-%s-%u-%llu", kind, pid,
           static_cast<unsigned long long>(serial));
  return name;
}

// Opens the exporter's descriptor when it still is the memfd the handle names; -1 otherwise.
int OpenExported(const char* kind, const HandleFields& f) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%u/fd/%d", f.pid, f.fd);
  char target[256];
  ssize_t n = readlink(path, target, sizeof(target) - 1);
  if (n <= 0) return -1;
  target[n] = '\0';
  const std::string want = "/memfd:" + MemfdName(kind, f.pid, f.serial) + " (deleted)";
  if (want != target) return -1;
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < f.mapped) {
    close(fd);
    return -1;
  }
  return fd;
}

bool AllZero(const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

// REQUIRES d.mu. Moves allocation `a` into a memfd mapped at the same address (the pages that hold
// anything but zeros are copied first). No stream may be writing to it meanwhile.
CUresult MakeShareable(Allocation* a) {
  const uint64_t serial = g_next_serial.fetch_add(1);
  const size_t length = RoundUp(a->mapped == 0 ? 1 : a->mapped, kPage);
  int fd = memfd_create(MemfdName("ipc", static_cast<uint32_t>(getpid()), serial).c_str(),
                        MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (ftruncate(fd, static_cast<off_t>(length)) != 0) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const auto* base = reinterpret_cast<const unsigned char*>(a->base);
  constexpr size_t kChunk = 64 * 1024;
  for (size_t off = 0; off < length; off += kChunk) {
    size_t n = std::min(kChunk, length - off);
    if (AllZero(base + off, n)) continue;  // the file reads zeros there already
    if (pwrite(fd, base + off, n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) {
      close(fd);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  void* p = mmap(reinterpret_cast<void*>(a->base), length, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return CUDA_ERROR_MAP_FAILED;
  }
  a->ipc_fd = fd;
  a->ipc_serial = serial;
  return CUDA_SUCCESS;
}

}  // namespace

Event::~Event() {
  if (shared != nullptr) munmap(shared, kPage);
  if (shared_fd >= 0) close(shared_fd);
}

uint64_t Event::BeginRecord() {
  if (shared != nullptr) return shared->recorded.fetch_add(1) + 1;
  std::lock_guard<std::mutex> lock(mu);
  return ++recorded;
}

void Event::Complete(uint64_t generation) {
  if (shared != nullptr) {
    uint64_t c = shared->completed.load();
    while (c < generation && !shared->completed.compare_exchange_weak(c, generation)) {
    }
    return;
  }
  std::lock_guard<std::mutex> lock(mu);
  when = std::chrono::steady_clock::now();
  completed = std::max(completed, generation);
  cv.notify_all();
}

uint64_t Event::Recorded() {
  if (shared != nullptr) return shared->recorded.load();
  std::lock_guard<std::mutex> lock(mu);
  return recorded;
}

bool Event::Reached(uint64_t generation) {
  if (shared != nullptr) return shared->completed.load() >= generation;
  std::lock_guard<std::mutex> lock(mu);
  return completed >= generation;
}

void Event::WaitFor(uint64_t generation) {
  if (shared != nullptr) {
    // Another process completes it: nothing to be notified by, so poll (a fake's luxury).
    while (shared->completed.load() < generation) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return;
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return completed >= generation; });
}

CUresult MakeEventShareable(Event* event) {
  const uint64_t serial = g_next_serial.fetch_add(1);
  const auto pid = static_cast<uint32_t>(getpid());
  int fd = memfd_create(MemfdName("ipcevt", pid, serial).c_str(), MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  void* p = MAP_FAILED;
  if (ftruncate(fd, kPage) == 0) p = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  event->shared = new (p) IpcEventWords();
  event->shared_fd = fd;
  HandleFields f;
  f.pid = pid;
  f.fd = fd;
  f.serial = serial;
  f.mapped = kPage;
  EncodeHandle(reinterpret_cast<char*>(event->ipc_handle), kEventMagic, f);
  return CUDA_SUCCESS;
}

}  // namespace fakecuda

using fakecuda::Allocation;
using fakecuda::Driver;
using fakecuda::MemoryKind;

CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  FAKECUDA_ENTER();
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  Driver& d = Driver::Get();
  bool exported = false;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    Allocation* a = d.FindAllocation(dptr);
    if (a == nullptr || a->kind != MemoryKind::kDevice || a->pool != nullptr) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    exported = a->ipc_fd >= 0;
  }
  // Moving the pages must not race with work that writes them.
  if (!exported) fakecuda::SynchronizeContextStreams(ctx, /*blocking_only=*/false);
  std::lock_guard<std::mutex> lock(d.mu);
  Allocation* a = d.FindAllocation(dptr);
  if (a == nullptr || a->kind != MemoryKind::kDevice || a->pool != nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (a->ipc_fd < 0) {
    if (CUresult r = fakecuda::MakeShareable(a); r != CUDA_SUCCESS) return r;
  }
  fakecuda::HandleFields f;
  f.pid = static_cast<uint32_t>(getpid());
  f.fd = a->ipc_fd;
  f.serial = a->ipc_serial;
  f.size = a->size;
  f.mapped = fakecuda::RoundUp(a->mapped == 0 ? 1 : a->mapped, fakecuda::kPage);
  fakecuda::EncodeHandle(handle->reserved, fakecuda::kMemMagic, f);
  return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int flags) {
  FAKECUDA_ENTER();
  if (pdptr == nullptr || (flags & ~static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  fakecuda::HandleFields f;
  if (!fakecuda::DecodeHandle(handle.reserved, fakecuda::kMemMagic, &f) || f.size == 0 ||
      f.size > f.mapped) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  // The exporting process maps its own memory; it cannot open its handle (as on the driver).
  if (f.pid == static_cast<uint32_t>(getpid())) return CUDA_ERROR_INVALID_CONTEXT;
  Driver& d = Driver::Get();
  const uint64_t key_serial = f.serial;
  const std::pair<uint32_t, uint64_t> key{f.pid, key_serial};
  {
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.ipc_opened.find(key);
    if (it != d.ipc_opened.end()) {
      ++d.allocations[it->second].ipc_opens;
      *pdptr = it->second;
      return CUDA_SUCCESS;
    }
  }
  int fd = fakecuda::OpenExported("ipc", f);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;
  void* p = mmap(nullptr, f.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return CUDA_ERROR_MAP_FAILED;
  std::lock_guard<std::mutex> lock(d.mu);
  if (auto it = d.ipc_opened.find(key); it != d.ipc_opened.end()) {  // another thread was first
    munmap(p, f.mapped);
    ++d.allocations[it->second].ipc_opens;
    *pdptr = it->second;
    return CUDA_SUCCESS;
  }
  Allocation a;
  a.base = reinterpret_cast<uintptr_t>(p);
  a.size = f.size;
  a.mapped = f.mapped;
  a.kind = MemoryKind::kIpcOpened;
  a.device = ctx->device;
  a.ctx = ctx;
  a.ipc_serial = key_serial;
  a.ipc_pid = f.pid;
  a.ipc_opens = 1;
  d.allocations[a.base] = a;
  d.ipc_opened[key] = a.base;
  *pdptr = a.base;
  return CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  FAKECUDA_ENTER();
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  void* unmap = nullptr;
  size_t length = 0;
  {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.allocations.find(dptr);
    if (it == d.allocations.end() || it->second.kind != MemoryKind::kIpcOpened) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (--it->second.ipc_opens > 0) return CUDA_SUCCESS;
    unmap = reinterpret_cast<void*>(it->first);
    length = it->second.mapped;
    d.ipc_opened.erase({it->second.ipc_pid, it->second.ipc_serial});
    d.allocations.erase(it);
  }
  // Work queued before the close may still use the mapping.
  fakecuda::SynchronizeContextStreams(ctx, /*blocking_only=*/false);
  munmap(unmap, length);
  return CUDA_SUCCESS;
}

CUresult cuIpcGetEventHandle(CUipcEventHandle* handle, CUevent event) {
  FAKECUDA_ENTER();
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.events.find(reinterpret_cast<fakecuda::Event*>(event));
  if (it == d.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (it->second->shared == nullptr) return CUDA_ERROR_INVALID_VALUE;  // not CU_EVENT_INTERPROCESS
  memcpy(handle->reserved, it->second->ipc_handle, CU_IPC_HANDLE_SIZE);
  return CUDA_SUCCESS;
}

CUresult cuIpcOpenEventHandle(CUevent* event, CUipcEventHandle handle) {
  FAKECUDA_ENTER();
  if (event == nullptr) return CUDA_ERROR_INVALID_VALUE;
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  (void)ctx;
  fakecuda::HandleFields f;
  if (!fakecuda::DecodeHandle(handle.reserved, fakecuda::kEventMagic, &f) ||
      f.mapped != fakecuda::kPage) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (f.pid == static_cast<uint32_t>(getpid())) return CUDA_ERROR_INVALID_CONTEXT;
  int fd = fakecuda::OpenExported("ipcevt", f);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;
  void* p = mmap(nullptr, fakecuda::kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return CUDA_ERROR_MAP_FAILED;
  auto ev = std::make_shared<fakecuda::Event>();
  ev->flags = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
  ev->shared = static_cast<fakecuda::IpcEventWords*>(p);
  memcpy(ev->ipc_handle, handle.reserved, CU_IPC_HANDLE_SIZE);
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  *event = reinterpret_cast<CUevent>(ev.get());
  d.events[ev.get()] = std::move(ev);
  return CUDA_SUCCESS;
}
