// ApiServer: the controller's HTTP/JSON API (cpp-httplib) in front of a Controller.
//
// Every request but GET /healthz and the console's static files must carry "Authorization: Bearer
// <token>" (compared in constant time); otherwise 401. Errors are JSON: {"error": {"code": "invalid_argument",
// "message": "..."}} with 400 (bad input), 401, 404, 409 (conflict or no capacity), 503 (this
// replica is not the leader). A rejected request changes nothing.
//
//   GET  /healthz                        liveness, no token: {"ok": true, "serving": bool}
//   GET  /metrics                        Prometheus text
//   GET|POST /v1/pools, GET|PUT|DELETE /v1/pools/{name}   (placement_mode, tflops_oversell_ratio)
//   GET /v1/quotas, PUT|DELETE /v1/quotas/{tenant}        (max_tflops, max_vram_mib, max_gpus, max_qos)
//   GET|POST /v1/nodes (POST registers), GET /v1/nodes/{name}, POST /v1/nodes/{name}/heartbeat,
//   POST /v1/nodes/{name}/cordon and /uncordon (admin)
//   GET  /v1/gpus[?pool=NAME]
//   GET|POST /v1/workloads, GET|DELETE /v1/workloads/{name}
//   GET|POST /v1/allocations[?node=NAME], GET|DELETE /v1/allocations/{id}
//     POST answers the allocation plus "preempted": the ids preempted to make room for it, and
//     "preempted_suspended": those of them suspended (tiering: kept, swapped out) not released
//   GET /v1/evictions[?node=NAME], GET /v1/evictions/{id}, POST /v1/evictions/{id}/stopped
//                                                         (allocations taken back; the agent reports)
//   GET  /v1/usage                       pools and GPUs: allocated, schedulable and used now
//   GET  /v1/history[?since_ms=T][&pool=NAME]   the same sampled over time (usage_history.h)
//   GET  /, /console, /console/FILE      the web console, no token (web_console.h)
//
// Thread safety: requests run on the server's worker threads; the Controller serializes them.
#pragma once

#include <functional>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.h"
#include "controller/controller.h"
#include "controller/tls_files.h"

namespace httplib {
class Server;
}

namespace tf::controller {

class UsageHistory;

// Constant-time equality of two secrets (time depends only on the presented length).
bool TokenEquals(const std::string& expected, const std::string& presented);

// Socket options for a listening socket that is ours alone (SO_REUSEADDR, never SO_REUSEPORT): a
// second server on a port in use fails to bind. For httplib::Server::set_socket_options.
void ExclusiveListenSocket(int sock);

class ApiServer {
 public:
  // `controller` must outlive the server. `token` must not be empty. With `tls` (REQUIRES files
  // that passed CheckServerTls) the server speaks only HTTPS (TLS 1.2 or later): /metrics and
  // /healthz included; a plain HTTP request is dropped at the handshake.
  ApiServer(Controller* controller, std::string token, ServerTlsFiles tls = {});
  ~ApiServer();

  // How a standby names the leader in its 503 answers (the leader's identity, "" when unknown).
  // Call before Start().
  void SetLeaderLookup(std::function<std::string()> lookup) { leader_lookup_ = std::move(lookup); }
  // Where GET /v1/history reads (null: it answers 404). Must outlive the server; call before Start().
  void SetUsageHistory(const UsageHistory* history) { history_ = history; }

  // Binds host:port (port 0 picks a free one); returns the bound port. kInvalidArgument when the
  // TLS files could not be loaded.
  StatusOr<int> Bind(const std::string& host, int port);
  // Serves on a background thread until Stop().
  void Start();
  void Stop();
  bool tls() const { return tls_.enabled(); }

  // Every /v1/ request from its headers' arrival (parsed) to its answer written to the socket
  // (exported at /metrics as tf_controller_api_request_seconds; bench/controller prints it).
  LatencyHistogram& request_times() { return request_times_; }

 private:
  void Routes();

  Controller* const controller_;
  const std::string token_;
  const ServerTlsFiles tls_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  LatencyHistogram request_times_;
  std::vector<std::pair<std::string, std::regex>> routes_;  // method, path pattern: for 405
  std::function<std::string()> leader_lookup_;
  const UsageHistory* history_ = nullptr;
};

}  // namespace tf::controller
