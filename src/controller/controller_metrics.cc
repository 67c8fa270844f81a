// The controller's Prometheus families: the pool's capacity and what is allocated of it (per pool,
// per GPU, per allocation's vGPU), placement outcomes, and the controller's own health. Names and
// labels: docs/operations.md, "Metrics".
#include <algorithm>
#include <map>
#include <string>

#include "controller/controller.h"

namespace tf::controller {

const char* PlacementResultName(PlacementResult r) {
  switch (r) {
    case PlacementResult::kPlaced: return "placed";
    case PlacementResult::kPlacedPreempting: return "placed_preempting";
    case PlacementResult::kNoCapacity: return "no_capacity";
    case PlacementResult::kQuota: return "quota";
    case PlacementResult::kInvalid: return "invalid";
  }
  return "invalid";
}

PlacementResult PlacementResultOf(const Status& refusal) {
  switch (refusal.code()) {
    case StatusCode::kOutOfMemory: return PlacementResult::kNoCapacity;
    case StatusCode::kResourceExhausted: return PlacementResult::kQuota;
    default: return PlacementResult::kInvalid;
  }
}

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

void Controller::WriteMetrics(prom::Exposition* out) const {
  using prom::Type;
  std::lock_guard<std::mutex> lock(mu_);
  prom::Exposition& o = *out;
  const bool leader = serving_ && (election_ == nullptr || election_->IsLeader());
  o.Family("tf_controller_leader", Type::kGauge, "1 when this replica leads and serves.");
  o.Sample("tf_controller_leader", {}, leader ? 1 : 0);

  size_t ready = 0, lost = 0;
  for (const auto& [n, node] : nodes_) (node.value.state == NodeState::kReady ? ready : lost)++;
  o.Family("tf_controller_nodes", Type::kGauge, "Registered nodes by state.");
  o.Sample("tf_controller_nodes", {{"state", "ready"}}, static_cast<double>(ready));
  o.Sample("tf_controller_nodes", {{"state", "lost"}}, static_cast<double>(lost));
  size_t cordoned = 0;
  for (const auto& [n, node] : nodes_) cordoned += node.value.cordoned ? 1 : 0;
  o.Family("tf_controller_nodes_cordoned", Type::kGauge, "Registered nodes cordoned (taking no new allocations).");
  o.Sample("tf_controller_nodes_cordoned", {}, static_cast<double>(cordoned));

  struct PoolSums {
    MilliTflops cap_milli = 0, used_milli = 0;  // exact sums
    double virtual_t = 0;
    double cap_v = 0, used_v = 0, virtual_v = 0;  // MiB
    size_t gpus = 0;
  };
  std::map<std::string, PoolSums> sums;
  for (const auto& [n, p] : pools_) sums[n];
  const std::map<std::string, size_t> per_node = GpusPerNodeLocked();
  for (const auto& [uuid, g] : gpus_) {
    PoolSums& s = sums[g.value.pool];
    double oversell = 1;
    const Pool* pool = nullptr;
    if (auto p = pools_.find(g.value.pool); p != pools_.end()) {
      oversell = p->second.value.tflops_oversell_ratio;
      pool = &p->second.value;
    }
    auto node = nodes_.find(g.value.node);
    s.cap_milli += g.value.milli_tflops;
    s.virtual_t += ToTflops(g.value.milli_tflops) * oversell;
    s.used_milli += g.value.used_milli_tflops;
    s.cap_v += static_cast<double>(g.value.vram_mib);
    s.virtual_v += static_cast<double>(SchedulableVramMib(g.value, pool, node == nodes_.end() ? nullptr : &node->second.value,
                                                          per_node.at(g.value.node)));
    s.used_v += static_cast<double>(g.value.used_vram_mib);
    s.gpus++;
  }
  auto per_pool = [&](const char* name, const char* help, auto get) {
    o.Family(name, Type::kGauge, help);
    for (const auto& [pool, s] : sums) o.Sample(name, {{"pool", pool}}, get(s));
  };
  per_pool("tf_pool_gpus", "Physical GPUs registered in the pool.", [](const PoolSums& s) { return double(s.gpus); });
  per_pool("tf_pool_capacity_tflops", "FP16 dense TFLOPS of the pool's physical GPUs.",
           [](const PoolSums& s) { return ToTflops(s.cap_milli); });
  per_pool("tf_pool_virtual_capacity_tflops",
           "TFLOPS the pool may hand out: physical capacity times the pool's oversell ratio.",
           [](const PoolSums& s) { return s.virtual_t; });
  per_pool("tf_pool_allocated_tflops", "TFLOPS requested by the pool's live allocations.",
           [](const PoolSums& s) { return ToTflops(s.used_milli); });
  per_pool("tf_pool_capacity_vram_bytes", "VRAM of the pool's physical GPUs, bytes.",
           [](const PoolSums& s) { return s.cap_v * kMiB; });
  per_pool("tf_pool_virtual_capacity_vram_bytes",
           "VRAM the pool may hand out, bytes: physical VRAM expanded by the pool's host and disk tiers, as far as each node's tier budgets allow.",
           [](const PoolSums& s) { return s.virtual_v * kMiB; });
  per_pool("tf_pool_allocated_vram_bytes", "VRAM of the pool's live allocations, bytes.",
           [](const PoolSums& s) { return s.used_v * kMiB; });

  o.Family("tf_gpu_allocated_tflops", Type::kGauge, "TFLOPS requested by the allocations on the GPU.");
  for (const auto& [uuid, g] : gpus_)
    o.Sample("tf_gpu_allocated_tflops", {{"pool", g.value.pool}, {"node", g.value.node}, {"gpu", uuid}},
             ToTflops(g.value.used_milli_tflops));
  o.Family("tf_gpu_allocated_vram_bytes", Type::kGauge, "VRAM of the allocations on the GPU, bytes.");
  for (const auto& [uuid, g] : gpus_)
    o.Sample("tf_gpu_allocated_vram_bytes", {{"pool", g.value.pool}, {"node", g.value.node}, {"gpu", uuid}},
             static_cast<double>(g.value.used_vram_mib) * kMiB);
  o.Family("tf_gpu_unpooled_tflops", Type::kGauge,
           "TFLOPS guaranteed on the GPU to vGPUs that are no allocation's (a tfusion run without a controller, "
           "an unbound worker session), as its node agent reports; placement counts them as used.");
  for (const auto& [uuid, g] : gpus_)
    o.Sample("tf_gpu_unpooled_tflops", {{"pool", g.value.pool}, {"node", g.value.node}, {"gpu", uuid}},
             ToTflops(g.value.unpooled_milli_tflops));
  o.Family("tf_gpu_unpooled_vram_bytes", Type::kGauge,
           "VRAM limits of the GPU's vGPUs that are no allocation's, bytes; placement counts them as used.");
  for (const auto& [uuid, g] : gpus_)
    o.Sample("tf_gpu_unpooled_vram_bytes", {{"pool", g.value.pool}, {"node", g.value.node}, {"gpu", uuid}},
             static_cast<double>(g.value.unpooled_vram_mib) * kMiB);

  // One sample per vGPU of each live allocation: what was asked, with who asked and where it went.
  auto per_vgpu = [&](const char* name, const char* help, auto get) {
    o.Family(name, Type::kGauge, help);
    for (const auto& [id, a] : allocations_) {
      for (const Vgpu& v : a.value.vgpus) {
        o.Sample(name,
                 {{"allocation", id}, {"pool", a.value.pool}, {"node", a.value.node}, {"gpu", v.gpu_uuid},
                  {"tenant", a.value.tenant}, {"qos", QosName(a.value.qos)}},
                 get(v));
      }
    }
  };
  per_vgpu("tf_allocation_request_tflops", "Compute request of the allocation's vGPU (guaranteed), TFLOPS.",
           [](const Vgpu& v) { return ToTflops(v.milli_tflops); });
  per_vgpu("tf_allocation_limit_tflops", "Compute limit of the allocation's vGPU (its ceiling), TFLOPS.",
           [](const Vgpu& v) { return ToTflops(std::max(v.milli_tflops_limit, v.milli_tflops)); });
  per_vgpu("tf_allocation_vram_bytes", "VRAM ceiling of the allocation's vGPU, bytes.",
           [](const Vgpu& v) { return static_cast<double>(v.vram_mib) * kMiB; });

  o.Family("tf_controller_allocations", Type::kGauge, "Live allocations.");
  o.Sample("tf_controller_allocations", {}, static_cast<double>(allocations_.size()));

  o.Family("tf_controller_placements_total", Type::kCounter,
           "Allocation requests the scheduler decided, by pool and result: placed, placed_preempting "
           "(after preempting lower-QoS allocations), no_capacity, quota, invalid.");
  for (const auto& [pool, s] : sums) {
    for (PlacementResult r : kPlacementResults) {
      auto it = counters_.placements.find({pool, r});
      o.Sample("tf_controller_placements_total", {{"pool", pool}, {"result", PlacementResultName(r)}},
               it == counters_.placements.end() ? 0.0 : static_cast<double>(it->second));
    }
  }
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    o.Family(name, Type::kCounter, help);
    o.Sample(name, {}, static_cast<double>(v));
  };
  counter("tf_controller_allocations_released_total", "Allocations released by request.",
          counters_.allocations_released);
  counter("tf_controller_allocations_preempted_total", "Allocations released to make room for a higher QoS.",
          counters_.allocations_preempted);
  counter("tf_controller_allocations_suspended_total",
          "Allocations with VRAM tiering suspended (kept, swapped out) to make room for a higher QoS.",
          counters_.allocations_suspended);
  counter("tf_controller_allocations_resumed_total", "Suspended allocations resumed once their GPUs had room.",
          counters_.allocations_resumed);
  counter("tf_controller_allocations_released_lost_node_total", "Allocations released because their node was lost.",
          counters_.allocations_released_lost_node);
  counter("tf_controller_allocations_lease_expired_total",
          "Allocations released because their lease expired (the command holding them stopped renewing).",
          counters_.allocations_lease_expired);
  counter("tf_controller_commit_conflicts_total", "Store transactions refused by a compare (CAS).",
          counters_.commit_conflicts);
  counter("tf_controller_nodes_marked_lost_total", "Times a node was marked lost.", counters_.nodes_marked_lost);
  counter("tf_controller_evictions_stopped_total", "Evictions whose processes the node agent reported stopped.",
          counters_.evictions_stopped);
  size_t stopping = 0;
  for (const auto& [id, e] : evictions_) stopping += e.value.state == EvictionState::kStopping;
  o.Family("tf_controller_evictions_stopping", Type::kGauge, "Taken-back allocations whose processes may still run.");
  o.Sample("tf_controller_evictions_stopping", {}, static_cast<double>(stopping));
  o.Family("tf_controller_call_stage_seconds", Type::kHistogram,
           "Where write calls spend their time: lock_wait and locked (allocate/release), durable_wait "
           "(waiting for the store batch's commit).");
  stage_times_.lock_wait.WriteTo(&o, "tf_controller_call_stage_seconds", {{"stage", "lock_wait"}});
  stage_times_.locked.WriteTo(&o, "tf_controller_call_stage_seconds", {{"stage", "locked"}});
  stage_times_.durable_wait.WriteTo(&o, "tf_controller_call_stage_seconds", {{"stage", "durable_wait"}});
}

std::string Controller::MetricsText() const {
  prom::Exposition e;
  WriteMetrics(&e);
  return e.Take();
}

}  // namespace tf::controller
