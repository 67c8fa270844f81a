#include "hypervisor/node_agent.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "controller/model.h"
#include "hypervisor/remote_sessions.h"
#include "hypervisor/vgpu_metrics.h"

namespace tf::hypervisor {

using nlohmann::json;

namespace {
std::string Hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  std::string h = buf;
  for (char& c : h)
    if (!isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '-';
  return h;
}

Status FromHttp(const StatusOr<controller::HttpResponse>& r, const std::string& what) {
  if (!r.ok()) return r.status();
  if (r->status == 200 || r->status == 201) return Status::Ok();
  std::string msg = r->body;
  json j = json::parse(r->body, nullptr, false);
  if (!j.is_discarded() && j.contains("error")) msg = j["error"].value("message", r->body);
  StatusCode code = r->status == 401   ? StatusCode::kUnauthenticated
                    : r->status == 404 ? StatusCode::kNotFound
                    : r->status == 400 ? StatusCode::kInvalidArgument
                    : r->status == 403 ? StatusCode::kPermissionDenied
                    : r->status == 409 ? StatusCode::kFailedPrecondition
                                       : StatusCode::kUnavailable;
  return Status(code, what + ": HTTP " + std::to_string(r->status) + ": " + msg);
}
}  // namespace

NodeAgent::NodeAgent(NodeAgentOptions options, GpuSource* source, QuotaRegions* regions,
                     const controller::Clock* clock)
    : options_(std::move(options)), source_(source), regions_(regions), clock_(clock),
      client_(options_.controller_url, options_.token, 5000, options_.ca_file), stopper_(clock, options_.stop_grace_ms) {
  if (options_.node_name.empty()) options_.node_name = Hostname();
  if (!options_.catalog_overrides.empty()) {
    Status st = catalog_.LoadOverrides(options_.catalog_overrides);
    if (!st.ok()) std::fprintf(stderr, "hypervisor: GPU catalog overrides ignored: %s\n", st.ToString().c_str());
  }
}

Status NodeAgent::Discover() {
  StatusOr<std::vector<DiscoveredGpu>> found = source_->Discover();
  std::vector<AgentGpu> gpus;
  if (!found.ok()) {
    discovery_message_ = found.status().message();
    std::fprintf(stderr, "hypervisor: %s\n", discovery_message_.c_str());
  } else {
    for (const DiscoveredGpu& d : *found) {
      AgentGpu g{d, d.name, 0, {d.uuid, 0, 0}};
      StatusOr<GpuModelSpec> spec = catalog_.Lookup(d.name);
      if (spec.ok()) {
        g.model = spec->name;
        g.tflops = spec->fp16_tflops;
        if (g.device.multiprocessor_count == 0) g.device.multiprocessor_count = spec->sm_count;
      } else {
        std::fprintf(stderr, "hypervisor: GPU %d '%s' is not in the GPU catalog: 0 TFLOPS offered "
                     "(add an override line '<name> <tflops>')\n", d.index, d.name.c_str());
      }
      Status st = regions_->AttachGpu(d, g.tflops);
      if (!st.ok()) std::fprintf(stderr, "hypervisor: quota region of %s: %s\n", d.uuid.c_str(), st.ToString().c_str());
      if (limiter::GpuRegion* r = regions_->region(d.uuid); r != nullptr && options_.host_tier_budget_bytes >= 0)
        r->SetHostTierBudget(static_cast<uint64_t>(options_.host_tier_budget_bytes));
      gpus.push_back(std::move(g));
    }
    if (gpus.empty()) discovery_message_ = "the NVIDIA driver reports no GPU on this machine";
    // Scale to zero for the allocations' vGPUs: restores on their processes' wake requests,
    // checkpoints on zero requests and after idle_zero_ms (docs/tiering.md).
    std::vector<std::string> paths;
    for (const AgentGpu& g : gpus)
      if (limiter::GpuRegion* r = regions_->region(g.device.uuid); r != nullptr) paths.push_back(r->path());
    if (!paths.empty()) {
      std::string libcuda = options_.libcuda_path;
      if (libcuda.empty()) {
        const char* env = getenv("TFUSION_REAL_LIBCUDA");
        libcuda = env != nullptr && *env ? env : "libcuda.so.1";
      }
      zero_keeper_ = std::make_unique<ZeroRestorer>(libcuda, paths, "", "a-", "hypervisor");
      zero_keeper_->Start();
      tier_log_ = std::make_unique<TierEventLog>(paths);
      tier_log_->Start();
    }
    std::fprintf(stderr, "hypervisor: %zu GPU(s) discovered\n", gpus.size());
  }
  std::lock_guard<std::mutex> lock(mu_);
  gpus_ = std::move(gpus);
  discovered_ = true;
  return Status::Ok();
}

TierBudgetReport NodeAgent::TierBudgets() const {
  TierBudgetReport out;
  uint64_t on_disk = 0;
  for (const auto& snap : SnapshotRegions(regions_->dir())) {
    out.host_mib[snap->gpu_uuid] = static_cast<int64_t>(snap->host_tier_budget_bytes >> 20);
    for (uint32_t k = 0; k < snap->process_count; ++k)
      if (snap->processes[k].tier_state == limiter::kTierOnDisk) on_disk += snap->processes[k].movable_bytes;
  }
  struct statvfs fs;
  if (!options_.disk_tier_dir.empty() && statvfs(options_.disk_tier_dir.c_str(), &fs) == 0) {
    const uint64_t bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize + on_disk;
    out.disk_mib = static_cast<int64_t>(bytes >> 30) * 1024;
  }
  return out;
}

Status NodeAgent::Register() {
  const TierBudgetReport budgets = TierBudgets();
  json gpus = json::array();
  for (const AgentGpu& g : this->gpus()) {
    json j = {{"uuid", g.device.uuid}, {"model", g.model}, {"index", g.device.index},
              {"tflops", g.tflops},    {"vram_mib", g.device.memory_total_mib}};
    if (g.device.numa_node >= 0) j["numa_node"] = g.device.numa_node;
    if (auto b = budgets.host_mib.find(g.device.uuid); b != budgets.host_mib.end()) j["host_tier_budget_mib"] = b->second;
    gpus.push_back(j);
  }
  json body = {{"name", options_.node_name}, {"address", options_.address}, {"gpus", gpus},
               {"credential", credential_}, {"disk_tier_budget_mib", budgets.disk_mib}};
  if (!options_.worker_address.empty()) body["worker_address"] = options_.worker_address;
  if (!options_.pool.empty()) body["pool"] = options_.pool;
  StatusOr<controller::HttpResponse> r = client_.Post("/v1/nodes", body.dump());
  Status st = FromHttp(r, "registering node " + options_.node_name);
  // An agent the controller refuses retries for ever without a heartbeat to fail: these are what
  // an operator alerts on. "refused": the controller answered no (a GPU registered to another node,
  // a bad token); "failed": no answer (unreachable, a standby, its store failing).
  std::lock_guard<std::mutex> lock(mu_);
  const bool refused = r.ok() && r->status >= 400 && r->status < 500;
  ++registrations_[st.ok() ? "ok" : refused ? "refused" : "failed"];
  registered_ = st.ok();
  return st;
}

namespace {
// The credential in `file`, or a new one written there (0600, its folder made) when it has none.
StatusOr<std::string> LoadOrCreateCredential(const std::string& file) {
  std::random_device rd;
  char fresh[48];
  std::snprintf(fresh, sizeof fresh, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  if (file.empty()) return std::string(fresh);
  if (std::ifstream in(file); in) {
    std::string c;
    if (std::getline(in, c) && !c.empty()) return c;
  }
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(file).parent_path(), ec);
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return Unavailable("cannot write the node credential " + file + ": " + std::strerror(errno));
  std::string line = std::string(fresh) + "\n";
  bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ok = ::fsync(fd) == 0 && ok;
  ::close(fd);
  if (!ok) return Unavailable("cannot write the node credential " + file);
  return std::string(fresh);
}

// A region counter or size as a heartbeat carries it. The region is shared memory that tenants
// of the GPU can write: a value past int64 would reach the controller negative and have the
// node's whole heartbeat refused, so it is reported as the largest int64 instead.
int64_t Reported(uint64_t v) {
  return v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(v);
}
int64_t AddReported(int64_t a, uint64_t b) {
  const int64_t r = Reported(b);
  return a > INT64_MAX - r ? INT64_MAX : a + r;
}
}  // namespace

Status NodeAgent::Start() {
  if (!discovered_) TF_RETURN_IF_ERROR(Discover());
  if (credential_.empty()) {
    StatusOr<std::string> c = LoadOrCreateCredential(options_.credential_file);
    if (!c.ok()) return c.status();
    credential_ = *c;
  }
  return Register();
}

Status NodeAgent::HeartbeatOnce() {
  StatusOr<std::vector<GpuUtilization>> samples = source_->Sample();
  const TierBudgetReport budgets = TierBudgets();
  json gpus = json::array();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (samples.ok()) {
      for (const GpuUtilization& u : *samples) {
        for (AgentGpu& g : gpus_)
          if (g.device.uuid == u.uuid) g.last_sample = u;
        gpus.push_back({{"uuid", u.uuid}, {"utilization_percent", u.gpu_percent},
                        {"memory_used_mib", u.memory_used_mib}});
        if (auto b = budgets.host_mib.find(u.uuid); b != budgets.host_mib.end())
          gpus.back()["host_tier_budget_mib"] = b->second;
      }
    }
  }
  // The use of the allocations' vGPUs, as the regions count it (tfusion top shows it).
  json vgpus = json::array();
  // Per GPU, what the vGPUs that are no allocation's are guaranteed and may hold (a local
  // `tfusion run` without --controller, a worker session without an allocation): the controller
  // counts it as used, so that it never places allocations on capacity they already have. A
  // program of several CUDA processes through a worker has a session vGPU of the allocation's size
  // per process: all but one of an allocation's sessions count here too.
  struct Unpooled {
    uint64_t share_ppm = 0, vram_bytes = 0;
  };
  std::map<std::string, Unpooled> unpooled;  // by GPU UUID
  std::set<std::string> sessions_seen;       // "GPU/allocation": one bound session counted as the allocation's
  for (const auto& snap : SnapshotRegions(regions_->dir())) {
    for (uint32_t i = 0; i < snap->vgpu_count; ++i) {
      const limiter::VgpuInfo& v = snap->vgpus[i];
      const std::string bound = BoundAllocation(v.id);
      const bool extra_session =
          !bound.empty() && v.process_count > 0 && !sessions_seen.insert(std::string(snap->gpu_uuid) + "/" + bound).second;
      // Only vGPUs with processes: one a run or session left behind (another user's, which this
      // agent does not sweep) must not keep its capacity from the pool.
      if ((std::string(v.id).rfind("a-", 0) != 0 && bound.empty() && v.process_count > 0) || extra_session) {
        // Values a tenant scribbled on are clamped to the whole GPU each (at most 64 vGPUs).
        Unpooled& u = unpooled[snap->gpu_uuid];
        u.share_ppm += std::min<uint64_t>(v.compute_share_ppm, 1'000'000);
        u.vram_bytes += std::min<uint64_t>(v.vram_limit_bytes, snap->total_vram_bytes);
      }
      if (std::string(v.id).rfind("a-", 0) != 0) continue;  // not an allocation's vGPU
      json entry = {{"allocation", v.id}, {"gpu", snap->gpu_uuid},
                    {"busy_ns_total", Reported(v.busy_ns_total)},
                    {"throttled_ns_total", Reported(v.throttled_ns_total)},
                    // Never above the throttled time, whatever the region holds.
                    {"held_turn_ns_total", Reported(std::min(v.held_turn_ns_total, v.throttled_ns_total))}};
      // Its live processes (pids as the region records them) and, with tiering, where their VRAM
      // is (mixed when they differ). The worker sessions bound to the allocation count as its
      // processes (remote_sessions.h).
      std::set<uint32_t> mine{v.index};
      std::set<uint32_t> tiered;
      if (v.tier_enabled) tiered.insert(v.index);
      for (uint32_t j = 0; j < snap->vgpu_count; ++j) {
        if (BoundAllocation(snap->vgpus[j].id) != v.id) continue;
        mine.insert(snap->vgpus[j].index);
        if (snap->vgpus[j].tier_enabled) tiered.insert(snap->vgpus[j].index);
      }
      json procs = json::array();
      std::string state;
      int64_t swapped = 0;
      for (uint32_t k = 0; k < snap->process_count; ++k) {
        const limiter::ProcessInfo& p = snap->processes[k];
        if (!mine.count(p.vgpu_index)) continue;
        // The `tfusion run` that holds the slot for its command is not one of its programs (as
        // `tfusion smi` counts them).
        if (p.vram_bytes == 0 && IsRunWrapper(p.pid)) continue;
        // What the controller accepts: 256 processes per vGPU, pids 1..4194304 and at most 1 PiB
        // each (a slot a tenant scribbled on is left out or clamped, not a refused heartbeat).
        if (procs.size() < 256 && p.pid >= 1 && p.pid <= 4194304)
          procs.push_back({{"pid", p.pid}, {"vram_bytes", std::min<int64_t>(Reported(p.vram_bytes), int64_t{1} << 50)}});
        if (!tiered.count(p.vgpu_index) || p.tier_state == limiter::kTierOff) continue;
        const std::string s = limiter::TierStateLabel(p.tier_state);
        state = state.empty() || state == s ? s : "mixed";
        swapped = AddReported(swapped, p.host_bytes);
        if (p.tier_state == limiter::kTierOnDisk) swapped = AddReported(swapped, p.movable_bytes);
      }
      entry["processes"] = std::move(procs);
      if (v.tier_enabled) {
        entry["tier_state"] = state.empty() ? "resident" : state;
        entry["swapped_bytes"] = swapped;
        // As the controller accepts them (0..30 days); a value a tenant wrote past that is left out.
        for (auto [name, ms] : {std::pair{"applied_idle_swap_ms", v.idle_swap_ms},
                                std::pair{"applied_idle_disk_ms", v.idle_disk_ms},
                                std::pair{"applied_idle_zero_ms", v.idle_zero_ms}}) {
          if (static_cast<uint64_t>(ms) <= static_cast<uint64_t>(controller::kMaxTierIdleMs))
            entry[name] = static_cast<int64_t>(ms);
        }
      }
      vgpus.push_back(std::move(entry));
    }
  }
  for (json& g : gpus) {
    // At most the whole GPU, as this agent registered it: the regions are written by tenants too
    // (a region's VRAM total or a second region naming the GPU must not inflate it).
    const std::string uuid = g.value("uuid", "");
    const Unpooled& u = unpooled[uuid];
    int64_t vram_mib = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const AgentGpu& a : gpus_)
        if (a.device.uuid == uuid) vram_mib = static_cast<int64_t>(a.device.memory_total_mib);
    }
    g["unpooled_share_ppm"] = static_cast<int64_t>(std::min<uint64_t>(u.share_ppm, 1'000'000));
    g["unpooled_vram_mib"] = std::min(static_cast<int64_t>(u.vram_bytes >> 20), vram_mib);
  }
  Status st = FromHttp(client_.Post("/v1/nodes/" + options_.node_name + "/heartbeat",
                                    json{{"gpus", gpus}, {"vgpus", vgpus}, {"credential", credential_},
                                         {"disk_tier_budget_mib", budgets.disk_mib}}.dump()),
                       "heartbeat");
  if (st.code() == StatusCode::kNotFound) st = Register();
  std::lock_guard<std::mutex> lock(mu_);
  if (st.ok()) {
    ++heartbeats_ok_;
    last_heartbeat_ms_ = clock_->NowMs();
  } else {
    ++heartbeats_failed_;
  }
  return st;
}

Status NodeAgent::SyncAllocations() {
  Status st = SyncAllocationsOnce();
  std::lock_guard<std::mutex> lock(mu_);
  ++(st.ok() ? syncs_ok_ : syncs_failed_);
  return st;
}

// A vGPU that lingers with an allocation this agent never followed: its allocation is gone when
// the controller answers 404 for it (a node token sees only its own node's allocations, so one
// placed elsewhere is not this node's either). Only ids the controller issues are asked about (a
// standalone `tfusion run` vGPU is left alone); an allocation it still has, or a failed request,
// is asked about again after kAskAgainMs.
bool NodeAgent::GoneAtController(const std::string& allocation, int64_t now_ms) {
  if (!IsAllocationId(allocation)) return false;
  if (auto it = ask_again_.find(allocation); it != ask_again_.end() && now_ms < it->second) return false;
  StatusOr<controller::HttpResponse> r = client_.Get("/v1/allocations/" + allocation);
  if (r.ok() && r->status == 404) {
    ask_again_.erase(allocation);
    released_[allocation] = now_ms + kRememberReleasedMs;
    return true;
  }
  ask_again_[allocation] = now_ms + kAskAgainMs;
  return false;
}

Status NodeAgent::SyncAllocationsOnce() {
  // What a worker session or a `tfusion run` of root's killed outright left (its lock, in root's
  // lock folder, is free): also where no worker or `tfusion smi` runs to remove it, and while the
  // controller cannot be reached. Other users' are theirs to sweep (their own `smi`, workers, runs).
  for (const std::string& id : RemoveEndedSessionVgpus(regions_->dir()))
    std::fprintf(stderr, "hypervisor: removed vGPU %s: its session or run ended without removing it\n", id.c_str());
  StatusOr<controller::HttpResponse> r = client_.Get("/v1/allocations?node=" + options_.node_name);
  TF_RETURN_IF_ERROR(FromHttp(r, "listing allocations"));
  json j = json::parse(r->body, nullptr, false);
  if (j.is_discarded() || !j.contains("allocations") || !j["allocations"].is_array())
    return Internal("the controller's allocation list is not JSON");
  std::vector<VgpuAssignment> want;
  for (const json& a : j["allocations"]) {
    if (a.value("node", "") != options_.node_name || !a.contains("vgpus")) continue;
    for (const json& v : a["vgpus"]) {
      VgpuAssignment va{a.value("id", ""), v.value("gpu", ""),
                        static_cast<uint64_t>(v.value("vram_mib", int64_t{0})) << 20,
                        v.value("share_ppm", uint64_t{0}), v.value("limit_ppm", uint64_t{0}), limiter::kDefaultQos};
      if (va.compute_share_ppm == 0) {  // written by an older controller: derive it
        for (const AgentGpu& g : gpus())
          if (g.device.uuid == va.gpu_uuid && g.tflops > 0)
            va.compute_share_ppm = static_cast<uint64_t>(v.value("tflops", 0.0) / g.tflops * 1e6 + 0.5);
      }
      // An older controller sends no limit: limit = request (QuotaRegions::Sync).
      if (StatusOr<controller::Qos> q = controller::ParseQos(a.value("qos", "medium")); q.ok())
        va.qos = static_cast<uint32_t>(*q);
      va.tiering = a.value("tiering", false);
      va.freeze_requests = a.value("freeze_requests", 0u);
      va.thaw_requests = a.value("thaw_requests", 0u);
      va.held = a.value("suspended", false);
      va.idle_swap_ms = a.value("idle_swap_ms", int64_t{-1});
      va.idle_disk_ms = a.value("idle_disk_ms", int64_t{-1});
      va.idle_zero_ms = a.value("idle_zero_ms", int64_t{-1});
      va.zero_requests = a.value("zero_requests", 0u);
      want.push_back(std::move(va));
    }
  }
  // Evictions are read after the allocations: an allocation taken back in between is then in
  // neither list's "wanted" set, and its eviction is known.
  StatusOr<controller::HttpResponse> er = client_.Get("/v1/evictions?node=" + options_.node_name);
  Status evictions_status = FromHttp(er, "listing evictions");
  std::map<std::string, std::string> evicted;  // id -> reason
  std::set<std::string> unreported;             // evictions still "stopping" at the controller
  if (evictions_status.ok()) {
    json e = json::parse(er->body, nullptr, false);
    if (!e.is_discarded() && e.contains("evictions") && e["evictions"].is_array()) {
      for (const json& ev : e["evictions"]) {
        if (!ev.is_object() || ev.value("node", "") != options_.node_name) continue;
        evicted[ev.value("id", "")] = ev.value("reason", "evicted");
        if (ev.value("state", "") == "stopping") unreported.insert(ev.value("id", ""));
      }
    }
  }

  std::vector<LingeringVgpu> lingering;
  Status st = regions_->Sync(want, &lingering);
  std::set<std::string> wanted_ids;
  for (const VgpuAssignment& a : want) wanted_ids.insert(a.id);
  std::set<std::string> still_running;  // vGPUs taken back, processes still alive
  std::set<std::string> allocations_running;  // their allocations (a session's: the one it is bound to)
  for (const LingeringVgpu& v : lingering) {
    const std::string& allocation = v.allocation_id();
    std::string reason = v.reason;
    if (reason.empty()) {
      if (auto e = evicted.find(allocation); e != evicted.end()) reason = e->second;
      else if (known_.count(allocation) || released_.count(allocation)) reason = "released";
      else if (GoneAtController(allocation, clock_->NowMs())) reason = "released";
      else continue;  // still at the controller, or not one of its ids: removed once its processes exit
    }
    if (stop_reason_.emplace(v.id, Stopping{reason, allocation}).second) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stopped_by_reason_[reason];
    }
    stopper_.Step(v, reason);
    still_running.insert(v.id);
    allocations_running.insert(allocation);
  }
  std::map<std::string, int> finished;  // allocation id -> processes that were signalled
  for (auto it = stop_reason_.begin(); it != stop_reason_.end();) {
    if (still_running.count(it->first)) {
      ++it;
      continue;
    }
    finished[it->second.allocation] += std::max(0, stopper_.Finish(it->first));
    it = stop_reason_.erase(it);
  }
  // Tell the controller about every eviction of this node whose vGPUs (its own, its sessions')
  // have no process left (also those that never had one here); until it hears, the eviction stays
  // "stopping".
  for (const std::string& id : unreported) {
    if (allocations_running.count(id)) continue;
    auto f = finished.find(id);
    json body = {{"processes", f == finished.end() ? 0 : f->second}};
    Status reported = FromHttp(client_.Post("/v1/evictions/" + id + "/stopped", body.dump()),
                               "reporting eviction " + id + " stopped");
    if (!reported.ok() && st.ok()) st = reported;
  }
  for (auto it = ask_again_.begin(); it != ask_again_.end();) {  // forget old answers
    it = it->second + kRememberReleasedMs <= clock_->NowMs() ? ask_again_.erase(it) : std::next(it);
  }
  // Allocations this agent followed and that are gone are remembered for a while: a worker session
  // that binds to one late (its client was placed just before the allocation went) is stopped too.
  const int64_t now_ms = clock_->NowMs();
  for (const std::string& id : known_) {
    if (!wanted_ids.count(id)) released_[id] = now_ms + kRememberReleasedMs;
  }
  for (auto it = released_.begin(); it != released_.end();) {
    it = it->second <= now_ms || wanted_ids.count(it->first) ? released_.erase(it) : std::next(it);
  }
  known_ = wanted_ids;
  known_.insert(allocations_running.begin(), allocations_running.end());
  if (st.ok() && !evictions_status.ok()) st = evictions_status;
  std::lock_guard<std::mutex> lock(mu_);
  vgpus_ = want.size();
  vgpus_stopping_ = still_running.size();
  sigterm_total_ = stopper_.sigterm_total();
  sigkill_total_ = stopper_.sigkill_total();
  return st;
}

std::vector<AgentGpu> NodeAgent::gpus() const {
  std::lock_guard<std::mutex> lock(mu_);
  return gpus_;
}

std::string NodeAgent::MetricsText() const {
  using prom::Type;
  prom::Exposition o;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string& node = options_.node_name;
    o.Family("tf_node_gpus", Type::kGauge, "GPUs discovered on this node.");
    o.Sample("tf_node_gpus", {{"node", node}}, static_cast<double>(gpus_.size()));
    o.Family("tf_node_vgpus", Type::kGauge, "vGPUs of this node's allocations (last sync).");
    o.Sample("tf_node_vgpus", {{"node", node}}, static_cast<double>(vgpus_));
    auto per_gpu = [&](const char* name, const char* help, auto get) {
      o.Family(name, Type::kGauge, help);
      for (const AgentGpu& g : gpus_) {
        const std::string index = std::to_string(g.device.index);
        o.Sample(name, {{"node", node}, {"gpu", g.device.uuid}, {"index", index}, {"model", g.model}}, get(g));
      }
    };
    constexpr double kMiB = 1024.0 * 1024.0;
    per_gpu("tf_gpu_capacity_tflops", "FP16 dense TFLOPS from the GPU catalog.",
            [](const AgentGpu& g) { return g.tflops; });
    per_gpu("tf_gpu_vram_total_bytes", "VRAM of the GPU, bytes.",
            [&](const AgentGpu& g) { return static_cast<double>(g.device.memory_total_mib) * kMiB; });
    per_gpu("tf_gpu_vram_used_bytes", "VRAM in use on the GPU (last sample), bytes.",
            [&](const AgentGpu& g) { return static_cast<double>(g.last_sample.memory_used_mib) * kMiB; });
    per_gpu("tf_gpu_utilization_ratio", "Fraction of the last sample period the GPU was busy (0-1).",
            [](const AgentGpu& g) { return g.last_sample.gpu_percent / 100.0; });
    o.Family("tf_node_vgpus_stopping", Type::kGauge, "vGPUs taken back by the controller whose processes still run.");
    o.Sample("tf_node_vgpus_stopping", {{"node", node}}, static_cast<double>(vgpus_stopping_));
    o.Family("tf_node_vgpu_stops_total", Type::kCounter, "vGPUs taken back while in use, by reason.");
    for (const char* reason : {"preempted", "node-lost", "released"}) {
      auto it = stopped_by_reason_.find(reason);
      o.Sample("tf_node_vgpu_stops_total", {{"node", node}, {"reason", reason}},
               it == stopped_by_reason_.end() ? 0.0 : static_cast<double>(it->second));
    }
    o.Family("tf_node_process_signals_total", Type::kCounter, "Signals sent to tenant processes of taken-back vGPUs.");
    o.Sample("tf_node_process_signals_total", {{"node", node}, {"signal", "SIGTERM"}}, static_cast<double>(sigterm_total_));
    o.Sample("tf_node_process_signals_total", {{"node", node}, {"signal", "SIGKILL"}}, static_cast<double>(sigkill_total_));
    o.Family("tf_node_registered", Type::kGauge, "1 when the controller accepted this agent's last registration.");
    o.Sample("tf_node_registered", {{"node", node}}, registered_ ? 1 : 0);
    o.Family("tf_node_registrations_total", Type::kCounter,
             "Registrations with the controller, by result: ok, refused (the controller said no), failed (no answer).");
    for (const char* result : {"ok", "refused", "failed"}) {
      auto it = registrations_.find(result);
      o.Sample("tf_node_registrations_total", {{"node", node}, {"result", result}},
               it == registrations_.end() ? 0.0 : static_cast<double>(it->second));
    }
    o.Family("tf_node_heartbeats_total", Type::kCounter, "Heartbeats sent, by result.");
    o.Sample("tf_node_heartbeats_total", {{"node", node}, {"result", "ok"}}, static_cast<double>(heartbeats_ok_));
    o.Sample("tf_node_heartbeats_total", {{"node", node}, {"result", "failed"}}, static_cast<double>(heartbeats_failed_));
    o.Family("tf_node_syncs_total", Type::kCounter, "Syncs of the node's vGPUs with the controller's allocations, by result.");
    o.Sample("tf_node_syncs_total", {{"node", node}, {"result", "ok"}}, static_cast<double>(syncs_ok_));
    o.Sample("tf_node_syncs_total", {{"node", node}, {"result", "failed"}}, static_cast<double>(syncs_failed_));
  }
  WriteVgpuMetrics(&o, regions_->dir(), options_.node_name);  // reads shared memory: not under mu_
  return o.Take();
}

}  // namespace tf::hypervisor
