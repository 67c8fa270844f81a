// Writes the seed corpus of wire_fuzz into the directory given as argv[1]: valid frames (plain,
// with bulk, handshake frames) and valid handshake payloads, so the fuzzer starts from inputs
// that get past the checksum and magic checks.
#include <stdio.h>
#include <string.h>

#include "transport/handshake.h"
#include "transport/wire.h"

using namespace tf::transport;  // NOLINT: a tool

namespace {

bool Write(const char* dir, const char* name, const uint8_t* data, size_t n) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE* f = fopen(path, "wb");
  if (f == nullptr) return false;
  bool ok = fwrite(data, 1, n, f) == n;
  return fclose(f) == 0 && ok;
}

size_t Frame(uint16_t opcode, uint16_t flags, const uint8_t* payload, size_t len, uint8_t* out) {
  FrameHeader h;
  h.opcode = opcode;
  h.flags = flags;
  h.sequence = 7;
  h.payload_length = static_cast<uint32_t>(len);
  EncodeFrameHeader(h, out);
  memcpy(out + kFrameHeaderSize, payload, len);
  return kFrameHeaderSize + len;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const char* dir = argv[1];
  uint8_t buf[4096];
  uint8_t body[kMaxHandshakePayload];
  bool ok = true;

  ClientHello hello;
  hello.SetToken("token", 5);
  hello.SetHostId("host-1");
  hello.client_pid = 1234;
  size_t n = EncodeClientHello(hello, body, sizeof(body));
  ok &= Write(dir, "client_hello_payload", body, n);
  ok &= Write(dir, "client_hello_frame", buf,
              Frame(static_cast<uint16_t>(Opcode::kClientHello), 0, body, n, buf));

  ServerHello sh{1, kKnownFeatures, 99};
  n = EncodeServerHello(sh, body, sizeof(body));
  ok &= Write(dir, "server_hello_frame", buf,
              Frame(static_cast<uint16_t>(Opcode::kServerHello), 0, body, n, buf));

  Refusal r;
  r.Set(RefusalReason::kVersionMismatch, "client speaks [2, 3]");
  n = EncodeRefusal(r, body, sizeof(body));
  ok &= Write(dir, "refusal_payload", body, n);

  uint8_t payload[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  n = Frame(DriverCallOpcode(12), kFlagReplyExpected, payload, sizeof(payload), buf);
  ok &= Write(dir, "call_frame", buf, n);

  n = Frame(DriverCallOpcode(40), kFlagBulkFollows, payload, 4, buf);
  BulkDescriptor d;
  d.length = 32;
  EncodeBulkDescriptor(d, buf + n);
  n += kBulkDescriptorSize;
  memset(buf + n, 0xAB, 32);
  n += 32;
  ok &= Write(dir, "bulk_frame", buf, n);

  // Generated driver calls (wire_fuzz's FuzzGeneratedCall): u16 selector, then arguments naming
  // the objects its host publishes (stream 0x2000, event 0x3000) and a small value.
  for (uint16_t sel = 0; sel < 96; ++sel) {
    Writer w(buf, sizeof(buf));
    w.U16(sel);
    w.U64(sel % 2 ? 0x3000 : 0x2000);
    w.U64(sel % 2 ? 0x2000 : 0x3000);
    w.U32(sel % 3);
    char name[32];
    snprintf(name, sizeof(name), "generated_%u", static_cast<unsigned>(sel));
    ok &= Write(dir, name, buf, w.size() - (sel % 4) * 4);
  }
  return ok ? 0 : 1;
}
