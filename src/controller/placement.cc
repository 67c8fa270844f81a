#include "controller/placement.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

namespace tf::controller {
namespace {

// Mirrors of usage no known allocation explains; never preempted.
constexpr char kResidualPrefix[] = "~residual/";

bool ContainsIgnoreCase(const std::string& hay, const std::string& needle) {
  auto it = std::search(hay.begin(), hay.end(), needle.begin(), needle.end(),
                        [](char a, char b) { return std::tolower(a) == std::tolower(b); });
  return it != hay.end();
}

sched::Qos ToSchedQos(Qos q) {
  switch (q) {
    case Qos::kLow: return sched::Qos::kLow;
    case Qos::kMedium: return sched::Qos::kMedium;
    case Qos::kHigh: return sched::Qos::kHigh;
    case Qos::kCritical: return sched::Qos::kCritical;
  }
  return sched::Qos::kMedium;
}

// The scheduler's "no room" is the controller's kOutOfMemory (HTTP 409, counted as refused).
Status FromSched(const Status& s) {
  if (s.code() == StatusCode::kUnavailable) return OutOfMemory(s.message());
  if (s.code() == StatusCode::kNotFound) return NotFound(s.message());
  return s;
}

}  // namespace

PlacementEngine::PlacementEngine(sched::SchedulerOptions options)
    : options_(options), scheduler_(std::make_unique<sched::Scheduler>(options)) {}

void PlacementEngine::Reset(const ClusterSnapshot& snap) {
  scheduler_ = std::make_unique<sched::Scheduler>(options_);
  gpu_refs_.clear();
  node_gpus_.clear();
  for (const Pool* p : snap.pools) {
    Status st = AddPool(*p);
    if (!st.ok()) std::fprintf(stderr, "placement: pool %s: %s\n", p->name.c_str(), st.ToString().c_str());
  }
  std::map<std::string, std::vector<const Gpu*>> by_node;
  for (const Gpu* g : snap.gpus) by_node[g->node].push_back(g);
  for (const Node* n : snap.nodes) {
    Status st = AddNode(*n, by_node[n->name]);
    if (!st.ok()) std::fprintf(stderr, "placement: node %s: %s\n", n->name.c_str(), st.ToString().c_str());
  }
  // Known allocations, restricted to the GPUs the mirror holds.
  std::map<std::string, std::pair<sched::MilliTflops, int64_t>> explained;
  for (const Allocation* a : snap.allocations) {
    sched::Request r;
    r.id = a->id;
    r.tenant = a->tenant;
    r.pool = a->pool;
    r.qos = ToSchedQos(a->qos);
    r.suspendable = a->tiering;
    sched::Placement p;
    p.request_id = a->id;
    p.node_name = a->node;
    p.node = scheduler_->state().NodeIndex(a->node);
    for (const Vgpu& v : a->vgpus) {
      auto ref = gpu_refs_.find(v.gpu_uuid);
      if (ref == gpu_refs_.end() || ref->second.node != a->node) continue;
      p.gpus.push_back(ref->second.index);
      p.compute_per_gpu = v.milli_tflops;
      p.vram_per_gpu_mib = v.vram_mib;
      // The scheduler's requests are in TFLOPS; ToTflops converts back to exactly these integers.
      r.tflops_request = ToTflops(v.milli_tflops);
      r.tflops_limit = ToTflops(v.milli_tflops_limit);
      r.vram_request_mib = v.vram_mib;
    }
    if (p.gpus.empty() || p.node < 0) continue;
    r.gpu_count = static_cast<int>(p.gpus.size());
    // A suspended allocation is bound to its GPUs without counting on them.
    Status st = a->suspended ? scheduler_->CommitSuspended(r, p) : scheduler_->Commit(r, p);
    if (!st.ok()) {
      std::fprintf(stderr, "placement: allocation %s not mirrored: %s\n", a->id.c_str(), st.ToString().c_str());
      continue;
    }
    if (a->suspended) continue;
    for (const Vgpu& v : a->vgpus) {
      explained[v.gpu_uuid].first += v.milli_tflops;
      explained[v.gpu_uuid].second += v.vram_mib;
    }
  }
  // Usage the store records but no known allocation explains.
  for (const Gpu* g : snap.gpus) {
    auto ref = gpu_refs_.find(g->uuid);
    if (ref == gpu_refs_.end()) continue;
    const auto& ex = explained[g->uuid];
    // Plus what vGPUs outside the pool hold (its node agent reports them), up to what is left.
    double ratio = 1;
    for (const Pool* p : snap.pools)
      if (p->name == g->pool) ratio = std::max(1.0, p->tflops_oversell_ratio);
    const sched::MilliTflops room = std::max<sched::MilliTflops>(
        0, static_cast<sched::MilliTflops>(static_cast<double>(g->milli_tflops) * ratio) - g->used_milli_tflops);
    sched::MilliTflops compute = g->used_milli_tflops - ex.first + std::min(g->unpooled_milli_tflops, room);
    int64_t vram = g->used_vram_mib - ex.second + std::min(g->unpooled_vram_mib, std::max<int64_t>(0, g->vram_mib - g->used_vram_mib));
    if (compute <= 0 && vram <= 0) continue;
    sched::Request r;
    r.id = kResidualPrefix + g->uuid;
    r.pool = g->pool;
    r.qos = sched::Qos::kCritical;
    r.tflops_request = sched::ToTflops(std::max<sched::MilliTflops>(compute, 1));
    r.vram_request_mib = std::max<int64_t>(vram, 0);
    sched::Placement p{r.id, scheduler_->state().NodeIndex(g->node), g->node, {ref->second.index},
                       std::max<sched::MilliTflops>(compute, 1), r.vram_request_mib};
    Status st = scheduler_->Commit(r, p);
    if (!st.ok()) std::fprintf(stderr, "placement: GPU %s residual usage: %s\n", g->uuid.c_str(), st.ToString().c_str());
  }
  // Lost and cordoned nodes take no new work (taken out after their allocations were mirrored).
  for (const Node* n : snap.nodes)
    if (n->state == NodeState::kLost || n->cordoned) (void)scheduler_->SetSchedulable(n->name, false);
  // Quotas last: a quota lowered below current use must not drop existing allocations.
  for (const TenantQuota* q : snap.quotas)
    scheduler_->SetTenantQuota(q->tenant, {ToTflops(q->max_milli_tflops), q->max_vram_mib, q->max_gpus});
}

Status PlacementEngine::AddPool(const Pool& p) {
  sched::PoolSpec spec{p.name, std::max(1.0, p.tflops_oversell_ratio),
                       sched::PlacementMode::kNodeCompactGpuLowLoad};
  if (StatusOr<sched::PlacementMode> m = sched::ParsePlacementMode(p.placement_mode); m.ok())
    spec.mode = *m;
  spec.vram_expand_to_host_percent = p.vram_expand_to_host_percent;
  spec.vram_expand_to_disk_percent = p.vram_expand_to_disk_percent;
  return scheduler_->AddPool(spec);
}

Status PlacementEngine::AddNode(const Node& n, std::vector<const Gpu*> gpus) {
  // GPUs in index order. A GPU the controller marked unschedulable while its node is ready (it
  // disappeared from the node's report) is left out; a lost node keeps all its GPUs (its
  // allocations still count) and is cordoned as a whole by Reset.
  std::sort(gpus.begin(), gpus.end(), [](const Gpu* a, const Gpu* b) { return a->index < b->index; });
  const bool lost = n.state == NodeState::kLost;
  sched::NodeSpec spec{n.name, n.pool, {}, 0, 0};
  std::vector<std::string> uuids;
  for (const Gpu* g : gpus) {
    if (!lost && !g->schedulable) continue;
    if (g->milli_tflops <= 0 || g->vram_mib <= 0 || spec.gpus.size() >= 64) continue;
    spec.gpus.push_back({g->model.empty() ? "unknown" : g->model, ToTflops(g->milli_tflops), g->vram_mib,
                         std::max(0, g->numa_node), 0});
    const sched::TierBudgets budgets = GpuTierBudgets(*g, &n, gpus.size());
    spec.gpus.back().host_tier_budget_mib = budgets.host_mib;
    spec.gpus.back().disk_tier_budget_mib = budgets.disk_mib;
    uuids.push_back(g->uuid);
  }
  TF_RETURN_IF_ERROR(scheduler_->AddNode(spec));
  for (size_t i = 0; i < uuids.size(); ++i) gpu_refs_[uuids[i]] = {n.name, static_cast<int>(i)};
  node_gpus_[n.name] = std::move(uuids);
  return Status::Ok();
}

StatusOr<sched::Request> PlacementEngine::ToSchedRequest(const PlacementRequest& in) const {
  sched::Request r;
  r.id = in.id;
  r.tenant = in.tenant;
  r.pool = in.pool;
  r.tflops_request = in.tflops;
  r.tflops_limit = in.tflops_limit;
  r.compute_percent_request = in.percent;
  r.compute_percent_limit = in.percent_limit;
  r.vram_request_mib = in.vram_mib;
  r.gpu_count = in.gpu_count;
  r.qos = ToSchedQos(in.qos);
  r.node = in.node;
  r.suspendable = in.tiering;
  if (!in.gpu_model.empty()) {
    for (const std::string& m : scheduler_->state().model_names())
      if (ContainsIgnoreCase(m, in.gpu_model)) r.gpu_models.push_back(m);
    if (r.gpu_models.empty())
      return OutOfMemory("no GPU model matching '" + in.gpu_model + "' is in the cluster");
  }
  TF_RETURN_IF_ERROR(RestrictToGpusThatHost(in, &r));
  return r;
}

// A TFLOPS limit is a ceiling on one GPU: above a GPU's physical capacity it can never be
// honoured there. Without a limit the request is the ceiling (a hard cap), and an oversold pool
// must not place one vGPU above its GPU either: oversell lets the requests of several vGPUs add
// up to more than the GPU, not one vGPU be more than it. GPUs too small are left out through the
// model allow list (the placement arithmetic, which counts requests against the oversold
// capacity, is unchanged); a ceiling above every GPU of the pool is refused.
Status PlacementEngine::RestrictToGpusThatHost(const PlacementRequest& in, sched::Request* r) const {
  const bool implied = in.tflops_limit <= 0;
  const double need_tflops = implied ? in.tflops : in.tflops_limit;
  if (need_tflops <= 0 || in.gpu_count <= 0) return Status::Ok();
  const sched::ClusterState& state = scheduler_->state();
  const int pool = state.PoolIndex(in.pool);
  if (pool < 0) return Status::Ok();  // the scheduler names the missing pool
  const sched::MilliTflops need = sched::ToMilliTflops(need_tflops);
  const uint64_t allowed = state.ModelMask(r->gpu_models);
  sched::MilliTflops largest = 0;
  uint64_t hosting = 0;   // models with a GPU big enough
  bool any_too_small = false;
  for (sched::NodeId id : state.pool_nodes(pool)) {
    const sched::NodeState& n = state.node(id);
    if (!n.schedulable) continue;
    for (const sched::GpuState& g : n.gpus) {
      if (((allowed >> g.model_id) & 1) == 0) continue;
      largest = std::max(largest, g.capacity);
      if (g.capacity >= need) hosting |= uint64_t{1} << g.model_id;
      else any_too_small = true;
    }
  }
  if (largest == 0) return Status::Ok();  // no GPU at all: the scheduler says there is no room
  if (hosting == 0) {
    char buf[256];
    if (implied) {
      std::snprintf(buf, sizeof(buf), "tflops %g is more than any GPU in pool '%s' has (the largest has %g "
                    "TFLOPS): a vGPU is a slice of one GPU; ask for more GPUs (gpu_count) instead",
                    need_tflops, in.pool.c_str(), sched::ToTflops(largest));
    } else {
      std::snprintf(buf, sizeof(buf), "tflops_limit %g is more than any GPU in pool '%s' has (the largest has %g "
                    "TFLOPS): the limit is a ceiling on one GPU", need_tflops, in.pool.c_str(), sched::ToTflops(largest));
    }
    return OutOfMemory(buf);
  }
  if (!any_too_small) return Status::Ok();
  std::vector<std::string> models;
  for (size_t m = 0; m < state.model_names().size() && m < 64; ++m)
    if ((hosting >> m) & 1) models.push_back(state.model_names()[m]);
  r->gpu_models = std::move(models);
  return Status::Ok();
}

StatusOr<PlacementDecision> PlacementEngine::Place(const PlacementRequest& in, bool allow_preemption) const {
  StatusOr<sched::Request> r = ToSchedRequest(in);
  if (!r.ok()) return r.status();
  PlacementDecision d;
  sched::Placement placement;
  StatusOr<sched::Placement> p = scheduler_->Place(*r);
  if (p.ok()) {
    placement = *p;
  } else {
    if (p.status().code() != StatusCode::kUnavailable || !allow_preemption) return FromSched(p.status());
    StatusOr<sched::PreemptionPlan> plan = scheduler_->PlanPreemption(*r);
    if (!plan.ok()) {
      if (plan.status().code() == StatusCode::kUnavailable) return FromSched(p.status());
      return FromSched(plan.status());
    }
    placement = plan->placement;
    d.victims = plan->victims;
    d.suspended = plan->suspended;
  }
  d.node = placement.node_name;
  const std::vector<std::string>& uuids = node_gpus_.at(d.node);
  for (int gi : placement.gpus) d.gpu_uuids.push_back(uuids.at(static_cast<size_t>(gi)));
  d.milli_tflops_per_gpu = placement.compute_per_gpu;
  return d;
}

StatusOr<std::vector<sched::NodeFit>> PlacementEngine::RankNodes(const PlacementRequest& in) const {
  StatusOr<sched::Request> r = ToSchedRequest(in);
  if (!r.ok()) return r.status();
  StatusOr<std::vector<sched::NodeFit>> fits = scheduler_->RankNodes(*r);
  if (!fits.ok()) return FromSched(fits.status());
  return fits;
}

Status PlacementEngine::Commit(const PlacementRequest& in, const PlacementDecision& d) {
  StatusOr<sched::Request> r = ToSchedRequest(in);
  if (!r.ok()) return r.status();
  for (const std::string& v : d.victims) {
    if (std::find(d.suspended.begin(), d.suspended.end(), v) != d.suspended.end()) (void)scheduler_->Suspend(v);
    else (void)scheduler_->Release(v);
  }
  sched::Placement p;
  p.request_id = in.id;
  p.node_name = d.node;
  p.node = scheduler_->state().NodeIndex(d.node);
  for (const std::string& uuid : d.gpu_uuids) p.gpus.push_back(gpu_refs_.at(uuid).index);
  p.compute_per_gpu = d.milli_tflops_per_gpu;
  p.vram_per_gpu_mib = in.vram_mib;
  return scheduler_->Commit(*r, p);
}

void PlacementEngine::Release(const Allocation& a) { (void)scheduler_->Release(a.id); }

Status PlacementEngine::Resume(const Allocation& a) { return scheduler_->Resume(a.id); }

void PlacementEngine::Suspend(const Allocation& a) { (void)scheduler_->Suspend(a.id); }

std::unique_ptr<PlacementEngine> MakeSchedulerPlacement(sched::SchedulerOptions options) {
  return std::make_unique<PlacementEngine>(options);
}

sched::TierBudgets GpuTierBudgets(const Gpu& gpu, const Node* node, size_t node_gpus) {
  return {gpu.host_tier_budget_mib, node ? DiskTierShareMib(node->disk_tier_budget_mib, node_gpus) : -1};
}

namespace {
sched::PoolSpec CapacitySpec(const Pool* pool) {
  sched::PoolSpec spec;
  if (pool != nullptr) {
    spec.tflops_oversell_ratio = std::max(1.0, pool->tflops_oversell_ratio);
    spec.vram_expand_to_host_percent = pool->vram_expand_to_host_percent;
    spec.vram_expand_to_disk_percent = pool->vram_expand_to_disk_percent;
  }
  return spec;
}
}  // namespace

int64_t SchedulableVramMib(const Gpu& gpu, const Pool* pool, const Node* node, size_t node_gpus) {
  return sched::GpuSchedulableCapacity(ToTflops(gpu.milli_tflops), gpu.vram_mib, CapacitySpec(pool),
                                       GpuTierBudgets(gpu, node, node_gpus)).vram_mib;
}

sched::SchedulableCapacity UnboundedSchedulableCapacity(const Gpu& gpu, const Pool& pool) {
  return sched::GpuSchedulableCapacity(ToTflops(gpu.milli_tflops), gpu.vram_mib, CapacitySpec(&pool));
}

}  // namespace tf::controller
