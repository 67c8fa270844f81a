// HttpClient: a small blocking HTTP/1.1 client (keep-alive) used by the etcd store, the node
// agent and the CLI helpers. It hides cpp-httplib from their headers.
// Thread safety: every method may be called from several threads; requests are serialized on one
// connection.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace httplib {
class Client;
}

namespace tf::controller {

struct HttpResponse {
  int status = 0;
  std::string body;
  std::multimap<std::string, std::string> headers;  // as received

  // The first value of header `name` (as sent; HTTP/1.1 servers here send canonical case), or "".
  std::string get_header_value(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

class HttpClient {
 public:
  // `base_url` is "http://host:port". `bearer_token` may be empty (no Authorization header).
  HttpClient(const std::string& base_url, std::string bearer_token, int timeout_ms = 5000);
  ~HttpClient();

  // kUnavailable when the server cannot be reached or the connection breaks; any HTTP status
  // (even 4xx/5xx) is a successful exchange and is returned.
  StatusOr<HttpResponse> Get(const std::string& path);
  StatusOr<HttpResponse> Post(const std::string& path, const std::string& json_body);
  StatusOr<HttpResponse> Put(const std::string& path, const std::string& json_body);
  StatusOr<HttpResponse> Patch(const std::string& path, const std::string& json_body);
  StatusOr<HttpResponse> Delete(const std::string& path);

  const std::string& base_url() const { return base_url_; }

 private:
  const std::string base_url_;
  const std::string token_;
  std::mutex mu_;
  std::unique_ptr<httplib::Client> cli_;
};

// The controller replicas behind a list of URLs ("http://a:9300,http://b:9300"): each request goes
// to the replica that answered last, and moves on through the list when that one cannot be
// reached or answers 503 (a standby, or a leader without its store), so a node agent follows the
// leader after a failover. Only for requests that may be repeated safely (registrations,
// heartbeats, reads, idempotent reports). Thread safety: as HttpClient.
class ReplicaClient {
 public:
  ReplicaClient(const std::string& urls, const std::string& bearer_token, int timeout_ms = 5000);

  StatusOr<HttpResponse> Get(const std::string& path);
  StatusOr<HttpResponse> Post(const std::string& path, const std::string& json_body);

 private:
  template <typename F>
  StatusOr<HttpResponse> Request(F&& call);

  std::vector<std::unique_ptr<HttpClient>> replicas_;
  std::atomic<size_t> current_{0};
};

}  // namespace tf::controller
