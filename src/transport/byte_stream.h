// ByteStream: the read/write seam under the TCP transport. The transport frames, queues and
// batches; the stream moves bytes over a connected non-blocking socket, in clear (PlainStream) or
// through TLS (tls_stream.h). Both keep the transport's rules: absolute CLOCK_MONOTONIC deadlines,
// nothing blocks past them, a dead peer is a status, never SIGPIPE.
//
// Thread safety: SendAll may run on one thread while RecvSome/RecvExact run on another (the
// transport has one writer and one reader at a time); Shutdown may be called from any thread.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "transport/transport_status.h"

namespace tf::transport {

class ByteStream {
 public:
  virtual ~ByteStream() = default;

  // Writes every byte of iov (which it may modify), waiting for the socket as needed.
  virtual TransportStatus SendAll(struct iovec* iov, int iovcnt, int64_t deadline_ns) = 0;
  // Reads what is available now, without waiting: Ok with *got > 0, or Ok with *got == 0 when
  // nothing is (then WaitReadable). kPeerClosed at the end of the stream.
  virtual TransportStatus RecvSome(void* buf, size_t cap, size_t* got) = 0;
  // Waits until RecvSome may return bytes. kTimeout at the deadline.
  virtual TransportStatus WaitReadable(int64_t deadline_ns, const char* what) = 0;
  // Reads exactly n bytes. kPeerClosed on EOF.
  TransportStatus RecvExact(void* buf, size_t n, int64_t deadline_ns);
  // Ends both directions (TLS first says goodbye): wakes a blocked reader; the socket itself is
  // closed by its owner.
  virtual void Shutdown() = 0;

  virtual int fd() const = 0;
  // "tcp", or the TLS version and cipher ("TLSv1.3 TLS_AES_256_GCM_SHA384, kernel TLS tx").
  virtual const char* description() const = 0;
};

// The socket as it is. Does not own fd.
std::unique_ptr<ByteStream> NewPlainStream(int fd);

}  // namespace tf::transport
