// The handshake's own SHA-256 and HMAC-SHA256: the published test vectors (FIPS 180-2 examples,
// RFC 4231) and agreement with OpenSSL on random keys and messages of every length around the
// block boundaries.
#include "transport/sha256.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <random>
#include <string>
#include <vector>

namespace tf::transport {
namespace {

std::string Hex(const uint8_t* p, size_t n) {
  static const char kHex[] = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += kHex[p[i] >> 4];
    s += kHex[p[i] & 15];
  }
  return s;
}

std::string Sha(const std::string& m) {
  uint8_t d[kSha256Bytes];
  Sha256Digest(m.data(), m.size(), d);
  return Hex(d, sizeof(d));
}

std::string Hmac(const std::string& key, const std::string& m) {
  uint8_t d[kSha256Bytes];
  HmacSha256(key.data(), key.size(), m.data(), m.size(), d);
  return Hex(d, sizeof(d));
}

TEST(Sha256Test, Fips180Examples) {
  EXPECT_EQ(Sha(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, Rfc4231HmacTestCases) {
  // Test cases 1-4, 6 and 7 of RFC 4231 section 4 (HMAC-SHA-256); case 5 compares 128 bits.
  EXPECT_EQ(Hmac(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(Hmac("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(Hmac(std::string(20, '\xaa'), std::string(50, '\xdd')),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4 += static_cast<char>(i);
  EXPECT_EQ(Hmac(key4, std::string(50, '\xcd')),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  EXPECT_EQ(Hmac(std::string(20, '\x0c'), "Test With Truncation").substr(0, 32),
            "a3b6167473100ee06e0c796c2955552b");
  EXPECT_EQ(Hmac(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  EXPECT_EQ(Hmac(std::string(131, '\xaa'),
                 "This is a test using a larger than block-size key and a larger than block-size "
                 "data. The key needs to be hashed before being used by the HMAC algorithm."),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST(Sha256Test, AgreesWithOpenSsl) {
  std::mt19937 rng(42);
  for (size_t len = 0; len < 300; ++len) {
    std::vector<uint8_t> msg(len), key(len % 150);
    for (auto& b : msg) b = static_cast<uint8_t>(rng());
    for (auto& b : key) b = static_cast<uint8_t>(rng());
    uint8_t ours[kSha256Bytes], theirs[EVP_MAX_MD_SIZE];
    Sha256Digest(msg.data(), msg.size(), ours);
    SHA256(msg.data(), msg.size(), theirs);
    ASSERT_EQ(Hex(ours, 32), Hex(theirs, 32)) << "sha256 of " << len << " bytes";
    unsigned theirs_len = 0;
    HmacSha256(key.data(), key.size(), msg.data(), msg.size(), ours);
    static const uint8_t kEmpty = 0;  // OpenSSL refuses a null key, even of length 0
    HMAC(EVP_sha256(), key.empty() ? &kEmpty : key.data(), static_cast<int>(key.size()),
         msg.empty() ? &kEmpty : msg.data(), msg.size(), theirs, &theirs_len);
    ASSERT_EQ(theirs_len, 32u);
    ASSERT_EQ(Hex(ours, 32), Hex(theirs, 32)) << "hmac of " << len << " bytes, key " << key.size();
  }
}

TEST(Sha256Test, HmacOverPartsEqualsHmacOverTheirConcatenation) {
  uint8_t a[kSha256Bytes], b[kSha256Bytes];
  const ByteSpan parts[] = {{"tfusion ", 8}, {"", 0}, {"auth v2", 7}};
  HmacSha256("k", 1, parts, 3, a);
  HmacSha256("k", 1, "tfusion auth v2", 15, b);
  EXPECT_EQ(Hex(a, 32), Hex(b, 32));
  EXPECT_TRUE(ConstantTimeEqual(a, b, 32));
  b[31] ^= 1;
  EXPECT_FALSE(ConstantTimeEqual(a, b, 32));
}

}  // namespace
}  // namespace tf::transport
