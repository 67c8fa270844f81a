// KubeApi: the few calls the scheduler extender makes to the Kubernetes API server (read a pod,
// create its Binding), over HTTPS with the server verified against a CA file and a bearer token.
// The defaults are the in-cluster ones: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT,
// the service account's token and CA under /var/run/secrets/kubernetes.io/serviceaccount/.
//
// Thread safety: every method may be called from several threads (one connection per call).
#pragma once

#include <string>

#include "common/status.h"
#include "controller/http_client.h"

namespace tf::k8s {

struct KubeApiOptions {
  std::string url;         // https://HOST:PORT; empty: from the in-cluster environment
  std::string token_file;  // re-read on every call (projected tokens rotate)
  std::string ca_file;
};

// Fills what `o` leaves empty from the in-cluster environment. kInvalidArgument when the URL is
// missing (not in a cluster and no --kube-api) or not https://.
StatusOr<KubeApiOptions> ResolveKubeApi(KubeApiOptions o);

class KubeApi {
 public:
  explicit KubeApi(KubeApiOptions options) : options_(std::move(options)) {}

  // kUnavailable when the server cannot be reached or its certificate does not verify; any HTTP
  // answer is returned as it is.
  StatusOr<controller::HttpResponse> Get(const std::string& path) const;
  StatusOr<controller::HttpResponse> Post(const std::string& path, const std::string& json_body) const;

  const std::string& url() const { return options_.url; }

 private:
  template <typename F>
  StatusOr<controller::HttpResponse> Call(const char* method, const std::string& path, F&& send) const;

  const KubeApiOptions options_;
};

}  // namespace tf::k8s
