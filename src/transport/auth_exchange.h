// The handshake's exchange of frames (internal to the transports): client hello, the server's
// challenge, the client's proof, the server's hello, or a refusal at any step. Each transport
// carries the frames its own way (a TCP or TLS stream, shm's rendezvous socket), through a
// HandshakeChannel; what is sent and checked is here, once. docs/protocol.md, "Handshake".
#pragma once

#include <cstddef>
#include <cstdint>

#include "transport/handshake.h"
#include "transport/transport_status.h"
#include "transport/wire.h"

namespace tf::transport::internal {

// Bytes of the largest handshake frame.
inline constexpr size_t kMaxHandshakeFrame = kFrameHeaderSize + kMaxHandshakePayload;

class HandshakeChannel {
 public:
  virtual ~HandshakeChannel() = default;
  // Sends one whole frame (header + payload, at most kMaxHandshakeFrame bytes).
  virtual TransportStatus SendFrame(const uint8_t* frame, size_t n) = 0;
  // Receives one frame: its header and up to kMaxHandshakePayload payload bytes. A frame that is
  // not a handshake frame (bulk, oversized) is kProtocol.
  virtual TransportStatus RecvFrame(FrameHeader* h, uint8_t* payload) = 0;
};

// A handshake frame: header version kHandshakeFrameVersion, so any client can read a refusal.
size_t EncodeAuthFrame(uint16_t opcode, uint64_t sequence, const uint8_t* payload, size_t n,
                       uint8_t out[kMaxHandshakeFrame]);

// Server side: receives the hello, negotiates (policy), challenges, verifies the proof. On
// success fills *accept (with the server's mac) and *hello and returns Ok; the caller then sends
// the server hello (EncodeServerHelloFrame; shm attaches the segment to it). A refused client is
// sent the refusal and kRefused is returned with its reason.
TransportStatus ServerHandshake(HandshakeChannel* ch, const ServerPolicy& policy,
                                ServerHello* accept, ClientHello* hello);
size_t EncodeServerHelloFrame(const ServerHello& accept, uint8_t out[kMaxHandshakeFrame]);

// Server side, for a connection it will not serve: reads the client's hello (so that closing does
// not reset the connection before the client reads the answer) and sends a refusal. Returns the
// kRefused status to report.
TransportStatus RefuseClient(HandshakeChannel* ch, const Refusal& refusal);

// Client side: sends the hello, answers the challenge, checks the server hello and the server's
// mac (a server that cannot prove it knows the credential's key is refused: kProtocol). A
// refusal is kRefused with the server's reason and message.
TransportStatus ClientHandshake(HandshakeChannel* ch, const ClientHello& hello,
                                ServerHello* session);

// Fills n bytes from the kernel's random source; false when none is available.
bool RandomBytes(void* out, size_t n);

}  // namespace tf::transport::internal
