#include "transport/handshake.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace tf::transport {

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
// blob token (u32 len <= 256), u32 client_pid, blob host_id (u32 len <= 128).
size_t EncodeClientHello(const ClientHello& h, uint8_t* out, size_t cap) {
  if (h.token_length > kMaxTokenBytes || h.host_id_length > kMaxHostIdBytes) return 0;
  Writer w(out, cap);
  w.U16(h.min_version);
  w.U16(h.max_version);
  w.U64(h.features_supported);
  w.U64(h.features_required);
  w.Blob(h.token, h.token_length);
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
  if (r.Blob(&p, &n, kMaxTokenBytes)) out->SetToken(p, n);
  r.U32(&out->client_pid);
  if (r.Blob(&p, &n, kMaxHostIdBytes)) {
    memcpy(out->host_id, p, n);
    out->host_id_length = n;
  }
  return r.Finish() ? WireError::kOk : WireError::kMalformed;
}

// ServerHello: u16 version, u64 features, u64 session_id.
size_t EncodeServerHello(const ServerHello& h, uint8_t* out, size_t cap) {
  Writer w(out, cap);
  w.U16(h.version);
  w.U64(h.features);
  w.U64(h.session_id);
  return w.ok() ? w.size() : 0;
}

WireError DecodeServerHello(const uint8_t* data, size_t size, ServerHello* out) {
  Reader r(data, size);
  r.U16(&out->version);
  r.U64(&out->features);
  r.U64(&out->session_id);
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

namespace {

bool ConstantTimeEqual(const uint8_t* a, size_t an, const uint8_t* b, size_t bn) {
  uint8_t diff = an == bn ? 0 : 1;
  size_t n = an < bn ? an : bn;
  for (size_t i = 0; i < n; ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

bool NegotiateHandshake(const ClientHello& hello, const ServerPolicy& policy, uint64_t session_id,
                        ServerHello* accept, Refusal* refuse) {
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
  if (policy.token_length != 0 || policy.token != nullptr) {
    if (!ConstantTimeEqual(hello.token, hello.token_length, policy.token, policy.token_length) &&
        !(policy.accept_credential != nullptr &&
          policy.accept_credential(hello.token, hello.token_length, policy.credential_ctx))) {
      refuse->Set(RefusalReason::kBadToken, "authentication token not accepted");
      return false;
    }
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
