#include "k8s/admission.h"

#include <nlohmann/json.hpp>

#include "controller/base64.h"

namespace tf::k8s {
namespace {

using json = nlohmann::json;

constexpr char kLibVolume[] = "tensorfusion-lib";
constexpr char kShmVolume[] = "tensorfusion-shm";
constexpr char kInitName[] = "tensorfusion-init";

// A key as one JSON-pointer token (RFC 6901): "~" -> "~0", "/" -> "~1".
std::string PointerToken(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

// A string field of an object, "" when absent or not a string (input is never trusted).
std::string Str(const json& o, const char* key) {
  if (!o.is_object()) return "";
  auto it = o.find(key);
  return it != o.end() && it->is_string() ? it->get<std::string>() : "";
}

json Op(const std::string& path, json value) { return {{"op", "add"}, {"path", path}, {"value", std::move(value)}}; }

// Adds `items` to the array at `path` of `parent` (an object): the whole array when the field is
// absent or null, else one "add .../-" per item.
void AppendAll(json* ops, const json& parent, const std::string& field, const std::string& path, const json& items) {
  auto it = parent.find(field);
  if (it == parent.end() || it->is_null()) {
    ops->push_back(Op(path, items));
    return;
  }
  for (const json& item : items) ops->push_back(Op(path + "/-", item));
}

json FromAnnotation(const std::string& name, const char* annotation) {
  return {{"name", name},
          {"valueFrom", {{"fieldRef", {{"fieldPath", std::string("metadata.annotations['") + annotation + "']"}}}}}};
}

json Plain(const std::string& name, const std::string& value) { return {{"name", name}, {"value", value}}; }

// The environment of every container: the limiter (local) or the client stub (remote) preloaded
// from the injected volume, and what it needs to find its vGPU or worker.
json ContainerEnv(const PodGpuRequest& r, const WebhookOptions& o) {
  const std::string lib = std::string(kLibMount) + (r.local ? "/limiter" : "/client");
  json env = json::array();
  env.push_back(FromAnnotation("TFUSION_GPU_UUID", kGpuIdsAnnotation));
  if (r.local) {
    env.push_back(FromAnnotation("TFUSION_VGPU", kAllocationAnnotation));
    env.push_back(Plain("TFUSION_REGION", std::string(kRegionDir) + "/gpu-$(TFUSION_GPU_UUID).region"));
    env.push_back(Plain("CUDA_VISIBLE_DEVICES", "$(TFUSION_GPU_UUID)"));
    env.push_back(Plain("NVIDIA_VISIBLE_DEVICES", "$(TFUSION_GPU_UUID)"));
    env.push_back(Plain("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"));
  } else {
    env.push_back(FromAnnotation("TFUSION_REMOTE", kWorkerAnnotation));
    // The limits the stub sends the worker; the GPU and the allocation are the Binding's
    // annotations. The extender's session ticket is bound to exactly these (RemotePodLimits).
    const worker::SessionLimits limits = RemotePodLimits(r);
    for (const worker::LimitsEnvVar& v : worker::kLimitsEnv) {
      if (v.field == &worker::SessionLimits::gpu) {
        env.push_back(Plain(v.name, "$(TFUSION_GPU_UUID)"));
      } else if (v.field == &worker::SessionLimits::allocation) {
        env.push_back(FromAnnotation(v.name, kAllocationAnnotation));
      } else if (!(limits.*v.field).empty()) {
        env.push_back(Plain(v.name, limits.*v.field));
      }
    }
    if (o.pod_tickets) {
      env.push_back(FromAnnotation("TFUSION_TOKEN", kTicketAnnotation));
    } else if (!o.worker_token_secret.empty()) {
      env.push_back({{"name", "TFUSION_TOKEN"},
                     {"valueFrom", {{"secretKeyRef", {{"name", o.worker_token_secret}, {"key", "token"}}}}}});
    }
  }
  env.push_back(Plain("TRITON_LIBCUDA_PATH", lib));
  return env;
}

// The patch for a pod that passed ParsePodAnnotations. kInvalidArgument for a pod the patch cannot
// be applied to without breaking it (a name we use is taken, LD_PRELOAD from a reference).
StatusOr<json> BuildPatch(const json& pod, const PodGpuRequest& r, const WebhookOptions& o) {
  const json& spec = pod.at("spec");
  json ops = json::array();
  ops.push_back(Op("/spec/schedulerName", o.scheduler_name));

  json volumes = json::array({{{"name", kLibVolume}, {"emptyDir", json::object()}}});
  if (r.local) {
    volumes.push_back({{"name", kShmVolume}, {"hostPath", {{"path", o.host_shm_dir}, {"type", "Directory"}}}});
  }
  if (auto v = spec.find("volumes"); v != spec.end() && v->is_array()) {
    for (const json& existing : *v) {
      for (const json& ours : volumes) {
        if (Str(existing, "name") == ours["name"])
          return InvalidArgument("the pod already has a volume named '" + ours["name"].get<std::string>() +
                                 "', which TensorFusion injects: rename it");
      }
    }
  }
  AppendAll(&ops, spec, "volumes", "/spec/volumes", volumes);

  json init = {{"name", kInitName},
               {"image", o.limiter_image},
               {"command", {"cp", "-a", "/opt/tensorfusion/lib/.", std::string(kLibMount) + "/"}},
               {"volumeMounts", {{{"name", kLibVolume}, {"mountPath", kLibMount}}}}};
  auto inits = spec.find("initContainers");
  if (inits == spec.end() || inits->is_null()) {
    ops.push_back(Op("/spec/initContainers", json::array({init})));
  } else {
    for (const json& c : *inits) {
      if (Str(c, "name") == kInitName)
        return InvalidArgument(std::string("the pod already has an init container named '") + kInitName + "'");
    }
    ops.push_back(Op("/spec/initContainers/0", init));  // first: the libraries exist before anything runs
  }

  const std::string lib = std::string(kLibMount) + (r.local ? "/limiter" : "/client");
  const std::string preload = lib + "/libcuda.so.1:" + lib + "/libnvidia-ml.so.1";
  const json& containers = spec.at("containers");
  for (size_t i = 0; i < containers.size(); ++i) {
    const json& c = containers[i];
    const std::string base = "/spec/containers/" + std::to_string(i);
    const std::string cname = Str(c, "name");
    json mounts = json::array({{{"name", kLibVolume}, {"mountPath", kLibMount}, {"readOnly", true}}});
    if (r.local) mounts.push_back({{"name", kShmVolume}, {"mountPath", kRegionDir}});
    AppendAll(&ops, c, "volumeMounts", base + "/volumeMounts", mounts);

    json env = ContainerEnv(r, o);
    // LD_PRELOAD: ours first, before what the container preloads itself.
    bool preload_done = false;
    if (auto e = c.find("env"); e != c.end() && e->is_array()) {
      for (size_t k = 0; k < e->size(); ++k) {
        const json& var = (*e)[k];
        if (Str(var, "name") != "LD_PRELOAD") continue;
        if (var.contains("valueFrom"))
          return InvalidArgument("container '" + cname + "' takes LD_PRELOAD from a reference; TensorFusion "
                                 "must preload its library first: give LD_PRELOAD as a value");
        const std::string theirs = Str(var, "value");
        ops.push_back({{"op", "replace"},
                       {"path", base + "/env/" + std::to_string(k) + "/value"},
                       {"value", theirs.empty() ? preload : preload + ":" + theirs}});
        preload_done = true;
      }
    }
    if (!preload_done) env.push_back(Plain("LD_PRELOAD", preload));
    AppendAll(&ops, c, "env", base + "/env", env);
  }

  const std::string annotation_path = "/metadata/annotations";
  const json& meta = pod.at("metadata");
  if (auto a = meta.find("annotations"); a == meta.end() || a->is_null()) {
    ops.push_back(Op(annotation_path, {{kRequestAnnotation, PodRequestToJson(r)}}));
  } else {
    ops.push_back(Op(annotation_path + "/" + PointerToken(kRequestAnnotation), PodRequestToJson(r)));
  }
  return ops;
}

json Review(const std::string& uid, json response_fields) {
  json response = {{"uid", uid}};
  response.update(response_fields);
  return {{"apiVersion", "admission.k8s.io/v1"}, {"kind", "AdmissionReview"}, {"response", response}};
}

WebhookReply Refuse(const std::string& uid, const std::string& message) {
  json status = {{"code", 400}, {"reason", "BadRequest"}, {"status", "Failure"}, {"message", message}};
  return {200, Review(uid, {{"allowed", false}, {"status", status}}).dump()};
}

WebhookReply Malformed(const std::string& message) { return {400, json{{"error", message}}.dump()}; }

// Annotations as strings; kInvalidArgument when the map is not one.
StatusOr<Annotations> AnnotationsOf(const json& meta) {
  Annotations out;
  auto a = meta.find("annotations");
  if (a == meta.end() || a->is_null()) return out;
  if (!a->is_object()) return InvalidArgument("metadata.annotations is not an object");
  for (const auto& [k, v] : a->items()) {
    if (!v.is_string()) return InvalidArgument("metadata.annotations['" + k + "'] is not a string");
    out[k] = v.get<std::string>();
  }
  return out;
}

WebhookReply Handle(const std::string& body, const WebhookOptions& o);

}  // namespace

worker::SessionLimits RemotePodLimits(const PodGpuRequest& r) {
  worker::SessionLimits l;
  l.vram = std::to_string(r.vram_mib) + "MiB";
  auto number = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", v);
    return std::string(buf);
  };
  if (r.tflops > 0) {
    l.tflops = number(r.tflops);
    if (r.tflops_limit > r.tflops) l.tflops_limit = number(r.tflops_limit);
  } else {
    l.percent = number(r.percent);
    if (r.percent_limit > r.percent) l.percent_limit = number(r.percent_limit);
  }
  // Medium, the default, is left out (a version-2 record when nothing else of version 3 is).
  if (r.qos != "medium") l.qos = r.qos;
  return l;
}

WebhookReply HandleAdmissionReview(const std::string& body, const WebhookOptions& o) {
  try {
    return Handle(body, o);
  } catch (const json::exception& e) {
    // A field of an unexpected type deep in the pod: refused as malformed, never a crash.
    return Malformed(std::string("malformed review: ") + e.what());
  }
}

namespace {
WebhookReply Handle(const std::string& body, const WebhookOptions& o) {
  json review = json::parse(body, nullptr, false);
  if (review.is_discarded()) return Malformed("the body is not JSON");
  if (!review.is_object()) return Malformed("the body is not a JSON object");
  if (Str(review, "apiVersion") != "admission.k8s.io/v1")
    return Malformed("apiVersion must be admission.k8s.io/v1 (got \"" + Str(review, "apiVersion") + "\")");
  if (Str(review, "kind") != "AdmissionReview")
    return Malformed("kind must be AdmissionReview (got \"" + Str(review, "kind") + "\")");
  auto req = review.find("request");
  if (req == review.end() || !req->is_object()) return Malformed("request is missing");
  auto uid_it = req->find("uid");
  if (uid_it == req->end() || uid_it->is_null()) return Malformed("request.uid is missing");
  if (!uid_it->is_string()) return Malformed("request.uid must be a string");
  if (uid_it->get<std::string>().empty()) return Malformed("request.uid is empty");
  const std::string uid = uid_it->get<std::string>();
  if (uid.size() > 128) return Malformed("request.uid is longer than 128 characters");

  const json kind = req->contains("kind") ? (*req)["kind"] : json::object();
  if (!kind.is_object() || Str(kind, "kind") != "Pod" || Str(kind, "group") != "" ||
      Str(kind, "version") != "v1") {
    return Refuse(uid, "this webhook admits pods (group \"\", version v1, kind Pod) only, got " + kind.dump());
  }
  const std::string operation = Str(*req, "operation");
  if (operation != "CREATE") return {200, Review(uid, {{"allowed", true}}).dump()};
  auto pod_it = req->find("object");
  if (pod_it == req->end() || !pod_it->is_object()) return Malformed("request.object (the pod) is missing");
  const json& pod = *pod_it;
  if (!pod.contains("metadata") || !pod["metadata"].is_object()) return Malformed("the pod has no metadata");
  if (!pod.contains("spec") || !pod["spec"].is_object()) return Malformed("the pod has no spec");
  const json& spec = pod["spec"];
  if (!spec.contains("containers") || !spec["containers"].is_array() || spec["containers"].empty())
    return Malformed("the pod has no containers");
  for (const char* field : {"containers", "initContainers", "volumes"}) {
    if (spec.contains(field) && !spec[field].is_null() && !spec[field].is_array())
      return Malformed(std::string("spec.") + field + " is not an array");
  }
  auto objects = [](const json& list) {
    for (const json& item : list) {
      if (!item.is_object()) return false;
    }
    return true;
  };
  for (const char* field : {"containers", "initContainers", "volumes"}) {
    if (spec.contains(field) && spec[field].is_array() && !objects(spec[field]))
      return Malformed(std::string("spec.") + field + " holds something that is not an object");
  }
  for (const json& c : spec["containers"]) {
    for (const char* field : {"env", "volumeMounts"}) {
      if (!c.contains(field) || c[field].is_null()) continue;
      if (!c[field].is_array() || !objects(c[field]))
        return Malformed("container '" + Str(c, "name") + "': " + field + " is not an array of objects");
    }
  }

  const json& meta = pod["metadata"];
  const json labels = meta.contains("labels") ? meta["labels"] : json::object();
  if (!labels.is_object() || Str(labels, kEnabledLabel) != "true") {
    return {200, Review(uid, {{"allowed", true}}).dump()};  // not ours: admitted unchanged
  }
  StatusOr<Annotations> annotations = AnnotationsOf(meta);
  if (!annotations.ok()) return Malformed(annotations.status().message());
  if (spec.contains("nodeName") && spec["nodeName"].is_string() && !spec["nodeName"].get<std::string>().empty())
    return Refuse(uid, "spec.nodeName is set: a TensorFusion pod is placed by the scheduler '" + o.scheduler_name +
                           "', which reserves its vGPU; leave nodeName out");

  StatusOr<std::string> profile_name = WorkloadProfileOf(*annotations);
  if (!profile_name.ok()) return Refuse(uid, profile_name.status().message());
  WorkloadDefaults profile;
  if (!profile_name->empty()) {
    if (!o.lookup_profile) return Refuse(uid, "workload profiles cannot be looked up (no controller)");
    StatusOr<WorkloadDefaults> p = o.lookup_profile(*profile_name);
    if (!p.ok()) {
      return Refuse(uid, std::string(kDomain) + "workload-profile: \"" + *profile_name + "\": " + p.status().message());
    }
    profile = *p;
  }
  StatusOr<PodGpuRequest> request = ParsePodAnnotations(*annotations, profile_name->empty() ? nullptr : &profile);
  if (!request.ok()) return Refuse(uid, request.status().message());
  StatusOr<json> patch = BuildPatch(pod, *request, o);
  if (!patch.ok()) return Refuse(uid, patch.status().message());
  return {200, Review(uid, {{"allowed", true},
                            {"patchType", "JSONPatch"},
                            {"patch", controller::Base64Encode(patch->dump())}})
                   .dump()};
}

}  // namespace

}  // namespace tf::k8s
