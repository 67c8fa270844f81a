#include "controller/api_server.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "controller/http_client.h"
#include "controller/sqlite_store.h"
#include "test_cluster.h"

namespace tf::controller {
namespace {

using nlohmann::json;

class ApiServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = std::move(SqliteStore::Open(dir_.path() + "/state.db")).value();
    c_ = std::make_unique<Controller>(store_.get(), &clock_, MakeCompactFirstPlacement(), nullptr);
    ASSERT_TRUE(c_->Rebuild().ok());
    api_ = std::make_unique<ApiServer>(c_.get(), "s3cret");
    auto port = api_->Bind("127.0.0.1", 0);
    ASSERT_TRUE(port.ok());
    url_ = "http://127.0.0.1:" + std::to_string(*port);
    api_->Start();
    client_ = std::make_unique<HttpClient>(url_, "s3cret");
  }
  json Body(const StatusOr<HttpResponse>& r) { return json::parse(r->body); }

  testing::TempDir dir_;
  FakeClock clock_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Controller> c_;
  std::unique_ptr<ApiServer> api_;
  std::string url_;
  std::unique_ptr<HttpClient> client_;
};

TEST(TokenEquals, ComparesWholeTokens) {
  EXPECT_TRUE(TokenEquals("abc", "abc"));
  EXPECT_FALSE(TokenEquals("abc", "abd"));
  EXPECT_FALSE(TokenEquals("abc", "ab"));
  EXPECT_FALSE(TokenEquals("abc", "abcabc"));
  EXPECT_FALSE(TokenEquals("abc", ""));
  EXPECT_FALSE(TokenEquals("", ""));
}

TEST_F(ApiServerTest, MissingOrWrongTokenIs401) {
  HttpClient none(url_, ""), wrong(url_, "guess");
  auto r = none.Get("/v1/pools");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(Body(r)["error"]["code"], "unauthenticated");
  EXPECT_EQ(wrong.Post("/v1/pools", R"({"name":"x"})")->status, 401);
  EXPECT_EQ(wrong.Get("/metrics")->status, 401);
  EXPECT_EQ(none.Get("/healthz")->status, 200);
  EXPECT_EQ(c_->ListPools().size(), 1u);  // only "default": nothing was created
}

TEST_F(ApiServerTest, BadJsonIs400WithAMessage) {
  auto r = client_->Post("/v1/allocations", "{not json");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(Body(r)["error"]["message"], "request body is not valid JSON");
  r = client_->Post("/v1/allocations", R"({"tflops":"ten","vram_mib":1})");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(Body(r)["error"]["message"], "field 'tflops' must be a number");
  r = client_->Post("/v1/allocations", R"({"vram_mib":1})");
  EXPECT_EQ(r->status, 400);
  r = client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-1","tflops":10}]})");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(Body(r)["error"]["message"], "gpus: field 'vram_mib' is required");
  r = client_->Post("/v1/pools", R"([1,2])");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(Body(r)["error"]["message"], "request body must be a JSON object");
}

TEST_F(ApiServerTest, AllocateReleaseAndExhaustion) {
  auto r = client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-1","model":"L4","tflops":120,"vram_mib":23034}]})");
  ASSERT_EQ(r->status, 200) << r->body;
  r = client_->Post("/v1/allocations", R"({"tflops":100,"vram_mib":20000,"qos":"high"})");
  ASSERT_EQ(r->status, 201) << r->body;
  std::string id = Body(r)["id"];
  EXPECT_EQ(Body(r)["vgpus"][0]["gpu"], "GPU-1");
  r = client_->Post("/v1/allocations", R"({"tflops":30,"vram_mib":100})");
  EXPECT_EQ(r->status, 409);
  EXPECT_EQ(Body(r)["error"]["code"], "out_of_memory");
  EXPECT_EQ(client_->Get("/v1/allocations/" + id)->status, 200);
  EXPECT_EQ(client_->Delete("/v1/allocations/" + id)->status, 200);
  EXPECT_EQ(client_->Delete("/v1/allocations/" + id)->status, 404);
  EXPECT_EQ(client_->Post("/v1/allocations", R"({"tflops":30,"vram_mib":100})")->status, 201);
  auto m = client_->Get("/metrics");
  EXPECT_NE(m->body.find("tf_controller_allocations_granted_total 2"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("tf_pool_capacity_tflops{pool=\"default\"} 120"), std::string::npos);
}

TEST_F(ApiServerTest, PoolsWorkloadsAndUnknownRoutes) {
  EXPECT_EQ(client_->Post("/v1/pools", R"({"name":"train"})")->status, 201);
  EXPECT_EQ(client_->Post("/v1/pools", R"({"name":"train"})")->status, 409);
  EXPECT_EQ(client_->Get("/v1/pools/train")->status, 200);
  EXPECT_EQ(client_->Get("/v1/pools/none")->status, 404);
  EXPECT_EQ(client_->Post("/v1/workloads", R"({"name":"w","pool":"train","tflops":5,"vram_mib":10})")->status, 201);
  EXPECT_EQ(client_->Post("/v1/workloads", R"({"name":"w2","pool":"zzz","tflops":5,"vram_mib":10})")->status, 404);
  EXPECT_EQ(client_->Delete("/v1/pools/train")->status, 200);
  EXPECT_EQ(client_->Get("/v1/nothing")->status, 404);
  EXPECT_EQ(client_->Post("/v1/nodes/ghost/heartbeat", "{}")->status, 404);
}

}  // namespace
}  // namespace tf::controller
