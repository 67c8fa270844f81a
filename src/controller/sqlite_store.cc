#include "controller/sqlite_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

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

StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::Open(const std::string& path) {
  std::unique_ptr<SqliteStore> s(new SqliteStore(path));
  Status st = s->Init();
  if (!st.ok()) return st;
  return s;
}

Status SqliteStore::Error(const char* what) const {
  return Unavailable(std::string("sqlite ") + what + " (" + path_ + "): " + sqlite3_errmsg(db_));
}

Status SqliteStore::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string m = err ? err : "unknown error";
    sqlite3_free(err);
    return Unavailable("sqlite: " + m + " in: " + sql);
  }
  return Status::Ok();
}

Status SqliteStore::Init() {
  if (sqlite3_open_v2(path_.c_str(), &db_,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                      nullptr) != SQLITE_OK) {
    return Error("open");
  }
  sqlite3_busy_timeout(db_, 5000);
  TF_RETURN_IF_ERROR(Exec("PRAGMA journal_mode=WAL"));
  TF_RETURN_IF_ERROR(Exec("PRAGMA synchronous=FULL"));
  TF_RETURN_IF_ERROR(Exec(
      "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL,"
      " create_rev INTEGER NOT NULL, mod_rev INTEGER NOT NULL) WITHOUT ROWID;"
      "CREATE TABLE IF NOT EXISTS meta (id INTEGER PRIMARY KEY CHECK (id = 1),"
      " revision INTEGER NOT NULL);"
      "INSERT OR IGNORE INTO meta (id, revision) VALUES (1, 0);"));
  struct {
    sqlite3_stmt** stmt;
    const char* sql;
  } stmts[] = {
      {&get_, "SELECT value, create_rev, mod_rev FROM kv WHERE key = ?1"},
      {&list_,
       "SELECT key, value, create_rev, mod_rev FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key"},
      {&put_,
       "INSERT INTO kv (key, value, create_rev, mod_rev) VALUES (?1, ?2, ?3, ?3)"
       " ON CONFLICT(key) DO UPDATE SET value = excluded.value, mod_rev = excluded.mod_rev"},
      {&del_, "DELETE FROM kv WHERE key = ?1"},
      {&set_rev_, "UPDATE meta SET revision = ?1 WHERE id = 1"},
  };
  for (auto& s : stmts) {
    if (sqlite3_prepare_v3(db_, s.sql, -1, SQLITE_PREPARE_PERSISTENT, s.stmt, nullptr) != SQLITE_OK)
      return Error("prepare");
  }
  sqlite3_stmt* rev = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT revision FROM meta WHERE id = 1", -1, &rev, nullptr) !=
      SQLITE_OK)
    return Error("prepare");
  if (sqlite3_step(rev) == SQLITE_ROW) revision_ = sqlite3_column_int64(rev, 0);
  sqlite3_finalize(rev);
  settled_ = revision_;
  flusher_ = std::thread([this] { FlushLoop(); });
  return Status::Ok();
}

SqliteStore::~SqliteStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  staged_cv_.notify_all();
  if (flusher_.joinable()) flusher_.join();  // commits what is staged first
  for (sqlite3_stmt* s : {get_, list_, put_, del_, set_rev_}) sqlite3_finalize(s);
  if (db_) sqlite3_close(db_);
}

StatusOr<std::optional<KeyValue>> SqliteStore::Get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  StmtReset reset{get_};
  BindText(get_, 1, key);
  int rc = sqlite3_step(get_);
  if (rc == SQLITE_DONE) return std::optional<KeyValue>();
  if (rc != SQLITE_ROW) return Error("get");
  return std::optional<KeyValue>(KeyValue{key, ColumnText(get_, 0), sqlite3_column_int64(get_, 1),
                                          sqlite3_column_int64(get_, 2)});
}

StatusOr<std::vector<KeyValue>> SqliteStore::List(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  StmtReset reset{list_};
  // Keys are compared as text: every key >= prefix and < prefix-with-0xFF-appended matches.
  std::string end = prefix + "\xff";
  BindText(list_, 1, prefix);
  BindText(list_, 2, end);
  std::vector<KeyValue> out;
  int rc;
  while ((rc = sqlite3_step(list_)) == SQLITE_ROW) {
    out.push_back(KeyValue{ColumnText(list_, 0), ColumnText(list_, 1),
                           sqlite3_column_int64(list_, 2), sqlite3_column_int64(list_, 3)});
  }
  if (rc != SQLITE_DONE) return Error("list");
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
  if (!txn_open_) {
    TF_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    txn_open_ = true;
  }
  TF_RETURN_IF_ERROR(Exec("SAVEPOINT tx"));
  StatusOr<int64_t> r = CommitLocked(compares, writes);
  if (!r.ok()) {
    Exec("ROLLBACK TO tx");
    Exec("RELEASE tx");
    return r;
  }
  TF_RETURN_IF_ERROR(Exec("RELEASE tx"));
  revision_ = *r;
  staged_cv_.notify_one();
  return r;
}

Status SqliteStore::WaitDurable(int64_t revision) {
  std::unique_lock<std::mutex> lock(mu_);
  settled_cv_.wait(lock, [&] { return settled_ >= revision; });
  for (const auto& [lo, hi] : failed_)
    if (revision >= lo && revision <= hi) return last_failure_;
  return Status::Ok();
}

uint64_t SqliteStore::batches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return batches_;
}

void SqliteStore::FlushLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    staged_cv_.wait(lock, [&] { return stop_ || (txn_open_ && revision_ > settled_); });
    if (!txn_open_ || revision_ <= settled_) {
      if (txn_open_) {  // only failed transactions were staged: nothing to keep
        Exec("ROLLBACK");
        txn_open_ = false;
      }
      if (stop_) return;
      continue;
    }
    // The fsync happens here, under mu_: stagers queue behind it and form the next batch.
    const int64_t through = revision_;
    Status st = Exec("COMMIT");
    if (!st.ok()) {
      Exec("ROLLBACK");
      failed_.emplace_back(settled_ + 1, through);
      last_failure_ = Unavailable("sqlite commit failed, transaction lost: " + st.message());
    }
    txn_open_ = false;
    settled_ = through;
    ++batches_;
    settled_cv_.notify_all();
  }
}

StatusOr<int64_t> SqliteStore::CommitLocked(const std::vector<Compare>& compares,
                                            const std::vector<Write>& writes) {
  for (const Compare& c : compares) {
    StmtReset reset{get_};
    BindText(get_, 1, c.key);
    int rc = sqlite3_step(get_);
    int64_t have = 0;
    if (rc == SQLITE_ROW) {
      have = sqlite3_column_int64(get_, 2);
    } else if (rc != SQLITE_DONE) {
      return Error("compare");
    }
    if (have != c.mod_revision) {
      return Status(StatusCode::kAborted, "compare failed on " + c.key + ": revision " +
                                              std::to_string(have) + ", expected " +
                                              std::to_string(c.mod_revision));
    }
  }
  const int64_t rev = revision_ + 1;
  for (const Write& w : writes) {
    sqlite3_stmt* s = w.kind == Write::Kind::kPut ? put_ : del_;
    StmtReset reset{s};
    BindText(s, 1, w.key);
    if (w.kind == Write::Kind::kPut) {
      sqlite3_bind_blob(s, 2, w.value.data(), static_cast<int>(w.value.size()), SQLITE_STATIC);
      sqlite3_bind_int64(s, 3, rev);
    }
    if (sqlite3_step(s) != SQLITE_DONE) return Error("write");
  }
  StmtReset reset{set_rev_};
  sqlite3_bind_int64(set_rev_, 1, rev);
  if (sqlite3_step(set_rev_) != SQLITE_DONE) return Error("revision");
  return rev;
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

void SqliteLeaderLock::Resign() {
  if (fd_ < 0) return;
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
  fd_ = -1;
}

}  // namespace tf::controller
