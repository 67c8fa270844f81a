#include "scheduler/scheduler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>

namespace tf::sched {
namespace {

bool PacksGpus(PlacementMode m) {
  return m != PlacementMode::kLowLoadFirst && m != PlacementMode::kNodeCompactGpuLowLoad;
}
bool MeasuresFragmentation(PlacementMode m) {
  return m == PlacementMode::kFgd || m == PlacementMode::kFragAware;
}

// Recomputes the aggregates of a scratch copy of a node (preemption trials).
void RefreshScratch(NodeState& n) {
  n.used_sum = n.max_free_compute = n.max_free_vram = 0;
  for (const GpuState& g : n.gpus) {
    n.used_sum += g.used;
    n.max_free_compute = std::max(n.max_free_compute, g.free_compute());
    n.max_free_vram = std::max(n.max_free_vram, g.free_vram());
  }
}

void RemoveFromScratch(NodeState& n, const Allocation& a) {
  for (int gi : a.placement.gpus) {
    GpuState& g = n.gpus[static_cast<size_t>(gi)];
    g.used -= a.placement.compute_per_gpu;
    g.vram_used_mib -= a.placement.vram_per_gpu_mib;
    if (!a.request.suspendable) --g.vgpus;  // a suspended victim keeps its vGPU on the node
  }
  n.cpu_used -= a.host_cpu;
  n.mem_used -= a.host_mem;
  RefreshScratch(n);
}

}  // namespace

size_t Scheduler::ShapeKeyHash::operator()(const ShapeKey& k) const {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; h ^= h >> 29; };
  mix(static_cast<uint64_t>(k.pool));
  mix(static_cast<uint64_t>(k.mode));
  mix(static_cast<uint64_t>(k.tflops));
  mix(static_cast<uint64_t>(k.percent_milli));
  mix(static_cast<uint64_t>(k.vram));
  mix(static_cast<uint64_t>(k.count));
  mix(static_cast<uint64_t>(k.cpu));
  mix(static_cast<uint64_t>(k.mem));
  mix(k.models);
  return static_cast<size_t>(h);
}

Scheduler::Scheduler(SchedulerOptions options) : options_(options) {
  if (options_.cache_shapes < 1) options_.cache_shapes = 1;
  rng_state_ = options_.tie_break_seed;
}

void Scheduler::SetWorkloadMix(WorkloadMix mix) {
  demand_mix_ = mix.DemandWeighted();
  mix_ = std::move(mix);
  ++mix_generation_;
  for (uint32_t& g : slot_generation_) ++g;
}

void Scheduler::SetTenantQuota(const std::string& tenant, TenantQuota quota) { quotas_[tenant] = quota; }

const TenantQuota* Scheduler::quota(const std::string& tenant) const {
  auto it = quotas_.find(tenant);
  return it == quotas_.end() ? nullptr : &it->second;
}

Scheduler::TenantUsage Scheduler::usage(const std::string& tenant) const {
  auto it = usage_.find(tenant);
  return it == usage_.end() ? TenantUsage{} : it->second;
}

int Scheduler::CacheSlot(const ShapeKey& key) const {
  auto it = slot_of_.find(key);
  if (it != slot_of_.end()) return it->second;
  int slot;
  if (static_cast<int>(key_of_slot_.size()) < options_.cache_shapes) {
    slot = static_cast<int>(key_of_slot_.size());
    key_of_slot_.push_back(key);
    slot_generation_.push_back(1);
  } else {
    slot = next_victim_slot_;
    next_victim_slot_ = (next_victim_slot_ + 1) % options_.cache_shapes;
    slot_of_.erase(key_of_slot_[static_cast<size_t>(slot)]);
    key_of_slot_[static_cast<size_t>(slot)] = key;
    ++slot_generation_[static_cast<size_t>(slot)];
  }
  slot_of_.emplace(key, slot);
  return slot;
}

double Scheduler::Measure(const FragView& v, const WorkloadMix& mix, bool ours) const {
  if (!ours || !options_.frag_aware_stranded_measure) return NodeFragmentation(v, mix);
  const double blend = options_.frag_aware_fgd_blend;
  double stranded = NodeStrandedGpu(v, mix);
  return blend > 0 ? blend * NodeFragmentation(v, mix) + (1 - blend) * stranded : stranded;
}

double Scheduler::FragBefore(NodeId id, const NodeState& n, const WorkloadMix& mix, bool ours) const {
  int which = ours ? 1 : 0;
  if (id < 0) return Measure(MakeFragView(n), mix, ours);
  size_t i = static_cast<size_t>(id);
  if (frag_value_[which].size() != state_.nodes().size()) {
    frag_value_[which].assign(state_.nodes().size(), 0);
    frag_version_[which].assign(state_.nodes().size(), 0);
    frag_generation_[which].assign(state_.nodes().size(), 0);
  }
  if (frag_version_[which][i] != n.version || frag_generation_[which][i] != mix_generation_) {
    frag_value_[which][i] = Measure(MakeFragView(n), mix, ours);
    frag_version_[which][i] = n.version;
    frag_generation_[which][i] = mix_generation_;
  }
  return frag_value_[which][i];
}

// Scores one node for a request. Higher is better; the GPU choice is part of the result.
Scheduler::Evaluation Scheduler::Evaluate(const NodeState& n, const Request& r, uint64_t mm,
                                          PlacementMode mode, NodeId id) const {
  Evaluation e;
  if (!n.schedulable) return e;
  if (!r.remote) {
    if (n.TracksCpu() && n.cpu_capacity - n.cpu_used < r.cpu_milli) return e;
    if (n.TracksMem() && n.mem_capacity - n.mem_used < r.memory_mib) return e;
  }
  const int k = r.gpu_count;
  const int ng = static_cast<int>(n.gpus.size());
  if (k > ng) return e;
  const bool pct = r.compute_percent_request > 0;
  const MilliTflops fixed = pct ? 0 : ToMilliTflops(r.tflops_request);
  if (k > 0) {
    if ((n.model_mask & mm) == 0) return e;
    if (!pct && fixed > n.max_free_compute) return e;
    if (r.vram_request_mib > n.max_free_vram) return e;
  }
  int cand[64];
  MilliTflops need[64];
  int nc = 0;
  if (k > 0) {
    for (int i = 0; i < ng; ++i) {
      const GpuState& g = n.gpus[static_cast<size_t>(i)];
      if (((mm >> g.model_id) & 1) == 0) continue;
      MilliTflops want = pct ? ClusterState::ComputeNeed(r, g) : fixed;
      if (g.free_compute() >= want && g.free_vram() >= r.vram_request_mib && g.vgpus < kMaxVgpusPerGpu) {
        need[i] = want;
        cand[nc++] = i;
      }
    }
    if (nc < k) return e;
    const bool pack = PacksGpus(mode);
    std::sort(cand, cand + nc, [&](int a, int b) {
      MilliTflops la = n.gpus[static_cast<size_t>(a)].free_compute() - need[a];
      MilliTflops lb = n.gpus[static_cast<size_t>(b)].free_compute() - need[b];
      if (la != lb) return pack ? la < lb : la > lb;
      return a < b;
    });
  }

  const bool frag = MeasuresFragmentation(mode);
  const bool ours = mode == PlacementMode::kFragAware;
  const bool demand = ours && options_.frag_aware_demand_weighted;
  WorkloadMix self_mix;
  const WorkloadMix* mix = demand ? &demand_mix_ : &mix_;
  if (frag && mix->empty()) {
    WorkloadShape s;
    s.gpu_count = k;
    s.gpu_milli = k > 0 && n.gpus[static_cast<size_t>(cand[0])].schedulable > 0
                      ? std::max<int64_t>(1, need[cand[0]] * 1000 / n.gpus[static_cast<size_t>(cand[0])].schedulable)
                      : 0;
    s.cpu_milli = r.remote ? 0 : r.cpu_milli;
    s.memory_mib = r.remote ? 0 : r.memory_mib;
    // With no configured mix (the controller has none), the later demand is unknown: besides
    // copies of this request, count whole GPUs and a whole node of this one's size as demand
    // too, so that a slice packs onto a GPU already broken rather than break a whole one, and onto
    // a small node rather than break a large one (scored against copies of itself only, FGD and
    // FragAware spread small slices over empty GPUs of large nodes, and whole-node jobs that a
    // careful packing left room for were refused).
    std::vector<WorkloadShape> shapes = {s};
    if (k > 0) {
      WorkloadShape whole_gpu;
      whole_gpu.gpu_count = 1;
      whole_gpu.gpu_milli = 1000;
      shapes.push_back(whole_gpu);
      if (ng > 1) {
        WorkloadShape whole_node = whole_gpu;
        whole_node.gpu_count = ng;
        shapes.push_back(whole_node);
      }
    }
    self_mix = WorkloadMix(std::move(shapes));
    mix = &self_mix;
    id = -1;  // the per-node cache holds the configured mix only
  }

  uint64_t chosen = 0;
  int topology = 0;
  double frag_delta = 0;
  FragView view;
  if (frag) {
    view = MakeFragView(n);
    if (!r.remote) {
      if (n.TracksCpu()) view.cpu_free -= r.cpu_milli;
      if (n.TracksMem()) view.mem_free -= r.memory_mib;
    }
  }
  auto after_milli = [&](int gi) {
    const GpuState& g = n.gpus[static_cast<size_t>(gi)];
    return g.schedulable > 0 ? (g.free_compute() - need[gi]) * 1000 / g.schedulable : 0;
  };

  if (k == 1 && frag) {
    // The GPU inside the node is chosen by the same fragmentation rule as the node.
    double before = FragBefore(id, n, *mix, ours);
    double best = 0;
    int best_gpu = -1;
    int64_t seen_free[64];
    int seen_model[64];
    int ns = 0;
    for (int c = 0; c < nc; ++c) {
      int gi = cand[c];
      int64_t f = view.free_milli[gi];
      bool dup = false;
      for (int s = 0; s < ns && !dup; ++s) dup = seen_free[s] == f && seen_model[s] == view.model_id[gi];
      if (dup) continue;
      seen_free[ns] = f;
      seen_model[ns++] = view.model_id[gi];
      view.free_milli[gi] = after_milli(gi);
      double d = Measure(view, *mix, ours) - before;
      view.free_milli[gi] = f;
      if (best_gpu < 0 || d < best) {
        best = d;
        best_gpu = gi;
      }
    }
    chosen = uint64_t{1} << best_gpu;
    frag_delta = best;
  } else if (k > 0) {
    // Multi-GPU: prefer a set of mutual NVLink peers, then one NUMA node, then any k, each in
    // the mode's GPU order.
    for (int s = 0; s < nc && !chosen; ++s) {
      uint64_t set = uint64_t{1} << cand[s];
      int size = 1;
      for (int c = 0; c < nc && size < k; ++c) {
        int gi = cand[c];
        if (gi == cand[s]) continue;
        if ((n.gpus[static_cast<size_t>(gi)].nvlink_peers & set) == set) {
          set |= uint64_t{1} << gi;
          ++size;
        }
      }
      if (size == k) {
        chosen = set;
        topology = 2;
      }
    }
    for (int s = 0; s < nc && !chosen; ++s) {
      int numa = n.gpus[static_cast<size_t>(cand[s])].numa_node;
      uint64_t set = 0;
      int size = 0;
      for (int c = 0; c < nc && size < k; ++c) {
        if (n.gpus[static_cast<size_t>(cand[c])].numa_node == numa) {
          set |= uint64_t{1} << cand[c];
          ++size;
        }
      }
      if (size == k) {
        chosen = set;
        topology = 1;
      }
    }
    if (!chosen) {
      for (int c = 0; c < k; ++c) chosen |= uint64_t{1} << cand[c];
    }
    if (frag) {
      double before = FragBefore(id, n, *mix, ours);
      for (uint64_t m = chosen; m; m &= m - 1) {
        int gi = std::countr_zero(m);
        view.free_milli[gi] = after_milli(gi);
      }
      frag_delta = Measure(view, *mix, ours) - before;
    }
  } else if (frag) {
    frag_delta = Measure(view, *mix, ours) - FragBefore(id, n, *mix, ours);
  }

  MilliTflops add = 0;
  for (uint64_t m = chosen; m; m &= m - 1) add += need[std::countr_zero(m)];
  const double cap = static_cast<double>(n.schedulable_sum);
  const double util_before = cap > 0 ? static_cast<double>(n.used_sum) / cap : 0;
  const double util_after = cap > 0 ? static_cast<double>(n.used_sum + add) / cap : 0;
  double score = 0;
  switch (mode) {
    case PlacementMode::kCompactFirst: score = util_after; break;
    case PlacementMode::kLowLoadFirst: score = -util_after; break;
    case PlacementMode::kNodeCompactGpuLowLoad: score = util_before; break;
    case PlacementMode::kBestFit: {
      double gpu_left = cap > 0 ? 1.0 - util_after : 0;
      double cpu_left = 0;
      if (n.TracksCpu()) {
        int64_t cpu = r.remote ? 0 : r.cpu_milli;
        cpu_left = static_cast<double>(n.cpu_capacity - n.cpu_used - cpu) / static_cast<double>(n.cpu_capacity);
      }
      score = -(gpu_left + options_.best_fit_cpu_weight * cpu_left);
      if (options_.k8s_integer_scores) {
        score = std::floor(100.0 * (1.0 + score / (1.0 + options_.best_fit_cpu_weight)));
      }
      break;
    }
    case PlacementMode::kFgd:
      score = options_.k8s_integer_scores ? std::floor(100.0 / (1.0 + std::exp(frag_delta / 1000.0))) : -frag_delta;
      break;
    case PlacementMode::kFragAware: {
      // Coarse fragmentation delta first (differences below one quantum are noise of a myopic
      // estimate), then pack: least idle GPU left on the node, then least host CPU left.
      double q = options_.frag_aware_quantum_milli;
      double bucket = q > 0 ? std::floor(frag_delta / q) : frag_delta;
      int64_t idle_after = 0;
      for (int i = 0; i < ng; ++i) idle_after += view.free_milli[i];
      double cpu_left = 0;
      if (n.TracksCpu()) {
        cpu_left = static_cast<double>(view.cpu_free) / static_cast<double>(n.cpu_capacity);
      }
      score = -bucket * 1e6 - options_.frag_aware_leftover_weight * static_cast<double>(idle_after) -
              options_.frag_aware_cpu_weight * cpu_left;
      break;
    }
  }
  e.fits = true;
  e.score = score + topology * 1e12;
  e.gpus = chosen;
  return e;
}

StatusOr<PlacementMode> Scheduler::ModeFor(const Request& r, int* pool) const {
  if (r.pool.empty()) {
    if (state_.pools().size() != 1) {
      return InvalidArgument("request '" + r.id + "' names no pool and the cluster has " +
                             std::to_string(state_.pools().size()) + " pools");
    }
    *pool = 0;
  } else {
    *pool = state_.PoolIndex(r.pool);
    if (*pool < 0) return NotFound("request '" + r.id + "': pool '" + r.pool + "' does not exist");
  }
  return state_.pools()[static_cast<size_t>(*pool)].mode;
}

StatusOr<Placement> Scheduler::Place(const Request& r) const {
  int pool = 0;
  StatusOr<PlacementMode> mode = ModeFor(r, &pool);
  if (!mode.ok()) return mode.status();
  return PlaceIn(r, pool, *mode);
}

StatusOr<Placement> Scheduler::Place(const Request& r, PlacementMode mode) const {
  int pool = 0;
  StatusOr<PlacementMode> pool_mode = ModeFor(r, &pool);
  if (!pool_mode.ok()) return pool_mode.status();
  return PlaceIn(r, pool, mode);
}

namespace {

// TFLOPS as a user wrote them: up to three decimals, no trailing zeros (520, 12.5, 0.001).
std::string TflopsText(MilliTflops m) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.3f", ToTflops(m));
  std::string s = buf;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// Why request `r` does not fit node `n` (whose Evaluate said no), in the order Evaluate checks.
std::string WhyNotFits(const NodeState& n, const Request& r, uint64_t mm) {
  if (!n.schedulable) return "the node is not schedulable (lost or cordoned)";
  if (!r.remote && n.TracksCpu() && n.cpu_capacity - n.cpu_used < r.cpu_milli) return "not enough host CPU";
  if (!r.remote && n.TracksMem() && n.mem_capacity - n.mem_used < r.memory_mib) return "not enough host memory";
  if (r.gpu_count > static_cast<int>(n.gpus.size())) {
    return "it has " + std::to_string(n.gpus.size()) + " GPU(s), the request needs " + std::to_string(r.gpu_count);
  }
  if (r.gpu_count > 0 && (n.model_mask & mm) == 0) return "none of its GPUs is of an allowed model";
  int with_room = 0, full_of_vgpus = 0;
  MilliTflops most_compute = 0;
  int64_t most_vram = 0;
  MilliTflops want = 0;
  for (const GpuState& g : n.gpus) {
    if (((mm >> g.model_id) & 1) == 0) continue;
    want = ClusterState::ComputeNeed(r, g);
    most_compute = std::max(most_compute, g.free_compute());
    most_vram = std::max(most_vram, g.free_vram());
    if (g.free_compute() >= want && g.free_vram() >= r.vram_request_mib) {
      if (g.vgpus < kMaxVgpusPerGpu) ++with_room;
      else ++full_of_vgpus;
    }
  }
  std::string need = TflopsText(want) + " TFLOPS and " + std::to_string(r.vram_request_mib) + " MiB VRAM";
  if (with_room >= r.gpu_count) return "no set of its GPUs with room suits the request";
  if (with_room + full_of_vgpus >= r.gpu_count) {
    return std::to_string(full_of_vgpus) + " of its GPUs with room hold " + std::to_string(kMaxVgpusPerGpu) +
           " vGPUs each, the most a GPU can (needs " + std::to_string(r.gpu_count) + " GPU(s) with room for one more)";
  }
  return std::to_string(with_room) + " of its GPUs have " + need + " free (needs " +
         std::to_string(r.gpu_count) + "); the most free: " + TflopsText(std::max<MilliTflops>(0, most_compute)) +
         " TFLOPS, " + std::to_string(std::max<int64_t>(0, most_vram)) + " MiB VRAM";
}

}  // namespace

StatusOr<std::vector<NodeFit>> Scheduler::RankNodes(const Request& r) const {
  TF_RETURN_IF_ERROR(ValidateRequest(r));
  int pool = 0;
  StatusOr<PlacementMode> mode = ModeFor(r, &pool);
  if (!mode.ok()) return mode.status();
  const uint64_t mm = state_.ModelMask(r.gpu_models);
  std::vector<NodeFit> out;
  for (NodeId id : state_.pool_nodes(pool)) {
    const NodeState& n = state_.node(id);
    if (!r.node.empty() && n.name != r.node) continue;
    Evaluation e = Evaluate(n, r, mm, *mode, id);
    NodeFit f;
    f.node = id;
    f.name = n.name;
    f.fits = e.fits;
    if (e.fits) f.score = e.score;
    else f.why_not = WhyNotFits(n, r, mm);
    out.push_back(std::move(f));
  }
  return out;
}

std::string Scheduler::NoRoomDetail(const Request& r, int pool, uint64_t mm) const {
  if (r.gpu_count == 0) return "";
  // Could the request ever fit a node of the pool, with nothing else on it? And does some node
  // have the room now but not the vGPU slots?
  bool ever = false;
  int slot_bound = 0;
  for (NodeId id : state_.pool_nodes(pool)) {
    const NodeState& n = state_.node(id);
    if (!r.node.empty() && n.name != r.node) continue;
    int empty_fit = 0, room = 0, room_and_slot = 0;
    for (const GpuState& g : n.gpus) {
      if (((mm >> g.model_id) & 1) == 0) continue;
      const MilliTflops need = ClusterState::ComputeNeed(r, g);
      if (g.schedulable >= need && g.vram_capacity_mib >= r.vram_request_mib) ++empty_fit;
      if (g.free_compute() >= need && g.free_vram() >= r.vram_request_mib) {
        ++room;
        if (g.vgpus < kMaxVgpusPerGpu) ++room_and_slot;
      }
    }
    if (empty_fit >= r.gpu_count) ever = true;
    if (n.schedulable && room >= r.gpu_count && room_and_slot < r.gpu_count) ++slot_bound;
  }
  if (!ever) {
    return " (nor would it with nothing placed: no node of it has " + std::to_string(r.gpu_count) +
           " GPU(s) of the allowed models with that much TFLOPS and VRAM)";
  }
  if (slot_bound > 0) {
    return " (" + std::to_string(slot_bound) + " node(s) have the TFLOPS and VRAM, but their GPUs hold " +
           std::to_string(kMaxVgpusPerGpu) + " vGPUs each, the most a GPU can)";
  }
  return "";
}

StatusOr<Placement> Scheduler::PlaceIn(const Request& r, int pool, PlacementMode mode) const {
  TF_RETURN_IF_ERROR(ValidateRequest(r));
  const uint64_t mm = state_.ModelMask(r.gpu_models);
  if (r.gpu_count > 0 && mm == 0) {
    return Unavailable("request '" + r.id + "': no GPU of the allowed models is in the cluster");
  }
  if (r.tflops_request > 0) {
    Placement estimate;
    estimate.gpus.resize(static_cast<size_t>(r.gpu_count));
    estimate.compute_per_gpu = ToMilliTflops(r.tflops_request);
    estimate.vram_per_gpu_mib = r.vram_request_mib;
    TF_RETURN_IF_ERROR(CheckQuota(r, estimate));
  }
  const ShapeKey key{pool,
                     static_cast<int>(mode),
                     ToMilliTflops(r.tflops_request),
                     static_cast<int64_t>(r.compute_percent_request * 1000),
                     r.vram_request_mib,
                     r.gpu_count,
                     r.remote ? 0 : r.cpu_milli,
                     r.remote ? 0 : r.memory_mib,
                     mm};
  const int slot = CacheSlot(key);
  const size_t num_nodes = state_.nodes().size();
  if (cache_nodes_ != num_nodes) {
    cache_.assign(static_cast<size_t>(options_.cache_shapes) * num_nodes, CacheEntry{});
    cache_nodes_ = num_nodes;
  }
  const uint32_t gen = slot_generation_[static_cast<size_t>(slot)];
  CacheEntry* row = &cache_[static_cast<size_t>(slot) * num_nodes];
  NodeId best = -1;
  double best_score = 0;
  uint32_t ties = 0;
  const bool random_ties = options_.tie_break_seed != 0;
  for (NodeId id : state_.pool_nodes(pool)) {
    const NodeState& n = state_.node(id);
    if (!r.node.empty() && n.name != r.node) continue;
    CacheEntry& c = row[id];
    if (c.version != n.version || c.generation != gen) {
      Evaluation e = Evaluate(n, r, mm, mode, id);
      c.score = e.fits ? e.score : -HUGE_VAL;
      c.gpus = e.gpus;
      c.version = n.version;
      c.generation = gen;
    }
    if (c.score == -HUGE_VAL) continue;
    if (best < 0 || c.score > best_score) {
      best = id;
      best_score = c.score;
      ties = 1;
    } else if (random_ties && c.score == best_score) {
      // Reservoir sampling over the tied nodes (splitmix64).
      uint64_t z = (rng_state_ += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      if (z % ++ties == 0) best = id;
    }
  }
  if (best < 0 && !r.node.empty()) {
    return Unavailable("request '" + r.id + "': node '" + r.node + "' of pool '" +
                       state_.pools()[static_cast<size_t>(pool)].name + "' has no room" + NoRoomDetail(r, pool, mm));
  }
  if (best < 0) {
    return Unavailable("request '" + r.id + "': no node in pool '" +
                       state_.pools()[static_cast<size_t>(pool)].name + "' has room" + NoRoomDetail(r, pool, mm));
  }
  const NodeState& n = state_.node(best);
  Placement p;
  p.request_id = r.id;
  p.node = best;
  p.node_name = n.name;
  for (uint64_t m = row[best].gpus; m; m &= m - 1) p.gpus.push_back(std::countr_zero(m));
  if (!p.gpus.empty()) p.compute_per_gpu = ClusterState::ComputeNeed(r, n.gpus[static_cast<size_t>(p.gpus[0])]);
  p.vram_per_gpu_mib = r.vram_request_mib;
  if (r.tflops_request <= 0) TF_RETURN_IF_ERROR(CheckQuota(r, p));
  return p;
}

Status Scheduler::CheckQuota(const Request& r, const Placement& p) const {
  const TenantQuota* q = quota(r.tenant);
  if (q == nullptr) return Status::Ok();
  TenantUsage u = usage(r.tenant);
  const int64_t n = static_cast<int64_t>(p.gpus.size());
  const std::string who = "tenant '" + r.tenant + "' (request '" + r.id + "')";
  if (q->max_tflops > 0 && u.compute + n * p.compute_per_gpu > ToMilliTflops(q->max_tflops)) {
    return ResourceExhausted(who + " would exceed its TFLOPS quota: uses " + TflopsText(u.compute) + " of " +
                             TflopsText(ToMilliTflops(q->max_tflops)) + " TFLOPS and asks " +
                             TflopsText(n * p.compute_per_gpu));
  }
  if (q->max_vram_mib > 0 && u.vram_mib + n * p.vram_per_gpu_mib > q->max_vram_mib) {
    return ResourceExhausted(who + " would exceed its VRAM quota: uses " + std::to_string(u.vram_mib) + " of " +
                             std::to_string(q->max_vram_mib) + " MiB and asks " +
                             std::to_string(n * p.vram_per_gpu_mib));
  }
  if (q->max_gpus > 0 && u.gpus + n > q->max_gpus) {
    return ResourceExhausted(who + " would exceed its vGPU quota: holds " + std::to_string(u.gpus) + " of " +
                             std::to_string(q->max_gpus) + " and asks " + std::to_string(n));
  }
  return Status::Ok();
}

void Scheduler::Account(const Request& r, const Placement& p, int sign) {
  TenantUsage& u = usage_[r.tenant];
  const int64_t n = static_cast<int64_t>(p.gpus.size());
  u.compute += sign * n * p.compute_per_gpu;
  u.vram_mib += sign * n * p.vram_per_gpu_mib;
  u.gpus += sign * static_cast<int>(n);
}

Status Scheduler::Commit(const Request& r, const Placement& p) {
  TF_RETURN_IF_ERROR(ValidateRequest(r));
  TF_RETURN_IF_ERROR(CheckQuota(r, p));
  TF_RETURN_IF_ERROR(state_.Commit(r, p));
  Account(r, p, +1);
  return Status::Ok();
}

Status Scheduler::CommitSuspended(const Request& r, const Placement& p) {
  TF_RETURN_IF_ERROR(ValidateRequest(r));
  TF_RETURN_IF_ERROR(state_.CommitSuspended(r, p));
  Account(r, p, +1);
  return Status::Ok();
}

StatusOr<Placement> Scheduler::Schedule(const Request& r) {
  StatusOr<Placement> p = Place(r);
  if (!p.ok()) return p;
  Status s = Commit(r, *p);
  if (!s.ok()) return s;
  return p;
}

StatusOr<Request> Scheduler::Release(std::string_view request_id) {
  const Allocation* a = state_.FindAllocation(request_id);
  if (a == nullptr) return NotFound("no allocation for request '" + std::string(request_id) + "'");
  Account(a->request, a->placement, -1);
  return state_.Release(request_id);
}

StatusOr<std::vector<Request>> Scheduler::FailNode(std::string_view name) {
  NodeId id = state_.NodeIndex(name);
  if (id < 0) return NotFound("node '" + std::string(name) + "' does not exist");
  for (int slot : state_.node(id).allocations) {
    const Allocation& a = state_.allocations()[static_cast<size_t>(slot)];
    Account(a.request, a.placement, -1);
  }
  return state_.FailNode(name);
}

Status Scheduler::SetSchedulable(std::string_view name, bool schedulable) {
  return state_.SetSchedulable(name, schedulable);
}

StatusOr<PreemptionPlan> Scheduler::PlanPreemption(const Request& r) const {
  TF_RETURN_IF_ERROR(ValidateRequest(r));
  int pool = 0;
  StatusOr<PlacementMode> mode = ModeFor(r, &pool);
  if (!mode.ok()) return mode.status();
  const uint64_t mm = state_.ModelMask(r.gpu_models);
  const auto& allocs = state_.allocations();

  bool have = false;
  PreemptionPlan best;
  int best_qos_sum = 0;
  MilliTflops best_evicted = 0;
  std::vector<int> order;
  std::vector<int> chosen;
  for (NodeId id : state_.pool_nodes(pool)) {
    const NodeState& n = state_.node(id);
    if (!r.node.empty() && n.name != r.node) continue;
    if (!n.schedulable || r.gpu_count > static_cast<int>(n.gpus.size())) continue;
    if (r.gpu_count > 0 && (n.model_mask & mm) == 0) continue;
    std::vector<int> victims;
    for (int slot : n.allocations) {
      const Allocation& a = allocs[static_cast<size_t>(slot)];
      if (a.request.qos < r.qos && !a.suspended) victims.push_back(slot);
    }
    if (victims.empty()) continue;
    auto by_qos_then_size = [&](int a, int b) {
      const Allocation& x = allocs[static_cast<size_t>(a)];
      const Allocation& y = allocs[static_cast<size_t>(b)];
      if (x.request.qos != y.request.qos) return x.request.qos < y.request.qos;
      MilliTflops sx = x.placement.compute_per_gpu * static_cast<MilliTflops>(x.placement.gpus.size());
      MilliTflops sy = y.placement.compute_per_gpu * static_cast<MilliTflops>(y.placement.gpus.size());
      if (sx != sy) return sx > sy;
      return a < b;
    };
    // One greedy trial per target GPU (single-GPU requests) or one per node (multi-GPU): evict
    // victims on the target first, lowest QoS and largest first, until the request fits; then
    // drop every victim the fit does not need.
    std::vector<int> targets;
    if (r.gpu_count == 1) {
      for (int i = 0; i < static_cast<int>(n.gpus.size()); ++i) targets.push_back(i);
    } else {
      targets.push_back(-1);
    }
    for (int target : targets) {
      order.clear();
      for (int slot : victims) {
        if (target < 0 || ((allocs[static_cast<size_t>(slot)].gpu_mask >> target) & 1)) order.push_back(slot);
      }
      std::sort(order.begin(), order.end(), by_qos_then_size);
      if (target >= 0) {
        std::vector<int> rest;
        for (int slot : victims) {
          if (!((allocs[static_cast<size_t>(slot)].gpu_mask >> target) & 1)) rest.push_back(slot);
        }
        std::sort(rest.begin(), rest.end(), by_qos_then_size);
        order.insert(order.end(), rest.begin(), rest.end());
      }
      NodeState scratch = n;
      chosen.clear();
      bool fits = Evaluate(scratch, r, mm, *mode, -1).fits;
      for (size_t i = 0; i < order.size() && !fits; ++i) {
        RemoveFromScratch(scratch, allocs[static_cast<size_t>(order[i])]);
        chosen.push_back(order[i]);
        fits = Evaluate(scratch, r, mm, *mode, -1).fits;
      }
      if (!fits || chosen.empty()) continue;
      for (size_t i = chosen.size(); i-- > 0;) {
        NodeState trial = n;
        for (size_t j = 0; j < chosen.size(); ++j) {
          if (j != i) RemoveFromScratch(trial, allocs[static_cast<size_t>(chosen[j])]);
        }
        if (Evaluate(trial, r, mm, *mode, -1).fits) chosen.erase(chosen.begin() + static_cast<long>(i));
      }
      // Verify: the request fits the node with exactly these victims gone.
      NodeState verify = n;
      int qos_sum = 0;
      MilliTflops evicted = 0;
      for (int slot : chosen) {
        const Allocation& a = allocs[static_cast<size_t>(slot)];
        RemoveFromScratch(verify, a);
        qos_sum += static_cast<int>(a.request.qos);
        evicted += a.placement.compute_per_gpu * static_cast<MilliTflops>(a.placement.gpus.size());
      }
      Evaluation e = Evaluate(verify, r, mm, *mode, -1);
      if (!e.fits) continue;
      bool better = !have || chosen.size() < best.victims.size() ||
                    (chosen.size() == best.victims.size() &&
                     (qos_sum < best_qos_sum || (qos_sum == best_qos_sum && evicted < best_evicted)));
      if (!better) continue;
      Placement p;
      p.request_id = r.id;
      p.node = id;
      p.node_name = n.name;
      for (uint64_t m = e.gpus; m; m &= m - 1) p.gpus.push_back(std::countr_zero(m));
      if (!p.gpus.empty()) p.compute_per_gpu = ClusterState::ComputeNeed(r, n.gpus[static_cast<size_t>(p.gpus[0])]);
      p.vram_per_gpu_mib = r.vram_request_mib;
      best.placement = std::move(p);
      best.victims.clear();
      std::vector<int> sorted = chosen;
      std::sort(sorted.begin(), sorted.end(), by_qos_then_size);
      best.suspended.clear();
      for (int slot : sorted) {
        const Request& v = allocs[static_cast<size_t>(slot)].request;
        best.victims.push_back(v.id);
        if (v.suspendable) best.suspended.push_back(v.id);
      }
      best_qos_sum = qos_sum;
      best_evicted = evicted;
      have = true;
    }
  }
  if (!have) {
    return Unavailable("request '" + r.id + "': evicting lower-QoS workloads would not make room on any node");
  }
  TF_RETURN_IF_ERROR(CheckQuota(r, best.placement));
  return best;
}

StatusOr<std::vector<Request>> Scheduler::ExecutePreemption(const Request& r, const PreemptionPlan& plan) {
  std::vector<std::pair<Request, Placement>> evicted;
  std::vector<std::string> suspended;
  for (const std::string& id : plan.victims) {
    const Allocation* a = state_.FindAllocation(id);
    if (a == nullptr) return NotFound("preemption victim '" + id + "' is no longer placed");
    if (std::find(plan.suspended.begin(), plan.suspended.end(), id) != plan.suspended.end()) {
      suspended.push_back(id);
    } else {
      evicted.emplace_back(a->request, a->placement);
    }
  }
  for (const auto& [req, pl] : evicted) Release(req.id);
  for (const std::string& id : suspended) (void)Suspend(id);
  Status s = Commit(r, plan.placement);
  if (!s.ok()) {
    for (const std::string& id : suspended) (void)Resume(id);
    for (const auto& [req, pl] : evicted) Commit(req, pl);
    return s;
  }
  std::vector<Request> out;
  for (auto& [req, pl] : evicted) out.push_back(std::move(req));
  return out;
}

double Scheduler::ClusterFragmentation() const {
  double t = 0;
  for (const NodeState& n : state_.nodes()) {
    if (n.schedulable) t += NodeFragmentation(MakeFragView(n), mix_);
  }
  return t;
}

int64_t Scheduler::ClusterIdleMilli() const {
  int64_t t = 0;
  for (const NodeState& n : state_.nodes()) {
    if (n.schedulable) t += IdleMilli(MakeFragView(n));
  }
  return t;
}

}  // namespace tf::sched
