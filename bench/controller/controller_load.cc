// Controller load benchmark (prints numbers; not a pass/fail test).
//  1. Latency: allocate/release API calls over HTTP against an in-process controller on the
//     embedded SQLite store (WAL; durability power = synchronous=FULL, process = NORMAL), paced
//     at a target rate.
//  2. Memory: RSS with many nodes and allocations held in the controller.
//     Each client thread is paced on its own schedule (open loop: a late call does not delay the
//     next one's start time, and its latency is measured from its scheduled start), so queueing
//     behind a slow fsync shows up in the percentiles instead of lowering the offered rate.
// Usage: controller_load [calls_per_second=1000] [seconds=10] [nodes=5000] [allocations=50000]
//                        [client_threads=16] [durability=power|process]
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "controller/api_server.h"
#include "process_stats.h"
#include "controller/http_client.h"
#include "controller/sqlite_store.h"

using namespace tf::controller;
using tf::bench::LoadAverage;
using tf::bench::ProcessCpuSeconds;
using tf::bench::ThreadCpuSeconds;
using Clk = std::chrono::steady_clock;

namespace {

long RssKiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

void Register(Controller& c, int nodes, int gpus_per_node, int pools) {
  for (int p = 0; p < pools; ++p) (void)c.CreatePool("pool-" + std::to_string(p));
  for (int n = 0; n < nodes; ++n) {
    NodeRegistration reg{"node-" + std::to_string(n), pools ? "pool-" + std::to_string(n % pools) : "", "", {}};
    for (int g = 0; g < gpus_per_node; ++g)
      reg.gpus.push_back({"GPU-" + std::to_string(n) + "-" + std::to_string(g), "H100-SXM", g, 0, 989.0, 81559});
    if (!c.RegisterNode(reg).ok()) std::abort();
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int rate = argc > 1 ? std::atoi(argv[1]) : 1000;
  const int seconds = argc > 2 ? std::atoi(argv[2]) : 10;
  const int mem_nodes = argc > 3 ? std::atoi(argv[3]) : 5000;
  const int mem_allocs = argc > 4 ? std::atoi(argv[4]) : 50000;
  const int threads = argc > 5 ? std::atoi(argv[5]) : 16;
  const std::string durability_name = argc > 6 ? argv[6] : "power";
  auto durability = ParseSqliteDurability(durability_name);
  if (!durability.ok()) {
    std::fprintf(stderr, "controller_load: %s\n", durability.status().message().c_str());
    return 2;
  }
  std::string dir = std::filesystem::temp_directory_path() / ("tfbench-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);

  {  // Phase 1: latency over HTTP.
    SystemClock clock;
    auto store = std::move(SqliteStore::Open(dir + "/latency.db", *durability)).value();
    const uint64_t batches_before = store->batches();
    Controller c(store.get(), &clock, MakeSchedulerPlacement(), nullptr);
    if (!c.Rebuild().ok()) return 1;
    Register(c, 100, 8, 0);
    ApiServer api(&c, "bench-token");
    int port = *api.Bind("127.0.0.1", 0);
    api.Start();
    const auto interval = std::chrono::nanoseconds(1'000'000'000LL * threads / rate);
    std::vector<std::vector<double>> lat(threads);
    std::atomic<int> errors{0};
    // Connect first, one client at a time: cpp-httplib as Debian builds it listens with a backlog
    // of 5, and a burst of simultaneous connects loses SYNs that are retried only after 1 s.
    std::vector<std::unique_ptr<HttpClient>> clients;
    for (int t = 0; t < threads; ++t) {
      clients.push_back(std::make_unique<HttpClient>("http://127.0.0.1:" + std::to_string(port), "bench-token"));
      if (!clients.back()->Get("/healthz").ok()) return 1;
    }
    std::vector<std::thread> ts;
    std::vector<double> client_cpu_s(threads);
    c.stage_times().lock_wait.Reset();
    c.stage_times().locked.Reset();
    c.stage_times().durable_wait.Reset();
    api.request_times().Reset();
    const double cpu_before = ProcessCpuSeconds();
    rusage ru_before{};
    getrusage(RUSAGE_SELF, &ru_before);
    const std::string load_before = LoadAverage();
    auto start = Clk::now();
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        HttpClient& client = *clients[static_cast<size_t>(t)];
        auto next = start + interval * t / threads;
        std::string id;
        while (Clk::now() - start < std::chrono::seconds(seconds)) {
          std::this_thread::sleep_until(next);
          auto t0 = next;  // the scheduled start: time spent behind schedule counts
          next += interval;
          bool ok;
          if (id.empty()) {
            auto r = client.Post("/v1/allocations", R"({"tflops":10,"vram_mib":1024})");
            ok = r.ok() && r->status == 201;
            if (ok) id = nlohmann::json::parse(r->body)["id"];
          } else {
            auto r = client.Delete("/v1/allocations/" + id);
            ok = r.ok() && r->status == 200;
            id.clear();
          }
          lat[t].push_back(std::chrono::duration<double, std::milli>(Clk::now() - t0).count());
          if (!ok) ++errors;
        }
        client_cpu_s[static_cast<size_t>(t)] = ThreadCpuSeconds();
      });
    }
    for (auto& th : ts) th.join();
    double elapsed = std::chrono::duration<double>(Clk::now() - start).count();
    const double cpu_s = ProcessCpuSeconds() - cpu_before;
    rusage ru_after{};
    getrusage(RUSAGE_SELF, &ru_after);
    double client_cpu = 0;
    for (double v : client_cpu_s) client_cpu += v;
    std::vector<double> all;
    for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
    std::sort(all.begin(), all.end());
    auto pct = [&](double p) { return all[std::min(all.size() - 1, size_t(p * all.size()))]; };
    std::printf("latency: target %d calls/s, achieved %.0f calls/s over %.1f s, %zu calls, %d errors\n",
                rate, all.size() / elapsed, elapsed, all.size(), errors.load());
    std::printf("latency: p50 %.3f ms  p90 %.3f ms  p99 %.3f ms  p99.9 %.3f ms  max %.3f ms\n",
                pct(0.50), pct(0.90), pct(0.99), pct(0.999), all.back());
    std::printf("latency: %d client threads, %llu store batches (commits; an fsync each with durability "
                "power) for %zu calls, durability %s\n", threads,
                static_cast<unsigned long long>(store->batches() - batches_before), all.size(),
                SqliteDurabilityName(*durability));
    // Server side: the same calls as the HTTP server and the controller saw them (histogram
    // quantiles: the upper edge of a bucket 9 % wide). A client-side tail that the server side
    // does not show was spent outside the request's handling: in the kernel's queues, waiting
    // for a server thread to be scheduled, or in the load generator itself.
    auto ms = [](const LatencyHistogram& h, double q) { return h.Quantile(q) * 1e3; };
    const LatencyHistogram& req = api.request_times();
    const CallStageTimes& st = c.stage_times();
    std::printf("server: request (headers read -> answer written) p50 %.3f ms  p90 %.3f ms  p99 %.3f ms  "
                "p99.9 %.3f ms  max %.3f ms (%llu requests)\n", ms(req, 0.5), ms(req, 0.9), ms(req, 0.99),
                ms(req, 0.999), ms(req, 1.0), static_cast<unsigned long long>(req.Count()));
    for (const auto& [name, h] : {std::pair<const char*, const LatencyHistogram*>{"lock_wait", &st.lock_wait},
                                  {"locked", &st.locked}, {"durable_wait", &st.durable_wait}}) {
      std::printf("server: %-12s p50 %.3f ms  p99 %.3f ms  p99.9 %.3f ms  max %.3f ms\n", name, ms(*h, 0.5),
                  ms(*h, 0.99), ms(*h, 0.999), ms(*h, 1.0));
    }
    size_t over10 = static_cast<size_t>(all.end() - std::upper_bound(all.begin(), all.end(), 10.0));
    std::printf("cpu: process %.2f s of %.1f s (%.0f%% of one core): load generator threads %.2f s, "
                "controller and server %.2f s; %.1f us of controller CPU per call; context switches "
                "%ld voluntary, %ld involuntary; load average before: %s; calls over 10 ms: %zu\n",
                cpu_s, elapsed, 100 * cpu_s / elapsed, client_cpu, cpu_s - client_cpu,
                1e6 * (cpu_s - client_cpu) / static_cast<double>(all.size()), ru_after.ru_nvcsw - ru_before.ru_nvcsw,
                ru_after.ru_nivcsw - ru_before.ru_nivcsw, load_before.c_str(), over10);
    api.Stop();
  }

  {  // Phase 2: memory with many nodes and allocations (50 pools so each placement scans one).
    long before = RssKiB();
    SystemClock clock;
    auto store = std::move(SqliteStore::Open(dir + "/memory.db", *durability)).value();
    Controller c(store.get(), &clock, MakeSchedulerPlacement(), nullptr);
    if (!c.Rebuild().ok()) return 1;
    auto t0 = Clk::now();
    Register(c, mem_nodes, 8, 50);
    for (int i = 0; i < mem_allocs; ++i) {
      AllocationRequest r{"", "pool-" + std::to_string(i % 50), 10, 1024, 1, "", ""};
      if (!c.Allocate(r).ok()) {
        std::fprintf(stderr, "allocation %d failed\n", i);
        return 1;
      }
    }
    double fill_s = std::chrono::duration<double>(Clk::now() - t0).count();
    long rss = RssKiB();
    std::printf("memory: %d nodes, %d GPUs, %zu allocations: RSS %.1f MiB (process before: %.1f MiB), filled in %.1f s\n",
                mem_nodes, mem_nodes * 8, c.ListAllocations().size(), rss / 1024.0, before / 1024.0, fill_s);
    auto r0 = Clk::now();
    Controller again(store.get(), &clock, MakeSchedulerPlacement(), nullptr);
    if (!again.Rebuild().ok()) return 1;
    std::printf("restart: rebuilt %zu allocations from the store in %.2f s\n", again.ListAllocations().size(),
                std::chrono::duration<double>(Clk::now() - r0).count());
  }
  std::filesystem::remove_all(dir);
  return 0;
}
