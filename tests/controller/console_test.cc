// The console's server side: its static files (no token, strict headers), GET /v1/usage and the
// usage history behind GET /v1/history. The page itself is tested in a real browser
// (console_browser_test.py).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "api_server_fixture.h"
#include "controller/usage_history.h"
#include "controller/web_console.h"

namespace tf::controller {
namespace {

using nlohmann::json;

class ConsoleTest : public ApiServerFixture {
 protected:
  void BeforeStart(ApiServer& api) override { api.SetUsageHistory(&history_); }

  UsageHistory history_{1000, 5000};  // one sample a second, five kept
};

TEST_F(ConsoleTest, StaticFilesNeedNoTokenAndCarryAStrictPolicy) {
  HttpClient anonymous(url_, "");
  auto page = anonymous.Get("/console/");
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_NE(page->body.find("<script src=\"console.js\""), std::string::npos);
  const std::string csp = page->get_header_value("Content-Security-Policy");
  EXPECT_NE(csp.find("script-src 'self'"), std::string::npos) << csp;
  EXPECT_NE(csp.find("default-src 'none'"), std::string::npos) << csp;
  EXPECT_EQ(csp.find("unsafe"), std::string::npos) << csp;
  EXPECT_EQ(page->get_header_value("X-Content-Type-Options"), "nosniff");
  EXPECT_EQ(page->get_header_value("X-Frame-Options"), "DENY");

  auto js = anonymous.Get("/console/console.js");
  EXPECT_EQ(js->status, 200);
  EXPECT_EQ(js->get_header_value("Content-Type"), "text/javascript; charset=utf-8");
  EXPECT_NE(js->body.find("sessionStorage"), std::string::npos);
  EXPECT_EQ(anonymous.Get("/console/console.css")->status, 200);

  auto root = anonymous.Get("/");
  EXPECT_EQ(root->status, 302);
  EXPECT_EQ(root->get_header_value("Location"), "/console/");
  EXPECT_NE(anonymous.Get("/console/../v1/pools")->status, 200);  // no way around the token
  EXPECT_EQ(anonymous.Get("/console/missing.js")->status, 404);
  // Nothing on the console's paths changes state: other methods are refused.
  EXPECT_EQ(anonymous.Post("/console/", "{}")->status, 405);
}

TEST_F(ConsoleTest, ApiAnswersAreNotCachedAndNeedTheToken) {
  HttpClient anonymous(url_, "");
  auto r = anonymous.Get("/v1/usage");
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(r->get_header_value("Cache-Control"), "no-store");
  EXPECT_EQ(r->get_header_value("X-Content-Type-Options"), "nosniff");
  EXPECT_EQ(anonymous.Get("/v1/history")->status, 401);
  r = client_->Get("/v1/usage");
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Cache-Control"), "no-store");
  EXPECT_EQ(r->get_header_value("Content-Security-Policy"), "");  // the page's policy is the page's
}

TEST_F(ConsoleTest, UsageShowsPhysicalAndVirtualCapacity) {
  ASSERT_EQ(client_->Post("/v1/pools", R"({"name":"over","tflops_oversell_ratio":2,"vram_expand_to_host_percent":50,
                                             "placement_mode":"CompactFirst"})")
                ->status,
            201);
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"n1","pool":"over","gpus":[
      {"uuid":"GPU-1","model":"H100","index":0,"tflops":100,"vram_mib":80000},
      {"uuid":"GPU-2","model":"H100","index":1,"tflops":100,"vram_mib":80000}]})")
                ->status,
            200);
  ASSERT_EQ(client_->Post("/v1/nodes/n1/heartbeat", R"({"gpus":[{"uuid":"GPU-1","utilization_percent":50,"memory_used_mib":1000}]})")->status, 200);
  // 150 TFLOPS of vGPUs on one 100-TFLOPS GPU (no one vGPU may be more than its GPU).
  auto a = client_->Post("/v1/allocations", R"({"pool":"over","tflops":100,"vram_mib":60000})");
  ASSERT_EQ(a->status, 201) << a->body;
  const std::string placed = json::parse(a->body)["vgpus"][0]["gpu"];
  auto b = client_->Post("/v1/allocations", R"({"pool":"over","tflops":50,"vram_mib":40000})");
  ASSERT_EQ(b->status, 201) << b->body;
  ASSERT_EQ(json::parse(b->body)["vgpus"][0]["gpu"], placed) << "CompactFirst packs the same GPU";

  json u = json::parse(client_->Get("/v1/usage")->body);
  json pool;
  for (const json& p : u["pools"])
    if (p["name"] == "over") pool = p;
  EXPECT_EQ(pool["gpus"], 2);
  EXPECT_DOUBLE_EQ(pool["tflops"].get<double>(), 200);
  EXPECT_DOUBLE_EQ(pool["schedulable_tflops"].get<double>(), 400);
  EXPECT_DOUBLE_EQ(pool["used_tflops"].get<double>(), 150);
  EXPECT_EQ(pool["vram_mib"], 160000);
  EXPECT_EQ(pool["schedulable_vram_mib"], 240000);
  EXPECT_EQ(pool["used_vram_mib"], 100000);
  EXPECT_DOUBLE_EQ(pool["utilization_percent"].get<double>(), 25);  // 50% of one of two equal GPUs
  for (const json& g : u["gpus"]) {
    if (g["uuid"] != placed) continue;
    EXPECT_DOUBLE_EQ(g["free_tflops"].get<double>(), 50);  // the largest slice still fitting on it
    EXPECT_EQ(g["free_vram_mib"], 20000);
  }
}

TEST_F(ConsoleTest, HistoryKeepsTheNewestSamplesAndFiltersByPool) {
  testing::AddNodes(*c_, 1, 2);
  UsageSampler sampler(c_.get(), &history_, &clock_);
  for (int i = 0; i < 8; ++i) {
    if (i == 6) {
      ASSERT_EQ(client_->Post("/v1/allocations", R"({"tflops":10,"vram_mib":1024})")->status, 201);
    }
    sampler.SampleOnce();
    clock_.AdvanceMs(1000);
  }
  EXPECT_EQ(history_.size(), 5u);  // bounded: retention / interval
  auto r = client_->Get("/v1/history");
  ASSERT_EQ(r->status, 200);
  json h = json::parse(r->body);
  EXPECT_EQ(h["interval_ms"], 1000);
  EXPECT_EQ(h["retention_ms"], 5000);
  ASSERT_EQ(h["samples"].size(), 5u);
  EXPECT_EQ(h["samples"][0]["t_ms"], 1'003'000);  // the three oldest were dropped
  EXPECT_FALSE(h["samples"][0].contains("gpus"));  // per-GPU series only for one pool
  EXPECT_DOUBLE_EQ(h["samples"][2]["pools"][0]["used_tflops"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(h["samples"][3]["pools"][0]["used_tflops"].get<double>(), 10);

  h = json::parse(client_->Get("/v1/history?pool=default&since_ms=1006000")->body);
  ASSERT_EQ(h["samples"].size(), 1u);
  EXPECT_EQ(h["samples"][0]["t_ms"], 1'007'000);
  EXPECT_EQ(h["samples"][0]["gpus"].size(), 2u);

  EXPECT_EQ(client_->Get("/v1/history?since_ms=yesterday")->status, 400);
  EXPECT_EQ(client_->Get("/v1/history?since_ms=-5")->status, 400);
  EXPECT_EQ(client_->Get("/v1/history?pool=nope")->status, 404);
}

TEST_F(ConsoleTest, TenantTokensReadUsageButNotTokens) {
  auto made = client_->Post("/v1/tokens", R"({"role":"tenant","tenant":"alice"})");
  ASSERT_EQ(made->status, 201);
  HttpClient tenant(url_, json::parse(made->body)["token"].get<std::string>());
  EXPECT_EQ(tenant.Get("/v1/usage")->status, 200);
  EXPECT_EQ(tenant.Get("/v1/history")->status, 200);
  EXPECT_EQ(tenant.Get("/v1/tokens")->status, 403);
}

}  // namespace
}  // namespace tf::controller
