// Handshake payloads and the server's decision: what is accepted, and why anything is refused.
#include "transport/handshake.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace tf::transport {
namespace {

ClientHello MakeHello(const char* token = "s3cret") {
  ClientHello h;
  h.SetToken(token, strlen(token));
  h.SetHostId("tenant-node-7");
  h.client_pid = 4242;
  return h;
}

ServerPolicy PolicyWithToken(const char* token) {
  ServerPolicy p;
  p.token = reinterpret_cast<const uint8_t*>(token);
  p.token_length = strlen(token);
  return p;
}

TEST(HandshakeTest, ClientHelloRoundTrip) {
  ClientHello h = MakeHello();
  h.features_required = kFeatureDeferredErrors;
  uint8_t buf[kMaxHandshakePayload];
  size_t n = EncodeClientHello(h, buf, sizeof(buf));
  ASSERT_GT(n, 0u);
  ClientHello got;
  ASSERT_EQ(DecodeClientHello(buf, n, &got), WireError::kOk);
  EXPECT_EQ(got.min_version, h.min_version);
  EXPECT_EQ(got.max_version, h.max_version);
  EXPECT_EQ(got.features_supported, h.features_supported);
  EXPECT_EQ(got.features_required, kFeatureDeferredErrors);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(got.token), got.token_length), "s3cret");
  EXPECT_EQ(std::string(got.host_id, got.host_id_length), "tenant-node-7");
  EXPECT_EQ(got.client_pid, 4242u);
}

TEST(HandshakeTest, EveryTruncationAndTrailingByteIsMalformed) {
  ClientHello h = MakeHello();
  uint8_t buf[kMaxHandshakePayload];
  size_t n = EncodeClientHello(h, buf, sizeof(buf));
  for (size_t k = 0; k < n; ++k) {
    ClientHello got;
    EXPECT_EQ(DecodeClientHello(buf, k, &got), WireError::kMalformed) << k;
  }
  ClientHello got;
  EXPECT_EQ(DecodeClientHello(buf, n + 1, &got), WireError::kMalformed);

  ServerHello s{1, kKnownFeatures, 77};
  n = EncodeServerHello(s, buf, sizeof(buf));
  for (size_t k = 0; k < n; ++k) {
    ServerHello g;
    EXPECT_EQ(DecodeServerHello(buf, k, &g), WireError::kMalformed) << k;
  }
  Refusal r;
  r.Set(RefusalReason::kBadToken, "no");
  n = EncodeRefusal(r, buf, sizeof(buf));
  for (size_t k = 0; k < n; ++k) {
    Refusal g;
    EXPECT_EQ(DecodeRefusal(buf, k, &g), WireError::kMalformed) << k;
  }
}

TEST(HandshakeTest, OverlongTokenIsMalformed) {
  ClientHello got;
  std::vector<uint8_t> msg(4 + 16 + 4 + kMaxTokenBytes + 1 + 8, 0);
  msg[0] = 1;
  msg[2] = 1;
  const uint32_t len = kMaxTokenBytes + 1;  // token length prefix at offset 20
  msg[20] = static_cast<uint8_t>(len);
  msg[21] = static_cast<uint8_t>(len >> 8);
  EXPECT_EQ(DecodeClientHello(msg.data(), msg.size(), &got), WireError::kMalformed);
  EXPECT_FALSE(got.SetToken(msg.data(), kMaxTokenBytes + 1));
}

TEST(HandshakeTest, AcceptsMatchingClientAndPicksHighestCommonVersion) {
  ClientHello h = MakeHello();
  ServerPolicy p = PolicyWithToken("s3cret");
  ServerHello ok;
  Refusal no;
  ASSERT_TRUE(NegotiateHandshake(h, p, 1234, &ok, &no));
  EXPECT_EQ(ok.version, kProtocolVersionMax);
  EXPECT_EQ(ok.session_id, 1234u);
  EXPECT_EQ(ok.features, kKnownFeatures);
  char msg[128];
  EXPECT_TRUE(CheckServerHello(h, ok, msg, sizeof(msg)));
}

TEST(HandshakeTest, WrongTokenIsRefused) {
  ServerHello ok;
  Refusal no;
  EXPECT_FALSE(NegotiateHandshake(MakeHello("guess"), PolicyWithToken("s3cret"), 1, &ok, &no));
  EXPECT_EQ(no.reason, static_cast<uint16_t>(RefusalReason::kBadToken));
  // A prefix of the right token is not the token.
  EXPECT_FALSE(NegotiateHandshake(MakeHello("s3cre"), PolicyWithToken("s3cret"), 1, &ok, &no));
  EXPECT_FALSE(NegotiateHandshake(MakeHello(""), PolicyWithToken("s3cret"), 1, &ok, &no));
}

TEST(HandshakeTest, VersionMismatchIsRefusedWithBothRanges) {
  ClientHello h = MakeHello();
  h.min_version = 7;
  h.max_version = 9;
  ServerHello ok;
  Refusal no;
  ASSERT_FALSE(NegotiateHandshake(h, ServerPolicy{}, 1, &ok, &no));
  EXPECT_EQ(no.reason, static_cast<uint16_t>(RefusalReason::kVersionMismatch));
  std::string msg(no.message, no.message_length);
  EXPECT_NE(msg.find("[7, 9]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[1, 1]"), std::string::npos) << msg;
}

TEST(HandshakeTest, UnknownRequiredFeatureIsRefused) {
  ClientHello h = MakeHello();
  h.features_required = 1ull << 63;
  h.features_supported |= 1ull << 63;
  ServerHello ok;
  Refusal no;
  ASSERT_FALSE(NegotiateHandshake(h, ServerPolicy{}, 1, &ok, &no));
  EXPECT_EQ(no.reason, static_cast<uint16_t>(RefusalReason::kUnknownRequiredFeature));
  EXPECT_NE(std::string(no.message, no.message_length).find("0x8000000000000000"),
            std::string::npos);
}

// Found by wire_fuzz: such a hello used to be accepted with a feature set lacking what the
// client required, which the client then rejected.
TEST(HandshakeTest, RequiredFeatureNotInClientsOwnSupportedSetIsMalformed) {
  ClientHello h = MakeHello();
  h.features_supported = 0;
  h.features_required = kFeatureDeferredErrors;
  ServerHello ok;
  Refusal no;
  ASSERT_FALSE(NegotiateHandshake(h, ServerPolicy{}, 1, &ok, &no));
  EXPECT_EQ(no.reason, static_cast<uint16_t>(RefusalReason::kMalformedHello));
}

TEST(HandshakeTest, ServerRequiredFeatureMissingInClientIsRefused) {
  ClientHello h = MakeHello();
  h.features_supported = 0;
  ServerPolicy p;
  p.features_required = kFeatureBulkArena;
  ServerHello ok;
  Refusal no;
  ASSERT_FALSE(NegotiateHandshake(h, p, 1, &ok, &no));
  EXPECT_EQ(no.reason, static_cast<uint16_t>(RefusalReason::kMissingRequiredFeature));
}

TEST(HandshakeTest, ClientRejectsInconsistentServerHello) {
  ClientHello h = MakeHello();
  h.features_required = kFeatureBulkArena;
  char msg[128];
  EXPECT_FALSE(CheckServerHello(h, ServerHello{2, kKnownFeatures, 1}, msg, sizeof(msg)));
  EXPECT_FALSE(CheckServerHello(h, ServerHello{1, kFeatureDeferredErrors, 1}, msg, sizeof(msg)));
  EXPECT_FALSE(CheckServerHello(h, ServerHello{1, kKnownFeatures | (1ull << 40), 1}, msg,
                                sizeof(msg)));
}

}  // namespace
}  // namespace tf::transport
