// SqliteStore: the embedded, single-machine Store (the default). One file, WAL journal,
// synchronous=FULL so that an acknowledged Commit survives kill -9 and power loss.
// SqliteLeaderLock: the single-leader election for it, an exclusive flock on "PATH.lock".
#pragma once

#include <mutex>
#include <string>

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
  std::string Describe() const override { return "sqlite:" + path_; }

 private:
  explicit SqliteStore(std::string path) : path_(std::move(path)) {}
  Status Init();
  Status Exec(const char* sql);
  Status Error(const char* what) const;
  StatusOr<int64_t> CommitLocked(const std::vector<Compare>& compares,
                                 const std::vector<Write>& writes);

  const std::string path_;
  std::mutex mu_;  // one connection, serialized; guards every member below
  sqlite3* db_ = nullptr;
  int64_t revision_ = 0;  // the last committed store revision
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
