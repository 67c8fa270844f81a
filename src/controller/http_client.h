// HttpClient: a small blocking HTTP/1.1 client (keep-alive) used by the etcd store, the node
// agent and the CLI helpers. It hides cpp-httplib from their headers.
//
// https:// URLs are TLS (the distribution's OpenSSL through cpp-httplib): the server's
// certificate chain is verified against one CA file, or the system's trust store when there is
// none, and must name the URL's host. A failed verification fails the request with a message
// naming the URL and what it was checked against; there is no fallback to plain HTTP or to an
// unverified connection.
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
  // `base_url` is "http://host:port" or "https://host:port". `bearer_token` may be empty (no
  // Authorization header). `ca_file` (PEM) is what an https server's certificate must chain to;
  // empty: DefaultCaFile() ($TFUSION_CA_FILE), else the system's trust store. A CA file that
  // cannot be read or holds no certificate makes every request fail with kInvalidArgument.
  HttpClient(const std::string& base_url, std::string bearer_token, int timeout_ms = 5000,
             const std::string& ca_file = "");
  ~HttpClient();

  // kUnavailable when the server cannot be reached or the connection breaks, kUnauthenticated
  // when an https server's certificate is not trusted; any HTTP status (even 4xx/5xx) is a
  // successful exchange and is returned.
  StatusOr<HttpResponse> Get(const std::string& path);
  StatusOr<HttpResponse> Post(const std::string& path, const std::string& json_body);
  StatusOr<HttpResponse> Put(const std::string& path, const std::string& json_body);
  StatusOr<HttpResponse> Patch(const std::string& path, const std::string& json_body);
  StatusOr<HttpResponse> Delete(const std::string& path);

  const std::string& base_url() const { return base_url_; }

 private:
  template <typename Call>
  StatusOr<HttpResponse> Exchange(const char* method, const std::string& path, Call&& call);

  const std::string base_url_;
  const std::string token_;
  const int timeout_ms_;
  const bool tls_;
  std::string ca_file_;  // "" with tls_: the system's trust store
  Status config_;        // a bad CA file: every request fails with it
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
  // `ca_file`: as HttpClient's, for every replica. `writes_once`: a PUT, PATCH or DELETE moves on
  // only past a replica that did not take it (refused the connection, answered 503), never after
  // one that may have acted on it (it timed out or closed the connection before answering): the
  // client commands, whose writes are not all idempotent.
  ReplicaClient(const std::string& urls, const std::string& bearer_token, int timeout_ms = 5000,
                const std::string& ca_file = "", bool writes_once = false);

  StatusOr<HttpResponse> Get(const std::string& path);
  StatusOr<HttpResponse> Post(const std::string& path, const std::string& json_body);
  StatusOr<HttpResponse> Delete(const std::string& path);
  StatusOr<HttpResponse> Put(const std::string& path, const std::string& json_body);
  StatusOr<HttpResponse> Patch(const std::string& path, const std::string& json_body);
  // A POST that is not safe to repeat (`tfusion token create`): as a write with writes_once.
  StatusOr<HttpResponse> PostOnce(const std::string& path, const std::string& json_body);

 private:
  template <typename F>
  StatusOr<HttpResponse> Request(F&& call, bool write = false);

  std::vector<std::unique_ptr<HttpClient>> replicas_;
  std::atomic<size_t> current_{0};
  const bool writes_once_ = false;
};

}  // namespace tf::controller
