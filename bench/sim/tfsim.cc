// tfsim: replays the openb trace through the placement library and prints Markdown tables.
//
//   tfsim [--data DIR] [--experiment static|dynamic|micro|all] [--trace NAME|all]
//         [--policies BestFit,FGD,...] [--seeds N] [--decisions N]
//
// DIR defaults to ../shared/data/openb (relative to the repository root).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "scheduler/scheduler.h"
#include "sim/replay.h"

namespace {

using tf::sched::PlacementMode;

struct Args {
  std::string data = "../shared/data/openb";
  std::string experiment = "all";
  std::string trace = "default";
  std::vector<PlacementMode> policies = {PlacementMode::kBestFit, PlacementMode::kFgd,
                                         PlacementMode::kCompactFirst, PlacementMode::kLowLoadFirst,
                                         PlacementMode::kNodeCompactGpuLowLoad, PlacementMode::kFragAware};
  int seeds = 10;
  long decisions = 20000;
  std::vector<double> compress = {1, 3000, 100000};
  tf::sched::SchedulerOptions options = [] {
    tf::sched::SchedulerOptions o;
    o.k8s_integer_scores = true;  // the references behave as kube-scheduler plugins
    return o;
  }();
};

const char* kTraces[] = {"default",    "cpu050",     "cpu100",     "cpu200",     "gpushare20", "gpushare40",
                         "gpushare60", "gpushare80", "multigpu20", "multigpu30", "multigpu40", "gpuspec10",
                         "gpuspec20",  "gpuspec25"};

struct Stat {
  double mean = 0, sd = 0;
};
Stat Of(const std::vector<double>& v) {
  Stat s;
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
  s.sd = v.size() > 1 ? std::sqrt(s.sd / static_cast<double>(v.size() - 1)) : 0;
  return s;
}

int Fail(const tf::Status& s) {
  std::fprintf(stderr, "tfsim: %s\n", s.ToString().c_str());
  return 1;
}

int RunStaticTable(const Args& a, const std::vector<tf::sim::TraceNode>& nodes, const std::string& trace) {
  auto pods = tf::sim::LoadPods(a.data + "/openb_pod_list_" + trace + ".csv");
  if (!pods.ok()) return Fail(pods.status());
  std::printf("\n### Static FGD protocol, trace `%s` (%d seeds from 42)\n\n", trace.c_str(), a.seeds);
  std::printf("| policy | unallocated @100%% | unallocated @130%% | frag ratio @90%% | first failure (arrived %%) "
              "| alloc trails arrivals by >1 pt (arrived %%) | wall s/run |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  for (PlacementMode m : a.policies) {
    std::vector<double> u100, u130, fr, ff, gap, wall;
    for (int i = 0; i < a.seeds; ++i) {
      auto r = tf::sim::RunStatic(nodes, *pods, m, 42 + static_cast<uint64_t>(i), a.options);
      if (!r.ok()) return Fail(r.status());
      u100.push_back(r->unallocated_at_100);
      u130.push_back(r->unallocated_at_130);
      fr.push_back(r->frag_ratio_at_90);
      ff.push_back(r->first_failure_load);
      gap.push_back(r->gap_load);
      wall.push_back(r->wall_seconds);
    }
    Stat s100 = Of(u100), s130 = Of(u130), sfr = Of(fr), sff = Of(ff), sgap = Of(gap), sw = Of(wall);
    std::printf("| %s | %.2f ± %.2f | %.2f ± %.2f | %.1f%% ± %.1f | %.1f | %.1f | %.2f |\n",
                std::string(tf::sched::PlacementModeName(m)).c_str(), s100.mean, s100.sd, s130.mean, s130.sd,
                sfr.mean, sfr.sd, sff.mean, sgap.mean, sw.mean);
    std::fflush(stdout);
  }
  return 0;
}

int RunDynamicTable(const Args& a, const std::vector<tf::sim::TraceNode>& nodes) {
  auto pods = tf::sim::LoadPods(a.data + "/openb_pod_list_" + a.trace + ".csv");
  if (!pods.ok()) return Fail(pods.status());
  std::printf("\n### Dynamic replay, trace `%s` (trace lifetimes, arrivals compressed by a factor, QoS-ordered "
              "queue, no preemption)\n\n",
              a.trace.c_str());
  std::printf("| policy | compress | time-avg allocation | placed | never placed | delay p50 / p99 s: critical | high | medium | low |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (double f : a.compress)
  for (PlacementMode m : a.policies) {
    auto r = tf::sim::RunDynamic(nodes, *pods, m, f, a.options);
    if (!r.ok()) return Fail(r.status());
    std::printf("| %s | %.0fx | %.2f%% | %lld | %lld |", std::string(tf::sched::PlacementModeName(m)).c_str(), f,
                r->time_avg_allocation, static_cast<long long>(r->placed), static_cast<long long>(r->never_placed));
    for (int q = 3; q >= 0; --q) std::printf(" %.0f / %.0f (n=%lld) |", r->delay_p50[q], r->delay_p99[q],
                                              static_cast<long long>(r->count[q]));
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}

int RunMicroTable(const Args& a, const std::vector<tf::sim::TraceNode>& nodes) {
  auto pods = tf::sim::LoadPods(a.data + "/openb_pod_list_default.csv");
  if (!pods.ok()) return Fail(pods.status());
  std::printf("\n### Decision micro-benchmark (churn at 80%% GPU allocation, one thread, %ld timed decisions)\n\n",
              a.decisions);
  std::printf("| policy | nodes | decisions/s | p50 µs | p99 µs | max µs |\n|---|---:|---:|---:|---:|---:|\n");
  for (PlacementMode m : a.policies) {
    for (int n : {0, 5000}) {
      auto r = tf::sim::RunMicro(nodes, *pods, m, n, a.decisions, a.options);
      if (!r.ok()) return Fail(r.status());
      std::printf("| %s | %d | %.0f | %.1f | %.1f | %.1f |\n", std::string(tf::sched::PlacementModeName(m)).c_str(),
                  r->nodes, r->decisions_per_second, r->p50_us, r->p99_us, r->max_us);
      std::fflush(stdout);
    }
  }
  std::printf("\n### One whole FGD-protocol replay (default trace, seed 42)\n\n| policy | pods | wall s |\n|---|---:|---:|\n");
  for (PlacementMode m : a.policies) {
    auto r = tf::sim::RunStatic(nodes, *pods, m, 42, a.options);
    if (!r.ok()) return Fail(r.status());
    std::printf("| %s | %lld | %.3f |\n", std::string(tf::sched::PlacementModeName(m)).c_str(),
                static_cast<long long>(r->pods), r->wall_seconds);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tfsim: %s needs a value\n", f.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (f == "--data") {
      a.data = value();
    } else if (f == "--experiment") {
      a.experiment = value();
    } else if (f == "--trace") {
      a.trace = value();
    } else if (f == "--seeds") {
      a.seeds = std::atoi(value().c_str());
    } else if (f == "--decisions") {
      a.decisions = std::atol(value().c_str());
    } else if (f == "--compress") {
      a.compress = {std::atof(value().c_str())};
    } else if (f == "--tie-seed") {
      a.options.tie_break_seed = std::strtoull(value().c_str(), nullptr, 10);
    } else if (f == "--k8s-integer-scores") {
      a.options.k8s_integer_scores = true;
    } else if (f == "--frag-aware-leftover") {
      a.options.frag_aware_leftover_weight = std::atof(value().c_str());
    } else if (f == "--frag-aware-quantum") {
      a.options.frag_aware_quantum_milli = std::atof(value().c_str());
    } else if (f == "--frag-aware-cpu") {
      a.options.frag_aware_cpu_weight = std::atof(value().c_str());
    } else if (f == "--frag-aware-fgd-measure") {
      a.options.frag_aware_stranded_measure = false;
    } else if (f == "--frag-aware-blend") {
      a.options.frag_aware_fgd_blend = std::atof(value().c_str());
    } else if (f == "--frag-aware-demand") {
      a.options.frag_aware_demand_weighted = true;
    } else if (f == "--best-fit-cpu") {
      a.options.best_fit_cpu_weight = std::atof(value().c_str());
    } else if (f == "--policies") {
      a.policies.clear();
      std::string list = value();
      size_t start = 0;
      while (start <= list.size()) {
        size_t comma = list.find(',', start);
        std::string name = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        auto m = tf::sched::ParsePlacementMode(name);
        if (!m.ok()) return Fail(m.status());
        a.policies.push_back(*m);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else {
      std::fprintf(stderr, "usage: tfsim [--data DIR] [--experiment static|dynamic|micro|all] [--trace NAME|all] "
                           "[--policies A,B] [--seeds N] [--decisions N]\n");
      return 2;
    }
  }
  auto nodes = tf::sim::LoadNodes(a.data + "/openb_node_list_gpu_node.csv");
  if (!nodes.ok()) return Fail(nodes.status());
  int rc = 0;
  if (a.experiment == "static" || a.experiment == "all") {
    if (a.trace == "all") {
      for (const char* t : kTraces) rc |= RunStaticTable(a, *nodes, t);
    } else {
      size_t start = 0;  // a comma-separated list of trace names
      while (start <= a.trace.size()) {
        size_t comma = a.trace.find(',', start);
        rc |= RunStaticTable(a, *nodes, a.trace.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    }
  }
  if (a.experiment == "dynamic" || a.experiment == "all") rc |= RunDynamicTable(a, *nodes);
  if (a.experiment == "micro" || a.experiment == "all") rc |= RunMicroTable(a, *nodes);
  return rc;
}
