#include "transport/auth_exchange.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "transport/sha256.h"
#include "transport/socket_io.h"

namespace tf::transport::internal {
namespace {

TransportStatus Protocol(const char* what) {
  return TransportStatus::Error(TransportErrc::kProtocol, 0, "%s", what);
}

TransportStatus RefusedStatus(const Refusal& r, const char* prefix) {
  TransportStatus s = TransportStatus::Error(
      TransportErrc::kRefused, 0, "%s: %s: %.*s", prefix, RefusalReasonName(r.reason),
      static_cast<int>(r.message_length), r.message);
  s.set_refusal_reason(r.reason);
  return s;
}

TransportStatus SendPayload(HandshakeChannel* ch, Opcode op, uint64_t sequence,
                            const uint8_t* body, size_t n) {
  uint8_t frame[kMaxHandshakeFrame];
  size_t total = EncodeAuthFrame(static_cast<uint16_t>(op), sequence, body, n, frame);
  return ch->SendFrame(frame, total);
}

// Sends the refusal; returns the status the server reports.
TransportStatus Refuse(HandshakeChannel* ch, const Refusal& r, uint64_t sequence) {
  uint8_t body[kMaxHandshakePayload];
  size_t n = EncodeRefusal(r, body, sizeof(body));
  SendPayload(ch, Opcode::kHandshakeRefused, sequence, body, n);
  return RefusedStatus(r, "refused client");
}

// A refusal from the server, or kProtocol when the frame is neither that nor `expected`.
TransportStatus UnlessExpected(const FrameHeader& h, const uint8_t* body, Opcode expected) {
  if (h.opcode == static_cast<uint16_t>(expected)) return TransportStatus::Ok();
  if (h.opcode == static_cast<uint16_t>(Opcode::kHandshakeRefused)) {
    Refusal r;
    if (DecodeRefusal(body, h.payload_length, &r) != WireError::kOk) {
      return Protocol("malformed handshake refusal");
    }
    return RefusedStatus(r, "server refused the connection");
  }
  return TransportStatus::Error(TransportErrc::kProtocol, 0,
                                "handshake: expected opcode 0x%04x, got 0x%04x",
                                static_cast<unsigned>(expected), h.opcode);
}

}  // namespace

size_t EncodeAuthFrame(uint16_t opcode, uint64_t sequence, const uint8_t* payload, size_t n,
                       uint8_t out[kMaxHandshakeFrame]) {
  FrameHeader h;
  h.version = kHandshakeFrameVersion;
  h.opcode = opcode;
  h.sequence = sequence;
  h.payload_length = static_cast<uint32_t>(n);
  EncodeFrameHeader(h, out);
  if (n) memcpy(out + kFrameHeaderSize, payload, n);
  return kFrameHeaderSize + n;
}

bool RandomBytes(void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

TransportStatus ServerHandshake(HandshakeChannel* ch, const ServerPolicy& policy,
                                ServerHello* accept, ClientHello* hello) {
  FrameHeader h;
  uint8_t hello_payload[kMaxHandshakePayload];
  TF_TRANSPORT_RETURN_IF_ERROR(ch->RecvFrame(&h, hello_payload));
  const size_t hello_length = h.payload_length;
  Refusal refusal;
  AuthKey key;
  if (h.opcode != static_cast<uint16_t>(Opcode::kClientHello) ||
      DecodeClientHello(hello_payload, hello_length, hello) != WireError::kOk) {
    refusal.Set(RefusalReason::kMalformedHello, "expected a well-formed client hello");
    return Refuse(ch, refusal, h.sequence);
  }
  if (!NegotiateHandshake(*hello, policy, NewSessionId(), accept, &key, &refusal)) {
    return Refuse(ch, refusal, h.sequence);
  }
  AuthChallenge challenge;
  if (!RandomBytes(challenge.server_nonce, sizeof(challenge.server_nonce))) {
    refusal.Set(RefusalReason::kInternal, "the server has no source of randomness");
    return Refuse(ch, refusal, h.sequence);
  }
  uint8_t body[kMaxHandshakePayload];
  size_t n = EncodeAuthChallenge(challenge, body, sizeof(body));
  TF_TRANSPORT_RETURN_IF_ERROR(SendPayload(ch, Opcode::kAuthChallenge, h.sequence, body, n));

  TF_TRANSPORT_RETURN_IF_ERROR(ch->RecvFrame(&h, body));
  AuthProof proof;
  if (h.opcode != static_cast<uint16_t>(Opcode::kAuthProof) ||
      DecodeAuthProof(body, h.payload_length, &proof) != WireError::kOk) {
    refusal.Set(RefusalReason::kMalformedHello, "expected a well-formed authentication proof");
    return Refuse(ch, refusal, h.sequence);
  }
  uint8_t transcript[32];
  AuthTranscript(hello_payload, hello_length, challenge, proof.client_nonce, transcript);
  if (key.check) {
    uint8_t want[kAuthMacBytes];
    ClientAuthMac(key.bytes, key.length, transcript, want);
    if (!ConstantTimeEqual(want, proof.mac, sizeof(want))) {
      refusal.Set(RefusalReason::kBadToken,
                  "authentication failed: the proof does not match the worker's token (a wrong "
                  "token or ticket, or a replayed handshake)");
      return Refuse(ch, refusal, h.sequence);
    }
  }
  ServerAuthMac(key.bytes, key.length, transcript, *accept, accept->mac);
  return TransportStatus::Ok();
}

size_t EncodeServerHelloFrame(const ServerHello& accept, uint8_t out[kMaxHandshakeFrame]) {
  uint8_t body[kMaxHandshakePayload];
  size_t n = EncodeServerHello(accept, body, sizeof(body));
  return EncodeAuthFrame(static_cast<uint16_t>(Opcode::kServerHello), 1, body, n, out);
}

TransportStatus RefuseClient(HandshakeChannel* ch, const Refusal& refusal) {
  FrameHeader h;
  uint8_t body[kMaxHandshakePayload];
  TransportStatus st = ch->RecvFrame(&h, body);
  if (!st.ok()) return st;
  return Refuse(ch, refusal, h.sequence);
}

TransportStatus ClientHandshake(HandshakeChannel* ch, const ClientHello& hello,
                                ServerHello* session) {
  uint8_t hello_payload[kMaxHandshakePayload];
  const size_t hello_length = EncodeClientHello(hello, hello_payload, sizeof(hello_payload));
  if (hello_length == 0) {
    return TransportStatus::Error(TransportErrc::kInvalidArgument, 0, "client hello too large");
  }
  TF_TRANSPORT_RETURN_IF_ERROR(
      SendPayload(ch, Opcode::kClientHello, 0, hello_payload, hello_length));
  FrameHeader h;
  uint8_t body[kMaxHandshakePayload];
  TF_TRANSPORT_RETURN_IF_ERROR(ch->RecvFrame(&h, body));
  TF_TRANSPORT_RETURN_IF_ERROR(UnlessExpected(h, body, Opcode::kAuthChallenge));
  AuthChallenge challenge;
  if (DecodeAuthChallenge(body, h.payload_length, &challenge) != WireError::kOk) {
    return Protocol("malformed authentication challenge");
  }
  AuthProof proof;
  if (!RandomBytes(proof.client_nonce, sizeof(proof.client_nonce))) {
    return TransportStatus::Error(TransportErrc::kIo, 0, "no source of randomness");
  }
  const CredentialParts cred = SplitCredential(hello.token, hello.token_length);
  uint8_t transcript[32];
  AuthTranscript(hello_payload, hello_length, challenge, proof.client_nonce, transcript);
  ClientAuthMac(cred.key, cred.key_length, transcript, proof.mac);
  size_t n = EncodeAuthProof(proof, body, sizeof(body));
  TF_TRANSPORT_RETURN_IF_ERROR(SendPayload(ch, Opcode::kAuthProof, 1, body, n));

  TF_TRANSPORT_RETURN_IF_ERROR(ch->RecvFrame(&h, body));
  TF_TRANSPORT_RETURN_IF_ERROR(CheckHandshakeReply(hello, h, body, session));
  uint8_t want[kAuthMacBytes];
  ServerAuthMac(cred.key, cred.key_length, transcript, *session, want);
  if (!ConstantTimeEqual(want, session->mac, sizeof(want))) {
    return TransportStatus::Error(
        TransportErrc::kProtocol, 0,
        "the worker did not prove it knows this client's token (a worker started with another "
        "--token, or none, or not the worker meant)");
  }
  return TransportStatus::Ok();
}

}  // namespace tf::transport::internal
