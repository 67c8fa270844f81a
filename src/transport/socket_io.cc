#include "transport/socket_io.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "transport/transport.h"

namespace tf::transport {

int64_t MonotonicNowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

namespace internal {

int64_t DeadlineAfterMs(int timeout_ms) {
  if (timeout_ms < 0) timeout_ms = 0;
  return MonotonicNowNs() + static_cast<int64_t>(timeout_ms) * 1000000;
}

int RemainingMs(int64_t deadline_ns) {
  int64_t left = deadline_ns - MonotonicNowNs();
  if (left <= 0) return 0;
  int64_t ms = (left + 999999) / 1000000;
  return ms > 0x7fffffff ? 0x7fffffff : static_cast<int>(ms);
}

bool SetNonBlocking(int fd) {
  int fl = fcntl(fd, F_GETFL);
  return fl >= 0 && fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0;
}

TransportStatus ErrnoStatus(int err, const char* what) {
  switch (err) {
    case ECONNRESET:
    case EPIPE:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ECONNABORTED:
      return TransportStatus::Error(TransportErrc::kPeerDead, err, "%s: peer is gone: %s", what,
                                    strerror(err));
    default:
      return TransportStatus::Error(TransportErrc::kIo, err, "%s: %s", what, strerror(err));
  }
}

TransportStatus WaitFd(int fd, short events, int64_t deadline_ns, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = poll(&p, 1, RemainingMs(deadline_ns));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, what);
    }
    if (n == 0) {
      if (MonotonicNowNs() < deadline_ns) continue;
      return TransportStatus::Error(TransportErrc::kTimeout, 0, "%s: timed out", what);
    }
    if (p.revents & events) return TransportStatus::Ok();
    if (p.revents & POLLNVAL) {
      return TransportStatus::Error(TransportErrc::kClosed, EBADF, "%s: descriptor closed", what);
    }
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    return ErrnoStatus(err ? err : ECONNRESET, what);
  }
}

TransportStatus SendAll(int fd, struct iovec* iov, int iovcnt, int64_t deadline_ns) {
  while (iovcnt > 0 && iov[0].iov_len == 0) {
    ++iov;
    --iovcnt;
  }
  while (iovcnt > 0) {
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(iovcnt > IOV_MAX ? IOV_MAX : iovcnt);
    ssize_t n = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        TF_TRANSPORT_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline_ns, "send"));
        continue;
      }
      return ErrnoStatus(errno, "send");
    }
    size_t left = static_cast<size_t>(n);
    while (iovcnt > 0 && left >= iov[0].iov_len) {
      left -= iov[0].iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov[0].iov_base = static_cast<char*>(iov[0].iov_base) + left;
      iov[0].iov_len -= left;
    }
  }
  return TransportStatus::Ok();
}

}  // namespace internal
}  // namespace tf::transport

#include <sys/random.h>
#include <unistd.h>

#include "transport/wire.h"

namespace tf::transport::internal {

TransportStatus RecvExact(int fd, void* buf, size_t n, int64_t deadline_ns) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = recv(fd, static_cast<char*>(buf) + got, n - got, MSG_DONTWAIT);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      return TransportStatus::Error(TransportErrc::kPeerClosed, 0,
                                    "peer closed the connection");
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return ErrnoStatus(errno, "recv");
    TF_TRANSPORT_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline_ns, "recv"));
  }
  return TransportStatus::Ok();
}

size_t EncodeHandshakeFrame(uint16_t opcode, uint64_t sequence, const uint8_t* payload,
                            size_t len, uint8_t* out) {
  FrameHeader h;
  h.opcode = opcode;
  h.sequence = sequence;
  h.payload_length = static_cast<uint32_t>(len);
  EncodeFrameHeader(h, out);
  if (len) memcpy(out + kFrameHeaderSize, payload, len);
  return kFrameHeaderSize + len;
}

uint64_t NewSessionId() {
  uint64_t id = 0;
  if (getrandom(&id, sizeof(id), GRND_NONBLOCK) != static_cast<ssize_t>(sizeof(id)) || id == 0) {
    id = static_cast<uint64_t>(MonotonicNowNs()) ^ (static_cast<uint64_t>(getpid()) << 40);
  }
  return id;
}

}  // namespace tf::transport::internal

#include "transport/handshake.h"

namespace tf::transport::internal {

TransportStatus CheckHandshakeReply(const ClientHello& offered, const FrameHeader& h,
                                    const uint8_t* body, ServerHello* session) {
  if (h.opcode == static_cast<uint16_t>(Opcode::kHandshakeRefused)) {
    Refusal r;
    if (DecodeRefusal(body, h.payload_length, &r) != WireError::kOk) {
      return TransportStatus::Error(TransportErrc::kProtocol, 0, "malformed handshake refusal");
    }
    TransportStatus s = TransportStatus::Error(
        TransportErrc::kRefused, 0, "server refused the connection: %s: %.*s",
        RefusalReasonName(r.reason), static_cast<int>(r.message_length), r.message);
    s.set_refusal_reason(r.reason);
    return s;
  }
  if (h.opcode != static_cast<uint16_t>(Opcode::kServerHello) ||
      DecodeServerHello(body, h.payload_length, session) != WireError::kOk) {
    return TransportStatus::Error(TransportErrc::kProtocol, 0,
                                  "expected a server hello, got opcode 0x%04x", h.opcode);
  }
  char msg[160];
  if (!CheckServerHello(offered, *session, msg, sizeof(msg))) {
    return TransportStatus::Error(TransportErrc::kProtocol, 0, "bad server hello: %s", msg);
  }
  return TransportStatus::Ok();
}

}  // namespace tf::transport::internal
