#include "scheduler/defrag.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace tf::sched {

StatusOr<DefragPlan> PlanDefrag(const Scheduler& scheduler, const std::string& pool_name,
                                const DefragOptions& options) {
  const ClusterState& live = scheduler.state();
  int pool = live.PoolIndex(pool_name);
  if (pool < 0) return NotFound("pool '" + pool_name + "' does not exist");
  if (!(options.max_node_fraction > 0 && options.max_node_fraction <= 1)) {
    return InvalidArgument("defrag max_node_fraction must be in (0, 1]");
  }
  DefragPlan plan;
  const auto& pool_nodes = live.pool_nodes(pool);
  const int budget = static_cast<int>(std::floor(options.max_node_fraction * static_cast<double>(pool_nodes.size())));
  if (budget < 2) return plan;  // a move touches a source and a target

  // Least used first: emptying them frees whole nodes for the cheapest moves.
  std::vector<NodeId> sources;
  for (NodeId id : pool_nodes) {
    const NodeState& n = live.node(id);
    if (n.schedulable && !n.allocations.empty()) sources.push_back(id);
  }
  std::sort(sources.begin(), sources.end(), [&](NodeId a, NodeId b) {
    const NodeState& x = live.node(a);
    const NodeState& y = live.node(b);
    if (x.used_sum != y.used_sum) return x.used_sum < y.used_sum;
    return a < b;
  });

  Scheduler scratch = scheduler;
  std::set<std::string> touched;
  for (NodeId src : sources) {
    const NodeState& n = scratch.state().node(src);
    if (touched.count(n.name) || n.allocations.empty()) continue;
    std::vector<Allocation> moving;
    bool movable = true;
    for (int slot : n.allocations) {
      const Allocation& a = scratch.state().allocations()[static_cast<size_t>(slot)];
      // A suspended allocation's data waits on this node: it resumes here or nowhere.
      if (a.request.qos > options.max_qos_moved || a.suspended) movable = false;
      moving.push_back(a);
    }
    if (!movable) continue;
    std::sort(moving.begin(), moving.end(), [](const Allocation& a, const Allocation& b) {
      return a.placement.compute_per_gpu * static_cast<int64_t>(a.placement.gpus.size()) >
             b.placement.compute_per_gpu * static_cast<int64_t>(b.placement.gpus.size());
    });
    const std::string src_name = n.name;
    (void)scratch.SetSchedulable(src_name, false);
    for (const Allocation& a : moving) (void)scratch.Release(a.request.id);
    std::vector<Placement> placed;
    std::set<std::string> targets;
    bool ok = true;
    for (const Allocation& a : moving) {
      StatusOr<Placement> p = scratch.Place(a.request, PlacementMode::kBestFit);
      if (!p.ok() || !scratch.Commit(a.request, *p).ok()) {
        ok = false;
        break;
      }
      targets.insert(p->node_name);
      placed.push_back(*p);
    }
    std::set<std::string> would = touched;
    would.insert(src_name);
    would.insert(targets.begin(), targets.end());
    if (!ok || static_cast<int>(would.size()) > budget) {
      for (const Placement& p : placed) (void)scratch.Release(p.request_id);
      (void)scratch.SetSchedulable(src_name, true);
      for (const Allocation& a : moving) (void)scratch.Commit(a.request, a.placement);
      continue;
    }
    touched = std::move(would);
    for (size_t i = 0; i < placed.size(); ++i) {
      plan.moves.push_back(DefragMove{moving[i].request.id, src_name, placed[i].node_name, placed[i].gpus});
    }
    plan.nodes_emptied.push_back(src_name);
  }
  plan.nodes_touched = static_cast<int>(touched.size());
  return plan;
}

}  // namespace tf::sched
