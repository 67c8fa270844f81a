#include "controller/etcd_store.h"
#include "controller/sqlite_store.h"
#include "controller/store.h"

namespace tf::controller {

StatusOr<std::unique_ptr<Store>> OpenStore(const std::string& spec, const std::string& sqlite_durability) {
  StatusOr<SqliteDurability> durability = ParseSqliteDurability(sqlite_durability);
  if (!durability.ok()) return durability.status();
  if (spec.rfind("etcd:", 0) == 0) {
    if (*durability != SqliteDurability::kPower)
      return InvalidArgument("durability 'process' applies to the SQLite store; etcd fsyncs its own log");
    std::string endpoints = spec.substr(5);
    if (endpoints.empty()) return InvalidArgument("store spec 'etcd:' names no endpoint");
    return std::unique_ptr<Store>(std::make_unique<EtcdStore>(endpoints));
  }
  std::string path = spec.rfind("sqlite:", 0) == 0 ? spec.substr(7) : spec;
  if (path.empty()) return InvalidArgument("store spec names no SQLite file");
  StatusOr<std::unique_ptr<SqliteStore>> s = SqliteStore::Open(path, *durability);
  if (!s.ok()) return s.status();
  return std::unique_ptr<Store>(std::move(s).value());
}

StatusOr<std::unique_ptr<LeaderElection>> MakeLeaderElection(Store* store,
                                                             const std::string& identity,
                                                             int ttl_seconds) {
  if (auto* etcd = dynamic_cast<EtcdStore*>(store)) {
    return std::unique_ptr<LeaderElection>(
        std::make_unique<EtcdLeaderElection>(etcd, kLeaderKey, identity, ttl_seconds));
  }
  std::string desc = store->Describe();
  if (desc.rfind("sqlite:", 0) == 0) {
    return std::unique_ptr<LeaderElection>(
        std::make_unique<SqliteLeaderLock>(desc.substr(7) + ".lock", identity));
  }
  return InvalidArgument("no leader election for store " + desc);
}

}  // namespace tf::controller
