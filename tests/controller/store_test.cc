#include <gtest/gtest.h>
#include <sqlite3.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "controller/latency_histogram.h"
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

// Reads `key` from the file through a connection of its own (what a restarted controller sees).
std::string ValueInFile(const std::string& path, const std::string& key) {
  sqlite3* db = nullptr;
  std::string out = "<absent>";
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, "SELECT value FROM kv WHERE key = ?1", -1, &st, nullptr) == SQLITE_OK) {
      sqlite3_bind_text(st, 1, key.c_str(), -1, SQLITE_TRANSIENT);
      if (sqlite3_step(st) == SQLITE_ROW)
        out.assign(static_cast<const char*>(sqlite3_column_blob(st, 0)), sqlite3_column_bytes(st, 0));
      sqlite3_finalize(st);
    }
  }
  sqlite3_close(db);
  return out;
}

// Waiters commit their own batches; many concurrent callers share commits, and each is in the
// file when its Commit returns.
TEST(SqliteStore, ConcurrentCommitsAreInTheFileWhenAcknowledged) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/s.db";
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  constexpr int kThreads = 8, kEach = 40;
  std::atomic<int> missing{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        const std::string key = "/k/" + std::to_string(t) + "-" + std::to_string(i);
        if (!(*store)->Commit({Compare::Absent(key)}, {Write::Put(key, "v")}).ok() ||
            ValueInFile(path, key) != "v")
          ++missing;
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(missing.load(), 0);
  EXPECT_LE((*store)->batches(), static_cast<uint64_t>(kThreads * kEach));
}

// A write staged without anyone waiting for it still reaches the file (the flusher thread).
TEST(SqliteStore, AWriteNobodyWaitsForIsCommittedSoon) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/s.db";
  auto store = SqliteStore::Open(path);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Stage({}, {Write::Put("/lonely", "1")}).ok());
  std::string seen;
  for (int i = 0; i < 100 && (seen = ValueInFile(path, "/lonely")) != "1"; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(seen, "1");
  ASSERT_TRUE((*store)->Stage({}, {Write::Put("/at-close", "2")}).ok());
  store->reset();  // closing commits what is staged
  EXPECT_EQ(ValueInFile(path, "/at-close"), "2");
}

TEST(LatencyHistogram, QuantilesAreWithinABucketOfTheTruth) {
  LatencyHistogram h;
  EXPECT_EQ(h.Quantile(0.99), 0);
  for (int i = 1; i <= 1000; ++i) h.Record(i * 1e-5);  // 10 us .. 10 ms
  EXPECT_EQ(h.Count(), 1000u);
  EXPECT_NEAR(h.Quantile(0.5), 5e-3, 5e-3 * 0.1);
  EXPECT_NEAR(h.Quantile(0.99), 9.9e-3, 9.9e-3 * 0.1);
  EXPECT_GE(h.Quantile(1.0), 1e-2);
  tf::prom::Exposition e;
  h.WriteTo(&e, "x_seconds", {{"stage", "a"}});
  std::string text = e.Take();
  EXPECT_NE(text.find("x_seconds_bucket{stage=\"a\",le=\"+Inf\"} 1000\n"), std::string::npos) << text;
  EXPECT_NE(text.find("x_seconds_count{stage=\"a\"} 1000\n"), std::string::npos) << text;
  h.Reset();
  EXPECT_EQ(h.Count(), 0u);
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
