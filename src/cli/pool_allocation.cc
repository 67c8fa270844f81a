#include "cli/pool_allocation.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "controller/http_client.h"
#include "transport/tcp_transport.h"

namespace tf::cli {
namespace {

using nlohmann::json;

constexpr uint64_t kMiB = 1ull << 20;

// The controller's {"error":{"code","message"}} as a Status with the same code.
Status FromReply(int http_status, const std::string& body, const std::string& what) {
  json j = json::parse(body, nullptr, false);
  std::string code, message = body;
  if (!j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_object()) {
    code = j["error"].value("code", "");
    message = j["error"].value("message", body);
  }
  message = what + ": " + message;
  if (code == "invalid_argument" || http_status == 400) return InvalidArgument(message);
  if (code == "unauthenticated" || http_status == 401) return Unauthenticated(message);
  // A refusal of this token (a tenant's QoS cap, another tenant named): not a controller that
  // cannot be reached, which a run may work around on a local vGPU.
  if (code == "permission_denied" || http_status == 403) return PermissionDenied(message);
  if (code == "not_found" || http_status == 404) return NotFound(message);
  if (code == "out_of_memory") return OutOfMemory(message);
  if (code == "resource_exhausted") return ResourceExhausted(message);
  if (code == "aborted") return Status(StatusCode::kAborted, message);
  if (code == "failed_precondition") return FailedPrecondition(message);
  if (code == "already_exists") return AlreadyExists(message);
  // Every replica answered, and none serves (standbys, or a leader without its store): not a
  // controller that cannot be reached.
  if (http_status == 503) return FailedPrecondition(message + " (HTTP 503: no replica serves now; try again shortly)");
  return Unavailable(message + " (HTTP " + std::to_string(http_status) + ")");
}

}  // namespace

StatusOr<PoolAllocation> RequestPoolAllocation(const std::string& url, const std::string& token,
                                               double tflops_or_0, double percent_or_0,
                                               uint64_t vram_bytes, const std::string& pool,
                                               const std::string& qos, const std::string& tenant,
                                               double limit_or_0, int lease_s, int64_t idle_swap_ms,
                                               int64_t idle_disk_ms, int64_t idle_zero_ms) {
  const bool by_tflops = tflops_or_0 > 0, by_percent = percent_or_0 > 0;
  if (!std::isfinite(tflops_or_0) || !std::isfinite(percent_or_0) || tflops_or_0 < 0 ||
      percent_or_0 < 0 || by_tflops == by_percent)
    return InvalidArgument("give exactly one of TFLOPS or percent of a GPU, as a positive number");
  if (by_percent && percent_or_0 > 100) return InvalidArgument("percent of a GPU must be at most 100");
  const double request = by_tflops ? tflops_or_0 : percent_or_0;
  if (!std::isfinite(limit_or_0) || limit_or_0 < 0) return InvalidArgument("the compute limit must be a positive number");
  if (limit_or_0 > 0 && limit_or_0 < request)
    return InvalidArgument("the compute limit is below the request: the limit is the ceiling and must be at least the request");
  if (by_percent && limit_or_0 > 100) return InvalidArgument("the percent limit must be at most 100");
  if (vram_bytes == 0) return InvalidArgument("VRAM must be positive");
  json body = {{"vram_mib", static_cast<int64_t>((vram_bytes + kMiB - 1) / kMiB)}, {"gpu_count", 1}};
  if (by_tflops) body["tflops"] = tflops_or_0;
  else body["percent"] = percent_or_0;
  if (limit_or_0 > 0) body[by_tflops ? "tflops_limit" : "percent_limit"] = limit_or_0;
  if (!pool.empty()) body["pool"] = pool;
  if (!qos.empty()) body["qos"] = qos;
  if (!tenant.empty()) body["tenant"] = tenant;
  if (lease_s > 0) body["lease_s"] = lease_s;
  if (idle_swap_ms >= 0) body["idle_swap_ms"] = idle_swap_ms;
  if (idle_disk_ms >= 0) body["idle_disk_ms"] = idle_disk_ms;
  if (idle_zero_ms >= 0) body["idle_zero_ms"] = idle_zero_ms;

  // An idempotency key: when the answer is lost (timeout, a controller restart), the retry gets
  // the allocation the first attempt made instead of holding a second one.
  std::random_device rd;
  char key[40];
  std::snprintf(key, sizeof key, "run-%08x%08x%08x", rd(), rd(), rd());
  body["request_id"] = key;

  controller::ReplicaClient client(url, token);
  StatusOr<controller::HttpResponse> r = client.Post("/v1/allocations", body.dump());
  for (int retry = 0; retry < 2 && !r.ok() && r.status().code() == StatusCode::kUnavailable; ++retry) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500 << retry));
    r = client.Post("/v1/allocations", body.dump());
  }
  if (!r.ok()) return r.status();
  if (r->status != 201 && r->status != 200) return FromReply(r->status, r->body, "allocating a vGPU from " + url);
  json j = json::parse(r->body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("vgpus") || !j["vgpus"].is_array() ||
      j["vgpus"].empty() || !j["vgpus"][0].is_object())
    return Internal("the controller's allocation answer is not what this client understands");
  const json& v = j["vgpus"][0];
  PoolAllocation a;
  a.id = j.value("id", "");
  a.node = j.value("node", "");
  a.gpu_uuid = v.value("gpu", "");
  a.gpu_index = v.value("gpu_index", 0);
  a.vram_bytes = static_cast<uint64_t>(v.value("vram_mib", int64_t{0})) * kMiB;
  a.share_ppm = v.value("share_ppm", uint64_t{0});
  a.limit_ppm = v.value("limit_ppm", a.share_ppm);  // an older controller: limit = request
  a.tflops = v.value("tflops", 0.0);
  a.tflops_limit = v.value("tflops_limit", a.tflops);
  a.qos = j.value("qos", "medium");
  a.tiering = j.value("tiering", false);
  a.idle_swap_ms = j.value("idle_swap_ms", int64_t{-1});
  a.idle_disk_ms = j.value("idle_disk_ms", int64_t{-1});
  a.idle_zero_ms = j.value("idle_zero_ms", int64_t{-1});
  if (a.id.empty() || a.gpu_uuid.empty()) return Internal("the controller's allocation answer lacks an id or GPU");
  return a;
}

Status RenewPoolAllocation(const std::string& url, const std::string& token, const std::string& id) {
  if (id.empty()) return InvalidArgument("allocation id must not be empty");
  controller::ReplicaClient client(url, token);
  StatusOr<controller::HttpResponse> r = client.Post("/v1/allocations/" + id + "/renew", "{}");
  if (!r.ok()) return r.status();
  if (r->status != 200) return FromReply(r->status, r->body, "renewing " + id);
  return Status::Ok();
}

Status ReleasePoolAllocation(const std::string& url, const std::string& token, const std::string& id) {
  if (id.empty()) return InvalidArgument("allocation id must not be empty");
  controller::ReplicaClient client(url, token);
  StatusOr<controller::HttpResponse> r = client.Delete("/v1/allocations/" + id);
  if (!r.ok()) return r.status();
  if (r->status != 200) return FromReply(r->status, r->body, "releasing " + id);
  return Status::Ok();
}

namespace {

// GET `path` from the controller as a JSON object; `what` names the lookup in errors.
StatusOr<json> GetObject(const std::string& url, const std::string& token, const std::string& path,
                         const std::string& what) {
  controller::ReplicaClient client(url, token);
  StatusOr<controller::HttpResponse> r = client.Get(path);
  if (!r.ok()) return r.status();
  if (r->status != 200) return FromReply(r->status, r->body, "looking up " + what);
  json j = json::parse(r->body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Internal("the controller's answer about " + what + " is not JSON");
  return j;
}

}  // namespace

StatusOr<std::string> EvictionReason(const std::string& url, const std::string& token,
                                     const std::string& id) {
  if (id.empty()) return InvalidArgument("allocation id must not be empty");
  StatusOr<json> j = GetObject(url, token, "/v1/evictions/" + id, id);
  if (!j.ok()) return j.status();
  std::string reason = j->value("reason", "evicted");
  if (!j->value("preempted_by", "").empty()) reason += " by " + j->value("preempted_by", "");
  return reason;
}

StatusOr<std::string> NodeWorkerAddress(const std::string& url, const std::string& token,
                                        const std::string& node) {
  if (node.empty()) return InvalidArgument("node name must not be empty");
  StatusOr<json> j = GetObject(url, token, "/v1/nodes/" + node, "node " + node);
  if (!j.ok()) return j.status();
  return j->value("worker_address", "");
}

Status ProbeWorkerAddress(const std::string& host_port, int timeout_ms) {
  int fd = -1;
  const transport::TransportStatus st = transport::DialTcp(host_port.c_str(), timeout_ms, &fd);
  if (st.ok()) {
    close(fd);
    return Status::Ok();
  }
  if (st.code() == transport::TransportErrc::kTimeout)
    return Unavailable("cannot connect to " + host_port + ": no answer within " + std::to_string(timeout_ms) + " ms");
  if (st.code() == transport::TransportErrc::kPeerDead && st.sys_errno() != 0)
    return Unavailable("cannot connect to " + host_port + ": " + std::strerror(st.sys_errno()));
  return Unavailable(st.message());  // a bad address, a name that does not resolve
}

StatusOr<RunPlacement> ChooseRunPlacement(const PoolAllocation& a,
                                          const std::vector<std::string>& local_gpu_uuids,
                                          const std::string& node_worker_address) {
  for (const std::string& uuid : local_gpu_uuids)
    if (uuid == a.gpu_uuid) return RunPlacement{false, ""};
  if (node_worker_address.empty()) {
    return FailedPrecondition("the controller placed this vGPU on node " + a.node + " (GPU " + a.gpu_uuid +
                              "), not on this machine, and that node has no worker address registered: "
                              "run `tfusion worker` there and start its node agent with --worker-address "
                              "HOST:PORT, or run the command on " + a.node +
                              (local_gpu_uuids.empty() ? std::string(" (this machine's GPUs were not found through NVML "
                                                                     "either: if it is " + a.node +
                                                                     ", give --nvml or TFUSION_REAL_LIBNVML)")
                                                       : std::string()));
  }
  return RunPlacement{true, node_worker_address};
}

}  // namespace tf::cli
