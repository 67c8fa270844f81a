// SqliteStore: the embedded, single-machine Store (the default). One file, WAL journal,
// synchronous=FULL so that an acknowledged Commit survives kill -9 and power loss.
//
// Group commit: each transaction runs at once inside a SAVEPOINT of one open SQLite transaction
// (so its compares see every earlier staged write); a flusher thread COMMITs that transaction (one
// fsync) whenever something is staged, and wakes the waiters. While one batch is being synced the
// next one accumulates, so N concurrent callers share one fsync instead of paying N.
// SqliteLeaderLock: the single-leader election for it, an exclusive flock on "PATH.lock".
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "controller/store.h"

struct sqlite3;
struct sqlite3_stmt;

namespace tf::controller {

class SqliteStore : public Store {
 public:
  static StatusOr<std::unique_ptr<SqliteStore>> Open(const std::string& path);
  ~SqliteStore() override;

  StatusOr<std::optional<KeyValue>> Get(const std::string& key) override;
  StatusOr<std::vector<KeyValue>> List(const std::string& prefix) override;
  StatusOr<int64_t> Commit(const std::vector<Compare>& compares,
                           const std::vector<Write>& writes) override;
  StatusOr<int64_t> Stage(const std::vector<Compare>& compares,
                          const std::vector<Write>& writes) override;
  Status WaitDurable(int64_t revision) override;
  // Batches committed so far (for the benchmark: transactions per fsync).
  uint64_t batches() const;
  std::string Describe() const override { return "sqlite:" + path_; }

 private:
  explicit SqliteStore(std::string path) : path_(std::move(path)) {}
  Status Init();
  Status Exec(const char* sql);
  Status Error(const char* what) const;
  StatusOr<int64_t> CommitLocked(const std::vector<Compare>& compares,
                                 const std::vector<Write>& writes);
  void FlushLoop();

  const std::string path_;
  mutable std::mutex mu_;  // one connection, serialized; guards every member below
  std::condition_variable staged_cv_;   // flusher: something was staged, or stop
  std::condition_variable settled_cv_;  // waiters: a batch became durable or failed
  sqlite3* db_ = nullptr;
  int64_t revision_ = 0;  // the last staged store revision (revisions of a failed batch are skipped)
  bool txn_open_ = false;  // a batch transaction is open (BEGIN IMMEDIATE done)
  int64_t settled_ = 0;    // every revision <= this is durable or failed
  std::vector<std::pair<int64_t, int64_t>> failed_;  // revision ranges lost with a failed batch
  Status last_failure_;
  uint64_t batches_ = 0;
  bool stop_ = false;
  std::thread flusher_;
  sqlite3_stmt* get_ = nullptr;
  sqlite3_stmt* list_ = nullptr;
  sqlite3_stmt* put_ = nullptr;
  sqlite3_stmt* del_ = nullptr;
  sqlite3_stmt* set_rev_ = nullptr;
};

class SqliteLeaderLock : public LeaderElection {
 public:
  SqliteLeaderLock(std::string lock_path, std::string identity)
      : lock_path_(std::move(lock_path)), identity_(std::move(identity)) {}
  ~SqliteLeaderLock() override { Resign(); }

  StatusOr<bool> TryAcquire() override;
  bool IsLeader() const override { return fd_ >= 0; }
  std::optional<Compare> Fence() const override { return std::nullopt; }
  void Resign() override;
  std::string Identity() const override { return identity_; }

 private:
  const std::string lock_path_;
  const std::string identity_;
  int fd_ = -1;
};

}  // namespace tf::controller
