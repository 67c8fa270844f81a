// HMAC-MD2 as the driver's INTEGRITY_CHECK answers it. Written from RFC 1319 (MD2) and RFC 2104
// (HMAC); the key, the record layout and the two fixed answers are from public analyses of the
// driver (docs/export-tables.md lists them).
#include "client/integrity_hash.h"

#include <cstring>

namespace tf::client::integrity {
namespace {

// RFC 1319's substitution table, built from the digits of pi.
constexpr uint8_t kPiSubst[256] = {
    41,  46,  67,  201, 162, 216, 124, 1,   61,  54,  84,  161, 236, 240, 6,   19,  98,  167, 5,
    243, 192, 199, 115, 140, 152, 147, 43,  217, 188, 76,  130, 202, 30,  155, 87,  60,  253, 212,
    224, 22,  103, 66,  111, 24,  138, 23,  229, 18,  190, 78,  196, 214, 218, 158, 222, 73,  160,
    251, 245, 142, 187, 47,  238, 122, 169, 104, 121, 145, 21,  178, 7,   63,  148, 194, 16,  137,
    11,  34,  95,  33,  128, 127, 93,  154, 90,  144, 50,  39,  53,  62,  204, 231, 191, 247, 151,
    3,   255, 25,  48,  179, 72,  165, 181, 209, 215, 94,  146, 42,  172, 86,  170, 198, 79,  184,
    56,  210, 150, 164, 125, 182, 118, 252, 107, 226, 156, 116, 4,   241, 69,  157, 112, 89,  100,
    113, 135, 32,  134, 91,  207, 101, 230, 45,  168, 2,   27,  96,  37,  173, 174, 176, 185, 246,
    28,  70,  97,  105, 52,  64,  126, 15,  85,  71,  163, 35,  221, 81,  175, 58,  195, 92,  249,
    206, 186, 197, 234, 38,  44,  83,  13,  110, 133, 40,  132, 9,   211, 223, 205, 244, 65,  129,
    77,  82,  106, 220, 55,  200, 108, 193, 171, 250, 36,  225, 123, 8,   12,  189, 177, 74,  120,
    136, 149, 139, 227, 99,  232, 109, 233, 203, 213, 254, 59,  0,   29,  57,  242, 239, 183, 14,
    102, 88,  208, 228, 166, 119, 114, 248, 235, 117, 75,  10,  49,  68,  80,  180, 143, 237, 31,
    26,  219, 153, 141, 51,  159, 17,  131, 20};

}  // namespace

const uint8_t kKey[16] = {0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52,
                          0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F};

void Md2::Reset() {
  memset(x_, 0, sizeof(x_));
  memset(c_, 0, sizeof(c_));
  memset(block_, 0, sizeof(block_));
  last_ = 0;
  n_ = 0;
}

void Md2::Compress() {
  // Checksum first (it only depends on the message bytes), then the 18 mixing rounds.
  for (int j = 0; j < 16; ++j) {
    c_[j] ^= kPiSubst[block_[j] ^ last_];
    last_ = c_[j];
  }
  for (int j = 0; j < 16; ++j) {
    x_[16 + j] = block_[j];
    x_[32 + j] = static_cast<uint8_t>(x_[j] ^ block_[j]);
  }
  uint8_t t = 0;
  for (int round = 0; round < 18; ++round) {
    for (uint8_t& b : x_) t = b ^= kPiSubst[t];
    t = static_cast<uint8_t>(t + round);
  }
}

void Md2::Update(const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    block_[n_++] = p[i];
    if (n_ == 16) {
      Compress();
      n_ = 0;
    }
  }
}

void Md2::Final(uint8_t digest[16]) {
  uint8_t pad = static_cast<uint8_t>(16 - n_);
  uint8_t padding[16];
  memset(padding, pad, sizeof(padding));
  Update(padding, pad);
  uint8_t checksum[16];
  memcpy(checksum, c_, sizeof(checksum));
  Update(checksum, sizeof(checksum));
  memcpy(digest, x_, 16);
}

void Compute(const CheckInput& input, const DeviceRecord* devices, size_t device_count,
             uint64_t out[2]) {
  switch (input.caller_version % 10) {
    case 0:
      out[0] = 0x3341181C03CB675Cull;
      out[1] = 0x8ED383AA1F4CD1E8ull;
      return;
    case 1:
      out[0] = 0x1841181C03CB675Cull;
      out[1] = 0x8ED383AA1F4CD1E8ull;
      return;
    default:
      break;
  }
  // The key is exactly one MD2 block, so HMAC uses it as it is.
  uint8_t pad[16];
  Md2 inner;
  for (int i = 0; i < 16; ++i) pad[i] = kKey[i] ^ 0x36;
  inner.Update(pad, sizeof(pad));
  inner.Update(&input, sizeof(input));
  for (size_t d = 0; d < device_count; ++d) inner.Update(&devices[d], sizeof(DeviceRecord));
  uint8_t inner_digest[16];
  inner.Final(inner_digest);
  Md2 outer;
  for (int i = 0; i < 16; ++i) pad[i] = kKey[i] ^ 0x5c;
  outer.Update(pad, sizeof(pad));
  outer.Update(inner_digest, sizeof(inner_digest));
  uint8_t digest[16];
  outer.Final(digest);
  memcpy(&out[0], digest, 8);
  memcpy(&out[1], digest + 8, 8);
}

}  // namespace tf::client::integrity
