#include "worker/session_ticket.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdio>
#include <cstdlib>

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
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &len) == nullptr) {
    return "";
  }
  return Hex(out, len);
}

bool IsHex(const std::string& s) {
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

std::string MintSessionTicket(const std::string& worker_token, int64_t expires_unix_s) {
  if (worker_token.empty() || expires_unix_s <= 0) return "";
  unsigned char nonce[16];
  if (RAND_bytes(nonce, sizeof(nonce)) != 1) return "";
  const std::string body = "tkt1." + std::to_string(expires_unix_s) + "." + Hex(nonce, sizeof(nonce));
  const std::string mac = Mac(worker_token, body);
  return mac.empty() ? "" : body + "." + mac;
}

bool CheckSessionTicket(const std::string& worker_token, const std::string& presented, int64_t now_unix_s) {
  if (worker_token.empty() || presented.size() > 200 || presented.compare(0, 5, "tkt1.") != 0) return false;
  const size_t a = presented.find('.', 5);
  if (a == std::string::npos || a == 5 || a - 5 > 19) return false;
  const size_t b = presented.find('.', a + 1);
  if (b == std::string::npos || b - a - 1 != 32) return false;
  const std::string expiry = presented.substr(5, a - 5), nonce = presented.substr(a + 1, 32);
  const std::string mac = presented.substr(b + 1);
  for (char c : expiry)
    if (c < '0' || c > '9') return false;
  if (mac.size() != 64 || !IsHex(nonce) || !IsHex(mac)) return false;
  const std::string want = Mac(worker_token, presented.substr(0, b));
  if (want.size() != mac.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < mac.size(); ++i) diff |= static_cast<unsigned char>(mac[i] ^ want[i]);
  if (diff != 0) return false;
  return std::strtoll(expiry.c_str(), nullptr, 10) >= now_unix_s;
}

}  // namespace tf::worker
