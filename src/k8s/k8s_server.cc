#include "k8s/k8s_server.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "controller/api_server.h"
#include "controller/http_client.h"
#include "controller/kube_api.h"
#include "controller/model.h"
#include "controller/tls_files.h"
#include "k8s/admission.h"
#include "k8s/extender.h"

namespace tf::k8s {
namespace {

using json = nlohmann::json;

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

int Fail(const std::string& message) {
  std::fprintf(stderr, "tfusion k8s: %s\n", message.c_str());
  return 2;
}

bool Readable(const std::string& path) { return std::ifstream(path).good(); }

// The controller's workload `name` as a profile's sizes.
StatusOr<WorkloadDefaults> LookupProfile(controller::HttpClient* c, const std::string& name) {
  StatusOr<controller::HttpResponse> r = c->Get("/v1/workloads/" + name);
  if (!r.ok()) return Unavailable("the controller cannot be reached to look it up: " + r.status().message());
  if (r->status == 404) return NotFound("no workload of that name is known to the controller (POST /v1/workloads)");
  if (r->status != 200) return Unavailable("the controller answered HTTP " + std::to_string(r->status));
  StatusOr<controller::Workload> w = controller::WorkloadFromJson(r->body);
  if (!w.ok()) return w.status();
  WorkloadDefaults d;
  d.tflops = controller::ToTflops(w->milli_tflops);
  d.tflops_limit = w->milli_tflops_limit > w->milli_tflops ? controller::ToTflops(w->milli_tflops_limit) : 0;
  d.vram_mib = w->vram_mib;
  d.gpu_count = w->gpu_count;
  d.qos = controller::QosName(w->qos);
  d.pool = w->pool;
  return d;
}

void Answer(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_content(body, "application/json");
}

// Runs a handler; a JSON field of an unexpected type anywhere is a 400, never a crash.
template <typename F>
void Guarded(httplib::Response& res, F&& handler) {
  try {
    auto reply = handler();
    Answer(res, reply.http_status, reply.body);
  } catch (const std::exception& e) {
    Answer(res, 400, json{{"error", std::string("malformed request: ") + e.what()}}.dump());
  }
}

}  // namespace

int RunK8s(const K8sOptions& o) {
  if (o.tls_cert.empty() || o.tls_key.empty()) return Fail("--tls-cert and --tls-key are required (the API server speaks HTTPS only)");
  for (const std::string* f : {&o.tls_cert, &o.tls_key}) {
    if (!Readable(*f)) return Fail("cannot read " + *f);
  }
  if (o.controller_url.empty()) return Fail("--controller URL is required");
  if (o.host_shm_dir.empty() || o.host_shm_dir[0] != '/' || o.host_shm_dir.find("/../") != std::string::npos ||
      std::any_of(o.host_shm_dir.begin(), o.host_shm_dir.end(), [](char c) { return c < 0x20 || c == 0x7f; }))
    return Fail("--host-shm-dir " + o.host_shm_dir + ": must be an absolute path on the nodes");
  std::string token;
  if (!o.token_file.empty()) {
    std::ifstream in(o.token_file);
    if (!in) return Fail("cannot read --token-file " + o.token_file);
    std::stringstream ss;
    ss << in.rdbuf();
    token = ss.str();
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) token.pop_back();
  } else if (const char* env = std::getenv("TFUSION_TOKEN")) {
    token = env;
  }
  if (token.empty()) return Fail("no controller token: give --token-file FILE or set TFUSION_TOKEN");
  if (!o.ca_file.empty()) {
    if (Status ca = controller::CheckCaFile(o.ca_file); !ca.ok()) return Fail(ca.message());
  }
  // The same client as the controller's reconciler; no --kube-api means in-cluster. Unlike the
  // controller, plain http:// is refused: the service account's token would cross in clear.
  StatusOr<controller::KubeApiConfig> kube_config = controller::ResolveKubeApiConfig(
      o.kube_api.empty() ? "in-cluster" : o.kube_api, o.kube_token_file, o.kube_ca_file);
  if (!kube_config.ok()) return Fail(kube_config.status().message());
  if (kube_config->url.rfind("https://", 0) != 0)
    return Fail("--kube-api " + kube_config->url + ": must be an https:// URL (the service account token is sent)");

  if (!o.worker_token_file.empty() && !o.worker_token_secret.empty())
    return Fail("give --worker-token-file (a ticket per pod) or --worker-token-secret (one credential for every "
                "pod), not both");
  if (o.ticket_days < 1 || o.ticket_days > 3650) return Fail("--ticket-days must be 1 to 3650");
  if (!o.worker_token_file.empty()) {
    if (StatusOr<std::string> t = ReadWorkerToken(o.worker_token_file); !t.ok()) return Fail(t.status().message());
  }

  controller::HttpClient controller(o.controller_url, token, 5000, o.ca_file);
  controller::KubeApi kube(*kube_config);
  Extender extender(&controller, &kube, TicketOptions{o.worker_token_file, o.ticket_days * 24 * 3600});
  WebhookOptions webhook;
  webhook.scheduler_name = o.scheduler_name;
  webhook.limiter_image = o.limiter_image;
  webhook.worker_token_secret = o.worker_token_secret;
  webhook.pod_tickets = !o.worker_token_file.empty();
  webhook.host_shm_dir = o.host_shm_dir;
  webhook.lookup_profile = [&controller](const std::string& name) { return LookupProfile(&controller, name); };

  httplib::SSLServer server(o.tls_cert.c_str(), o.tls_key.c_str());
  if (!server.is_valid())
    return Fail("cannot serve TLS with --tls-cert " + o.tls_cert + " and --tls-key " + o.tls_key +
                " (not PEM, or the key does not match the certificate)");
  server.set_socket_options(controller::ExclusiveListenSocket);
  server.set_payload_max_length(8u << 20);  // a pod is at most ~1.5 MiB
  server.Post("/mutate", [&](const httplib::Request& req, httplib::Response& res) {
    Guarded(res, [&] { return HandleAdmissionReview(req.body, webhook); });
  });
  server.Post("/filter", [&](const httplib::Request& req, httplib::Response& res) {
    Guarded(res, [&] { return extender.Filter(req.body); });
  });
  server.Post("/prioritize", [&](const httplib::Request& req, httplib::Response& res) {
    Guarded(res, [&] { return extender.Prioritize(req.body); });
  });
  server.Post("/bind", [&](const httplib::Request& req, httplib::Response& res) {
    Guarded(res, [&] { return extender.Bind(req.body); });
  });
  server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) { Answer(res, 200, R"({"ok":true})"); });

  const int port = o.port == 0 ? server.bind_to_any_port(o.listen_host.c_str())
                               : (server.bind_to_port(o.listen_host.c_str(), o.port) ? o.port : -1);
  if (port <= 0) return Fail("cannot listen on " + o.listen_host + ":" + std::to_string(o.port) + " (in use?)");
  g_stop.store(false);
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  signal(SIGPIPE, SIG_IGN);
  std::thread serving([&] { server.listen_after_bind(); });
  std::printf("tfusion k8s listening on https://%s:%d (controller %s, Kubernetes API %s)\n", o.listen_host.c_str(),
              port, o.controller_url.c_str(), kube.url().c_str());
  std::fflush(stdout);
  while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server.stop();
  serving.join();
  return 0;
}

}  // namespace tf::k8s
