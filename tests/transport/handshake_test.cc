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

// As the server sees it: encoded and decoded.
ClientHello OnTheWire(const ClientHello& h) {
  uint8_t buf[kMaxHandshakePayload];
  ClientHello got;
  EXPECT_EQ(DecodeClientHello(buf, EncodeClientHello(h, buf, sizeof(buf)), &got), WireError::kOk);
  return got;
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
  // The token itself never goes on the wire: the hello names no credential id for it.
  EXPECT_EQ(got.token_length, 0u);
  EXPECT_EQ(got.credential_id_length, 0u);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buf), n).find("s3cret"), std::string::npos);
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

TEST(HandshakeTest, ASessionTicketSendsItsIdAndKeepsItsMac) {
  const std::string ticket = "tkt1.1900000000.0123456789abcdef0123456789abcdef.feedc0de";
  ClientHello h = MakeHello(ticket.c_str());
  uint8_t buf[kMaxHandshakePayload];
  size_t n = EncodeClientHello(h, buf, sizeof(buf));
  ASSERT_GT(n, 0u);
  ClientHello got;
  ASSERT_EQ(DecodeClientHello(buf, n, &got), WireError::kOk);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(got.credential_id), got.credential_id_length),
            "tkt1.1900000000.0123456789abcdef0123456789abcdef");
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buf), n).find("feedc0de"), std::string::npos);
  CredentialParts parts = SplitCredential(h.token, h.token_length);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(parts.key), parts.key_length), "feedc0de");
  // Anything else is a token, all of it key.
  const char* token = "tkt1.not-a-ticket";
  parts = SplitCredential(reinterpret_cast<const uint8_t*>(token), strlen(token));
  EXPECT_EQ(parts.id_length, 0u);
  EXPECT_EQ(parts.key_length, strlen(token));
}

TEST(HandshakeTest, ChallengeAndProofRoundTripAndRejectTruncation) {
  AuthChallenge c;
  for (size_t i = 0; i < sizeof(c.server_nonce); ++i) c.server_nonce[i] = static_cast<uint8_t>(i);
  AuthProof p;
  for (size_t i = 0; i < sizeof(p.mac); ++i) p.mac[i] = static_cast<uint8_t>(255 - i);
  uint8_t buf[kMaxHandshakePayload];
  size_t n = EncodeAuthChallenge(c, buf, sizeof(buf));
  ASSERT_EQ(n, 32u);
  AuthChallenge c2;
  ASSERT_EQ(DecodeAuthChallenge(buf, n, &c2), WireError::kOk);
  EXPECT_EQ(memcmp(c.server_nonce, c2.server_nonce, 32), 0);
  EXPECT_EQ(DecodeAuthChallenge(buf, n - 1, &c2), WireError::kMalformed);
  n = EncodeAuthProof(p, buf, sizeof(buf));
  ASSERT_EQ(n, 64u);
  AuthProof p2;
  ASSERT_EQ(DecodeAuthProof(buf, n, &p2), WireError::kOk);
  EXPECT_EQ(memcmp(p.mac, p2.mac, 32), 0);
  EXPECT_EQ(DecodeAuthProof(buf, n + 1, &p2), WireError::kMalformed);
}

TEST(HandshakeTest, OnlyTheRightKeyMakesTheProofAndItIsBoundToBothNonces) {
  ClientHello h = MakeHello();
  uint8_t hello[kMaxHandshakePayload];
  size_t n = EncodeClientHello(h, hello, sizeof(hello));
  AuthChallenge c;
  c.server_nonce[0] = 1;
  uint8_t client_nonce[kAuthNonceBytes] = {2};
  uint8_t t[32], right[32], wrong[32], prefix[32];
  AuthTranscript(hello, n, c, client_nonce, t);
  ClientAuthMac(reinterpret_cast<const uint8_t*>("s3cret"), 6, t, right);
  ClientAuthMac(reinterpret_cast<const uint8_t*>("guess!"), 6, t, wrong);
  ClientAuthMac(reinterpret_cast<const uint8_t*>("s3cre"), 5, t, prefix);
  EXPECT_NE(memcmp(right, wrong, 32), 0);
  EXPECT_NE(memcmp(right, prefix, 32), 0);
  // Another challenge (a replay meets a fresh nonce) gives another proof.
  c.server_nonce[0] = 9;
  uint8_t t2[32], replayed[32];
  AuthTranscript(hello, n, c, client_nonce, t2);
  ClientAuthMac(reinterpret_cast<const uint8_t*>("s3cret"), 6, t2, replayed);
  EXPECT_NE(memcmp(right, replayed, 32), 0);
  // The server's mac differs from the client's and covers what was negotiated.
  ServerHello a{2, kKnownFeatures, 77};
  ServerHello b{2, kFeatureDeferredErrors, 77};
  uint8_t sa[32], sb[32];
  ServerAuthMac(reinterpret_cast<const uint8_t*>("s3cret"), 6, t, a, sa);
  ServerAuthMac(reinterpret_cast<const uint8_t*>("s3cret"), 6, t, b, sb);
  EXPECT_NE(memcmp(sa, right, 32), 0);
  EXPECT_NE(memcmp(sa, sb, 32), 0);
}

TEST(HandshakeTest, AcceptsMatchingClientAndPicksHighestCommonVersion) {
  ClientHello h = MakeHello();
  ServerPolicy p = PolicyWithToken("s3cret");
  ServerHello ok;
  AuthKey key;
  Refusal no;
  ASSERT_TRUE(NegotiateHandshake(h, p, 1234, &ok, &key, &no));
  EXPECT_TRUE(key.check);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(key.bytes), key.length), "s3cret");
  EXPECT_EQ(ok.version, kProtocolVersionMax);
  EXPECT_EQ(ok.session_id, 1234u);
  EXPECT_EQ(ok.features, kKnownFeatures);
  char msg[128];
  EXPECT_TRUE(CheckServerHello(h, ok, msg, sizeof(msg)));
}

TEST(HandshakeTest, ATicketIdIsLookedUpAndAnUnknownOneIsRefused) {
  ServerPolicy p = PolicyWithToken("s3cret");
  p.credential_key = [](const uint8_t* id, size_t n, AuthKey* key, void*) {
    if (std::string(reinterpret_cast<const char*>(id), n) != "tkt1.1.aa") return false;
    memcpy(key->bytes, "mac", 3);
    key->length = 3;
    return true;
  };
  ServerHello ok;
  AuthKey key;
  Refusal no;
  ASSERT_TRUE(NegotiateHandshake(OnTheWire(MakeHello("tkt1.1.aa.mac")), p, 1, &ok, &key, &no));
  EXPECT_EQ(std::string(reinterpret_cast<char*>(key.bytes), key.length), "mac");
  ClientHello decoded = OnTheWire(MakeHello("tkt1.2.bb.mac"));
  EXPECT_FALSE(NegotiateHandshake(decoded, p, 1, &ok, &key, &no));
  EXPECT_EQ(no.reason, static_cast<uint16_t>(RefusalReason::kBadToken));
  // A server without a token takes any client and checks no proof.
  ASSERT_TRUE(NegotiateHandshake(decoded, ServerPolicy{}, 1, &ok, &key, &no));
  EXPECT_FALSE(key.check);
}

TEST(HandshakeTest, VersionMismatchIsRefusedWithBothRanges) {
  ClientHello h = MakeHello();
  h.min_version = 7;
  h.max_version = 9;
  ServerHello ok;
  AuthKey key;
  Refusal no;
  ASSERT_FALSE(NegotiateHandshake(h, ServerPolicy{}, 1, &ok, &key, &no));
  EXPECT_EQ(no.reason, static_cast<uint16_t>(RefusalReason::kVersionMismatch));
  std::string msg(no.message, no.message_length);
  EXPECT_NE(msg.find("[7, 9]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 2]"), std::string::npos) << msg;
  // A version 1 client (it sent its token in clear) is refused before anything else.
  h.min_version = h.max_version = 1;
  ASSERT_FALSE(NegotiateHandshake(h, PolicyWithToken("s3cret"), 1, &ok, &key, &no));
  EXPECT_EQ(no.reason, static_cast<uint16_t>(RefusalReason::kVersionMismatch));
}

TEST(HandshakeTest, UnknownRequiredFeatureIsRefused) {
  ClientHello h = MakeHello();
  h.features_required = 1ull << 63;
  h.features_supported |= 1ull << 63;
  ServerHello ok;
  AuthKey key;
  Refusal no;
  ASSERT_FALSE(NegotiateHandshake(h, ServerPolicy{}, 1, &ok, &key, &no));
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
  AuthKey key;
  Refusal no;
  ASSERT_FALSE(NegotiateHandshake(h, ServerPolicy{}, 1, &ok, &key, &no));
  EXPECT_EQ(no.reason, static_cast<uint16_t>(RefusalReason::kMalformedHello));
}

TEST(HandshakeTest, ServerRequiredFeatureMissingInClientIsRefused) {
  ClientHello h = MakeHello();
  h.features_supported = 0;
  ServerPolicy p;
  p.features_required = kFeatureBulkArena;
  ServerHello ok;
  AuthKey key;
  Refusal no;
  ASSERT_FALSE(NegotiateHandshake(h, p, 1, &ok, &key, &no));
  EXPECT_EQ(no.reason, static_cast<uint16_t>(RefusalReason::kMissingRequiredFeature));
}

TEST(HandshakeTest, ClientRejectsInconsistentServerHello) {
  ClientHello h = MakeHello();
  h.features_required = kFeatureBulkArena;
  char msg[128];
  EXPECT_FALSE(CheckServerHello(h, ServerHello{3, kKnownFeatures, 1}, msg, sizeof(msg)));
  EXPECT_FALSE(CheckServerHello(h, ServerHello{2, kFeatureDeferredErrors, 1}, msg, sizeof(msg)));
  EXPECT_FALSE(CheckServerHello(h, ServerHello{2, kKnownFeatures | (1ull << 40), 1}, msg,
                                sizeof(msg)));
}

}  // namespace
}  // namespace tf::transport
