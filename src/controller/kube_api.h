// KubeApi: a small client of the Kubernetes API server for the reconciler (k8s_reconciler.h):
// plain requests (GET, POST, PUT, DELETE with JSON bodies) and watch streams (one JSON event per
// line). HTTPS verifies the server against a CA bundle (the service account's ca.crt in a pod);
// http:// is accepted for a local `kubectl proxy`. The bearer token is read from a file and
// re-read every minute, because a pod's projected service-account token is rotated by the kubelet.
//
// Thread safety: one request at a time per KubeApi (calls are serialized); Interrupt() may be
// called from any thread to break a Stream that is waiting for the server.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"

namespace httplib {
class Client;
}

namespace tf::controller {

// Where a pod finds its service account's credentials, and the API server.
inline constexpr char kServiceAccountTokenFile[] = "/var/run/secrets/kubernetes.io/serviceaccount/token";
inline constexpr char kServiceAccountCaFile[] = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

struct KubeApiConfig {
  std::string url;         // "https://HOST:PORT" or "http://HOST:PORT", no path
  std::string token_file;  // bearer token (first line); empty: no Authorization header
  std::string ca_file;     // PEM bundle that verifies the server (https only)
  int timeout_ms = 10'000; // connect, read and write timeout of plain requests
};

// Resolves `tfusion controller --kube-api API` with its token and CA flags. API is a URL or
// "in-cluster": https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT. Empty token_file /
// ca_file take the service account's files when they exist. kInvalidArgument, naming the flag,
// for a malformed URL, an https URL without a readable CA file, a token file that cannot be read,
// or in-cluster outside a pod.
StatusOr<KubeApiConfig> ResolveKubeApiConfig(const std::string& api, const std::string& token_file,
                                             const std::string& ca_file);

struct KubeResponse {
  int status = 0;
  std::string body;
};

class KubeApi {
 public:
  explicit KubeApi(KubeApiConfig config);
  ~KubeApi();
  KubeApi(const KubeApi&) = delete;
  KubeApi& operator=(const KubeApi&) = delete;

  // `method` GET, POST, PUT, PATCH or DELETE; `path` with its query. Any HTTP status is a
  // successful exchange; kUnavailable when the server cannot be reached or the TLS handshake
  // fails (an unverifiable certificate says so).
  StatusOr<KubeResponse> Call(const std::string& method, const std::string& path,
                              const std::string& body = "",
                              const std::string& content_type = "application/json");

  // A watch: GET `path` and hand every complete line of a 200 answer to `on_line` as it arrives
  // (return false to stop reading). Returns when the server ends the stream (status 200), with
  // the status and body of any other answer, or kUnavailable when the connection breaks, nothing
  // arrives for `idle_timeout_s`, or Interrupt() was called.
  StatusOr<KubeResponse> Stream(const std::string& path, const std::function<bool(const std::string&)>& on_line,
                                int idle_timeout_s);

  // Breaks a Stream (or Call) in progress; later calls work again.
  void Interrupt();

  const std::string& url() const { return config_.url; }

 private:
  std::string TokenLocked();  // the token file's first line, re-read at most once a minute

  const KubeApiConfig config_;
  std::mutex mu_;  // serializes requests on client_
  std::unique_ptr<httplib::Client> client_;
  std::string token_;
  int64_t token_read_ms_ = -1;
};

// Parses a Kubernetes quantity into a number: digits with an optional fraction, then an optional
// suffix Ki Mi Gi Ti Pi Ei (powers of 1024), n u m k M G T P E (powers of 1000) or a decimal
// exponent (e3, E-2): "12.5", "8Gi", "500m", "1e3". The only quantity parser of the project (the
// reconciler's specs, the webhook's annotations through k8s::ParseQuantityBytes).
// kInvalidArgument when it is not one, is negative, longer than 64 characters, or not finite.
StatusOr<double> ParseKubeQuantity(const std::string& text);

}  // namespace tf::controller
