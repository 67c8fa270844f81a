#include "worker/session_ticket.h"

#include <cstdio>
#include <cstdlib>

#include "transport/auth_exchange.h"
#include "transport/sha256.h"

namespace tf::worker {
namespace {

constexpr char kHex[] = "0123456789abcdef";

std::string Hex(const unsigned char* p, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += kHex[p[i] >> 4];
    out += kHex[p[i] & 15];
  }
  return out;
}

std::string Mac(const std::string& key, const std::string& message) {
  unsigned char out[transport::kSha256Bytes];
  transport::HmacSha256(key.data(), key.size(), message.data(), message.size(), out);
  return Hex(out, sizeof(out));
}

bool IsHex(const std::string& s) {
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

std::string SessionLimitsDigest(const SessionLimits& l) {
  // In the limits record's order, up to the last field given: a field added to the record later
  // (empty for older runs) leaves the digest of every ticket made before it unchanged.
  const std::string* fields[] = {&l.vram, &l.tflops, &l.percent, &l.gpu, &l.tflops_limit, &l.percent_limit, &l.qos,
                                 &l.idle_swap, &l.idle_disk, &l.idle_zero, &l.allocation};
  size_t count = sizeof(fields) / sizeof(fields[0]);
  while (count > 0 && fields[count - 1]->empty()) --count;
  std::string canonical;
  for (size_t i = 0; i < count; ++i) {
    canonical += std::to_string(fields[i]->size()) + ":" + *fields[i] + ";";  // length-prefixed: no value can fake a split
  }
  uint8_t out[transport::kSha256Bytes];
  transport::Sha256Digest(canonical.data(), canonical.size(), out);
  return Hex(out, 16);
}

std::string TicketLimitsDigest(const std::string& id) {
  if (id.compare(0, 5, "tkt2.") != 0) return "";
  const size_t dot = id.rfind('.');
  const std::string digest = dot == std::string::npos ? "" : id.substr(dot + 1);
  return digest.size() == 32 && IsHex(digest) ? digest : "";
}

std::string MintSessionTicket(const std::string& worker_token, int64_t expires_unix_s,
                              const std::string& limits_digest) {
  if (worker_token.empty() || expires_unix_s <= 0) return "";
  if (!limits_digest.empty() && (limits_digest.size() != 32 || !IsHex(limits_digest))) return "";
  unsigned char nonce[16];
  if (!transport::internal::RandomBytes(nonce, sizeof(nonce))) return "";
  const std::string body = limits_digest.empty()
      ? "tkt1." + std::to_string(expires_unix_s) + "." + Hex(nonce, sizeof(nonce))
      : "tkt2." + std::to_string(expires_unix_s) + "." + Hex(nonce, sizeof(nonce)) + "." + limits_digest;
  const std::string mac = Mac(worker_token, body);
  return mac.empty() ? "" : body + "." + mac;
}

std::string SessionTicketKey(const std::string& worker_token, const std::string& id, int64_t now_unix_s) {
  if (worker_token.empty() || id.size() > 200) return "";
  const bool v2 = id.compare(0, 5, "tkt2.") == 0;
  if (!v2 && id.compare(0, 5, "tkt1.") != 0) return "";
  const size_t a = id.find('.', 5);
  if (a == std::string::npos || a == 5 || a - 5 > 19) return "";
  const size_t rest = id.size() - a - 1;  // nonce, then for tkt2 "." and the digest
  if (rest != (v2 ? 32 + 1 + 32 : 32) || (v2 && id[a + 1 + 32] != '.')) return "";
  const std::string expiry = id.substr(5, a - 5), nonce = id.substr(a + 1, 32);
  for (char c : expiry)
    if (c < '0' || c > '9') return "";
  if (!IsHex(nonce) || (v2 && TicketLimitsDigest(id).empty()) ||
      std::strtoll(expiry.c_str(), nullptr, 10) < now_unix_s)
    return "";
  return Mac(worker_token, id);
}

bool CheckSessionTicket(const std::string& worker_token, const std::string& presented, int64_t now_unix_s) {
  const size_t dot = presented.rfind('.');
  if (dot == std::string::npos) return false;
  const std::string mac = presented.substr(dot + 1);
  const std::string want = SessionTicketKey(worker_token, presented.substr(0, dot), now_unix_s);
  if (want.empty() || mac.size() != want.size()) return false;
  return transport::ConstantTimeEqual(reinterpret_cast<const uint8_t*>(mac.data()),
                                      reinterpret_cast<const uint8_t*>(want.data()), want.size());
}

}  // namespace tf::worker
