// Random JSON of the right shape with extreme numbers at every write route of the API; after each
// request the books must still balance: every GPU's usage is the sum of its allocations', nothing
// is negative, nothing is above capacity, every number is finite, and the server answers.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "controller/api_server.h"
#include "controller/http_client.h"
#include "controller/sqlite_store.h"
#include "test_cluster.h"

namespace tf::controller {
namespace {

using nlohmann::json;

class ApiFuzzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = std::move(SqliteStore::Open(dir_.path() + "/state.db")).value();
    c_ = std::make_unique<Controller>(store_.get(), &clock_, MakeSchedulerPlacement(), nullptr);
    ASSERT_TRUE(c_->Rebuild().ok());
    api_ = std::make_unique<ApiServer>(c_.get(), "tok");
    auto port = api_->Bind("127.0.0.1", 0);
    ASSERT_TRUE(port.ok());
    api_->Start();
    client_ = std::make_unique<HttpClient>("http://127.0.0.1:" + std::to_string(*port), "tok");
  }

  // A value of the kind a careless or hostile client sends where a number belongs.
  json Extreme() {
    static const std::vector<json> kValues = {
        json(0), json(-0.0), json(5e-324), json(1e308), json(-1e308), json(9007199254740993.0),
        json(int64_t{9007199254740991}), json(int64_t{9007199254740993}),
        json(std::numeric_limits<int64_t>::max()), json(std::numeric_limits<int64_t>::min()),
        json(std::numeric_limits<uint64_t>::max()), json(uint64_t{9223372036854775808ULL}),
        json(4294967297), json(-4294967295), json(-1), json(1), json(2), json(10), json(50.5), json(100),
        json(100.000001), json(1e16), json(9.3e15), json(std::string(10000, '9')), json("10"), json(nullptr),
        json::array({1}), json::object()};
    return kValues[rng_() % kValues.size()];
  }
  json Small() { return json(static_cast<int>(1 + rng_() % 60)); }
  json Num() { return rng_() % 3 == 0 ? Small() : Extreme(); }
  std::string Name() {
    static const char* kNames[] = {"n1", "n2", "w", "p", "t", "", "bad name", "x/y"};
    return kNames[rng_() % 8];
  }

  void Check(const std::string& what) {
    auto gpus = client_->Get("/v1/gpus");
    ASSERT_TRUE(gpus.ok() && gpus->status == 200) << what;
    auto allocs = client_->Get("/v1/allocations");
    ASSERT_TRUE(allocs.ok() && allocs->status == 200) << what;
    auto pools = client_->Get("/v1/pools");
    ASSERT_TRUE(pools.ok() && pools->status == 200) << what;
    std::map<std::string, double> oversell;
    // A pool's ratio may be lowered below what is already placed (nothing is evicted for it): the
    // bound is the highest ratio the pool has had.
    for (const json& p : json::parse(pools->body)["pools"])
      oversell[p["name"]] = max_ratio_[p["name"]] = std::max(max_ratio_[p["name"]], p["tflops_oversell_ratio"].get<double>());
    std::map<std::string, std::pair<double, int64_t>> sum;
    for (const json& a : json::parse(allocs->body)["allocations"]) {
      for (const json& v : a["vgpus"]) {
        const double t = v["tflops"].get<double>();
        ASSERT_TRUE(std::isfinite(t) && t >= 0) << what << ": " << a.dump();
        ASSERT_GT(v["vram_mib"].get<int64_t>(), 0) << what << ": " << a.dump();
        ASSERT_LE(v["share_ppm"].get<uint64_t>(), 1'000'000u) << what << ": " << a.dump();
        ASSERT_LE(v["limit_ppm"].get<uint64_t>(), 1'000'000u) << what << ": " << a.dump();
        sum[v["gpu"]].first += t;
        sum[v["gpu"]].second += v["vram_mib"].get<int64_t>();
      }
    }
    for (const json& g : json::parse(gpus->body)["gpus"]) {
      const double used = g["used_tflops"].get<double>(), cap = g["tflops"].get<double>();
      const int64_t used_v = g["used_vram_mib"].get<int64_t>(), cap_v = g["vram_mib"].get<int64_t>();
      const auto& s = sum[g["uuid"]];
      ASSERT_TRUE(std::isfinite(used) && used >= 0) << what << ": " << g.dump();
      ASSERT_NEAR(used, s.first, 1e-6 * std::max(1.0, s.first)) << what << ": " << g.dump();
      ASSERT_EQ(used_v, s.second) << what << ": " << g.dump();
      ASSERT_GE(used_v, 0) << what;
      ASSERT_LE(used_v, cap_v) << what << ": " << g.dump();
      const double ratio = oversell.count(g["pool"]) ? oversell[g["pool"]] : 1.0;
      ASSERT_LE(used, cap * ratio * (1 + 1e-9) + 1e-9) << what << ": " << g.dump();
    }
  }

  testing::TempDir dir_;
  FakeClock clock_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Controller> c_;
  std::unique_ptr<ApiServer> api_;
  std::unique_ptr<HttpClient> client_;
  std::mt19937_64 rng_{20261125};
  std::map<std::string, double> max_ratio_;
};

TEST_F(ApiFuzzTest, ExtremeNumbersAtEveryRouteNeverUnbalanceTheBooks) {
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-1","model":"L4","tflops":120,"vram_mib":23034},
                                                             {"uuid":"GPU-2","model":"H100","tflops":989,"vram_mib":81559}]})")
                ->status,
            200);
  std::vector<std::string> ids;
  int accepted = 0;
  for (int i = 0; i < 1500; ++i) {
    json body;
    std::string method = "POST", path;
    switch (rng_() % 9) {
      case 0:
      case 1:
      case 2: {
        path = "/v1/allocations";
        body = {{"vram_mib", Num()}};
        body[rng_() % 2 ? "tflops" : "percent"] = Num();
        if (rng_() % 3 == 0) body[rng_() % 2 ? "tflops_limit" : "percent_limit"] = Num();
        if (rng_() % 4 == 0) body["gpu_count"] = Num();
        if (rng_() % 4 == 0) body["tenant"] = "t";
        break;
      }
      case 3:
        path = "/v1/workloads";
        body = {{"name", Name()}, {"tflops", Num()}, {"vram_mib", Num()}, {"gpu_count", Num()}};
        break;
      case 4:
        method = rng_() % 2 ? "PUT" : "PATCH";
        path = "/v1/pools/default";
        body = {{"tflops_oversell_ratio", Num()}};
        break;
      case 5:
        method = "PUT";
        path = "/v1/quotas/t";
        body = {{"max_tflops", Num()}, {"max_vram_mib", Num()}, {"max_gpus", Num()}};
        break;
      case 6:
        path = "/v1/nodes/n1/heartbeat";
        body = {{"gpus", {{{"uuid", rng_() % 2 ? "GPU-1" : "GPU-9"}, {"utilization_percent", Num()},
                           {"memory_used_mib", Num()}}}}};
        break;
      case 7:
        path = "/v1/nodes";
        body = {{"name", "n2"}, {"gpus", {{{"uuid", "GPU-3"}, {"model", "X"}, {"tflops", Num()}, {"vram_mib", Num()}}}}};
        break;
      case 8:
        if (ids.empty()) continue;
        method = "DELETE";
        path = "/v1/allocations/" + ids[rng_() % ids.size()];
        break;
    }
    StatusOr<HttpResponse> r = method == "POST"    ? client_->Post(path, body.dump())
                               : method == "PUT"   ? client_->Put(path, body.dump())
                               : method == "PATCH" ? client_->Patch(path, body.dump())
                                                   : client_->Delete(path);
    const std::string what = method + " " + path + " " + body.dump().substr(0, 300);
    ASSERT_TRUE(r.ok()) << what << ": " << r.status().ToString();
    ASSERT_LT(r->status, 500) << what << ": " << r->body;
    if (r->status < 300) ++accepted;
    if (path == "/v1/allocations" && r->status == 201) ids.push_back(json::parse(r->body)["id"].get<std::string>());
    Check(what);
  }
  EXPECT_GT(accepted, 100) << "the fuzzer should also exercise the success paths";
  EXPECT_FALSE(ids.empty());
}

}  // namespace
}  // namespace tf::controller
