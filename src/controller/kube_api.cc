#include "controller/kube_api.h"

#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <regex>

namespace tf::controller {
namespace {

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool Readable(const std::string& path) { return !path.empty() && access(path.c_str(), R_OK) == 0; }

std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

}  // namespace

StatusOr<KubeApiConfig> ResolveKubeApiConfig(const std::string& api, const std::string& token_file,
                                             const std::string& ca_file) {
  KubeApiConfig c;
  if (api == "in-cluster") {
    const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
    const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
    if (host == nullptr || port == nullptr || *host == '\0' || *port == '\0')
      return InvalidArgument("--kube-api in-cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are "
                             "not set (not running in a pod?); give the API server's URL instead");
    std::string h = host;
    if (h.find(':') != std::string::npos) h = "[" + h + "]";  // an IPv6 service address
    c.url = "https://" + h + ":" + port;
    c.token_file = token_file.empty() ? kServiceAccountTokenFile : token_file;
    c.ca_file = ca_file.empty() ? kServiceAccountCaFile : ca_file;
  } else {
    static const std::regex kUrl(R"(^(https?)://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?/?$)");
    std::smatch m;
    if (!std::regex_match(api, m, kUrl))
      return InvalidArgument("--kube-api '" + api + "' is not an http(s)://HOST[:PORT] URL or in-cluster");
    if (m[3].matched && std::stoi(m[3].str().substr(1)) > 65535)
      return InvalidArgument("--kube-api '" + api + "': the port must be at most 65535");
    c.url = api.back() == '/' ? api.substr(0, api.size() - 1) : api;
    c.token_file = token_file.empty() && Readable(kServiceAccountTokenFile) ? kServiceAccountTokenFile : token_file;
    c.ca_file = ca_file.empty() && Readable(kServiceAccountCaFile) ? kServiceAccountCaFile : ca_file;
  }
  if (c.url.rfind("https://", 0) == 0) {
    if (c.ca_file.empty())
      return InvalidArgument("--kube-api " + c.url + " is https: --kube-ca-file must name the CA that signed "
                             "the API server's certificate");
    if (!Readable(c.ca_file)) return InvalidArgument("--kube-ca-file: cannot read " + c.ca_file);
  }
  if (!c.token_file.empty() && FirstLine(c.token_file).empty())
    return InvalidArgument("--kube-token-file: cannot read a token from " + c.token_file);
  return c;
}

KubeApi::KubeApi(KubeApiConfig config)
    : config_(std::move(config)), client_(std::make_unique<httplib::Client>(config_.url)) {
  const int t = config_.timeout_ms;
  client_->set_connection_timeout(t / 1000, (t % 1000) * 1000);
  client_->set_read_timeout(t / 1000, (t % 1000) * 1000);
  client_->set_write_timeout(t / 1000, (t % 1000) * 1000);
  client_->set_keep_alive(true);
  if (config_.url.rfind("https://", 0) == 0) {
    client_->set_ca_cert_path(config_.ca_file);
    client_->enable_server_certificate_verification(true);
  }
}

KubeApi::~KubeApi() = default;

std::string KubeApi::TokenLocked() {
  if (config_.token_file.empty()) return "";
  const int64_t now = SteadyMs();
  if (token_read_ms_ < 0 || now - token_read_ms_ > 60'000) {
    std::string t = FirstLine(config_.token_file);
    if (!t.empty()) token_ = t;  // keep the last good one while the kubelet rewrites the file
    token_read_ms_ = now;
  }
  return token_;
}

namespace {
StatusOr<KubeResponse> Convert(const httplib::Result& r, const std::string& what) {
  if (!r) {
    std::string why = httplib::to_string(r.error());
    if (r.error() == httplib::Error::SSLServerVerification)
      why += " (the API server's certificate is not signed by the CA in --kube-ca-file, or does not name the host)";
    return Unavailable(what + ": " + why);
  }
  return KubeResponse{r->status, r->body};
}
}  // namespace

StatusOr<KubeResponse> KubeApi::Call(const std::string& method, const std::string& path, const std::string& body,
                                     const std::string& content_type) {
  std::lock_guard<std::mutex> lock(mu_);
  httplib::Headers headers{{"Accept", "application/json"}};
  const std::string token = TokenLocked();
  if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
  const std::string what = method + " " + config_.url + path;
  const char* type = content_type.c_str();
  if (method == "GET") return Convert(client_->Get(path.c_str(), headers), what);
  if (method == "POST") return Convert(client_->Post(path.c_str(), headers, body, type), what);
  if (method == "PUT") return Convert(client_->Put(path.c_str(), headers, body, type), what);
  if (method == "PATCH") return Convert(client_->Patch(path.c_str(), headers, body, type), what);
  if (method == "DELETE") return Convert(client_->Delete(path.c_str(), headers, body, type), what);
  return InvalidArgument("unsupported method " + method);
}

StatusOr<KubeResponse> KubeApi::Stream(const std::string& path,
                                       const std::function<bool(const std::string&)>& on_line,
                                       int idle_timeout_s) {
  std::lock_guard<std::mutex> lock(mu_);
  httplib::Headers headers{{"Accept", "application/json"}};
  const std::string token = TokenLocked();
  if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
  client_->set_read_timeout(idle_timeout_s, 0);
  int status = 0;
  std::string pending, error_body;
  bool stopped = false;
  httplib::Result r = client_->Get(
      path.c_str(), headers,
      [&](const httplib::Response& res) {
        status = res.status;
        return true;
      },
      [&](const char* data, size_t n) {
        if (status != 200) {
          error_body.append(data, n);
          return error_body.size() < (1u << 20);
        }
        pending.append(data, n);
        size_t start = 0;
        for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
          if (nl > start && !on_line(pending.substr(start, nl - start))) {
            stopped = true;
            return false;
          }
        }
        pending.erase(0, start);
        return pending.size() < (16u << 20);  // one event is far below this
      });
  const int t = config_.timeout_ms;
  client_->set_read_timeout(t / 1000, (t % 1000) * 1000);
  if (stopped) return KubeResponse{200, ""};
  if (!r) return Unavailable("watch " + config_.url + path + ": " + httplib::to_string(r.error()));
  if (status == 200 && !pending.empty()) on_line(pending);  // a last line without its newline
  return KubeResponse{status, status == 200 ? "" : error_body};
}

void KubeApi::Interrupt() { client_->stop(); }

StatusOr<double> ParseKubeQuantity(const std::string& text) {
  static const std::regex kQuantity(
      R"(^([0-9]+(\.[0-9]*)?|\.[0-9]+)((Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE]([+-]?[0-9]+))?$)");
  std::smatch m;
  if (text.size() > 64 || !std::regex_match(text, m, kQuantity))
    return InvalidArgument("'" + text + "' is not a non-negative Kubernetes quantity (e.g. 20, 12.5, 8Gi)");
  double v = std::strtod(m[1].str().c_str(), nullptr);
  const std::string suffix = m[4].str();
  static const std::pair<const char*, double> kSuffixes[] = {
      {"Ki", 1024.0}, {"Mi", 1048576.0}, {"Gi", 1073741824.0}, {"Ti", 1099511627776.0},
      {"Pi", 1125899906842624.0}, {"Ei", 1152921504606846976.0}, {"n", 1e-9}, {"u", 1e-6},
      {"m", 1e-3}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15}, {"E", 1e18}};
  for (const auto& [s, f] : kSuffixes)
    if (suffix == s) v *= f;
  if (m[5].matched) v *= std::pow(10.0, std::stod(m[5].str()));
  if (!std::isfinite(v)) return InvalidArgument("'" + text + "' is too large");
  return v;
}

}  // namespace tf::controller
