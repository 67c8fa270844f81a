// The connection handshake: the client's hello, the server's hello or refusal, and the server's
// negotiation policy. Payload layouts are in docs/protocol.md ("Handshake").
//
// All structures are fixed-size (no allocation): tokens up to kMaxTokenBytes, host ids up to
// kMaxHostIdBytes, refusal messages up to kMaxRefusalMessageBytes. Decoders reject anything
// longer, any trailing byte and any truncation with WireError::kMalformed.
#pragma once

#include <cstddef>
#include <cstdint>

#include "transport/wire.h"

namespace tf::transport {

inline constexpr uint32_t kMaxTokenBytes = 256;
inline constexpr uint32_t kMaxHostIdBytes = 128;
inline constexpr uint32_t kMaxRefusalMessageBytes = 256;
// Upper bound of an encoded hello/refusal payload (for stack buffers).
inline constexpr size_t kMaxHandshakePayload = 1024;

// Feature bits. A side lists what it supports and what it requires of the peer; the session runs
// with the intersection of the supported sets. A bit this build does not know is never in its
// supported set, so a peer that *requires* it is refused with kUnknownRequiredFeature.
inline constexpr uint64_t kFeatureDeferredErrors = 1ull << 0;  // async errors at next sync reply
inline constexpr uint64_t kFeatureBulkArena = 1ull << 1;       // shm bulk slices by arena offset
// The server accepts host-memory regions (page-locked memory shared with the client, opcodes
// 0x0013-0x0015 of docs/remote.md); used only over a transport that can share host memory.
inline constexpr uint64_t kFeatureHostRegions = 1ull << 2;
// The server accepts mirrored host memory (opcodes 0x0016-0x0018, event 0x8110 of
// docs/remote.md): the client uses it where host memory cannot be shared (TCP).
inline constexpr uint64_t kFeatureMirrors = 1ull << 3;
// The server accepts the managed-memory bit in host-region map messages (docs/remote.md).
inline constexpr uint64_t kFeatureManagedRegions = 1ull << 4;
// A refused session-info reply (the client's vGPU limits refused) carries the reason after its
// empty device list (docs/remote.md), for the client to print.
inline constexpr uint64_t kFeatureRefusalReason = 1ull << 5;
inline constexpr uint64_t kKnownFeatures = kFeatureDeferredErrors | kFeatureBulkArena |
                                           kFeatureHostRegions | kFeatureMirrors |
                                           kFeatureManagedRegions | kFeatureRefusalReason;
// The longest refusal reason sent.
inline constexpr uint32_t kMaxRefusalReasonBytes = 512;

// What a client holds to open a session: the worker's token, or a session ticket minted from it
// ("tkt1.<expiry>.<nonce>.<mac>", or tkt2 with a limits digest before the mac;
// src/worker/session_ticket.h). Neither crosses the wire: the hello carries the credential's
// public id (empty for the token, all of a ticket before its mac) and the client proves it knows the key (the token, or the ticket's mac) by answering
// the server's challenge (docs/protocol.md, "Handshake").
inline constexpr uint32_t kMaxCredentialIdBytes = kMaxTokenBytes;
inline constexpr size_t kAuthNonceBytes = 32;
inline constexpr size_t kAuthMacBytes = 32;

// A credential split into what is sent (id) and what proves it (key). Pure function of the text.
struct CredentialParts {
  const uint8_t* id = nullptr;
  size_t id_length = 0;
  const uint8_t* key = nullptr;
  size_t key_length = 0;
};
CredentialParts SplitCredential(const uint8_t* credential, size_t n);

struct ClientHello {
  uint16_t min_version = kProtocolVersionMin;
  uint16_t max_version = kProtocolVersionMax;
  uint64_t features_supported = kKnownFeatures;
  uint64_t features_required = 0;
  // Client side: the credential (never encoded; EncodeClientHello writes its id).
  uint32_t token_length = 0;
  uint8_t token[kMaxTokenBytes] = {};
  // Server side: the credential id the client sent (a version 1 client sent its token here).
  uint32_t credential_id_length = 0;
  uint8_t credential_id[kMaxCredentialIdBytes] = {};
  uint32_t client_pid = 0;  // as the client sees itself; informational (namespaces differ)
  uint32_t host_id_length = 0;
  char host_id[kMaxHostIdBytes] = {};  // not NUL-terminated on the wire

  // Copies; returns false (and leaves the field unchanged) when too long.
  bool SetToken(const void* data, size_t n);
  bool SetHostId(const char* s);
};

// The server's challenge (opcode kAuthChallenge) and the client's answer (kAuthProof).
struct AuthChallenge {
  uint8_t server_nonce[kAuthNonceBytes] = {};
};
struct AuthProof {
  uint8_t client_nonce[kAuthNonceBytes] = {};
  uint8_t mac[kAuthMacBytes] = {};
};

struct ServerHello {
  uint16_t version = 0;   // the chosen protocol version
  uint64_t features = 0;  // the session's features: both sides support them
  uint64_t session_id = 0;
  uint8_t mac[kAuthMacBytes] = {};  // the server's proof that it knows the credential's key too
};

// Why a server refused; values are fixed on the wire.
enum class RefusalReason : uint16_t {
  kVersionMismatch = 1,
  kUnknownRequiredFeature = 2,  // the client requires a feature the server does not know
  kMissingRequiredFeature = 3,  // the server requires a feature the client does not support
  kBadToken = 4,
  kMalformedHello = 5,
  kServerBusy = 6,
  kInternal = 7,
  kTlsRequired = 8,  // a plaintext client at a worker that serves TCP only over TLS
};
const char* RefusalReasonName(uint16_t reason);

struct Refusal {
  uint16_t reason = 0;  // a RefusalReason value (unknown values are kept as they are)
  uint32_t message_length = 0;
  char message[kMaxRefusalMessageBytes] = {};  // not NUL-terminated on the wire

  // printf-style, truncated to kMaxRefusalMessageBytes.
  void Set(RefusalReason r, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
};

// Encoders return the payload size written into out, or 0 when cap is too small.
size_t EncodeClientHello(const ClientHello& h, uint8_t* out, size_t cap);
size_t EncodeServerHello(const ServerHello& h, uint8_t* out, size_t cap);
size_t EncodeRefusal(const Refusal& r, uint8_t* out, size_t cap);
size_t EncodeAuthChallenge(const AuthChallenge& c, uint8_t* out, size_t cap);
size_t EncodeAuthProof(const AuthProof& p, uint8_t* out, size_t cap);
WireError DecodeClientHello(const uint8_t* data, size_t size, ClientHello* out);
WireError DecodeServerHello(const uint8_t* data, size_t size, ServerHello* out);
WireError DecodeRefusal(const uint8_t* data, size_t size, Refusal* out);
WireError DecodeAuthChallenge(const uint8_t* data, size_t size, AuthChallenge* out);
WireError DecodeAuthProof(const uint8_t* data, size_t size, AuthProof* out);

// The key a client must prove it knows (up to kMaxTokenBytes). check == false: the server takes
// any client (no token configured), and proves itself with the empty key.
struct AuthKey {
  bool check = true;
  size_t length = 0;
  uint8_t bytes[kMaxTokenBytes] = {};
};

// What a server accepts. token == nullptr with token_length 0 accepts any client (tests, local).
struct ServerPolicy {
  uint16_t min_version = kProtocolVersionMin;
  uint16_t max_version = kProtocolVersionMax;
  uint64_t features_supported = kKnownFeatures;
  uint64_t features_required = 0;
  const uint8_t* token = nullptr;
  size_t token_length = 0;
  // The key of a credential id other than the token's (the worker's session tickets): fills *key
  // and returns true, or returns false (unknown, malformed or expired id: refused).
  bool (*credential_key)(const uint8_t* id, size_t length, AuthKey* key, void* ctx) = nullptr;
  void* credential_ctx = nullptr;
};

// Server side, on the client's hello: checks versions and features and looks up the key of the
// credential id. Returns true and fills *accept (with session_id) and *key, or false and fills
// *refuse with a reason and a message naming the mismatch.
bool NegotiateHandshake(const ClientHello& hello, const ServerPolicy& policy, uint64_t session_id,
                        ServerHello* accept, AuthKey* key, Refusal* refuse);

// The proofs. transcript: SHA-256 of the client hello's payload bytes as sent, the server nonce
// and the client nonce. The client's mac is HMAC-SHA256(key, "tfusion auth v2 client" ||
// transcript); the server's is HMAC-SHA256(key, "tfusion auth v2 server" || transcript || u16
// version || u64 features || u64 session_id), so it also vouches for what was negotiated.
void AuthTranscript(const uint8_t* hello_payload, size_t hello_length, const AuthChallenge& c,
                    const uint8_t client_nonce[kAuthNonceBytes], uint8_t out[32]);
void ClientAuthMac(const uint8_t* key, size_t key_length, const uint8_t transcript[32],
                   uint8_t out[kAuthMacBytes]);
void ServerAuthMac(const uint8_t* key, size_t key_length, const uint8_t transcript[32],
                   const ServerHello& hello, uint8_t out[kAuthMacBytes]);

// Client side: checks that a server hello is consistent with what the client offered (version in
// range, features a subset of the client's, every required feature present). On failure writes a
// reason into msg (NUL-terminated) and returns false. The server's mac is checked separately.
bool CheckServerHello(const ClientHello& offered, const ServerHello& got, char* msg, size_t msg_cap);

}  // namespace tf::transport
