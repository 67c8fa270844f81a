#include "k8s/extender.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <vector>

#include <nlohmann/json.hpp>

#include "controller/model.h"
#include "controller/placement.h"
#include "k8s/admission.h"
#include "k8s/pod_request.h"
#include "worker/session_ticket.h"

namespace tf::k8s {
namespace {

using json = nlohmann::json;
using controller::HttpResponse;

constexpr char kDefaultPool[] = "default";  // the controller's default pool

// The controller's state, as its API serves it.
struct View {
  std::vector<controller::Pool> pools;
  std::vector<controller::Node> nodes;
  std::vector<controller::Gpu> gpus;
  std::vector<controller::Allocation> allocations;
  std::vector<controller::TenantQuota> quotas;
};

std::string ErrorText(const HttpResponse& r) {
  json j = json::parse(r.body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string())
    return j["error"]["message"].get<std::string>();
  return "HTTP " + std::to_string(r.status);
}

template <typename T, typename Parse>
Status FetchList(controller::HttpClient* c, const std::string& path, const char* field, Parse parse,
                 std::vector<T>* out) {
  StatusOr<HttpResponse> r = c->Get(path);
  if (!r.ok()) return Unavailable("controller: " + r.status().message());
  if (r->status != 200) return Unavailable("controller: GET " + path + ": " + ErrorText(*r));
  json j = json::parse(r->body, nullptr, false);
  if (!j.is_object() || !j.contains(field) || !j[field].is_array())
    return Unavailable("controller: GET " + path + ": unexpected answer");
  for (const json& item : j[field]) {
    StatusOr<T> v = parse(item.dump());
    if (!v.ok()) return Unavailable("controller: GET " + path + ": " + v.status().message());
    out->push_back(std::move(*v));
  }
  return Status::Ok();
}

StatusOr<View> FetchView(controller::HttpClient* c) {
  View v;
  TF_RETURN_IF_ERROR(FetchList(c, "/v1/pools", "pools", controller::PoolFromJson, &v.pools));
  TF_RETURN_IF_ERROR(FetchList(c, "/v1/nodes", "nodes", controller::NodeFromJson, &v.nodes));
  TF_RETURN_IF_ERROR(FetchList(c, "/v1/gpus", "gpus", controller::GpuFromJson, &v.gpus));
  TF_RETURN_IF_ERROR(FetchList(c, "/v1/allocations", "allocations", controller::AllocationFromJson, &v.allocations));
  TF_RETURN_IF_ERROR(FetchList(c, "/v1/quotas", "quotas", controller::TenantQuotaFromJson, &v.quotas));
  return v;
}

// The engine mirrors `v` (which must outlive nothing: Reset copies what it keeps).
std::unique_ptr<controller::PlacementEngine> EngineFor(const View& v) {
  controller::ClusterSnapshot s;
  for (const auto& p : v.pools) s.pools.push_back(&p);
  for (const auto& n : v.nodes) s.nodes.push_back(&n);
  for (const auto& g : v.gpus) s.gpus.push_back(&g);
  for (const auto& a : v.allocations) s.allocations.push_back(&a);
  for (const auto& q : v.quotas) s.quotas.push_back(&q);
  auto engine = controller::MakeSchedulerPlacement();
  engine->Reset(s);
  return engine;
}

std::string Str(const json& o, const char* key) {
  if (!o.is_object()) return "";
  auto it = o.find(key);
  return it != o.end() && it->is_string() ? it->get<std::string>() : "";
}

// A pod as the extender sees it.
struct PodTarget {
  bool ours = false;  // labelled tensor-fusion.ai/enabled=true
  std::string name, ns, uid;
  PodGpuRequest request;
};

// kInvalidArgument (with a message for the pod's events) when the pod is ours but carries no valid
// recorded request.
StatusOr<PodTarget> PodOf(const json& pod) {
  PodTarget t;
  if (!pod.is_object()) return InvalidArgument("the pod is missing");
  const json meta = pod.contains("metadata") ? pod["metadata"] : json::object();
  t.name = Str(meta, "name");
  t.ns = Str(meta, "namespace");
  t.uid = Str(meta, "uid");
  const json labels = meta.is_object() && meta.contains("labels") ? meta["labels"] : json::object();
  t.ours = Str(labels, kEnabledLabel) == "true";
  if (!t.ours) return t;
  const json annotations = meta.is_object() && meta.contains("annotations") ? meta["annotations"] : json::object();
  const std::string recorded = Str(annotations, kRequestAnnotation);
  if (recorded.empty()) {
    return InvalidArgument(std::string("the pod has no ") + kRequestAnnotation +
                           " annotation: it was not admitted through the TensorFusion webhook");
  }
  StatusOr<PodGpuRequest> r = PodRequestFromJson(recorded);
  if (!r.ok()) return r.status();
  t.request = *r;
  return t;
}

controller::PlacementRequest ToPlacement(const PodTarget& t) {
  controller::PlacementRequest p;
  p.id = "k8s-" + t.uid;
  p.pool = t.request.pool.empty() ? kDefaultPool : t.request.pool;
  p.tenant = t.ns;
  p.tflops = t.request.tflops;
  p.tflops_limit = t.request.tflops_limit;
  p.percent = t.request.percent;
  p.percent_limit = t.request.percent_limit;
  p.vram_mib = t.request.vram_mib;
  p.gpu_count = t.request.gpu_count;
  p.qos = controller::ParseQos(t.request.qos).ok() ? *controller::ParseQos(t.request.qos) : controller::Qos::kMedium;
  p.gpu_model = t.request.gpu_model;
  return p;
}

// The node names of ExtenderArgs: nodes.items[].metadata.name (nodeCacheCapable false) or
// nodenames (true). kInvalidArgument when neither is there.
StatusOr<std::vector<std::string>> NodeNames(const json& args, bool* as_names) {
  std::vector<std::string> names;
  if (args.contains("nodes") && args["nodes"].is_object()) {
    *as_names = false;
    const json& items = args["nodes"].contains("items") ? args["nodes"]["items"] : json::array();
    if (!items.is_array() && !items.is_null()) return InvalidArgument("nodes.items is not an array");
    for (const json& n : items.is_null() ? json::array() : items) {
      std::string name = n.is_object() && n.contains("metadata") ? Str(n["metadata"], "name") : "";
      if (name.empty()) return InvalidArgument("a node in nodes.items has no metadata.name");
      names.push_back(name);
    }
    return names;
  }
  if (args.contains("nodenames") && args["nodenames"].is_array()) {
    *as_names = true;
    for (const json& n : args["nodenames"]) {
      if (!n.is_string() || n.get<std::string>().empty()) return InvalidArgument("nodenames holds a non-name");
      names.push_back(n.get<std::string>());
    }
    return names;
  }
  return InvalidArgument("ExtenderArgs has neither nodes nor nodenames");
}

ExtenderReply BadRequest(const std::string& message) { return {400, json{{"error", message}}.dump()}; }

StatusOr<json> ParseArgs(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) return InvalidArgument("the body is not JSON");
  if (!j.is_object()) return InvalidArgument("the body is not a JSON object");
  return j;
}

// What Filter and Prioritize are both sent: ExtenderArgs with a pod and the candidate nodes.
struct Candidates {
  json args;
  std::vector<std::string> names;
  bool as_names = false;  // the nodes came as nodenames, not as a NodeList
};

StatusOr<Candidates> ParseCandidates(const std::string& body) {
  StatusOr<json> args = ParseArgs(body);
  if (!args.ok()) return args.status();
  Candidates c;
  StatusOr<std::vector<std::string>> names = NodeNames(*args, &c.as_names);
  if (!names.ok()) return names.status();
  if (!args->contains("pod") || !(*args)["pod"].is_object()) return InvalidArgument("ExtenderArgs has no pod");
  c.args = std::move(*args);
  c.names = std::move(*names);
  return c;
}

// Per node: "" when the pod's vGPU can go there, else why not (and whether more room could help).
struct NodeVerdict {
  std::string why_not;
  bool unresolvable = false;
};

StatusOr<std::map<std::string, NodeVerdict>> Judge(const PodTarget& pod, const std::vector<std::string>& names,
                                                   const View& view, std::map<std::string, double>* scores) {
  std::map<std::string, NodeVerdict> out;
  auto engine = EngineFor(view);
  const controller::PlacementRequest pr = ToPlacement(pod);
  StatusOr<controller::PlacementDecision> anywhere = engine->Place(pr, false);
  if (!anywhere.ok() && anywhere.status().code() != StatusCode::kOutOfMemory) {
    for (const auto& n : names) out[n] = {anywhere.status().message(), true};
    return out;
  }
  if (!pod.request.local) {  // the pod runs anywhere; its vGPU is somewhere in the pool
    for (const auto& n : names) {
      if (anywhere.ok()) {
        out[n] = {};
        if (scores) (*scores)[n] = 0;
      } else {
        out[n] = {"no room for the vGPU in pool '" + pr.pool + "': " + anywhere.status().message(), false};
      }
    }
    return out;
  }
  StatusOr<std::vector<sched::NodeFit>> fits = engine->RankNodes(pr);
  if (!fits.ok()) {
    for (const auto& n : names) out[n] = {fits.status().message(), true};
    return out;
  }
  std::map<std::string, const sched::NodeFit*> by_name;
  for (const auto& f : *fits) by_name[f.name] = &f;
  std::map<std::string, const controller::Node*> nodes;
  for (const auto& n : view.nodes) nodes[n.name] = &n;
  for (const auto& name : names) {
    auto node = nodes.find(name);
    if (node == nodes.end()) {
      out[name] = {"the node is not registered with the TensorFusion controller (no node agent)", true};
      continue;
    }
    if (node->second->pool != pr.pool) {
      out[name] = {"the node is in pool '" + node->second->pool + "', the pod asks for pool '" + pr.pool + "'", true};
      continue;
    }
    auto f = by_name.find(name);
    if (f == by_name.end()) {
      out[name] = {"the node has no GPU the scheduler knows", true};
    } else if (!f->second->fits) {
      out[name] = {"no room for the vGPU: " + f->second->why_not, false};
    } else {
      out[name] = {};
      if (scores) (*scores)[name] = f->second->score;
    }
  }
  return out;
}

}  // namespace

ExtenderReply Extender::Filter(const std::string& body) const {
  StatusOr<Candidates> call = ParseCandidates(body);
  if (!call.ok()) return BadRequest(call.status().message());
  const json& args = call->args;
  const std::vector<std::string>& names = call->names;
  const bool as_names = call->as_names;
  StatusOr<PodTarget> pod = PodOf(args["pod"]);
  std::map<std::string, NodeVerdict> verdicts;
  if (!pod.ok()) {
    for (const auto& n : names) verdicts[n] = {pod.status().message(), true};
  } else if (pod->ours) {
    StatusOr<View> view = FetchView(controller_);
    if (!view.ok()) return {200, json{{"error", view.status().message()}}.dump()};
    StatusOr<std::map<std::string, NodeVerdict>> v = Judge(*pod, names, *view, nullptr);
    if (!v.ok()) return {200, json{{"error", v.status().message()}}.dump()};
    verdicts = std::move(*v);
  }
  json failed = json::object(), unresolvable = json::object(), passing = json::array();
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    const NodeVerdict& v = verdicts[n];
    if (v.why_not.empty()) {
      passing.push_back(as_names ? json(n) : args["nodes"]["items"][i]);
    } else {
      (v.unresolvable ? unresolvable : failed)[n] = v.why_not;
    }
  }
  json result = {{"failedNodes", failed}, {"failedAndUnresolvableNodes", unresolvable}};
  if (as_names) result["nodenames"] = passing;
  else result["nodes"] = {{"apiVersion", "v1"}, {"kind", "NodeList"}, {"metadata", json::object()}, {"items", passing}};
  return {200, result.dump()};
}

ExtenderReply Extender::Prioritize(const std::string& body) const {
  StatusOr<Candidates> call = ParseCandidates(body);
  if (!call.ok()) return BadRequest(call.status().message());
  const json& args = call->args;
  const std::vector<std::string>& names = call->names;
  std::map<std::string, double> scores;
  StatusOr<PodTarget> pod = PodOf(args["pod"]);
  if (pod.ok() && pod->ours) {
    StatusOr<View> view = FetchView(controller_);
    if (!view.ok()) return {503, json{{"error", view.status().message()}}.dump()};
    (void)Judge(*pod, names, *view, &scores);
  }
  // The mode's scores (higher preferred) mapped onto 1..10 for the nodes that fit; 0 otherwise.
  double lo = HUGE_VAL, hi = -HUGE_VAL;
  for (const auto& [n, s] : scores) {
    lo = std::min(lo, s);
    hi = std::max(hi, s);
  }
  json list = json::array();
  for (const auto& n : names) {
    int64_t score = 0;
    if (auto it = scores.find(n); it != scores.end()) {
      score = hi > lo ? 1 + std::llround(9 * (it->second - lo) / (hi - lo)) : 10;
      if (!pod->request.local) score = 0;  // a remote pod's node does not matter to its vGPU
    }
    list.push_back({{"host", n}, {"score", score}});
  }
  return {200, list.dump()};
}

StatusOr<std::string> ReadWorkerToken(const std::string& path) {
  std::ifstream in(path);
  std::string token;
  if (!in) return Unavailable("cannot read the workers' token file " + path);
  if (!std::getline(in, token) || token.empty())
    return InvalidArgument("the workers' token file " + path + " is empty (its first line is the token)");
  return token;
}

ExtenderReply Extender::Bind(const std::string& body) const {
  StatusOr<json> args = ParseArgs(body);
  if (!args.ok()) return BadRequest(args.status().message());
  const std::string name = Str(*args, "podName"), ns = Str(*args, "podNamespace"), uid = Str(*args, "podUID"),
                    node = Str(*args, "node");
  // Kubernetes names: lower-case alphanumerics and '-' (and '.' in subdomains); UIDs also upper case.
  auto valid = [](const std::string& s, size_t max, const char* extra) {
    if (s.empty() || s.size() > max) return false;
    for (char c : s) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || (c != '\0' && std::strchr(extra, c) != nullptr)))
        return false;
    }
    return true;
  };
  if (!valid(name, 253, ".")) return BadRequest("podName must be a DNS subdomain name (got \"" + name + "\")");
  if (!valid(ns, 63, "")) return BadRequest("podNamespace must be a DNS label (got \"" + ns + "\")");
  if (!valid(uid, 128, "ABCDEFGHIJKLMNOPQRSTUVWXYZ")) return BadRequest("podUID must be a UID (got \"" + uid + "\")");
  if (!valid(node, 253, ".")) return BadRequest("node must be a DNS subdomain name (got \"" + node + "\")");
  auto fail = [](const std::string& why) { return ExtenderReply{200, json{{"error", why}}.dump()}; };

  const std::string pod_path = "/api/v1/namespaces/" + ns + "/pods/" + name;
  StatusOr<controller::KubeResponse> got = kube_->Call("GET", pod_path);
  if (!got.ok()) return fail(got.status().message());
  if (got->status != 200) return fail("GET " + pod_path + ": HTTP " + std::to_string(got->status));
  json pod = json::parse(got->body, nullptr, false);
  StatusOr<PodTarget> target = PodOf(pod);
  if (!target.ok()) return fail(target.status().message());
  if (target->uid != uid) return fail("pod " + ns + "/" + name + " has uid " + target->uid + ", not " + uid);
  if (!target->ours) return fail("pod " + ns + "/" + name + " is not labelled " + kEnabledLabel + "=true");
  const std::string bound = pod.contains("spec") ? Str(pod["spec"], "nodeName") : "";
  if (!bound.empty() && bound != node) return fail("pod " + ns + "/" + name + " is already bound to " + bound);

  // Reserve: one allocation per pod uid, however often the bind is retried.
  const PodGpuRequest& r = target->request;
  json alloc = {{"pool", r.pool.empty() ? kDefaultPool : r.pool},
                {"vram_mib", r.vram_mib},
                {"gpu_count", r.gpu_count},
                {"qos", r.qos},
                {"tenant", ns},
                {"request_id", "pod-" + uid},
                {"allow_preemption", false}};
  if (r.tflops > 0) alloc["tflops"] = r.tflops;
  if (r.tflops_limit > 0) alloc["tflops_limit"] = r.tflops_limit;
  if (r.percent > 0) alloc["percent"] = r.percent;
  if (r.percent_limit > 0) alloc["percent_limit"] = r.percent_limit;
  if (!r.gpu_model.empty()) alloc["gpu_model"] = r.gpu_model;
  if (r.local) alloc["node"] = node;
  StatusOr<HttpResponse> made = controller_->Post("/v1/allocations", alloc.dump());
  if (!made.ok()) return fail("controller: " + made.status().message());
  if (made->status != 200 && made->status != 201) return fail("controller refused the vGPU: " + ErrorText(*made));
  json a = json::parse(made->body, nullptr, false);
  const std::string id = Str(a, "id");
  if (id.empty()) return fail("controller: an allocation without an id");
  std::string gpus;
  if (a.contains("vgpus") && a["vgpus"].is_array()) {
    for (const json& v : a["vgpus"]) gpus += (gpus.empty() ? "" : ",") + Str(v, "gpu");
  }
  auto release = [&](const std::string& why) {
    StatusOr<HttpResponse> d = controller_->Delete("/v1/allocations/" + id);
    const bool released = d.ok() && (d->status == 200 || d->status == 404);
    return fail(why + (released ? "; allocation " + id + " released"
                                : "; allocation " + id + " could not be released: " +
                                      (d.ok() ? ErrorText(*d) : d.status().message())));
  };
  if (r.local && Str(a, "node") != node)
    return fail("pod " + ns + "/" + name + " already holds allocation " + id + " on node " + Str(a, "node"));

  json annotations = {{kAllocationAnnotation, id}, {kGpuIdsAnnotation, gpus}};
  if (!r.local) {
    StatusOr<HttpResponse> n = controller_->Get("/v1/nodes/" + Str(a, "node"));
    const json nj = n.ok() && n->status == 200 ? json::parse(n->body, nullptr, false) : json();
    const std::string worker = Str(nj, "worker_address");
    if (worker.empty())
      return release("node " + Str(a, "node") + ", where the vGPU was placed, has no worker for remote pods "
                     "(tfusion hypervisor --worker-address)");
    annotations[kWorkerAnnotation] = worker;
    if (!tickets_.worker_token_file.empty()) {
      StatusOr<std::string> token = ReadWorkerToken(tickets_.worker_token_file);
      if (!token.ok()) return release(token.status().message());
      worker::SessionLimits limits = RemotePodLimits(r);
      limits.gpu = gpus;
      limits.allocation = id;
      const std::string ticket =
          worker::MintSessionTicket(*token, time(nullptr) + tickets_.ttl_s, worker::SessionLimitsDigest(limits));
      if (ticket.empty()) return release("cannot make the pod's session ticket (no randomness)");
      annotations[kTicketAnnotation] = ticket;
    }
  }
  if (bound == node) return {200, json::object().dump()};  // bound before; the answer was lost

  json binding = {{"apiVersion", "v1"},
                  {"kind", "Binding"},
                  {"metadata", {{"name", name}, {"namespace", ns}, {"uid", uid}, {"annotations", annotations}}},
                  {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}}}};
  StatusOr<controller::KubeResponse> b = kube_->Call("POST", pod_path + "/binding", binding.dump());
  if (b.ok() && (b->status == 200 || b->status == 201)) return {200, json::object().dump()};
  if (b.ok() && b->status == 409) {
    // Already bound: by an earlier attempt of ours (fine) or elsewhere (release).
    StatusOr<controller::KubeResponse> again = kube_->Call("GET", pod_path);
    json p = again.ok() && again->status == 200 ? json::parse(again->body, nullptr, false) : json();
    if (p.is_object() && p.contains("spec") && Str(p["spec"], "nodeName") == node) return {200, json::object().dump()};
  }
  return release("binding pod " + ns + "/" + name + " to " + node + " failed: " +
                 (b.ok() ? "HTTP " + std::to_string(b->status) + " " + b->body.substr(0, 300) : b.status().message()));
}

}  // namespace tf::k8s
