// What happens on a TCP connection before the TCP transport takes it (internal): TLS when asked
// for, then the handshake (auth_exchange.h) over the resulting stream.
#pragma once

#include <memory>

#include "transport/byte_stream.h"
#include "transport/handshake.h"
#include "transport/transport.h"

namespace tf::transport::internal {

// Server, on an accepted non-blocking socket (not owned): with options.tls_server a client must
// start TLS (a plaintext one is refused with kTlsRequired, in clear, so that any client can read
// why); without it a client that starts TLS is dropped. Then the handshake against policy. On
// success *io is the session's stream, *accept the server hello sent, *peer the client's hello.
// Everything is bounded by options.connect_timeout_ms.
TransportStatus AcceptTcpSession(int fd, const ServerPolicy& policy, const TransportOptions& options,
                                 std::unique_ptr<ByteStream>* io, ServerHello* accept,
                                 ClientHello* peer);

// Client, on a connected non-blocking socket (not owned) to `host` (as dialled, for the
// certificate check): TLS when options.tls_ca_file is set, then the handshake.
TransportStatus OpenTcpSession(int fd, const char* host, const ClientHello& hello,
                               const TransportOptions& options, std::unique_ptr<ByteStream>* io,
                               ServerHello* session);

}  // namespace tf::transport::internal
