// `tfusion k8s`: the admission webhook and the scheduler extender on one HTTPS port.
//
//   POST /mutate      AdmissionReview (admission.k8s.io/v1)        k8s/admission.h
//   POST /filter      ExtenderArgs -> ExtenderFilterResult         k8s/extender.h
//   POST /prioritize  ExtenderArgs -> HostPriorityList
//   POST /bind        ExtenderBindingArgs -> ExtenderBindingResult
//   GET  /healthz     {"ok": true}
//
// Requests carry no credential of their own: the API server and kube-scheduler reach the port
// over TLS (the webhook configuration's caBundle, the extender's tlsConfig).
#pragma once

#include <cstdint>
#include <string>

namespace tf::k8s {

struct K8sOptions {
  std::string listen_host = "0.0.0.0";
  int port = 9443;                 // 0: any free port (printed)
  std::string tls_cert, tls_key;   // PEM files; required
  std::string controller_url;      // the controller's API
  std::string token_file;          // its token; else $TFUSION_TOKEN
  std::string ca_file;             // https:// controller: the CA it must chain to (else $TFUSION_CA_FILE,
                                   // else the system's trust store; controller::HttpClient)
  std::string scheduler_name = "tensor-fusion-scheduler";
  std::string limiter_image = "tensorfusion/tensorfusion-lib:latest";
  std::string worker_token_secret; // remote pods: Secret whose key "token" the stub presents
  std::string worker_token_file;   // remote pods: the workers' token; each pod gets its own ticket
  int64_t ticket_days = 365;       // how long such a ticket opens sessions
  std::string host_shm_dir = "/dev/shm/tensorfusion";  // the agents' quota regions on the host
  std::string kube_api;            // https://HOST:PORT or in-cluster; empty: in-cluster
  std::string kube_token_file;     // empty: the service account's
  std::string kube_ca_file;        // empty: the service account's
};

// Serves until SIGINT/SIGTERM. Returns 0 after a stop, 2 for bad options or files.
int RunK8s(const K8sOptions& options);

}  // namespace tf::k8s
