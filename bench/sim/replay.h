// The experiments tfsim runs: the FGD static protocol, a dynamic replay on the trace's own
// creation/deletion times, and decision micro-benchmarks. Timing uses the wall clock of the
// simulator process only; the scheduler itself sees no clock.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/openb_trace.h"

namespace tf::sim {

struct StaticResult {
  double unallocated_at_100 = 0;   // % of cluster GPU capacity
  double unallocated_at_130 = 0;
  double frag_ratio_at_90 = 0;     // % of idle GPU that is fragmented (FGD measure)
  double first_failure_load = 0;   // arrived % at the first GPU pod that did not fit
  double gap_load = 0;             // arrived % when allocation first trails arrivals by > 1 point
  double wall_seconds = 0;
  int64_t pods = 0;
};

// FGD protocol: sample pods with replacement until GPU demand reaches 130% of capacity (seed),
// shuffle, place one at a time, no departures.
StatusOr<StaticResult> RunStatic(const std::vector<TraceNode>& nodes, const std::vector<TracePod>& pods,
                                 sched::PlacementMode mode, uint64_t seed,
                                 const sched::SchedulerOptions& options = {});

struct DynamicResult {
  double time_avg_allocation = 0;  // % of GPU capacity, averaged over the trace's time span
  int64_t placed = 0, never_placed = 0;
  // Queueing delay in seconds per QoS (index = sched::Qos), p50 and p99 over placed pods.
  double delay_p50[4] = {}, delay_p99[4] = {};
  int64_t count[4] = {};
};

// `compress` divides every arrival time (lifetimes are kept), raising the offered load: the raw
// trace keeps only ~0.2% of the cluster busy on average. Allocation is averaged over the arrival
// window [first arrival, last arrival].
StatusOr<DynamicResult> RunDynamic(const std::vector<TraceNode>& nodes, const std::vector<TracePod>& pods,
                                   sched::PlacementMode mode, double compress,
                                   const sched::SchedulerOptions& options = {});

struct MicroResult {
  int nodes = 0;
  int64_t decisions = 0;
  double decisions_per_second = 0;
  double p50_us = 0, p99_us = 0, max_us = 0;
};

// Steady-state churn at ~80% GPU allocation: place a sampled pod, release the oldest when above
// the target. Times Scheduler::Place + Commit per decision.
StatusOr<MicroResult> RunMicro(const std::vector<TraceNode>& nodes, const std::vector<TracePod>& pods,
                               sched::PlacementMode mode, int replicate_to, int64_t decisions,
                               const sched::SchedulerOptions& options = {});

}  // namespace tf::sim
