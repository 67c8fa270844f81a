#include "controller/api_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>

#include <nlohmann/json.hpp>

#include "api_server_fixture.h"
#include "exposition_parser.h"

namespace tf::controller {
namespace {

using nlohmann::json;

class ApiServerTest : public ApiServerFixture {
 protected:
  json Body(const StatusOr<HttpResponse>& r) { return json::parse(r->body); }
};

// One HTTP/1.1 request written as given (headers this test chooses, the body as is) to the
// server at `url` ("http://127.0.0.1:PORT"); the status and body of its answer (0 when none).
// Without `content_length` the request has no Content-Length header (as `curl -X POST` sends).
std::pair<int, std::string> RawRequest(const std::string& url, const std::string& head, const std::string& body,
                                       bool content_length = true) {
  const int port = std::stoi(url.substr(url.rfind(':') + 1));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return {0, ""};
  }
  const std::string request =
      head + "Host: 127.0.0.1\r\nConnection: close\r\n" +
      (content_length ? "Content-Length: " + std::to_string(body.size()) + "\r\n" : std::string()) + "\r\n" + body;
  for (size_t sent = 0; sent < request.size();) {
    ssize_t n = write(fd, request.data() + sent, request.size() - sent);
    if (n <= 0) break;  // the server may answer (413) and close before it has read everything
    sent += static_cast<size_t>(n);
  }
  std::string answer;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) answer.append(buf, static_cast<size_t>(n));
  close(fd);
  if (answer.rfind("HTTP/1.1 ", 0) != 0) return {0, answer};
  const size_t body_at = answer.find("\r\n\r\n");
  return {std::stoi(answer.substr(9, 3)), body_at == std::string::npos ? "" : answer.substr(body_at + 4)};
}

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
  // The scheme is case-insensitive (RFC 7235); the token is not.
  for (const auto& [auth, status] : std::vector<std::pair<std::string, int>>{
           {"bearer s3cret", 200}, {"BEARER s3cret", 200}, {"Bearer S3CRET", 401}, {"Bearers3cret", 401}})
    EXPECT_EQ(RawRequest(url_, "GET /v1/pools HTTP/1.1\r\nAuthorization: " + auth + "\r\n", "").first, status) << auth;
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
  // Free text a node reports is printed by tables and terminals: no control characters (a node
  // token could write escape sequences into an operator's terminal).
  for (const char* bad : {R"({"name":"n1","address":"\u001b[2J\u001b[Hfake prompt$ "})",
                          R"({"name":"n1","gpus":[{"uuid":"GPU-1","model":"\u001b]0;owned\u0007H100","tflops":10,"vram_mib":1}]})",
                          R"({"name":"n1","gpus":[{"uuid":"GPU-1","model":"H100\nnewline","tflops":10,"vram_mib":1}]})"}) {
    r = client_->Post("/v1/nodes", bad);
    EXPECT_EQ(r->status, 400) << bad;
    EXPECT_NE(r->body.find("may only hold printable ASCII characters"), std::string::npos) << r->body;
  }
  // A GPU's number on its node and its NUMA node are in range.
  for (auto [bad, says] : {std::pair{R"({"name":"n1","gpus":[{"uuid":"GPU-1","index":-5,"tflops":10,"vram_mib":1}]})",
                                     "GPU GPU-1: index must be from 0 to 63"},
                           std::pair{R"({"name":"n1","gpus":[{"uuid":"GPU-1","numa_node":-7,"tflops":10,"vram_mib":1}]})",
                                     "GPU GPU-1: numa_node must be from 0 to 1023, or -1 (unknown)"}}) {
    r = client_->Post("/v1/nodes", bad);
    EXPECT_EQ(r->status, 400) << bad;
    EXPECT_NE(r->body.find(says), std::string::npos) << r->body;
  }
  EXPECT_TRUE(c_->ListNodes().empty());
  r = client_->Post("/v1/pools", R"([1,2])");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(Body(r)["error"]["message"], "request body must be a JSON object");
}

// A field a request does not take is refused, and nothing changes: ignored, a typo passes for a
// field left out (a quota PUT with "max_vram_gib" cleared the tenant's limits).
TEST_F(ApiServerTest, AFieldTheRequestDoesNotTakeIsRefusedAndChangesNothing) {
  ASSERT_EQ(client_->Put("/v1/quotas/acme", R"({"max_tflops":600,"max_gpus":4})")->status, 200);
  auto r = client_->Put("/v1/quotas/acme", R"({"max_vram_gib":100})");
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(Body(r)["error"]["message"].get<std::string>().find("field 'max_vram_gib' is not known here (a quota takes "
                                                                 "max_tflops, max_vram_mib, max_gpus, max_qos)"),
            std::string::npos)
      << r->body;
  const json quotas = Body(client_->Get("/v1/quotas"))["quotas"];
  ASSERT_EQ(quotas.size(), 1u);
  EXPECT_EQ(quotas[0]["max_tflops"], 600.0) << "the refused PUT changed nothing";
  EXPECT_EQ(quotas[0]["max_gpus"], 4);
  r = client_->Post("/v1/allocations", R"({"tflops":1,"vram_mib":10,"bogus_field":1})");
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_TRUE(Body(client_->Get("/v1/allocations"))["allocations"].empty());
  r = client_->Post("/v1/workloads", R"({"name":"w","tflops":1,"vram_mib":10,"gpus":2})");
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("field 'gpus' is not known here (a workload takes "), std::string::npos) << r->body;
  EXPECT_EQ(client_->Get("/v1/workloads/w")->status, 404);
  ASSERT_EQ(client_->Post("/v1/pools", R"({"name":"p1"})")->status, 201);
  for (const char* bad : {R"({"foo":1})", R"({"name":"p2"})"})
    EXPECT_EQ(client_->Patch("/v1/pools/p1", bad)->status, 400) << bad;
  EXPECT_EQ(client_->Put("/v1/pools/p1", R"({"tflops_oversell":2})")->status, 400);
  EXPECT_EQ(client_->Post("/v1/pools", R"({"name":"p3","mode":"FragAware"})")->status, 400);
  EXPECT_EQ(client_->Get("/v1/pools/p3")->status, 404);
  EXPECT_EQ(client_->Post("/v1/tokens", R"({"role":"tenant","tenant":"acme","expires":"1d"})")->status, 400);
  // A field the role does not take is refused, not dropped.
  r = client_->Post("/v1/tokens", R"({"role":"tenant","tenant":"acme","node":"vm"})");
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_NE(r->body.find("a tenant token names no node"), std::string::npos) << r->body;
  EXPECT_EQ(client_->Post("/v1/tokens", R"({"role":"node","node":"vm","tenant":"acme"})")->status, 400);
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
  tf::testing::ParsedExposition e;
  ASSERT_EQ(tf::testing::ParseExposition(m->body, &e), "") << m->body;
  EXPECT_EQ(e.Value("tf_controller_placements_total", {{"pool", "default"}, {"result", "placed"}}), 2) << m->body;
  EXPECT_EQ(e.Value("tf_controller_placements_total", {{"pool", "default"}, {"result", "no_capacity"}}), 1);
  EXPECT_EQ(e.Value("tf_controller_placements_total", {{"pool", "default"}, {"result", "quota"}}), 0);
  EXPECT_EQ(e.Value("tf_pool_capacity_tflops", {{"pool", "default"}}), 120);
  EXPECT_EQ(e.Value("tf_pool_allocated_tflops", {{"pool", "default"}}), 30);
  EXPECT_EQ(e.Value("tf_pool_allocated_vram_bytes", {{"pool", "default"}}), 100.0 * 1024 * 1024);
  EXPECT_EQ(e.Value("tf_gpu_allocated_tflops", {{"gpu", "GPU-1"}, {"node", "n1"}}), 30);
  EXPECT_EQ(e.Value("tf_allocation_request_tflops", {{"gpu", "GPU-1"}}), 30);
  EXPECT_EQ(e.families["tf_controller_api_request_seconds"].type, "histogram");
}

// A refusal by quota counts under its own result; a request naming a pool that does not exist
// adds no series (outside input cannot grow the label values); the exposition stays valid.
TEST_F(ApiServerTest, MetricsCountRefusalsByResultAndStayValid) {
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-1","model":"L4","tflops":120,"vram_mib":23034}]})")->status, 200);
  ASSERT_EQ(client_->Put("/v1/quotas/acme", R"({"max_tflops":10})")->status, 200);
  EXPECT_NE(client_->Post("/v1/allocations", R"({"tflops":50,"vram_mib":100,"tenant":"acme"})")->status, 201);
  EXPECT_EQ(client_->Post("/v1/allocations", R"({"tflops":5,"vram_mib":100,"pool":"nope"})")->status, 404);
  ASSERT_EQ(client_->Post("/v1/allocations", R"({"tflops":5,"vram_mib":100,"tenant":"acme"})")->status, 201);
  auto m = client_->Get("/metrics");
  tf::testing::ParsedExposition e;
  ASSERT_EQ(tf::testing::ParseExposition(m->body, &e), "") << m->body;
  EXPECT_EQ(e.Value("tf_controller_placements_total", {{"pool", "default"}, {"result", "quota"}}), 1) << m->body;
  EXPECT_EQ(e.Value("tf_controller_placements_total", {{"pool", "default"}, {"result", "placed"}}), 1);
  EXPECT_EQ(m->body.find("nope"), std::string::npos) << m->body;
  EXPECT_EQ(e.Value("tf_allocation_request_tflops", {{"tenant", "acme"}}), 5);
}

TEST_F(ApiServerTest, ComputeLimitRoundTripsAndBadLimitsAreRefusedWithAMessage) {
  auto r = client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-1","model":"L4","tflops":100,"vram_mib":23034}]})");
  ASSERT_EQ(r->status, 200) << r->body;
  r = client_->Post("/v1/allocations", R"({"tflops":25,"tflops_limit":100,"vram_mib":1000})");
  ASSERT_EQ(r->status, 201) << r->body;
  const std::string id = Body(r)["id"];
  EXPECT_EQ(Body(r)["vgpus"][0]["tflops_limit"], 100.0);
  EXPECT_EQ(Body(r)["vgpus"][0]["limit_ppm"], 1000000);
  EXPECT_EQ(Body(r)["vgpus"][0]["share_ppm"], 250000);
  auto got = client_->Get("/v1/allocations/" + id);
  EXPECT_EQ(Body(got)["vgpus"][0]["tflops_limit"], 100.0);
  r = client_->Post("/v1/allocations", R"({"percent":10,"percent_limit":50,"vram_mib":1000})");
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Body(r)["vgpus"][0]["limit_ppm"], 500000);
  r = client_->Post("/v1/workloads", R"({"name":"w","tflops":10,"tflops_limit":40,"vram_mib":100})");
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Body(client_->Get("/v1/workloads/w"))["tflops_limit"], 40.0);

  struct Case {
    const char* body;
    int status;
    const char* says;
  } cases[] = {
      {R"({"tflops":30,"tflops_limit":20,"vram_mib":100})", 400, "tflops_limit 20 is below the request tflops 30"},
      {R"({"percent":30,"percent_limit":20,"vram_mib":100})", 400, "percent_limit 20 is below the request percent 30"},
      {R"({"percent":30,"percent_limit":101,"vram_mib":100})", 400, "percent_limit must be a number in (0, 100]"},
      {R"({"tflops":30,"tflops_limit":0,"vram_mib":100})", 400, "tflops_limit must be a positive number"},
      {R"({"tflops":30,"tflops_limit":"lots","vram_mib":100})", 400, "'tflops_limit' must be a number"},
      {R"({"tflops":30,"percent_limit":50,"vram_mib":100})", 400, "in the request's unit"},
      {R"({"tflops":10,"tflops_limit":150,"vram_mib":100})", 409, "tflops_limit 150 is more than any GPU"},
      {R"({"tflops":500,"vram_mib":100})", 409, "tflops 500 is more than any GPU in pool 'default' has"},
      {R"({"tflops":50,"vram_mib":100,"gpu_count":3})", 409, "nor would it with nothing placed"},
  };
  for (const Case& k : cases) {
    auto bad = client_->Post("/v1/allocations", k.body);
    EXPECT_EQ(bad->status, k.status) << k.body << " " << bad->body;
    EXPECT_NE(bad->body.find(k.says), std::string::npos) << k.body << " " << bad->body;
    // Refused, it got no id: the answer names none for the user to look up in vain.
    EXPECT_EQ(bad->body.find("'a-"), std::string::npos) << k.body << " " << bad->body;
  }
  ASSERT_EQ(client_->Put("/v1/quotas/t", R"({"max_tflops":5})")->status, 200);
  auto over = client_->Post("/v1/allocations", R"({"tflops":10,"vram_mib":100,"tenant":"t"})");
  EXPECT_NE(over->body.find("tenant 't' would exceed its TFLOPS quota: uses 0 of 5 TFLOPS and asks 10\""),
            std::string::npos)
      << over->body;
  EXPECT_EQ(client_->Post("/v1/workloads", R"({"name":"x","tflops":10,"tflops_limit":5,"vram_mib":100})")->status, 400);
  EXPECT_EQ(Body(client_->Get("/v1/allocations"))["allocations"].size(), 2u);
  EXPECT_EQ(client_->Get("/v1/workloads/x")->status, 404);
}

TEST_F(ApiServerTest, HigherQosPreemptsAndTheResponseNamesTheVictims) {
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-1","model":"L4","tflops":100,"vram_mib":20000}]})")->status, 200);
  auto low = client_->Post("/v1/allocations", R"({"tflops":60,"vram_mib":1000,"qos":"low"})");
  auto med = client_->Post("/v1/allocations", R"({"tflops":30,"vram_mib":1000,"qos":"medium"})");
  ASSERT_EQ(low->status, 201);
  ASSERT_EQ(med->status, 201);
  EXPECT_TRUE(Body(med)["preempted"].empty());
  // No preemption wanted: refused.
  auto r = client_->Post("/v1/allocations", R"({"tflops":50,"vram_mib":1000,"qos":"high","allow_preemption":false})");
  EXPECT_EQ(r->status, 409);
  // High 50 fits once the low 60 is gone; the medium one stays.
  r = client_->Post("/v1/allocations", R"({"tflops":50,"vram_mib":1000,"qos":"high"})");
  ASSERT_EQ(r->status, 201) << r->body;
  ASSERT_EQ(Body(r)["preempted"].size(), 1u);
  EXPECT_EQ(Body(r)["preempted"][0], Body(low)["id"]);
  EXPECT_EQ(client_->Get("/v1/allocations/" + std::string(Body(low)["id"]))->status, 404);
  EXPECT_EQ(client_->Get("/v1/allocations/" + std::string(Body(med)["id"]))->status, 200);
  // Critical 95: the high 50 and the medium 30 are both lower; with 20 free, both must go.
  r = client_->Post("/v1/allocations", R"({"tflops":95,"vram_mib":1000,"qos":"critical"})");
  EXPECT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Body(r)["preempted"].size(), 2u);
  r = client_->Post("/v1/allocations", R"({"tflops":10,"vram_mib":1000,"qos":"critical"})");
  EXPECT_EQ(r->status, 409);  // nothing lower than critical is left: no futile eviction
  EXPECT_EQ(Body(client_->Get("/v1/allocations"))["allocations"].size(), 1u);
}

// In a pool that oversells VRAM (its allocations have tiering) a preempted allocation is
// suspended, not released: it stays listed and bound to its GPU, its room goes to the preemptor,
// it survives a controller restart, and it resumes on its own when the preemptor is released.
// Deleting a suspended allocation frees nothing twice.
TEST_F(ApiServerTest, APreemptedTieredAllocationIsSuspendedAndResumesWhenTheRoomIsBack) {
  ASSERT_EQ(client_->Post("/v1/pools", R"({"name":"over","vram_expand_to_host_percent":100})")->status, 201);
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"n1","pool":"over","gpus":[{"uuid":"GPU-1","model":"L4","tflops":100,"vram_mib":20000}]})")->status, 200);
  auto low = client_->Post("/v1/allocations", R"({"pool":"over","tflops":60,"vram_mib":30000,"qos":"low"})");
  ASSERT_EQ(low->status, 201) << low->body;
  const std::string low_id = Body(low)["id"];
  EXPECT_TRUE(Body(low)["tiering"]);
  auto gpu_use = [&] {
    json g = Body(client_->Get("/v1/gpus"))["gpus"][0];
    return std::make_pair(g["used_milli_tflops"].get<int64_t>(), g["used_vram_mib"].get<int64_t>());
  };
  auto crit = client_->Post("/v1/allocations", R"({"pool":"over","tflops":60,"vram_mib":20000,"qos":"critical"})");
  ASSERT_EQ(crit->status, 201) << crit->body;
  const std::string crit_id = Body(crit)["id"];
  EXPECT_EQ(Body(crit)["preempted"], json::array({low_id}));
  EXPECT_EQ(Body(crit)["preempted_suspended"], json::array({low_id}));
  EXPECT_FALSE(Body(crit)["suspended"]);
  json held = Body(client_->Get("/v1/allocations/" + low_id));
  EXPECT_TRUE(held["suspended"]);
  EXPECT_EQ(held["suspended_by"], crit_id);
  EXPECT_EQ(held["node"], "n1");
  EXPECT_EQ(held["vgpus"][0]["gpu"], "GPU-1");
  EXPECT_EQ(gpu_use(), std::make_pair(int64_t{60'000}, int64_t{20'000})) << "only the preemptor counts";
  EXPECT_EQ(Body(client_->Get("/v1/allocations"))["allocations"].size(), 2u);
  EXPECT_TRUE(Body(client_->Get("/v1/evictions"))["evictions"].empty()) << "nothing is stopped";
  // A thaw would take the GPU back: refused while suspended.
  auto thaw = client_->Post("/v1/allocations/" + low_id + "/thaw", "{}");
  EXPECT_EQ(thaw->status, 409);
  EXPECT_NE(thaw->body.find("suspended"), std::string::npos) << thaw->body;
  // A suspended allocation is never a victim again: nothing lower is left to take room from.
  EXPECT_EQ(client_->Post("/v1/allocations", R"({"pool":"over","tflops":50,"vram_mib":100,"qos":"critical"})")->status, 409);

  {  // A controller started on the same store sees the same.
    Controller again(store_.get(), &clock_, MakeSchedulerPlacement(), nullptr);
    ASSERT_TRUE(again.Rebuild().ok());
    auto a = again.GetAllocation(low_id);
    ASSERT_TRUE(a.ok());
    EXPECT_TRUE(a->suspended);
    EXPECT_EQ(a->suspended_by, crit_id);
    EXPECT_EQ(again.ListGpus("")[0].gpu.used_vram_mib, 20000);
  }

  // The preemptor goes: the suspended one counts again, on the same GPU.
  auto deleted = client_->Delete("/v1/allocations/" + crit_id);
  ASSERT_EQ(deleted->status, 200) << deleted->body;
  held = Body(client_->Get("/v1/allocations/" + low_id));
  EXPECT_FALSE(held["suspended"]);
  EXPECT_EQ(held["vgpus"][0]["gpu"], "GPU-1");
  EXPECT_EQ(gpu_use(), std::make_pair(int64_t{60'000}, int64_t{30'000}));

  // Suspended again, then deleted: the GPU holds the preemptor's use only.
  crit = client_->Post("/v1/allocations", R"({"pool":"over","tflops":60,"vram_mib":20000,"qos":"critical"})");
  ASSERT_EQ(crit->status, 201) << crit->body;
  ASSERT_TRUE(Body(client_->Get("/v1/allocations/" + low_id))["suspended"]);
  ASSERT_EQ(client_->Delete("/v1/allocations/" + low_id)->status, 200);
  EXPECT_EQ(client_->Get("/v1/allocations/" + low_id)->status, 404);
  EXPECT_EQ(gpu_use(), std::make_pair(int64_t{60'000}, int64_t{20'000}));
  ASSERT_EQ(client_->Delete("/v1/allocations/" + std::string(Body(crit)["id"]))->status, 200);
  EXPECT_EQ(gpu_use(), std::make_pair(int64_t{0}, int64_t{0}));

  auto m = client_->Get("/metrics");
  tf::testing::ParsedExposition e;
  ASSERT_EQ(tf::testing::ParseExposition(m->body, &e), "") << m->body;
  EXPECT_EQ(e.Value("tf_controller_allocations_suspended_total", {}), 2);
  EXPECT_EQ(e.Value("tf_controller_allocations_resumed_total", {}), 1);
  EXPECT_EQ(e.Value("tf_controller_allocations_preempted_total", {}), 0) << "none was released";
}

TEST_F(ApiServerTest, PoolModeOversellAndTenantQuotaOverHttp) {
  auto r = client_->Post("/v1/pools", R"({"name":"frag","placement_mode":"FragAware","tflops_oversell_ratio":1.5})");
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Body(r)["placement_mode"], "FragAware");
  EXPECT_EQ(client_->Post("/v1/pools", R"({"name":"bad","placement_mode":"random"})")->status, 400);
  EXPECT_EQ(client_->Put("/v1/pools/frag", R"({"placement_mode":"BestFit","tflops_oversell_ratio":2})")->status, 200);
  EXPECT_EQ(Body(client_->Get("/v1/pools/frag"))["placement_mode"], "BestFit");
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"n1","pool":"frag","gpus":[{"uuid":"GPU-1","model":"L4","tflops":100,"vram_mib":20000}]})")->status, 200);
  // 2x oversell: 150 + 50 TFLOPS on a 100-TFLOPS GPU.
  EXPECT_EQ(client_->Post("/v1/allocations", R"({"pool":"frag","tflops":100,"vram_mib":100})")->status, 201);
  EXPECT_EQ(client_->Post("/v1/allocations", R"({"pool":"frag","tflops":100,"vram_mib":100})")->status, 201);
  EXPECT_EQ(client_->Post("/v1/allocations", R"({"pool":"frag","tflops":1,"vram_mib":100})")->status, 409);
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"n2","gpus":[{"uuid":"GPU-2","model":"L4","tflops":100,"vram_mib":20000}]})")->status, 200);
  EXPECT_EQ(client_->Put("/v1/quotas/team", R"({"max_gpus":1})")->status, 200);
  EXPECT_EQ(client_->Post("/v1/allocations", R"({"tenant":"team","percent":10,"vram_mib":100})")->status, 201);
  r = client_->Post("/v1/allocations", R"({"tenant":"team","percent":10,"vram_mib":100})");
  EXPECT_EQ(r->status, 409);
  EXPECT_EQ(Body(r)["error"]["code"], "resource_exhausted");
  EXPECT_EQ(Body(client_->Get("/v1/quotas"))["quotas"][0]["max_gpus"], 1);
  EXPECT_EQ(client_->Post("/v1/allocations", R"({"percent":10,"tflops":3,"vram_mib":100})")->status, 400);
}

// The node agent reports each allocation's vGPU counters with its heartbeat; the allocation list
// shows the use over the last interval and the time throttled. Bad reports change nothing.
TEST_F(ApiServerTest, HeartbeatsCarryVgpuUseIntoTheAllocationList) {
  auto r = client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-1","model":"L4","tflops":120,"vram_mib":23034}]})");
  ASSERT_EQ(r->status, 200) << r->body;
  r = client_->Post("/v1/allocations", R"({"percent":25,"percent_limit":100,"vram_mib":100})");
  ASSERT_EQ(r->status, 201) << r->body;
  const std::string id = Body(r)["id"];
  auto beat = [&](int64_t busy, int64_t throttled) {
    return client_->Post("/v1/nodes/n1/heartbeat",
                         json{{"vgpus", {{{"allocation", id}, {"gpu", "GPU-1"}, {"busy_ns_total", busy},
                                          {"throttled_ns_total", throttled}}}}}.dump());
  };
  auto vgpu = [&] { return Body(client_->Get("/v1/allocations"))["allocations"][0]["vgpus"][0]; };
  ASSERT_EQ(beat(1'000'000'000, 0)->status, 200);
  EXPECT_FALSE(vgpu().contains("use_percent")) << "one sample has no interval yet";
  clock_.AdvanceMs(2'000);
  ASSERT_EQ(beat(1'500'000'000, 300'000'000)->status, 200);
  EXPECT_NEAR(vgpu()["use_percent"].get<double>(), 25.0, 1e-9);  // 0.5 s busy in 2 s
  EXPECT_NEAR(vgpu()["throttled_seconds"].get<double>(), 0.3, 1e-9);

  for (const char* bad : {R"({"vgpus":[{"allocation":"a-x","gpu":"GPU-1","busy_ns_total":-1,"throttled_ns_total":0}]})",
                          R"({"vgpus":[{"gpu":"GPU-1","busy_ns_total":1,"throttled_ns_total":0}]})",
                          R"({"vgpus":[{"allocation":"a-x","gpu":"GPU-1","busy_ns_total":"1","throttled_ns_total":0}]})",
                          R"({"vgpus":[7]})", R"({"vgpus":{}})"}) {
    r = client_->Post("/v1/nodes/n1/heartbeat", bad);
    EXPECT_EQ(r->status, 400) << bad;
    EXPECT_EQ(Body(r)["error"]["code"], "invalid_argument") << bad;
  }
  EXPECT_NEAR(vgpu()["use_percent"].get<double>(), 25.0, 1e-9) << "refused reports change nothing";
  EXPECT_EQ(vgpu()["processes"], json::array()) << "reported without processes: none listed";
  // The processes on the vGPU, as its node's quota region lists them; bad lists are refused.
  json report = {{"vgpus", {{{"allocation", id}, {"gpu", "GPU-1"}, {"busy_ns_total", 1'500'000'000},
                              {"throttled_ns_total", 300'000'000},
                              {"processes", {{{"pid", 4242}, {"vram_bytes", 512ll << 20}}}}}}}};
  ASSERT_EQ(client_->Post("/v1/nodes/n1/heartbeat", report.dump())->status, 200);
  EXPECT_EQ(vgpu()["processes"], json::parse(R"([{"pid":4242,"vram_mib":512}])"));
  for (json bad_procs : {json::parse(R"([{"pid":0,"vram_bytes":1}])"), json::parse(R"([{"vram_bytes":1}])"),
                         json::parse(R"([{"pid":5,"vram_bytes":-1}])"), json::parse(R"([7])"),
                         json::parse(R"({"pid":5})")}) {
    json b = report;
    b["vgpus"][0]["processes"] = bad_procs;
    r = client_->Post("/v1/nodes/n1/heartbeat", b.dump());
    EXPECT_EQ(r->status, 400) << b.dump();
  }
  json many = report;
  many["vgpus"][0]["processes"] = json::array();
  for (int i = 1; i <= 257; ++i) many["vgpus"][0]["processes"].push_back({{"pid", i}, {"vram_bytes", 0}});
  EXPECT_EQ(client_->Post("/v1/nodes/n1/heartbeat", many.dump())->status, 400);
  EXPECT_EQ(vgpu()["processes"], json::parse(R"([{"pid":4242,"vram_mib":512}])")) << "refused reports change nothing";
  EXPECT_FALSE(vgpu().contains("turn_seconds")) << "not reported: not shown";
  // Of the throttled time, the part spent waiting for other vGPUs' turns (0..throttled).
  json turns = {{"vgpus", {{{"allocation", id}, {"gpu", "GPU-1"}, {"busy_ns_total", 1'500'000'000},
                             {"throttled_ns_total", 300'000'000}, {"held_turn_ns_total", 200'000'000}}}}};
  ASSERT_EQ(client_->Post("/v1/nodes/n1/heartbeat", turns.dump())->status, 200);
  EXPECT_NEAR(vgpu()["turn_seconds"].get<double>(), 0.2, 1e-9);
  for (json bad_turns : {json(-1), json(300'000'001), json("1")}) {
    json b = turns;
    b["vgpus"][0]["held_turn_ns_total"] = bad_turns;
    r = client_->Post("/v1/nodes/n1/heartbeat", b.dump());
    EXPECT_EQ(r->status, 400) << b.dump();
    EXPECT_EQ(Body(r)["error"]["code"], "invalid_argument") << b.dump();
  }
  EXPECT_NEAR(vgpu()["turn_seconds"].get<double>(), 0.2, 1e-9) << "refused reports change nothing";
  json unreported = turns;
  unreported["vgpus"][0]["held_turn_ns_total"] = nullptr;
  ASSERT_EQ(client_->Post("/v1/nodes/n1/heartbeat", unreported.dump())->status, 200);
  EXPECT_FALSE(vgpu().contains("turn_seconds")) << "null is as if not reported, not 0";
  // Counters that go back (the vGPU was made again) start a new interval.
  clock_.AdvanceMs(1'000);
  ASSERT_EQ(beat(10, 0)->status, 200);
  EXPECT_FALSE(vgpu().contains("use_percent"));
}

// The node agent reports what vGPUs outside the pool hold of each GPU; the GPU shows it, and
// placement counts it as used. Out-of-range reports are refused and change nothing.
TEST_F(ApiServerTest, UnpooledUseOfAGpuIsShownAndCountedByPlacement) {
  auto r = client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-1","model":"L4","tflops":100,"vram_mib":20000}]})");
  ASSERT_EQ(r->status, 200) << r->body;
  auto beat = [&](const std::string& gpu) {
    return client_->Post("/v1/nodes/n1/heartbeat", R"({"gpus":[{"uuid":"GPU-1","utilization_percent":0,"memory_used_mib":0)" + gpu + "}]}");
  };
  ASSERT_EQ(beat(R"(,"unpooled_share_ppm":600000,"unpooled_vram_mib":12000)")->status, 200);
  json gpu = Body(client_->Get("/v1/gpus"))["gpus"][0];
  EXPECT_EQ(gpu["unpooled_tflops"], 60.0);
  EXPECT_EQ(gpu["unpooled_vram_mib"], 12000);
  EXPECT_EQ(client_->Post("/v1/allocations", R"({"tflops":50,"vram_mib":100})")->status, 409) << "only 40 TFLOPS left";
  EXPECT_EQ(client_->Post("/v1/allocations", R"({"tflops":10,"vram_mib":9000})")->status, 409) << "only 8000 MiB left";
  for (const char* bad : {R"(,"unpooled_share_ppm":-2)", R"(,"unpooled_vram_mib":-5)", R"(,"unpooled_vram_mib":"1")"}) {
    r = beat(bad);
    EXPECT_EQ(r->status, 400) << bad;
  }
  EXPECT_EQ(Body(client_->Get("/v1/gpus"))["gpus"][0]["unpooled_tflops"], 60.0) << "refused reports change nothing";
  // More than the GPU (a tenant wrote its region) is the whole GPU; the heartbeat is kept.
  ASSERT_EQ(beat(R"(,"unpooled_share_ppm":90000000,"unpooled_vram_mib":999999999)")->status, 200);
  gpu = Body(client_->Get("/v1/gpus"))["gpus"][0];
  EXPECT_EQ(gpu["unpooled_tflops"], 100.0);
  EXPECT_EQ(gpu["unpooled_vram_mib"], 20000);
  EXPECT_EQ(client_->Post("/v1/allocations", R"({"tflops":1,"vram_mib":100})")->status, 409) << "the GPU is full";
  ASSERT_EQ(beat(R"(,"unpooled_share_ppm":0,"unpooled_vram_mib":0)")->status, 200);
  EXPECT_EQ(client_->Post("/v1/allocations", R"({"tflops":50,"vram_mib":100})")->status, 201) << "gone: room again";
}

// A second server on a port in use fails at start with a message naming it (no SO_REUSEPORT
// split brain between two controllers).
TEST_F(ApiServerTest, ASecondServerOnAPortInUseFailsToStart) {
  const int port = std::stoi(url_.substr(url_.rfind(':') + 1));
  ApiServer second(c_.get(), "other");
  StatusOr<int> bound = second.Bind("127.0.0.1", port);
  ASSERT_FALSE(bound.ok());
  EXPECT_NE(bound.status().message().find(std::to_string(port)), std::string::npos) << bound.status().ToString();
  EXPECT_NE(bound.status().message().find("in use"), std::string::npos) << bound.status().ToString();
  for (int i = 0; i < 10; ++i) EXPECT_EQ(client_->Get("/v1/pools")->status, 200) << "every request reaches the first";
}

// Numbers beyond what any GPU has, and integers that do not fit, are refused before any
// arithmetic, naming the field; usage stays exactly the sum of the allocations.
TEST_F(ApiServerTest, OverflowingAndTruncatedNumbersAreRefusedAndChangeNothing) {
  auto r = client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-1","model":"L4","tflops":120,"vram_mib":23034}]})");
  ASSERT_EQ(r->status, 200) << r->body;
  struct Case {
    const char* method;
    const char* path;
    const char* body;
    const char* names;
  };
  const Case cases[] = {
      {"POST", "/v1/allocations", R"({"tflops":1e16,"vram_mib":100})", "tflops"},
      {"POST", "/v1/allocations", R"({"tflops":9.3e15,"vram_mib":100})", "tflops"},
      {"POST", "/v1/allocations", R"({"tflops":10,"tflops_limit":1e300,"vram_mib":100})", "tflops_limit"},
      {"POST", "/v1/allocations", R"({"tflops":10,"vram_mib":9223372036854775807})", "vram_mib"},
      {"POST", "/v1/allocations", R"({"tflops":10,"vram_mib":18446744073709551615})", "vram_mib"},
      {"POST", "/v1/allocations", R"({"tflops":10,"vram_mib":100,"gpu_count":4294967297})", "gpu_count"},
      {"POST", "/v1/workloads", R"({"name":"w","tflops":1e16,"vram_mib":100})", "tflops"},
      {"POST", "/v1/workloads", R"({"name":"w","tflops":1,"vram_mib":100,"gpu_count":-4294967295})", "gpu_count"},
      {"PUT", "/v1/quotas/t", R"({"max_gpus":-4294967295})", "max_gpus"},
      {"PUT", "/v1/quotas/t", R"({"max_gpus":4294967296})", "max_gpus"},
      {"PUT", "/v1/quotas/t", R"({"max_tflops":1e308})", "max_tflops"},
      {"POST", "/v1/nodes", R"({"name":"n2","gpus":[{"uuid":"GPU-2","model":"X","tflops":1e16,"vram_mib":1}]})", "tflops"},
  };
  for (const Case& k : cases) {
    StatusOr<HttpResponse> resp = std::string(k.method) == "POST" ? client_->Post(k.path, k.body)
                                                                  : client_->Put(k.path, k.body);
    ASSERT_TRUE(resp.ok());
    EXPECT_EQ(resp->status, 400) << k.path << " " << k.body << ": " << resp->body;
    EXPECT_NE(Body(resp)["error"]["message"].get<std::string>().find(k.names), std::string::npos)
        << k.body << ": " << resp->body;
  }
  auto g = Body(client_->Get("/v1/gpus"))["gpus"];
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0]["used_tflops"], 0.0);
  EXPECT_EQ(g[0]["used_vram_mib"], 0);
  EXPECT_TRUE(Body(client_->Get("/v1/allocations"))["allocations"].empty());
  EXPECT_TRUE(Body(client_->Get("/v1/workloads"))["workloads"].empty());
  EXPECT_TRUE(Body(client_->Get("/v1/quotas"))["quotas"].empty());
}

// Heartbeats are checked against the node's own GPUs; a bad one changes nothing.
TEST_F(ApiServerTest, HeartbeatsAreValidatedAgainstTheNodesOwnGpus) {
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-1","model":"L4","tflops":120,"vram_mib":23034}]})")->status, 200);
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"n2","gpus":[{"uuid":"GPU-2","model":"L4","tflops":120,"vram_mib":23034}]})")->status, 200);
  ASSERT_EQ(client_->Post("/v1/nodes/n1/heartbeat", R"({"gpus":[{"uuid":"GPU-1","utilization_percent":40,"memory_used_mib":10}]})")->status, 200);
  for (const char* bad : {R"({"gpus":[{"uuid":"GPU-2","utilization_percent":1,"memory_used_mib":1}]})",
                          R"({"gpus":[{"uuid":"GPU-9","utilization_percent":1,"memory_used_mib":1}]})",
                          R"({"gpus":[{"uuid":"GPU-1","utilization_percent":-5,"memory_used_mib":1}]})",
                          R"({"gpus":[{"uuid":"GPU-1","utilization_percent":101,"memory_used_mib":1}]})",
                          R"({"gpus":[{"uuid":"GPU-1","utilization_percent":1,"memory_used_mib":-1}]})",
                          R"({"gpus":[{"uuid":"GPU-1","utilization_percent":1,"memory_used_mib":99999}]})"}) {
    auto r = client_->Post("/v1/nodes/n1/heartbeat", bad);
    EXPECT_EQ(r->status, 400) << bad << ": " << r->body;
  }
  for (const json& g : Body(client_->Get("/v1/gpus"))["gpus"]) {
    EXPECT_EQ(g["utilization_percent"], g["uuid"] == "GPU-1" ? 40.0 : 0.0) << g.dump();
  }
}

TEST_F(ApiServerTest, AWrongMethodIs405WithAllowAndAHugeBodyIs413) {
  auto r = client_->Delete("/v1/gpus");
  EXPECT_EQ(r->status, 405) << r->body;
  EXPECT_EQ(r->get_header_value("Allow"), "GET");
  EXPECT_EQ(Body(r)["error"]["code"], "method_not_allowed");
  r = client_->Put("/v1/allocations", "{}");
  EXPECT_EQ(r->status, 405) << r->body;
  EXPECT_NE(r->get_header_value("Allow").find("POST"), std::string::npos);
  EXPECT_EQ(client_->Get("/v1/nothing")->status, 404);
  std::string huge = R"({"name":"n1","pad":")" + std::string(2 << 20, 'x') + R"("})";
  r = client_->Post("/v1/nodes", huge);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 413) << r->body;
  EXPECT_EQ(Body(r)["error"]["code"], "payload_too_large");
  EXPECT_TRUE(c_->ListNodes().empty());
  EXPECT_EQ(client_->Get("/v1/pools")->status, 200) << "the server keeps serving";
  // A 9 KiB body sent as a form (curl -d's default type) is held to the HTTP library's 8 KiB: the
  // answer says so, and how to send it.
  auto [status, answer] = RawRequest(url_,
                                     "POST /v1/nodes HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n"
                                     "Content-Type: application/x-www-form-urlencoded\r\n",
                                     R"({"name":"n1","pad":")" + std::string(9000, 'x') + R"("})");
  EXPECT_EQ(status, 413) << answer;
  EXPECT_NE(answer.find("send it with Content-Type: application/json (up to 1048576 bytes)"), std::string::npos)
      << answer;
  EXPECT_TRUE(c_->ListNodes().empty());
  // A POST without Content-Length (`curl -X POST URL`) is refused by the HTTP library before any
  // route sees it: the answer still says why, as JSON.
  std::tie(status, answer) =
      RawRequest(url_, "POST /v1/allocations/a-1/renew HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n", "", false);
  EXPECT_EQ(status, 400) << answer;
  EXPECT_EQ(json::parse(answer, nullptr, false)["error"]["message"],
            "the HTTP request could not be read: a POST, PUT or PATCH needs a Content-Length header (send {} when "
            "there is nothing to send)")
      << answer;
  // Any other request it cannot read is not blamed on a Content-Length.
  std::tie(status, answer) = RawRequest(url_, "GET /v1/pools HTTP/1.1 trailing words\r\n", "");
  EXPECT_EQ(status, 400) << answer;
  EXPECT_NE(answer.find("a malformed request line or header"), std::string::npos) << answer;
}

// PATCH changes only what it names; PUT replaces (absent fields get their defaults).
TEST_F(ApiServerTest, PatchKeepsWhatItDoesNotNameAndPutReplaces) {
  ASSERT_EQ(client_->Post("/v1/pools", R"({"name":"p"})")->status, 201);
  ASSERT_EQ(client_->Put("/v1/pools/p", R"({"placement_mode":"FragAware","tflops_oversell_ratio":2})")->status, 200);
  auto r = client_->Patch("/v1/pools/p", R"({"tflops_oversell_ratio":1.5})");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(Body(r)["placement_mode"], "FragAware");
  EXPECT_EQ(Body(r)["tflops_oversell_ratio"], 1.5);
  r = client_->Patch("/v1/pools/p", R"({"tflops_oversell_ratio":0.5})");
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(Body(client_->Get("/v1/pools/p"))["tflops_oversell_ratio"], 1.5) << "a refused patch changes nothing";
  EXPECT_EQ(client_->Patch("/v1/pools/none", R"({"tflops_oversell_ratio":2})")->status, 404);
  r = client_->Put("/v1/pools/p", R"({"tflops_oversell_ratio":3})");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_NE(Body(r)["placement_mode"], "FragAware") << "PUT replaces: the mode went back to the default";
}

// A retried create (its first answer lost) gets the allocation the first attempt made: 200 and
// the same id, capacity counted once. Another tenant cannot use the key; a bad key is refused.
// Leases: an allocation whose holder stops renewing is released (and recorded as evicted, so its
// node's agent stops what still runs on it); one renewed in time stays.
TEST_F(ApiServerTest, AnAllocationWhoseLeaseIsNotRenewedIsReleased) {
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-1","model":"L4","tflops":120,"vram_mib":23034}]})")->status, 200);
  auto kept = client_->Post("/v1/allocations", R"({"tflops":30,"vram_mib":1000,"lease_s":60})");
  ASSERT_EQ(kept->status, 201) << kept->body;
  auto dropped = client_->Post("/v1/allocations", R"({"tflops":30,"vram_mib":1000,"lease_s":60})");
  ASSERT_EQ(dropped->status, 201) << dropped->body;
  auto plain = client_->Post("/v1/allocations", R"({"tflops":30,"vram_mib":1000})");
  ASSERT_EQ(plain->status, 201) << plain->body;
  const std::string kept_id = Body(kept)["id"], dropped_id = Body(dropped)["id"], plain_id = Body(plain)["id"];
  for (int i = 0; i < 7; ++i) {  // 70 s: the kept one is renewed every 10 s, the node beats
    clock_.AdvanceMs(10'000);
    ASSERT_EQ(client_->Post("/v1/nodes/n1/heartbeat", "{}")->status, 200);
    auto renewed = client_->Post("/v1/allocations/" + kept_id + "/renew", "{}");
    ASSERT_EQ(renewed->status, 200) << renewed->body;
    c_->Tick();
  }
  const json list = Body(client_->Get("/v1/allocations"))["allocations"];
  std::set<std::string> live;
  for (const json& a : list) live.insert(a["id"].get<std::string>());
  EXPECT_TRUE(live.count(kept_id));
  EXPECT_TRUE(live.count(plain_id)) << "no lease: kept until released";
  EXPECT_FALSE(live.count(dropped_id));
  auto why = client_->Get("/v1/evictions/" + dropped_id);
  ASSERT_EQ(why->status, 200) << why->body;
  EXPECT_EQ(Body(why)["reason"], "lease-expired");
  EXPECT_EQ(Body(client_->Get("/v1/gpus"))["gpus"][0]["used_tflops"], 60.0) << "its capacity came back";
  auto gone = client_->Post("/v1/allocations/" + dropped_id + "/renew", "{}");
  EXPECT_EQ(gone->status, 404) << gone->body;
  auto no_lease = client_->Post("/v1/allocations/" + plain_id + "/renew", "{}");
  EXPECT_EQ(no_lease->status, 409) << no_lease->body;
  for (const char* bad : {R"({"tflops":1,"vram_mib":10,"lease_s":1})", R"({"tflops":1,"vram_mib":10,"lease_s":99999})",
                          R"({"tflops":1,"vram_mib":10,"lease_s":"60"})"}) {
    auto r = client_->Post("/v1/allocations", bad);
    EXPECT_EQ(r->status, 400) << bad << ": " << r->body;
    EXPECT_NE(r->body.find("lease_s"), std::string::npos) << r->body;
  }
}

// A controller that was down longer than a lease does not release, as it comes back, the
// allocations whose holders could not renew meanwhile: each gets one whole lease from then, as
// each node gets a fresh heartbeat timeout. One still not renewed after that is released.
TEST_F(ApiServerTest, ALeaseDoesNotRunOutWhileNoControllerServed) {
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-1","model":"L4","tflops":120,"vram_mib":23034}]})")->status, 200);
  auto renewing = client_->Post("/v1/allocations", R"({"tflops":30,"vram_mib":1000,"lease_s":60})");
  ASSERT_EQ(renewing->status, 201) << renewing->body;
  auto gone = client_->Post("/v1/allocations", R"({"tflops":30,"vram_mib":1000,"lease_s":60})");
  ASSERT_EQ(gone->status, 201) << gone->body;
  const std::string renewing_id = Body(renewing)["id"], gone_id = Body(gone)["id"];
  api_->Stop();
  clock_.AdvanceMs(80'000);  // down for 80 s: neither holder could renew its 60 s lease
  Controller again(store_.get(), &clock_, MakeSchedulerPlacement(), nullptr);
  ASSERT_TRUE(again.Rebuild().ok());
  again.Tick();
  EXPECT_TRUE(again.GetAllocation(renewing_id).ok()) << "released as the controller came back";
  EXPECT_TRUE(again.GetAllocation(gone_id).ok()) << "released as the controller came back";
  clock_.AdvanceMs(20'000);  // the holder that still runs renews within its lease
  ASSERT_TRUE(again.RenewLease(renewing_id).ok());
  again.Tick();
  EXPECT_TRUE(again.GetAllocation(gone_id).ok()) << "it has a whole lease from the restart";
  clock_.AdvanceMs(41'000);  // 61 s after the restart
  again.Tick();
  EXPECT_TRUE(again.GetAllocation(renewing_id).ok());
  EXPECT_FALSE(again.GetAllocation(gone_id).ok()) << "not renewed within a lease of the restart";
}

// A replica that stops serving now and then (an election lost and won back) delays a lease by
// the time it did not serve, not by a whole lease each time: a holder gone for good still loses
// its allocation.
TEST_F(ApiServerTest, ALeaseRunsOutBesideAStoreThatFailsNowAndThen) {
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-1","model":"L4","tflops":120,"vram_mib":23034}]})")->status, 200);
  auto gone = client_->Post("/v1/allocations", R"({"tflops":30,"vram_mib":1000,"lease_s":60})");
  ASSERT_EQ(gone->status, 201) << gone->body;
  const std::string id = Body(gone)["id"];
  // Every 20 s, 1 s without serving: 3 s in its first 60 s.
  for (int i = 0; i < 3; ++i) {
    clock_.AdvanceMs(19'000);
    c_->StopServing();
    clock_.AdvanceMs(1'000);
    ASSERT_TRUE(c_->Rebuild().ok());
    c_->Tick();
    ASSERT_TRUE(c_->GetAllocation(id).ok()) << "released " << (i + 1) * 20 << " s after its last renewal";
  }
  clock_.AdvanceMs(2'000);  // 62 s: within 60 s + the 3 s not served
  c_->Tick();
  EXPECT_TRUE(c_->GetAllocation(id).ok());
  clock_.AdvanceMs(2'000);  // 64 s
  c_->Tick();
  EXPECT_FALSE(c_->GetAllocation(id).ok()) << "each failure gave the lease a whole new one";
  // A lease renewed in the meantime is kept by the same failures, and runs out once it stops.
  auto kept = client_->Post("/v1/allocations", R"({"tflops":30,"vram_mib":1000,"lease_s":60})");
  ASSERT_EQ(kept->status, 201) << kept->body;
  const std::string kept_id = Body(kept)["id"];
  clock_.AdvanceMs(50'000);
  c_->StopServing();
  clock_.AdvanceMs(20'000);  // 70 s: its lease ran out while nothing served
  ASSERT_TRUE(c_->Rebuild().ok());
  c_->Tick();
  EXPECT_TRUE(c_->GetAllocation(kept_id).ok()) << "its holder could not renew while nothing served";
  ASSERT_TRUE(c_->RenewLease(kept_id).ok());
  clock_.AdvanceMs(59'000);
  c_->Tick();
  EXPECT_TRUE(c_->GetAllocation(kept_id).ok());
  clock_.AdvanceMs(2'000);
  c_->Tick();
  EXPECT_FALSE(c_->GetAllocation(kept_id).ok());
}

// QoS decides who preempts whom, so an operator may cap the QoS a tenant asks for: a tenant
// whose quota says max_qos "high" cannot take another tenant's running work with "critical".
TEST_F(ApiServerTest, AQuotasMaxQosKeepsATenantFromPreemptingWithAHigherQos) {
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-1","model":"L4","tflops":120,"vram_mib":23034}]})")->status, 200);
  auto made = client_->Post("/v1/tokens", R"({"role":"tenant","tenant":"acme"})");
  ASSERT_EQ(made->status, 201);
  HttpClient acme(url_, Body(made)["token"].get<std::string>());
  // /metrics names every tenant's allocations: not a tenant token's to read.
  auto metrics = acme.Get("/metrics");
  EXPECT_EQ(metrics->status, 403) << metrics->body;
  EXPECT_NE(metrics->body.find("scrape with an admin or node token"), std::string::npos) << metrics->body;
  EXPECT_EQ(client_->Get("/metrics")->status, 200);
  auto beta = client_->Post("/v1/allocations", R"({"tflops":100,"vram_mib":1000,"tenant":"beta","qos":"medium"})");
  ASSERT_EQ(beta->status, 201) << beta->body;
  ASSERT_EQ(client_->Put("/v1/quotas/acme", R"({"max_qos":"high"})")->status, 200);
  EXPECT_EQ(Body(client_->Get("/v1/quotas"))["quotas"][0]["max_qos"], "high");
  auto r = acme.Post("/v1/allocations", R"({"tflops":100,"vram_mib":1000,"qos":"critical"})");
  EXPECT_EQ(r->status, 403) << r->body;
  EXPECT_NE(r->body.find("may ask for QoS up to 'high' (its quota's max_qos), not 'critical'"), std::string::npos)
      << r->body;
  EXPECT_EQ(client_->Get("/v1/allocations/" + std::string(Body(beta)["id"]))->status, 200) << "nothing was preempted";
  r = acme.Post("/v1/allocations", R"({"tflops":10,"vram_mib":1000,"qos":"high"})");
  EXPECT_EQ(r->status, 201) << r->body;
  for (const char* bad : {R"({"max_qos":"urgent"})", R"({"max_qos":3})"})
    EXPECT_EQ(client_->Put("/v1/quotas/acme", bad)->status, 400) << bad;
  EXPECT_EQ(Body(client_->Get("/v1/quotas"))["quotas"][0]["max_qos"], "high") << "refusals changed nothing";
  // A PUT that leaves max_qos out (a client that knows only the three limits) keeps the cap.
  ASSERT_EQ(client_->Put("/v1/quotas/acme", R"({"max_gpus":8})")->status, 200);
  EXPECT_EQ(Body(client_->Get("/v1/quotas"))["quotas"][0]["max_qos"], "high");
  // Under a cap below the default QoS, a request that names none gets the cap, not a refusal.
  ASSERT_EQ(client_->Put("/v1/quotas/acme", R"({"max_qos":"low"})")->status, 200);
  r = acme.Post("/v1/allocations", R"({"tflops":1,"vram_mib":10})");
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Body(r)["qos"], "low");
  EXPECT_EQ(acme.Post("/v1/allocations", R"({"tflops":1,"vram_mib":10,"qos":"medium"})")->status, 403);
  // Without a cap (the default) any QoS is taken, as before.
  ASSERT_EQ(client_->Put("/v1/quotas/acme", R"({"max_qos":""})")->status, 200);
  r = acme.Post("/v1/allocations", R"({"tflops":100,"vram_mib":1000,"qos":"critical"})");
  EXPECT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Body(r)["preempted"].size(), 1u);
}

TEST_F(ApiServerTest, ARetriedCreateWithTheSameRequestIdGetsTheSameAllocation) {
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-1","model":"L4","tflops":120,"vram_mib":23034}]})")->status, 200);
  const char* body = R"({"tflops":30,"vram_mib":1000,"tenant":"t1","request_id":"run-abc123"})";
  auto first = client_->Post("/v1/allocations", body);
  ASSERT_EQ(first->status, 201) << first->body;
  EXPECT_EQ(Body(first)["replayed"], false);
  auto again = client_->Post("/v1/allocations", body);
  ASSERT_EQ(again->status, 200) << again->body;
  EXPECT_EQ(Body(again)["id"], Body(first)["id"]);
  EXPECT_EQ(Body(again)["replayed"], true);
  EXPECT_EQ(Body(client_->Get("/v1/allocations"))["allocations"].size(), 1u);
  EXPECT_EQ(Body(client_->Get("/v1/gpus"))["gpus"][0]["used_tflops"], 30.0);
  auto other = client_->Post("/v1/allocations", R"({"tflops":30,"vram_mib":1000,"tenant":"t2","request_id":"run-abc123"})");
  EXPECT_EQ(other->status, 409) << other->body;
  EXPECT_EQ(client_->Post("/v1/allocations", R"({"tflops":30,"vram_mib":1000,"request_id":"no spaces"})")->status, 400);
  // The key lives with its allocation and survives a restart of the controller.
  api_->Stop();
  c_ = std::make_unique<Controller>(store_.get(), &clock_, MakeSchedulerPlacement(), nullptr);
  ASSERT_TRUE(c_->Rebuild().ok());
  bool replayed = false;
  AllocationRequest retry{"", "", 30, 1000, 1, "", ""};
  retry.tenant = "t1";
  retry.request_id = "run-abc123";
  auto a = c_->Allocate(retry, nullptr, &replayed);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(replayed);
  EXPECT_EQ(a->id, Body(first)["id"].get<std::string>());
}

// Every list pages with a cursor: ?limit=N&after=KEY, "next" while more remain; bad limits are
// 400; without a limit the whole list comes back as before.
TEST_F(ApiServerTest, ListsPageWithACursor) {
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-1","model":"L4","tflops":120,"vram_mib":23034}]})")->status, 200);
  std::set<std::string> made;
  for (int i = 0; i < 7; ++i) {
    auto r = client_->Post("/v1/allocations", R"({"tflops":1,"vram_mib":10})");
    ASSERT_EQ(r->status, 201) << r->body;
    made.insert(Body(r)["id"].get<std::string>());
  }
  std::set<std::string> seen;
  std::string after;
  int pages = 0;
  for (; pages < 10; ++pages) {
    auto r = client_->Get("/v1/allocations?limit=3" + (after.empty() ? std::string() : "&after=" + after));
    ASSERT_EQ(r->status, 200) << r->body;
    json b = Body(r);
    EXPECT_LE(b["allocations"].size(), 3u);
    for (const json& a : b["allocations"]) EXPECT_TRUE(seen.insert(a["id"].get<std::string>()).second) << "no repeats";
    if (!b.contains("next")) break;
    after = b["next"].get<std::string>();
  }
  EXPECT_EQ(pages, 2);  // 3 + 3 + 1
  EXPECT_EQ(seen, made);
  EXPECT_EQ(Body(client_->Get("/v1/allocations"))["allocations"].size(), 7u);
  EXPECT_FALSE(Body(client_->Get("/v1/allocations"))["allocations"].is_null());
  for (const char* bad : {"0", "-1", "10001", "x", "", "3abc"})
    EXPECT_EQ(client_->Get(std::string("/v1/gpus?limit=") + bad)->status, 400) << bad;
  EXPECT_EQ(Body(client_->Get("/v1/nodes?limit=1"))["nodes"].size(), 1u);
}

TEST_F(ApiServerTest, PoolsWorkloadsAndUnknownRoutes) {
  EXPECT_EQ(client_->Post("/v1/pools", R"({"name":"train"})")->status, 201);
  EXPECT_EQ(client_->Post("/v1/pools", R"({"name":"train"})")->status, 409);
  EXPECT_EQ(client_->Get("/v1/pools/train")->status, 200);
  EXPECT_EQ(client_->Get("/v1/pools/none")->status, 404);
  EXPECT_EQ(client_->Post("/v1/workloads", R"({"name":"w","pool":"train","tflops":5,"vram_mib":10})")->status, 201);
  EXPECT_EQ(client_->Post("/v1/workloads", R"({"name":"w2","pool":"zzz","tflops":5,"vram_mib":10})")->status, 404);
  // A pool a workload names stays until the workload goes: its allocations could never be placed.
  auto r = client_->Delete("/v1/pools/train");
  EXPECT_EQ(r->status, 409) << r->body;
  EXPECT_NE(r->body.find("pool 'train' still has workload 'w' (delete it first: DELETE /v1/workloads/w)"),
            std::string::npos)
      << r->body;
  EXPECT_EQ(client_->Get("/v1/pools/train")->status, 200);
  EXPECT_EQ(client_->Delete("/v1/workloads/w")->status, 200);
  EXPECT_EQ(client_->Delete("/v1/pools/train")->status, 200);
  EXPECT_EQ(client_->Get("/v1/nothing")->status, 404);
  EXPECT_EQ(client_->Post("/v1/nodes/ghost/heartbeat", "{}")->status, 404);
}

// Tier idle overrides: an allocation carries them (or inherits its workload's), GET shows them, a
// restarted controller still has them, PATCH changes them on the live allocation (null: back to the
// QoS default), and bad values are refused naming the field, changing nothing.
TEST_F(ApiServerTest, TierIdleOverridesAreStoredShownPatchedAndValidated) {
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-1","model":"L4","tflops":100,"vram_mib":20000}]})")->status, 200);
  ASSERT_EQ(client_->Patch("/v1/pools/default", R"({"vram_expand_to_host_percent":100})")->status, 200);
  auto r = client_->Post("/v1/allocations", R"({"percent":10,"vram_mib":1000,"idle_swap_ms":30000,"idle_disk_ms":0})");
  ASSERT_EQ(r->status, 201) << r->body;
  const std::string id = Body(r)["id"];
  json got = Body(client_->Get("/v1/allocations/" + id));
  EXPECT_EQ(got["idle_swap_ms"], 30000);
  EXPECT_EQ(got["idle_disk_ms"], 0) << "0 = never, kept apart from 'unset'";
  r = client_->Post("/v1/allocations", R"({"percent":10,"vram_mib":1000})");
  ASSERT_EQ(r->status, 201);
  EXPECT_FALSE(Body(r).contains("idle_swap_ms")) << "no override: the QoS default";

  // Refused, naming the field; nothing is allocated.
  const size_t before = Body(client_->Get("/v1/allocations"))["allocations"].size();
  struct Bad {
    const char* body;
    const char* says;
  };
  for (const Bad& b : {Bad{R"({"percent":10,"vram_mib":10,"idle_swap_ms":-1})", "idle_swap_ms"},
                       Bad{R"({"percent":10,"vram_mib":10,"idle_disk_ms":2592000001})", "idle_disk_ms"},
                       Bad{R"({"percent":10,"vram_mib":10,"idle_swap_ms":"10s"})", "idle_swap_ms"},
                       Bad{R"({"percent":10,"vram_mib":10,"idle_disk_ms":1.5})", "idle_disk_ms"}}) {
    auto bad = client_->Post("/v1/allocations", b.body);
    EXPECT_EQ(bad->status, 400) << b.body;
    EXPECT_NE(bad->body.find(b.says), std::string::npos) << bad->body;
  }
  EXPECT_EQ(Body(client_->Get("/v1/allocations"))["allocations"].size(), before);

  // A workload's overrides reach its allocations; the request's own win.
  ASSERT_EQ(client_->Post("/v1/workloads", R"({"name":"w","tflops":5,"vram_mib":100,"idle_swap_ms":5000})")->status, 201);
  EXPECT_EQ(Body(client_->Get("/v1/workloads/w"))["idle_swap_ms"], 5000);
  EXPECT_EQ(client_->Post("/v1/workloads", R"({"name":"w2","tflops":5,"vram_mib":100,"idle_swap_ms":-5})")->status, 400);
  r = client_->Post("/v1/allocations", R"({"workload":"w"})");
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Body(r)["idle_swap_ms"], 5000);
  r = client_->Post("/v1/allocations", R"({"workload":"w","idle_swap_ms":7000})");
  EXPECT_EQ(Body(r)["idle_swap_ms"], 7000);

  // PATCH: changes what it names; null goes back to the QoS default.
  r = client_->Patch("/v1/allocations/" + id, R"({"idle_swap_ms":120000})");
  ASSERT_EQ(r->status, 200) << r->body;
  got = Body(client_->Get("/v1/allocations/" + id));
  EXPECT_EQ(got["idle_swap_ms"], 120000);
  EXPECT_EQ(got["idle_disk_ms"], 0) << "not named: unchanged";
  r = client_->Patch("/v1/allocations/" + id, R"({"idle_disk_ms":null})");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_FALSE(Body(client_->Get("/v1/allocations/" + id)).contains("idle_disk_ms"));
  for (const char* bad : {R"({"idle_swap_ms":-3})", R"({"vram_mib":5})", R"({})", R"({"idle_swap_ms":"never"})"}) {
    auto p = client_->Patch("/v1/allocations/" + id, bad);
    EXPECT_EQ(p->status, 400) << bad << " " << p->body;
  }
  EXPECT_NE(client_->Patch("/v1/allocations/" + id, R"({"vram_mib":5})")->body.find("'vram_mib' cannot be changed"),
            std::string::npos);
  EXPECT_EQ(Body(client_->Get("/v1/allocations/" + id))["idle_swap_ms"], 120000) << "refusals changed nothing";
  EXPECT_EQ(client_->Patch("/v1/allocations/a-none", R"({"idle_swap_ms":1})")->status, 404);
  // An allocation without tiering has no idle timeouts to change.
  ASSERT_EQ(client_->Patch("/v1/pools/default", R"({"vram_expand_to_host_percent":0})")->status, 200);
  r = client_->Post("/v1/allocations", R"({"percent":10,"vram_mib":1000})");
  ASSERT_EQ(r->status, 201);
  auto flat = client_->Patch("/v1/allocations/" + std::string(Body(r)["id"]), R"({"idle_swap_ms":1000})");
  EXPECT_EQ(flat->status, 409) << flat->body;
  EXPECT_NE(flat->body.find("no VRAM tiering"), std::string::npos) << flat->body;

  // A tenant changes its own allocations only; another's looks absent.
  auto made = client_->Post("/v1/tokens", R"({"role":"tenant","tenant":"alice"})");
  ASSERT_EQ(made->status, 201);
  HttpClient alice(url_, Body(made)["token"].get<std::string>());
  EXPECT_EQ(alice.Patch("/v1/allocations/" + id, R"({"idle_swap_ms":1000})")->status, 404);

  // A tenant reads its own quota, not another's; an admin reads any.
  ASSERT_EQ(client_->Put("/v1/quotas/alice", R"({"max_tflops":50})")->status, 200);
  ASSERT_EQ(client_->Put("/v1/quotas/bob", R"({"max_tflops":70})")->status, 200);
  auto own = alice.Get("/v1/quotas/alice");
  EXPECT_EQ(own->status, 200) << own->body;
  EXPECT_EQ(Body(own)["max_tflops"], 50.0) << own->body;
  EXPECT_EQ(alice.Get("/v1/quotas/bob")->status, 403);
  EXPECT_EQ(Body(client_->Get("/v1/quotas/bob"))["max_tflops"], 70.0);
  auto none = client_->Get("/v1/quotas/carol");
  EXPECT_EQ(none->status, 404);
  EXPECT_NE(none->body.find("tenant 'carol' has no quota"), std::string::npos) << none->body;

  // A controller rebuilt from the store has them.
  Controller again(store_.get(), &clock_, MakeSchedulerPlacement(), nullptr);
  ASSERT_TRUE(again.Rebuild().ok());
  StatusOr<Allocation> reloaded = again.GetAllocation(id);
  ASSERT_TRUE(reloaded.ok());
  EXPECT_EQ(reloaded->idle_swap_ms, 120000);
  EXPECT_FALSE(reloaded->idle_disk_ms.has_value());
}

// Scale to zero through the control plane: idle_zero_ms is validated against the swap timeout in
// effect with it (the override, else the QoS default), on POST, on a workload and on PATCH (the
// pair as it would be), refusals change nothing; a freeze takes a level ("host" or "zero", counted
// in zero_requests for the node agent), anything else is a 400 naming the field.
TEST_F(ApiServerTest, IdleZeroAndTheFreezeLevelAreValidatedAndStored) {
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-1","model":"L4","tflops":100,"vram_mib":20000}]})")->status, 200);
  ASSERT_EQ(client_->Patch("/v1/pools/default", R"({"vram_expand_to_host_percent":100})")->status, 200);
  auto r = client_->Post("/v1/allocations", R"({"percent":10,"vram_mib":1000,"qos":"low","idle_zero_ms":60000})");
  ASSERT_EQ(r->status, 201) << "longer than the low QoS's 10 s swap timeout\n" << r->body;
  const std::string id = Body(r)["id"];
  EXPECT_EQ(Body(client_->Get("/v1/allocations/" + id))["idle_zero_ms"], 60000);
  struct Bad {
    const char* body;
    const char* says;
  };
  const size_t before = Body(client_->Get("/v1/allocations"))["allocations"].size();
  for (const Bad& b : {Bad{R"({"percent":10,"vram_mib":10,"idle_swap_ms":30000,"idle_zero_ms":20000})",
                           "idle_zero_ms (20s) must be longer than idle_swap_ms (30s)"},
                       Bad{R"({"percent":10,"vram_mib":10,"qos":"medium","idle_zero_ms":30000})",
                           "must be longer than the medium QoS's idle swap timeout (1m)"},
                       Bad{R"({"percent":10,"vram_mib":10,"qos":"critical","idle_zero_ms":30000})",
                           "needs an idle swap timeout"},
                       Bad{R"({"percent":10,"vram_mib":10,"idle_zero_ms":-1})", "idle_zero_ms"}}) {
    auto bad = client_->Post("/v1/allocations", b.body);
    EXPECT_EQ(bad->status, 400) << b.body;
    EXPECT_NE(bad->body.find(b.says), std::string::npos) << bad->body;
  }
  EXPECT_EQ(Body(client_->Get("/v1/allocations"))["allocations"].size(), before) << "nothing allocated";
  EXPECT_EQ(client_->Post("/v1/workloads", R"({"name":"wz","tflops":5,"vram_mib":100,"idle_swap_ms":5000,"idle_zero_ms":4000})")->status, 400);
  ASSERT_EQ(client_->Post("/v1/workloads", R"({"name":"wz","tflops":5,"vram_mib":100,"idle_swap_ms":5000,"idle_zero_ms":9000})")->status, 201);
  r = client_->Post("/v1/allocations", R"({"workload":"wz"})");
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Body(r)["idle_zero_ms"], 9000);

  // PATCH: the pair as it would be.
  auto p = client_->Patch("/v1/allocations/" + id, R"({"idle_swap_ms":120000})");
  EXPECT_EQ(p->status, 400) << "a swap timeout longer than the zero one kept\n" << p->body;
  p = client_->Patch("/v1/allocations/" + id, R"({"idle_swap_ms":120000,"idle_zero_ms":600000})");
  ASSERT_EQ(p->status, 200) << p->body;
  EXPECT_EQ(Body(p)["idle_zero_ms"], 600000);
  p = client_->Patch("/v1/allocations/" + id, R"({"idle_zero_ms":null})");
  ASSERT_EQ(p->status, 200) << p->body;
  EXPECT_FALSE(Body(p).contains("idle_zero_ms"));

  // The freeze level.
  r = client_->Post("/v1/allocations/" + id + "/freeze", R"({"level":"zero"})");
  ASSERT_EQ(r->status, 202) << r->body;
  EXPECT_EQ(Body(r)["zero_requests"], 1);
  EXPECT_EQ(Body(r)["freeze_requests"], 1);
  r = client_->Post("/v1/allocations/" + id + "/freeze", R"({"level":"host"})");
  ASSERT_EQ(r->status, 202) << r->body;
  EXPECT_EQ(Body(r)["zero_requests"], 1);
  EXPECT_EQ(Body(r)["freeze_requests"], 2);
  ASSERT_EQ(client_->Post("/v1/allocations/" + id + "/freeze", "")->status, 202) << "no body: level host";
  for (const char* bad : {R"({"level":"deep"})", R"({"level":3})", R"({"lvl":"zero"})", "not json"}) {
    auto f = client_->Post("/v1/allocations/" + id + "/freeze", bad);
    EXPECT_EQ(f->status, 400) << bad << " " << f->body;
  }
  EXPECT_NE(client_->Post("/v1/allocations/" + id + "/freeze", R"({"level":"deep"})")->body.find("'level' must be"),
            std::string::npos);
  EXPECT_EQ(client_->Post("/v1/allocations/" + id + "/thaw", R"({"level":"zero"})")->status, 400);
  json got = Body(client_->Get("/v1/allocations/" + id));
  EXPECT_EQ(got["zero_requests"], 1) << "refusals counted nothing";
  EXPECT_EQ(got["freeze_requests"], 3);
  Controller again(store_.get(), &clock_, MakeSchedulerPlacement(), nullptr);
  ASSERT_TRUE(again.Rebuild().ok());
  EXPECT_EQ(again.GetAllocation(id)->zero_requests, 1u) << "stored";
}

// Trial 44, F2: cordon and uncordon (admin) over HTTP. The node keeps its allocations, shows as
// cordoned with how many it holds, stays cordoned when its agent registers again; tenant and node
// tokens may not cordon; an unknown node is a 404 that says so.
TEST_F(ApiServerTest, CordonAndUncordonANodeOverHttp) {
  for (const char* n : {"n1", "n2"}) {
    const std::string reg = std::string(R"({"name":")") + n + R"(","gpus":[{"uuid":"GPU-)" + n +
                            R"(","model":"L4","tflops":120,"vram_mib":23034}]})";
    ASSERT_EQ(client_->Post("/v1/nodes", reg)->status, 200);
  }
  auto a = client_->Post("/v1/allocations", R"({"tflops":60,"vram_mib":1000,"node":"n1"})");
  ASSERT_EQ(a->status, 201) << a->body;
  auto r = client_->Post("/v1/nodes/n1/cordon", "");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(Body(r)["cordoned"], true);
  EXPECT_EQ(Body(r)["allocations"], 1);
  EXPECT_EQ(Body(r).count("credential_sha256"), 0u);
  r = client_->Get("/v1/nodes/n1");
  EXPECT_EQ(Body(r)["cordoned"], true);
  EXPECT_EQ(Body(r)["state"], "ready");
  r = client_->Get("/v1/nodes");
  EXPECT_EQ(Body(r)["nodes"][0]["cordoned"], true);
  EXPECT_EQ(Body(r)["nodes"][1]["cordoned"], false);
  EXPECT_EQ(Body(r)["nodes"][1]["allocations"], 0);
  // New work goes to n2 only; pinned to n1 it is refused.
  r = client_->Post("/v1/allocations", R"({"tflops":10,"vram_mib":100})");
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Body(r)["node"], "n2");
  r = client_->Post("/v1/allocations", R"({"tflops":10,"vram_mib":100,"node":"n1"})");
  EXPECT_EQ(r->status, 409) << r->body;
  // The agent registers again (it restarted): the cordon stays.
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"n1","gpus":[{"uuid":"GPU-n1","model":"L4","tflops":120,"vram_mib":23034}]})")->status, 200);
  EXPECT_EQ(Body(client_->Get("/v1/nodes/n1"))["cordoned"], true);
  // Who may: an admin only.
  auto made = client_->Post("/v1/tokens", R"({"role":"tenant","tenant":"acme"})");
  ASSERT_EQ(made->status, 201);
  HttpClient acme(url_, Body(made)["token"].get<std::string>());
  r = acme.Post("/v1/nodes/n1/uncordon", "");
  EXPECT_EQ(r->status, 403) << r->body;
  made = client_->Post("/v1/tokens", R"({"role":"node","node":"n1"})");
  ASSERT_EQ(made->status, 201);
  HttpClient agent(url_, Body(made)["token"].get<std::string>());
  EXPECT_EQ(agent.Post("/v1/nodes/n1/uncordon", "")->status, 403);
  EXPECT_TRUE(c_->GetNode("n1")->node.cordoned);
  r = client_->Post("/v1/nodes/nope/cordon", "");
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(Body(r)["error"]["message"], "node 'nope' is not registered");
  r = client_->Post("/v1/nodes/n1/uncordon", R"({"schedulable":true})");
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(Body(r)["error"]["message"], "field 'schedulable' is not known here (an uncordon takes no fields)");
  EXPECT_EQ(client_->Get("/v1/nodes/n1/cordon")->status, 405);
  r = client_->Post("/v1/nodes/n1/uncordon", "");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(Body(r)["cordoned"], false);
  r = client_->Post("/v1/allocations", R"({"tflops":10,"vram_mib":100,"node":"n1"})");
  EXPECT_EQ(r->status, 201) << r->body;
}

// Trial 44, F2: an agent registering a GPU below what its allocations hold gets a 409 naming the
// GPU, and the stored GPU stays as it was.
TEST_F(ApiServerTest, ARegistrationThatShrinksABusyGpuIs409AndChangesNothing) {
  ASSERT_EQ(client_->Post("/v1/nodes", R"({"name":"l4-a","gpus":[{"uuid":"GPU-l4-a-0","model":"L4","tflops":121,"vram_mib":23034}]})")->status, 200);
  ASSERT_EQ(client_->Post("/v1/allocations", R"({"tflops":121,"vram_mib":23034})")->status, 201);
  auto r = client_->Post("/v1/nodes", R"({"name":"l4-a","gpus":[{"uuid":"GPU-l4-a-0","model":"L4","tflops":50,"vram_mib":10000}]})");
  EXPECT_EQ(r->status, 409) << r->body;
  EXPECT_EQ(Body(r)["error"]["code"], "failed_precondition");
  const std::string m = Body(r)["error"]["message"];
  EXPECT_EQ(m.rfind("GPU GPU-l4-a-0 holds allocations of 121 TFLOPS and 23034 MiB but now reports 50 TFLOPS and 10000 MiB", 0), 0u) << m;
  auto gpus = Body(client_->Get("/v1/gpus"))["gpus"];
  EXPECT_EQ(gpus[0]["tflops"], 121);
  EXPECT_EQ(gpus[0]["vram_mib"], 23034);
}

}  // namespace
}  // namespace tf::controller
