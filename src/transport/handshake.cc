#include "transport/handshake.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "transport/sha256.h"

namespace tf::transport {

CredentialParts SplitCredential(const uint8_t* credential, size_t n) {
  CredentialParts p;
  // A session ticket: "tkt1." <expiry> "." <nonce> "." <mac>, or "tkt2." <expiry> "." <nonce> "."
  // <limits digest> "." <mac>; the id is all before the last dot.
  const bool v2 = n > 5 && memcmp(credential, "tkt2.", 5) == 0;
  if (n > 5 && (v2 || memcmp(credential, "tkt1.", 5) == 0)) {
    size_t dots = 0, last = 0;
    for (size_t i = 0; i < n; ++i) {
      if (credential[i] == '.') {
        ++dots;
        last = i;
      }
    }
    if (dots == (v2 ? 4u : 3u) && last + 1 < n) {
      p.id = credential;
      p.id_length = last;
      p.key = credential + last + 1;
      p.key_length = n - last - 1;
      return p;
    }
  }
  p.key = credential;
  p.key_length = n;
  return p;
}

bool ClientHello::SetToken(const void* data, size_t n) {
  if (n > kMaxTokenBytes) return false;
  if (n) memcpy(token, data, n);
  token_length = static_cast<uint32_t>(n);
  return true;
}

bool ClientHello::SetHostId(const char* s) {
  size_t n = strlen(s);
  if (n > kMaxHostIdBytes) return false;
  memcpy(host_id, s, n);
  host_id_length = static_cast<uint32_t>(n);
  return true;
}

const char* RefusalReasonName(uint16_t reason) {
  switch (static_cast<RefusalReason>(reason)) {
    case RefusalReason::kVersionMismatch: return "version_mismatch";
    case RefusalReason::kUnknownRequiredFeature: return "unknown_required_feature";
    case RefusalReason::kMissingRequiredFeature: return "missing_required_feature";
    case RefusalReason::kBadToken: return "bad_token";
    case RefusalReason::kMalformedHello: return "malformed_hello";
    case RefusalReason::kServerBusy: return "server_busy";
    case RefusalReason::kInternal: return "internal";
    case RefusalReason::kTlsRequired: return "tls_required";
  }
  return "unknown";
}

void Refusal::Set(RefusalReason r, const char* fmt, ...) {
  reason = static_cast<uint16_t>(r);
  char buf[kMaxRefusalMessageBytes + 1];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  if (n > static_cast<int>(kMaxRefusalMessageBytes)) n = kMaxRefusalMessageBytes;
  memcpy(message, buf, static_cast<size_t>(n));
  message_length = static_cast<uint32_t>(n);
}

// ClientHello: u16 min_version, u16 max_version, u64 features_supported, u64 features_required,
// blob credential id (u32 len <= 256; version 1 sent the token here), u32 client_pid, blob host_id
// (u32 len <= 128).
size_t EncodeClientHello(const ClientHello& h, uint8_t* out, size_t cap) {
  if (h.token_length > kMaxTokenBytes || h.host_id_length > kMaxHostIdBytes) return 0;
  const CredentialParts cred = SplitCredential(h.token, h.token_length);
  Writer w(out, cap);
  w.U16(h.min_version);
  w.U16(h.max_version);
  w.U64(h.features_supported);
  w.U64(h.features_required);
  w.Blob(cred.id, static_cast<uint32_t>(cred.id_length));
  w.U32(h.client_pid);
  w.Blob(h.host_id, h.host_id_length);
  return w.ok() ? w.size() : 0;
}

WireError DecodeClientHello(const uint8_t* data, size_t size, ClientHello* out) {
  Reader r(data, size);
  r.U16(&out->min_version);
  r.U16(&out->max_version);
  r.U64(&out->features_supported);
  r.U64(&out->features_required);
  const uint8_t* p;
  uint32_t n;
  if (r.Blob(&p, &n, kMaxCredentialIdBytes)) {
    if (n) memcpy(out->credential_id, p, n);
    out->credential_id_length = n;
  }
  r.U32(&out->client_pid);
  if (r.Blob(&p, &n, kMaxHostIdBytes)) {
    memcpy(out->host_id, p, n);
    out->host_id_length = n;
  }
  return r.Finish() ? WireError::kOk : WireError::kMalformed;
}

// ServerHello: u16 version, u64 features, u64 session_id, u8[32] mac.
size_t EncodeServerHello(const ServerHello& h, uint8_t* out, size_t cap) {
  Writer w(out, cap);
  w.U16(h.version);
  w.U64(h.features);
  w.U64(h.session_id);
  w.Bytes(h.mac, sizeof(h.mac));
  return w.ok() ? w.size() : 0;
}

WireError DecodeServerHello(const uint8_t* data, size_t size, ServerHello* out) {
  Reader r(data, size);
  r.U16(&out->version);
  r.U64(&out->features);
  r.U64(&out->session_id);
  r.Bytes(out->mac, sizeof(out->mac));
  return r.Finish() ? WireError::kOk : WireError::kMalformed;
}

// AuthChallenge: u8[32] server nonce. AuthProof: u8[32] client nonce, u8[32] mac.
size_t EncodeAuthChallenge(const AuthChallenge& c, uint8_t* out, size_t cap) {
  Writer w(out, cap);
  w.Bytes(c.server_nonce, sizeof(c.server_nonce));
  return w.ok() ? w.size() : 0;
}

WireError DecodeAuthChallenge(const uint8_t* data, size_t size, AuthChallenge* out) {
  Reader r(data, size);
  r.Bytes(out->server_nonce, sizeof(out->server_nonce));
  return r.Finish() ? WireError::kOk : WireError::kMalformed;
}

size_t EncodeAuthProof(const AuthProof& p, uint8_t* out, size_t cap) {
  Writer w(out, cap);
  w.Bytes(p.client_nonce, sizeof(p.client_nonce));
  w.Bytes(p.mac, sizeof(p.mac));
  return w.ok() ? w.size() : 0;
}

WireError DecodeAuthProof(const uint8_t* data, size_t size, AuthProof* out) {
  Reader r(data, size);
  r.Bytes(out->client_nonce, sizeof(out->client_nonce));
  r.Bytes(out->mac, sizeof(out->mac));
  return r.Finish() ? WireError::kOk : WireError::kMalformed;
}

// Refusal: u16 reason, blob message (u32 len <= 256, UTF-8, no NUL).
size_t EncodeRefusal(const Refusal& f, uint8_t* out, size_t cap) {
  if (f.message_length > kMaxRefusalMessageBytes) return 0;
  Writer w(out, cap);
  w.U16(f.reason);
  w.Blob(f.message, f.message_length);
  return w.ok() ? w.size() : 0;
}

WireError DecodeRefusal(const uint8_t* data, size_t size, Refusal* out) {
  Reader r(data, size);
  r.U16(&out->reason);
  const uint8_t* p;
  uint32_t n;
  if (r.Blob(&p, &n, kMaxRefusalMessageBytes)) {
    memcpy(out->message, p, n);
    out->message_length = n;
  }
  return r.Finish() ? WireError::kOk : WireError::kMalformed;
}

bool NegotiateHandshake(const ClientHello& hello, const ServerPolicy& policy, uint64_t session_id,
                        ServerHello* accept, AuthKey* key, Refusal* refuse) {
  if (hello.min_version > hello.max_version) {
    refuse->Set(RefusalReason::kMalformedHello, "client version range [%u, %u] is empty",
                hello.min_version, hello.max_version);
    return false;
  }
  if ((hello.features_required & ~hello.features_supported) != 0) {
    refuse->Set(RefusalReason::kMalformedHello,
                "client requires features it does not list as supported: 0x%016llx",
                static_cast<unsigned long long>(hello.features_required &
                                                ~hello.features_supported));
    return false;
  }
  uint16_t lo = hello.min_version > policy.min_version ? hello.min_version : policy.min_version;
  uint16_t hi = hello.max_version < policy.max_version ? hello.max_version : policy.max_version;
  if (lo > hi) {
    refuse->Set(RefusalReason::kVersionMismatch,
                "protocol version mismatch: client speaks [%u, %u], server speaks [%u, %u]",
                hello.min_version, hello.max_version, policy.min_version, policy.max_version);
    return false;
  }
  key->check = policy.token_length != 0 || policy.token != nullptr;
  key->length = 0;
  if (key->check && hello.credential_id_length == 0) {
    if (policy.token_length > sizeof(key->bytes)) {
      refuse->Set(RefusalReason::kInternal, "the server's token is longer than %u bytes",
                  kMaxTokenBytes);
      return false;
    }
    memcpy(key->bytes, policy.token, policy.token_length);
    key->length = policy.token_length;
  } else if (key->check &&
             (policy.credential_key == nullptr ||
              !policy.credential_key(hello.credential_id, hello.credential_id_length, key,
                                     policy.credential_ctx))) {
    refuse->Set(RefusalReason::kBadToken,
                "credential not accepted: a session ticket that expired, is malformed, or was "
                "made with another token");
    return false;
  }
  uint64_t unknown = hello.features_required & ~policy.features_supported;
  if (unknown != 0) {
    refuse->Set(RefusalReason::kUnknownRequiredFeature,
                "client requires features the server does not support: 0x%016llx",
                static_cast<unsigned long long>(unknown));
    return false;
  }
  uint64_t missing = policy.features_required & ~hello.features_supported;
  if (missing != 0) {
    refuse->Set(RefusalReason::kMissingRequiredFeature,
                "server requires features the client does not support: 0x%016llx",
                static_cast<unsigned long long>(missing));
    return false;
  }
  accept->version = hi;
  accept->features = hello.features_supported & policy.features_supported;
  accept->session_id = session_id;
  return true;
}

namespace {
constexpr char kClientLabel[] = "tfusion auth v2 client";
constexpr char kServerLabel[] = "tfusion auth v2 server";
}  // namespace

void AuthTranscript(const uint8_t* hello_payload, size_t hello_length, const AuthChallenge& c,
                    const uint8_t client_nonce[kAuthNonceBytes], uint8_t out[32]) {
  Sha256 s;
  s.Update(hello_payload, hello_length);
  s.Update(c.server_nonce, sizeof(c.server_nonce));
  s.Update(client_nonce, kAuthNonceBytes);
  s.Final(out);
}

void ClientAuthMac(const uint8_t* key, size_t key_length, const uint8_t transcript[32],
                   uint8_t out[kAuthMacBytes]) {
  const ByteSpan parts[] = {{kClientLabel, sizeof(kClientLabel) - 1}, {transcript, 32}};
  HmacSha256(key, key_length, parts, 2, out);
}

void ServerAuthMac(const uint8_t* key, size_t key_length, const uint8_t transcript[32],
                   const ServerHello& hello, uint8_t out[kAuthMacBytes]) {
  uint8_t fields[18];
  Writer w(fields, sizeof(fields));
  w.U16(hello.version);
  w.U64(hello.features);
  w.U64(hello.session_id);
  const ByteSpan parts[] = {
      {kServerLabel, sizeof(kServerLabel) - 1}, {transcript, 32}, {fields, sizeof(fields)}};
  HmacSha256(key, key_length, parts, 3, out);
}

bool CheckServerHello(const ClientHello& offered, const ServerHello& got, char* msg,
                      size_t msg_cap) {
  if (got.version < offered.min_version || got.version > offered.max_version) {
    snprintf(msg, msg_cap, "server chose protocol version %u outside the offered [%u, %u]",
             got.version, offered.min_version, offered.max_version);
    return false;
  }
  if ((got.features & ~offered.features_supported) != 0) {
    snprintf(msg, msg_cap, "server enabled features the client did not offer: 0x%016llx",
             static_cast<unsigned long long>(got.features & ~offered.features_supported));
    return false;
  }
  if ((offered.features_required & ~got.features) != 0) {
    snprintf(msg, msg_cap, "server did not enable required features 0x%016llx",
             static_cast<unsigned long long>(offered.features_required & ~got.features));
    return false;
  }
  return true;
}

}  // namespace tf::transport
