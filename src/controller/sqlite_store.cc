#include "controller/sqlite_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <cstring>

namespace tf::controller {
namespace {

// Resets a prepared statement (and its bindings) when the scope ends, early returns included.
struct StmtReset {
  sqlite3_stmt* s;
  ~StmtReset() {
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
  }
};

void BindText(sqlite3_stmt* s, int i, const std::string& v) {
  sqlite3_bind_text(s, i, v.data(), static_cast<int>(v.size()), SQLITE_STATIC);
}

std::string ColumnText(sqlite3_stmt* s, int i) {
  const void* p = sqlite3_column_blob(s, i);
  int n = sqlite3_column_bytes(s, i);
  return p ? std::string(static_cast<const char*>(p), n) : std::string();
}

}  // namespace

StatusOr<SqliteDurability> ParseSqliteDurability(const std::string& text) {
  if (text == "power") return SqliteDurability::kPower;
  if (text == "process") return SqliteDurability::kProcess;
  return InvalidArgument("durability must be 'power' (every commit is fsynced: survives power loss) or "
                         "'process' (survives a crash of the controller, may lose about the last second "
                         "on power loss), not '" + text + "'");
}

const char* SqliteDurabilityName(SqliteDurability d) {
  return d == SqliteDurability::kProcess ? "process" : "power";
}

StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::Open(const std::string& path,
                                                         SqliteDurability durability) {
  std::unique_ptr<SqliteStore> s(new SqliteStore(path, durability));
  Status st = s->Init();
  if (!st.ok()) return st;
  return s;
}

Status SqliteStore::Error(sqlite3* db, const char* what) const {
  return Unavailable(std::string("sqlite ") + what + " (" + path_ + "): " + sqlite3_errmsg(db));
}

Status SqliteStore::Exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string m = err ? err : "unknown error";
    sqlite3_free(err);
    return Unavailable("sqlite: " + m + " in: " + sql);
  }
  return Status::Ok();
}

Status SqliteStore::Init() {
  const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
  if (sqlite3_open_v2(path_.c_str(), &db_, flags, nullptr) != SQLITE_OK) return Error(db_, "open");
  sqlite3_busy_timeout(db_, 5000);
  TF_RETURN_IF_ERROR(Exec(db_, "PRAGMA journal_mode=WAL"));
  TF_RETURN_IF_ERROR(Exec(db_, durability_ == SqliteDurability::kPower ? "PRAGMA synchronous=FULL"
                                                                      : "PRAGMA synchronous=NORMAL"));
  TF_RETURN_IF_ERROR(Exec(db_, "PRAGMA wal_autocheckpoint=0"));
  TF_RETURN_IF_ERROR(Exec(db_,
      "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL,"
      " create_rev INTEGER NOT NULL, mod_rev INTEGER NOT NULL) WITHOUT ROWID;"
      "CREATE TABLE IF NOT EXISTS meta (id INTEGER PRIMARY KEY CHECK (id = 1),"
      " revision INTEGER NOT NULL);"
      "INSERT OR IGNORE INTO meta (id, revision) VALUES (1, 0);"));
  if (sqlite3_open_v2(path_.c_str(), &read_db_, flags, nullptr) != SQLITE_OK)
    return Error(read_db_, "open (reader)");
  sqlite3_busy_timeout(read_db_, 5000);
  if (sqlite3_open_v2(path_.c_str(), &checkpoint_db_, flags, nullptr) != SQLITE_OK)
    return Error(checkpoint_db_, "open (checkpointer)");
  sqlite3_busy_timeout(checkpoint_db_, 1000);
  struct {
    sqlite3* db;
    sqlite3_stmt** stmt;
    const char* sql;
  } stmts[] = {
      {read_db_, &get_, "SELECT value, create_rev, mod_rev FROM kv WHERE key = ?1"},
      {read_db_, &list_,
       "SELECT key, value, create_rev, mod_rev FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key"},
      {db_, &put_,
       "INSERT INTO kv (key, value, create_rev, mod_rev) VALUES (?1, ?2, ?3, ?4)"
       " ON CONFLICT(key) DO UPDATE SET value = excluded.value, mod_rev = excluded.mod_rev"},
      {db_, &del_, "DELETE FROM kv WHERE key = ?1"},
      {db_, &set_rev_, "UPDATE meta SET revision = ?1 WHERE id = 1"},
  };
  for (auto& s : stmts) {
    if (sqlite3_prepare_v3(s.db, s.sql, -1, SQLITE_PREPARE_PERSISTENT, s.stmt, nullptr) != SQLITE_OK)
      return Error(s.db, "prepare");
  }
  sqlite3_stmt* rev = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT revision FROM meta WHERE id = 1", -1, &rev, nullptr) != SQLITE_OK)
    return Error(db_, "prepare");
  if (sqlite3_step(rev) == SQLITE_ROW) revision_ = sqlite3_column_int64(rev, 0);
  sqlite3_finalize(rev);
  settled_ = revision_;
  flusher_ = std::thread([this] { FlushLoop(); });
  checkpointer_ = std::thread([this] { CheckpointLoop(); });
  return Status::Ok();
}

SqliteStore::~SqliteStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  staged_cv_.notify_all();
  stop_cv_.notify_all();
  if (flusher_.joinable()) flusher_.join();  // commits what is staged first
  if (checkpointer_.joinable()) checkpointer_.join();
  for (sqlite3_stmt* s : {get_, list_, put_, del_, set_rev_}) sqlite3_finalize(s);
  for (sqlite3* db : {checkpoint_db_, read_db_, db_})
    if (db) sqlite3_close(db);
}

StatusOr<std::optional<KeyValue>> SqliteStore::GetLocked(const std::string& key) {
  if (auto it = overlay_.find(key); it != overlay_.end()) {
    if (it->second.deleted) return std::optional<KeyValue>();
    return std::optional<KeyValue>(
        KeyValue{key, it->second.value, it->second.create_revision, it->second.mod_revision});
  }
  StmtReset reset{get_};
  BindText(get_, 1, key);
  int rc = sqlite3_step(get_);
  if (rc == SQLITE_DONE) return std::optional<KeyValue>();
  if (rc != SQLITE_ROW) return Error(read_db_, "get");
  return std::optional<KeyValue>(KeyValue{key, ColumnText(get_, 0), sqlite3_column_int64(get_, 1),
                                          sqlite3_column_int64(get_, 2)});
}

StatusOr<std::optional<KeyValue>> SqliteStore::Get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return GetLocked(key);
}

StatusOr<std::vector<KeyValue>> SqliteStore::List(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  // Keys are compared as text: every key >= prefix and < prefix-with-0xFF-appended matches.
  const std::string end = prefix + "\xff";
  std::map<std::string, KeyValue> rows;
  {
    StmtReset reset{list_};
    BindText(list_, 1, prefix);
    BindText(list_, 2, end);
    int rc;
    while ((rc = sqlite3_step(list_)) == SQLITE_ROW) {
      KeyValue kv{ColumnText(list_, 0), ColumnText(list_, 1), sqlite3_column_int64(list_, 2),
                  sqlite3_column_int64(list_, 3)};
      std::string k = kv.key;
      rows.emplace(std::move(k), std::move(kv));
    }
    if (rc != SQLITE_DONE) return Error(read_db_, "list");
  }
  for (auto it = overlay_.lower_bound(prefix); it != overlay_.end() && it->first < end; ++it) {
    if (it->second.deleted) {
      rows.erase(it->first);
    } else {
      rows[it->first] = KeyValue{it->first, it->second.value, it->second.create_revision,
                                 it->second.mod_revision};
    }
  }
  std::vector<KeyValue> out;
  out.reserve(rows.size());
  for (auto& [k, kv] : rows) out.push_back(std::move(kv));
  return out;
}

StatusOr<int64_t> SqliteStore::Commit(const std::vector<Compare>& compares,
                                      const std::vector<Write>& writes) {
  StatusOr<int64_t> rev = Stage(compares, writes);
  if (!rev.ok()) return rev;
  TF_RETURN_IF_ERROR(WaitDurable(*rev));
  return rev;
}

StatusOr<int64_t> SqliteStore::Stage(const std::vector<Compare>& compares,
                                     const std::vector<Write>& writes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return Unavailable("sqlite store " + path_ + " is closing");
  for (const Compare& c : compares) {
    StatusOr<std::optional<KeyValue>> kv = GetLocked(c.key);
    if (!kv.ok()) return kv.status();
    const int64_t have = kv->has_value() ? (*kv)->mod_revision : 0;
    if (have != c.mod_revision) {
      return Status(StatusCode::kAborted, "compare failed on " + c.key + ": revision " +
                                              std::to_string(have) + ", expected " +
                                              std::to_string(c.mod_revision));
    }
  }
  const int64_t rev = revision_ + 1;
  for (const Write& w : writes) {
    Staged s;
    s.mod_revision = rev;
    if (w.kind == Write::Kind::kDelete) {
      s.deleted = true;
    } else {
      StatusOr<std::optional<KeyValue>> kv = GetLocked(w.key);
      if (!kv.ok()) return kv.status();
      s.value = w.value;
      s.create_revision = kv->has_value() ? (*kv)->create_revision : rev;
    }
    pending_.writes.push_back({w, s.create_revision, rev});
    overlay_[w.key] = std::move(s);
  }
  revision_ = rev;
  pending_.through = rev;
  // Nobody is woken: the caller's WaitDurable commits the batch itself (or the flusher thread
  // does within kBackstop when nobody waits).
  return rev;
}

Status SqliteStore::WaitDurable(int64_t revision) {
  std::unique_lock<std::mutex> lock(mu_);
  // Group commit without a hand-off: the first waiter that finds no commit in progress commits
  // everything staged so far on its own thread; waiters that arrive meanwhile stage into the next
  // batch and one of them commits it when this one is done. Nobody returns before the batch with
  // its revision has committed (or failed).
  while (settled_ < revision) {
    if (FlushNeededLocked()) {
      FlushLocked(lock);
    } else {
      settled_cv_.wait(lock);
    }
  }
  for (const auto& [lo, hi] : failed_)
    if (revision >= lo && revision <= hi) return last_failure_;
  return Status::Ok();
}

uint64_t SqliteStore::batches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return batches_;
}

Status SqliteStore::WriteBatch(const Batch& b) {
  TF_RETURN_IF_ERROR(Exec(db_, "BEGIN IMMEDIATE"));
  // Replaying the writes in stage order, each with its own transaction's revision, gives the
  // file exactly the state the overlay showed.
  Status st;
  for (const StagedWrite& sw : b.writes) {
    const Write& w = sw.write;
    sqlite3_stmt* s = w.kind == Write::Kind::kPut ? put_ : del_;
    StmtReset reset{s};
    BindText(s, 1, w.key);
    if (w.kind == Write::Kind::kPut) {
      sqlite3_bind_blob(s, 2, w.value.data(), static_cast<int>(w.value.size()), SQLITE_STATIC);
      sqlite3_bind_int64(s, 3, sw.create_revision);
      sqlite3_bind_int64(s, 4, sw.mod_revision);
    }
    if (sqlite3_step(s) != SQLITE_DONE) {
      st = Error(db_, "write");
      break;
    }
  }
  if (st.ok()) {
    StmtReset reset{set_rev_};
    sqlite3_bind_int64(set_rev_, 1, b.through);
    if (sqlite3_step(set_rev_) != SQLITE_DONE) st = Error(db_, "revision");
  }
  if (st.ok()) st = Exec(db_, "COMMIT");
  if (!st.ok()) Exec(db_, "ROLLBACK");
  return st;
}

bool SqliteStore::FlushNeededLocked() const {
  return !flushing_ && (!pending_.writes.empty() || pending_.through > settled_);
}

void SqliteStore::FlushLocked(std::unique_lock<std::mutex>& lock) {
  flushing_ = true;
  Batch batch = std::move(pending_);
  pending_ = Batch{};
  pending_.through = batch.through;
  lock.unlock();
  // The fsync happens here, without mu_: stagers keep staging and form the next batch.
  Status st = WriteBatch(batch);
  lock.lock();
  if (st.ok()) {
    // Overlay entries now in the file (and not overwritten since) are read from the file.
    for (const StagedWrite& w : batch.writes) {
      auto it = overlay_.find(w.write.key);
      if (it != overlay_.end() && it->second.mod_revision <= batch.through) overlay_.erase(it);
    }
  } else {
    // Lost: this batch, and everything staged after it (it may depend on the lost writes).
    failed_.emplace_back(settled_ + 1, revision_);
    last_failure_ = Unavailable("sqlite commit failed, transaction lost: " + st.message());
    overlay_.clear();
    pending_ = Batch{};
    pending_.through = revision_;
    batch.through = revision_;
  }
  settled_ = batch.through;
  ++batches_;
  flushing_ = false;
  settled_cv_.notify_all();
}

void SqliteStore::FlushLoop() {
  // The backstop for writes staged without anyone waiting for them (and what is staged at
  // shutdown): committed within kBackstop. Waiters commit their own batches (WaitDurable).
  constexpr auto kBackstop = std::chrono::milliseconds(10);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (FlushNeededLocked()) {
      FlushLocked(lock);
      continue;
    }
    if (stop_ && !flushing_) return;
    staged_cv_.wait_for(lock, kBackstop);
  }
}

void SqliteStore::CheckpointLoop() {
  // PASSIVE: copies what it can without blocking the writer; the writer restarts the WAL from
  // its beginning once everything was copied. Once a second: a hot row (a GPU, the revision)
  // rewritten many times is copied once, and the copy's fsyncs stay off the commit path.
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    stop_cv_.wait_for(lock, std::chrono::milliseconds(1000), [&] { return stop_; });
    if (stop_) break;
    lock.unlock();
    sqlite3_wal_checkpoint_v2(checkpoint_db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
    lock.lock();
  }
}

StatusOr<bool> SqliteLeaderLock::TryAcquire() {
  if (fd_ >= 0) return true;
  int fd = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Unavailable("open " + lock_path_ + ": " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return false;  // another controller holds this store
  }
  if (::ftruncate(fd, 0) == 0) {
    std::string line = identity_ + "\n";
    [[maybe_unused]] ssize_t n = ::write(fd, line.data(), line.size());
  }
  fd_ = fd;
  return true;
}

std::string SqliteLeaderLock::CurrentLeader() const {
  if (fd_ >= 0) return identity_;
  const int fd = ::open(lock_path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string leader;
  if (::flock(fd, LOCK_SH | LOCK_NB) == 0) {
    ::flock(fd, LOCK_UN);  // nobody holds it: no leader
  } else {
    char buf[256];
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    if (n > 0) {
      leader.assign(buf, static_cast<size_t>(n));
      leader = leader.substr(0, leader.find('\n'));
      if (std::any_of(leader.begin(), leader.end(), [](char c) { return c < 0x20 || c > 0x7e; }))
        leader.clear();  // not an identity a replica wrote
    }
  }
  ::close(fd);
  return leader;
}

void SqliteLeaderLock::Resign() {
  const int fd = fd_.exchange(-1);
  if (fd < 0) return;
  ::flock(fd, LOCK_UN);
  ::close(fd);
}

}  // namespace tf::controller
