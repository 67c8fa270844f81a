// libFuzzer target for everything that decodes bytes a peer controls: stream frames (header,
// payload, bulk descriptor), the three handshake payloads, and the Reader. Any crash, sanitizer
// report, or a decode/encode/decode round trip that changes a value is a bug.
//
// Built with clang++ -fsanitize=fuzzer,address by tests/fuzz/CMakeLists.txt; `ctest -R wire_fuzz`
// runs it for a bounded time from the seed corpus that wire_fuzz_seeds writes.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "transport/handshake.h"
#include "transport/wire.h"

using namespace tf::transport;  // NOLINT: a fuzz harness

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

void FuzzStreamFrame(const uint8_t* data, size_t size) {
  FrameView v;
  size_t consumed = 0;
  if (DecodeStreamFrame(data, size, &v, &consumed) != WireError::kOk) return;
  Check(consumed <= size);
  Check(v.payload + v.payload_length <= data + size);
  if (v.bulk) Check(v.bulk + v.bulk_length <= data + size);
  // Re-encoding the header reproduces the bytes exactly.
  uint8_t again[kFrameHeaderSize];
  EncodeFrameHeader(v.header, again);
  Check(memcmp(again, data, kFrameHeaderSize) == 0);
  // Every payload byte is readable.
  volatile uint8_t sink = 0;
  for (uint32_t i = 0; i < v.payload_length; ++i) sink = sink ^ v.payload[i];
}

void FuzzClientHello(const uint8_t* data, size_t size) {
  ClientHello h;
  if (DecodeClientHello(data, size, &h) != WireError::kOk) return;
  Check(h.token_length == 0 && h.credential_id_length <= kMaxCredentialIdBytes &&
        h.host_id_length <= kMaxHostIdBytes);
  ServerPolicy p;
  ServerHello ok;
  AuthKey key;
  Refusal no;
  if (NegotiateHandshake(h, p, 1, &ok, &key, &no)) {
    char msg[128];
    Check(CheckServerHello(h, ok, msg, sizeof(msg)));
  } else {
    Check(no.message_length <= kMaxRefusalMessageBytes && no.reason != 0);
  }
}

void FuzzServerReplies(const uint8_t* data, size_t size) {
  ServerHello s;
  if (DecodeServerHello(data, size, &s) == WireError::kOk) {
    uint8_t buf[96];
    Check(EncodeServerHello(s, buf, sizeof(buf)) == size && memcmp(buf, data, size) == 0);
  }
  AuthChallenge c;
  if (DecodeAuthChallenge(data, size, &c) == WireError::kOk) {
    uint8_t buf[64];
    Check(EncodeAuthChallenge(c, buf, sizeof(buf)) == size && memcmp(buf, data, size) == 0);
  }
  AuthProof pr;
  if (DecodeAuthProof(data, size, &pr) == WireError::kOk) {
    uint8_t buf[96];
    Check(EncodeAuthProof(pr, buf, sizeof(buf)) == size && memcmp(buf, data, size) == 0);
  }
  Refusal r;
  if (DecodeRefusal(data, size, &r) == WireError::kOk) {
    Check(r.message_length <= kMaxRefusalMessageBytes);
    uint8_t buf[kMaxHandshakePayload];
    Check(EncodeRefusal(r, buf, sizeof(buf)) == size && memcmp(buf, data, size) == 0);
    (void)RefusalReasonName(r.reason);
  }
}

void FuzzReader(const uint8_t* data, size_t size) {
  Reader r(data, size);
  uint8_t op;
  while (r.U8(&op)) {
    uint64_t v;
    uint32_t u;
    const uint8_t* p;
    uint32_t n;
    switch (op % 4) {
      case 0: r.U64(&v); break;
      case 1: r.U32(&u); break;
      case 2:
        if (r.Blob(&p, &n, 4096)) Check(p + n <= data + size);
        break;
      default: {
        uint8_t tmp[16];
        r.Bytes(tmp, op % 17);
      }
    }
  }
  Check(r.remaining() == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzStreamFrame(data, size);
  // A handshake frame carries its payload after the header: fuzz the payload decoders on both
  // the raw input and on what follows a header.
  FuzzClientHello(data, size);
  FuzzServerReplies(data, size);
  if (size > kFrameHeaderSize) {
    FuzzClientHello(data + kFrameHeaderSize, size - kFrameHeaderSize);
    FuzzServerReplies(data + kFrameHeaderSize, size - kFrameHeaderSize);
  }
  FuzzReader(data, size);
  return 0;
}
