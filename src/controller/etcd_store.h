// EtcdStore: the Store on a real etcd (3.4+) cluster, spoken to through etcd's gRPC-gateway
// JSON API (/v3/kv/range, /v3/kv/txn, /v3/lease/*) so that no gRPC library is needed.
// EtcdLeaderElection: leadership through a lease and a create-if-absent txn on one key.
#pragma once

#include <atomic>
#include <condition_variable>
#include <thread>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "controller/http_client.h"
#include "controller/store.h"

namespace tf::controller {

class EtcdStore : public Store {
 public:
  // `endpoints`: "http://127.0.0.1:2379[,http://...]". A request that cannot reach one endpoint
  // is retried on the next.
  explicit EtcdStore(const std::string& endpoints);

  StatusOr<std::optional<KeyValue>> Get(const std::string& key) override;
  StatusOr<std::vector<KeyValue>> List(const std::string& prefix) override;
  StatusOr<int64_t> Commit(const std::vector<Compare>& compares,
                           const std::vector<Write>& writes) override;
  std::string Describe() const override { return "etcd:" + endpoints_; }

  // Calls one gateway method ("/v3/kv/range") with a JSON body; the parsed JSON reply.
  StatusOr<nlohmann::json> Call(const std::string& path, const nlohmann::json& body);

 private:
  const std::string endpoints_;
  std::vector<std::unique_ptr<HttpClient>> clients_;
  std::atomic<size_t> preferred_{0};
};

class EtcdLeaderElection : public LeaderElection {
 public:
  // `store` must outlive this object. The lease is renewed every ttl/3 seconds.
  EtcdLeaderElection(EtcdStore* store, std::string key, std::string identity, int ttl_seconds);
  ~EtcdLeaderElection() override;

  StatusOr<bool> TryAcquire() override;
  bool IsLeader() const override;
  std::optional<Compare> Fence() const override;
  void Resign() override;
  std::string Identity() const override { return identity_; }

  // The identity stored in the election key right now ("" when nobody leads).
  StatusOr<std::string> CurrentLeader();

 private:
  void KeepAliveLoop();
  void StopKeepAlive();

  EtcdStore* const store_;
  const std::string key_;
  const std::string identity_;
  const int ttl_seconds_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool leading_ = false;
  int64_t lease_id_ = 0;
  int64_t fence_revision_ = 0;  // mod_revision of our write to key_
  std::chrono::steady_clock::time_point lease_deadline_;
  std::thread keepalive_;
};

}  // namespace tf::controller
