// TLS on the TCP transport's stream (byte_stream.h), with the distribution's OpenSSL 3 loaded by
// dlopen ("libssl.so.3", which brings libcrypto.so.3; $TFUSION_LIBSSL names another file) the
// first time TLS is asked for. Nothing links OpenSSL, so the client stub keeps needing only libc
// and a plaintext connection never loads it; when TLS is asked for and the library is missing,
// the connection fails with a message that says so.
//
// TLS 1.3 only (both ends are TensorFusion). The client verifies the worker's certificate chain
// against a CA file and that the certificate names the host it dialled (DNS name or IP address).
// Kernel TLS is asked for (SSL_OP_ENABLE_KTLS): where the kernel has the tls module, OpenSSL hands
// record encryption to it after the handshake and description() says so.
//
// Thread safety: a TlsContext is immutable once made and may be shared (the worker makes one
// before forking its sessions). A stream serializes its OpenSSL calls with a mutex that is never
// held across a wait, so one reader and one writer proceed concurrently as on a plain socket.
// SIGPIPE: a write to a dead peer never raises it (it is blocked around OpenSSL's writes in a
// process that does not ignore it).
#pragma once

#include <cstdint>
#include <memory>

#include "transport/byte_stream.h"
#include "transport/transport_status.h"

namespace tf::transport {

class TlsContext;

// Client side: trusts the certificates in ca_file (PEM). Errors name the file: unreadable, or no
// certificate in it; or that OpenSSL cannot be loaded.
TransportStatus NewTlsClientContext(const char* ca_file, std::shared_ptr<TlsContext>* out);
// Server side: presents cert_file (PEM chain, leaf first) with key_file (unencrypted PEM key).
TransportStatus NewTlsServerContext(const char* cert_file, const char* key_file,
                                    std::shared_ptr<TlsContext>* out);

// Runs the TLS handshake on a connected non-blocking socket (not owned) until deadline_ns.
// host: what the client dialled, checked against the certificate. kRefused-free: a certificate
// the client does not trust is kProtocol with OpenSSL's reason ("certificate verify failed:
// self-signed certificate in certificate chain") and the CA file named.
TransportStatus TlsConnect(const TlsContext& ctx, int fd, const char* host, int64_t deadline_ns,
                           std::unique_ptr<ByteStream>* out);
TransportStatus TlsAccept(const TlsContext& ctx, int fd, int64_t deadline_ns,
                          std::unique_ptr<ByteStream>* out);

// The first byte of a TLS connection (a handshake record); a TensorFusion frame starts with 'T'.
inline constexpr uint8_t kTlsHandshakeRecordType = 0x16;

}  // namespace tf::transport
