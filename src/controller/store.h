// Store: the controller's durable state, a versioned key/value map with multi-key transactions.
//
// Every key carries the store revision of the write that created it (create_revision) and of the
// last write that changed it (mod_revision). The store revision only grows, across restarts too.
// A transaction is a list of compares and a list of writes: the writes are applied atomically iff
// every compare holds; otherwise nothing changes and Commit returns kAborted. This is the
// compare-and-swap the controller uses so that two replicas can never both take the same GPU
// capacity, and it maps one-to-one onto an etcd Txn.
//
// Durability: when Commit (or WaitDurable after Stage) returns OK the writes survive a kill -9 of
// the process (SQLite: WAL, concurrent transactions group-committed; with durability "power",
// the default, also an OS crash or power loss: sqlite_store.h; etcd: its raft log).
// Thread safety: every implementation is safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace tf::controller {

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
};

// A condition on one key's mod_revision. mod_revision == 0 means "the key does not exist".
struct Compare {
  std::string key;
  int64_t mod_revision = 0;

  static Compare Absent(std::string key) { return {std::move(key), 0}; }
  static Compare At(std::string key, int64_t rev) { return {std::move(key), rev}; }
};

struct Write {
  enum class Kind { kPut, kDelete };
  Kind kind = Kind::kPut;
  std::string key;
  std::string value;

  static Write Put(std::string key, std::string value) {
    return {Kind::kPut, std::move(key), std::move(value)};
  }
  static Write Delete(std::string key) { return {Kind::kDelete, std::move(key), {}}; }
};

class Store {
 public:
  virtual ~Store() = default;

  // The current value of `key`, or nullopt when absent.
  virtual StatusOr<std::optional<KeyValue>> Get(const std::string& key) = 0;
  // Every key that starts with `prefix`, in key order.
  virtual StatusOr<std::vector<KeyValue>> List(const std::string& prefix) = 0;
  // Applies `writes` atomically iff every compare holds. Returns the new store revision; every
  // written key's mod_revision becomes that revision. kAborted: a compare failed, nothing changed.
  // kUnavailable: the backend could not be reached (the outcome is then unknown for etcd).
  virtual StatusOr<int64_t> Commit(const std::vector<Compare>& compares,
                                   const std::vector<Write>& writes) = 0;
  // Group commit, for callers that hold a lock while they decide: Stage applies the transaction
  // exactly as Commit would (compares checked now; later Stage/Get/List see its writes) and
  // returns its revision, but it is durable only once WaitDurable(revision) returns OK. Staged
  // transactions become durable in stage order, a prefix at a time, so a transaction that depends
  // on an earlier one is never durable without it. If WaitDurable fails, the transaction (and any
  // staged with it) is not in the store: the caller must re-read what it derived from it.
  // Backends without batching (etcd) are durable at once: Stage is Commit.
  virtual StatusOr<int64_t> Stage(const std::vector<Compare>& compares,
                                  const std::vector<Write>& writes) {
    return Commit(compares, writes);
  }
  virtual Status WaitDurable(int64_t revision) {
    (void)revision;
    return Status::Ok();
  }
  // "sqlite:/var/lib/tfusion/state.db" or "etcd:http://127.0.0.1:2379".
  virtual std::string Describe() const = 0;
};

// Leadership among controller replicas. Only the leader serves writes; every write the leader
// makes also carries Fence() so that a replica that lost leadership without noticing (a paused
// process, an expired lease) has its writes refused by the store.
class LeaderElection {
 public:
  virtual ~LeaderElection() = default;
  // One non-blocking attempt to become leader. Returns true when this replica leads now.
  virtual StatusOr<bool> TryAcquire() = 0;
  // Whether this replica still believes it leads (its lease or lock is still held).
  virtual bool IsLeader() const = 0;
  // A compare that holds only while this replica leads; nullopt when the backend needs none
  // (a file lock: there is only one process).
  virtual std::optional<Compare> Fence() const = 0;
  // Gives leadership up (revokes the lease, drops the lock). Safe to call when not leading.
  virtual void Resign() = 0;
  // This replica's identity, as recorded in the election key.
  virtual std::string Identity() const = 0;
};

// Opens the store described by `spec`: "sqlite:PATH", a bare PATH (SQLite), or
// "etcd:http://HOST:PORT" (several endpoints separated by commas).
// `sqlite_durability`: "power" or "process" (SqliteStore); "process" with etcd is refused.
StatusOr<std::unique_ptr<Store>> OpenStore(const std::string& spec,
                                           const std::string& sqlite_durability = "power");

// The election matching a store: a file lock "PATH.lock" beside a SQLite file, or an etcd lease
// with `ttl_seconds` on key kLeaderKey. `store` must outlive the election.
inline constexpr char kLeaderKey[] = "/tf/leader";
StatusOr<std::unique_ptr<LeaderElection>> MakeLeaderElection(Store* store,
                                                             const std::string& identity,
                                                             int ttl_seconds);

}  // namespace tf::controller
