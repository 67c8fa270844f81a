#include "controller/k8s_reconciler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <regex>
#include <set>

#include "scheduler/types.h"

namespace tf::controller {
namespace {

using Json = nlohmann::json;

constexpr char kApiPrefix[] = "/apis/tensor-fusion.ai/v1/";
constexpr int kMaxConflictRetries = 5;

void Log(const std::string& line) { std::fprintf(stderr, "kube: %s\n", line.c_str()); }

// A Kubernetes object name (DNS subdomain) that may go into a URL path as it is.
bool IsKubeName(const std::string& s) {
  static const std::regex kName(R"(^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$)");
  return !s.empty() && s.size() <= 253 && std::regex_match(s, kName);
}

// "percent-encoding" of the few characters a label selector has that a query may not carry.
std::string QueryEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += c;
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", static_cast<unsigned char>(c));
      out += buf;
    }
  }
  return out;
}

std::string Rfc3339(int64_t ms) {
  std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// A TFLOPS amount as a quantity string: at most 3 decimals, no trailing zeros.
std::string TflopsQuantity(double v) {
  if (!std::isfinite(v) || v < 0) v = 0;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  std::string s = buf;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

std::string VramQuantity(int64_t mib) { return std::to_string(std::max<int64_t>(mib, 0)) + "Mi"; }

std::string StatusMessage(const KubeResponse& r) {
  Json j = Json::parse(r.body, nullptr, false);
  std::string m = j.is_object() ? j.value("message", std::string()) : std::string();
  if (m.empty()) m = r.body.substr(0, 300);
  return "HTTP " + std::to_string(r.status) + (m.empty() ? "" : ": " + m);
}

const Json& Field(const Json& j, const char* key) {
  static const Json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

std::string Str(const Json& j, const char* key) {
  const Json& f = Field(j, key);
  return f.is_string() ? f.get<std::string>() : "";
}

bool HasFinalizer(const Json& obj) {
  const Json& f = Field(Field(obj, "metadata"), "finalizers");
  if (!f.is_array()) return false;
  return std::any_of(f.begin(), f.end(), [](const Json& e) { return e == kKubeFinalizer; });
}

bool Deleting(const Json& obj) { return !Str(Field(obj, "metadata"), "deletionTimestamp").empty(); }

// The Ready condition, keeping the previous transition time when its status did not change.
Json ReadyCondition(const Json& current_obj, bool ready, const std::string& reason, const std::string& message,
                    int64_t now_ms) {
  const std::string status = ready ? "True" : "False";
  std::string since = Rfc3339(now_ms);
  const Json& old = Field(Field(current_obj, "status"), "conditions");
  if (old.is_array())
    for (const Json& c : old)
      if (Str(c, "type") == "Ready" && Str(c, "status") == status && !Str(c, "lastTransitionTime").empty())
        since = Str(c, "lastTransitionTime");
  Json c = {{"type", "Ready"}, {"status", status}, {"reason", reason}, {"message", message.substr(0, 4096)},
            {"lastTransitionTime", since}};
  const Json& gen = Field(Field(current_obj, "metadata"), "generation");
  if (gen.is_number_integer()) c["observedGeneration"] = gen;
  return c;
}

// An integer field of a spec within [lo, hi]; `fallback` when absent.
StatusOr<int64_t> IntField(const Json& obj, const char* key, const std::string& where, int64_t lo, int64_t hi,
                           int64_t fallback) {
  const Json& f = Field(obj, key);
  if (f.is_null()) return fallback;
  if (!f.is_number_integer() || f.get<int64_t>() < lo || f.get<int64_t>() > hi)
    return InvalidArgument(where + "." + key + " must be a whole number in [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "], not " + f.dump());
  return f.get<int64_t>();
}

// A quantity field (int or string); nullopt when absent.
StatusOr<std::optional<double>> QuantityField(const Json& obj, const char* key, const std::string& where) {
  const Json& f = Field(obj, key);
  if (f.is_null()) return std::optional<double>();
  std::string text;
  if (f.is_number_integer() && f.get<int64_t>() >= 0) {
    text = std::to_string(f.get<int64_t>());
  } else if (f.is_string()) {
    text = f.get<std::string>();
  } else {
    return InvalidArgument(where + "." + key + " must be a quantity, not " + f.dump());
  }
  StatusOr<double> v = ParseKubeQuantity(text);
  if (!v.ok()) return InvalidArgument(where + "." + key + ": " + v.status().message());
  return std::optional<double>(*v);
}

// Our pool as a GPUPool's spec (and the SchedulingConfigTemplate it names) asks for it.
StatusOr<Pool> PoolFromGpuPool(const Json& obj, const std::map<std::string, Json>& templates) {
  Pool p;
  p.name = Str(Field(obj, "metadata"), "name");
  TF_RETURN_IF_ERROR(ValidateName("GPUPool name", p.name));
  const Json& spec = Field(obj, "spec");
  if (!spec.is_null() && !spec.is_object()) return InvalidArgument("spec must be an object");
  const Json& tmpl = Field(spec, "schedulingConfigTemplate");
  if (!tmpl.is_null()) {
    if (!tmpl.is_string() || !IsKubeName(tmpl.get<std::string>()))
      return InvalidArgument("spec.schedulingConfigTemplate must be the name of a SchedulingConfigTemplate, not " +
                             tmpl.dump());
    const std::string name = tmpl.get<std::string>();
    auto it = templates.find(name);
    if (it == templates.end())
      return InvalidArgument("spec.schedulingConfigTemplate: SchedulingConfigTemplate '" + name + "' does not exist");
    const Json& mode = Field(Field(Field(it->second, "spec"), "placement"), "mode");
    const std::string text = mode.is_string() ? mode.get<std::string>() : mode.dump();
    StatusOr<sched::PlacementMode> m = sched::ParsePlacementMode(text);
    if (!mode.is_string() || !m.ok())
      return InvalidArgument("SchedulingConfigTemplate '" + name + "' has placement mode " +
                             (mode.is_string() ? "'" + text + "'" : text) +
                             ": accepted are NodeCompactGPULowLoad, CompactFirst, LowLoadFirst, BestFit, FGD, FragAware");
    p.placement_mode = std::string(sched::PlacementModeName(*m));
  }
  const Json& over = Field(Field(spec, "capacityConfig"), "oversubscription");
  const std::string where = "spec.capacityConfig.oversubscription";
  StatusOr<int64_t> ratio = IntField(over, "tflopsOversellRatio", where, 100, 10000, 100);
  if (!ratio.ok()) return ratio.status();
  StatusOr<int64_t> host = IntField(over, "vramExpandToHostMem", where, 0, 400, 0);
  if (!host.ok()) return host.status();
  StatusOr<int64_t> disk = IntField(over, "vramExpandToHostDisk", where, 0, 400, 0);
  if (!disk.ok()) return disk.status();
  p.tflops_oversell_ratio = static_cast<double>(*ratio) / 100.0;
  p.vram_expand_to_host_percent = static_cast<int>(*host);
  p.vram_expand_to_disk_percent = static_cast<int>(*disk);
  return p;
}

bool SamePoolSettings(const Pool& a, const Pool& b) {
  return a.placement_mode == b.placement_mode && std::fabs(a.tflops_oversell_ratio - b.tflops_oversell_ratio) < 1e-9 &&
         a.vram_expand_to_host_percent == b.vram_expand_to_host_percent &&
         a.vram_expand_to_disk_percent == b.vram_expand_to_disk_percent;
}

std::string WorkloadRequestId(const Json& obj) { return "k8s-" + Str(Field(obj, "metadata"), "uid"); }

// The allocation a TensorFusionWorkload asks for (one replica: gpuCount vGPUs on one node).
StatusOr<AllocationRequest> RequestFromWorkload(const Json& obj) {
  AllocationRequest r;
  const Json& meta = Field(obj, "metadata");
  r.tenant = Str(meta, "namespace");
  TF_RETURN_IF_ERROR(ValidateName("namespace", r.tenant));
  static const std::regex kUid(R"(^[A-Za-z0-9-]{1,100}$)");
  if (!std::regex_match(Str(meta, "uid"), kUid)) return InvalidArgument("metadata.uid is missing or malformed");
  r.request_id = WorkloadRequestId(obj);
  const Json& spec = Field(obj, "spec");
  if (!spec.is_object()) return InvalidArgument("spec is required");
  if (!Field(spec, "poolName").is_null()) {
    r.pool = Str(spec, "poolName");
    TF_RETURN_IF_ERROR(ValidateName("spec.poolName", r.pool));
  }
  if (!Field(spec, "qos").is_null()) {
    StatusOr<Qos> q = ParseQos(Str(spec, "qos"));
    if (!q.ok()) return InvalidArgument("spec.qos must be low, medium, high or critical, not " + Field(spec, "qos").dump());
    r.qos = QosName(*q);
  }
  StatusOr<int64_t> count = IntField(spec, "gpuCount", "spec", 1, 64, 1);
  if (!count.ok()) return count.status();
  r.gpu_count = static_cast<int>(*count);
  if (!Field(spec, "gpuModel").is_null()) {
    r.gpu_model = Str(spec, "gpuModel");
    if (r.gpu_model.empty() || r.gpu_model.size() > 64) return InvalidArgument("spec.gpuModel must be 1-64 characters");
  }
  const Json& req = Field(Field(spec, "resources"), "requests");
  const Json& lim = Field(Field(spec, "resources"), "limits");
  if (!req.is_object()) return InvalidArgument("spec.resources.requests is required");
  auto tflops = QuantityField(req, "tflops", "spec.resources.requests");
  auto compute = QuantityField(req, "compute", "spec.resources.requests");
  auto vram = QuantityField(req, "vram", "spec.resources.requests");
  auto tflops_limit = QuantityField(lim, "tflops", "spec.resources.limits");
  auto compute_limit = QuantityField(lim, "compute", "spec.resources.limits");
  for (const auto* q : {&tflops, &compute, &vram, &tflops_limit, &compute_limit})
    if (!q->ok()) return q->status();
  if (tflops->has_value() == compute->has_value())
    return InvalidArgument("spec.resources.requests needs tflops or compute (one of them)");
  if (!vram->has_value()) return InvalidArgument("spec.resources.requests.vram is required");
  if ((tflops_limit->has_value() && !tflops->has_value()) || (compute_limit->has_value() && !compute->has_value()))
    return InvalidArgument("a limit must be in its request's unit (limits.tflops with requests.tflops, "
                           "limits.compute with requests.compute)");
  r.tflops = tflops->value_or(0);
  r.percent = compute->value_or(0);
  r.tflops_limit = tflops_limit->value_or(0);
  r.percent_limit = compute_limit->value_or(0);
  const double mib = std::ceil(**vram / 1048576.0);
  if (mib < 1 || mib > 16.0 * 1024 * 1024)
    return InvalidArgument("spec.resources.requests.vram must be at least 1Mi and at most 16Ti");
  r.vram_mib = static_cast<int64_t>(mib);
  return r;
}

std::string ObjectPath(const std::string& plural, const Json& obj) {
  const Json& meta = Field(obj, "metadata");
  const std::string ns = Str(meta, "namespace");
  return std::string(kApiPrefix) + (ns.empty() ? "" : "namespaces/" + ns + "/") + plural + "/" + Str(meta, "name");
}

// Names of the objects mirroring our nodes and GPUs: the name when it is a Kubernetes name,
// lower-cased (GPU UUIDs); empty when even that is not one.
std::string MirrorName(const std::string& ours) {
  std::string s = ours;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return IsKubeName(s) ? s : "";
}

}  // namespace

// ---- KubeObjectCache ----

KubeObjectCache::KubeObjectCache(const KubeApiConfig& api, std::string collection, std::string label_selector,
                                 int watch_timeout_s, std::function<void()> changed, std::function<bool()> active)
    : api_(api), collection_(std::move(collection)), label_selector_(std::move(label_selector)),
      watch_timeout_s_(watch_timeout_s), changed_(std::move(changed)), active_(std::move(active)) {}

KubeObjectCache::~KubeObjectCache() { Stop(); }

void KubeObjectCache::Start() { thread_ = std::thread([this] { Run(); }); }

void KubeObjectCache::Stop() {
  stop_.store(true);
  api_.Interrupt();
  if (thread_.joinable()) thread_.join();
}

void KubeObjectCache::Interrupt() { api_.Interrupt(); }

bool KubeObjectCache::synced() const {
  std::lock_guard<std::mutex> lock(mu_);
  return synced_;
}

std::map<std::string, Json> KubeObjectCache::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return objects_;
}

std::string KubeObjectCache::KeyOf(const Json& object) {
  const Json& meta = Field(object, "metadata");
  const std::string ns = Str(meta, "namespace");
  return ns.empty() ? Str(meta, "name") : ns + "/" + Str(meta, "name");
}

void KubeObjectCache::Update(const Json& object, const std::string& base_rv) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!synced_) return;
  const std::string key = KeyOf(object);
  auto it = objects_.find(key);
  const std::string held_rv = it == objects_.end() ? "" : Str(Field(it->second, "metadata"), "resourceVersion");
  if (held_rv != base_rv) return;  // the watch delivered this key since: its copy is as new or newer
  objects_[key] = object;
}

void KubeObjectCache::Forget(const std::string& key, const std::string& uid) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return;
  const std::string held_uid = Str(Field(it->second, "metadata"), "uid");
  if (!uid.empty() && !held_uid.empty() && held_uid != uid) return;  // made again under the same name
  objects_.erase(it);
}

std::string KubeObjectCache::Query(const std::string& extra) const {
  std::string q = extra;
  if (!label_selector_.empty()) q += (q.empty() ? "" : "&") + std::string("labelSelector=") + QueryEscape(label_selector_);
  return q.empty() ? collection_ : collection_ + "?" + q;
}

void KubeObjectCache::Run() {
  int backoff_ms = 0;
  std::string last_error;
  auto sleep_ms = [this](int ms) {
    for (int waited = 0; waited < ms && !stop_.load(); waited += 50)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  };
  while (!stop_.load()) {
    if (!active_()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        objects_.clear();
        synced_ = false;
        resource_version_.clear();
      }
      sleep_ms(200);
      continue;
    }
    bool need_list;
    {
      std::lock_guard<std::mutex> lock(mu_);
      need_list = !synced_;
    }
    Status st = need_list ? List() : WatchOnce();
    if (st.ok()) {
      backoff_ms = 0;
      last_error.clear();
      continue;
    }
    if (st.code() == StatusCode::kAborted) {  // 410 Gone: relist at once
      Log(collection_ + ": " + st.message() + "; listing again");
      std::lock_guard<std::mutex> lock(mu_);
      synced_ = false;
      continue;
    }
    if (stop_.load()) break;
    backoff_ms = backoff_ms == 0 ? 500 : std::min(backoff_ms * 2, 30'000);
    if (st.message() != last_error) Log(collection_ + ": " + st.message() + " (retrying with back-off)");
    last_error = st.message();
    sleep_ms(backoff_ms);
  }
}

Status KubeObjectCache::List() {
  std::map<std::string, Json> objects;
  std::string cont, rv;
  for (int page = 0; page < 100000; ++page) {
    std::string extra = "limit=500";
    if (!cont.empty()) extra += "&continue=" + QueryEscape(cont);
    StatusOr<KubeResponse> r = api_.Call("GET", Query(extra));
    if (!r.ok()) return r.status();
    if (r->status == 410) {  // the continue token expired: start the list over
      cont.clear();
      objects.clear();
      continue;
    }
    if (r->status != 200) return Unavailable("list " + collection_ + ": " + StatusMessage(*r));
    Json list = Json::parse(r->body, nullptr, false);
    if (!list.is_object() || (!Field(list, "items").is_array() && !Field(list, "items").is_null()))
      return Unavailable("list " + collection_ + ": the answer is not a list");
    for (const Json& item : Field(list, "items")) {
      if (!item.is_object() || Str(Field(item, "metadata"), "name").empty()) continue;
      objects[KeyOf(item)] = item;
    }
    rv = Str(Field(list, "metadata"), "resourceVersion");
    cont = Str(Field(list, "metadata"), "continue");
    if (cont.empty()) break;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    objects_ = std::move(objects);
    resource_version_ = rv;
    synced_ = true;
  }
  changed_();
  return Status::Ok();
}

Status KubeObjectCache::WatchOnce() {
  std::string rv;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rv = resource_version_;
  }
  std::string path = Query("watch=true&allowWatchBookmarks=true&timeoutSeconds=" +
                           std::to_string(watch_timeout_s_) + (rv.empty() ? "" : "&resourceVersion=" + QueryEscape(rv)));
  bool expired = false;
  std::string failure;
  StatusOr<KubeResponse> r = api_.Stream(
      path,
      [&](const std::string& line) {
        Json ev = Json::parse(line, nullptr, false);
        const std::string type = Str(ev, "type");
        const Json& obj = Field(ev, "object");
        if (!obj.is_object() || type.empty()) {
          failure = "watch " + collection_ + ": an event that is not {type, object}: " + line.substr(0, 200);
          return false;
        }
        if (type == "ERROR") {
          const Json& code = Field(obj, "code");
          if (code.is_number_integer() && code.get<int>() == 410) {
            expired = true;
          } else {
            failure = "watch " + collection_ + ": ERROR event: " + Str(obj, "message");
          }
          return false;
        }
        const std::string obj_rv = Str(Field(obj, "metadata"), "resourceVersion");
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (type == "ADDED" || type == "MODIFIED") {
            if (Str(Field(obj, "metadata"), "name").empty()) return true;
            objects_[KeyOf(obj)] = obj;
          } else if (type == "DELETED") {
            objects_.erase(KeyOf(obj));
          } else if (type != "BOOKMARK") {
            failure = "watch " + collection_ + ": unknown event type '" + type + "'";
            return false;
          }
          if (!obj_rv.empty()) resource_version_ = obj_rv;
        }
        if (type != "BOOKMARK") changed_();
        return true;
      },
      watch_timeout_s_ + 30);
  if (expired) return Status(StatusCode::kAborted, "watch " + collection_ + ": resourceVersion " + rv + " is too old (410 Gone)");
  if (!failure.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    synced_ = false;  // we cannot tell what we missed
    return Unavailable(failure);
  }
  if (!r.ok()) return r.status();
  if (r->status == 410) return Status(StatusCode::kAborted, "watch " + collection_ + ": 410 Gone");
  if (r->status != 200) return Unavailable("watch " + collection_ + ": " + StatusMessage(*r));
  return Status::Ok();  // the server ended the watch (timeoutSeconds): resume from resource_version_
}

// ---- KubeReconciler ----

KubeReconciler::KubeReconciler(Controller* controller, const Clock* clock, KubeReconcilerOptions options)
    : controller_(controller), clock_(clock), options_(std::move(options)), api_(options_.api) {
  auto changed = [this] { Wake(); };
  auto active = [this] { return controller_->Serving(); };
  auto cache = [&](const char* plural, const std::string& selector) {
    return std::make_unique<KubeObjectCache>(options_.api, std::string(kApiPrefix) + plural, selector,
                                             options_.watch_timeout_s, changed, active);
  };
  const std::string managed = std::string(kKubeManagedByLabel) + "=" + kKubeManagedByValue;
  pools_ = cache("gpupools", "");
  templates_ = cache("schedulingconfigtemplates", "");
  workloads_ = cache("tensorfusionworkloads", "");
  gpunodes_ = cache("gpunodes", managed);
  gpus_ = cache("gpus", managed);
  pods_ = std::make_unique<KubeObjectCache>(options_.api, "/api/v1/pods", std::string(kKubePodLabel) + "=true",
                                            options_.watch_timeout_s, changed, active);
}

KubeReconciler::~KubeReconciler() { Stop(); }

void KubeReconciler::Start() {
  for (auto* c : {pools_.get(), templates_.get(), workloads_.get(), gpunodes_.get(), gpus_.get(), pods_.get()}) c->Start();
  thread_ = std::thread([this] { Run(); });
}

void KubeReconciler::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto* c : {pools_.get(), templates_.get(), workloads_.get(), gpunodes_.get(), gpus_.get(), pods_.get()}) c->Stop();
}

void KubeReconciler::Wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    changed_ = true;
  }
  cv_.notify_all();
}

void KubeReconciler::Run() {
  int backoff_ms = 0;
  bool was_serving = false;
  std::string last_error;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const int wait_ms = backoff_ms > 0 ? backoff_ms : options_.resync_ms;
    cv_.wait_for(lock, std::chrono::milliseconds(wait_ms), [this, backoff_ms] { return stop_ || (changed_ && backoff_ms == 0); });
    if (stop_) break;
    changed_ = false;
    lock.unlock();
    const bool serving = controller_->Serving();
    if (was_serving && !serving) {
      Log("this replica stopped leading: no more reconciling");
      for (auto* c : {pools_.get(), templates_.get(), workloads_.get(), gpunodes_.get(), gpus_.get(), pods_.get()}) c->Interrupt();
    }
    was_serving = serving;
    Status st = ReconcileOnce();
    if (st.ok()) {
      backoff_ms = 0;
      last_error.clear();
    } else {
      backoff_ms = backoff_ms == 0 ? 500 : std::min(backoff_ms * 2, options_.max_backoff_ms);
      if (st.message() != last_error) Log(st.message() + " (retrying with back-off)");
      last_error = st.message();
    }
    lock.lock();
  }
}

Status KubeReconciler::Replace(KubeObjectCache& cache, const std::string& path, Json current,
                               const std::function<std::optional<Json>(const Json&)>& desired) {
  for (int attempt = 0; attempt <= kMaxConflictRetries; ++attempt) {
    std::optional<Json> body = desired(current);
    if (!body) return Status::Ok();
    StatusOr<KubeResponse> r = api_.Call("PUT", path, body->dump());
    if (!r.ok()) return r.status();
    if (r->status == 200 || r->status == 201) {
      Json updated = Json::parse(r->body, nullptr, false);
      if (updated.is_object()) cache.Update(updated, Str(Field(current, "metadata"), "resourceVersion"));
      return Status::Ok();
    }
    if (r->status == 404) {
      cache.Forget(KubeObjectCache::KeyOf(current), Str(Field(current, "metadata"), "uid"));
      return Status::Ok();  // deleted meanwhile: nothing left to write
    }
    if (r->status != 409) return Unavailable("PUT " + path + ": " + StatusMessage(*r));
    // Someone else wrote the object since we read it: read it again and redo the change on it.
    const std::string object_path = path.size() > 7 && path.compare(path.size() - 7, 7, "/status") == 0
                                        ? path.substr(0, path.size() - 7) : path;
    Log("PUT " + path + ": 409 Conflict (resourceVersion " + Str(Field(current, "metadata"), "resourceVersion") +
        " is stale); reading it again");
    StatusOr<KubeResponse> fresh = api_.Call("GET", object_path);
    if (!fresh.ok()) return fresh.status();
    if (fresh->status == 404) {
      cache.Forget(KubeObjectCache::KeyOf(current), Str(Field(current, "metadata"), "uid"));
      return Status::Ok();
    }
    if (fresh->status != 200) return Unavailable("GET " + object_path + ": " + StatusMessage(*fresh));
    const std::string stale_rv = Str(Field(current, "metadata"), "resourceVersion");
    current = Json::parse(fresh->body, nullptr, false);
    if (!current.is_object()) return Unavailable("GET " + object_path + ": not a JSON object");
    cache.Update(current, stale_rv);
  }
  return Status(StatusCode::kAborted, "PUT " + path + ": still conflicting after " + std::to_string(kMaxConflictRetries) + " re-reads");
}

Status KubeReconciler::SetFinalizer(KubeObjectCache& cache, const std::string& path, const Json& object, bool present) {
  return Replace(cache, path, object, [present](const Json& cur) -> std::optional<Json> {
    if (HasFinalizer(cur) == present) return std::nullopt;
    Json out = cur;
    Json& meta = out["metadata"];
    Json list = Json::array();
    if (meta.contains("finalizers") && meta["finalizers"].is_array())
      for (const Json& f : meta["finalizers"])
        if (f != kKubeFinalizer) list.push_back(f);
    if (present) list.push_back(kKubeFinalizer);
    meta["finalizers"] = list;
    return out;
  });
}

Status KubeReconciler::WriteStatus(KubeObjectCache& cache, const std::string& path, const Json& object,
                                   const std::function<Json(const Json&)>& status_for) {
  return Replace(cache, path + "/status", object, [&status_for](const Json& cur) -> std::optional<Json> {
    Json status = status_for(cur);
    if (Field(cur, "status") == status) return std::nullopt;  // nothing new: no write
    Json out = cur;
    out["status"] = std::move(status);
    return out;
  });
}

Status KubeReconciler::ReconcileOnce() {
  if (!controller_->Serving()) return Status::Ok();
  for (auto* c : {pools_.get(), templates_.get(), workloads_.get(), gpunodes_.get(), gpus_.get()})
    if (!c->synced()) return Status::Ok();  // wait for every list
  Status first = Status::Ok();
  auto note = [&first](const Status& st) {
    if (!st.ok() && first.ok()) first = st;
  };
  const Objects templates = templates_->Snapshot();
  std::vector<Allocation> allocations = controller_->ListAllocations();
  UsageSnapshot usage = TakeUsageSnapshot(*controller_, clock_->NowMs());
  for (const auto& [key, obj] : pools_->Snapshot()) note(ReconcilePool(obj, templates, usage, allocations));
  for (const auto& [key, obj] : workloads_->Snapshot()) note(ReconcileWorkload(obj, allocations));
  allocations = controller_->ListAllocations();  // workloads may have placed or released some
  if (pods_->synced()) {
    note(ReleaseEndedPods(allocations));
    allocations = controller_->ListAllocations();
  }
  usage = TakeUsageSnapshot(*controller_, clock_->NowMs());
  note(MirrorNodes(usage));
  note(MirrorGpus(usage, allocations));
  return first;
}

Status KubeReconciler::ReleaseEndedPods(const std::vector<Allocation>& allocations) {
  // By uid: the pods that still run (or wait to), and the ones that ended, with their names.
  std::set<std::string> live;
  std::map<std::string, std::string> ended;  // uid -> "namespace/name (phase)"
  for (const auto& [key, pod] : pods_->Snapshot()) {
    const std::string uid = Str(Field(pod, "metadata"), "uid");
    if (uid.empty()) continue;
    const std::string phase = Str(Field(pod, "status"), "phase");
    if (phase == "Succeeded" || phase == "Failed") {
      ended[uid] = key + " (" + phase + ")";
    } else {
      live.insert(uid);
    }
  }
  const int64_t now = clock_->NowMs();
  Status first = Status::Ok();
  std::set<std::string> held;
  for (const Allocation& a : allocations) held.insert(a.id);
  for (auto it = pod_asked_again_ms_.begin(); it != pod_asked_again_ms_.end();)  // released meanwhile
    it = held.count(it->first) ? std::next(it) : pod_asked_again_ms_.erase(it);
  for (const Allocation& a : allocations) {
    if (a.request_id.compare(0, 4, "pod-") != 0) continue;
    const std::string uid = a.request_id.substr(4);
    if (live.count(uid)) continue;
    std::string why;
    if (auto it = ended.find(uid); it != ended.end()) {
      why = "pod " + it->second + " ended";
    } else if (now - a.created_ms >= kPodBindGraceMs && IsKubeName(a.tenant)) {
      // Missing from the watched pods, which may lag (a watch backing off after an error) or have
      // lost it to a label change: asked of the API server itself, every pod of the allocation's
      // namespace, before anything is released; a pod found there is not asked about again for
      // 15 s.
      if (auto next = pod_asked_again_ms_.find(a.id); next != pod_asked_again_ms_.end() && now < next->second) continue;
      pod_asked_again_ms_.erase(a.id);
      StatusOr<KubeResponse> r = api_.Call("GET", "/api/v1/namespaces/" + a.tenant + "/pods");
      if (!r.ok() || r->status != 200) continue;  // cannot tell now: the next pass asks again
      const Json list = Json::parse(r->body, nullptr, false);
      if (!Field(list, "items").is_array()) continue;
      bool present = false;
      for (const Json& pod : Field(list, "items")) {
        if (Str(Field(pod, "metadata"), "uid") != uid) continue;
        const std::string phase = Str(Field(pod, "status"), "phase");
        present = phase != "Succeeded" && phase != "Failed";
      }
      if (present) {
        pod_asked_again_ms_[a.id] = now + 15'000;
        continue;
      }
      why = "pod uid " + uid + " of namespace " + a.tenant + " is gone";
    } else {
      continue;  // just bound (its pod may not have reached the watch yet), or not a pod's namespace
    }
    Status st = controller_->Release(a.id);
    if (st.ok()) {
      Log(why + ": allocation " + a.id + " released");
    } else if (st.code() != StatusCode::kNotFound && first.ok()) {
      first = Status(st.code(), why + ": releasing allocation " + a.id + ": " + st.message());
    }
  }
  return first;
}

Status KubeReconciler::ReconcilePool(const Json& obj, const Objects& templates, const UsageSnapshot& usage,
                                     const std::vector<Allocation>& allocations) {
  const std::string name = Str(Field(obj, "metadata"), "name");
  if (!IsKubeName(name)) return Status::Ok();  // not a name the API server hands out
  const std::string path = ObjectPath("gpupools", obj);
  const int64_t now = clock_->NowMs();
  auto log_once = [this, &name](const std::string& line) {
    if (last_logged_["gpupool/" + name] == line) return;
    last_logged_["gpupool/" + name] = line;
    Log("GPUPool " + name + ": " + line);
  };
  size_t held = 0;
  for (const Allocation& a : allocations)
    if (a.pool == name) ++held;

  if (Deleting(obj)) {
    if (!HasFinalizer(obj)) return Status::Ok();
    if (held > 0) {
      const std::string msg = "being deleted: waiting for " + std::to_string(held) +
                              " allocation(s) in pool '" + name + "' to be released (the finalizer " +
                              kKubeFinalizer + " stays until then)";
      log_once(msg);
      return WriteStatus(*pools_, path, obj, [&](const Json& cur) {
        Json s = Field(cur, "status").is_object() ? Field(cur, "status") : Json::object();
        s["conditions"] = Json::array({ReadyCondition(cur, false, "Deleting", msg, now)});
        return s;
      });
    }
    Status del = controller_->DeletePool(name);
    if (del.code() == StatusCode::kFailedPrecondition) {
      // An allocation placed in the pool since this pass's snapshot: wait for it as above.
      for (const Allocation& a : controller_->ListAllocations()) {
        if (a.pool != name) continue;
        log_once("being deleted: waiting for allocation " + a.id + " in pool '" + name + "' to be released");
        return Status::Ok();
      }
    }
    if (del.ok()) {
      log_once("deleted: pool removed from the controller, finalizer removed");
    } else if (del.code() == StatusCode::kNotFound) {
      log_once("deleted (the controller had no such pool), finalizer removed");
    } else if (del.code() == StatusCode::kFailedPrecondition) {
      log_once("deleted; the controller keeps the pool: " + del.message());
    } else {
      return del;
    }
    return SetFinalizer(*pools_, path, obj, false);
  }

  if (!HasFinalizer(obj)) {
    TF_RETURN_IF_ERROR(SetFinalizer(*pools_, path, obj, true));
    for (const auto& [k, o] : pools_->Snapshot())
      if (k == name) return ReconcilePool(o, templates, usage, allocations);  // with its new resourceVersion
    return Status::Ok();
  }

  StatusOr<Pool> want = PoolFromGpuPool(obj, templates);
  std::string problem;
  if (want.ok()) {
    StatusOr<Pool> have = controller_->GetPool(name);
    if (!have.ok()) {
      StatusOr<Pool> made = controller_->CreatePool(*want);
      if (made.ok()) {
        log_once("created pool (placement " + made->placement_mode + ", oversell " + TflopsQuantity(made->tflops_oversell_ratio) + ")");
      } else if (made.status().code() == StatusCode::kInvalidArgument) {
        problem = made.status().message();
      } else {
        return made.status();
      }
    } else if (!SamePoolSettings(*have, *want)) {
      StatusOr<Pool> updated = controller_->UpdatePool(*want);
      if (updated.ok()) {
        log_once("updated pool (placement " + updated->placement_mode + ", oversell " +
                 TflopsQuantity(updated->tflops_oversell_ratio) + ")");
      } else if (updated.status().code() == StatusCode::kInvalidArgument) {
        problem = updated.status().message();
      } else {
        return updated.status();
      }
    }
  } else {
    problem = want.status().message();
  }
  if (!problem.empty()) log_once("invalid spec, nothing changed: " + problem);

  // Status: what our store holds for the pool (also while the spec is invalid: the pool as it is).
  StatusOr<Pool> pool = controller_->GetPool(name);
  std::set<std::string> nodes, ready;
  for (const NodeStatus& n : controller_->ListNodes())
    if (n.node.pool == name) {
      nodes.insert(n.node.name);
      if (n.node.state == NodeState::kReady) ready.insert(n.node.name);
    }
  const PoolUsage* pu = nullptr;
  for (const PoolUsage& p : usage.pools)
    if (p.name == name) pu = &p;
  return WriteStatus(*pools_, path, obj, [&](const Json& cur) {
    Json s = Json::object();
    s["phase"] = nodes.empty() ? "Pending" : "Running";
    if (pool.ok()) s["placementMode"] = pool->placement_mode;
    s["totalNodes"] = nodes.size();
    s["readyNodes"] = ready.size();
    s["totalGPUs"] = pu ? pu->gpus : 0;
    s["totalTFlops"] = TflopsQuantity(pu ? pu->tflops : 0);
    s["totalVRAM"] = VramQuantity(pu ? pu->vram_mib : 0);
    s["virtualTFlops"] = TflopsQuantity(pu ? pu->schedulable_tflops : 0);
    s["virtualVRAM"] = VramQuantity(pu ? pu->schedulable_vram_mib : 0);
    s["availableTFlops"] = TflopsQuantity(pu ? pu->schedulable_tflops - pu->used_tflops : 0);
    s["availableVRAM"] = VramQuantity(pu ? pu->schedulable_vram_mib - pu->used_vram_mib : 0);
    s["conditions"] = Json::array(
        {problem.empty() ? ReadyCondition(cur, true, "Reconciled",
                                          "pool '" + name + "' matches the spec; " + std::to_string(held) +
                                              " allocation(s) hold " + TflopsQuantity(pu ? pu->used_tflops : 0) +
                                              " TFLOPS and " + VramQuantity(pu ? pu->used_vram_mib : 0) + " of VRAM",
                                          now)
                         : ReadyCondition(cur, false, "InvalidSpec", problem + " (the pool keeps its settings)", now)});
    const Json& gen = Field(Field(cur, "metadata"), "generation");
    if (gen.is_number_integer() && problem.empty()) s["observedGeneration"] = gen;
    else if (Field(Field(cur, "status"), "observedGeneration").is_number_integer())
      s["observedGeneration"] = Field(Field(cur, "status"), "observedGeneration");
    return s;
  });
}

Status KubeReconciler::ReconcileWorkload(const Json& obj, const std::vector<Allocation>& allocations) {
  const Json& meta = Field(obj, "metadata");
  const std::string ns = Str(meta, "namespace"), name = Str(meta, "name");
  if (!IsKubeName(name) || !IsKubeName(ns)) return Status::Ok();
  const std::string path = ObjectPath("tensorfusionworkloads", obj);
  const std::string request_id = WorkloadRequestId(obj);
  const int64_t now = clock_->NowMs();
  auto log_once = [this, &ns, &name](const std::string& line) {
    std::string& last = last_logged_["workload/" + ns + "/" + name];
    if (last == line) return;
    last = line;
    Log("TensorFusionWorkload " + ns + "/" + name + ": " + line);
  };
  const Allocation* held = nullptr;
  for (const Allocation& a : allocations)
    if (a.request_id == request_id && a.tenant == ns) held = &a;

  if (Deleting(obj)) {
    if (!HasFinalizer(obj)) return Status::Ok();
    if (held != nullptr) {
      Status st = controller_->Release(held->id);
      if (!st.ok() && st.code() != StatusCode::kNotFound) return st;
      log_once("deleted: allocation " + held->id + " released");
    }
    last_logged_.erase("workload/" + ns + "/" + name);
    return SetFinalizer(*workloads_, path, obj, false);
  }
  if (!HasFinalizer(obj)) {
    TF_RETURN_IF_ERROR(SetFinalizer(*workloads_, path, obj, true));
    for (const auto& [k, o] : workloads_->Snapshot())
      if (k == ns + "/" + name) return ReconcileWorkload(o, allocations);
    return Status::Ok();
  }

  std::string phase = "Running", reason = "Placed", message;
  Allocation placed;
  if (held != nullptr) {
    placed = *held;
  } else {
    StatusOr<AllocationRequest> req = RequestFromWorkload(obj);
    if (!req.ok()) {
      phase = "Failed";
      reason = "InvalidSpec";
      message = req.status().message();
    } else {
      StatusOr<Allocation> a = controller_->Allocate(*req);
      if (a.ok()) {
        placed = *a;
        log_once("placed as allocation " + a->id + " on node " + a->node);
      } else if (a.status().code() == StatusCode::kInvalidArgument || a.status().code() == StatusCode::kNotFound ||
                 a.status().code() == StatusCode::kPermissionDenied) {  // e.g. a QoS above its tenant's cap
        phase = "Failed";
        reason = "InvalidSpec";
        message = a.status().message();
      } else if (a.status().code() == StatusCode::kOutOfMemory ||
                 a.status().code() == StatusCode::kResourceExhausted) {
        phase = "Pending";
        reason = "Unschedulable";
        message = a.status().message() + " (placement is tried again)";
      } else {
        return a.status();
      }
    }
  }
  if (!message.empty()) log_once(message);
  if (placed.id.empty() && message.empty()) message = "not placed";
  if (!placed.id.empty()) message = "allocation " + placed.id + " on node " + placed.node;
  return WriteStatus(*workloads_, path, obj, [&](const Json& cur) {
    Json s = Json::object();
    s["phase"] = phase;
    s["message"] = message.substr(0, 1024);
    s["workerCount"] = placed.id.empty() ? 0 : 1;
    s["readyWorkers"] = placed.id.empty() ? 0 : 1;
    Json list = Json::array();
    if (!placed.id.empty()) {
      Json gpus = Json::array();
      for (const Vgpu& v : placed.vgpus) gpus.push_back(v.gpu_uuid);
      list.push_back({{"id", placed.id}, {"node", placed.node}, {"gpus", gpus}});
    }
    s["allocations"] = list;
    s["conditions"] = Json::array({ReadyCondition(cur, phase == "Running", reason, message, now)});
    const Json& gen = Field(Field(cur, "metadata"), "generation");
    if (gen.is_number_integer()) s["observedGeneration"] = gen;
    return s;
  });
}

StatusOr<Json> KubeReconciler::EnsureMirror(KubeObjectCache& cache, const std::string& plural, const std::string& kind,
                                            const std::string& name) {
  Json body = {{"apiVersion", kKubeGroupVersion},
               {"kind", kind},
               {"metadata", {{"name", name}, {"labels", {{kKubeManagedByLabel, kKubeManagedByValue}}}}}};
  const std::string collection = std::string(kApiPrefix) + plural;
  StatusOr<KubeResponse> r = api_.Call("POST", collection, body.dump());
  if (!r.ok()) return r.status();
  if (r->status == 409) r = api_.Call("GET", collection + "/" + name);  // made meanwhile: use it
  if (!r.ok()) return r.status();
  if (r->status != 200 && r->status != 201) return Unavailable("create " + kind + " " + name + ": " + StatusMessage(*r));
  Json obj = Json::parse(r->body, nullptr, false);
  if (!obj.is_object()) return Unavailable("create " + kind + " " + name + ": the answer is not an object");
  cache.Update(obj, "");  // unless the watch has delivered it already
  Log("created " + kind + " " + name);
  return obj;
}

Status KubeReconciler::MirrorNodes(const UsageSnapshot& usage) {
  Status first = Status::Ok();
  Objects existing = gpunodes_->Snapshot();
  std::set<std::string> wanted;
  for (const NodeStatus& ns : controller_->ListNodes()) {
    const Node& n = ns.node;
    const std::string kname = MirrorName(n.name);
    if (kname.empty() || !wanted.insert(kname).second) continue;  // no Kubernetes name for it
    Json obj;
    if (auto it = existing.find(kname); it != existing.end()) {
      obj = it->second;
    } else {
      StatusOr<Json> made = EnsureMirror(*gpunodes_, "gpunodes", "GPUNode", kname);
      if (!made.ok()) {
        if (first.ok()) first = made.status();
        continue;
      }
      obj = *made;
    }
    MilliTflops tflops_milli = 0, used_milli = 0, vtflops_milli = 0;  // exact sums of the GPUs' TFLOPS
    int64_t vram = 0, vvram = 0, used_vram = 0;
    Json uuids = Json::array();
    for (const GpuUsage& g : usage.gpus)
      if (g.node == n.name) {
        tflops_milli += ToMilliTflops(g.tflops);
        vtflops_milli += ToMilliTflops(g.schedulable_tflops);
        used_milli += ToMilliTflops(g.used_tflops);
        vram += g.vram_mib;
        vvram += g.schedulable_vram_mib;
        used_vram += g.used_vram_mib;
        uuids.push_back(g.uuid);
      }
    Status st = WriteStatus(*gpunodes_, ObjectPath("gpunodes", obj), obj, [&](const Json&) {
      Json s = {{"phase", n.state == NodeState::kReady ? "Ready" : "Lost"},
                {"poolName", n.pool},
                {"registeredAt", Rfc3339(n.registered_ms)},
                {"totalGPUs", uuids.size()},
                {"totalTFlops", TflopsQuantity(ToTflops(tflops_milli))},
                {"totalVRAM", VramQuantity(vram)},
                {"virtualTFlops", TflopsQuantity(ToTflops(vtflops_milli))},
                {"virtualVRAM", VramQuantity(vvram)},
                {"availableTFlops", TflopsQuantity(ToTflops(vtflops_milli - used_milli))},
                {"availableVRAM", VramQuantity(vvram - used_vram)},
                {"managedGPUDeviceIDs", uuids}};
      if (!n.address.empty()) s["address"] = n.address;
      if (!n.worker_address.empty()) s["workerAddress"] = n.worker_address;
      if (n.state == NodeState::kLost && n.lost_since_ms > 0) s["lostSince"] = Rfc3339(n.lost_since_ms);
      return s;
    });
    if (!st.ok() && first.ok()) first = st;
  }
  for (const auto& [key, obj] : existing) {
    if (wanted.count(key) || Str(Field(Field(obj, "metadata"), "labels"), kKubeManagedByLabel) != kKubeManagedByValue)
      continue;
    StatusOr<KubeResponse> r = api_.Call("DELETE", ObjectPath("gpunodes", obj));
    if (r.ok() && (r->status == 200 || r->status == 202 || r->status == 404)) {
      gpunodes_->Forget(key, Str(Field(obj, "metadata"), "uid"));
      Log("deleted GPUNode " + key + " (its node left the controller)");
    } else if (first.ok()) {
      first = r.ok() ? Unavailable("DELETE GPUNode " + key + ": " + StatusMessage(*r)) : r.status();
    }
  }
  return first;
}

Status KubeReconciler::MirrorGpus(const UsageSnapshot& usage, const std::vector<Allocation>& allocations) {
  Status first = Status::Ok();
  Objects existing = gpus_->Snapshot();
  std::set<std::string> wanted;
  std::map<std::string, Json> vgpus_by_gpu;
  for (const Allocation& a : allocations)
    for (const Vgpu& v : a.vgpus) {
      Json e = {{"allocation", a.id}, {"qos", QosName(a.qos)}, {"tflops", TflopsQuantity(ToTflops(v.milli_tflops))},
                {"tflopsLimit", TflopsQuantity(ToTflops(v.milli_tflops_limit))}, {"vram", VramQuantity(v.vram_mib)}};
      if (!a.tenant.empty()) e["tenant"] = a.tenant;
      vgpus_by_gpu[v.gpu_uuid].push_back(std::move(e));
    }
  std::map<std::string, int> gpu_index_numa;
  for (const GpuStatus& g : controller_->ListGpus("")) gpu_index_numa[g.gpu.uuid] = g.gpu.numa_node;
  for (const GpuUsage& g : usage.gpus) {
    const std::string kname = MirrorName(g.uuid);
    if (kname.empty() || !wanted.insert(kname).second) continue;
    Json obj;
    if (auto it = existing.find(kname); it != existing.end()) {
      obj = it->second;
    } else {
      StatusOr<Json> made = EnsureMirror(*gpus_, "gpus", "GPU", kname);
      if (!made.ok()) {
        if (first.ok()) first = made.status();
        continue;
      }
      obj = *made;
    }
    Status st = WriteStatus(*gpus_, ObjectPath("gpus", obj), obj, [&](const Json&) {
      Json s = {{"uuid", g.uuid},
                {"nodeName", MirrorName(g.node).empty() ? g.node : MirrorName(g.node)},
                {"poolName", g.pool},
                {"gpuModel", g.model.substr(0, 256)},
                {"index", g.index},
                {"numaNode", gpu_index_numa.count(g.uuid) ? gpu_index_numa[g.uuid] : -1},
                {"phase", g.schedulable ? "Running" : "Unschedulable"},
                {"capacity", {{"tflops", TflopsQuantity(g.tflops)}, {"vram", VramQuantity(g.vram_mib)}}},
                {"available", {{"tflops", TflopsQuantity(ToTflops(ToMilliTflops(g.tflops) - ToMilliTflops(g.used_tflops)))},
                               {"vram", VramQuantity(g.vram_mib - g.used_vram_mib)}}},
                {"allocated", {{"tflops", TflopsQuantity(g.used_tflops)}, {"vram", VramQuantity(g.used_vram_mib)}}},
                {"utilizationPercent", static_cast<int>(std::lround(std::clamp(g.utilization_percent, 0.0, 100.0)))},
                {"memoryUsed", VramQuantity(g.memory_used_mib)},
                {"vgpus", vgpus_by_gpu.count(g.uuid) ? vgpus_by_gpu[g.uuid] : Json::array()}};
      return s;
    });
    if (!st.ok() && first.ok()) first = st;
  }
  for (const auto& [key, obj] : existing) {
    if (wanted.count(key) || Str(Field(Field(obj, "metadata"), "labels"), kKubeManagedByLabel) != kKubeManagedByValue)
      continue;
    StatusOr<KubeResponse> r = api_.Call("DELETE", ObjectPath("gpus", obj));
    if (r.ok() && (r->status == 200 || r->status == 202 || r->status == 404)) {
      gpus_->Forget(key, Str(Field(obj, "metadata"), "uid"));
      Log("deleted GPU " + key + " (its node left the controller)");
    } else if (first.ok()) {
      first = r.ok() ? Unavailable("DELETE GPU " + key + ": " + StatusMessage(*r)) : r.status();
    }
  }
  return first;
}

}  // namespace tf::controller
