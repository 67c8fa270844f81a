#include "transport/tcp_session_setup.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#include "transport/auth_exchange.h"
#include "transport/socket_io.h"
#include "transport/tls_stream.h"

namespace tf::transport::internal {
namespace {

// Handshake frames over a stream, each bounded by the connection's deadline.
class StreamChannel final : public HandshakeChannel {
 public:
  StreamChannel(ByteStream* io, int64_t deadline_ns) : io_(io), deadline_ns_(deadline_ns) {}

  TransportStatus SendFrame(const uint8_t* frame, size_t n) override {
    iovec iov{const_cast<uint8_t*>(frame), n};
    return io_->SendAll(&iov, 1, deadline_ns_);
  }
  TransportStatus RecvFrame(FrameHeader* h, uint8_t* payload) override {
    uint8_t hdr[kFrameHeaderSize];
    TF_TRANSPORT_RETURN_IF_ERROR(io_->RecvExact(hdr, sizeof(hdr), deadline_ns_));
    WireError e = DecodeFrameHeader(hdr, sizeof(hdr), h, kMaxHandshakePayload);
    if (e == WireError::kOk && (h->flags & kFlagBulkFollows)) e = WireError::kBadFlags;
    if (e != WireError::kOk) {
      return TransportStatus::Error(TransportErrc::kProtocol, 0, "handshake frame: %s",
                                    WireErrorName(e));
    }
    return io_->RecvExact(payload, h->payload_length, deadline_ns_);
  }

 private:
  ByteStream* io_;
  const int64_t deadline_ns_;
};

TransportStatus NoStream() {
  return TransportStatus::Error(TransportErrc::kResourceExhausted, 0, "out of memory");
}

// The first byte the client sent, left in the socket.
TransportStatus PeekFirstByte(int fd, int64_t deadline_ns, uint8_t* b) {
  for (;;) {
    ssize_t n = recv(fd, b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 1) return TransportStatus::Ok();
    if (n == 0) {
      return TransportStatus::Error(TransportErrc::kPeerClosed, 0,
                                    "peer closed the connection before the handshake");
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return ErrnoStatus(errno, "recv");
    TF_TRANSPORT_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline_ns, "handshake"));
  }
}

}  // namespace

TransportStatus AcceptTcpSession(int fd, const ServerPolicy& policy, const TransportOptions& options,
                                 std::unique_ptr<ByteStream>* io, ServerHello* accept,
                                 ClientHello* peer) {
  const int64_t deadline = DeadlineAfterMs(options.connect_timeout_ms);
  uint8_t first = 0;
  TF_TRANSPORT_RETURN_IF_ERROR(PeekFirstByte(fd, deadline, &first));
  const bool client_tls = first == kTlsHandshakeRecordType;
  if (options.tls_server != nullptr && client_tls) {
    TF_TRANSPORT_RETURN_IF_ERROR(TlsAccept(*options.tls_server, fd, deadline, io));
  } else if (client_tls) {
    return TransportStatus::Error(TransportErrc::kProtocol, 0,
                                  "a client started TLS, but this worker serves plaintext TCP "
                                  "(give it --tls-cert/--tls-key)");
  } else {
    *io = NewPlainStream(fd);
    if (!*io) return NoStream();
  }
  StreamChannel ch(io->get(), deadline);
  if (options.tls_server != nullptr && !client_tls) {
    Refusal r;
    r.Set(RefusalReason::kTlsRequired,
          "this worker serves TCP clients only over TLS: set TFUSION_CA_FILE to the CA file "
          "that signed its certificate");
    return RefuseClient(&ch, r);
  }
  TF_TRANSPORT_RETURN_IF_ERROR(ServerHandshake(&ch, policy, accept, peer));
  uint8_t frame[kMaxHandshakeFrame];
  return ch.SendFrame(frame, EncodeServerHelloFrame(*accept, frame));
}

TransportStatus OpenTcpSession(int fd, const char* host, const ClientHello& hello,
                               const TransportOptions& options, std::unique_ptr<ByteStream>* io,
                               ServerHello* session) {
  const int64_t deadline = DeadlineAfterMs(options.connect_timeout_ms);
  if (options.tls_ca_file != nullptr) {
    std::shared_ptr<TlsContext> ctx;
    TF_TRANSPORT_RETURN_IF_ERROR(NewTlsClientContext(options.tls_ca_file, &ctx));
    TF_TRANSPORT_RETURN_IF_ERROR(TlsConnect(*ctx, fd, host, deadline, io));
  } else {
    *io = NewPlainStream(fd);
    if (!*io) return NoStream();
  }
  StreamChannel ch(io->get(), deadline);
  return ClientHandshake(&ch, hello, session);
}

}  // namespace tf::transport::internal
