#include "controller/etcd_store.h"

#include <nlohmann/json.hpp>

#include "controller/base64.h"

namespace tf::controller {
namespace {

using nlohmann::json;

// The gateway writes int64 fields as JSON strings and omits fields at their zero value.
int64_t Int64Field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return 0;
  if (it->is_string()) return std::stoll(it->get<std::string>());
  if (it->is_number_integer()) return it->get<int64_t>();
  return 0;
}

std::string Decode(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || !it->is_string()) return {};
  return Base64Decode(it->get<std::string>()).value_or(std::string());
}

// The smallest key greater than every key starting with `prefix` (etcd's range_end idiom).
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    unsigned char c = static_cast<unsigned char>(prefix.back());
    if (c < 0xff) {
      prefix.back() = static_cast<char>(c + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

KeyValue ToKeyValue(const json& kv) {
  return KeyValue{Decode(kv, "key"), Decode(kv, "value"), Int64Field(kv, "create_revision"),
                  Int64Field(kv, "mod_revision")};
}

}  // namespace

EtcdStore::EtcdStore(const std::string& endpoints) : endpoints_(endpoints) {
  size_t start = 0;
  while (start <= endpoints.size()) {
    size_t comma = endpoints.find(',', start);
    std::string ep = endpoints.substr(start, comma == std::string::npos ? std::string::npos
                                                                        : comma - start);
    if (!ep.empty()) clients_.push_back(std::make_unique<HttpClient>(ep, "", 3000));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
}

StatusOr<json> EtcdStore::Call(const std::string& path, const json& body) {
  if (clients_.empty()) return InvalidArgument("etcd: no endpoints in '" + endpoints_ + "'");
  const std::string payload = body.dump();
  Status last;
  for (size_t attempt = 0; attempt < clients_.size(); ++attempt) {
    size_t i = (preferred_.load() + attempt) % clients_.size();
    StatusOr<HttpResponse> r = clients_[i]->Post(path, payload);
    if (!r.ok()) {
      last = r.status();
      continue;
    }
    preferred_.store(i);
    json reply = json::parse(r->body, nullptr, /*allow_exceptions=*/false);
    if (reply.is_discarded()) return Unavailable("etcd " + path + ": unparsable reply");
    if (r->status != 200) {
      std::string msg = reply.value("error", reply.value("message", r->body));
      return Unavailable("etcd " + path + ": HTTP " + std::to_string(r->status) + ": " + msg);
    }
    return reply;
  }
  return last;
}

StatusOr<std::optional<KeyValue>> EtcdStore::Get(const std::string& key) {
  StatusOr<json> r = Call("/v3/kv/range", {{"key", Base64Encode(key)}});
  if (!r.ok()) return r.status();
  auto kvs = r->find("kvs");
  if (kvs == r->end() || kvs->empty()) return std::optional<KeyValue>();
  return std::optional<KeyValue>(ToKeyValue((*kvs)[0]));
}

StatusOr<std::vector<KeyValue>> EtcdStore::List(const std::string& prefix) {
  StatusOr<json> r = Call("/v3/kv/range", {{"key", Base64Encode(prefix)},
                                           {"range_end", Base64Encode(PrefixEnd(prefix))}});
  if (!r.ok()) return r.status();
  std::vector<KeyValue> out;
  auto kvs = r->find("kvs");
  if (kvs != r->end()) {
    for (const json& kv : *kvs) out.push_back(ToKeyValue(kv));
  }
  return out;
}

StatusOr<int64_t> EtcdStore::Commit(const std::vector<Compare>& compares,
                                    const std::vector<Write>& writes) {
  json cmp = json::array();
  for (const Compare& c : compares) {
    cmp.push_back({{"key", Base64Encode(c.key)},
                   {"target", "MOD"},
                   {"result", "EQUAL"},
                   {"mod_revision", std::to_string(c.mod_revision)}});
  }
  json ops = json::array();
  for (const Write& w : writes) {
    if (w.kind == Write::Kind::kPut) {
      ops.push_back(
          {{"request_put", {{"key", Base64Encode(w.key)}, {"value", Base64Encode(w.value)}}}});
    } else {
      ops.push_back({{"request_delete_range", {{"key", Base64Encode(w.key)}}}});
    }
  }
  StatusOr<json> r = Call("/v3/kv/txn", {{"compare", cmp}, {"success", ops}});
  if (!r.ok()) return r.status();
  if (!r->value("succeeded", false)) {
    return Status(StatusCode::kAborted, "etcd txn: a compare failed (concurrent change)");
  }
  return Int64Field(r->value("header", json::object()), "revision");
}

EtcdLeaderElection::EtcdLeaderElection(EtcdStore* store, std::string key, std::string identity,
                                       int ttl_seconds)
    : store_(store), key_(std::move(key)), identity_(std::move(identity)),
      ttl_seconds_(ttl_seconds < 2 ? 2 : ttl_seconds) {}

EtcdLeaderElection::~EtcdLeaderElection() { Resign(); }

StatusOr<bool> EtcdLeaderElection::TryAcquire() {
  if (IsLeader()) return true;
  StopKeepAlive();
  auto granted_at = std::chrono::steady_clock::now();
  StatusOr<json> grant =
      store_->Call("/v3/lease/grant", {{"TTL", std::to_string(ttl_seconds_)}, {"ID", "0"}});
  if (!grant.ok()) return grant.status();
  const int64_t lease = Int64Field(*grant, "ID");
  if (lease == 0) return Unavailable("etcd lease grant returned no ID");
  json txn = {
      {"compare", json::array({{{"key", Base64Encode(key_)},
                                {"target", "CREATE"},
                                {"result", "EQUAL"},
                                {"create_revision", "0"}}})},
      {"success", json::array({{{"request_put",
                                 {{"key", Base64Encode(key_)},
                                  {"value", Base64Encode(identity_)},
                                  {"lease", std::to_string(lease)}}}}})}};
  StatusOr<json> r = store_->Call("/v3/kv/txn", txn);
  if (!r.ok() || !r->value("succeeded", false)) {
    store_->Call("/v3/lease/revoke", {{"ID", std::to_string(lease)}});
    if (!r.ok()) return r.status();
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  leading_ = true;
  lease_id_ = lease;
  fence_revision_ = Int64Field(r->value("header", json::object()), "revision");
  lease_deadline_ = granted_at + std::chrono::seconds(ttl_seconds_);
  stop_ = false;
  keepalive_ = std::thread([this] { KeepAliveLoop(); });
  return true;
}

void EtcdLeaderElection::KeepAliveLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto period = std::chrono::milliseconds(ttl_seconds_ * 1000 / 3);
  while (!stop_ && leading_) {
    cv_.wait_for(lock, period, [this] { return stop_; });
    if (stop_) break;
    const int64_t lease = lease_id_;
    lock.unlock();
    auto sent_at = std::chrono::steady_clock::now();
    StatusOr<json> r = store_->Call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}});
    int64_t ttl = 0;
    if (r.ok()) ttl = Int64Field(r->value("result", json::object()), "TTL");
    lock.lock();
    if (r.ok() && ttl <= 0) {
      leading_ = false;  // the lease expired: someone else may lead now
    } else if (ttl > 0) {
      lease_deadline_ = sent_at + std::chrono::seconds(ttl);
    }
    // An unreachable etcd keeps the old deadline: IsLeader() turns false when it passes.
  }
}

bool EtcdLeaderElection::IsLeader() const {
  std::lock_guard<std::mutex> lock(mu_);
  return leading_ && std::chrono::steady_clock::now() < lease_deadline_;
}

std::optional<Compare> EtcdLeaderElection::Fence() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Compare::At(key_, fence_revision_);
}

void EtcdLeaderElection::StopKeepAlive() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (keepalive_.joinable()) keepalive_.join();
}

void EtcdLeaderElection::Resign() {
  StopKeepAlive();
  int64_t lease;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lease = leading_ ? lease_id_ : 0;
    leading_ = false;
    lease_id_ = 0;
  }
  // Revoking the lease deletes the election key at once, so a standby takes over without
  // waiting for the TTL.
  if (lease != 0) store_->Call("/v3/lease/revoke", {{"ID", std::to_string(lease)}});
}

StatusOr<std::string> EtcdLeaderElection::CurrentLeader() {
  StatusOr<std::optional<KeyValue>> kv = store_->Get(key_);
  if (!kv.ok()) return kv.status();
  return kv->has_value() ? (*kv)->value : std::string();
}

}  // namespace tf::controller
