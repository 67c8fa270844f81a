// Wire format of the remote vGPU protocol: opcodes, the frame header, the bulk descriptor, and a
// bounds-checked Reader/Writer for payloads. docs/protocol.md is the prose version of this file;
// the two change together.
//
// Every multi-byte field is fixed-width little-endian and encoded byte by byte, so the format does
// not depend on the compiler's struct layout or the host's byte order. Nothing here allocates,
// throws or logs; decoders return a WireError and never read outside the bytes they were given.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tf::transport {

// Bytes 'T' 'F' 'R' 'M' on the wire.
inline constexpr uint32_t kFrameMagic = 0x4D524654;

// Protocol versions this build speaks; the handshake picks one version inside both sides'
// ranges. Version 2: the client proves it holds the credential by challenge-response instead of
// sending it (docs/protocol.md, "Handshake"); version 1 clients are refused.
inline constexpr uint16_t kProtocolVersionMin = 2;
inline constexpr uint16_t kProtocolVersionMax = 2;
// Handshake frames (hellos, challenge, proof, refusal) always carry version 1 in their header, so
// that a client of any version can read why it was refused. Frames outside
// [kFrameVersionMin, kProtocolVersionMax] are rejected.
inline constexpr uint16_t kHandshakeFrameVersion = 1;
inline constexpr uint16_t kFrameVersionMin = 1;

inline constexpr size_t kFrameHeaderSize = 28;
inline constexpr size_t kBulkDescriptorSize = 24;
// Largest payload of one frame. Larger data (module images, copies) travels as bulk.
inline constexpr uint32_t kMaxPayloadBytes = 1u << 20;
// Largest bulk buffer of one frame on any transport; a transport may allow less
// (Transport::max_bulk_bytes()). Callers split larger copies into slices.
inline constexpr uint64_t kMaxBulkBytes = 64ull << 20;

// Opcodes have fixed numeric values; never renumber, never reuse a retired value.
//   0x0001-0x00FF  control messages
//   0x0100-0x7FFF  driver calls: 0x0100 + the generator's stable id of the entry point
//   0x8000-0xFFFF  replies and server-pushed events
enum class Opcode : uint16_t {
  kClientHello = 0x0001,
  kPing = 0x0002,
  kGoodbye = 0x0003,
  kAuthProof = 0x0004,      // handshake (v2): the client's nonce and proof

  kServerHello = 0x8001,
  kHandshakeRefused = 0x8002,
  kPong = 0x8003,
  kCallReply = 0x8004,   // reply to a driver call (reply-expected frame), same sequence
  kAsyncError = 0x8005,  // event: an async call failed; carries its sequence and CUresult
  kAuthChallenge = 0x8006,  // handshake (v2): the server's nonce
};

inline constexpr uint16_t kControlFirst = 0x0001;
inline constexpr uint16_t kControlLast = 0x00FF;
inline constexpr uint16_t kDriverCallFirst = 0x0100;
inline constexpr uint16_t kDriverCallLast = 0x7FFF;
inline constexpr uint16_t kReplyFirst = 0x8000;
inline constexpr uint16_t kMaxDriverCallId = kDriverCallLast - kDriverCallFirst;

constexpr bool IsControlOpcode(uint16_t op) { return op >= kControlFirst && op <= kControlLast; }
constexpr bool IsDriverCallOpcode(uint16_t op) {
  return op >= kDriverCallFirst && op <= kDriverCallLast;
}
constexpr bool IsReplyOrEventOpcode(uint16_t op) { return op >= kReplyFirst; }
// REQUIRES: generated_id <= kMaxDriverCallId.
constexpr uint16_t DriverCallOpcode(uint16_t generated_id) {
  return static_cast<uint16_t>(kDriverCallFirst + generated_id);
}
// REQUIRES: IsDriverCallOpcode(op).
constexpr uint16_t DriverCallId(uint16_t op) { return static_cast<uint16_t>(op - kDriverCallFirst); }

// Frame flags. Unknown bits are rejected (new meanings arrive behind a feature bit).
inline constexpr uint16_t kFlagReplyExpected = 1u << 0;  // the sender waits for a reply
inline constexpr uint16_t kFlagError = 1u << 1;          // a reply or event reporting failure
inline constexpr uint16_t kFlagBulkFollows = 1u << 2;    // a bulk descriptor follows the payload
inline constexpr uint16_t kKnownFlags = kFlagReplyExpected | kFlagError | kFlagBulkFollows;

enum class WireError : uint8_t {
  kOk = 0,
  kTruncated,         // fewer bytes than the structure needs
  kBadMagic,
  kBadChecksum,
  kBadVersion,        // outside [kFrameVersionMin, kProtocolVersionMax]
  kBadFlags,          // an unknown flag bit
  kReservedNonZero,
  kPayloadTooLarge,   // payload_length > kMaxPayloadBytes (or the caller's smaller limit)
  kBulkTooLarge,
  kMalformed,         // a payload that does not parse (bad length prefix, trailing bytes, ...)
};

// Stable lower-case name ("bad_magic"). Never null.
const char* WireErrorName(WireError e);

// The fields of a frame header a caller chooses. magic, reserved and the checksum are implied.
struct FrameHeader {
  uint16_t version = kProtocolVersionMax;
  uint16_t opcode = 0;
  uint16_t flags = 0;
  uint64_t sequence = 0;
  uint32_t payload_length = 0;
};

// Header layout (little-endian):
//   0 u32 magic | 4 u16 version | 6 u16 opcode | 8 u16 flags | 10 u16 reserved (0)
//   12 u64 sequence | 20 u32 payload_length | 24 u32 crc32c of bytes 0..23
void EncodeFrameHeader(const FrameHeader& h, uint8_t out[kFrameHeaderSize]);
// Checks, in order: size, magic, checksum, version, flags, reserved, payload_length against
// max_payload (itself capped at kMaxPayloadBytes). On failure *out is unspecified.
WireError DecodeFrameHeader(const uint8_t* data, size_t size, FrameHeader* out,
                            uint32_t max_payload = kMaxPayloadBytes);

// Follows the payload when kFlagBulkFollows is set. On TCP the bulk bytes follow the descriptor
// inline and arena_offset is 0; on shared memory the bytes live in the sender's half of the bulk
// arena at arena_offset (bytes from the arena's start).
//   0 u64 length | 8 u64 arena_offset | 16 u32 reserved (0) | 20 u32 crc32c of bytes 0..19
struct BulkDescriptor {
  uint64_t length = 0;
  uint64_t arena_offset = 0;
};
void EncodeBulkDescriptor(const BulkDescriptor& d, uint8_t out[kBulkDescriptorSize]);
WireError DecodeBulkDescriptor(const uint8_t* data, size_t size, BulkDescriptor* out,
                               uint64_t max_bulk = kMaxBulkBytes);

// A whole frame decoded from one contiguous buffer laid out as on a stream transport:
// header, payload, then (kFlagBulkFollows) descriptor and `length` bulk bytes. The views point
// into the caller's buffer.
struct FrameView {
  FrameHeader header;
  const uint8_t* payload = nullptr;
  uint32_t payload_length = 0;
  const uint8_t* bulk = nullptr;
  uint64_t bulk_length = 0;
};
// On kOk, *consumed is the frame's total size (the buffer may hold more frames after it).
// kTruncated means "need more bytes"; every other error is final for the connection.
WireError DecodeStreamFrame(const uint8_t* data, size_t size, FrameView* out, size_t* consumed,
                            uint32_t max_payload = kMaxPayloadBytes,
                            uint64_t max_bulk = kMaxBulkBytes);

// CRC-32C (Castagnoli), as used by iSCSI and ext4; crc32c("123456789") == 0xE3069283.
uint32_t Crc32c(const uint8_t* data, size_t size);

// Appends little-endian fields to a caller-owned buffer. Writing past the capacity sets a sticky
// failure (ok() false) instead of overflowing; check ok() once at the end.
class Writer {
 public:
  Writer(uint8_t* buf, size_t capacity) : buf_(buf), cap_(capacity) {}

  void U8(uint8_t v);
  void U16(uint16_t v);
  void U32(uint32_t v);
  void U64(uint64_t v);
  void I32(int32_t v) { U32(static_cast<uint32_t>(v)); }
  void I64(int64_t v) { U64(static_cast<uint64_t>(v)); }
  void Bytes(const void* data, size_t n);
  // u32 length, then the bytes.
  void Blob(const void* data, uint32_t n);

  bool ok() const { return ok_; }
  size_t size() const { return len_; }
  const uint8_t* data() const { return buf_; }

 private:
  uint8_t* Reserve(size_t n);

  uint8_t* buf_;
  size_t cap_;
  size_t len_ = 0;
  bool ok_ = true;
};

// Reads little-endian fields from a byte view. Every read is checked: a read past the end fails,
// zeroes its output and makes every later read fail too (sticky), so a decoder can read a whole
// message and check ok() once. A message is well-formed only if it was consumed exactly
// (Finish()).
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool U8(uint8_t* v);
  bool U16(uint16_t* v);
  bool U32(uint32_t* v);
  bool U64(uint64_t* v);
  bool I32(int32_t* v);
  bool I64(int64_t* v);
  bool Bytes(void* out, size_t n);
  // A u32 length prefix, then that many bytes, which must not exceed max_len. *data is a view
  // into the reader's buffer.
  bool Blob(const uint8_t** data, uint32_t* len, uint32_t max_len);

  bool ok() const { return ok_; }
  size_t remaining() const { return ok_ ? size_ - pos_ : 0; }
  // True iff every read succeeded and all bytes were consumed.
  bool Finish() const { return ok_ && pos_ == size_; }

 private:
  const uint8_t* Take(size_t n);

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace tf::transport
