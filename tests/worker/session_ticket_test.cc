// Session tickets: a ticket made with the worker's token opens sessions until it expires; a
// changed character, another worker's token, an expired or malformed ticket does not.
#include "worker/session_ticket.h"

#include <gtest/gtest.h>

#include <string>

namespace tf::worker {
namespace {

constexpr int64_t kNow = 1'800'000'000;

TEST(SessionTicket, AFreshTicketOpensSessionsUntilItExpires) {
  const std::string t = MintSessionTicket("worker-secret", kNow + 60);
  ASSERT_EQ(t.compare(0, 5, "tkt1."), 0) << t;
  EXPECT_EQ(t.find("worker-secret"), std::string::npos) << "the token is not in the ticket";
  EXPECT_TRUE(CheckSessionTicket("worker-secret", t, kNow));
  EXPECT_TRUE(CheckSessionTicket("worker-secret", t, kNow + 60));
  EXPECT_FALSE(CheckSessionTicket("worker-secret", t, kNow + 61)) << "expired";
  EXPECT_NE(MintSessionTicket("worker-secret", kNow + 60), t) << "each ticket has its own nonce";
}

TEST(SessionTicket, ForgedOrForeignTicketsAreRefused) {
  const std::string t = MintSessionTicket("worker-secret", kNow + 60);
  EXPECT_FALSE(CheckSessionTicket("another-worker", t, kNow));
  // A later expiry with the old MAC.
  std::string longer = t;
  longer.replace(5, std::to_string(kNow + 60).size(), std::to_string(kNow + 99));
  EXPECT_FALSE(CheckSessionTicket("worker-secret", longer, kNow));
  // Any single changed character of the MAC or the nonce.
  for (size_t i = 16; i < t.size(); i += 7) {
    std::string bad = t;
    bad[i] = bad[i] == 'a' ? 'b' : (bad[i] == '.' ? '.' : 'a');
    if (bad == t) continue;
    EXPECT_FALSE(CheckSessionTicket("worker-secret", bad, kNow)) << i;
  }
  for (const std::string& junk : {std::string(""), std::string("worker-secret"), std::string("tkt1."),
                                  std::string("tkt1.x.y.z"), t + "0", t.substr(0, t.size() - 1),
                                  std::string("tkt1.-5.00000000000000000000000000000000.") + std::string(64, '0')}) {
    EXPECT_FALSE(CheckSessionTicket("worker-secret", junk, kNow)) << junk;
  }
  EXPECT_EQ(MintSessionTicket("", kNow + 60), "") << "a worker without a token needs no ticket";
  EXPECT_FALSE(CheckSessionTicket("", t, kNow));
}

// A tkt2 ticket names the limits it was made for under its MAC: a holder cannot change them.
TEST(SessionTicket, ATicketBoundToLimitsNamesThemAndCannotBeRebound) {
  SessionLimits l;
  l.vram = "512MiB";
  l.percent = "10";
  const std::string digest = SessionLimitsDigest(l);
  ASSERT_EQ(digest.size(), 32u);
  SessionLimits other = l;
  other.vram = "16GiB";
  EXPECT_NE(SessionLimitsDigest(other), digest);
  SessionLimits shifted;  // the same characters split across fields differently
  shifted.vram = "512MiB1";
  shifted.percent = "0";
  EXPECT_NE(SessionLimitsDigest(shifted), digest);
  const std::string t = MintSessionTicket("secret", kNow + 60, digest);
  ASSERT_EQ(t.rfind("tkt2.", 0), 0u) << t;
  EXPECT_TRUE(CheckSessionTicket("secret", t, kNow));
  const std::string id = t.substr(0, t.rfind('.'));
  EXPECT_EQ(TicketLimitsDigest(id), digest);
  // The same MAC with another digest in the id does not verify.
  const std::string rebound = id.substr(0, id.rfind('.') + 1) + SessionLimitsDigest(other) + t.substr(t.rfind('.'));
  EXPECT_FALSE(CheckSessionTicket("secret", rebound, kNow));
  EXPECT_EQ(TicketLimitsDigest(MintSessionTicket("secret", kNow + 60).substr(0, 60)), "");
  EXPECT_EQ(MintSessionTicket("secret", kNow + 60, "not-a-digest"), "");
}

}  // namespace
}  // namespace tf::worker
