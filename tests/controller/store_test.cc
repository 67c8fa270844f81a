#include <gtest/gtest.h>

#include "controller/sqlite_store.h"
#include "controller/base64.h"
#include "test_cluster.h"

namespace tf::controller {
namespace {

TEST(Base64, RoundTrips) {
  for (std::string s : std::vector<std::string>{"", "a", "ab", "abc", "abcd", "/tf/gpus/GPU-1", std::string("\0\xff\x10", 3)}) {
    EXPECT_EQ(Base64Decode(Base64Encode(s)).value(), s);
  }
  EXPECT_EQ(Base64Encode("foo"), "Zm9v");
  EXPECT_FALSE(Base64Decode("Zm9").has_value());
}

TEST(SqliteStore, CompareAndSwapOnRevisions) {
  testing::TempDir dir;
  auto store = SqliteStore::Open(dir.path() + "/s.db");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  Store& s = **store;
  auto r1 = s.Commit({Compare::Absent("/k")}, {Write::Put("/k", "v1")});
  ASSERT_TRUE(r1.ok());
  // Creating it again must fail: it exists.
  auto again = s.Commit({Compare::Absent("/k")}, {Write::Put("/k", "other")});
  EXPECT_EQ(again.status().code(), StatusCode::kAborted);
  auto kv = s.Get("/k");
  ASSERT_TRUE(kv.ok() && kv->has_value());
  EXPECT_EQ((*kv)->value, "v1");
  EXPECT_EQ((*kv)->mod_revision, *r1);
  // A stale revision loses; the current one wins and bumps the revision.
  auto r2 = s.Commit({Compare::At("/k", *r1)}, {Write::Put("/k", "v2"), Write::Put("/j", "x")});
  ASSERT_TRUE(r2.ok());
  EXPECT_GT(*r2, *r1);
  EXPECT_EQ(s.Commit({Compare::At("/k", *r1)}, {Write::Delete("/k")}).status().code(),
            StatusCode::kAborted);
  EXPECT_EQ((*s.Get("/k"))->value, "v2");
  EXPECT_EQ((*s.Get("/k"))->create_revision, *r1);
  auto list = s.List("/");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].key, "/j");
}

TEST(SqliteStore, RevisionSurvivesReopen) {
  testing::TempDir dir;
  int64_t rev;
  {
    auto s = SqliteStore::Open(dir.path() + "/s.db");
    rev = *(*s)->Commit({}, {Write::Put("/a", "1")});
  }
  auto s = SqliteStore::Open(dir.path() + "/s.db");
  EXPECT_GT(*(*s)->Commit({}, {Write::Put("/b", "2")}), rev);
  EXPECT_EQ((*(*s)->Get("/a"))->value, "1");
}

TEST(SqliteLeaderLock, OnlyOneHolder) {
  testing::TempDir dir;
  SqliteLeaderLock a(dir.path() + "/s.db.lock", "a"), b(dir.path() + "/s.db.lock", "b");
  EXPECT_TRUE(*a.TryAcquire());
  EXPECT_FALSE(*b.TryAcquire());
  a.Resign();
  EXPECT_TRUE(*b.TryAcquire());
}

}  // namespace
}  // namespace tf::controller
