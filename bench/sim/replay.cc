#include "sim/replay.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <random>

#include "scheduler/scheduler.h"
#include "scheduler/workload_queue.h"

namespace tf::sim {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

bool Placeable(const TracePod& p) { return p.num_gpu > 0 || p.cpu_milli > 0; }

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  size_t i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<long>(i), v.end());
  return v[i];
}

std::vector<const TracePod*> Sample(const std::vector<TracePod>& pods, int64_t target_milli, uint64_t seed) {
  std::vector<const TracePod*> valid;
  for (const TracePod& p : pods) {
    if (Placeable(p)) valid.push_back(&p);
  }
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, valid.size() - 1);
  std::vector<const TracePod*> out;
  int64_t demand = 0;
  while (demand < target_milli && !valid.empty()) {
    const TracePod* p = valid[pick(rng)];
    out.push_back(p);
    demand += p->gpu_demand();
  }
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

}  // namespace

StatusOr<StaticResult> RunStatic(const std::vector<TraceNode>& nodes, const std::vector<TracePod>& pods,
                                 sched::PlacementMode mode, uint64_t seed,
                                 const sched::SchedulerOptions& options) {
  sched::Scheduler s(options);
  TF_RETURN_IF_ERROR(BuildCluster(nodes, pods, mode, &s));
  const double total = static_cast<double>(s.state().TotalCapacity()) / 1000.0;  // milli-GPU
  std::vector<const TracePod*> order = Sample(pods, static_cast<int64_t>(1.3 * total), seed);

  StaticResult res;
  res.pods = static_cast<int64_t>(order.size());
  double arrived = 0, allocated = 0;
  bool at90 = false, at100 = false, failed = false, gapped = false;
  auto start = Clock::now();
  for (size_t i = 0; i < order.size(); ++i) {
    const TracePod& p = *order[i];
    arrived += static_cast<double>(p.gpu_demand());
    sched::Request r = ToRequest(p, std::to_string(i));
    StatusOr<sched::Placement> placed = s.Schedule(r);
    if (placed.ok()) {
      allocated += static_cast<double>(p.gpu_demand());
    } else if (p.gpu_demand() > 0 && !failed) {
      failed = true;
      res.first_failure_load = 100.0 * arrived / total;
    }
    if (!gapped && allocated < arrived - 0.01 * total) {
      gapped = true;
      res.gap_load = 100.0 * arrived / total;
    }
    if (!at90 && arrived >= 0.9 * total) {
      at90 = true;
      int64_t idle = s.ClusterIdleMilli();
      res.frag_ratio_at_90 = idle > 0 ? 100.0 * s.ClusterFragmentation() / static_cast<double>(idle) : 0;
    }
    if (!at100 && arrived >= total) {
      at100 = true;
      res.unallocated_at_100 = 100.0 - 100.0 * allocated / total;
    }
  }
  res.wall_seconds = Seconds(start, Clock::now());
  res.unallocated_at_130 = 100.0 - 100.0 * allocated / total;
  if (!failed) res.first_failure_load = 100.0 * arrived / total;
  if (!gapped) res.gap_load = 100.0 * arrived / total;
  return res;
}

StatusOr<DynamicResult> RunDynamic(const std::vector<TraceNode>& nodes, const std::vector<TracePod>& pods,
                                   sched::PlacementMode mode, double compress,
                                   const sched::SchedulerOptions& options) {
  sched::Scheduler s(options);
  TF_RETURN_IF_ERROR(BuildCluster(nodes, pods, mode, &s));
  sched::WorkloadQueue queue(&s, /*allow_preemption=*/false);
  struct Event {
    int64_t t;
    int kind;  // 0 = deletion (first at equal times), 1 = creation
    size_t pod;
  };
  std::vector<Event> events;
  std::vector<int64_t> arrival(pods.size(), 0);
  int64_t first_arrival = INT64_MAX, last_arrival = 0;
  for (size_t i = 0; i < pods.size(); ++i) {
    if (!Placeable(pods[i]) || pods[i].deletion_time <= pods[i].creation_time) continue;
    arrival[i] = static_cast<int64_t>(static_cast<double>(pods[i].creation_time) / compress);
    first_arrival = std::min(first_arrival, arrival[i]);
    last_arrival = std::max(last_arrival, arrival[i]);
    events.push_back({arrival[i], 1, i});
    events.push_back({arrival[i] + pods[i].deletion_time - pods[i].creation_time, 0, i});
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.t != b.t ? a.t < b.t : (a.kind != b.kind ? a.kind < b.kind : a.pod < b.pod);
  });
  const double total = static_cast<double>(s.state().TotalCapacity()) / 1000.0;
  std::vector<double> delays[4];
  std::vector<char> placed(pods.size(), 0);
  DynamicResult res;
  double area = 0, used = 0;
  int64_t prev_t = events.empty() ? 0 : events.front().t;
  prev_t = first_arrival;
  for (const Event& e : events) {
    if (e.t > first_arrival) {
      int64_t until = std::min(e.t, last_arrival);
      if (until > prev_t) area += used * static_cast<double>(until - prev_t);
      prev_t = std::max(prev_t, until);
    }
    const TracePod& p = pods[e.pod];
    std::string id = std::to_string(e.pod);
    if (e.kind == 1) {
      TF_RETURN_IF_ERROR(queue.Submit(ToRequest(p, id)));
    } else {
      if (placed[e.pod]) used -= static_cast<double>(p.gpu_demand());
      queue.Release(id);
    }
    for (const sched::QueueEvent& qe : queue.TakeEvents()) {
      if (qe.kind != sched::QueueEvent::Kind::kPlaced) continue;
      size_t idx = std::stoul(qe.request_id);
      placed[idx] = 1;
      used += static_cast<double>(pods[idx].gpu_demand());
      delays[static_cast<int>(ToQos(pods[idx].qos))].push_back(static_cast<double>(e.t - arrival[idx]));
    }
  }
  const double span = static_cast<double>(last_arrival - first_arrival);
  res.time_avg_allocation = span > 0 ? 100.0 * area / span / total : 0;
  for (int q = 0; q < 4; ++q) {
    res.count[q] = static_cast<int64_t>(delays[q].size());
    res.placed += res.count[q];
    res.delay_p50[q] = Percentile(delays[q], 0.5);
    res.delay_p99[q] = Percentile(delays[q], 0.99);
  }
  res.never_placed = static_cast<int64_t>(events.size() / 2) - res.placed;
  return res;
}

StatusOr<MicroResult> RunMicro(const std::vector<TraceNode>& nodes, const std::vector<TracePod>& pods,
                               sched::PlacementMode mode, int replicate_to, int64_t decisions,
                               const sched::SchedulerOptions& options) {
  sched::Scheduler s(options);
  TF_RETURN_IF_ERROR(BuildCluster(nodes, pods, mode, &s, replicate_to));
  const int64_t total = s.state().TotalCapacity() / 1000;
  std::vector<const TracePod*> stream = Sample(pods, INT64_MAX / 4 > 0 ? total * 40 : 0, 7);
  std::deque<std::pair<std::string, int64_t>> live;
  int64_t used = 0;
  std::vector<double> lat;
  lat.reserve(static_cast<size_t>(decisions));
  size_t next = 0;
  int64_t id = 0;
  // Fill to the target first (not timed), then churn.
  const int64_t target = total * 8 / 10;
  auto step = [&](bool timed) {
    const TracePod& p = *stream[next++ % stream.size()];
    sched::Request r = ToRequest(p, std::to_string(id++));
    auto t0 = Clock::now();
    StatusOr<sched::Placement> pl = s.Schedule(r);
    auto t1 = Clock::now();
    if (timed) lat.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if (pl.ok()) {
      live.emplace_back(r.id, p.gpu_demand());
      used += p.gpu_demand();
    }
    while (used > target && !live.empty()) {
      (void)s.Release(live.front().first);
      used -= live.front().second;
      live.pop_front();
    }
  };
  for (int64_t i = 0; i < 200000 && used < target - 2000; ++i) step(false);
  auto start = Clock::now();
  for (int64_t i = 0; i < decisions; ++i) step(true);
  double wall = Seconds(start, Clock::now());
  MicroResult m;
  m.nodes = static_cast<int>(s.state().nodes().size());
  m.decisions = decisions;
  double sum = 0;
  for (double v : lat) sum += v;
  m.decisions_per_second = sum > 0 ? static_cast<double>(decisions) / (sum / 1e6) : 0;
  (void)wall;
  m.p50_us = Percentile(lat, 0.5);
  m.p99_us = Percentile(lat, 0.99);
  m.max_us = lat.empty() ? 0 : *std::max_element(lat.begin(), lat.end());
  return m;
}

}  // namespace tf::sim
