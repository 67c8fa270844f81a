// Deadline-bounded socket I/O shared by the TCP and shared-memory transports (internal).
// Every function takes an absolute CLOCK_MONOTONIC deadline in nanoseconds and never blocks past
// it; sockets are non-blocking and writes use MSG_NOSIGNAL (a dead peer is an error, not SIGPIPE).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

#include "transport/transport_status.h"
#include "transport/wire.h"

namespace tf::transport::internal {

int64_t DeadlineAfterMs(int timeout_ms);
// Milliseconds left until deadline_ns, rounded up, >= 0.
int RemainingMs(int64_t deadline_ns);

bool SetNonBlocking(int fd);

// Waits until fd is ready for `events` (POLLIN/POLLOUT). kTimeout at the deadline; kPeerDead on
// POLLERR/POLLHUP without POLLIN (for reads the caller's recv reports EOF itself).
TransportStatus WaitFd(int fd, short events, int64_t deadline_ns, const char* what);

// Writes every byte of iov (modified in place) with sendmsg, waiting for POLLOUT as needed.
TransportStatus SendAll(int fd, struct iovec* iov, int iovcnt, int64_t deadline_ns);

// Maps an errno from send/recv/connect to a status: ECONNRESET/EPIPE/ETIMEDOUT/EHOSTUNREACH ->
// kPeerDead, others -> kIo.
TransportStatus ErrnoStatus(int err, const char* what);

}  // namespace tf::transport::internal

namespace tf::transport::internal {

// Reads exactly n bytes from a stream socket. kPeerClosed on EOF.
TransportStatus RecvExact(int fd, void* buf, size_t n, int64_t deadline_ns);

// Encodes a whole handshake frame (header + payload) into out (>= kFrameHeaderSize + len bytes);
// returns its size.
size_t EncodeHandshakeFrame(uint16_t opcode, uint64_t sequence, const uint8_t* payload,
                            size_t len, uint8_t* out);

// A fresh random session id (getrandom, falling back to time and pid).
uint64_t NewSessionId();

}  // namespace tf::transport::internal

namespace tf::transport {
struct ClientHello;
struct ServerHello;
}

namespace tf::transport::internal {

// Client side: interprets the server's answer to `offered` (header h, payload body). A
// refusal becomes kRefused carrying the server's reason and message; anything else unexpected is
// kProtocol.
TransportStatus CheckHandshakeReply(const ClientHello& offered, const FrameHeader& h,
                                    const uint8_t* body, ServerHello* session);

}  // namespace tf::transport::internal
