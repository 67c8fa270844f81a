#include "scheduler/fragmentation.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace tf::sched {

WorkloadMix::WorkloadMix(std::vector<WorkloadShape> shapes) {
  std::map<std::tuple<int, int64_t, int64_t, int64_t, uint64_t>, double> merged;
  for (const WorkloadShape& s : shapes) {
    if (s.weight <= 0) continue;
    merged[{s.gpu_count, s.gpu_count == 0 ? 0 : s.gpu_milli, s.cpu_milli, s.memory_mib, s.model_mask}] += s.weight;
  }
  double total = 0;
  for (auto& [k, w] : merged) total += w;
  for (auto& [k, w] : merged) {
    WorkloadShape s;
    std::tie(s.gpu_count, s.gpu_milli, s.cpu_milli, s.memory_mib, s.model_mask) = k;
    s.weight = w / total;
    shapes_.push_back(s);
  }
  std::stable_sort(shapes_.begin(), shapes_.end(),
                   [](const WorkloadShape& a, const WorkloadShape& b) { return a.gpu_milli < b.gpu_milli; });
}

WorkloadMix WorkloadMix::DemandWeighted() const {
  std::vector<WorkloadShape> out = shapes_;
  for (WorkloadShape& s : out) s.weight *= static_cast<double>(s.gpu_count) * static_cast<double>(s.gpu_milli);
  return WorkloadMix(std::move(out));
}

FragView MakeFragView(const NodeState& n) {
  FragView v;
  v.gpus = static_cast<int>(n.gpus.size());
  for (int i = 0; i < v.gpus; ++i) {
    const GpuState& g = n.gpus[static_cast<size_t>(i)];
    v.free_milli[i] = g.schedulable > 0 ? g.free_compute() * 1000 / g.schedulable : 0;
    v.model_id[i] = g.model_id;
  }
  if (n.TracksCpu()) v.cpu_free = n.cpu_capacity - n.cpu_used;
  if (n.TracksMem()) v.mem_free = n.mem_capacity - n.mem_used;
  return v;
}

int64_t IdleMilli(const FragView& v) {
  int64_t t = 0;
  for (int i = 0; i < v.gpus; ++i) t += v.free_milli[i];
  return t;
}

double NodeFragmentation(const FragView& v, const WorkloadMix& mix) {
  int64_t sorted[64];
  uint64_t models = 0;
  int64_t total = 0;
  for (int i = 0; i < v.gpus; ++i) {
    sorted[i] = v.free_milli[i];
    total += sorted[i];
    models |= uint64_t{1} << v.model_id[i];
  }
  if (total == 0) return 0;
  std::sort(sorted, sorted + v.gpus);
  double frag = 0;
  int p = 0;
  int64_t small = 0;  // idle milli on GPUs with less room than the current shape needs
  for (const WorkloadShape& s : mix.shapes()) {
    if (s.gpu_count == 0) {
      frag += s.weight * static_cast<double>(total);
      continue;
    }
    while (p < v.gpus && sorted[p] < s.gpu_milli) small += sorted[p++];
    bool host_ok = s.cpu_milli <= v.cpu_free && s.memory_mib <= v.mem_free && (models & s.model_mask) != 0;
    bool fits = host_ok && v.gpus - p >= s.gpu_count;
    frag += s.weight * static_cast<double>(fits ? small : total);
  }
  return frag;
}

double NodeStrandedGpu(const FragView& v, const WorkloadMix& mix) {
  uint64_t models = 0;
  int64_t total = 0;
  for (int i = 0; i < v.gpus; ++i) {
    total += v.free_milli[i];
    models |= uint64_t{1} << v.model_id[i];
  }
  if (total == 0) return 0;
  double frag = 0;
  int64_t last_milli = -1;
  int64_t slots = 0;  // copies of a one-GPU slice of size last_milli that the GPUs could take
  for (const WorkloadShape& s : mix.shapes()) {
    if (s.gpu_count == 0 || (models & s.model_mask) == 0 || s.memory_mib > v.mem_free) {
      frag += s.weight * static_cast<double>(total);
      continue;
    }
    if (s.gpu_milli != last_milli) {
      last_milli = s.gpu_milli;
      slots = 0;
      for (int i = 0; i < v.gpus; ++i) slots += v.free_milli[i] / s.gpu_milli;
    }
    int64_t copies = slots / s.gpu_count;
    if (s.cpu_milli > 0) copies = std::min(copies, v.cpu_free / s.cpu_milli);
    if (s.memory_mib > 0) copies = std::min(copies, v.mem_free / s.memory_mib);
    int64_t usable = std::min(total, copies * s.gpu_count * s.gpu_milli);
    frag += s.weight * static_cast<double>(total - usable);
  }
  return frag;
}

}  // namespace tf::sched
