#include "controller/http_client.h"

#include <httplib.h>

namespace tf::controller {

HttpClient::HttpClient(const std::string& base_url, std::string bearer_token, int timeout_ms)
    : base_url_(base_url), token_(std::move(bearer_token)),
      cli_(std::make_unique<httplib::Client>(base_url)) {
  cli_->set_keep_alive(true);
  cli_->set_tcp_nodelay(true);
  cli_->set_connection_timeout(timeout_ms / 1000, (timeout_ms % 1000) * 1000);
  cli_->set_read_timeout(timeout_ms / 1000, (timeout_ms % 1000) * 1000);
  cli_->set_write_timeout(timeout_ms / 1000, (timeout_ms % 1000) * 1000);
  if (!token_.empty()) cli_->set_bearer_token_auth(token_.c_str());
}

HttpClient::~HttpClient() = default;

namespace {
StatusOr<HttpResponse> Convert(const httplib::Result& r, const std::string& what) {
  if (!r) return Unavailable(what + ": " + httplib::to_string(r.error()));
  HttpResponse out{r->status, r->body, {}};
  for (const auto& [name, value] : r->headers) out.headers.emplace(name, value);
  return out;
}
}  // namespace

StatusOr<HttpResponse> HttpClient::Get(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  return Convert(cli_->Get(path.c_str()), "GET " + base_url_ + path);
}

StatusOr<HttpResponse> HttpClient::Post(const std::string& path, const std::string& json_body) {
  std::lock_guard<std::mutex> lock(mu_);
  return Convert(cli_->Post(path.c_str(), json_body, "application/json"),
                 "POST " + base_url_ + path);
}

StatusOr<HttpResponse> HttpClient::Put(const std::string& path, const std::string& json_body) {
  std::lock_guard<std::mutex> lock(mu_);
  return Convert(cli_->Put(path.c_str(), json_body, "application/json"), "PUT " + base_url_ + path);
}

StatusOr<HttpResponse> HttpClient::Patch(const std::string& path, const std::string& json_body) {
  std::lock_guard<std::mutex> lock(mu_);
  return Convert(cli_->Patch(path.c_str(), json_body, "application/json"), "PATCH " + base_url_ + path);
}

StatusOr<HttpResponse> HttpClient::Delete(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  return Convert(cli_->Delete(path.c_str()), "DELETE " + base_url_ + path);
}

ReplicaClient::ReplicaClient(const std::string& urls, const std::string& bearer_token, int timeout_ms) {
  size_t start = 0;
  while (start <= urls.size()) {
    size_t comma = urls.find(',', start);
    std::string url = urls.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!url.empty()) replicas_.push_back(std::make_unique<HttpClient>(url, bearer_token, timeout_ms));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (replicas_.empty()) replicas_.push_back(std::make_unique<HttpClient>(urls, bearer_token, timeout_ms));
}

template <typename F>
StatusOr<HttpResponse> ReplicaClient::Request(F&& call) {
  const size_t first = current_.load(std::memory_order_relaxed);
  StatusOr<HttpResponse> last = Unavailable("no controller URL");
  for (size_t i = 0; i < replicas_.size(); ++i) {
    const size_t at = (first + i) % replicas_.size();
    last = call(*replicas_[at]);
    if (last.ok() && last->status != 503) {
      current_.store(at, std::memory_order_relaxed);
      return last;
    }
  }
  return last;  // every replica failed: the last answer says why
}

StatusOr<HttpResponse> ReplicaClient::Get(const std::string& path) {
  return Request([&](HttpClient& c) { return c.Get(path); });
}

StatusOr<HttpResponse> ReplicaClient::Post(const std::string& path, const std::string& json_body) {
  return Request([&](HttpClient& c) { return c.Post(path, json_body); });
}

}  // namespace tf::controller
