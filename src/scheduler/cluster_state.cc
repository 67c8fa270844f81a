#include "scheduler/cluster_state.h"

#include <algorithm>
#include <cmath>

namespace tf::sched {

SchedulableCapacity GpuSchedulableCapacity(double tflops, int64_t vram_mib, const PoolSpec& pool,
                                           TierBudgets budgets) {
  auto bounded = [](int64_t expand_mib, int64_t budget_mib) {
    return budget_mib < 0 ? expand_mib : std::min(expand_mib, budget_mib);
  };
  // Host and disk parts that add up to exactly VRAM x (host + disk) / 100 when nothing bounds them.
  const int64_t host = vram_mib * pool.vram_expand_to_host_percent / 100;
  const int64_t disk = vram_mib * (pool.vram_expand_to_host_percent + pool.vram_expand_to_disk_percent) / 100 - host;
  return {static_cast<MilliTflops>(std::floor(static_cast<double>(ToMilliTflops(tflops)) * pool.tflops_oversell_ratio)),
          vram_mib + bounded(host, budgets.host_mib) + bounded(disk, budgets.disk_mib)};
}

Status ClusterState::AddPool(const PoolSpec& pool) {
  if (pool.name.empty()) return InvalidArgument("pool name must not be empty");
  if (!std::isfinite(pool.tflops_oversell_ratio) || pool.tflops_oversell_ratio < 1.0) {
    return InvalidArgument("pool '" + pool.name + "': tflops oversell ratio must be >= 1");
  }
  if (pool.vram_expand_to_host_percent < 0 || pool.vram_expand_to_host_percent > 400 ||
      pool.vram_expand_to_disk_percent < 0 || pool.vram_expand_to_disk_percent > 400) {
    return InvalidArgument("pool '" + pool.name + "': VRAM expansion must be 0 to 400 percent");
  }
  if (PoolIndex(pool.name) >= 0) return AlreadyExists("pool '" + pool.name + "' already exists");
  pools_.push_back(pool);
  pool_nodes_.emplace_back();
  return Status::Ok();
}

Status ClusterState::AddNode(const NodeSpec& spec) {
  if (spec.name.empty()) return InvalidArgument("node name must not be empty");
  if (node_by_name_.count(spec.name)) return AlreadyExists("node '" + spec.name + "' already exists");
  int pool = PoolIndex(spec.pool);
  if (pool < 0) return NotFound("node '" + spec.name + "': pool '" + spec.pool + "' does not exist");
  if (spec.gpus.size() > 64) return InvalidArgument("node '" + spec.name + "': more than 64 GPUs");
  if (spec.cpu_milli < 0 || spec.memory_mib < 0) {
    return InvalidArgument("node '" + spec.name + "': negative CPU or memory");
  }
  NodeState n;
  n.name = spec.name;
  n.pool = pool;
  n.cpu_capacity = spec.cpu_milli;
  n.mem_capacity = spec.memory_mib;
  const PoolSpec& ps = pools_[static_cast<size_t>(pool)];
  for (size_t i = 0; i < spec.gpus.size(); ++i) {
    const GpuSpec& g = spec.gpus[i];
    if (!std::isfinite(g.tflops) || g.tflops <= 0 || g.vram_mib <= 0) {
      return InvalidArgument("node '" + spec.name + "' GPU " + std::to_string(i) +
                             ": TFLOPS and VRAM must be positive");
    }
    if (g.model.empty()) return InvalidArgument("node '" + spec.name + "': GPU model missing");
    int model = ModelId(g.model);
    if (model < 0) {
      if (models_.size() >= 64) return ResourceExhausted("more than 64 GPU models");
      models_.push_back(g.model);
      model = static_cast<int>(models_.size()) - 1;
    }
    GpuState s;
    s.model_id = model;
    s.capacity = ToMilliTflops(g.tflops);
    const SchedulableCapacity offered =
        GpuSchedulableCapacity(g.tflops, g.vram_mib, ps, {g.host_tier_budget_mib, g.disk_tier_budget_mib});
    s.schedulable = offered.compute;
    s.vram_capacity_mib = offered.vram_mib;
    s.numa_node = g.numa_node;
    s.nvlink_peers = g.nvlink_peers & ~(uint64_t{1} << i);
    n.gpus.push_back(s);
    n.model_mask |= uint64_t{1} << model;
  }
  Refresh(n);
  NodeId id = static_cast<NodeId>(nodes_.size());
  node_by_name_.emplace(spec.name, id);
  nodes_.push_back(std::move(n));
  pool_nodes_[static_cast<size_t>(pool)].push_back(id);
  return Status::Ok();
}

void ClusterState::Refresh(NodeState& n) {
  n.schedulable_sum = n.used_sum = n.max_free_compute = n.max_free_vram = 0;
  for (const GpuState& g : n.gpus) {
    n.schedulable_sum += g.schedulable;
    n.used_sum += g.used;
    n.max_free_compute = std::max(n.max_free_compute, g.free_compute());
    n.max_free_vram = std::max(n.max_free_vram, g.free_vram());
  }
  ++n.version;
}

int ClusterState::PoolIndex(std::string_view name) const {
  for (size_t i = 0; i < pools_.size(); ++i) {
    if (pools_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

NodeId ClusterState::NodeIndex(std::string_view name) const {
  auto it = node_by_name_.find(std::string(name));
  return it == node_by_name_.end() ? -1 : it->second;
}

int ClusterState::ModelId(std::string_view model) const {
  for (size_t i = 0; i < models_.size(); ++i) {
    if (models_[i] == model) return static_cast<int>(i);
  }
  return -1;
}

uint64_t ClusterState::ModelMask(const std::vector<std::string>& models) const {
  if (models.empty()) return ~uint64_t{0};
  uint64_t mask = 0;
  for (const std::string& m : models) {
    int id = ModelId(m);
    if (id >= 0) mask |= uint64_t{1} << id;
  }
  return mask;
}

MilliTflops ClusterState::ComputeNeed(const Request& r, const GpuState& g) {
  if (r.gpu_count == 0) return 0;
  if (r.compute_percent_request > 0) {
    return static_cast<MilliTflops>(std::ceil(static_cast<double>(g.capacity) * r.compute_percent_request / 100.0));
  }
  return ToMilliTflops(r.tflops_request);
}

const Allocation* ClusterState::FindAllocation(std::string_view request_id) const {
  auto it = alloc_by_id_.find(std::string(request_id));
  return it == alloc_by_id_.end() ? nullptr : &allocs_[static_cast<size_t>(it->second)];
}

void ClusterState::Apply(Allocation& a, int sign) {
  NodeState& n = nodes_[static_cast<size_t>(a.placement.node)];
  for (int gi : a.placement.gpus) {
    GpuState& g = n.gpus[static_cast<size_t>(gi)];
    g.used += sign * a.placement.compute_per_gpu;
    g.vram_used_mib += sign * a.placement.vram_per_gpu_mib;
    g.allocations += sign;
  }
  n.cpu_used += sign * a.host_cpu;
  n.mem_used += sign * a.host_mem;
  Refresh(n);
}

Status ClusterState::Commit(const Request& request, const Placement& p) { return Place(request, p, true); }

Status ClusterState::CommitSuspended(const Request& request, const Placement& p) { return Place(request, p, false); }

Status ClusterState::Place(const Request& request, const Placement& p, bool count) {
  if (alloc_by_id_.count(request.id)) return AlreadyExists("request '" + request.id + "' is already placed");
  if (p.node < 0 || static_cast<size_t>(p.node) >= nodes_.size()) {
    return InvalidArgument("placement for '" + request.id + "' names no node");
  }
  NodeState& n = nodes_[static_cast<size_t>(p.node)];
  if (!n.schedulable) return FailedPrecondition("node '" + n.name + "' is not schedulable");
  if (static_cast<int>(p.gpus.size()) != request.gpu_count) {
    return InvalidArgument("placement for '" + request.id + "' has the wrong GPU count");
  }
  Allocation a;
  a.request = request;
  a.placement = p;
  a.live = true;
  for (int gi : p.gpus) {
    if (gi < 0 || static_cast<size_t>(gi) >= n.gpus.size() || (a.gpu_mask >> gi) & 1) {
      return InvalidArgument("placement for '" + request.id + "' names a bad GPU index");
    }
    a.gpu_mask |= uint64_t{1} << gi;
    const GpuState& g = n.gpus[static_cast<size_t>(gi)];
    if (count && (g.free_compute() < p.compute_per_gpu || g.free_vram() < p.vram_per_gpu_mib)) {
      return FailedPrecondition("placement for '" + request.id + "' no longer fits GPU " +
                                std::to_string(gi) + " of node '" + n.name + "'");
    }
  }
  if (!request.remote) {
    a.host_cpu = request.cpu_milli;
    a.host_mem = request.memory_mib;
    if (count && ((n.TracksCpu() && n.cpu_used + a.host_cpu > n.cpu_capacity) ||
                  (n.TracksMem() && n.mem_used + a.host_mem > n.mem_capacity))) {
      return FailedPrecondition("placement for '" + request.id + "' exceeds host CPU or memory of '" + n.name + "'");
    }
  }
  int slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
    allocs_[static_cast<size_t>(slot)] = std::move(a);
  } else {
    slot = static_cast<int>(allocs_.size());
    allocs_.push_back(std::move(a));
  }
  Allocation& stored = allocs_[static_cast<size_t>(slot)];
  alloc_by_id_.emplace(request.id, slot);
  n.allocations.push_back(slot);
  for (int gi : stored.placement.gpus) ++n.gpus[static_cast<size_t>(gi)].vgpus;
  if (count) {
    Apply(stored, +1);
  } else {
    stored.suspended = true;
    ++n.version;
  }
  return Status::Ok();
}

StatusOr<Request> ClusterState::Release(std::string_view request_id) {
  auto it = alloc_by_id_.find(std::string(request_id));
  if (it == alloc_by_id_.end()) return NotFound("no allocation for request '" + std::string(request_id) + "'");
  int slot = it->second;
  Allocation& a = allocs_[static_cast<size_t>(slot)];
  if (!a.suspended) Apply(a, -1);
  NodeState& n = nodes_[static_cast<size_t>(a.placement.node)];
  n.allocations.erase(std::find(n.allocations.begin(), n.allocations.end(), slot));
  for (int gi : a.placement.gpus) --n.gpus[static_cast<size_t>(gi)].vgpus;
  ++n.version;
  a.live = false;
  a.suspended = false;
  alloc_by_id_.erase(it);
  free_slots_.push_back(slot);
  return std::move(a.request);
}

Status ClusterState::Suspend(std::string_view request_id) {
  auto it = alloc_by_id_.find(std::string(request_id));
  if (it == alloc_by_id_.end()) return NotFound("no allocation for request '" + std::string(request_id) + "'");
  Allocation& a = allocs_[static_cast<size_t>(it->second)];
  if (a.suspended) return FailedPrecondition("request '" + a.request.id + "' is suspended already");
  Apply(a, -1);
  a.suspended = true;
  return Status::Ok();
}

Status ClusterState::Resume(std::string_view request_id) {
  auto it = alloc_by_id_.find(std::string(request_id));
  if (it == alloc_by_id_.end()) return NotFound("no allocation for request '" + std::string(request_id) + "'");
  Allocation& a = allocs_[static_cast<size_t>(it->second)];
  if (!a.suspended) return Status::Ok();
  const NodeState& n = nodes_[static_cast<size_t>(a.placement.node)];
  if (!n.schedulable) return FailedPrecondition("node '" + n.name + "' is not schedulable");
  for (int gi : a.placement.gpus) {
    const GpuState& g = n.gpus[static_cast<size_t>(gi)];
    if (g.free_compute() < a.placement.compute_per_gpu || g.free_vram() < a.placement.vram_per_gpu_mib) {
      return FailedPrecondition("request '" + a.request.id + "': GPU " + std::to_string(gi) + " of node '" +
                                n.name + "' has no room for it yet");
    }
  }
  if ((n.TracksCpu() && n.cpu_used + a.host_cpu > n.cpu_capacity) ||
      (n.TracksMem() && n.mem_used + a.host_mem > n.mem_capacity)) {
    return FailedPrecondition("request '" + a.request.id + "': node '" + n.name + "' has no host CPU or memory for it yet");
  }
  a.suspended = false;
  Apply(a, +1);
  return Status::Ok();
}

StatusOr<std::vector<Request>> ClusterState::FailNode(std::string_view name) {
  NodeId id = NodeIndex(name);
  if (id < 0) return NotFound("node '" + std::string(name) + "' does not exist");
  std::vector<int> slots = nodes_[static_cast<size_t>(id)].allocations;
  std::vector<Request> displaced;
  for (int slot : slots) {
    StatusOr<Request> r = Release(allocs_[static_cast<size_t>(slot)].request.id);
    if (r.ok()) displaced.push_back(std::move(r).value());
  }
  NodeState& n = nodes_[static_cast<size_t>(id)];
  n.schedulable = false;
  ++n.version;
  return displaced;
}

Status ClusterState::SetSchedulable(std::string_view name, bool schedulable) {
  NodeId id = NodeIndex(name);
  if (id < 0) return NotFound("node '" + std::string(name) + "' does not exist");
  NodeState& n = nodes_[static_cast<size_t>(id)];
  n.schedulable = schedulable;
  ++n.version;
  return Status::Ok();
}

MilliTflops ClusterState::TotalCapacity() const {
  MilliTflops t = 0;
  for (const NodeState& n : nodes_) {
    if (n.schedulable) {
      for (const GpuState& g : n.gpus) t += g.capacity;
    }
  }
  return t;
}

MilliTflops ClusterState::TotalUsed() const {
  MilliTflops t = 0;
  for (const NodeState& n : nodes_) {
    if (n.schedulable) t += n.used_sum;
  }
  return t;
}

}  // namespace tf::sched
