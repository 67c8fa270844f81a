// The frame format: round trips, and rejection of every malformed input a peer could send.
#include "transport/wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace tf::transport {
namespace {

std::vector<uint8_t> EncodeStreamFrame(const FrameHeader& h, const std::vector<uint8_t>& payload,
                                       const std::vector<uint8_t>& bulk) {
  std::vector<uint8_t> out(kFrameHeaderSize);
  FrameHeader hh = h;
  hh.payload_length = static_cast<uint32_t>(payload.size());
  if (!bulk.empty()) hh.flags |= kFlagBulkFollows;
  EncodeFrameHeader(hh, out.data());
  out.insert(out.end(), payload.begin(), payload.end());
  if (!bulk.empty()) {
    uint8_t d[kBulkDescriptorSize];
    BulkDescriptor bd;
    bd.length = bulk.size();
    EncodeBulkDescriptor(bd, d);
    out.insert(out.end(), d, d + sizeof(d));
    out.insert(out.end(), bulk.begin(), bulk.end());
  }
  return out;
}

// Rewrites the header checksum after a test tampered with a field, so that the field's own
// check is what rejects it.
void Reseal(std::vector<uint8_t>* f) {
  uint32_t crc = Crc32c(f->data(), 24);
  for (int i = 0; i < 4; ++i) (*f)[24 + i] = static_cast<uint8_t>(crc >> (8 * i));
}

TEST(Crc32cTest, KnownVector) {
  EXPECT_EQ(Crc32c(reinterpret_cast<const uint8_t*>("123456789"), 9), 0xE3069283u);
}

TEST(OpcodeTest, RangesAreFixed) {
  EXPECT_EQ(static_cast<uint16_t>(Opcode::kClientHello), 0x0001);
  EXPECT_EQ(static_cast<uint16_t>(Opcode::kServerHello), 0x8001);
  EXPECT_TRUE(IsControlOpcode(0x0001));
  EXPECT_FALSE(IsControlOpcode(0x0100));
  EXPECT_EQ(DriverCallOpcode(0), 0x0100);
  EXPECT_EQ(DriverCallOpcode(kMaxDriverCallId), 0x7FFF);
  EXPECT_TRUE(IsDriverCallOpcode(DriverCallOpcode(42)));
  EXPECT_EQ(DriverCallId(DriverCallOpcode(42)), 42);
  EXPECT_TRUE(IsReplyOrEventOpcode(static_cast<uint16_t>(Opcode::kCallReply)));
  EXPECT_FALSE(IsReplyOrEventOpcode(0x7FFF));
}

TEST(FrameHeaderTest, RoundTripIsLittleEndian) {
  FrameHeader h;
  h.opcode = 0x1234;
  h.flags = kFlagReplyExpected;
  h.sequence = 0x0102030405060708ull;
  h.payload_length = 77;
  uint8_t buf[kFrameHeaderSize];
  EncodeFrameHeader(h, buf);
  EXPECT_EQ(buf[0], 'T');
  EXPECT_EQ(buf[3], 'M');
  EXPECT_EQ(buf[6], 0x34);
  EXPECT_EQ(buf[7], 0x12);
  EXPECT_EQ(buf[12], 0x08);
  EXPECT_EQ(buf[19], 0x01);
  FrameHeader got;
  ASSERT_EQ(DecodeFrameHeader(buf, sizeof(buf), &got), WireError::kOk);
  EXPECT_EQ(got.opcode, h.opcode);
  EXPECT_EQ(got.flags, h.flags);
  EXPECT_EQ(got.sequence, h.sequence);
  EXPECT_EQ(got.payload_length, 77u);
  EXPECT_EQ(got.version, kProtocolVersionMax);
}

TEST(StreamFrameTest, RoundTripWithPayloadAndBulk) {
  FrameHeader h;
  h.opcode = DriverCallOpcode(7);
  h.sequence = 99;
  std::vector<uint8_t> payload = {1, 2, 3, 4, 5};
  std::vector<uint8_t> bulk(1000, 0xAB);
  auto f = EncodeStreamFrame(h, payload, bulk);
  f.push_back(0xEE);  // the start of the next frame stays unconsumed
  FrameView v;
  size_t consumed = 0;
  ASSERT_EQ(DecodeStreamFrame(f.data(), f.size(), &v, &consumed), WireError::kOk);
  EXPECT_EQ(consumed, f.size() - 1);
  EXPECT_EQ(v.payload_length, 5u);
  EXPECT_EQ(0, memcmp(v.payload, payload.data(), 5));
  EXPECT_EQ(v.bulk_length, 1000u);
  EXPECT_EQ(v.bulk[999], 0xAB);
}

TEST(StreamFrameTest, EveryTruncationIsRejectedAsTruncated) {
  FrameHeader h;
  h.opcode = DriverCallOpcode(1);
  auto f = EncodeStreamFrame(h, std::vector<uint8_t>(40, 7), std::vector<uint8_t>(100, 9));
  for (size_t n = 0; n < f.size(); ++n) {
    std::vector<uint8_t> cut(f.begin(), f.begin() + static_cast<long>(n));
    FrameView v;
    size_t consumed = 0;
    EXPECT_EQ(DecodeStreamFrame(cut.data(), cut.size(), &v, &consumed), WireError::kTruncated)
        << "length " << n;
  }
}

TEST(StreamFrameTest, BadMagicChecksumVersionFlagsReservedAreRejected) {
  FrameHeader h;
  h.opcode = 5;
  auto good = EncodeStreamFrame(h, {1, 2}, {});
  FrameView v;
  size_t c;

  auto f = good;
  f[0] = 'X';
  EXPECT_EQ(DecodeStreamFrame(f.data(), f.size(), &v, &c), WireError::kBadMagic);

  f = good;
  f[13] ^= 1;  // sequence bit flip without resealing
  EXPECT_EQ(DecodeStreamFrame(f.data(), f.size(), &v, &c), WireError::kBadChecksum);

  for (uint16_t version : {uint16_t{0}, uint16_t{kProtocolVersionMax + 1}, uint16_t{0xFFFF}}) {
    f = good;
    f[4] = static_cast<uint8_t>(version);
    f[5] = static_cast<uint8_t>(version >> 8);
    Reseal(&f);
    EXPECT_EQ(DecodeStreamFrame(f.data(), f.size(), &v, &c), WireError::kBadVersion) << version;
  }

  f = good;
  f[9] = 0x80;  // unknown flag bit 15
  Reseal(&f);
  EXPECT_EQ(DecodeStreamFrame(f.data(), f.size(), &v, &c), WireError::kBadFlags);

  f = good;
  f[10] = 1;
  Reseal(&f);
  EXPECT_EQ(DecodeStreamFrame(f.data(), f.size(), &v, &c), WireError::kReservedNonZero);
}

TEST(StreamFrameTest, OversizeLengthsAreRejectedBeforeAnyAllocation) {
  FrameHeader h;
  h.payload_length = kMaxPayloadBytes + 1;
  uint8_t buf[kFrameHeaderSize];
  EncodeFrameHeader(h, buf);
  FrameHeader got;
  EXPECT_EQ(DecodeFrameHeader(buf, sizeof(buf), &got), WireError::kPayloadTooLarge);
  h.payload_length = 0xFFFFFFFFu;
  EncodeFrameHeader(h, buf);
  EXPECT_EQ(DecodeFrameHeader(buf, sizeof(buf), &got), WireError::kPayloadTooLarge);
  // A caller's smaller limit (a handshake) applies too.
  h.payload_length = 2000;
  EncodeFrameHeader(h, buf);
  EXPECT_EQ(DecodeFrameHeader(buf, sizeof(buf), &got, 1024), WireError::kPayloadTooLarge);

  uint8_t d[kBulkDescriptorSize];
  BulkDescriptor bd;
  bd.length = kMaxBulkBytes + 1;
  EncodeBulkDescriptor(bd, d);
  BulkDescriptor gotd;
  EXPECT_EQ(DecodeBulkDescriptor(d, sizeof(d), &gotd), WireError::kBulkTooLarge);
  bd.length = 1 << 20;
  EncodeBulkDescriptor(bd, d);
  d[3] ^= 0x10;
  EXPECT_EQ(DecodeBulkDescriptor(d, sizeof(d), &gotd), WireError::kBadChecksum);
}

TEST(StreamFrameTest, ArenaOffsetOnAStreamIsMalformed) {
  FrameHeader h;
  h.flags = kFlagBulkFollows;
  std::vector<uint8_t> f(kFrameHeaderSize + kBulkDescriptorSize + 4);
  EncodeFrameHeader(h, f.data());
  BulkDescriptor bd;
  bd.length = 4;
  bd.arena_offset = 4096;
  EncodeBulkDescriptor(bd, f.data() + kFrameHeaderSize);
  FrameView v;
  size_t c;
  EXPECT_EQ(DecodeStreamFrame(f.data(), f.size(), &v, &c), WireError::kMalformed);
}

TEST(ReaderWriterTest, RoundTripAndStickyOverflow) {
  uint8_t buf[32];
  Writer w(buf, sizeof(buf));
  w.U8(1);
  w.U16(0x0203);
  w.U32(0x04050607);
  w.U64(0x08090A0B0C0D0E0Full);
  w.I32(-5);
  w.Blob("hey", 3);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w.size(), 1u + 2 + 4 + 8 + 4 + 4 + 3);
  w.U64(1);  // 26 + 8 > 32
  EXPECT_FALSE(w.ok());
  w.U8(1);  // sticky
  EXPECT_FALSE(w.ok());

  Reader r(buf, 26);
  uint8_t a;
  uint16_t b;
  uint32_t c;
  uint64_t d;
  int32_t e;
  const uint8_t* p;
  uint32_t n;
  EXPECT_TRUE(r.U8(&a) && r.U16(&b) && r.U32(&c) && r.U64(&d) && r.I32(&e));
  EXPECT_TRUE(r.Blob(&p, &n, 16));
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 0x0203);
  EXPECT_EQ(c, 0x04050607u);
  EXPECT_EQ(d, 0x08090A0B0C0D0E0Full);
  EXPECT_EQ(e, -5);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(p), n), "hey");
  EXPECT_TRUE(r.Finish());
  EXPECT_FALSE(r.U8(&a));
  EXPECT_EQ(a, 0);
  EXPECT_FALSE(r.ok());
}

TEST(ReaderWriterTest, BlobLengthBeyondDataOrLimitFails) {
  uint8_t buf[8] = {0xFF, 0xFF, 0xFF, 0x7F, 1, 2, 3, 4};  // claims 2 GiB
  Reader r(buf, sizeof(buf));
  const uint8_t* p;
  uint32_t n;
  EXPECT_FALSE(r.Blob(&p, &n, 0xFFFFFFFFu));
  EXPECT_EQ(p, nullptr);
  uint8_t small[8] = {4, 0, 0, 0, 1, 2, 3, 4};
  Reader r2(small, sizeof(small));
  EXPECT_FALSE(r2.Blob(&p, &n, 3));  // over the caller's limit
  Reader r3(small, 6);
  uint8_t out[16];
  EXPECT_FALSE(r3.Bytes(out, 7));
}

}  // namespace
}  // namespace tf::transport
