// SqliteStore: the embedded, single-machine Store (the default). One file, WAL journal.
//
// Durability (SqliteDurability, `--durability`):
//  - kPower (default): synchronous=FULL. Every batch's COMMIT fsyncs the WAL before anyone is
//    acknowledged: an acknowledged write survives kill -9, an OS crash and power loss.
//  - kProcess: synchronous=NORMAL. A batch's COMMIT writes its WAL frames with write(2) (they
//    are in the kernel's page cache when anyone is acknowledged) and fsyncs only when the WAL is
//    checkpointed (the checkpointer below, about once a second). An acknowledged write survives
//    kill -9 or any crash of this process; an OS crash or power loss may lose the writes
//    acknowledged since the last checkpoint (about the last second), never corrupting the file:
//    what survives is a prefix of the transactions, so allocations and GPU usage still agree.
// SqliteLeaderLock: the single-leader election for it, an exclusive flock on "PATH.lock".
//
// Group commit. Stage checks a transaction's compares against the latest state (the file plus
// the overlay of staged, not yet durable writes), puts its writes into the overlay and queues
// it; it never waits for the disk. WaitDurable: the first waiter that finds no commit in
// progress takes everything queued, writes it to the file in one SQLite transaction and COMMITs
// (one fsync) on its own thread, then wakes the other waiters (no hand-off to another thread: two
// context switches fewer per call). While one batch syncs the next accumulates, and one of its
// waiters commits it next, so concurrent callers share an fsync and nobody stages behind one.
// A flusher thread commits, within 10 ms, what was staged without anyone waiting for it.
// Reads (Get, List, compares) go through a second connection plus the overlay.
// Checkpoints (copying the WAL into the database file, more fsyncs) never run inside a commit:
// auto-checkpoint is off and a third connection checkpoints PASSIVE-ly every second.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <atomic>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "controller/store.h"

struct sqlite3;
struct sqlite3_stmt;

namespace tf::controller {

enum class SqliteDurability { kPower, kProcess };
// "power" or "process" (what `--durability` takes); kInvalidArgument otherwise.
StatusOr<SqliteDurability> ParseSqliteDurability(const std::string& text);
const char* SqliteDurabilityName(SqliteDurability d);

class SqliteStore : public Store {
 public:
  static StatusOr<std::unique_ptr<SqliteStore>> Open(
      const std::string& path, SqliteDurability durability = SqliteDurability::kPower);
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
  SqliteDurability durability() const { return durability_; }

 private:
  struct Staged {  // a key's latest staged (not yet durable) state
    bool deleted = false;
    std::string value;
    int64_t create_revision = 0;
    int64_t mod_revision = 0;
  };
  struct StagedWrite {
    Write write;
    int64_t create_revision = 0;  // puts: of the key (kept when the key exists)
    int64_t mod_revision = 0;     // the revision of its transaction
  };
  struct Batch {
    std::vector<StagedWrite> writes;  // in stage order
    int64_t through = 0;              // the last revision it contains
  };

  SqliteStore(std::string path, SqliteDurability durability)
      : path_(std::move(path)), durability_(durability) {}
  Status Init();
  Status Exec(sqlite3* db, const char* sql);
  Status Error(sqlite3* db, const char* what) const;
  // The key's current state: overlay, else the file. REQUIRES mu_.
  StatusOr<std::optional<KeyValue>> GetLocked(const std::string& key);
  Status WriteBatch(const Batch& b);  // the flushing thread only: BEGIN, writes, COMMIT
  // Whether something staged is not yet durable and nobody is committing it. REQUIRES mu_.
  bool FlushNeededLocked() const;
  // Commits everything staged so far as one batch on the calling thread (mu_ released during
  // the write and fsync), then wakes the waiters. REQUIRES `lock` holds mu_ and
  // FlushNeededLocked().
  void FlushLocked(std::unique_lock<std::mutex>& lock);
  void FlushLoop();
  void CheckpointLoop();

  const std::string path_;
  const SqliteDurability durability_;
  mutable std::mutex mu_;  // guards every member below except the writer connection
  std::condition_variable staged_cv_;   // flusher thread: stop
  std::condition_variable settled_cv_;  // waiters: a batch became durable or failed
  std::condition_variable stop_cv_;     // checkpointer: stop
  sqlite3* read_db_ = nullptr;           // Get/List/compares, under mu_
  sqlite3_stmt* get_ = nullptr;
  sqlite3_stmt* list_ = nullptr;
  std::map<std::string, Staged> overlay_;  // staged or in-flight writes, by key
  Batch pending_;                          // staged, not yet being committed
  int64_t revision_ = 0;   // the last staged revision (a failed batch's revisions are skipped)
  int64_t settled_ = 0;    // every revision <= this is durable or failed
  std::vector<std::pair<int64_t, int64_t>> failed_;  // revision ranges lost with a failed batch
  Status last_failure_;
  uint64_t batches_ = 0;
  bool stop_ = false;
  bool flushing_ = false;  // a thread is writing a batch (one at a time: batches commit in order)

  // The writer connection: only the thread that set flushing_ uses it (after Init).
  sqlite3* db_ = nullptr;
  sqlite3_stmt* put_ = nullptr;
  sqlite3_stmt* del_ = nullptr;
  sqlite3_stmt* set_rev_ = nullptr;
  std::thread flusher_;
  sqlite3* checkpoint_db_ = nullptr;  // only the checkpointer thread
  std::thread checkpointer_;
};

class SqliteLeaderLock : public LeaderElection {
 public:
  SqliteLeaderLock(std::string lock_path, std::string identity)
      : lock_path_(std::move(lock_path)), identity_(std::move(identity)) {}
  ~SqliteLeaderLock() override { Resign(); }

  StatusOr<bool> TryAcquire() override;
  bool IsLeader() const override { return fd_.load() >= 0; }
  std::optional<Compare> Fence() const override { return std::nullopt; }
  void Resign() override;
  std::string Identity() const override { return identity_; }
  // The identity of the replica that holds the lock (it writes it into the lock file), "" when
  // none does or it cannot be read.
  std::string CurrentLeader() const;

 private:
  const std::string lock_path_;
  const std::string identity_;
  std::atomic<int> fd_{-1};  // written by the election, read by request threads (CurrentLeader)
};

}  // namespace tf::controller
