// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), written here so that the handshake's
// challenge-response needs no OpenSSL: the client stub links only libc. Test vectors: FIPS 180-2
// examples and RFC 4231 (tests/transport/sha256_test.cc, which also compares with OpenSSL).
//
// Not constant-time with respect to the message length (only lengths, never key bytes, steer
// branches). Thread safety: a Sha256 object is used by one thread; the free functions keep no
// state.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tf::transport {

inline constexpr size_t kSha256Bytes = 32;

class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t n);
  // Writes the digest; the object must not be updated afterwards.
  void Final(uint8_t out[kSha256Bytes]);

 private:
  void Block(const uint8_t* p);

  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buffered_ = 0;
  uint64_t total_ = 0;  // bytes hashed so far
};

void Sha256Digest(const void* data, size_t n, uint8_t out[kSha256Bytes]);

// HMAC-SHA256 over the concatenation of `parts` (count entries of data/length), keyed with key.
struct ByteSpan {
  const void* data;
  size_t size;
};
void HmacSha256(const void* key, size_t key_len, const ByteSpan* parts, size_t count,
                uint8_t out[kSha256Bytes]);
inline void HmacSha256(const void* key, size_t key_len, const void* data, size_t n,
                       uint8_t out[kSha256Bytes]) {
  ByteSpan part{data, n};
  HmacSha256(key, key_len, &part, 1, out);
}

// Compares two equal-length byte strings without an early exit.
bool ConstantTimeEqual(const uint8_t* a, const uint8_t* b, size_t n);

}  // namespace tf::transport
