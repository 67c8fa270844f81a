// API call latency over HTTPS against plain HTTP (prints numbers; not a pass/fail test).
//
// One in-process controller (SQLite store in a temporary folder, durability process so that
// fsyncs do not drown the transport's cost) behind two API servers on 127.0.0.1: one plain, one
// TLS with a certificate from the CA `tfusion up --tls` makes (ECDSA P-256). One client thread
// calls sequentially, in two connection modes:
//   keep-alive: one HttpClient, one connection (and one TLS handshake) for every call;
//   new connection: a new HttpClient per call (TCP connect + TLS handshake each time), which is
//   what every `tfusion` client command pays once.
// Calls: GET /v1/pools/default (a read) and POST + DELETE /v1/allocations (a write and its
// release; both counted). Rounds alternate plain and TLS so that drift on a shared machine hits
// both. Client-side latency per call in microseconds; CPU of the whole process per call.
// Then throughput: `threads` client threads on kept-alive connections allocate and release as fast
// as they can (closed loop) for `seconds`, over plain HTTP with the admin token against HTTPS with
// a tenant token (every call checked against the tenant's role and quota), alternating.
// Usage: tls_latency [calls_per_mode=2000] [rounds=3] [threads=8] [seconds=5]
// TLS_LATENCY_ONLY="https, tenant token" (a combination's name as printed) floods only that one
// (to profile it alone).
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "controller/api_server.h"
#include "process_stats.h"
#include "controller/http_client.h"
#include "controller/self_signed_ca.h"
#include "controller/sqlite_store.h"

using namespace tf::controller;
using tf::bench::LoadAverage;
using tf::bench::ProcessCpuSeconds;
using Clk = std::chrono::steady_clock;

namespace {

struct Sample {
  std::vector<double> us;
  double cpu_s = 0;
};

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// `calls` calls of `kind` ("read" or "write") against `url`; a fresh client per call unless
// `keep_alive`.
Sample Run(const std::string& url, const std::string& ca, const std::string& kind, bool keep_alive, int calls) {
  Sample s;
  s.us.reserve(static_cast<size_t>(calls));
  std::unique_ptr<HttpClient> kept;
  auto client = [&]() -> HttpClient& {
    if (!keep_alive || !kept) kept = std::make_unique<HttpClient>(url, "bench-token", 5000, ca);
    return *kept;
  };
  const double cpu0 = ProcessCpuSeconds();
  for (int i = 0; i < calls; ++i) {
    if (kind == "read") {
      auto t0 = Clk::now();
      auto r = client().Get("/v1/pools/default");
      s.us.push_back(std::chrono::duration<double, std::micro>(Clk::now() - t0).count());
      if (!r.ok() || r->status != 200) {
        std::fprintf(stderr, "read failed: %s\n", r.ok() ? r->body.c_str() : r.status().ToString().c_str());
        std::exit(1);
      }
    } else {
      auto t0 = Clk::now();
      auto a = client().Post("/v1/allocations", R"({"tflops":1,"vram_mib":16})");
      s.us.push_back(std::chrono::duration<double, std::micro>(Clk::now() - t0).count());
      if (!a.ok() || a->status != 201) {
        std::fprintf(stderr, "allocate failed: %s\n", a.ok() ? a->body.c_str() : a.status().ToString().c_str());
        std::exit(1);
      }
      const std::string id = nlohmann::json::parse(a->body)["id"];
      t0 = Clk::now();
      auto d = client().Delete("/v1/allocations/" + id);
      s.us.push_back(std::chrono::duration<double, std::micro>(Clk::now() - t0).count());
      if (!d.ok() || d->status != 200) std::exit(1);
    }
  }
  s.cpu_s = ProcessCpuSeconds() - cpu0;
  return s;
}

// Closed loop: `threads` clients on kept-alive connections alternate allocate and release for
// `seconds`; operations (calls) per second, and per-call latency.
struct Throughput {
  double ops_per_s = 0;
  std::vector<double> us;
  int errors = 0;
};

Throughput Flood(const std::string& url, const std::string& ca, const std::string& token, int threads,
                 int seconds) {
  std::vector<std::unique_ptr<HttpClient>> clients;
  for (int t = 0; t < threads; ++t) {  // connect one at a time (a burst of connects loses SYNs)
    clients.push_back(std::make_unique<HttpClient>(url, token, 5000, ca));
    if (!clients.back()->Get("/healthz").ok()) std::exit(1);
  }
  std::vector<std::vector<double>> lat(static_cast<size_t>(threads));
  std::atomic<int> errors{0};
  std::vector<std::thread> ts;
  const auto start = Clk::now();
  const auto end = start + std::chrono::seconds(seconds);
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      HttpClient& c = *clients[static_cast<size_t>(t)];
      std::string id;
      while (Clk::now() < end) {
        auto t0 = Clk::now();
        bool ok;
        if (id.empty()) {
          auto r = c.Post("/v1/allocations", R"({"tflops":1,"vram_mib":16})");
          ok = r.ok() && r->status == 201;
          if (ok) id = nlohmann::json::parse(r->body)["id"];
        } else {
          auto r = c.Delete("/v1/allocations/" + id);
          ok = r.ok() && r->status == 200;
          id.clear();
        }
        lat[static_cast<size_t>(t)].push_back(std::chrono::duration<double, std::micro>(Clk::now() - t0).count());
        if (!ok) ++errors;
      }
      if (!id.empty()) (void)c.Delete("/v1/allocations/" + id);
    });
  }
  for (auto& th : ts) th.join();
  Throughput out;
  for (auto& v : lat) out.us.insert(out.us.end(), v.begin(), v.end());
  out.ops_per_s = static_cast<double>(out.us.size()) / std::chrono::duration<double>(Clk::now() - start).count();
  out.errors = errors.load();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 2000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 8;
  const int seconds = argc > 4 ? std::atoi(argv[4]) : 5;
  if (calls <= 0 || rounds <= 0 || threads <= 0 || seconds <= 0) {
    std::fprintf(stderr, "usage: tls_latency [calls_per_mode>0] [rounds>0] [threads>0] [seconds>0]\n");
    return 2;
  }
  char tmpl[] = "/tmp/tf-tlsbench-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  auto tls = EnsureSelfSignedTls(dir + "/tls", {"localhost", "127.0.0.1"}, static_cast<int64_t>(time(nullptr)));
  if (!tls.ok()) {
    std::fprintf(stderr, "%s\n", tls.status().ToString().c_str());
    return 1;
  }
  auto store = std::move(SqliteStore::Open(dir + "/state.db", SqliteDurability::kProcess)).value();
  SystemClock clock;
  Controller controller(store.get(), &clock, MakeSchedulerPlacement(), nullptr);
  if (!controller.Rebuild().ok()) return 1;
  NodeRegistration reg{"node-0", "", "", {}};
  for (int g = 0; g < 8; ++g) reg.gpus.push_back({"GPU-" + std::to_string(g), "H100-SXM", g, 0, 989.0, 81559});
  if (!controller.RegisterNode(reg).ok()) return 1;

  ApiServer plain(&controller, "bench-token");
  ApiServer https(&controller, "bench-token", ServerTlsFiles{tls->cert_file, tls->key_file});
  auto plain_port = plain.Bind("127.0.0.1", 0);
  auto https_port = https.Bind("127.0.0.1", 0);
  if (!plain_port.ok() || !https_port.ok()) return 1;
  plain.Start();
  https.Start();
  const std::string plain_url = "http://127.0.0.1:" + std::to_string(*plain_port);
  const std::string https_url = "https://127.0.0.1:" + std::to_string(*https_port);

  std::printf("tls_latency: %d calls per mode, %d rounds; load average at start %s; %ld CPUs\n", calls, rounds,
              LoadAverage().c_str(), sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("%-5s %-6s %-8s %-14s %9s %9s %9s %9s %12s\n", "round", "call", "scheme", "connection", "p50_us",
              "p99_us", "mean_us", "max_us", "cpu_us/call");
  (void)Run(https_url, tls->ca_file, "read", true, 100);  // warm up both paths
  (void)Run(plain_url, "", "read", true, 100);
  for (int round = 1; round <= rounds; ++round) {
    for (const char* kind : {"read", "write"}) {
      for (bool keep_alive : {true, false}) {
        const int n = keep_alive ? calls : std::max(1, calls / 4);
        for (bool use_tls : {round % 2 == 1, round % 2 == 0}) {
          Sample s = Run(use_tls ? https_url : plain_url, use_tls ? tls->ca_file : "", kind, keep_alive, n);
          double mean = 0;
          for (double v : s.us) mean += v;
          mean /= static_cast<double>(s.us.size());
          std::printf("%-5d %-6s %-8s %-14s %9.0f %9.0f %9.0f %9.0f %12.0f\n", round, kind, use_tls ? "https" : "http",
                      keep_alive ? "keep-alive" : "new per call", Quantile(s.us, 0.5), Quantile(s.us, 0.99), mean,
                      Quantile(s.us, 1.0), s.cpu_s * 1e6 / static_cast<double>(s.us.size()));
          std::fflush(stdout);
        }
      }
    }
  }

  // Throughput: admin over plain HTTP against a tenant (role and quota checks) over HTTPS.
  std::string tenant_token;
  {
    HttpClient admin(plain_url, "bench-token");
    auto q = admin.Put("/v1/quotas/bench", R"({"max_tflops":100000,"max_vram_mib":1000000000,"max_gpus":0})");
    auto t = admin.Post("/v1/tokens", R"({"role":"tenant","tenant":"bench","description":"tls_latency"})");
    if (!q.ok() || q->status != 200 || !t.ok() || t->status != 201) {
      std::fprintf(stderr, "cannot make the tenant token: %s\n", t.ok() ? t->body.c_str() : t.status().ToString().c_str());
      return 1;
    }
    tenant_token = nlohmann::json::parse(t->body)["token"];
  }
  std::printf("\nthroughput: %d threads, kept-alive connections, allocate/release closed loop, %d s each\n", threads,
              seconds);
  std::printf("%-5s %-24s %10s %9s %9s %7s\n", "round", "scheme", "ops_per_s", "p50_us", "p99_us", "errors");
  // Four combinations, in a rotated order each round; the ratio the target is about is HTTPS with a
  // tenant token against plain HTTP with the admin token.
  struct Combo {
    const char* name;
    bool tls;
    bool tenant;
    double sum = 0;
  };
  Combo combos[] = {{"http, admin token", false, false}, {"https, tenant token", true, true},
                    {"http, tenant token", false, true}, {"https, admin token", true, false}};
  for (int round = 1; round <= rounds; ++round) {
    for (int k = 0; k < 4; ++k) {
      Combo& c = combos[(k + round - 1) % 4];
      if (const char* only = getenv("TLS_LATENCY_ONLY"); only && std::string(only) != c.name) continue;
      Throughput r = Flood(c.tls ? https_url : plain_url, c.tls ? tls->ca_file : "",
                           c.tenant ? tenant_token : "bench-token", threads, seconds);
      c.sum += r.ops_per_s;
      std::printf("%-5d %-24s %10.0f %9.0f %9.0f %7d\n", round, c.name, r.ops_per_s, Quantile(r.us, 0.5),
                  Quantile(r.us, 0.99), r.errors);
      std::fflush(stdout);
    }
  }
  for (const Combo& c : combos) {
    std::printf("throughput: %-20s %8.0f ops/s (mean of %d rounds), %.3f of http with the admin token\n", c.name,
                c.sum / rounds, rounds, c.sum / combos[0].sum);
  }
  plain.Stop();
  https.Stop();
  std::filesystem::remove_all(dir);
  return 0;
}
