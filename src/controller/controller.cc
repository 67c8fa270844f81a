#include "controller/controller.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <cstdio>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include <openssl/rand.h>
#include <openssl/sha.h>

#include "common/gpu_catalog.h"

namespace tf::controller {
namespace {

constexpr int kMaxCommitAttempts = 3;

// The highest store revision this thread staged in the current Durably() call.
thread_local int64_t t_staged_revision = 0;

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Holds the controller's mutex and records how long the caller waited for it and held it.
class TimedLock {
 public:
  TimedLock(std::mutex& mu, CallStageTimes& times) : mu_(mu), times_(times) {
    const auto asked = std::chrono::steady_clock::now();
    mu_.lock();
    locked_ = std::chrono::steady_clock::now();
    times_.lock_wait.Record(std::chrono::duration<double>(locked_ - asked).count());
  }
  ~TimedLock() {
    const double held = SecondsSince(locked_);
    mu_.unlock();
    times_.locked.Record(held);
  }
  TimedLock(const TimedLock&) = delete;
  TimedLock& operator=(const TimedLock&) = delete;

 private:
  std::mutex& mu_;
  CallStageTimes& times_;
  std::chrono::steady_clock::time_point locked_;
};
constexpr int kMaxGpusPerAllocation = 64;
// Physical bounds every input is checked against before any arithmetic: one GPU's VRAM (16 TiB)
// and TFLOPS as a node may register them, and tenant quotas.
constexpr int64_t kMaxGpuVramMib = int64_t{1} << 24;
constexpr double kMaxRegisteredGpuTflops = 1e6;
constexpr double kMaxQuotaTflops = 1e9;
constexpr int64_t kMaxQuotaVramMib = int64_t{1} << 40;
constexpr int kMaxQuotaGpus = 1'000'000;

std::string PoolKey(const std::string& n) { return kPoolPrefix + n; }
std::string NodeKey(const std::string& n) { return kNodePrefix + n; }
std::string GpuKey(const std::string& u) { return kGpuPrefix + u; }
std::string WorkloadKey(const std::string& n) { return kWorkloadPrefix + n; }
std::string AllocationKey(const std::string& id) { return kAllocationPrefix + id; }
std::string QuotaKey(const std::string& t) { return kQuotaPrefix + t; }
std::string EvictionKey(const std::string& id) { return kEvictionPrefix + id; }

template <typename T>
std::string Dump(const T& v) {
  return ToJson(v).dump();
}

// Compute limits (the ceiling, in the request's unit; 0 = the request). Checked after the
// request itself, so the request is known to be valid.
Status ValidateComputeLimit(double tflops, double percent, double tflops_limit, double percent_limit) {
  if (!std::isfinite(tflops_limit) || tflops_limit < 0)
    return InvalidArgument("tflops_limit must be a positive number");
  if (!std::isfinite(percent_limit) || percent_limit < 0 || percent_limit > 100)
    return InvalidArgument("percent_limit must be a number in (0, 100]");
  if (tflops_limit > 0 && percent_limit > 0)
    return InvalidArgument("give either tflops_limit or percent_limit, not both");
  if ((percent > 0 && tflops_limit > 0) || (percent == 0 && percent_limit > 0))
    return InvalidArgument("give the limit in the request's unit: tflops_limit with tflops, percent_limit with "
                           "percent (the GPU, and so the conversion, is known only after placement)");
  auto below = [](const char* limit_field, double limit, const char* request_field, double request) {
    char buf[200];
    std::snprintf(buf, sizeof(buf), "%s %g is below the request %s %g: the limit is the ceiling and must be "
                  "at least the request", limit_field, limit, request_field, request);
    return InvalidArgument(buf);
  };
  if (tflops_limit > 0 && ToMilliTflops(tflops_limit) < ToMilliTflops(tflops)) return below("tflops_limit", tflops_limit, "tflops", tflops);
  if (percent_limit > 0 && percent_limit < percent) return below("percent_limit", percent_limit, "percent", percent);
  return Status::Ok();
}

// The most TFLOPS one GPU can be asked for: the largest GPU of the built-in catalog, or a larger
// one registered with the pool (a model added through catalog overrides).
double CatalogMaxTflops() {
  static const double m = [] {
    double best = 0;
    const GpuCatalog catalog;
    for (const GpuModelSpec& spec : catalog.builtin_models()) best = std::max(best, spec.fp16_tflops);
    return best;
  }();
  return m;
}

Status CheckTflopsBound(const char* field, double value, double bound) {
  if (value <= bound) return Status::Ok();
  char buf[200];
  std::snprintf(buf, sizeof(buf), "%s %g is above %g, the TFLOPS of the largest GPU in the catalog and the pool",
                field, value, bound);
  return InvalidArgument(buf);
}

std::string Sha256Hex(const std::string& s) {
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d);
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : d) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

// A node enrolled by one agent refuses another (a cloned machine, a second agent started with
// the same --node name).
Status CheckNodeCredential(const Node& n, const std::string& presented) {
  if (n.credential_sha256.empty() || Sha256Hex(presented) == n.credential_sha256) return Status::Ok();
  return FailedPrecondition("node '" + n.name + "' is enrolled by another agent (a cloned machine, or a second "
                            "agent started with the same --node name): give this one another --node name, or "
                            "remove the node first (tfusion node rm " + n.name + ")");
}

Status ValidateResources(double tflops, int64_t vram_mib, int gpu_count, double percent = 0,
                         double tflops_limit = 0, double percent_limit = 0) {
  if (!std::isfinite(percent) || percent < 0 || percent > 100)
    return InvalidArgument("percent must be a number in (0, 100]");
  if (percent > 0) {
    if (tflops != 0) return InvalidArgument("give either tflops or percent, not both");
  } else if (!std::isfinite(tflops) || tflops <= 0) {
    return InvalidArgument("tflops must be a positive number");
  } else if (ToMilliTflops(tflops) < 1) {
    return InvalidArgument("tflops must be a positive number of at least 0.001 (compute is counted in whole "
                           "milli-TFLOPS)");
  }
  TF_RETURN_IF_ERROR(ValidateComputeLimit(tflops, percent, tflops_limit, percent_limit));
  if (vram_mib <= 0) return InvalidArgument("vram_mib must be a positive integer");
  if (vram_mib > kMaxGpuVramMib)
    return InvalidArgument("vram_mib " + std::to_string(vram_mib) + " is above " + std::to_string(kMaxGpuVramMib) +
                           ", the most one GPU may have");
  if (gpu_count < 1 || gpu_count > kMaxGpusPerAllocation)
    return InvalidArgument("gpu_count must be between 1 and " +
                           std::to_string(kMaxGpusPerAllocation));
  return Status::Ok();
}

// The vGPU a placement makes on GPU `g`: the request as placed (`tflops` per GPU, percent
// requests resolved) and the limit in TFLOPS and as a share of the GPU. A limit above the GPU's
// capacity is refused (kOutOfMemory, as "no room"); the placement engine only offers GPUs that can host
// it, so this is the last guard against a GPU that reported a different capacity.
// `part` / `whole` in parts per million, rounded to the nearest (halves up); both >= 0, whole > 0,
// part <= 1e12 (so the product fits in 64 bits).
uint64_t PartsPerMillion(MilliTflops part, MilliTflops whole) {
  return static_cast<uint64_t>((part * 1'000'000 + whole / 2) / whole);
}

StatusOr<Vgpu> VgpuOn(const Gpu& g, const PlacementRequest& pr, MilliTflops milli) {
  Vgpu v{g.uuid, milli, pr.vram_mib, g.index, 1'000'000, milli, 1'000'000};
  if (g.milli_tflops <= 0) return v;  // capacity unknown: the whole GPU
  v.share_ppm = PartsPerMillion(milli, g.milli_tflops);
  if (pr.tflops_limit > 0) {
    const MilliTflops limit = ToMilliTflops(pr.tflops_limit);
    if (limit > g.milli_tflops) {
      char buf[200];
      std::snprintf(buf, sizeof(buf), "tflops_limit %g is above the capacity of GPU %s (%s, %g TFLOPS)",
                    pr.tflops_limit, g.uuid.c_str(), g.model.c_str(), ToTflops(g.milli_tflops));
      return OutOfMemory(buf);
    }
    v.milli_tflops_limit = limit;
    v.limit_ppm = PartsPerMillion(limit, g.milli_tflops);
  } else if (pr.percent_limit > 0) {
    v.limit_ppm = static_cast<uint64_t>(std::llround(pr.percent_limit * 1e4));
    v.milli_tflops_limit = static_cast<MilliTflops>(
        (static_cast<uint64_t>(g.milli_tflops) * v.limit_ppm + 500'000) / 1'000'000);
  } else {
    v.limit_ppm = v.share_ppm;
  }
  // Rounding never leaves the limit below the request.
  v.milli_tflops_limit = std::max(v.milli_tflops_limit, v.milli_tflops);
  v.limit_ppm = std::max(v.limit_ppm, v.share_ppm);
  return v;
}

Status ValidatePoolSpec(Pool& p) {
  TF_RETURN_IF_ERROR(ValidateName("pool name", p.name));
  if (p.placement_mode.empty()) p.placement_mode = Pool{}.placement_mode;
  StatusOr<sched::PlacementMode> m = sched::ParsePlacementMode(p.placement_mode);
  if (!m.ok()) return InvalidArgument(m.status().message());
  p.placement_mode = std::string(sched::PlacementModeName(*m));
  if (!std::isfinite(p.tflops_oversell_ratio) || p.tflops_oversell_ratio < 1 || p.tflops_oversell_ratio > 100)
    return InvalidArgument("tflops_oversell_ratio must be a number in [1, 100]");
  if (p.vram_expand_to_host_percent < 0 || p.vram_expand_to_host_percent > 400 ||
      p.vram_expand_to_disk_percent < 0 || p.vram_expand_to_disk_percent > 400)
    return InvalidArgument("vram_expand_to_host_percent and vram_expand_to_disk_percent must be whole numbers in [0, 400]");
  return Status::Ok();
}

}  // namespace

int HttpStatusFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk: return 200;
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kUnauthenticated: return 401;
    case StatusCode::kPermissionDenied: return 403;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kAlreadyExists:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kAborted:
    case StatusCode::kOutOfMemory:
    case StatusCode::kResourceExhausted: return 409;
    case StatusCode::kUnavailable: return 503;
    case StatusCode::kNotSupported: return 501;
    default: return 500;
  }
}

Controller::Controller(Store* store, const Clock* clock, std::unique_ptr<PlacementEngine> placement,
                       LeaderElection* election, ControllerConfig config)
    : store_(store), clock_(clock), placement_(std::move(placement)), election_(election),
      config_(std::move(config)), rng_(std::random_device{}()) {}

Status Controller::Rebuild() {
  // Rebuild runs outside Durably: what it stages (the default pool, usage repairs) it waits for
  // itself, and it leaves no staged revision behind on this thread for a later call to wait on.
  t_staged_revision = 0;
  struct ClearStaged {
    ~ClearStaged() { t_staged_revision = 0; }
  } clear_staged;
  std::lock_guard<std::mutex> lock(mu_);
  serving_ = false;
  NoteUnservedLocked(clock_->NowMs());
  pools_.clear();
  nodes_.clear();
  gpus_.clear();
  workloads_.clear();
  allocations_.clear();
  allocations_by_node_.clear();
  quotas_.clear();
  tokens_.clear();
  evictions_.clear();
  last_heartbeat_ms_.clear();
  samples_.clear();
  sampled_ms_.clear();
  vgpu_use_.clear();
  placement_dirty_ = true;

  auto load = [&](const char* prefix, auto parse, auto& into, auto name_of) -> Status {
    StatusOr<std::vector<KeyValue>> kvs = store_->List(prefix);
    if (!kvs.ok()) return kvs.status();
    for (const KeyValue& kv : *kvs) {
      auto v = parse(kv.value);
      if (!v.ok()) return Internal(kv.key + ": " + v.status().message());
      std::string name = name_of(*v);
      into[name] = {std::move(v).value(), kv.mod_revision};
    }
    return Status::Ok();
  };
  TF_RETURN_IF_ERROR(load(kPoolPrefix, PoolFromJson, pools_, [](const Pool& p) { return p.name; }));
  TF_RETURN_IF_ERROR(load(kNodePrefix, NodeFromJson, nodes_, [](const Node& n) { return n.name; }));
  TF_RETURN_IF_ERROR(load(kGpuPrefix, GpuFromJson, gpus_, [](const Gpu& g) { return g.uuid; }));
  TF_RETURN_IF_ERROR(
      load(kWorkloadPrefix, WorkloadFromJson, workloads_, [](const Workload& w) { return w.name; }));
  TF_RETURN_IF_ERROR(load(kAllocationPrefix, AllocationFromJson, allocations_,
                          [](const Allocation& a) { return a.id; }));
  allocation_by_request_.clear();
  suspended_.clear();
  for (const auto& [id, a] : allocations_) {
    allocations_by_node_[a.value.node].insert(id);
    if (a.value.suspended) suspended_.insert(id);
    if (!a.value.request_id.empty()) allocation_by_request_[a.value.request_id] = id;
  }
  TF_RETURN_IF_ERROR(load(kQuotaPrefix, TenantQuotaFromJson, quotas_,
                          [](const TenantQuota& q) { return q.tenant; }));
  TF_RETURN_IF_ERROR(load(kTokenPrefix, ApiTokenFromJson, tokens_, [](const ApiToken& t) { return t.id; }));
  TF_RETURN_IF_ERROR(load(kEvictionPrefix, EvictionFromJson, evictions_,
                          [](const Eviction& e) { return e.allocation.id; }));

  // GPU usage and allocations are written in the same transaction, so they agree; say so loudly
  // if a store was edited by hand and they do not.
  std::unordered_map<std::string, std::pair<MilliTflops, int64_t>> used;
  for (const auto& [id, a] : allocations_)
    for (const Vgpu& v : a.value.vgpus) {
      if (a.value.suspended) break;  // counted nowhere until it resumes
      used[v.gpu_uuid].first += v.milli_tflops;
      used[v.gpu_uuid].second += v.vram_mib;
    }
  for (auto& [uuid, g] : gpus_) {
    auto u = used[uuid];
    // Exact: usage is an integer sum. A store written before compute was counted in milli-TFLOPS
    // held usage as a sum of doubles; it converts to the same integers unless it had drifted.
    if (u.first == g.value.used_milli_tflops && u.second == g.value.used_vram_mib) continue;
    std::fprintf(stderr, "controller: GPU %s usage (%.3f TFLOPS, %lld MiB) disagrees with its "
                 "allocations (%.3f TFLOPS, %lld MiB): repaired from the allocations\n", uuid.c_str(),
                 ToTflops(g.value.used_milli_tflops), static_cast<long long>(g.value.used_vram_mib), ToTflops(u.first),
                 static_cast<long long>(u.second));
    Gpu fixed = g.value;
    fixed.used_milli_tflops = u.first;
    fixed.used_vram_mib = u.second;
    StatusOr<int64_t> rev = CommitLocked({Compare::At(GpuKey(uuid), g.revision)}, {Write::Put(GpuKey(uuid), Dump(fixed))});
    if (!rev.ok()) return rev.status();
    g = {fixed, *rev};
  }

  TF_RETURN_IF_ERROR(EnsurePoolLocked(config_.default_pool));
  if (t_staged_revision > 0) TF_RETURN_IF_ERROR(store_->WaitDurable(t_staged_revision));
  const int64_t now = clock_->NowMs();
  for (const auto& [name, n] : nodes_) last_heartbeat_ms_[name] = now;
  EnsurePlacementLocked();
  serving_ = true;
  if (not_serving_) AddUnservedSpanLocked(not_serving_since_ms_, now);
  not_serving_ = false;
  return Status::Ok();
}

void Controller::AddUnservedSpanLocked(int64_t from_ms, int64_t to_ms) {
  // Merged with those it overlaps or touches (a rebuild after a failed write falls inside the
  // write outage): that never lengthens a grace, and keeps one outage one span.
  unserved_.emplace_back(from_ms, to_ms);
  std::sort(unserved_.begin(), unserved_.end());
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& span : unserved_) {
    if (!merged.empty() && span.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, span.second);
    } else {
      merged.push_back(span);
    }
  }
  constexpr size_t kMaxUnservedSpans = 64;
  if (merged.size() > kMaxUnservedSpans) merged.erase(merged.begin(), merged.end() - kMaxUnservedSpans);
  unserved_ = std::move(merged);
}

void Controller::NoteUnservedLocked(int64_t now_ms) {
  if (not_serving_) return;  // already not serving
  not_serving_ = true;
  not_serving_since_ms_ = now_ms;
}

void Controller::NoteWriteFailedLocked() {
  if (write_failing_since_ms_ != 0) return;
  const int64_t last_ok = last_durable_ok_ms_.load(std::memory_order_relaxed);
  write_failing_since_ms_ = last_ok > 0 ? last_ok : clock_->NowMs();
  write_failing_.store(true, std::memory_order_relaxed);
}

void Controller::NoteWriteDurable() {
  const int64_t now = clock_->NowMs();
  last_durable_ok_ms_.store(now, std::memory_order_relaxed);
  if (!write_failing_.load(std::memory_order_relaxed)) return;  // the usual case: no lock taken
  std::lock_guard<std::mutex> lock(mu_);
  if (write_failing_since_ms_ != 0) AddUnservedSpanLocked(write_failing_since_ms_, now);
  write_failing_since_ms_ = 0;
  write_failing_.store(false, std::memory_order_relaxed);
}

int64_t Controller::UnservedMsLocked(int64_t from_ms, int64_t now_ms) const {
  // The union of the spans (a rebuild after a failed write falls inside the write outage).
  std::vector<std::pair<int64_t, int64_t>> spans = unserved_;
  if (not_serving_) spans.emplace_back(not_serving_since_ms_, INT64_MAX);
  if (write_failing_since_ms_ != 0) spans.emplace_back(write_failing_since_ms_, INT64_MAX);
  std::sort(spans.begin(), spans.end());
  int64_t total = 0, covered_to = from_ms;
  for (const auto& [start, end] : spans) {
    const int64_t a = std::max(start, covered_to), b = std::min(end, now_ms);
    if (b > a) total += b - a;
    covered_to = std::max(covered_to, b);
  }
  return total;
}

bool Controller::Serving() const {
  std::lock_guard<std::mutex> lock(mu_);
  return serving_ && (election_ == nullptr || election_->IsLeader());
}

void Controller::StopServing() {
  std::lock_guard<std::mutex> lock(mu_);
  serving_ = false;
  NoteUnservedLocked(clock_->NowMs());
}

Status Controller::CheckServingLocked() const {
  if (!serving_) return Unavailable("this controller replica is not serving (not the leader)");
  if (election_ && !election_->IsLeader())
    return Unavailable("this controller replica lost leadership");
  return Status::Ok();
}

StatusOr<int64_t> Controller::CommitLocked(std::vector<Compare> compares,
                                           const std::vector<Write>& writes) {
  if (election_) {
    if (std::optional<Compare> fence = election_->Fence()) compares.push_back(*fence);
  }
  StatusOr<int64_t> rev = store_->Stage(compares, writes);
  if (!rev.ok() && rev.status().code() == StatusCode::kAborted) ++counters_.commit_conflicts;
  if (!rev.ok() && rev.status().code() != StatusCode::kAborted) NoteWriteFailedLocked();
  if (rev.ok()) t_staged_revision = std::max(t_staged_revision, *rev);
  return rev;
}

template <typename F>
auto Controller::Durably(F&& body) -> decltype(body()) {
  t_staged_revision = 0;
  auto result = body();  // takes and releases mu_
  const int64_t rev = t_staged_revision;
  t_staged_revision = 0;
  if (rev == 0) return result;
  const auto waiting = std::chrono::steady_clock::now();
  Status durable = store_->WaitDurable(rev);
  stage_times_.durable_wait.Record(SecondsSince(waiting));
  if (durable.ok()) {
    NoteWriteDurable();
    return result;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    NoteWriteFailedLocked();
  }
  // The batch holding our transaction never reached the disk: the in-memory state is ahead of
  // the store. Re-read it (or stop serving) before anyone else acts on it.
  std::fprintf(stderr, "controller: %s; rebuilding from the store\n", durable.ToString().c_str());
  if (!Rebuild().ok()) StopServing();
  return durable;
}

Status Controller::EnsurePoolLocked(const std::string& name) {
  if (pools_.count(name)) return Status::Ok();
  Pool p{name, clock_->NowMs()};
  StatusOr<int64_t> rev = CommitLocked({Compare::Absent(PoolKey(name))}, {Write::Put(PoolKey(name), Dump(p))});
  if (!rev.ok()) {
    if (rev.status().code() != StatusCode::kAborted) return rev.status();
    // Another writer created it (or we are fenced off): read what is there.
    StatusOr<std::optional<KeyValue>> kv = store_->Get(PoolKey(name));
    if (!kv.ok()) return kv.status();
    if (!kv->has_value()) return rev.status();
    StatusOr<Pool> stored = PoolFromJson((*kv)->value);
    if (!stored.ok()) return stored.status();
    pools_[name] = {*stored, (*kv)->mod_revision};
    return Status::Ok();
  }
  pools_[name] = {p, *rev};
  return Status::Ok();
}

void Controller::EnsurePlacementLocked() {
  if (!placement_dirty_) return;
  ClusterSnapshot snap;
  for (const auto& [n, p] : pools_) snap.pools.push_back(&p.value);
  for (const auto& [n, node] : nodes_) snap.nodes.push_back(&node.value);
  for (const auto& [u, g] : gpus_) snap.gpus.push_back(&g.value);
  for (const auto& [id, a] : allocations_) snap.allocations.push_back(&a.value);
  for (const auto& [t, q] : quotas_) snap.quotas.push_back(&q.value);
  placement_->Reset(snap);
  placement_dirty_ = false;
}

std::string Controller::NewAllocationIdLocked() {
  char buf[24];
  std::snprintf(buf, sizeof buf, "a-%016llx", static_cast<unsigned long long>(rng_()));
  return buf;
}

Status Controller::ReloadGpusLocked(const std::vector<std::string>& uuids) {
  for (const std::string& uuid : uuids) {
    StatusOr<std::optional<KeyValue>> kv = store_->Get(GpuKey(uuid));
    if (!kv.ok()) return kv.status();
    auto it = gpus_.find(uuid);
    if (!kv->has_value()) {
      if (it != gpus_.end()) gpus_.erase(it);
      placement_dirty_ = true;
      continue;
    }
    StatusOr<Gpu> g = GpuFromJson((*kv)->value);
    if (!g.ok()) return g.status();
    gpus_[uuid] = {*g, (*kv)->mod_revision};
    placement_dirty_ = true;  // another writer changed it: the engine's mirror is stale
  }
  return Status::Ok();
}

// ---- pools ----

StatusOr<Pool> Controller::CreatePool(const std::string& name) {
  Pool p;
  p.name = name;
  return CreatePool(p);
}

StatusOr<Pool> Controller::CreatePool(const Pool& spec) {
  return Durably([&]() -> StatusOr<Pool> {
    Pool p = spec;
    TF_RETURN_IF_ERROR(ValidatePoolSpec(p));
    std::lock_guard<std::mutex> lock(mu_);
    TF_RETURN_IF_ERROR(CheckServingLocked());
    if (pools_.count(p.name)) return AlreadyExists("pool '" + p.name + "' already exists");
    p.created_ms = clock_->NowMs();
    StatusOr<int64_t> rev =
        CommitLocked({Compare::Absent(PoolKey(p.name))}, {Write::Put(PoolKey(p.name), Dump(p))});
    if (!rev.ok()) return rev.status();
    pools_[p.name] = {p, *rev};
    if (!placement_dirty_ && !placement_->AddPool(p).ok()) placement_dirty_ = true;
    return p;
  });
}

StatusOr<Pool> Controller::UpdatePool(const Pool& spec) {
  return PatchPool(spec.name, spec.placement_mode, spec.vram_expand_to_host_percent,  // every setting given
                   spec.vram_expand_to_disk_percent, spec.tflops_oversell_ratio);
}

StatusOr<Pool> Controller::PatchPool(const std::string& name, const std::optional<std::string>& placement_mode,
                                     const std::optional<int>& vram_expand_to_host_percent,
                                     const std::optional<int>& vram_expand_to_disk_percent,
                                     const std::optional<double>& tflops_oversell_ratio) {
  return Durably([&]() -> StatusOr<Pool> {
    TF_RETURN_IF_ERROR(ValidateName("pool name", name));
    std::lock_guard<std::mutex> lock(mu_);
    TF_RETURN_IF_ERROR(CheckServingLocked());
    auto it = pools_.find(name);
    if (it == pools_.end()) return NotFound("pool '" + name + "' not found");
    Pool p = it->second.value;
    if (placement_mode) p.placement_mode = *placement_mode;
    if (tflops_oversell_ratio) p.tflops_oversell_ratio = *tflops_oversell_ratio;
    if (vram_expand_to_host_percent) p.vram_expand_to_host_percent = *vram_expand_to_host_percent;
    if (vram_expand_to_disk_percent) p.vram_expand_to_disk_percent = *vram_expand_to_disk_percent;
    TF_RETURN_IF_ERROR(ValidatePoolSpec(p));
    StatusOr<int64_t> rev = CommitLocked({Compare::At(PoolKey(p.name), it->second.revision)},
                                         {Write::Put(PoolKey(p.name), Dump(p))});
    if (!rev.ok()) return rev.status();
    it->second = {p, *rev};
    placement_dirty_ = true;
    return p;
  });
}

StatusOr<TenantQuota> Controller::SetTenantQuota(const TenantQuota& q) {
  return Durably([&]() -> StatusOr<TenantQuota> {
    TF_RETURN_IF_ERROR(ValidateName("tenant", q.tenant));
    if (q.max_milli_tflops < 0 || q.max_vram_mib < 0 || q.max_gpus < 0)
      return InvalidArgument("quota limits must be numbers >= 0 (0 = unlimited)");
    if (q.max_milli_tflops > ToMilliTflops(kMaxQuotaTflops) || q.max_vram_mib > kMaxQuotaVramMib || q.max_gpus > kMaxQuotaGpus)
      return InvalidArgument("quota limits must be at most max_tflops 1e9, max_vram_mib 2^40, max_gpus 1000000");
    if (!q.max_qos.empty()) {
      StatusOr<Qos> cap = ParseQos(q.max_qos);
      if (!cap.ok()) return InvalidArgument("max_qos: " + cap.status().message() + " (\"\" = any)");
    }
    std::lock_guard<std::mutex> lock(mu_);
    TF_RETURN_IF_ERROR(CheckServingLocked());
    auto it = quotas_.find(q.tenant);
    Compare cmp = it == quotas_.end() ? Compare::Absent(QuotaKey(q.tenant))
                                      : Compare::At(QuotaKey(q.tenant), it->second.revision);
    StatusOr<int64_t> rev = CommitLocked({cmp}, {Write::Put(QuotaKey(q.tenant), Dump(q))});
    if (!rev.ok()) return rev.status();
    quotas_[q.tenant] = {q, *rev};
    placement_dirty_ = true;
    return q;
  });
}

Status Controller::DeleteTenantQuota(const std::string& tenant) {
  return Durably([&]() -> Status {
    std::lock_guard<std::mutex> lock(mu_);
    TF_RETURN_IF_ERROR(CheckServingLocked());
    auto it = quotas_.find(tenant);
    if (it == quotas_.end()) return NotFound("tenant '" + tenant + "' has no quota");
    StatusOr<int64_t> rev = CommitLocked({Compare::At(QuotaKey(tenant), it->second.revision)},
                                         {Write::Delete(QuotaKey(tenant))});
    if (!rev.ok()) return rev.status();
    quotas_.erase(it);
    placement_dirty_ = true;
    return Status::Ok();
  });
}

StatusOr<std::pair<ApiToken, std::string>> Controller::CreateToken(ApiToken t) {
  return Durably([&]() -> StatusOr<std::pair<ApiToken, std::string>> {
    if (t.role == Role::kTenant) {
      TF_RETURN_IF_ERROR(ValidateName("tenant", t.tenant));
      if (!t.node.empty()) return InvalidArgument("a tenant token names no node (it is not confined to one)");
    } else if (t.role == Role::kNode) {
      TF_RETURN_IF_ERROR(ValidateName("node", t.node));
      if (!t.tenant.empty()) return InvalidArgument("a node token names no tenant (it acts for its node's agent)");
    } else if (!t.tenant.empty() || !t.node.empty()) {
      return InvalidArgument("an admin token names no tenant and no node");
    }
    if (t.description.size() > 200) return InvalidArgument("description must be at most 200 characters");
    for (unsigned char ch : t.description)
      if (ch < 0x20 || ch == 0x7f) return InvalidArgument("description must not hold control characters");
    unsigned char raw[40];
    if (RAND_bytes(raw, sizeof(raw)) != 1) return Internal("no randomness for a token");
    static const char* kHex = "0123456789abcdef";
    std::string id, secret;
    for (int i = 0; i < 8; ++i) id += {kHex[raw[i] >> 4], kHex[raw[i] & 15]};
    for (int i = 8; i < 40; ++i) secret += {kHex[raw[i] >> 4], kHex[raw[i] & 15]};
    t.id = id;
    t.secret_sha256 = Sha256Hex(secret);
    t.created_ms = clock_->NowMs();
    std::lock_guard<std::mutex> lock(mu_);
    TF_RETURN_IF_ERROR(CheckServingLocked());
    StatusOr<int64_t> rev = CommitLocked({Compare::Absent(kTokenPrefix + t.id)}, {Write::Put(kTokenPrefix + t.id, Dump(t))});
    if (!rev.ok()) return rev.status();
    tokens_[t.id] = {t, *rev};
    return std::make_pair(t, "tft_" + id + "_" + secret);
  });
}

std::vector<ApiToken> Controller::ListTokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ApiToken> out;
  for (const auto& [id, t] : tokens_) out.push_back(t.value);
  return out;
}

Status Controller::RevokeToken(const std::string& id) {
  StatusOr<bool> done = Durably([&]() -> StatusOr<bool> {
    std::lock_guard<std::mutex> lock(mu_);
    TF_RETURN_IF_ERROR(CheckServingLocked());
    auto it = tokens_.find(id);
    if (it == tokens_.end()) return NotFound("token '" + id + "' not found");
    StatusOr<int64_t> rev = CommitLocked({Compare::At(kTokenPrefix + id, it->second.revision)},
                                         {Write::Delete(kTokenPrefix + id)});
    if (!rev.ok()) return rev.status();
    tokens_.erase(it);
    return true;
  });
  return done.ok() ? Status::Ok() : done.status();
}

StatusOr<ApiToken> Controller::Authenticate(const std::string& presented) const {
  // "tft_" + 16 hex id + "_" + 64 hex secret.
  if (presented.size() != 4 + 16 + 1 + 64 || presented.compare(0, 4, "tft_") != 0 || presented[20] != '_')
    return Unauthenticated("not a token of this controller");
  const std::string id = presented.substr(4, 16);
  const std::string digest = Sha256Hex(presented.substr(21));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tokens_.find(id);
  if (it == tokens_.end()) return Unauthenticated("unknown or revoked token");
  const std::string& want = it->second.value.secret_sha256;
  unsigned char diff = want.size() == digest.size() ? 0 : 1;
  for (size_t i = 0; i < digest.size() && i < want.size(); ++i) diff |= static_cast<unsigned char>(digest[i] ^ want[i]);
  if (diff != 0) return Unauthenticated("wrong token secret");
  return it->second.value;
}

std::vector<TenantQuota> Controller::ListTenantQuotas() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TenantQuota> out;
  for (const auto& [t, q] : quotas_) out.push_back(q.value);
  return out;
}

std::vector<Pool> Controller::ListPools() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Pool> out;
  for (const auto& [n, p] : pools_) out.push_back(p.value);
  return out;
}

StatusOr<Pool> Controller::GetPool(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(name);
  if (it == pools_.end()) return NotFound("pool '" + name + "' not found");
  return it->second.value;
}

Status Controller::DeletePool(const std::string& name) {
  return Durably([&]() -> Status {
    std::lock_guard<std::mutex> lock(mu_);
    TF_RETURN_IF_ERROR(CheckServingLocked());
    auto it = pools_.find(name);
    if (it == pools_.end()) return NotFound("pool '" + name + "' not found");
    if (name == config_.default_pool)
      return FailedPrecondition("the default pool '" + name + "' cannot be deleted");
    for (const auto& [n, node] : nodes_)
      if (node.value.pool == name)
        return FailedPrecondition("pool '" + name + "' still has node '" + n + "'");
    // A workload or allocation naming a deleted pool could never be placed again.
    for (const auto& [n, w] : workloads_)
      if (w.value.pool == name)
        return FailedPrecondition("pool '" + name + "' still has workload '" + n + "' (delete it first: DELETE /v1/workloads/" + n + ")");
    for (const auto& [id, a] : allocations_)
      if (a.value.pool == name)
        return FailedPrecondition("pool '" + name + "' still has allocation '" + id +
                                  "' (release it first: DELETE /v1/allocations/" + id + ")");
    StatusOr<int64_t> rev = CommitLocked({Compare::At(PoolKey(name), it->second.revision)},
                                         {Write::Delete(PoolKey(name))});
    if (!rev.ok()) return rev.status();
    pools_.erase(it);
    placement_dirty_ = true;
    return Status::Ok();
  });
}

// ---- nodes ----

namespace {
// A GPU re-registered with less than its allocations hold (a smaller reported VRAM, a changed
// catalog override, a typo in an agent's overrides file) would be over 100% allocated and nothing
// would say so: refused, naming what it holds and what it reports. Tier budgets do not count here:
// they follow free host memory and disk, and heartbeats change them without a refusal.
Status HoldsWhatItsAllocationsNeed(const Gpu& reported, const Pool& pool) {
  if (reported.used_milli_tflops <= 0 && reported.used_vram_mib <= 0) return Status::Ok();
  const sched::SchedulableCapacity cap = UnboundedSchedulableCapacity(reported, pool);
  if (reported.used_milli_tflops <= cap.compute && reported.used_vram_mib <= cap.vram_mib) return Status::Ok();
  char buf[640];
  std::snprintf(buf, sizeof(buf),
                "GPU %s holds allocations of %g TFLOPS and %lld MiB but now reports %g TFLOPS and %lld MiB "
                "(%g TFLOPS and %lld MiB to allocate in pool '%s'); the registration changed nothing: release "
                "its allocations first (tfusion ps lists them) or fix the GPU's report",
                reported.uuid.c_str(), ToTflops(reported.used_milli_tflops),
                static_cast<long long>(reported.used_vram_mib), ToTflops(reported.milli_tflops),
                static_cast<long long>(reported.vram_mib), ToTflops(cap.compute), static_cast<long long>(cap.vram_mib),
                pool.name.c_str());
  return FailedPrecondition(buf);
}
}  // namespace

StatusOr<Node> Controller::RegisterNode(const NodeRegistration& reg_in) {
  StatusOr<Node> out = Durably([&]() -> StatusOr<Node> {
    NodeRegistration reg = reg_in;
    if (reg.pool.empty()) reg.pool = config_.default_pool;
    TF_RETURN_IF_ERROR(ValidateName("node name", reg.name));
    TF_RETURN_IF_ERROR(ValidateName("pool name", reg.pool));
    if (!reg.worker_address.empty()) TF_RETURN_IF_ERROR(ValidateWorkerAddress(reg.worker_address));
    TF_RETURN_IF_ERROR(ValidateText("address", reg.address, 300));
    std::set<std::string> seen;
    for (const GpuReport& g : reg.gpus) {
      TF_RETURN_IF_ERROR(ValidateName("GPU uuid", g.uuid));
      TF_RETURN_IF_ERROR(ValidateText("GPU " + g.uuid + ": model", g.model, 128));
      if (!seen.insert(g.uuid).second) return InvalidArgument("GPU " + g.uuid + " is listed twice");
      // The index is the GPU's number on its node (as nvidia-smi numbers them): runs and the
      // agent find the GPU by it.
      if (g.index < 0 || g.index > 63) return InvalidArgument("GPU " + g.uuid + ": index must be from 0 to 63");
      if (g.numa_node < -1 || g.numa_node > 1023)
        return InvalidArgument("GPU " + g.uuid + ": numa_node must be from 0 to 1023, or -1 (unknown)");
      if (!std::isfinite(g.tflops) || g.tflops < 0 || g.tflops > kMaxRegisteredGpuTflops)
        return InvalidArgument("GPU " + g.uuid + ": tflops must be a number from 0 to 1e6");
      if (g.vram_mib < 0 || g.vram_mib > kMaxGpuVramMib)
        return InvalidArgument("GPU " + g.uuid + ": vram_mib must be from 0 to " + std::to_string(kMaxGpuVramMib));
      if (g.host_tier_budget_mib != -1)
        TF_RETURN_IF_ERROR(ValidateTierBudget("GPU " + g.uuid + ": host_tier_budget_mib", g.host_tier_budget_mib));
    }
    if (reg.disk_tier_budget_mib != -1)
      TF_RETURN_IF_ERROR(ValidateTierBudget("disk_tier_budget_mib", reg.disk_tier_budget_mib));
    std::lock_guard<std::mutex> lock(mu_);
    TF_RETURN_IF_ERROR(CheckServingLocked());
    if (!pools_.count(reg.pool)) return NotFound("pool '" + reg.pool + "' not found");

    const int64_t now = clock_->NowMs();
    std::vector<Compare> compares;
    std::vector<Write> writes;
    std::vector<Gpu> new_gpus;
    std::vector<std::string> removed;
    auto node_it = nodes_.find(reg.name);
    const bool first_registration = node_it == nodes_.end();  // nothing of it is allocated yet
    compares.push_back(node_it != nodes_.end() ? Compare::At(NodeKey(reg.name), node_it->second.revision)
                                               : Compare::Absent(NodeKey(reg.name)));
    Node node{reg.name, reg.pool, reg.address, reg.worker_address, NodeState::kReady, now, 0, ""};
    if (node_it != nodes_.end()) {
      TF_RETURN_IF_ERROR(CheckNodeCredential(node_it->second.value, reg.credential));
      node.credential_sha256 = node_it->second.value.credential_sha256;
      node.cordoned = node_it->second.value.cordoned;  // an agent's restart does not undo a cordon
      node.cordoned_ms = node_it->second.value.cordoned_ms;
    }
    if (node.credential_sha256.empty() && !reg.credential.empty()) node.credential_sha256 = Sha256Hex(reg.credential);
    node.disk_tier_budget_mib = reg.disk_tier_budget_mib;
    writes.push_back(Write::Put(NodeKey(reg.name), Dump(node)));
    for (const GpuReport& r : reg.gpus) {
      Gpu g{r.uuid, reg.name, reg.pool, r.model, r.index, r.numa_node, ToMilliTflops(r.tflops), r.vram_mib, 0, 0, true};
      g.host_tier_budget_mib = r.host_tier_budget_mib;
      auto it = gpus_.find(r.uuid);
      if (it != gpus_.end()) {
        if (it->second.value.node != reg.name)
          return AlreadyExists("GPU " + r.uuid + " is registered to node '" + it->second.value.node + "'");
        g.used_milli_tflops = it->second.value.used_milli_tflops;  // the agent restarted: usage stays
        g.used_vram_mib = it->second.value.used_vram_mib;
        if (g.used_milli_tflops > 0 && g.pool != it->second.value.pool)
          return FailedPrecondition("GPU " + r.uuid + " holds allocations in pool '" +
                                    it->second.value.pool + "'; release them before moving the node");
        TF_RETURN_IF_ERROR(HoldsWhatItsAllocationsNeed(g, pools_.at(reg.pool).value));
        compares.push_back(Compare::At(GpuKey(r.uuid), it->second.revision));
      } else {
        compares.push_back(Compare::Absent(GpuKey(r.uuid)));
      }
      writes.push_back(Write::Put(GpuKey(r.uuid), Dump(g)));
      new_gpus.push_back(g);
    }
    // GPUs the node no longer reports: forget idle ones, keep busy ones unschedulable so their
    // allocations stay accounted until released.
    std::vector<Gpu> kept;
    for (const auto& [uuid, g] : gpus_) {
      if (g.value.node != reg.name || seen.count(uuid)) continue;
      compares.push_back(Compare::At(GpuKey(uuid), g.revision));
      if (g.value.used_milli_tflops <= 0 && g.value.used_vram_mib <= 0) {
        writes.push_back(Write::Delete(GpuKey(uuid)));
        removed.push_back(uuid);
      } else {
        Gpu k = g.value;
        k.schedulable = false;
        writes.push_back(Write::Put(GpuKey(uuid), Dump(k)));
        kept.push_back(k);
      }
    }
    StatusOr<int64_t> rev = CommitLocked(compares, writes);
    if (!rev.ok()) return rev.status();
    if (node_it != nodes_.end() && node_it->second.value.state == NodeState::kLost)
      std::fprintf(stderr, "controller: node %s registered again after %lld ms lost: ready again\n", reg.name.c_str(),
                   static_cast<long long>(now - node_it->second.value.lost_since_ms));
    nodes_[reg.name] = {node, *rev};
    for (const std::string& uuid : removed) gpus_.erase(uuid);
    for (const Gpu& g : new_gpus) gpus_[g.uuid] = {g, *rev};
    for (const Gpu& g : kept) gpus_[g.uuid] = {g, *rev};
    last_heartbeat_ms_[reg.name] = now;
    if (first_registration && !placement_dirty_) {
      std::vector<const Gpu*> gpus;
      for (const Gpu& g : new_gpus) gpus.push_back(&gpus_.at(g.uuid).value);
      if (!placement_->AddNode(node, gpus).ok()) placement_dirty_ = true;
    } else {
      placement_dirty_ = true;  // a known node changed: rebuild the mirror before placing
    }
    return node;
  });
  // Refusals are what the controller decided about this node; a replica that cannot decide (not
  // serving, its store failing, conflicting writers) refuses nothing. Names that fail validation
  // are not logged (nothing to tell the node by).
  const StatusCode code = out.status().code();
  if (!out.ok() && (code == StatusCode::kUnavailable || code == StatusCode::kAborted)) return out;
  if (!ValidateName("node name", reg_in.name).ok()) return out;
  std::lock_guard<std::mutex> lock(mu_);
  if (out.ok()) {
    refused_registrations_.erase(reg_in.name);
    return out;
  }
  // The message may quote what the agent sent: only printable ASCII reaches the log.
  std::string why = out.status().ToString().substr(0, 512);
  for (char& c : why)
    if (c < 0x20 || c > 0x7e) c = '?';
  auto it = refused_registrations_.find(reg_in.name);
  if (it != refused_registrations_.end() && it->second == why) return out;
  if (it == refused_registrations_.end() && refused_registrations_.size() >= kMaxRefusedRegistrations)
    refused_registrations_.erase(refused_registrations_.begin());
  refused_registrations_[reg_in.name] = why;
  std::fprintf(stderr, "controller: registration of node %s refused: %s (logged again only if the reason changes)\n",
               reg_in.name.c_str(), why.c_str());
  return out;
}

Status Controller::Heartbeat(const std::string& name, const std::vector<GpuSample>& samples,
                             const std::vector<VgpuUseSample>& vgpus, const std::string& credential,
                             int64_t disk_tier_budget_mib) {
  return Durably([&]() -> Status {
    std::lock_guard<std::mutex> lock(mu_);
    TF_RETURN_IF_ERROR(CheckServingLocked());
    auto it = nodes_.find(name);
    if (it == nodes_.end()) return NotFound("node '" + name + "' is not registered");
    TF_RETURN_IF_ERROR(CheckNodeCredential(it->second.value, credential));
    const int64_t now = clock_->NowMs();
    for (const GpuSample& s : samples) {  // all checked before anything is stored
      auto g = gpus_.find(s.uuid);
      if (g == gpus_.end() || g->second.value.node != name)
        return InvalidArgument("GPU " + s.uuid + " is not a GPU of node '" + name + "' (register it first)");
      if (!std::isfinite(s.utilization_percent) || s.utilization_percent < 0 || s.utilization_percent > 100)
        return InvalidArgument("GPU " + s.uuid + ": utilization_percent must be a number from 0 to 100");
      if (s.memory_used_mib < 0 || s.memory_used_mib > g->second.value.vram_mib)
        return InvalidArgument("GPU " + s.uuid + ": memory_used_mib must be from 0 to its VRAM (" +
                               std::to_string(g->second.value.vram_mib) + " MiB)");
      if (s.host_tier_budget_mib != -1)
        TF_RETURN_IF_ERROR(ValidateTierBudget("GPU " + s.uuid + ": host_tier_budget_mib", s.host_tier_budget_mib));
      // Above the whole GPU is taken as the whole GPU (UpdateTierBudgetsLocked), not refused: the
      // rest of the node's heartbeat must not be lost over it.
      if (s.unpooled_share_ppm < -1) return InvalidArgument("GPU " + s.uuid + ": unpooled_share_ppm must not be negative");
      if (s.unpooled_vram_mib < -1) return InvalidArgument("GPU " + s.uuid + ": unpooled_vram_mib must not be negative");
    }
    if (disk_tier_budget_mib != -1) TF_RETURN_IF_ERROR(ValidateTierBudget("disk_tier_budget_mib", disk_tier_budget_mib));
    TF_RETURN_IF_ERROR(UpdateTierBudgetsLocked(name, samples, disk_tier_budget_mib));
    last_heartbeat_ms_[name] = now;
    for (const GpuSample& s : samples) {
      samples_[s.uuid] = s;
      sampled_ms_[s.uuid] = now;
    }
    for (const VgpuUseSample& v : vgpus) {
      auto a = allocations_.find(v.allocation);
      if (a == allocations_.end() || a->second.value.node != name) continue;
      VgpuCounters& k = vgpu_use_[v.allocation + "/" + v.gpu_uuid];
      if (k.sampled_ms > 0 && now > k.sampled_ms && v.busy_ns_total >= k.busy_ns) {
        k.use.use_percent = static_cast<double>(v.busy_ns_total - k.busy_ns) / 1e4 / static_cast<double>(now - k.sampled_ms);
      } else {
        k.use.use_percent = -1;  // the first sample, or the counters went back (a new vGPU)
      }
      k.busy_ns = v.busy_ns_total;
      k.sampled_ms = now;
      k.use.throttled_seconds = static_cast<double>(v.throttled_ns_total) / 1e9;
      k.use.turn_seconds = v.held_turn_ns_total >= 0 ? static_cast<double>(v.held_turn_ns_total) / 1e9 : -1;
      k.use.sampled_ms = now;
      k.use.tier_state = v.tier_state;
      k.use.swapped_bytes = v.swapped_bytes;
      k.use.processes = v.processes;
      k.use.applied_idle_swap_ms = v.applied_idle_swap_ms;
      k.use.applied_idle_disk_ms = v.applied_idle_disk_ms;
      k.use.applied_idle_zero_ms = v.applied_idle_zero_ms;
    }
    if (it->second.value.state == NodeState::kReady) return Status::Ok();
    // A lost node came back: it is ready again (allocations released meanwhile stay released).
    Node node = it->second.value;
    node.state = NodeState::kReady;
    node.lost_since_ms = 0;
    std::vector<Compare> compares{Compare::At(NodeKey(name), it->second.revision)};
    std::vector<Write> writes{Write::Put(NodeKey(name), Dump(node))};
    std::vector<Gpu> updated;
    for (const auto& [uuid, g] : gpus_) {
      if (g.value.node != name) continue;
      Gpu u = g.value;
      u.schedulable = true;
      compares.push_back(Compare::At(GpuKey(uuid), g.revision));
      writes.push_back(Write::Put(GpuKey(uuid), Dump(u)));
      updated.push_back(u);
    }
    StatusOr<int64_t> rev = CommitLocked(compares, writes);
    if (!rev.ok()) return rev.status();
    std::fprintf(stderr, "controller: node %s is back after %lld ms lost: ready again\n", name.c_str(),
                 static_cast<long long>(now - it->second.value.lost_since_ms));
    it->second = {node, *rev};
    for (const Gpu& g : updated) gpus_[g.uuid] = {g, *rev};
    placement_dirty_ = true;
    return Status::Ok();
  });
}

Status Controller::UpdateTierBudgetsLocked(const std::string& name, const std::vector<GpuSample>& samples,
                                           int64_t disk_tier_budget_mib) {
  auto it = nodes_.find(name);
  std::vector<Compare> compares;
  std::vector<Write> writes;
  std::optional<Node> node;
  if (disk_tier_budget_mib >= 0 && disk_tier_budget_mib != it->second.value.disk_tier_budget_mib) {
    node = it->second.value;
    node->disk_tier_budget_mib = disk_tier_budget_mib;
    compares.push_back(Compare::At(NodeKey(name), it->second.revision));
    writes.push_back(Write::Put(NodeKey(name), Dump(*node)));
  }
  std::vector<Gpu> gpus;
  for (const GpuSample& s : samples) {
    const Versioned<Gpu>& g = gpus_.at(s.uuid);  // checked by the caller
    Gpu u = g.value;
    if (s.host_tier_budget_mib >= 0) u.host_tier_budget_mib = s.host_tier_budget_mib;
    if (s.unpooled_share_ppm >= 0) {
      // In the GPU's TFLOPS, as allocations count (ppm of its capacity, rounded up).
      const int64_t ppm = std::min<int64_t>(s.unpooled_share_ppm, 1'000'000);
      u.unpooled_milli_tflops = static_cast<MilliTflops>((static_cast<__int128>(ppm) * g.value.milli_tflops + 999'999) / 1'000'000);
    }
    if (s.unpooled_vram_mib >= 0) u.unpooled_vram_mib = std::min(s.unpooled_vram_mib, g.value.vram_mib);
    if (u.host_tier_budget_mib == g.value.host_tier_budget_mib &&
        u.unpooled_milli_tflops == g.value.unpooled_milli_tflops && u.unpooled_vram_mib == g.value.unpooled_vram_mib)
      continue;
    if (u.unpooled_milli_tflops != g.value.unpooled_milli_tflops || u.unpooled_vram_mib != g.value.unpooled_vram_mib) {
      std::fprintf(stderr, "controller: GPU %s of node %s: vGPUs outside the pool now hold %.1f TFLOPS and %lld MiB "
                   "(placement counts them as used)\n", s.uuid.c_str(), name.c_str(), ToTflops(u.unpooled_milli_tflops),
                   static_cast<long long>(u.unpooled_vram_mib));
    }
    compares.push_back(Compare::At(GpuKey(s.uuid), g.revision));
    writes.push_back(Write::Put(GpuKey(s.uuid), Dump(u)));
    gpus.push_back(u);
  }
  if (writes.empty()) return Status::Ok();
  StatusOr<int64_t> rev = CommitLocked(compares, writes);
  if (!rev.ok()) return rev.status();
  if (node) it->second = {*node, *rev};
  for (const Gpu& g : gpus) gpus_[g.uuid] = {g, *rev};
  placement_dirty_ = true;  // the node's schedulable VRAM changed
  return Status::Ok();
}

// The placement engine names a request by the allocation id it was to get: refused, that id was
// never made, and a user would look it up in vain.
namespace {
Status WithoutUnmadeId(const Status& refusal, const std::string& id) {
  std::string m = refusal.message();
  for (const std::string& named : {" (request '" + id + "')", "request '" + id + "'"}) {
    const std::string as = named[0] == ' ' ? "" : "the request";
    for (size_t at; (at = m.find(named)) != std::string::npos;) m.replace(at, named.size(), as);
  }
  return Status(refusal.code(), std::move(m));
}
}  // namespace

Status Controller::WithTierBudgetHintLocked(const Status& refusal, const PlacementRequest& pr) const {
  auto pool = pools_.find(pr.pool);
  if (refusal.code() != StatusCode::kOutOfMemory || pool == pools_.end()) return refusal;
  const Pool& p = pool->second.value;
  if (p.vram_expand_to_host_percent + p.vram_expand_to_disk_percent == 0) return refusal;
  const std::map<std::string, size_t> per_node = GpusPerNodeLocked();
  int64_t largest = 0, largest_unbounded = 0;
  for (const auto& [uuid, g] : gpus_) {
    if (g.value.pool != pr.pool || !g.value.schedulable) continue;
    auto node = nodes_.find(g.value.node);
    if (node == nodes_.end() || node->second.value.state != NodeState::kReady || node->second.value.cordoned) continue;
    largest = std::max(largest, SchedulableVramMib(g.value, &p, &node->second.value, per_node.at(g.value.node)));
    largest_unbounded = std::max(largest_unbounded, SchedulableVramMib(g.value, &p, nullptr, 0));
  }
  if (pr.vram_mib <= largest || pr.vram_mib > largest_unbounded) return refusal;
  return OutOfMemory(refusal.message() + ": a vGPU of " + std::to_string(pr.vram_mib) +
                     " MiB needs more VRAM expansion than any node's tiers can hold (the most a GPU of pool '" +
                     pr.pool + "' offers is " + std::to_string(largest) +
                     " MiB: its VRAM plus the pool's expansion, bounded by its node's host tier budget and "
                     "disk tier; `tfusion node ls` shows them)");
}

std::map<std::string, size_t> Controller::GpusPerNodeLocked() const {
  std::map<std::string, size_t> n;
  for (const auto& [uuid, g] : gpus_) ++n[g.value.node];
  return n;
}

StatusOr<Node> Controller::SetNodeCordoned(const std::string& name, bool cordoned) {
  return Durably([&]() -> StatusOr<Node> {
    TF_RETURN_IF_ERROR(ValidateName("node name", name));
    std::lock_guard<std::mutex> lock(mu_);
    TF_RETURN_IF_ERROR(CheckServingLocked());
    auto it = nodes_.find(name);
    if (it == nodes_.end()) return NotFound("node '" + name + "' is not registered");
    if (it->second.value.cordoned == cordoned) return it->second.value;
    Node node = it->second.value;
    node.cordoned = cordoned;
    node.cordoned_ms = cordoned ? clock_->NowMs() : 0;
    StatusOr<int64_t> rev = CommitLocked({Compare::At(NodeKey(name), it->second.revision)},
                                         {Write::Put(NodeKey(name), Dump(node))});
    if (!rev.ok()) return rev.status();
    it->second = {node, *rev};
    placement_dirty_ = true;  // the mirror takes the node out of (or back into) placement
    // Suspended allocations wait for their GPUs to have room, and a cordoned node never has.
    if (!cordoned) ResumeSuspendedLocked(name);
    std::fprintf(stderr, "controller: node %s %s\n", name.c_str(),
                 cordoned ? "cordoned: it takes no new allocations" : "uncordoned: it takes allocations again");
    return node;
  });
}

Status Controller::DeregisterNode(const std::string& name) {
  return Durably([&]() -> Status {
    TF_RETURN_IF_ERROR(ValidateName("node name", name));
    std::lock_guard<std::mutex> lock(mu_);
    TF_RETURN_IF_ERROR(CheckServingLocked());
    auto it = nodes_.find(name);
    if (it == nodes_.end()) return NotFound("node '" + name + "' is not registered");
    auto held = allocations_by_node_.find(name);
    if (held != allocations_by_node_.end() && !held->second.empty()) {
      return FailedPrecondition("node '" + name + "' still holds " + std::to_string(held->second.size()) +
                                " allocation(s): release them first");
    }
    std::vector<Compare> compares{Compare::At(NodeKey(name), it->second.revision)};
    std::vector<Write> writes{Write::Delete(NodeKey(name))};
    std::vector<std::string> gone;
    for (const auto& [uuid, g] : gpus_) {
      if (g.value.node != name) continue;
      compares.push_back(Compare::At(GpuKey(uuid), g.revision));
      writes.push_back(Write::Delete(GpuKey(uuid)));
      gone.push_back(uuid);
    }
    StatusOr<int64_t> rev = CommitLocked(compares, writes);
    if (!rev.ok()) return rev.status();
    for (const std::string& uuid : gone) {
      gpus_.erase(uuid);
      samples_.erase(uuid);
      sampled_ms_.erase(uuid);
    }
    nodes_.erase(it);
    last_heartbeat_ms_.erase(name);
    placement_dirty_ = true;
    return Status::Ok();
  });
}

double Controller::MaxGpuTflopsLocked() const {
  double m = CatalogMaxTflops();
  for (const auto& [uuid, g] : gpus_) m = std::max(m, ToTflops(g.value.milli_tflops));
  return m;
}

StatusOr<VgpuUse> Controller::GetVgpuUse(const std::string& allocation, const std::string& gpu_uuid) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = vgpu_use_.find(allocation + "/" + gpu_uuid);
  if (it == vgpu_use_.end()) {
    return NotFound("no use reported for " + allocation + " on " + gpu_uuid);
  }
  return it->second.use;
}

std::vector<NodeStatus> Controller::ListNodes() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<NodeStatus> out;
  for (const auto& [name, n] : nodes_) {
    auto hb = last_heartbeat_ms_.find(name);
    out.push_back({n.value, hb == last_heartbeat_ms_.end() ? 0 : hb->second, AllocationsOnNodeLocked(name)});
  }
  return out;
}

size_t Controller::AllocationsOnNodeLocked(const std::string& node) const {
  auto held = allocations_by_node_.find(node);
  return held == allocations_by_node_.end() ? 0 : held->second.size();
}

StatusOr<NodeStatus> Controller::GetNode(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return NotFound("node '" + name + "' not found");
  auto hb = last_heartbeat_ms_.find(name);
  return NodeStatus{it->second.value, hb == last_heartbeat_ms_.end() ? 0 : hb->second, AllocationsOnNodeLocked(name)};
}

std::vector<GpuStatus> Controller::ListGpus(const std::string& pool_filter) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<GpuStatus> out;
  const std::map<std::string, size_t> per_node = GpusPerNodeLocked();
  for (const auto& [uuid, g] : gpus_) {
    if (!pool_filter.empty() && g.value.pool != pool_filter) continue;
    GpuStatus s{g.value, 0, 0, 0};
    auto pool = pools_.find(g.value.pool);
    auto node = nodes_.find(g.value.node);
    s.schedulable_vram_mib =
        SchedulableVramMib(g.value, pool == pools_.end() ? nullptr : &pool->second.value,
                           node == nodes_.end() ? nullptr : &node->second.value, per_node.at(g.value.node));
    if (auto it = samples_.find(uuid); it != samples_.end()) {
      s.utilization_percent = it->second.utilization_percent;
      s.memory_used_mib = it->second.memory_used_mib;
      s.sampled_ms = sampled_ms_.at(uuid);
    }
    out.push_back(std::move(s));
  }
  return out;
}

namespace {
// How ValidateIdleZero names the swap timeout it compares with.
std::string IdleSwapWhat(const std::optional<int64_t>& override_ms, Qos qos) {
  return override_ms ? std::string("idle_swap_ms") : std::string("the ") + QosName(qos) + " QoS's idle swap timeout";
}
}  // namespace

// ---- workloads ----

StatusOr<Workload> Controller::CreateWorkload(const Workload& w_in) {
  return Durably([&]() -> StatusOr<Workload> {
    Workload w = w_in;
    if (w.pool.empty()) w.pool = config_.default_pool;
    TF_RETURN_IF_ERROR(ValidateName("workload name", w.name));
    TF_RETURN_IF_ERROR(ValidateName("pool name", w.pool));
    TF_RETURN_IF_ERROR(ValidateResources(ToTflops(w.milli_tflops), w.vram_mib, w.gpu_count, 0,
                                         ToTflops(w.milli_tflops_limit)));
    if (w.milli_tflops_limit <= 0) w.milli_tflops_limit = w.milli_tflops;
    if (w.idle_swap_ms) TF_RETURN_IF_ERROR(ValidateTierIdle("idle_swap_ms", *w.idle_swap_ms));
    if (w.idle_disk_ms) TF_RETURN_IF_ERROR(ValidateTierIdle("idle_disk_ms", *w.idle_disk_ms));
    if (w.idle_zero_ms) {
      TF_RETURN_IF_ERROR(ValidateTierIdle("idle_zero_ms", *w.idle_zero_ms));
      TF_RETURN_IF_ERROR(ValidateIdleZero("idle_zero_ms", *w.idle_zero_ms, IdleSwapWhat(w.idle_swap_ms, w.qos),
                                          EffectiveIdleSwapMs(w.idle_swap_ms, w.qos)));
    }
    std::lock_guard<std::mutex> lock(mu_);
    TF_RETURN_IF_ERROR(CheckServingLocked());
    const double bound = MaxGpuTflopsLocked();
    TF_RETURN_IF_ERROR(CheckTflopsBound("tflops", ToTflops(w.milli_tflops), bound));
    TF_RETURN_IF_ERROR(CheckTflopsBound("tflops_limit", ToTflops(w.milli_tflops_limit), bound));
    if (!pools_.count(w.pool)) return NotFound("pool '" + w.pool + "' not found");
    if (workloads_.count(w.name)) return AlreadyExists("workload '" + w.name + "' already exists");
    StatusOr<int64_t> rev = CommitLocked({Compare::Absent(WorkloadKey(w.name))},
                                         {Write::Put(WorkloadKey(w.name), Dump(w))});
    if (!rev.ok()) return rev.status();
    workloads_[w.name] = {w, *rev};
    return w;
  });
}

std::vector<Workload> Controller::ListWorkloads() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Workload> out;
  for (const auto& [n, w] : workloads_) out.push_back(w.value);
  return out;
}

StatusOr<Workload> Controller::GetWorkload(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workloads_.find(name);
  if (it == workloads_.end()) return NotFound("workload '" + name + "' not found");
  return it->second.value;
}

Status Controller::DeleteWorkload(const std::string& name) {
  return Durably([&]() -> Status {
    std::lock_guard<std::mutex> lock(mu_);
    TF_RETURN_IF_ERROR(CheckServingLocked());
    auto it = workloads_.find(name);
    if (it == workloads_.end()) return NotFound("workload '" + name + "' not found");
    StatusOr<int64_t> rev = CommitLocked({Compare::At(WorkloadKey(name), it->second.revision)},
                                         {Write::Delete(WorkloadKey(name))});
    if (!rev.ok()) return rev.status();
    workloads_.erase(it);
    return Status::Ok();
  });
}

// ---- allocations ----

StatusOr<Allocation> Controller::Allocate(const AllocationRequest& req,
                                          std::vector<Allocation>* preempted, bool* replayed) {
  if (replayed) *replayed = false;
  if (!req.request_id.empty()) TF_RETURN_IF_ERROR(ValidateName("request_id", req.request_id));
  if (req.lease_ms != 0 && (req.lease_ms < 5'000 || req.lease_ms > 3'600'000))
    return InvalidArgument("lease_s must be from 5 to 3600 (seconds)");
  if (req.idle_swap_ms) TF_RETURN_IF_ERROR(ValidateTierIdle("idle_swap_ms", *req.idle_swap_ms));
  if (req.idle_disk_ms) TF_RETURN_IF_ERROR(ValidateTierIdle("idle_disk_ms", *req.idle_disk_ms));
  if (req.idle_zero_ms) TF_RETURN_IF_ERROR(ValidateTierIdle("idle_zero_ms", *req.idle_zero_ms));
  return Durably([&]() -> StatusOr<Allocation> {
    TimedLock lock(mu_, stage_times_);
    TF_RETURN_IF_ERROR(CheckServingLocked());
    if (auto known = allocation_by_request_.find(req.request_id);
        !req.request_id.empty() && known != allocation_by_request_.end()) {
      const Allocation& a = allocations_.at(known->second).value;
      if (a.tenant != req.tenant)
        return FailedPrecondition("request_id '" + req.request_id + "' is already used by another tenant");
      if (replayed) *replayed = true;
      return a;  // the retry of a request whose answer was lost
    }
    PlacementRequest pr;
    pr.pool = req.pool;
    pr.tenant = req.tenant;
    pr.tflops = req.tflops;
    pr.percent = req.percent;
    pr.vram_mib = req.vram_mib;
    pr.gpu_count = req.gpu_count;
    pr.gpu_model = req.gpu_model;
    pr.tflops_limit = req.tflops_limit;
    pr.percent_limit = req.percent_limit;
    pr.node = req.node;
    std::string qos = req.qos;
    std::optional<int64_t> idle_swap_ms = req.idle_swap_ms, idle_disk_ms = req.idle_disk_ms,
                           idle_zero_ms = req.idle_zero_ms;
    if (!req.workload.empty()) {
      TF_RETURN_IF_ERROR(ValidateName("workload name", req.workload));
      auto w = workloads_.find(req.workload);
      if (w == workloads_.end()) return NotFound("workload '" + req.workload + "' not found");
      const Workload& wl = w->second.value;
      if (pr.pool.empty()) pr.pool = wl.pool;
      if (pr.tflops == 0 && pr.percent == 0) {
        pr.tflops = ToTflops(wl.milli_tflops);  // converts back to exactly wl.milli_tflops
        if (pr.tflops_limit == 0 && pr.percent_limit == 0) pr.tflops_limit = ToTflops(wl.milli_tflops_limit);
      }
      if (pr.vram_mib == 0) pr.vram_mib = wl.vram_mib;
      if (pr.gpu_count == 0) pr.gpu_count = wl.gpu_count;
      if (qos.empty()) qos = QosName(wl.qos);
      if (!idle_swap_ms) idle_swap_ms = wl.idle_swap_ms;
      if (!idle_disk_ms) idle_disk_ms = wl.idle_disk_ms;
      if (!idle_zero_ms) idle_zero_ms = wl.idle_zero_ms;
    }
    if (pr.pool.empty()) pr.pool = config_.default_pool;
    if (pr.gpu_count == 0) pr.gpu_count = 1;
    if (!qos.empty()) {
      StatusOr<Qos> q = ParseQos(qos);
      if (!q.ok()) return q.status();
      pr.qos = *q;
    }
    // QoS decides who preempts whom: a tenant's quota may cap it, so that no tenant takes other
    // tenants' running work by asking for a higher QoS than the operator gave it. The default QoS
    // (none asked for, nor by the workload) is lowered to the cap; one asked for above it is refused.
    if (auto quota = quotas_.find(pr.tenant); !pr.tenant.empty() && quota != quotas_.end() &&
                                               !quota->second.value.max_qos.empty()) {
      StatusOr<Qos> cap = ParseQos(quota->second.value.max_qos);
      if (cap.ok() && static_cast<int>(pr.qos) > static_cast<int>(*cap)) {
        if (!qos.empty())
          return PermissionDenied("tenant '" + pr.tenant + "' may ask for QoS up to '" + QosName(*cap) +
                                  "' (its quota's max_qos), not '" + QosName(pr.qos) + "'");
        pr.qos = *cap;
      }
    }
    TF_RETURN_IF_ERROR(ValidateName("pool name", pr.pool));
    if (!pr.tenant.empty()) TF_RETURN_IF_ERROR(ValidateName("tenant", pr.tenant));
    if (idle_zero_ms) {
      TF_RETURN_IF_ERROR(ValidateIdleZero("idle_zero_ms", *idle_zero_ms, IdleSwapWhat(idle_swap_ms, pr.qos),
                                          EffectiveIdleSwapMs(idle_swap_ms, pr.qos)));
    }
    TF_RETURN_IF_ERROR(ValidateResources(pr.tflops, pr.vram_mib, pr.gpu_count, pr.percent, pr.tflops_limit,
                                         pr.percent_limit));
    const double bound = MaxGpuTflopsLocked();
    TF_RETURN_IF_ERROR(CheckTflopsBound("tflops", pr.tflops, bound));
    TF_RETURN_IF_ERROR(CheckTflopsBound("tflops_limit", pr.tflops_limit, bound));
    if (!pools_.count(pr.pool)) return NotFound("pool '" + pr.pool + "' not found");
    if (!pr.node.empty()) {
      TF_RETURN_IF_ERROR(ValidateName("node", pr.node));
      auto n = nodes_.find(pr.node);
      if (n == nodes_.end()) return NotFound("node '" + pr.node + "' not found");
      if (n->second.value.pool != pr.pool)
        return InvalidArgument("node '" + pr.node + "' is in pool '" + n->second.value.pool + "', not in '" + pr.pool + "'");
    }

    if (auto pool = pools_.find(pr.pool); pool != pools_.end()) {
      pr.tiering = pool->second.value.vram_expand_to_host_percent + pool->second.value.vram_expand_to_disk_percent > 0;
    }

    Status last;
    for (int attempt = 0; attempt < kMaxCommitAttempts; ++attempt) {
      EnsurePlacementLocked();
      pr.id = NewAllocationIdLocked();
      StatusOr<PlacementDecision> d = placement_->Place(pr, req.allow_preemption);
      if (!d.ok()) {
        ++counters_.placements[{pr.pool, PlacementResultOf(d.status())}];
        return WithTierBudgetHintLocked(WithoutUnmadeId(d.status(), pr.id), pr);
      }
      Allocation a{pr.id, req.workload, pr.pool, d->node, pr.qos, {}, clock_->NowMs(), pr.tenant, req.request_id};
      a.tiering = pr.tiering;
      a.idle_swap_ms = idle_swap_ms;
      a.idle_disk_ms = idle_disk_ms;
      a.idle_zero_ms = idle_zero_ms;
      a.lease_ms = req.lease_ms;
      a.lease_expires_ms = req.lease_ms > 0 ? clock_->NowMs() + req.lease_ms : 0;
      std::vector<Compare> compares{Compare::Absent(AllocationKey(a.id))};
      std::vector<Write> writes;
      std::map<std::string, Gpu> touched;  // new usage of every GPU the commit changes
      auto gpu = [&](const std::string& uuid) -> Gpu& {
        auto it = touched.find(uuid);
        return it != touched.end() ? it->second : touched.emplace(uuid, gpus_.at(uuid).value).first->second;
      };
      std::vector<std::string> victims;
      std::vector<Eviction> evicted;
      std::vector<Allocation> suspended;  // victims with tiering: kept, swapped out, not counted
      for (const std::string& id : d->victims) {
        auto v = allocations_.find(id);
        if (v == allocations_.end()) continue;  // the engine only names live allocations
        compares.push_back(Compare::At(AllocationKey(id), v->second.revision));
        if (std::find(d->suspended.begin(), d->suspended.end(), id) != d->suspended.end()) {
          Allocation held = v->second.value;
          held.suspended = true;
          held.suspended_by = a.id;
          held.suspended_ms = a.created_ms;
          writes.push_back(Write::Put(AllocationKey(id), Dump(held)));
          for (const Vgpu& vg : held.vgpus) {
            if (!gpus_.count(vg.gpu_uuid)) continue;
            Gpu& g = gpu(vg.gpu_uuid);
            g.used_milli_tflops -= vg.milli_tflops;
            g.used_vram_mib = std::max<int64_t>(0, g.used_vram_mib - vg.vram_mib);
          }
          suspended.push_back(std::move(held));
          victims.push_back(id);
          continue;
        }
        writes.push_back(Write::Delete(AllocationKey(id)));
        Eviction e{v->second.value, "preempted", a.id, a.created_ms, EvictionState::kStopping, 0, 0};
        writes.push_back(Write::Put(EvictionKey(id), Dump(e)));
        evicted.push_back(std::move(e));
        for (const Vgpu& vg : v->second.value.vgpus) {
          if (!gpus_.count(vg.gpu_uuid)) continue;
          Gpu& g = gpu(vg.gpu_uuid);
          g.used_milli_tflops -= vg.milli_tflops;  // exact: it was added as the same integer
          g.used_vram_mib = std::max<int64_t>(0, g.used_vram_mib - vg.vram_mib);
        }
        victims.push_back(id);
      }
      for (const std::string& uuid : d->gpu_uuids) {
        StatusOr<Vgpu> v = VgpuOn(gpus_.at(uuid).value, pr, d->milli_tflops_per_gpu);
        if (!v.ok()) {
          ++counters_.placements[{pr.pool, PlacementResultOf(v.status())}];
          return v.status();  // nothing staged yet: the refusal changes nothing
        }
        Gpu& g = gpu(uuid);
        g.used_milli_tflops += d->milli_tflops_per_gpu;
        g.used_vram_mib += pr.vram_mib;
        a.vgpus.push_back(std::move(*v));
      }
      std::vector<std::string> uuids;
      for (const auto& [uuid, g] : touched) {
        compares.push_back(Compare::At(GpuKey(uuid), gpus_.at(uuid).revision));
        writes.push_back(Write::Put(GpuKey(uuid), Dump(g)));
        uuids.push_back(uuid);
      }
      writes.push_back(Write::Put(AllocationKey(a.id), Dump(a)));
      StatusOr<int64_t> rev = CommitLocked(compares, writes);
      if (rev.ok()) {
        for (auto& [uuid, u] : touched) gpus_.at(uuid) = {std::move(u), *rev};
        Status mirrored = placement_->Commit(pr, *d);  // also releases the victims there
        if (!mirrored.ok()) {
          std::fprintf(stderr, "controller: placement mirror of %s: %s (rebuilding it)\n", a.id.c_str(),
                       mirrored.ToString().c_str());
          placement_dirty_ = true;
        }
        for (Allocation& held : suspended) {
          std::fprintf(stderr, "controller: allocation %s (%s, node %s) suspended by %s (%s): its VRAM is swapped "
                       "out until its GPUs have room again\n", held.id.c_str(), QosName(held.qos), held.node.c_str(),
                       a.id.c_str(), QosName(a.qos));
          suspended_.insert(held.id);
          ++counters_.allocations_suspended;
          const std::string id = held.id;
          allocations_[id] = {std::move(held), *rev};
        }
        for (const std::string& id : victims) {
          auto v = allocations_.find(id);
          if (preempted) preempted->push_back(v->second.value);
          if (v->second.value.suspended) continue;
          EraseAllocationLocked(v);
          ++counters_.allocations_preempted;
        }
        for (Eviction& e : evicted) {
          std::fprintf(stderr, "controller: allocation %s (%s, node %s) preempted by %s (%s)\n",
                       e.allocation.id.c_str(), QosName(e.allocation.qos), e.allocation.node.c_str(),
                       a.id.c_str(), QosName(a.qos));
          const std::string id = e.allocation.id;  // read before e is moved from
          evictions_[id] = {std::move(e), *rev};
        }
        allocations_[a.id] = {a, *rev};
        allocations_by_node_[a.node].insert(a.id);
        if (!a.request_id.empty()) allocation_by_request_[a.request_id] = a.id;
        ++counters_.placements[{pr.pool, victims.empty() ? PlacementResult::kPlaced
                                                         : PlacementResult::kPlacedPreempting}];
        return a;
      }
      last = rev.status();
      if (last.code() != StatusCode::kAborted) return last;
      if (election_ && !election_->IsLeader())
        return Unavailable("this controller replica lost leadership");
      // Another writer changed one of the GPUs or victims: read them again and place again.
      TF_RETURN_IF_ERROR(ReloadGpusLocked(uuids));
      for (const std::string& id : victims) {
        StatusOr<std::optional<KeyValue>> kv = store_->Get(AllocationKey(id));
        if (!kv.ok()) return kv.status();
        auto v = allocations_.find(id);
        if (v == allocations_.end()) continue;
        if (!kv->has_value()) {
          EraseAllocationLocked(v);
        } else if (StatusOr<Allocation> now = AllocationFromJson((*kv)->value); now.ok()) {
          v->second = {*now, (*kv)->mod_revision};  // e.g. another replica suspended it
          if (now->suspended) suspended_.insert(id);
          else suspended_.erase(id);
        }
      }
      placement_dirty_ = true;
    }
    return Status(StatusCode::kAborted, "allocation kept conflicting with concurrent writers: " + last.message());
  });
}

StatusOr<Allocation> Controller::UpdateAllocation(const std::string& id,
                                                  const std::function<Status(Allocation&)>& change) {
  return Durably([&]() -> StatusOr<Allocation> {
    std::lock_guard<std::mutex> lock(mu_);
    TF_RETURN_IF_ERROR(CheckServingLocked());
    auto it = allocations_.find(id);
    if (it == allocations_.end()) return NotFound("allocation '" + id + "' not found");
    Allocation a = it->second.value;
    TF_RETURN_IF_ERROR(change(a));
    StatusOr<int64_t> rev = CommitLocked({Compare::At(AllocationKey(id), it->second.revision)},
                                         {Write::Put(AllocationKey(id), Dump(a))});
    if (!rev.ok()) return rev.status();
    it->second = {a, *rev};
    return a;
  });
}

StatusOr<Allocation> Controller::RenewLease(const std::string& id) {
  const int64_t now = clock_->NowMs();
  return UpdateAllocation(id, [&](Allocation& a) {
    if (a.lease_ms <= 0) return FailedPrecondition("allocation '" + id + "' has no lease");
    a.lease_expires_ms = now + a.lease_ms;
    return Status::Ok();
  });
}

StatusOr<Allocation> Controller::RequestTier(const std::string& id, bool freeze, bool zero) {
  return UpdateAllocation(id, [&](Allocation& a) {
    if (!a.tiering) {
      return FailedPrecondition("allocation '" + id + "' has no VRAM tiering (its pool does not oversell VRAM: "
                                "tfusion pool set POOL --vram-expand-host P)");
    }
    if (!freeze && a.suspended) {
      return FailedPrecondition("allocation '" + id + "' is suspended (preempted by " + a.suspended_by +
                                "): it is thawed when the controller resumes it");
    }
    (freeze ? a.freeze_requests : a.thaw_requests) += 1;
    if (freeze && zero) a.zero_requests += 1;
    return Status::Ok();
  });
}

StatusOr<Allocation> Controller::SetTierIdle(const std::string& id, const TierIdleChange& change) {
  if (change.idle_swap_ms && *change.idle_swap_ms)
    TF_RETURN_IF_ERROR(ValidateTierIdle("idle_swap_ms", **change.idle_swap_ms));
  if (change.idle_disk_ms && *change.idle_disk_ms)
    TF_RETURN_IF_ERROR(ValidateTierIdle("idle_disk_ms", **change.idle_disk_ms));
  if (change.idle_zero_ms && *change.idle_zero_ms)
    TF_RETURN_IF_ERROR(ValidateTierIdle("idle_zero_ms", **change.idle_zero_ms));
  if (!change.idle_swap_ms && !change.idle_disk_ms && !change.idle_zero_ms)
    return InvalidArgument("nothing to change: give idle_swap_ms, idle_disk_ms or idle_zero_ms (null: back to the "
                           "QoS default)");
  return UpdateAllocation(id, [&](Allocation& a) {
    if (!a.tiering) {
      return FailedPrecondition("allocation '" + id + "' has no VRAM tiering (its pool does not oversell VRAM: "
                                "tfusion pool set POOL --vram-expand-host P), so it has no idle timeouts to change");
    }
    if (change.idle_swap_ms) a.idle_swap_ms = *change.idle_swap_ms;
    if (change.idle_disk_ms) a.idle_disk_ms = *change.idle_disk_ms;
    if (change.idle_zero_ms) a.idle_zero_ms = *change.idle_zero_ms;
    // The pair as it will be: a new swap timeout may no longer fit the zero timeout kept.
    if (a.idle_zero_ms) {
      TF_RETURN_IF_ERROR(ValidateIdleZero("idle_zero_ms", *a.idle_zero_ms, IdleSwapWhat(a.idle_swap_ms, a.qos),
                                          EffectiveIdleSwapMs(a.idle_swap_ms, a.qos)));
    }
    return Status::Ok();
  });
}

Status Controller::Release(const std::string& id) {
  return Durably([&]() -> Status {
    TimedLock lock(mu_, stage_times_);
    TF_RETURN_IF_ERROR(CheckServingLocked());
    auto it = allocations_.find(id);
    const std::string node = it == allocations_.end() ? "" : it->second.value.node;
    TF_RETURN_IF_ERROR(ReleaseLocked(id, nullptr));
    ResumeSuspendedLocked(node);  // room came back on that node's GPUs
    return Status::Ok();
  });
}

Status Controller::ReleaseLocked(const std::string& id, const char* eviction_reason) {
  const std::string reason = eviction_reason == nullptr ? "" : eviction_reason;
  uint64_t& released = reason == "node-lost"       ? counters_.allocations_released_lost_node
                       : reason == "lease-expired" ? counters_.allocations_lease_expired
                                                   : counters_.allocations_released;
  Status last;
  for (int attempt = 0; attempt < kMaxCommitAttempts; ++attempt) {
    auto it = allocations_.find(id);
    if (it == allocations_.end()) return NotFound("allocation '" + id + "' not found");
    const Allocation& a = it->second.value;
    std::vector<Compare> compares{Compare::At(AllocationKey(id), it->second.revision)};
    std::vector<Write> writes{Write::Delete(AllocationKey(id))};
    std::optional<Eviction> evicted;
    if (eviction_reason != nullptr) {
      evicted = Eviction{a, eviction_reason, "", clock_->NowMs(), EvictionState::kStopping, 0, 0};
      writes.push_back(Write::Put(EvictionKey(id), Dump(*evicted)));
    }
    std::vector<Gpu> updated;
    std::vector<std::string> uuids;
    for (const Vgpu& v : a.vgpus) {
      auto g = gpus_.find(v.gpu_uuid);
      if (g == gpus_.end() || a.suspended) continue;  // a suspended one is counted nowhere
      Gpu u = g->second.value;
      u.used_milli_tflops -= v.milli_tflops;  // exact: it was added as the same integer
      u.used_vram_mib = std::max<int64_t>(0, u.used_vram_mib - v.vram_mib);
      compares.push_back(Compare::At(GpuKey(u.uuid), g->second.revision));
      writes.push_back(Write::Put(GpuKey(u.uuid), Dump(u)));
      uuids.push_back(u.uuid);
      updated.push_back(std::move(u));
    }
    StatusOr<int64_t> rev = CommitLocked(compares, writes);
    if (rev.ok()) {
      for (Gpu& u : updated) {
        Versioned<Gpu>& g = gpus_.at(u.uuid);
        g.value = std::move(u);
        g.revision = *rev;
      }
      placement_->Release(it->second.value);
      EraseAllocationLocked(it);
      if (evicted) evictions_[id] = {std::move(*evicted), *rev};
      ++released;
      return Status::Ok();
    }
    last = rev.status();
    if (last.code() != StatusCode::kAborted) return last;
    if (election_ && !election_->IsLeader())
      return Unavailable("this controller replica lost leadership");
    TF_RETURN_IF_ERROR(ReloadGpusLocked(uuids));
  }
  return Status(StatusCode::kAborted, "release kept conflicting with concurrent writers: " + last.message());
}

std::vector<Allocation> Controller::ListAllocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Allocation> out;
  out.reserve(allocations_.size());
  for (const auto& [id, a] : allocations_) out.push_back(a.value);
  return out;
}

std::vector<Allocation> Controller::ListAllocationsOnNode(const std::string& node) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Allocation> out;
  auto ids = allocations_by_node_.find(node);
  if (ids == allocations_by_node_.end()) return out;
  for (const std::string& id : ids->second) out.push_back(allocations_.at(id).value);
  return out;
}

void Controller::EraseAllocationLocked(std::map<std::string, Versioned<Allocation>>::iterator it) {
  const Allocation& a = it->second.value;
  auto ids = allocations_by_node_.find(a.node);
  if (ids != allocations_by_node_.end()) {
    ids->second.erase(it->first);
    if (ids->second.empty()) allocations_by_node_.erase(ids);
  }
  if (!a.request_id.empty()) allocation_by_request_.erase(a.request_id);
  for (const Vgpu& v : a.vgpus) vgpu_use_.erase(a.id + "/" + v.gpu_uuid);
  suspended_.erase(a.id);
  allocations_.erase(it);
}

void Controller::ResumeSuspendedLocked(const std::string& node) {
  auto on = allocations_by_node_.find(node);
  if (on == allocations_by_node_.end()) return;
  // Highest QoS first, then the longest suspended.
  std::vector<std::string> waiting;
  for (const std::string& id : on->second)
    if (suspended_.count(id)) waiting.push_back(id);
  std::sort(waiting.begin(), waiting.end(), [this](const std::string& x, const std::string& y) {
    const Allocation& a = allocations_.at(x).value;
    const Allocation& b = allocations_.at(y).value;
    if (a.qos != b.qos) return a.qos > b.qos;
    if (a.suspended_ms != b.suspended_ms) return a.suspended_ms < b.suspended_ms;
    return a.id < b.id;
  });
  for (const std::string& id : waiting) {
    EnsurePlacementLocked();
    Versioned<Allocation>& held = allocations_.at(id);
    if (!placement_->Resume(held.value).ok()) continue;  // its GPUs still lack the room
    Allocation a = held.value;
    const std::string by = a.suspended_by;
    a.suspended = false;
    a.suspended_by.clear();
    a.suspended_ms = 0;
    std::vector<Compare> compares{Compare::At(AllocationKey(id), held.revision)};
    std::vector<Write> writes{Write::Put(AllocationKey(id), Dump(a))};
    std::vector<Gpu> updated;
    for (const Vgpu& v : a.vgpus) {
      auto g = gpus_.find(v.gpu_uuid);
      if (g == gpus_.end()) continue;
      Gpu u = g->second.value;
      u.used_milli_tflops += v.milli_tflops;
      u.used_vram_mib += v.vram_mib;
      compares.push_back(Compare::At(GpuKey(u.uuid), g->second.revision));
      writes.push_back(Write::Put(GpuKey(u.uuid), Dump(u)));
      updated.push_back(std::move(u));
    }
    StatusOr<int64_t> rev = CommitLocked(compares, writes);
    if (!rev.ok()) {
      placement_->Suspend(held.value);
      placement_dirty_ = true;  // another writer: the next tick tries again from fresh state
      std::fprintf(stderr, "controller: resuming %s failed: %s\n", id.c_str(), rev.status().ToString().c_str());
      continue;
    }
    for (Gpu& u : updated) {
      Versioned<Gpu>& g = gpus_.at(u.uuid);
      g = {std::move(u), *rev};
    }
    held = {std::move(a), *rev};
    suspended_.erase(id);
    ++counters_.allocations_resumed;
    std::fprintf(stderr, "controller: allocation %s (node %s) resumed: its GPUs have room again (it was suspended "
                 "by %s)\n", id.c_str(), node.c_str(), by.c_str());
  }
}

StatusOr<Allocation> Controller::GetAllocation(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocations_.find(id);
  if (it == allocations_.end()) return NotFound("allocation '" + id + "' not found");
  return it->second.value;
}

// ---- liveness ----

void Controller::Tick() {
  (void)Durably([&]() -> Status {
    std::lock_guard<std::mutex> lock(mu_);
    if (!CheckServingLocked().ok()) return Status::Ok();
    const int64_t now = clock_->NowMs();
    std::vector<std::string> expired;
    for (auto& [name, n] : nodes_) {
      if (n.value.state == NodeState::kReady) {
        if (now - last_heartbeat_ms_[name] <= config_.heartbeat_timeout_ms) continue;
        Node node = n.value;
        node.state = NodeState::kLost;
        node.lost_since_ms = now;
        std::vector<Compare> compares{Compare::At(NodeKey(name), n.revision)};
        std::vector<Write> writes{Write::Put(NodeKey(name), Dump(node))};
        std::vector<Gpu> updated;
        for (const auto& [uuid, g] : gpus_) {
          if (g.value.node != name) continue;
          Gpu u = g.value;
          u.schedulable = false;
          compares.push_back(Compare::At(GpuKey(uuid), g.revision));
          writes.push_back(Write::Put(GpuKey(uuid), Dump(u)));
          updated.push_back(u);
        }
        StatusOr<int64_t> rev = CommitLocked(compares, writes);
        if (!rev.ok()) {
          std::fprintf(stderr, "controller: marking node %s lost failed: %s\n", name.c_str(),
                       rev.status().ToString().c_str());
          continue;
        }
        n = {node, *rev};
        for (Gpu& u : updated) {
          Versioned<Gpu>& g = gpus_.at(u.uuid);
          g.value = std::move(u);
          g.revision = *rev;
        }
        ++counters_.nodes_marked_lost;
        placement_dirty_ = true;
        std::fprintf(stderr, "controller: node %s missed heartbeats for %lld ms: marked lost\n",
                     name.c_str(), static_cast<long long>(now - last_heartbeat_ms_[name]));
      } else if (now - n.value.lost_since_ms >= config_.lost_grace_ms) {
        expired.push_back(name);
      }
    }
    for (const std::string& name : expired) {
      std::vector<std::string> ids;
      if (auto on = allocations_by_node_.find(name); on != allocations_by_node_.end())
        ids.assign(on->second.begin(), on->second.end());
      std::string released;
      size_t count = 0;
      for (const std::string& id : ids) {
        Status st = ReleaseLocked(id, "node-lost");
        if (!st.ok())
          std::fprintf(stderr, "controller: releasing %s of lost node %s failed: %s\n", id.c_str(),
                       name.c_str(), st.ToString().c_str());
        else if (count++ < 20) released += (count > 1 ? ", " : "") + id;
      }
      if (count > 20) released += " and " + std::to_string(count - 20) + " more";
      if (count > 0)
        std::fprintf(stderr, "controller: node %s lost for %lld ms: released its %zu allocation(s) as node-lost: %s\n",
                     name.c_str(), static_cast<long long>(now - nodes_.at(name).value.lost_since_ms), count,
                     released.c_str());
    }
    // Allocations whose lease ran out: the command that held them is gone (killed, its machine lost).
    // A holder renews against a serving controller: while this replica did not serve (before it
    // started, in an election, while its store failed) its renewals failed, so a lease runs out
    // that much later (a replica that starts gives every lease a whole one, as a node gets a fresh
    // heartbeat timeout). Only the time not served since the lease was last renewed counts: a store
    // that fails now and then delays a lease by its failures, not by a whole lease each time.
    std::vector<std::string> lapsed;
    for (const auto& [id, a] : allocations_) {
      const int64_t expires = a.value.lease_expires_ms;
      if (expires > 0 && now > expires &&
          now > expires + UnservedMsLocked(expires - a.value.lease_ms, now))
        lapsed.push_back(id);
    }
    for (const std::string& id : lapsed) {
      Status st = ReleaseLocked(id, "lease-expired");
      if (!st.ok()) std::fprintf(stderr, "controller: releasing %s (lease expired) failed: %s\n", id.c_str(), st.ToString().c_str());
      else std::fprintf(stderr, "controller: allocation %s released: its lease expired\n", id.c_str());
    }
    // Suspended allocations whose GPUs have room again (released above, a pool that now offers
    // more, a release another replica made before this one led).
    std::set<std::string> waiting_nodes;
    for (const std::string& id : suspended_)
      if (auto a = allocations_.find(id); a != allocations_.end()) waiting_nodes.insert(a->second.value.node);
    for (const std::string& node : waiting_nodes) ResumeSuspendedLocked(node);
    PruneEvictionsLocked(now);
    return Status::Ok();
  });
}

void Controller::PruneEvictionsLocked(int64_t now_ms) {
  std::vector<Compare> compares;
  std::vector<Write> writes;
  std::vector<std::string> ids;
  for (const auto& [id, e] : evictions_) {
    if (now_ms - e.value.evicted_ms < config_.eviction_retention_ms) continue;
    compares.push_back(Compare::At(EvictionKey(id), e.revision));
    writes.push_back(Write::Delete(EvictionKey(id)));
    ids.push_back(id);
    if (ids.size() >= 256) break;  // a bounded transaction; the next tick takes the rest
  }
  if (ids.empty()) return;
  StatusOr<int64_t> rev = CommitLocked(compares, writes);
  if (!rev.ok()) {
    std::fprintf(stderr, "controller: forgetting old evictions failed: %s\n", rev.status().ToString().c_str());
    return;
  }
  for (const std::string& id : ids) evictions_.erase(id);
}

std::vector<Eviction> Controller::ListEvictions(const std::string& node) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Eviction> out;
  for (const auto& [id, e] : evictions_)
    if (node.empty() || e.value.allocation.node == node) out.push_back(e.value);
  return out;
}

StatusOr<Eviction> Controller::GetEviction(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = evictions_.find(id);
  if (it == evictions_.end()) return NotFound("no eviction of allocation '" + id + "'");
  return it->second.value;
}

StatusOr<Eviction> Controller::MarkEvictionStopped(const std::string& id, int processes) {
  return Durably([&]() -> StatusOr<Eviction> {
    if (processes < 0) return InvalidArgument("processes must be an integer >= 0");
    std::lock_guard<std::mutex> lock(mu_);
    TF_RETURN_IF_ERROR(CheckServingLocked());
    auto it = evictions_.find(id);
    if (it == evictions_.end()) return NotFound("no eviction of allocation '" + id + "'");
    if (it->second.value.state == EvictionState::kStopped) return it->second.value;
    Eviction e = it->second.value;
    e.state = EvictionState::kStopped;
    e.stopped_ms = clock_->NowMs();
    e.processes_stopped = processes;
    StatusOr<int64_t> rev = CommitLocked({Compare::At(EvictionKey(id), it->second.revision)},
                                         {Write::Put(EvictionKey(id), Dump(e))});
    if (!rev.ok()) return rev.status();
    it->second = {e, *rev};
    ++counters_.evictions_stopped;
    return e;
  });
}

ControllerCounters Controller::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

}  // namespace tf::controller
