// Defragmentation planner: proposes moves that empty lightly used nodes by re-placing their
// workloads, packed, on other nodes of the same pool.
//
// Rules (after KAI's consolidation and Karpenter's disruption budget): a node's workloads are
// moved all together or not at all, so no move is proposed for a workload that has nowhere to go;
// at most `max_node_fraction` of the pool's nodes are touched (sources and targets together) by one
// plan; workloads above `max_qos_moved` are never moved. Planning runs on a copy of the scheduler
// and changes nothing; the caller migrates and then commits (or simply re-plans).
#pragma once

#include <string>
#include <vector>

#include "scheduler/scheduler.h"

namespace tf::sched {

struct DefragOptions {
  double max_node_fraction = 0.1;  // of the pool's nodes, sources plus targets
  Qos max_qos_moved = Qos::kHigh;  // critical workloads stay put
};

struct DefragMove {
  std::string request_id;
  std::string from_node;
  std::string to_node;
  std::vector<int> to_gpus;
};

struct DefragPlan {
  std::vector<DefragMove> moves;
  std::vector<std::string> nodes_emptied;
  int nodes_touched = 0;
};

// kNotFound for an unknown pool; an empty plan when nothing can be emptied within the budget.
StatusOr<DefragPlan> PlanDefrag(const Scheduler& scheduler, const std::string& pool, const DefragOptions& options);

}  // namespace tf::sched
