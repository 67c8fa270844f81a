// Compute is counted in whole milli-TFLOPS: a GPU's usage is the exact sum of its allocations
// however many fractional requests come and go, and a store written when usage was a sum of
// doubles still loads (and is rewritten in the integer form).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api_server_fixture.h"

namespace tf::controller {
namespace {

using nlohmann::json;

class ExactComputeTest : public ApiServerFixture {
 protected:
  json Get(const std::string& path) {
    auto r = client_->Get(path);
    EXPECT_TRUE(r.ok() && r->status == 200) << path;
    return r.ok() ? json::parse(r->body) : json::object();
  }
};

// Thousands of creates and releases of fractional TFLOPS in random order, through the API: after
// every step each GPU's used TFLOPS is exactly the sum of the requests of the vGPUs on it (the
// integer field and the decimal one), and once everything is released it is exactly 0.
TEST_F(ExactComputeTest, UsageIsTheExactSumOfTheAllocationsThroughThousandsOfSteps) {
  auto r = client_->Post("/v1/nodes", R"({"name":"n1","gpus":[
      {"uuid":"GPU-0","model":"L4","tflops":121,"vram_mib":23034},
      {"uuid":"GPU-1","model":"L4","tflops":121,"vram_mib":23034},
      {"uuid":"GPU-2","model":"L4","tflops":121,"vram_mib":23034}]})");
  ASSERT_EQ(r->status, 200) << r->body;

  const std::vector<double> sizes = {0.1, 0.2, 0.3, 1.0 / 3, 2.0 / 3, 0.7, 1.1, 0.001, 0.01, 12.345, 0.15, 3.3};
  std::mt19937 rng(17);
  std::map<std::string, std::vector<std::pair<std::string, MilliTflops>>> live;  // id -> (gpu, milli)
  int created = 0, released = 0, full = 0;
  for (int step = 0; step < 2500; ++step) {
    const bool create = live.empty() || rng() % 100 < 55;
    if (create) {
      const double t = sizes[rng() % sizes.size()];
      const int gpus = rng() % 5 == 0 ? 2 : 1;
      json body = {{"tflops", t}, {"vram_mib", 1}, {"gpu_count", gpus}};
      r = client_->Post("/v1/allocations", body.dump());
      ASSERT_TRUE(r.ok());
      if (r->status == 409) {
        ++full;
      } else {
        ASSERT_EQ(r->status, 201) << r->body;
        json a = json::parse(r->body);
        for (const json& v : a["vgpus"]) {
          // Converted once, rounded to the nearest milli-TFLOPS.
          ASSERT_EQ(v["milli_tflops"].get<MilliTflops>(), std::llround(t * 1000)) << v.dump();
          ASSERT_EQ(v["tflops"].get<double>(), static_cast<double>(std::llround(t * 1000)) / 1000) << v.dump();
          live[a["id"]].push_back({v["gpu"], v["milli_tflops"].get<MilliTflops>()});
        }
        ++created;
      }
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_EQ(client_->Delete("/v1/allocations/" + it->first)->status, 200);
      live.erase(it);
      ++released;
    }
    // What the test itself placed on each GPU, and what the served allocations say.
    std::map<std::string, MilliTflops> mine, served;
    for (const auto& [id, vgpus] : live)
      for (const auto& [gpu, m] : vgpus) mine[gpu] += m;
    json allocations = Get("/v1/allocations")["allocations"];
    ASSERT_EQ(allocations.size(), live.size());
    for (const json& a : allocations)
      for (const json& v : a["vgpus"]) served[v["gpu"]] += v["milli_tflops"].get<MilliTflops>();
    for (const json& g : Get("/v1/gpus")["gpus"]) {
      const std::string uuid = g["uuid"];
      ASSERT_EQ(g["used_milli_tflops"].get<MilliTflops>(), mine[uuid]) << "step " << step << " " << g.dump();
      ASSERT_EQ(g["used_milli_tflops"].get<MilliTflops>(), served[uuid]) << "step " << step;
      // The decimal is the milli-TFLOPS sum shown once, never an accumulated double.
      ASSERT_EQ(g["used_tflops"].get<double>(), static_cast<double>(mine[uuid]) / 1000) << "step " << step;
    }
  }
  EXPECT_GT(created, 800);
  EXPECT_GT(released, 800);
  for (const auto& [id, vgpus] : live) ASSERT_EQ(client_->Delete("/v1/allocations/" + id)->status, 200);
  for (const json& g : Get("/v1/gpus")["gpus"]) {
    EXPECT_EQ(g["used_milli_tflops"].get<MilliTflops>(), 0) << g.dump();
    EXPECT_EQ(g["used_tflops"].get<double>(), 0.0) << g.dump();
    EXPECT_EQ(g["used_tflops"].dump(), "0.0") << "exactly zero, not a residue";
  }
  // The pool's sums are exact too.
  auto m = Get("/v1/usage");
  EXPECT_EQ(m["pools"][0]["used_tflops"].get<double>(), 0.0);
  EXPECT_EQ(m["pools"][0]["tflops"].get<double>(), 363.0);
  (void)full;
}

// Values below the resolution are refused with a clear message rather than rounded to nothing,
// and rounding follows the documented rule (nearest milli-TFLOPS).
TEST_F(ExactComputeTest, RequestsBelowOneMilliTflopsAreRefusedAndOthersRoundToTheNearest) {
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-0","tflops":121,"vram_mib":1000}]})")->status, 200);
  auto r = client_->Post("/v1/allocations", R"({"tflops":0.0004,"vram_mib":1})");
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("at least 0.001"), std::string::npos) << r->body;
  r = client_->Post("/v1/allocations", R"({"tflops":1e300,"vram_mib":1})");
  EXPECT_EQ(r->status, 400) << r->body;
  r = client_->Post("/v1/allocations", R"({"tflops":0.0015,"vram_mib":1})");
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(json::parse(r->body)["vgpus"][0]["milli_tflops"], 2);
  r = client_->Put("/v1/quotas/t", R"({"max_tflops":1e300})");
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(c_->ListGpus("")[0].gpu.used_milli_tflops, 2);
}

// A store written when compute was stored as doubles only (no *_milli_* fields): it loads, the
// usage that differs from its allocations only in float rounding is read as the exact sum, usage
// that really disagrees is repaired, and every record the controller rewrites gets the integer
// form.
TEST(ExactComputeStore, AStoreWithDoubleUsageFieldsLoads) {
  testing::TempDir dir;
  FakeClock clock;
  auto store = std::move(SqliteStore::Open(dir.path() + "/state.db")).value();
  auto put = [&](const std::string& key, const json& v) {
    ASSERT_TRUE(store->Commit({}, {Write::Put(key, v.dump())}).ok());
  };
  put(std::string(kPoolPrefix) + "default", {{"name", "default"}, {"placement_mode", "NodeCompactGPULowLoad"}});
  put(std::string(kNodePrefix) + "n1", {{"name", "n1"}, {"pool", "default"}, {"state", "ready"}});
  // 0.1 + 0.2 + 0.3 summed as doubles is 0.6000000000000001.
  put(std::string(kGpuPrefix) + "GPU-0", {{"uuid", "GPU-0"}, {"node", "n1"}, {"pool", "default"}, {"model", "L4"},
                                          {"index", 0}, {"tflops", 121.0}, {"vram_mib", 23034},
                                          {"used_tflops", 0.1 + 0.2 + 0.3}, {"used_vram_mib", 3}});
  // Usage that does not match its one allocation (1/3 TFLOPS): repaired on start.
  put(std::string(kGpuPrefix) + "GPU-1", {{"uuid", "GPU-1"}, {"node", "n1"}, {"pool", "default"}, {"model", "L4"},
                                          {"index", 1}, {"tflops", 121.0}, {"vram_mib", 23034},
                                          {"used_tflops", 5.0}, {"used_vram_mib", 1}});
  auto alloc = [&](const std::string& id, const std::string& gpu, double t) {
    put(std::string(kAllocationPrefix) + id,
        {{"id", id}, {"pool", "default"}, {"node", "n1"}, {"qos", "medium"},
         {"vgpus", {{{"gpu", gpu}, {"tflops", t}, {"vram_mib", 1}, {"gpu_index", gpu == "GPU-0" ? 0 : 1}}}}});
  };
  alloc("a1", "GPU-0", 0.1);
  alloc("a2", "GPU-0", 0.2);
  alloc("a3", "GPU-0", 0.3);
  alloc("a4", "GPU-1", 1.0 / 3);
  put(std::string(kWorkloadPrefix) + "w", {{"name", "w"}, {"pool", "default"}, {"tflops", 0.25}, {"vram_mib", 1}});
  put(std::string(kQuotaPrefix) + "t", {{"tenant", "t"}, {"max_tflops", 0.5}});

  Controller c(store.get(), &clock, MakeSchedulerPlacement(), nullptr);
  ASSERT_TRUE(c.Rebuild().ok());
  std::map<std::string, Gpu> gpus;
  for (const GpuStatus& g : c.ListGpus("")) gpus[g.gpu.uuid] = g.gpu;
  EXPECT_EQ(gpus["GPU-0"].milli_tflops, 121'000);
  EXPECT_EQ(gpus["GPU-0"].used_milli_tflops, 600);
  EXPECT_EQ(gpus["GPU-1"].used_milli_tflops, 333) << "repaired from its allocation";
  EXPECT_EQ(c.GetWorkload("w")->milli_tflops, 250);
  EXPECT_EQ(c.GetWorkload("w")->milli_tflops_limit, 250);
  auto quotas = c.ListTenantQuotas();
  ASSERT_EQ(quotas.size(), 1u);
  EXPECT_EQ(quotas[0].max_milli_tflops, 500);

  // The repaired GPU was written in the new form.
  auto stored = [&](const std::string& uuid) {
    auto kv = store->Get(std::string(kGpuPrefix) + uuid);
    return kv.ok() && kv->has_value() ? json::parse((*kv)->value) : json::object();
  };
  EXPECT_EQ(stored("GPU-1")["used_milli_tflops"], 333);
  EXPECT_EQ(stored("GPU-1")["used_tflops"].get<double>(), 0.333);

  // Releasing the old allocations subtracts exactly: 0.6 - 0.1 - 0.2 - 0.3 is 0, not a residue.
  for (const char* id : {"a1", "a2", "a3"}) ASSERT_TRUE(c.Release(id).ok()) << id;
  auto g0 = stored("GPU-0");
  EXPECT_EQ(g0["used_milli_tflops"], 0);
  EXPECT_EQ(g0["used_tflops"].get<double>(), 0.0);
  EXPECT_EQ(g0["milli_tflops"], 121'000);
  // The quota still applies in its converted form: 0.5 TFLOPS for tenant t.
  AllocationRequest over{"", "", 0.501, 1, 1, "", ""};
  over.tenant = "t";
  EXPECT_EQ(c.Allocate(over).status().code(), StatusCode::kResourceExhausted);
  AllocationRequest at{"", "", 0.5, 1, 1, "", ""};
  at.tenant = "t";
  EXPECT_TRUE(c.Allocate(at).ok());
}

}  // namespace
}  // namespace tf::controller
