// The session handle table: what a client can and cannot do with the names it was given.
#include "worker/session_handles.h"

#include <gtest/gtest.h>

#include <set>

namespace tf::worker {
namespace {

constexpr uint64_t kRealStream = 0x55550000a000;  // shaped like heap pointers
constexpr uint64_t kRealEvent = 0x55550000b000;

TEST(HandleTable, NamesAreNeitherPointersNorTheSpecialStreams) {
  HandleTable t(1234);
  const uint64_t s = t.Publish(HandleKind::kStream, kRealStream);
  EXPECT_NE(s, kRealStream);
  EXPECT_GT(s, 2u);
  EXPECT_TRUE(HandleTable::LooksLikeName(s));
  EXPECT_FALSE(HandleTable::LooksLikeName(kRealStream));
  // Not a canonical x86-64/aarch64 user or kernel address: bits 47-63 are not all equal.
  const uint64_t high = s >> 47;
  EXPECT_NE(high, 0u);
  EXPECT_NE(high, (1ull << 17) - 1);
  uint64_t real = 0;
  ASSERT_TRUE(t.Resolve(HandleKind::kStream, s, &real));
  EXPECT_EQ(real, kRealStream);
  for (uint64_t special : {0ull, 1ull, 2ull}) {
    EXPECT_EQ(t.Publish(HandleKind::kStream, special), special);
    ASSERT_TRUE(t.Resolve(HandleKind::kStream, special, &real));
    EXPECT_EQ(real, special);
  }
  EXPECT_EQ(t.Publish(HandleKind::kEvent, 0), 0u);
  EXPECT_FALSE(t.Resolve(HandleKind::kEvent, 0, &real));
  EXPECT_FALSE(t.Resolve(HandleKind::kContext, 1, &real));
}

TEST(HandleTable, SameObjectSameNameUntilRetiredThenNeverAgain) {
  HandleTable t(99);
  const uint64_t a = t.Publish(HandleKind::kFunction, kRealStream);
  EXPECT_EQ(t.Publish(HandleKind::kFunction, kRealStream), a);
  uint64_t w = 0;
  ASSERT_TRUE(t.WireOf(HandleKind::kFunction, kRealStream, &w));
  EXPECT_EQ(w, a);
  EXPECT_TRUE(t.Retire(HandleKind::kFunction, a));
  uint64_t real = 0;
  EXPECT_FALSE(t.Resolve(HandleKind::kFunction, a, &real));  // stale
  EXPECT_FALSE(t.Retire(HandleKind::kFunction, a));
  EXPECT_FALSE(t.WireOf(HandleKind::kFunction, kRealStream, &w));
  // The driver hands out the same address again (a new object): a new name, the old one stays dead.
  std::set<uint64_t> seen{a};
  for (int i = 0; i < 1000; ++i) {
    const uint64_t n = t.Publish(HandleKind::kFunction, kRealStream);
    EXPECT_TRUE(seen.insert(n).second) << "name reused after retire";
    EXPECT_FALSE(t.Resolve(HandleKind::kFunction, a, &real));
    ASSERT_TRUE(t.RetireReal(HandleKind::kFunction, kRealStream));
  }
  EXPECT_EQ(t.Live(HandleKind::kFunction), 0u);
}

TEST(HandleTable, ANameOfAnotherKindFails) {
  HandleTable t(7);
  const uint64_t s = t.Publish(HandleKind::kStream, kRealStream);
  const uint64_t e = t.Publish(HandleKind::kEvent, kRealEvent);
  uint64_t real = 0;
  EXPECT_FALSE(t.Resolve(HandleKind::kEvent, s, &real));
  EXPECT_FALSE(t.Resolve(HandleKind::kStream, e, &real));
  EXPECT_FALSE(t.Retire(HandleKind::kEvent, s));
  // The same real value may be two kinds' objects (a kernel and a function): two names.
  const uint64_t k = t.Publish(HandleKind::kKernel, kRealStream);
  EXPECT_NE(k, s);
  ASSERT_TRUE(t.Resolve(HandleKind::kKernel, k, &real));
  EXPECT_EQ(real, kRealStream);
  ASSERT_TRUE(t.Resolve(HandleKind::kStream, s, &real));
  EXPECT_EQ(real, kRealStream);
}

TEST(HandleTable, ANameOfAnotherSessionOrAForgedOneFails) {
  HandleTable a(0x1111), b(0x2222);
  const uint64_t na = a.Publish(HandleKind::kStream, kRealStream);
  const uint64_t nb = b.Publish(HandleKind::kStream, kRealStream);
  EXPECT_NE(na, nb);
  uint64_t real = 0;
  EXPECT_FALSE(b.Resolve(HandleKind::kStream, na, &real));
  EXPECT_FALSE(a.Resolve(HandleKind::kStream, nb, &real));
  // Forged: the real pointer, a neighbour slot, flipped check bits, an out-of-range index.
  EXPECT_FALSE(a.Resolve(HandleKind::kStream, kRealStream, &real));
  EXPECT_FALSE(a.Resolve(HandleKind::kStream, na + 1, &real));
  EXPECT_FALSE(a.Resolve(HandleKind::kStream, na ^ (1ull << 30), &real));
  EXPECT_FALSE(a.Resolve(HandleKind::kStream, (na & ~0xffffffull) | 0xfffff0, &real));
  // Two tables with random salts disagree too.
  HandleTable r1, r2;
  const uint64_t n1 = r1.Publish(HandleKind::kEvent, kRealEvent);
  EXPECT_FALSE(r2.Resolve(HandleKind::kEvent, n1, &real));
}

TEST(HandleTable, ManyLiveHandlesResolveToTheirOwnObjects) {
  HandleTable t(5);
  std::vector<uint64_t> names;
  for (uint64_t i = 0; i < 100000; ++i) names.push_back(t.Publish(HandleKind::kGraphNode, 0x1000 + i * 16));
  for (uint64_t i = 0; i < names.size(); i += 2) ASSERT_TRUE(t.Retire(HandleKind::kGraphNode, names[i]));
  uint64_t real = 0;
  for (uint64_t i = 0; i < names.size(); ++i) {
    const bool live = i % 2 == 1;
    ASSERT_EQ(t.Resolve(HandleKind::kGraphNode, names[i], &real), live);
    if (live) {
      EXPECT_EQ(real, 0x1000 + i * 16);
    }
  }
  EXPECT_EQ(t.Live(HandleKind::kGraphNode), 50000u);
}

}  // namespace
}  // namespace tf::worker
