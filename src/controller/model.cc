#include "controller/model.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "limiter/core/tier_defaults.h"

namespace tf::controller {

using nlohmann::json;

MilliTflops ToMilliTflops(double tflops) {
  if (std::isnan(tflops)) return 0;
  return static_cast<MilliTflops>(std::llround(std::clamp(tflops, -1e15, 1e15) * 1000.0));
}
double ToTflops(MilliTflops m) { return static_cast<double>(m) / 1000.0; }

const char* QosName(Qos q) {
  switch (q) {
    case Qos::kLow: return "low";
    case Qos::kMedium: return "medium";
    case Qos::kHigh: return "high";
    case Qos::kCritical: return "critical";
  }
  return "medium";
}

StatusOr<Qos> ParseQos(const std::string& s) {
  if (s == "low") return Qos::kLow;
  if (s == "medium") return Qos::kMedium;
  if (s == "high") return Qos::kHigh;
  if (s == "critical") return Qos::kCritical;
  return InvalidArgument("qos must be one of low, medium, high, critical (got '" + s + "')");
}

json ToJson(const Pool& p) {
  return {{"name", p.name}, {"created_ms", p.created_ms}, {"placement_mode", p.placement_mode},
          {"tflops_oversell_ratio", p.tflops_oversell_ratio},
          {"vram_expand_to_host_percent", p.vram_expand_to_host_percent},
          {"vram_expand_to_disk_percent", p.vram_expand_to_disk_percent}};
}

json ToJson(const TenantQuota& q) {
  return {{"tenant", q.tenant}, {"max_tflops", ToTflops(q.max_milli_tflops)},
          {"max_milli_tflops", q.max_milli_tflops}, {"max_vram_mib", q.max_vram_mib},
          {"max_gpus", q.max_gpus}, {"max_qos", q.max_qos}};
}

const char* EvictionStateName(EvictionState s) {
  return s == EvictionState::kStopped ? "stopped" : "stopping";
}

const char* RoleName(Role r) {
  switch (r) {
    case Role::kAdmin: return "admin";
    case Role::kTenant: return "tenant";
    case Role::kNode: return "node";
  }
  return "admin";
}

StatusOr<Role> ParseRole(const std::string& s) {
  if (s == "admin") return Role::kAdmin;
  if (s == "tenant") return Role::kTenant;
  if (s == "node") return Role::kNode;
  return InvalidArgument("role must be one of admin, tenant, node (got '" + s + "')");
}

json ToJson(const ApiToken& t) {
  return {{"id", t.id}, {"role", RoleName(t.role)}, {"tenant", t.tenant}, {"node", t.node},
          {"description", t.description}, {"secret_sha256", t.secret_sha256}, {"created_ms", t.created_ms}};
}

json ToJson(const Eviction& e) {
  return {{"id", e.allocation.id},          {"node", e.allocation.node},
          {"allocation", ToJson(e.allocation)}, {"reason", e.reason},
          {"preempted_by", e.preempted_by}, {"evicted_ms", e.evicted_ms},
          {"state", EvictionStateName(e.state)}, {"stopped_ms", e.stopped_ms},
          {"processes_stopped", e.processes_stopped}};
}

json ToJson(const Node& n) {
  return {{"name", n.name},
          {"pool", n.pool},
          {"address", n.address},
          {"worker_address", n.worker_address},
          {"state", n.state == NodeState::kReady ? "ready" : "lost"},
          {"registered_ms", n.registered_ms},
          {"lost_since_ms", n.lost_since_ms},
          {"credential_sha256", n.credential_sha256},
          {"disk_tier_budget_mib", n.disk_tier_budget_mib},
          {"cordoned", n.cordoned},
          {"cordoned_ms", n.cordoned_ms}};
}

int64_t DiskTierShareMib(int64_t node_disk_tier_budget_mib, size_t node_gpus) {
  if (node_disk_tier_budget_mib < 0) return -1;
  return node_disk_tier_budget_mib / static_cast<int64_t>(std::max<size_t>(node_gpus, 1));
}

Status ValidateTierBudget(const std::string& what, int64_t mib) {
  if (mib < 0 || mib > (int64_t{1} << 40))
    return InvalidArgument(what + " must be an integer from 0 to 1099511627776 (MiB)");
  return Status::Ok();
}

json ToJson(const Gpu& g) {
  return {{"uuid", g.uuid},           {"node", g.node},
          {"pool", g.pool},           {"model", g.model},
          {"index", g.index},         {"numa_node", g.numa_node},
          {"tflops", ToTflops(g.milli_tflops)}, {"milli_tflops", g.milli_tflops},
          {"vram_mib", g.vram_mib},
          {"used_tflops", ToTflops(g.used_milli_tflops)}, {"used_milli_tflops", g.used_milli_tflops},
          {"used_vram_mib", g.used_vram_mib},
          {"schedulable", g.schedulable},
          {"host_tier_budget_mib", g.host_tier_budget_mib},
          {"unpooled_tflops", ToTflops(g.unpooled_milli_tflops)}, {"unpooled_milli_tflops", g.unpooled_milli_tflops},
          {"unpooled_vram_mib", g.unpooled_vram_mib}};
}

namespace {
// Tier idle overrides: written only when set, so records without them read back unset.
void PutTierIdle(json& j, const std::optional<int64_t>& swap_ms, const std::optional<int64_t>& disk_ms,
                 const std::optional<int64_t>& zero_ms) {
  if (swap_ms) j["idle_swap_ms"] = *swap_ms;
  if (disk_ms) j["idle_disk_ms"] = *disk_ms;
  if (zero_ms) j["idle_zero_ms"] = *zero_ms;
}
void GetTierIdle(const json& j, std::optional<int64_t>& swap_ms, std::optional<int64_t>& disk_ms,
                 std::optional<int64_t>& zero_ms) {
  if (j.contains("idle_swap_ms")) swap_ms = j.at("idle_swap_ms").get<int64_t>();
  if (j.contains("idle_disk_ms")) disk_ms = j.at("idle_disk_ms").get<int64_t>();
  if (j.contains("idle_zero_ms")) zero_ms = j.at("idle_zero_ms").get<int64_t>();
}
}  // namespace

Status ValidateTierIdle(const char* field, int64_t ms) {
  if (ms < 0 || ms > kMaxTierIdleMs)
    return InvalidArgument(std::string("field '") + field + "' must be an integer from 0 (never) to " +
                           std::to_string(kMaxTierIdleMs) + " (30 days, in ms)");
  return Status::Ok();
}

Status ValidateIdleZero(const std::string& zero_field, int64_t zero_ms, const std::string& swap_what, int64_t swap_ms) {
  if (zero_ms <= 0) return Status::Ok();
  if (swap_ms <= 0)
    return InvalidArgument(zero_field + " needs an idle swap timeout (" + swap_what +
                           " is never): a process is checkpointed only once it is swapped out");
  if (zero_ms <= swap_ms)
    return InvalidArgument(zero_field + " (" + TierIdleText(zero_ms) + ") must be longer than " + swap_what + " (" +
                           TierIdleText(swap_ms) + "): a process is checkpointed only once it is swapped out");
  return Status::Ok();
}

int64_t EffectiveIdleSwapMs(const std::optional<int64_t>& override_ms, Qos qos) {
  return override_ms ? *override_ms : static_cast<int64_t>(limiter::DefaultIdleSwapMs(static_cast<uint32_t>(qos)));
}

std::string TierIdleText(int64_t ms) {
  if (ms <= 0) return "never";
  if (ms % 3'600'000 == 0) return std::to_string(ms / 3'600'000) + "h";
  if (ms % 60'000 == 0) return std::to_string(ms / 60'000) + "m";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

json ToJson(const Workload& w) {
  const MilliTflops limit = w.milli_tflops_limit > 0 ? w.milli_tflops_limit : w.milli_tflops;
  json j = {{"name", w.name},         {"pool", w.pool},
            {"tflops", ToTflops(w.milli_tflops)}, {"milli_tflops", w.milli_tflops},
            {"vram_mib", w.vram_mib}, {"gpu_count", w.gpu_count}, {"qos", QosName(w.qos)},
            {"tflops_limit", ToTflops(limit)}, {"milli_tflops_limit", limit}};
  PutTierIdle(j, w.idle_swap_ms, w.idle_disk_ms, w.idle_zero_ms);
  return j;
}

json ToJson(const Allocation& a) {
  json vgpus = json::array();
  for (const Vgpu& v : a.vgpus)
    vgpus.push_back({{"gpu", v.gpu_uuid}, {"tflops", ToTflops(v.milli_tflops)}, {"milli_tflops", v.milli_tflops},
                     {"vram_mib", v.vram_mib}, {"gpu_index", v.gpu_index}, {"share_ppm", v.share_ppm},
                     {"tflops_limit", ToTflops(v.milli_tflops_limit)},
                     {"milli_tflops_limit", v.milli_tflops_limit}, {"limit_ppm", v.limit_ppm}});
  json j = {{"id", a.id},     {"workload", a.workload}, {"pool", a.pool},
            {"node", a.node}, {"qos", QosName(a.qos)},  {"vgpus", vgpus},
            {"created_ms", a.created_ms}, {"tenant", a.tenant}, {"request_id", a.request_id},
            {"tiering", a.tiering}, {"freeze_requests", a.freeze_requests}, {"thaw_requests", a.thaw_requests},
            {"lease_ms", a.lease_ms}, {"lease_expires_ms", a.lease_expires_ms},
            {"suspended", a.suspended}, {"suspended_by", a.suspended_by}, {"suspended_ms", a.suspended_ms}};
  PutTierIdle(j, a.idle_swap_ms, a.idle_disk_ms, a.idle_zero_ms);
  j["zero_requests"] = a.zero_requests;
  return j;
}

namespace {

// Compute as stored: the integer `milli_key` (written since compute became milli-TFLOPS), else
// the older decimal `tflops_key` converted with ToMilliTflops, else `fallback` (nullopt: the key
// is required). Values outside [0, 1e12] milli-TFLOPS make the record malformed.
MilliTflops ReadMilli(const json& j, const char* milli_key, const char* tflops_key,
                      std::optional<MilliTflops> fallback) {
  constexpr MilliTflops kMax = 1'000'000'000'000;
  MilliTflops m = 0;
  if (j.contains(milli_key)) {
    const json& v = j.at(milli_key);
    if (!v.is_number_integer()) throw std::invalid_argument(std::string(milli_key) + " is not an integer");
    m = v.get<MilliTflops>();
  } else if (j.contains(tflops_key)) {
    const double t = j.at(tflops_key).get<double>();
    if (!std::isfinite(t) || t < 0 || t > 1e9) throw std::invalid_argument(std::string(tflops_key) + " is out of range");
    m = ToMilliTflops(t);
  } else if (fallback) {
    return *fallback;
  } else {
    throw std::invalid_argument(std::string("no ") + tflops_key);
  }
  if (m < 0 || m > kMax) throw std::invalid_argument(std::string(milli_key) + " is out of range");
  return m;
}

// A GPU's usage as stored. Usage is derived (the sum of the allocations, repaired from them on
// start), so an unreadable or out-of-range value does not make the record unreadable: it reads as
// -1, which disagrees with every sum and so is repaired.
MilliTflops ReadUsage(const json& j) {
  try {
    return ReadMilli(j, "used_milli_tflops", "used_tflops", 0);
  } catch (const std::invalid_argument&) {
    return -1;
  } catch (const json::exception&) {
    return -1;
  }
}

template <typename T, typename F>
StatusOr<T> Parse(const std::string& text, const char* what, F fill) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Internal(std::string("stored ") + what + " is not JSON");
  try {
    T v;
    fill(j, v);
    return v;
  } catch (const json::exception& e) {
    return Internal(std::string("stored ") + what + " is malformed: " + e.what());
  } catch (const std::invalid_argument& e) {
    return Internal(std::string("stored ") + what + " is malformed: " + e.what());
  }
}

}  // namespace

StatusOr<Pool> PoolFromJson(const std::string& text) {
  return Parse<Pool>(text, "pool", [](const json& j, Pool& p) {
    p.name = j.at("name").get<std::string>();
    p.created_ms = j.value("created_ms", int64_t{0});
    p.placement_mode = j.value("placement_mode", std::string("NodeCompactGPULowLoad"));
    p.tflops_oversell_ratio = j.value("tflops_oversell_ratio", 1.0);
    p.vram_expand_to_host_percent = j.value("vram_expand_to_host_percent", 0);
    p.vram_expand_to_disk_percent = j.value("vram_expand_to_disk_percent", 0);
  });
}

StatusOr<TenantQuota> TenantQuotaFromJson(const std::string& text) {
  return Parse<TenantQuota>(text, "quota", [](const json& j, TenantQuota& q) {
    q.tenant = j.at("tenant").get<std::string>();
    q.max_milli_tflops = ReadMilli(j, "max_milli_tflops", "max_tflops", 0);
    q.max_vram_mib = j.value("max_vram_mib", int64_t{0});
    q.max_gpus = j.value("max_gpus", 0);
    q.max_qos = j.value("max_qos", "");
  });
}

StatusOr<Node> NodeFromJson(const std::string& text) {
  return Parse<Node>(text, "node", [](const json& j, Node& n) {
    n.name = j.at("name").get<std::string>();
    n.pool = j.at("pool").get<std::string>();
    n.address = j.value("address", "");
    n.worker_address = j.value("worker_address", "");
    n.state = j.value("state", "ready") == "lost" ? NodeState::kLost : NodeState::kReady;
    n.registered_ms = j.value("registered_ms", int64_t{0});
    n.lost_since_ms = j.value("lost_since_ms", int64_t{0});
    n.credential_sha256 = j.value("credential_sha256", "");
    n.disk_tier_budget_mib = j.value("disk_tier_budget_mib", int64_t{-1});
    n.cordoned = j.value("cordoned", false);  // absent in records written before cordons existed
    n.cordoned_ms = j.value("cordoned_ms", int64_t{0});
  });
}

StatusOr<Gpu> GpuFromJson(const std::string& text) {
  return Parse<Gpu>(text, "gpu", [](const json& j, Gpu& g) {
    g.uuid = j.at("uuid").get<std::string>();
    g.node = j.at("node").get<std::string>();
    g.pool = j.at("pool").get<std::string>();
    g.model = j.value("model", "");
    g.index = j.value("index", 0);
    g.numa_node = j.value("numa_node", -1);
    g.milli_tflops = ReadMilli(j, "milli_tflops", "tflops", std::nullopt);
    g.vram_mib = j.at("vram_mib").get<int64_t>();
    g.used_milli_tflops = ReadUsage(j);
    g.used_vram_mib = j.value("used_vram_mib", int64_t{0});
    g.schedulable = j.value("schedulable", true);
    g.host_tier_budget_mib = j.value("host_tier_budget_mib", int64_t{-1});
    g.unpooled_milli_tflops = j.value("unpooled_milli_tflops", MilliTflops{0});
    g.unpooled_vram_mib = j.value("unpooled_vram_mib", int64_t{0});
  });
}

StatusOr<Workload> WorkloadFromJson(const std::string& text) {
  return Parse<Workload>(text, "workload", [](const json& j, Workload& w) {
    w.name = j.at("name").get<std::string>();
    w.pool = j.at("pool").get<std::string>();
    w.milli_tflops = ReadMilli(j, "milli_tflops", "tflops", std::nullopt);
    w.vram_mib = j.at("vram_mib").get<int64_t>();
    w.gpu_count = j.value("gpu_count", 1);
    StatusOr<Qos> q = ParseQos(j.value("qos", "medium"));
    w.qos = q.ok() ? *q : Qos::kMedium;
    // Older records: limit = request.
    w.milli_tflops_limit = ReadMilli(j, "milli_tflops_limit", "tflops_limit", w.milli_tflops);
    GetTierIdle(j, w.idle_swap_ms, w.idle_disk_ms, w.idle_zero_ms);
  });
}

StatusOr<Allocation> AllocationFromJson(const std::string& text) {
  return Parse<Allocation>(text, "allocation", [](const json& j, Allocation& a) {
    a.id = j.at("id").get<std::string>();
    a.workload = j.value("workload", "");
    a.pool = j.at("pool").get<std::string>();
    a.node = j.at("node").get<std::string>();
    StatusOr<Qos> q = ParseQos(j.value("qos", "medium"));
    a.qos = q.ok() ? *q : Qos::kMedium;
    for (const json& v : j.at("vgpus")) {
      Vgpu vg{v.at("gpu").get<std::string>(), ReadMilli(v, "milli_tflops", "tflops", std::nullopt),
              v.at("vram_mib").get<int64_t>(), v.value("gpu_index", 0),
              v.value("share_ppm", uint64_t{0}), 0, 0};
      // Older records have no limit: limit = request.
      vg.milli_tflops_limit =
          std::max(ReadMilli(v, "milli_tflops_limit", "tflops_limit", vg.milli_tflops), vg.milli_tflops);
      vg.limit_ppm = std::max(v.value("limit_ppm", vg.share_ppm), vg.share_ppm);
      a.vgpus.push_back(std::move(vg));
    }
    a.created_ms = j.value("created_ms", int64_t{0});
    a.tenant = j.value("tenant", "");
    a.request_id = j.value("request_id", "");
    a.tiering = j.value("tiering", false);
    a.freeze_requests = j.value("freeze_requests", 0u);
    a.thaw_requests = j.value("thaw_requests", 0u);
    a.lease_ms = j.value("lease_ms", int64_t{0});
    a.lease_expires_ms = j.value("lease_expires_ms", int64_t{0});
    a.suspended = j.value("suspended", false);
    a.suspended_by = j.value("suspended_by", "");
    a.suspended_ms = j.value("suspended_ms", int64_t{0});
    GetTierIdle(j, a.idle_swap_ms, a.idle_disk_ms, a.idle_zero_ms);
    a.zero_requests = j.value("zero_requests", 0u);
  });
}

StatusOr<ApiToken> ApiTokenFromJson(const std::string& text) {
  return Parse<ApiToken>(text, "token", [](const json& j, ApiToken& t) {
    t.id = j.at("id").get<std::string>();
    StatusOr<Role> r = ParseRole(j.value("role", "tenant"));
    t.role = r.ok() ? *r : Role::kTenant;
    t.tenant = j.value("tenant", "");
    t.node = j.value("node", "");
    t.description = j.value("description", "");
    t.secret_sha256 = j.at("secret_sha256").get<std::string>();
    t.created_ms = j.value("created_ms", int64_t{0});
  });
}

StatusOr<Eviction> EvictionFromJson(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("allocation"))
    return Internal("stored eviction is not JSON");
  StatusOr<Allocation> a = AllocationFromJson(j["allocation"].dump());
  if (!a.ok()) return a.status();
  return Parse<Eviction>(text, "eviction", [&a](const json& j, Eviction& e) {
    e.allocation = *a;
    e.reason = j.value("reason", "");
    e.preempted_by = j.value("preempted_by", "");
    e.evicted_ms = j.value("evicted_ms", int64_t{0});
    e.state = j.value("state", "stopping") == "stopped" ? EvictionState::kStopped : EvictionState::kStopping;
    e.stopped_ms = j.value("stopped_ms", int64_t{0});
    e.processes_stopped = j.value("processes_stopped", 0);
  });
}

Status ValidateWorkerAddress(const std::string& address) {
  const std::string bad = "worker address '" + address + "' must be HOST:PORT (e.g. 10.0.0.5:7600)";
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= address.size()) return InvalidArgument(bad);
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return InvalidArgument(bad);
  const int p = std::stoi(port);
  if (p < 1 || p > 65535) return InvalidArgument("worker address '" + address + "': port must be 1-65535");
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']' ||
        host.find_first_not_of("0123456789abcdefABCDEF:.", 1) != host.size() - 1)
      return InvalidArgument(bad);
    return Status::Ok();
  }
  if (host.size() > 253) return InvalidArgument(bad);
  for (char c : host) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
    if (!ok) return InvalidArgument(bad);
  }
  return Status::Ok();
}

Status ValidateText(const std::string& what, const std::string& text, size_t max_bytes) {
  if (text.size() > max_bytes) return InvalidArgument(what + " must be at most " + std::to_string(max_bytes) + " characters");
  for (char c : text)
    if (c < 0x20 || c > 0x7e)  // control characters, and bytes of other scripts (C1 controls among them)
      return InvalidArgument(what + " may only hold printable ASCII characters (no control characters)");
  return Status::Ok();
}

Status ValidateName(const std::string& what, const std::string& name) {
  if (name.empty() || name.size() > 128)
    return InvalidArgument(what + " must be 1-128 characters long");
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '-';
    if (!ok) return InvalidArgument(what + " '" + name + "' may only hold [A-Za-z0-9._:-]");
  }
  return Status::Ok();
}

}  // namespace tf::controller
