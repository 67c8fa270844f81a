#include "k8s/kube_api.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <httplib.h>

namespace tf::k8s {
namespace {

constexpr char kServiceAccountDir[] = "/var/run/secrets/kubernetes.io/serviceaccount";

std::string Trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

StatusOr<KubeApiOptions> ResolveKubeApi(KubeApiOptions o) {
  if (o.url.empty()) {
    const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
    const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
    if (!host || !*host)
      return InvalidArgument("no Kubernetes API server: give --kube-api https://HOST:PORT (outside a cluster; "
                             "inside one KUBERNETES_SERVICE_HOST is set)");
    std::string h = host;
    if (h.find(':') != std::string::npos) h = "[" + h + "]";  // IPv6
    o.url = "https://" + h + ":" + (port && *port ? port : "443");
  }
  if (o.url.rfind("https://", 0) != 0)
    return InvalidArgument("--kube-api " + o.url + ": must be an https:// URL (the service account token is sent)");
  if (o.token_file.empty()) o.token_file = std::string(kServiceAccountDir) + "/token";
  if (o.ca_file.empty()) o.ca_file = std::string(kServiceAccountDir) + "/ca.crt";
  return o;
}

template <typename F>
StatusOr<controller::HttpResponse> KubeApi::Call(const char* method, const std::string& path, F&& send) const {
  std::ifstream in(options_.token_file);
  if (!in) return Unavailable("cannot read the Kubernetes token file " + options_.token_file);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string token = Trimmed(ss.str());
  httplib::Client cli(options_.url);
  cli.set_ca_cert_path(options_.ca_file.c_str());
  cli.enable_server_certificate_verification(true);
  cli.set_connection_timeout(5, 0);
  cli.set_read_timeout(10, 0);
  cli.set_write_timeout(10, 0);
  if (!token.empty()) cli.set_bearer_token_auth(token.c_str());
  httplib::Result r = send(cli);
  if (!r) {
    std::string why = httplib::to_string(r.error());
    if (r.error() == httplib::Error::SSLServerVerification)
      why += " (the server's certificate does not verify against " + options_.ca_file + ")";
    return Unavailable(std::string("Kubernetes API ") + method + " " + options_.url + path + ": " + why);
  }
  controller::HttpResponse out;
  out.status = r->status;
  out.body = r->body;
  for (const auto& [k, v] : r->headers) out.headers.emplace(k, v);
  return out;
}

StatusOr<controller::HttpResponse> KubeApi::Get(const std::string& path) const {
  return Call("GET", path, [&](httplib::Client& c) { return c.Get(path.c_str()); });
}

StatusOr<controller::HttpResponse> KubeApi::Post(const std::string& path, const std::string& body) const {
  return Call("POST", path, [&](httplib::Client& c) { return c.Post(path.c_str(), body, "application/json"); });
}

}  // namespace tf::k8s
