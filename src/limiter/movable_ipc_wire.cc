#include "limiter/movable_ipc_wire.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "limiter/core/process_identity.h"

namespace tf::limiter::ipcwire {
namespace {

constexpr char kHandleMagic[8] = {'T', 'F', 'M', 'O', 'V', 'I', 'P', 'C'};
constexpr char kRequestMagic[8] = {'T', 'F', 'I', 'P', 'C', 'R', 'E', 'Q'};
constexpr char kReplyMagic[8] = {'T', 'F', 'I', 'P', 'C', 'R', 'E', 'P'};

template <typename T>
void Put(char* out, size_t at, T v) {
  memcpy(out + at, &v, sizeof(v));
}
template <typename T>
T Get(const char* in, size_t at) {
  T v;
  memcpy(&v, in + at, sizeof(v));
  return v;
}

bool Zero(const char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

// Waits for `events` on `sock` until `until_ms`; false on a timeout or an error.
bool WaitFor(int sock, short events, int64_t until_ms) {
  for (;;) {
    const int64_t left = until_ms - NowMs();
    if (left <= 0) return false;
    pollfd p{sock, events, 0};
    int n = poll(&p, 1, static_cast<int>(left));
    if (n > 0) return (p.revents & events) != 0;
    if (n < 0 && errno != EINTR) return false;
  }
}

}  // namespace

int64_t NowMs() { return MonotonicNowNs() / 1'000'000; }

void EncodeHandle(const Handle& h, char out[kHandleBytes]) {
  memset(out, 0, kHandleBytes);
  memcpy(out, kHandleMagic, 8);
  Put<uint16_t>(out, 8, kVersion);
  Put<uint32_t>(out, 12, h.pid);
  Put<uint64_t>(out, 16, h.secret);
  Put<uint64_t>(out, 24, h.export_id);
  Put<uint64_t>(out, 32, h.offset);
  Put<uint64_t>(out, 40, h.size);
}

HandleKind DecodeHandle(const char in[kHandleBytes], Handle* h) {
  if (memcmp(in, kHandleMagic, 8) != 0) return HandleKind::kNotOurs;
  if (Get<uint16_t>(in, 8) != kVersion || Get<uint16_t>(in, 10) != 0 || !Zero(in + 48, 16)) {
    return HandleKind::kMalformed;
  }
  h->pid = Get<uint32_t>(in, 12);
  h->secret = Get<uint64_t>(in, 16);
  h->export_id = Get<uint64_t>(in, 24);
  h->offset = Get<uint64_t>(in, 32);
  h->size = Get<uint64_t>(in, 40);
  if (h->pid == 0 || h->export_id == 0 || h->size == 0 || h->offset >= h->size) return HandleKind::kMalformed;
  return HandleKind::kOurs;
}

void EncodeRequest(const Request& r, char out[kRequestBytes]) {
  memset(out, 0, kRequestBytes);
  memcpy(out, kRequestMagic, 8);
  Put<uint16_t>(out, 8, kVersion);
  Put<uint64_t>(out, 16, r.export_id);
  Put<uint64_t>(out, 24, r.secret);
}

bool DecodeRequest(const char in[kRequestBytes], Request* r) {
  if (memcmp(in, kRequestMagic, 8) != 0 || Get<uint16_t>(in, 8) != kVersion || !Zero(in + 10, 6)) return false;
  r->export_id = Get<uint64_t>(in, 16);
  r->secret = Get<uint64_t>(in, 24);
  return r->export_id != 0;
}

void EncodeReply(const Reply& r, char out[kReplyBytes]) {
  memset(out, 0, kReplyBytes);
  memcpy(out, kReplyMagic, 8);
  Put<uint16_t>(out, 8, kVersion);
  Put<uint16_t>(out, 10, static_cast<uint16_t>(r.status));
  const uint32_t count = r.count <= kMaxChunks ? r.count : 0;
  Put<uint32_t>(out, 12, count);
  Put<uint64_t>(out, 16, r.size);
  for (uint32_t i = 0; i < count; ++i) {
    Put<uint64_t>(out, 32 + 16 * i, r.chunks[i].offset);
    Put<uint64_t>(out, 40 + 16 * i, r.chunks[i].size);
  }
}

bool DecodeReply(const char in[kReplyBytes], Reply* r) {
  if (memcmp(in, kReplyMagic, 8) != 0 || Get<uint16_t>(in, 8) != kVersion || !Zero(in + 24, 8)) return false;
  const uint16_t status = Get<uint16_t>(in, 10);
  if (status > static_cast<uint16_t>(IpcStatus::kExportFailed)) return false;
  r->status = static_cast<IpcStatus>(status);
  r->count = Get<uint32_t>(in, 12);
  r->size = Get<uint64_t>(in, 16);
  if (r->status != IpcStatus::kOk) return r->count == 0 && r->size == 0 && Zero(in + 32, kReplyBytes - 32);
  if (r->count == 0 || r->count > kMaxChunks || r->size == 0) return false;
  uint64_t next = 0;
  for (uint32_t i = 0; i < r->count; ++i) {
    r->chunks[i].offset = Get<uint64_t>(in, 32 + 16 * i);
    r->chunks[i].size = Get<uint64_t>(in, 40 + 16 * i);
    if (r->chunks[i].offset != next || r->chunks[i].size == 0 || r->chunks[i].size > r->size - next) return false;
    next += r->chunks[i].size;
  }
  return next == r->size && Zero(in + 32 + 16 * r->count, 16 * (kMaxChunks - r->count));
}

size_t SocketName(uint32_t pid, uint64_t secret, char* out, size_t cap) {
  if (cap < 2) return 0;
  out[0] = '\0';
  int n = snprintf(out + 1, cap - 1, "tfusion-ipc-%u-%016llx", pid, static_cast<unsigned long long>(secret));
  if (n < 0 || static_cast<size_t>(n) >= cap - 1) return 0;
  return 1 + static_cast<size_t>(n);
}

bool SendWithFds(int sock, const void* buf, size_t len, const int* fds, uint32_t nfds, int timeout_ms) {
  if (nfds > kMaxChunks) return false;
  const int64_t until = NowMs() + timeout_ms;
  iovec iov{const_cast<void*>(buf), len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxChunks)];
  if (nfds > 0) {
    memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  for (;;) {
    if (!WaitFor(sock, POLLOUT, until)) return false;
    ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(len)) return true;
    if (n >= 0 || (errno != EINTR && errno != EAGAIN)) return false;
  }
}

bool RecvWithFds(int sock, void* buf, size_t len, int* fds, uint32_t max_fds, uint32_t* nfds, int timeout_ms) {
  *nfds = 0;
  if (max_fds > kMaxChunks) return false;
  const int64_t until = NowMs() + timeout_ms;
  // One byte more than expected: a longer message shows as MSG_TRUNC or as a longer read.
  char extra = 0;
  iovec iov[2] = {{buf, len}, {&extra, 1}};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxChunks)];
  msghdr msg{};
  ssize_t n = -1;
  for (;;) {
    if (!WaitFor(sock, POLLIN, until)) return false;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    n = recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n >= 0) break;
    if (errno != EINTR && errno != EAGAIN) return false;
  }
  // Every descriptor that arrived is ours to close, whatever else is wrong with the message.
  uint32_t got = 0;
  bool too_many = false;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0)) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (got < max_fds) {
        fds[got++] = fd;
      } else {
        close(fd);
        too_many = true;
      }
    }
  }
  const bool ok = !too_many && (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) == 0 && n == static_cast<ssize_t>(len);
  if (!ok) {
    for (uint32_t i = 0; i < got; ++i) close(fds[i]);
    return false;
  }
  *nfds = got;
  return true;
}

}  // namespace tf::limiter::ipcwire
