#include "controller/usage_history.h"

#include <algorithm>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "scheduler/cluster_state.h"

namespace tf::controller {
namespace {

using nlohmann::json;

sched::PoolSpec SchedPool(const Pool& p) {
  sched::PoolSpec s;
  s.name = p.name;
  s.tflops_oversell_ratio = p.tflops_oversell_ratio;
  s.vram_expand_to_host_percent = p.vram_expand_to_host_percent;
  s.vram_expand_to_disk_percent = p.vram_expand_to_disk_percent;
  return s;
}

}  // namespace

UsageSnapshot TakeUsageSnapshot(const Controller& c, int64_t now_ms) {
  UsageSnapshot out;
  out.t_ms = now_ms;
  std::map<std::string, sched::PoolSpec> specs;
  std::map<std::string, PoolUsage> pools;
  for (const Pool& p : c.ListPools()) {
    specs[p.name] = SchedPool(p);
    pools[p.name].name = p.name;
  }
  std::map<std::string, double> busy;  // per pool: sum of utilization x TFLOPS
  struct MilliSums {
    MilliTflops capacity = 0, used = 0, schedulable = 0;
  };
  std::map<std::string, MilliSums> milli;  // per pool: exact sums, shown as TFLOPS
  for (const GpuStatus& s : c.ListGpus("")) {
    const Gpu& g = s.gpu;
    auto spec = specs.find(g.pool);
    const sched::PoolSpec pool = spec != specs.end() ? spec->second : sched::PoolSpec{};
    const sched::SchedulableCapacity offered = sched::GpuSchedulableCapacity(ToTflops(g.milli_tflops), g.vram_mib, pool);
    GpuUsage u{g.uuid, g.node, g.pool, g.model, g.index, g.schedulable, ToTflops(g.milli_tflops),
               ToTflops(g.used_milli_tflops),
               sched::ToTflops(offered.compute), g.vram_mib, g.used_vram_mib, s.schedulable_vram_mib,
               s.utilization_percent, s.memory_used_mib, s.sampled_ms};
    PoolUsage& p = pools[g.pool];
    p.name = g.pool;
    ++p.gpus;
    MilliSums& m = milli[g.pool];
    m.capacity += g.milli_tflops;
    m.used += g.used_milli_tflops;
    m.schedulable += offered.compute;
    p.tflops = ToTflops(m.capacity);
    p.used_tflops = ToTflops(m.used);
    p.schedulable_tflops = ToTflops(m.schedulable);
    p.vram_mib += u.vram_mib;
    p.used_vram_mib += u.used_vram_mib;
    p.schedulable_vram_mib += u.schedulable_vram_mib;
    p.memory_used_mib += u.memory_used_mib;
    busy[g.pool] += u.utilization_percent * u.tflops;
    out.gpus.push_back(std::move(u));
  }
  for (auto& [name, p] : pools) {
    if (p.tflops > 0) p.utilization_percent = busy[name] / p.tflops;
    out.pools.push_back(std::move(p));
  }
  std::sort(out.gpus.begin(), out.gpus.end(), [](const GpuUsage& a, const GpuUsage& b) {
    return std::tie(a.pool, a.node, a.index, a.uuid) < std::tie(b.pool, b.node, b.index, b.uuid);
  });
  return out;
}

json ToJson(const PoolUsage& p) {
  return {{"name", p.name},
          {"gpus", p.gpus},
          {"tflops", p.tflops},
          {"used_tflops", p.used_tflops},
          {"schedulable_tflops", p.schedulable_tflops},
          {"vram_mib", p.vram_mib},
          {"used_vram_mib", p.used_vram_mib},
          {"schedulable_vram_mib", p.schedulable_vram_mib},
          {"utilization_percent", p.utilization_percent},
          {"memory_used_mib", p.memory_used_mib}};
}

json ToJson(const GpuUsage& g) {
  return {{"uuid", g.uuid},
          {"node", g.node},
          {"pool", g.pool},
          {"model", g.model},
          {"index", g.index},
          {"schedulable", g.schedulable},
          {"tflops", g.tflops},
          {"used_tflops", g.used_tflops},
          {"schedulable_tflops", g.schedulable_tflops},
          {"free_tflops", std::max(0.0, g.schedulable_tflops - g.used_tflops)},
          {"vram_mib", g.vram_mib},
          {"used_vram_mib", g.used_vram_mib},
          {"schedulable_vram_mib", g.schedulable_vram_mib},
          {"free_vram_mib", std::max<int64_t>(0, g.schedulable_vram_mib - g.used_vram_mib)},
          {"utilization_percent", g.utilization_percent},
          {"memory_used_mib", g.memory_used_mib},
          {"sampled_ms", g.sampled_ms}};
}

UsageHistory::UsageHistory(int64_t interval_ms, int64_t retention_ms)
    : interval_ms_(std::max<int64_t>(1, interval_ms)),
      retention_ms_(std::max<int64_t>(interval_ms_, retention_ms)),
      capacity_(static_cast<size_t>(retention_ms_ / interval_ms_)) {}

UsageHistory::Name UsageHistory::InternLocked(const std::string& s) {
  auto [it, fresh] = names_.try_emplace(s);
  if (fresh) it->second = std::make_shared<const std::string>(s);
  return it->second;
}

void UsageHistory::Add(const UsageSnapshot& s) {
  std::lock_guard<std::mutex> lock(mu_);
  Sample sample{s.t_ms, s.pools, {}};
  sample.gpus.reserve(s.gpus.size());
  for (const GpuUsage& g : s.gpus) {
    sample.gpus.push_back({InternLocked(g.uuid), InternLocked(g.pool), static_cast<float>(g.utilization_percent),
                           g.used_tflops, g.used_vram_mib, g.memory_used_mib});
  }
  samples_.push_back(std::move(sample));
  if (samples_.size() > capacity_) {
    samples_.pop_front();
    // Forget names only the table still holds (GPUs gone for longer than the retention).
    std::erase_if(names_, [](const auto& kv) { return kv.second.use_count() == 1; });
  }
}

size_t UsageHistory::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return samples_.size();
}

json UsageHistory::ToJson(int64_t since_ms, const std::string& pool) const {
  std::lock_guard<std::mutex> lock(mu_);
  json samples = json::array();
  for (const Sample& s : samples_) {
    if (s.t_ms <= since_ms) continue;
    json pools = json::array();
    for (const PoolUsage& p : s.pools)
      if (pool.empty() || p.name == pool) pools.push_back(controller::ToJson(p));
    json j{{"t_ms", s.t_ms}, {"pools", std::move(pools)}};
    if (!pool.empty()) {
      json gpus = json::array();
      for (const GpuPoint& g : s.gpus) {
        if (*g.pool != pool) continue;
        gpus.push_back({{"uuid", *g.uuid},
                        {"used_tflops", g.used_tflops},
                        {"used_vram_mib", g.used_vram_mib},
                        {"utilization_percent", g.utilization_percent},
                        {"memory_used_mib", g.memory_used_mib}});
      }
      j["gpus"] = std::move(gpus);
    }
    samples.push_back(std::move(j));
  }
  return {{"interval_ms", interval_ms_}, {"retention_ms", retention_ms_}, {"samples", std::move(samples)}};
}

UsageSampler::UsageSampler(const Controller* controller, UsageHistory* history, const Clock* clock)
    : controller_(controller), history_(history), clock_(clock) {}

UsageSampler::~UsageSampler() { Stop(); }

void UsageSampler::SampleOnce() {
  if (controller_->Serving()) history_->Add(TakeUsageSnapshot(*controller_, clock_->NowMs()));
}

void UsageSampler::Start() { thread_.Start(history_->interval_ms(), [this] { SampleOnce(); }); }

void UsageSampler::Stop() { thread_.Stop(); }

}  // namespace tf::controller
