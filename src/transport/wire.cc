#include "transport/wire.h"

#include <array>
#include <cstring>

namespace tf::transport {
namespace {

constexpr std::array<uint32_t, 256> MakeCrc32cTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = MakeCrc32cTable();

void PutU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t GetU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

const char* WireErrorName(WireError e) {
  switch (e) {
    case WireError::kOk: return "ok";
    case WireError::kTruncated: return "truncated";
    case WireError::kBadMagic: return "bad_magic";
    case WireError::kBadChecksum: return "bad_checksum";
    case WireError::kBadVersion: return "bad_version";
    case WireError::kBadFlags: return "bad_flags";
    case WireError::kReservedNonZero: return "reserved_nonzero";
    case WireError::kPayloadTooLarge: return "payload_too_large";
    case WireError::kBulkTooLarge: return "bulk_too_large";
    case WireError::kMalformed: return "malformed";
  }
  return "unknown";
}

uint32_t Crc32c(const uint8_t* data, size_t size) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) c = kCrc32cTable[(c ^ data[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

void EncodeFrameHeader(const FrameHeader& h, uint8_t out[kFrameHeaderSize]) {
  PutU32(out + 0, kFrameMagic);
  PutU16(out + 4, h.version);
  PutU16(out + 6, h.opcode);
  PutU16(out + 8, h.flags);
  PutU16(out + 10, 0);
  PutU64(out + 12, h.sequence);
  PutU32(out + 20, h.payload_length);
  PutU32(out + 24, Crc32c(out, 24));
}

WireError DecodeFrameHeader(const uint8_t* data, size_t size, FrameHeader* out,
                            uint32_t max_payload) {
  if (size < kFrameHeaderSize) return WireError::kTruncated;
  if (GetU32(data) != kFrameMagic) return WireError::kBadMagic;
  if (GetU32(data + 24) != Crc32c(data, 24)) return WireError::kBadChecksum;
  out->version = GetU16(data + 4);
  out->opcode = GetU16(data + 6);
  out->flags = GetU16(data + 8);
  out->sequence = GetU64(data + 12);
  out->payload_length = GetU32(data + 20);
  if (out->version < kFrameVersionMin || out->version > kProtocolVersionMax) {
    return WireError::kBadVersion;
  }
  if ((out->flags & ~kKnownFlags) != 0) return WireError::kBadFlags;
  if (GetU16(data + 10) != 0) return WireError::kReservedNonZero;
  if (max_payload > kMaxPayloadBytes) max_payload = kMaxPayloadBytes;
  if (out->payload_length > max_payload) return WireError::kPayloadTooLarge;
  return WireError::kOk;
}

void EncodeBulkDescriptor(const BulkDescriptor& d, uint8_t out[kBulkDescriptorSize]) {
  PutU64(out + 0, d.length);
  PutU64(out + 8, d.arena_offset);
  PutU32(out + 16, 0);
  PutU32(out + 20, Crc32c(out, 20));
}

WireError DecodeBulkDescriptor(const uint8_t* data, size_t size, BulkDescriptor* out,
                               uint64_t max_bulk) {
  if (size < kBulkDescriptorSize) return WireError::kTruncated;
  if (GetU32(data + 20) != Crc32c(data, 20)) return WireError::kBadChecksum;
  if (GetU32(data + 16) != 0) return WireError::kReservedNonZero;
  out->length = GetU64(data);
  out->arena_offset = GetU64(data + 8);
  if (max_bulk > kMaxBulkBytes) max_bulk = kMaxBulkBytes;
  if (out->length > max_bulk) return WireError::kBulkTooLarge;
  return WireError::kOk;
}

WireError DecodeStreamFrame(const uint8_t* data, size_t size, FrameView* out, size_t* consumed,
                            uint32_t max_payload, uint64_t max_bulk) {
  WireError e = DecodeFrameHeader(data, size, &out->header, max_payload);
  if (e != WireError::kOk) return e;
  size_t pos = kFrameHeaderSize;
  if (size - pos < out->header.payload_length) return WireError::kTruncated;
  out->payload = data + pos;
  out->payload_length = out->header.payload_length;
  pos += out->header.payload_length;
  out->bulk = nullptr;
  out->bulk_length = 0;
  if (out->header.flags & kFlagBulkFollows) {
    BulkDescriptor d;
    e = DecodeBulkDescriptor(data + pos, size - pos, &d, max_bulk);
    if (e != WireError::kOk) return e;
    // A stream carries the bytes inline; an arena offset here is a sender bug.
    if (d.arena_offset != 0) return WireError::kMalformed;
    pos += kBulkDescriptorSize;
    if (size - pos < d.length) return WireError::kTruncated;
    out->bulk = data + pos;
    out->bulk_length = d.length;
    pos += d.length;
  }
  *consumed = pos;
  return WireError::kOk;
}

uint8_t* Writer::Reserve(size_t n) {
  if (!ok_ || cap_ - len_ < n) {
    ok_ = false;
    return nullptr;
  }
  uint8_t* p = buf_ + len_;
  len_ += n;
  return p;
}

void Writer::U8(uint8_t v) {
  if (uint8_t* p = Reserve(1)) *p = v;
}
void Writer::U16(uint16_t v) {
  if (uint8_t* p = Reserve(2)) PutU16(p, v);
}
void Writer::U32(uint32_t v) {
  if (uint8_t* p = Reserve(4)) PutU32(p, v);
}
void Writer::U64(uint64_t v) {
  if (uint8_t* p = Reserve(8)) PutU64(p, v);
}
void Writer::Bytes(const void* data, size_t n) {
  if (n == 0) return;
  if (uint8_t* p = Reserve(n)) memcpy(p, data, n);
}
void Writer::Blob(const void* data, uint32_t n) {
  U32(n);
  Bytes(data, n);
}

const uint8_t* Reader::Take(size_t n) {
  if (!ok_ || size_ - pos_ < n) {
    ok_ = false;
    return nullptr;
  }
  const uint8_t* p = data_ + pos_;
  pos_ += n;
  return p;
}

bool Reader::U8(uint8_t* v) {
  const uint8_t* p = Take(1);
  *v = p ? *p : 0;
  return p != nullptr;
}
bool Reader::U16(uint16_t* v) {
  const uint8_t* p = Take(2);
  *v = p ? GetU16(p) : 0;
  return p != nullptr;
}
bool Reader::U32(uint32_t* v) {
  const uint8_t* p = Take(4);
  *v = p ? GetU32(p) : 0;
  return p != nullptr;
}
bool Reader::U64(uint64_t* v) {
  const uint8_t* p = Take(8);
  *v = p ? GetU64(p) : 0;
  return p != nullptr;
}
bool Reader::I32(int32_t* v) {
  uint32_t u;
  bool ok = U32(&u);
  *v = static_cast<int32_t>(u);
  return ok;
}
bool Reader::I64(int64_t* v) {
  uint64_t u;
  bool ok = U64(&u);
  *v = static_cast<int64_t>(u);
  return ok;
}
bool Reader::Bytes(void* out, size_t n) {
  const uint8_t* p = Take(n);
  if (p == nullptr) {
    if (n) memset(out, 0, n);
    return false;
  }
  if (n) memcpy(out, p, n);
  return true;
}
bool Reader::Blob(const uint8_t** data, uint32_t* len, uint32_t max_len) {
  *data = nullptr;
  *len = 0;
  uint32_t n;
  if (!U32(&n)) return false;
  if (n > max_len) {
    ok_ = false;
    return false;
  }
  const uint8_t* p = Take(n);
  if (p == nullptr) return false;
  *data = p;
  *len = n;
  return true;
}

}  // namespace tf::transport
