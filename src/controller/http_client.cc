#include "controller/http_client.h"

#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <mutex>
#include <optional>

#include "controller/tls_files.h"

namespace tf::controller {

HttpClient::HttpClient(const std::string& base_url, std::string bearer_token, int timeout_ms,
                       const std::string& ca_file)
    : base_url_(base_url), token_(std::move(bearer_token)), timeout_ms_(timeout_ms), tls_(base_url.rfind("https://", 0) == 0),
      cli_(std::make_unique<httplib::Client>(base_url)) {
  cli_->set_keep_alive(true);
  cli_->set_tcp_nodelay(true);
  cli_->set_connection_timeout(timeout_ms / 1000, (timeout_ms % 1000) * 1000);
  cli_->set_read_timeout(timeout_ms / 1000, (timeout_ms % 1000) * 1000);
  cli_->set_write_timeout(timeout_ms / 1000, (timeout_ms % 1000) * 1000);
  if (!token_.empty()) cli_->set_bearer_token_auth(token_.c_str());
  if (tls_) {
    // OpenSSL writes to the socket with write(2): a peer that went away (a controller killed
    // mid-call) would end this process with SIGPIPE instead of failing the call. Processes that
    // kept the default disposition get it ignored (a handler someone installed is left alone).
    static std::once_flag ignore_sigpipe;
    std::call_once(ignore_sigpipe, [] {
      struct sigaction old{};
      if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
    });
    ca_file_ = ca_file.empty() ? DefaultCaFile() : ca_file;
    cli_->enable_server_certificate_verification(true);
    if (!ca_file_.empty()) {
      config_ = CheckCaFile(ca_file_);
      cli_->set_ca_cert_path(ca_file_);  // this CA only, not the system's store as well
    }
  }
}

HttpClient::~HttpClient() = default;

template <typename Call>
StatusOr<HttpResponse> HttpClient::Exchange(const char* method, const std::string& path, Call&& call) {
  const std::string what = std::string(method) + " " + base_url_ + path;
  if (!config_.ok()) return Status(config_.code(), what + ": " + config_.message());
  std::lock_guard<std::mutex> lock(mu_);
  const auto started = std::chrono::steady_clock::now();
  httplib::Result r = call();
  if (r) {
    HttpResponse out{r->status, r->body, {}};
    for (const auto& [name, value] : r->headers) out.headers.emplace(name, value);
    return out;
  }
  const std::string against =
      ca_file_.empty() ? "the system's trust store (no --ca-file or TFUSION_CA_FILE given; `tfusion up --tls` "
                         "prints the CA file to pass)"
                       : "the CA file " + ca_file_ + " (--ca-file / TFUSION_CA_FILE)";
  switch (r.error()) {
    case httplib::Error::SSLServerVerification: {
      const long v = cli_->get_openssl_verify_result();
      const std::string why = v == 0 ? "it does not name the host of " + base_url_ + " (its subjectAltName)"
                                     : VerifyResultText(v);
      return Unauthenticated(what + ": the server's TLS certificate was not accepted: " + why + "; checked against " +
                             against + ". Nothing was sent.");
    }
    case httplib::Error::SSLLoadingCerts:
      return InvalidArgument(what + ": cannot load " + against);
    case httplib::Error::SSLConnection:
      return Unavailable(what + ": the TLS handshake failed (is the server at " + base_url_ +
                         " serving plain HTTP? then use http://)");
    case httplib::Error::Connection:
      return Unavailable(what + ": cannot connect (nothing answers at " + base_url_ +
                         ": is the server running there, and is the URL right?)");
    case httplib::Error::ConnectionTimeout:
      return Unavailable(what + ": the connection timed out (is " + base_url_ + " reachable from here?)");
    case httplib::Error::Read:
      // A read that ran into the timeout: the server took the request and never answered (a hung
      // store behind it, a stopped process), which has nothing to do with the URL's scheme.
      if (std::chrono::steady_clock::now() - started >= std::chrono::milliseconds(timeout_ms_ * 9 / 10)) {
        return Unavailable(what + ": no answer within " + std::to_string(timeout_ms_) +
                           " ms (the server took the connection but did not answer: stopped or overloaded?)");
      }
      if (!tls_) {
        return Unavailable(what + ": the connection closed without an HTTP answer (if the server serves "
                           "HTTPS, use an https:// URL)");
      }
      break;
    default:
      break;
  }
  return Unavailable(what + ": " + httplib::to_string(r.error()));
}

StatusOr<HttpResponse> HttpClient::Get(const std::string& path) {
  return Exchange("GET", path, [&] { return cli_->Get(path.c_str()); });
}

StatusOr<HttpResponse> HttpClient::Post(const std::string& path, const std::string& json_body) {
  return Exchange("POST", path, [&] { return cli_->Post(path.c_str(), json_body, "application/json"); });
}

StatusOr<HttpResponse> HttpClient::Put(const std::string& path, const std::string& json_body) {
  return Exchange("PUT", path, [&] { return cli_->Put(path.c_str(), json_body, "application/json"); });
}

StatusOr<HttpResponse> HttpClient::Patch(const std::string& path, const std::string& json_body) {
  return Exchange("PATCH", path, [&] { return cli_->Patch(path.c_str(), json_body, "application/json"); });
}

StatusOr<HttpResponse> HttpClient::Delete(const std::string& path) {
  return Exchange("DELETE", path, [&] { return cli_->Delete(path.c_str()); });
}

ReplicaClient::ReplicaClient(const std::string& urls, const std::string& bearer_token, int timeout_ms,
                             const std::string& ca_file, bool writes_once)
    : writes_once_(writes_once) {
  size_t start = 0;
  while (start <= urls.size()) {
    size_t comma = urls.find(',', start);
    std::string url = urls.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!url.empty()) replicas_.push_back(std::make_unique<HttpClient>(url, bearer_token, timeout_ms, ca_file));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (replicas_.empty()) replicas_.push_back(std::make_unique<HttpClient>(urls, bearer_token, timeout_ms, ca_file));
}

namespace {
// The request never reached a server: nothing answered the connection (HttpClient::Exchange).
bool NotSent(const Status& s) {
  return s.message().find(": cannot connect (nothing answers at ") != std::string::npos ||
         s.message().find(": the connection timed out (is ") != std::string::npos;
}
}  // namespace

template <typename F>
StatusOr<HttpResponse> ReplicaClient::Request(F&& call, bool write) {
  const size_t first = current_.load(std::memory_order_relaxed);
  StatusOr<HttpResponse> last = Unavailable("no controller URL");
  std::optional<HttpResponse> answered;  // a 503: a replica that is up, which says more than one that is not
  for (size_t i = 0; i < replicas_.size(); ++i) {
    const size_t at = (first + i) % replicas_.size();
    last = call(*replicas_[at]);
    if (last.ok() && last->status != 503) {
      current_.store(at, std::memory_order_relaxed);
      return last;
    }
    if (last.ok()) answered = *last;
    // A write a replica may have acted on is not sent again to another: its outcome is unknown.
    if (write && writes_once_ && !last.ok() && !NotSent(last.status())) return last;
  }
  if (answered) return *answered;
  return last;  // no replica answered: the last failure says why
}

StatusOr<HttpResponse> ReplicaClient::Get(const std::string& path) {
  return Request([&](HttpClient& c) { return c.Get(path); });
}

StatusOr<HttpResponse> ReplicaClient::Post(const std::string& path, const std::string& json_body) {
  return Request([&](HttpClient& c) { return c.Post(path, json_body); });
}

StatusOr<HttpResponse> ReplicaClient::Delete(const std::string& path) {
  return Request([&](HttpClient& c) { return c.Delete(path); }, true);
}

StatusOr<HttpResponse> ReplicaClient::Put(const std::string& path, const std::string& json_body) {
  return Request([&](HttpClient& c) { return c.Put(path, json_body); }, true);
}

StatusOr<HttpResponse> ReplicaClient::Patch(const std::string& path, const std::string& json_body) {
  return Request([&](HttpClient& c) { return c.Patch(path, json_body); }, true);
}

StatusOr<HttpResponse> ReplicaClient::PostOnce(const std::string& path, const std::string& json_body) {
  return Request([&](HttpClient& c) { return c.Post(path, json_body); }, true);
}

}  // namespace tf::controller
