#include "limiter/movable_ipc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include "limiter/export_support.h"
#include "limiter/guest_log.h"
#include "limiter/in_context.h"
#include "limiter/movable_ipc_wire.h"

namespace tf::limiter {
namespace {

using ipcwire::IpcStatus;
using ipcwire::NowMs;

// Why an open or a served request failed: said once per process, so that a program's failure has
// an explanation without a line per call.
void SayOnce(std::atomic<bool>* told, const char* what) {
  if (!told->exchange(true)) GuestLog("legacy IPC of movable memory: %s", what);
}

// ---- exporter ----

struct ExportEntry {
  uint64_t id = 0;
  size_t size = 0;
  std::vector<ipcwire::Chunk> chunks;
  std::vector<int> fds;  // one per chunk, closed when the range is freed
};

struct ExportState {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;  // everything below
  uint64_t secret = 0;                             // 0 until the first export
  int listen_fd = -1;
  uint64_t next_id = 1;
  std::map<CUdeviceptr, ExportEntry> by_base;
};

ExportState& X() {
  static ExportState* s = new ExportState();  // never destroyed: the listener may run during exit
  return *s;
}

bool RandomSecret(uint64_t* out) {
  for (int i = 0; i < 4; ++i) {
    if (getrandom(out, sizeof(*out), 0) == static_cast<ssize_t>(sizeof(*out)) && *out != 0) return true;
  }
  return false;
}

bool PeerUid(int sock, ucred* cred) {
  socklen_t len = sizeof(*cred);
  return getsockopt(sock, SOL_SOCKET, SO_PEERCRED, cred, &len) == 0 && len == sizeof(*cred);
}

// One request on an accepted connection; the reply carries descriptors only for a known export.
void Serve(int conn) {
  static std::atomic<bool> told_uid{false}, told_bad{false};
  ucred peer{};
  if (!PeerUid(conn, &peer) || peer.uid != geteuid()) {
    SayOnce(&told_uid, "a process of another user asked for an export: refused");
    return;
  }
  char in[ipcwire::kRequestBytes];
  uint32_t nfds = 0;
  ipcwire::Reply reply;
  ipcwire::Request req;
  if (!ipcwire::RecvWithFds(conn, in, sizeof(in), nullptr, 0, &nfds, kIpcTimeoutMs)) return;
  std::vector<int> dups;
  if (!ipcwire::DecodeRequest(in, &req)) {
    SayOnce(&told_bad, "a malformed request was refused");
    reply.status = IpcStatus::kBadRequest;
  } else {
    ExportState& s = X();
    pthread_mutex_lock(&s.mu);
    const ExportEntry* e = nullptr;
    if (req.secret == s.secret) {
      for (const auto& [base, entry] : s.by_base) {
        if (entry.id == req.export_id) e = &entry;
      }
    }
    if (e == nullptr) {
      reply.status = IpcStatus::kUnknownExport;
    } else {
      // Copies of the descriptors, sent outside the lock (a free may close the originals meanwhile).
      reply.status = IpcStatus::kOk;
      for (int fd : e->fds) {
        int d = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (d < 0) {
          reply.status = IpcStatus::kExportFailed;
          break;
        }
        dups.push_back(d);
      }
      if (reply.status == IpcStatus::kOk) {
        reply.count = static_cast<uint32_t>(e->chunks.size());
        reply.size = e->size;
        for (size_t i = 0; i < e->chunks.size(); ++i) reply.chunks[i] = e->chunks[i];
      }
    }
    pthread_mutex_unlock(&s.mu);
    if (reply.status != IpcStatus::kOk) {
      for (int d : dups) close(d);
      dups.clear();
    }
  }
  char out[ipcwire::kReplyBytes];
  ipcwire::EncodeReply(reply, out);
  ipcwire::SendWithFds(conn, out, sizeof(out), dups.data(), static_cast<uint32_t>(dups.size()), kIpcTimeoutMs);
  for (int d : dups) close(d);
}

void* Listener(void* arg) {
  const int listen_fd = static_cast<int>(reinterpret_cast<intptr_t>(arg));
  for (;;) {
    int conn = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      if (errno == EBADF || errno == EINVAL) return nullptr;  // closed after a fork
      timespec pause{0, 10'000'000};                           // out of descriptors: try again later
      nanosleep(&pause, nullptr);
      continue;
    }
    Serve(conn);
    close(conn);
  }
}

// REQUIRES s.mu. The secret, the socket and the listener thread, on the first export.
CUresult StartListenerLocked(ExportState& s) {
  if (s.listen_fd >= 0) return CUDA_SUCCESS;
  uint64_t secret = 0;
  if (!RandomSecret(&secret)) return CUDA_ERROR_OPERATING_SYSTEM;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t name_len = ipcwire::SocketName(static_cast<uint32_t>(getpid()), secret, addr.sun_path,
                                              sizeof(addr.sun_path));
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0 || name_len == 0) {
    if (fd >= 0) close(fd);
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name_len);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 64) != 0) {
    close(fd);
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t thread;
  const int rc = pthread_create(&thread, &attr, &Listener, reinterpret_cast<void*>(static_cast<intptr_t>(fd)));
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    close(fd);
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  s.secret = secret;
  s.listen_fd = fd;
  return CUDA_SUCCESS;
}

// ---- importer ----

using ImportKey = std::tuple<uint32_t, uint64_t, uint64_t>;  // exporter pid, secret, export id

struct ImportEntry {
  ImportKey key;
  size_t size = 0;
  CUcontext ctx = nullptr;
  std::vector<std::pair<uint64_t, uint64_t>> mapped;  // offset, size of each chunk
  std::vector<CUmemGenericAllocationHandle> handles;
  int opens = 0;
};

struct ImportState {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;  // everything below; held for a whole open
  std::map<CUdeviceptr, ImportEntry> by_base;
  std::map<ImportKey, CUdeviceptr> by_key;
};

ImportState& I() {
  static ImportState* s = new ImportState();  // never destroyed: tenant threads may run during exit
  return *s;
}

// Asks the exporter named by `h` for its chunks; on success `fds` holds one descriptor per chunk
// (the caller's to close). CUDA_ERROR_INVALID_HANDLE when the exporter is gone, is not the handle's
// process, refuses, or answers late or malformed.
CUresult AskExporter(const ipcwire::Handle& h, ipcwire::Reply* reply, std::vector<int>* fds) {
  static std::atomic<bool> told_gone{false}, told_peer{false}, told_reply{false}, told_refused{false};
  const int64_t until = NowMs() + kIpcTimeoutMs;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t name_len = ipcwire::SocketName(h.pid, h.secret, addr.sun_path, sizeof(addr.sun_path));
  int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (sock < 0 || name_len == 0) {
    if (sock >= 0) close(sock);
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name_len);
  // A unix socket connects at once or says why; a full backlog (EAGAIN) is tried again until the
  // deadline.
  for (;;) {
    if (connect(sock, reinterpret_cast<sockaddr*>(&addr), len) == 0) break;
    if ((errno == EAGAIN || errno == EINTR) && NowMs() < until) {
      timespec pause{0, 1'000'000};
      nanosleep(&pause, nullptr);
      continue;
    }
    if (errno == EINPROGRESS) {
      pollfd p{sock, POLLOUT, 0};
      int left = static_cast<int>(until - NowMs());
      int so_error = 0;
      socklen_t l = sizeof(so_error);
      if (left > 0 && poll(&p, 1, left) == 1 && getsockopt(sock, SOL_SOCKET, SO_ERROR, &so_error, &l) == 0 &&
          so_error == 0) {
        break;
      }
    }
    close(sock);
    SayOnce(&told_gone, "the exporting process is gone (or exports nothing under that handle): the open fails");
    return CUDA_ERROR_INVALID_HANDLE;
  }
  ucred peer{};
  if (!PeerUid(sock, &peer) || peer.uid != geteuid() || static_cast<uint32_t>(peer.pid) != h.pid) {
    close(sock);
    SayOnce(&told_peer, "the socket of a handle is held by another process or user: the open fails");
    return CUDA_ERROR_INVALID_HANDLE;
  }
  char req[ipcwire::kRequestBytes];
  ipcwire::EncodeRequest({h.export_id, h.secret}, req);
  char in[ipcwire::kReplyBytes];
  int got[ipcwire::kMaxChunks];
  uint32_t nfds = 0;
  int left = static_cast<int>(until - NowMs());
  bool ok = left > 0 && ipcwire::SendWithFds(sock, req, sizeof(req), nullptr, 0, left);
  left = static_cast<int>(until - NowMs());
  ok = ok && left > 0 && ipcwire::RecvWithFds(sock, in, sizeof(in), got, ipcwire::kMaxChunks, &nfds, left);
  close(sock);
  if (!ok) {
    SayOnce(&told_reply, "the exporting process did not answer in time: the open fails");
    return CUDA_ERROR_INVALID_HANDLE;
  }
  fds->assign(got, got + nfds);
  auto fail = [&](std::atomic<bool>* told, const char* why) {
    for (int fd : *fds) close(fd);
    fds->clear();
    SayOnce(told, why);
    return CUDA_ERROR_INVALID_HANDLE;
  };
  if (!ipcwire::DecodeReply(in, reply)) return fail(&told_reply, "the exporting process sent a malformed reply");
  if (reply->status != IpcStatus::kOk) {
    return fail(&told_refused, "the exporting process refused the handle (unknown export or wrong secret)");
  }
  if (reply->count != nfds || reply->size != h.size) {
    return fail(&told_reply, "the exporting process's reply does not match the handle");
  }
  return CUDA_SUCCESS;
}

// Undoes a partial or whole mapping of `e` at `base` (its handles released, the range freed).
void Unmap(CUdeviceptr base, ImportEntry* e, bool reserved) {
  const auto& d = g_real;
  for (const auto& [offset, size] : e->mapped) d.cuMemUnmap(base + offset, size);
  for (CUmemGenericAllocationHandle h : e->handles) d.cuMemRelease(h);
  if (reserved) d.cuMemAddressFree(base, e->size);
  e->mapped.clear();
  e->handles.clear();
}

// Maps the exporter's chunks into one new range of this process, readable and writable by the
// current context's device. Every descriptor in `fds` is closed.
CUresult MapImported(const ipcwire::Reply& reply, std::vector<int>& fds, CUcontext ctx, CUdeviceptr* base,
                     ImportEntry* e) {
  const auto& d = g_real;
  e->size = reply.size;
  e->ctx = ctx;
  CUresult r = CUDA_SUCCESS;
  for (int fd : fds) {
    CUmemGenericAllocationHandle h = 0;
    if (r == CUDA_SUCCESS) {
      r = d.cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      if (r == CUDA_SUCCESS) e->handles.push_back(h);
    }
    close(fd);
  }
  fds.clear();
  if (r != CUDA_SUCCESS) {
    Unmap(0, e, false);
    return r;
  }
  CUdevice dev = 0;
  r = d.cuCtxGetDevice(&dev);
  if (r == CUDA_SUCCESS) r = d.cuMemAddressReserve(base, reply.size, 0, 0, 0);
  if (r != CUDA_SUCCESS) {
    Unmap(0, e, false);
    return r;
  }
  for (uint32_t i = 0; i < reply.count && r == CUDA_SUCCESS; ++i) {
    r = d.cuMemMap(*base + reply.chunks[i].offset, reply.chunks[i].size, 0, e->handles[i], 0);
    if (r == CUDA_SUCCESS) e->mapped.emplace_back(reply.chunks[i].offset, reply.chunks[i].size);
  }
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = dev;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = d.cuMemSetAccess(*base, reply.size, &access, 1);
  }
  if (r != CUDA_SUCCESS) Unmap(*base, e, true);
  return r;
}

}  // namespace

IpcExports& IpcExports::Instance() {
  static IpcExports x;
  return x;
}

CUresult IpcExports::Export(CUdeviceptr base, size_t size, CUmemGenericAllocationHandle phys, CUdeviceptr addr,
                            CUipcMemHandle* out) {
  if (out == nullptr || addr < base || addr - base >= size) return CUDA_ERROR_INVALID_VALUE;
  ExportState& s = X();
  pthread_mutex_lock(&s.mu);
  CUresult r = StartListenerLocked(s);
  auto it = s.by_base.find(base);
  if (r == CUDA_SUCCESS && it == s.by_base.end()) {
    int fd = -1;
    r = g_real.cuMemExportToShareableHandle(&fd, phys, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r == CUDA_SUCCESS) {
      ExportEntry e;
      e.id = s.next_id++;
      e.size = size;
      e.chunks.push_back({0, size});
      e.fds.push_back(fd);
      it = s.by_base.emplace(base, std::move(e)).first;
    }
  }
  if (r == CUDA_SUCCESS) {
    ipcwire::Handle h;
    h.pid = static_cast<uint32_t>(getpid());
    h.secret = s.secret;
    h.export_id = it->second.id;
    h.offset = addr - base;
    h.size = size;
    ipcwire::EncodeHandle(h, out->reserved);
  }
  pthread_mutex_unlock(&s.mu);
  return r;
}

void IpcExports::Forget(CUdeviceptr base) {
  ExportState& s = X();
  pthread_mutex_lock(&s.mu);
  if (auto it = s.by_base.find(base); it != s.by_base.end()) {
    for (int fd : it->second.fds) close(fd);
    s.by_base.erase(it);
  }
  pthread_mutex_unlock(&s.mu);
}

void IpcExports::ResetAfterFork() {
  ExportState& s = X();
  pthread_mutex_init(&s.mu, nullptr);
  for (auto& [base, e] : s.by_base) {
    for (int fd : e.fds) close(fd);
  }
  s.by_base.clear();
  // The socket is the parent's name; the child makes its own on its first export.
  if (s.listen_fd >= 0) close(s.listen_fd);
  s.listen_fd = -1;
  s.secret = 0;
}

IpcImports& IpcImports::Instance() {
  static IpcImports x;
  return x;
}

bool IpcImports::Open(CUdeviceptr* pdptr, const CUipcMemHandle& handle, unsigned int flags, CUresult* result) {
  static std::atomic<bool> told_malformed{false};
  ipcwire::Handle h;
  switch (ipcwire::DecodeHandle(handle.reserved, &h)) {
    case ipcwire::HandleKind::kNotOurs:
      return false;
    case ipcwire::HandleKind::kMalformed:
      SayOnce(&told_malformed, "a malformed handle was refused");
      *result = CUDA_ERROR_INVALID_HANDLE;
      return true;
    case ipcwire::HandleKind::kOurs:
      break;
  }
  if (pdptr == nullptr || (flags & ~static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) != 0) {
    *result = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  // The exporting process maps its own memory already; the driver refuses it its own handle too.
  if (h.pid == static_cast<uint32_t>(getpid())) {
    *result = CUDA_ERROR_INVALID_CONTEXT;
    return true;
  }
  CUcontext ctx = nullptr;
  if (g_real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr) {
    *result = CUDA_ERROR_INVALID_CONTEXT;
    return true;
  }
  ImportState& s = I();
  const ImportKey key{h.pid, h.secret, h.export_id};
  pthread_mutex_lock(&s.mu);
  if (auto it = s.by_key.find(key); it != s.by_key.end()) {
    ++s.by_base[it->second].opens;
    *pdptr = it->second;
    pthread_mutex_unlock(&s.mu);
    *result = CUDA_SUCCESS;
    return true;
  }
  ipcwire::Reply reply;
  std::vector<int> fds;
  CUresult r = AskExporter(h, &reply, &fds);
  CUdeviceptr base = 0;
  ImportEntry e;
  if (r == CUDA_SUCCESS) r = MapImported(reply, fds, ctx, &base, &e);
  if (r == CUDA_SUCCESS) {
    e.key = key;
    e.opens = 1;
    s.by_base[base] = std::move(e);
    s.by_key[key] = base;
    *pdptr = base;
  }
  pthread_mutex_unlock(&s.mu);
  *result = r;
  return true;
}

bool IpcImports::Close(CUdeviceptr dptr, CUresult* result) {
  ImportState& s = I();
  pthread_mutex_lock(&s.mu);
  auto it = s.by_base.find(dptr);
  if (it == s.by_base.end()) {
    pthread_mutex_unlock(&s.mu);
    return false;
  }
  *result = CUDA_SUCCESS;
  if (--it->second.opens == 0) {
    ImportEntry e = std::move(it->second);
    s.by_base.erase(it);
    s.by_key.erase(e.key);
    // Work already queued may still read or write the mapping.
    InContext(e.ctx, [] { return g_real.cuCtxSynchronize(); });
    Unmap(dptr, &e, true);
  }
  pthread_mutex_unlock(&s.mu);
  return true;
}

void IpcImports::ResetAfterFork() {
  ImportState& s = I();
  pthread_mutex_init(&s.mu, nullptr);
  s.by_base.clear();  // the child has none of the parent's device memory
  s.by_key.clear();
}

}  // namespace tf::limiter
