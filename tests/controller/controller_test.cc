#include "controller/controller.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "controller/replica.h"
#include "controller/sqlite_store.h"
#include "exposition_parser.h"
#include "test_cluster.h"

namespace tf::controller {
namespace {

class ControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = std::move(SqliteStore::Open(dir_.path() + "/state.db")).value();
    Restart();
  }
  void Restart() {
    ControllerConfig cfg;
    cfg.heartbeat_timeout_ms = 10'000;
    cfg.lost_grace_ms = 30'000;
    c_ = std::make_unique<Controller>(store_.get(), &clock_, MakeSchedulerPlacement(), nullptr, cfg);
    ASSERT_TRUE(c_->Rebuild().ok());
  }
  testing::TempDir dir_;
  FakeClock clock_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Controller> c_;
};

// A store whose writes fail while `failing` (a full disk: reads work, every batch fails to reach
// it; nothing of a failed batch is applied), over a real one.
class FailingWritesStore : public Store {
 public:
  explicit FailingWritesStore(std::unique_ptr<Store> inner) : inner_(std::move(inner)) {}
  StatusOr<std::optional<KeyValue>> Get(const std::string& key) override { return inner_->Get(key); }
  StatusOr<std::vector<KeyValue>> List(const std::string& prefix) override { return inner_->List(prefix); }
  StatusOr<int64_t> Commit(const std::vector<Compare>& compares, const std::vector<Write>& writes) override {
    if (failing) return Unavailable("disk full");
    return inner_->Commit(compares, writes);
  }
  // Staged as if it would be written (revisions no real one reaches), then lost at WaitDurable.
  StatusOr<int64_t> Stage(const std::vector<Compare>& compares, const std::vector<Write>& writes) override {
    if (failing) return kLost + ++lost_;
    return inner_->Stage(compares, writes);
  }
  Status WaitDurable(int64_t revision) override {
    if (revision > kLost) return Unavailable("disk full: the batch did not reach the disk");
    return inner_->WaitDurable(revision);
  }
  std::string Describe() const override { return inner_->Describe(); }
  bool failing = false;

 private:
  static constexpr int64_t kLost = int64_t{1} << 50;
  std::unique_ptr<Store> inner_;
  int64_t lost_ = 0;
};

// While the store's writes fail (every renewal with them) for longer than a lease, no lease runs
// out: once they succeed again, a holder that still runs has its usual time to renew, and one
// that is gone loses its allocation a lease after the outage (which lasts, as far as the
// controller can tell, until a write reaches the store again).
TEST(LeaseOutageTest, LeasesOutliveAStoreWhoseWritesFailAndRunOutAfterward) {
  testing::TempDir dir;
  FailingWritesStore store(std::move(SqliteStore::Open(dir.path() + "/state.db")).value());
  FakeClock clock;
  ControllerConfig cfg;
  cfg.heartbeat_timeout_ms = 3'600'000;  // the node stays ready: only leases are tested
  Controller c(&store, &clock, MakeSchedulerPlacement(), nullptr, cfg);
  ASSERT_TRUE(c.Rebuild().ok());
  testing::AddNodes(c, 1, 1);
  AllocationRequest req{"", "", 10, 1024, 1, "", ""};
  req.lease_ms = 60'000;
  auto live = c.Allocate(req), gone = c.Allocate(req);
  ASSERT_TRUE(live.ok() && gone.ok());
  clock.AdvanceMs(10'000);
  ASSERT_TRUE(c.RenewLease(live->id).ok());
  ASSERT_TRUE(c.RenewLease(gone->id).ok());  // its holder's last renewal: it dies now
  store.failing = true;
  for (int s = 0; s < 14; ++s) {  // 70 s of failing writes: the live holder's renewals fail
    clock.AdvanceMs(5'000);
    if (s % 3 == 0) {
      EXPECT_FALSE(c.RenewLease(live->id).ok());
    }
    c.Tick();
  }
  store.failing = false;
  clock.AdvanceMs(500);
  c.Tick();
  EXPECT_TRUE(c.GetAllocation(live->id).ok()) << "released before its holder could renew again";
  EXPECT_TRUE(c.GetAllocation(gone->id).ok());
  clock.AdvanceMs(10'000);
  ASSERT_TRUE(c.RenewLease(live->id).ok());
  c.Tick();
  clock.AdvanceMs(30'000);
  ASSERT_TRUE(c.RenewLease(live->id).ok());  // its holder renews as usual
  clock.AdvanceMs(31'000);  // 61 s after the first write that reached the store again: a lease
  c.Tick();
  EXPECT_TRUE(c.GetAllocation(live->id).ok());
  EXPECT_FALSE(c.GetAllocation(gone->id).ok()) << "a holder gone for good keeps its allocation";
}

TEST_F(ControllerTest, AllocatesUntilCapacityIsExhaustedThenReleases) {
  testing::AddNodes(*c_, 1, 2);
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {  // 4 x 50 TFLOPS fill two 100-TFLOPS GPUs
    auto a = c_->Allocate({"", "", 50, 1024, 1, "high", ""});
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ids.push_back(a->id);
  }
  auto full = c_->Allocate({"", "", 1, 1, 1, "", ""});
  EXPECT_EQ(full.status().code(), StatusCode::kOutOfMemory);
  ASSERT_TRUE(c_->Release(ids[0]).ok());
  EXPECT_EQ(c_->Release(ids[0]).code(), StatusCode::kNotFound);
  EXPECT_TRUE(c_->Allocate({"", "", 50, 1, 1, "", ""}).ok());
}

TEST_F(ControllerTest, CompactFirstPoolPacksOntoTheFullestGpu) {
  Pool spec;
  spec.name = "packed";
  spec.placement_mode = "compactfirst";
  ASSERT_TRUE(c_->CreatePool(spec).ok());
  EXPECT_EQ(c_->GetPool("packed")->placement_mode, "CompactFirst");
  testing::AddNodes(*c_, 1, 2, "packed");
  auto a = c_->Allocate({"", "packed", 30, 1, 1, "", ""});
  auto b = c_->Allocate({"", "packed", 30, 1, 1, "", ""});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->vgpus[0].gpu_uuid, b->vgpus[0].gpu_uuid);
}

TEST_F(ControllerTest, DefaultModePacksNodesButSpreadsGpusWithinTheNode) {
  EXPECT_EQ(c_->GetPool("default")->placement_mode, "NodeCompactGPULowLoad");
  testing::AddNodes(*c_, 2, 2);
  auto a = c_->Allocate({"", "", 30, 1, 1, "", ""});
  auto b = c_->Allocate({"", "", 30, 1, 1, "", ""});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->node, b->node);                              // the most loaded node
  EXPECT_NE(a->vgpus[0].gpu_uuid, b->vgpus[0].gpu_uuid);    // its least loaded GPU
  EXPECT_EQ(a->vgpus[0].share_ppm, 300000u);                // 30 of 100 TFLOPS
}

TEST_F(ControllerTest, NodesJoiningBetweenAllocationsKeepTheAccounting) {
  testing::AddNodes(*c_, 1, 1);  // node-0
  ASSERT_TRUE(c_->Allocate({"", "", 80, 1, 1, "", ""}).ok());
  NodeRegistration reg{"late", "", "", {{"GPU-late", "H100-SXM", 0, 0, 100.0, 81920}}};
  ASSERT_TRUE(c_->RegisterNode(reg).ok());  // joins the placement mirror incrementally
  auto a = c_->Allocate({"", "", 50, 1, 1, "", ""});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->node, "late");  // node-0 has only 20 left
  ASSERT_TRUE(c_->RegisterNode(reg).ok());  // re-registration: the mirror is rebuilt
  EXPECT_EQ(c_->Allocate({"", "", 60, 1, 1, "", ""}).status().code(), StatusCode::kOutOfMemory);
  EXPECT_TRUE(c_->Allocate({"", "", 50, 1, 1, "", ""}).ok());
}

TEST_F(ControllerTest, OversellRatioLetsRequestsExceedPhysicalTflops) {
  Pool spec;
  spec.name = "over";
  spec.tflops_oversell_ratio = 2.0;
  ASSERT_TRUE(c_->CreatePool(spec).ok());
  testing::AddNodes(*c_, 1, 1, "over");
  EXPECT_TRUE(c_->Allocate({"", "over", 90, 1, 1, "", ""}).ok());
  EXPECT_TRUE(c_->Allocate({"", "over", 90, 1, 1, "", ""}).ok());
  EXPECT_EQ(c_->Allocate({"", "over", 30, 1, 1, "", ""}).status().code(), StatusCode::kOutOfMemory);
  // Oversell lets several vGPUs add up to more than the GPU, never one vGPU be more than it.
  ASSERT_TRUE(c_->Release(c_->ListAllocations()[0].id).ok());
  auto too_big = c_->Allocate({"", "over", 150, 1, 1, "", ""});
  EXPECT_EQ(too_big.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(too_big.status().message().find("tflops 150 is more than any GPU in pool 'over' has (the largest has 100"),
            std::string::npos) << too_big.status().ToString();
  EXPECT_EQ(c_->ListAllocations().size(), 1u);
  spec.tflops_oversell_ratio = 0.5;
  EXPECT_EQ(c_->UpdatePool(spec).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ControllerTest, PercentRequestsReserveAShareOfTheChosenGpu) {
  testing::AddNodes(*c_, 1, 1);
  AllocationRequest r{"", "", 0, 1024, 1, "", ""};
  r.percent = 25;
  auto a = c_->Allocate(r);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->vgpus[0].milli_tflops, 25000);
  EXPECT_EQ(a->vgpus[0].share_ppm, 250000u);
}

TEST_F(ControllerTest, TenantQuotaRefusesBeyondItsLimit) {
  testing::AddNodes(*c_, 1, 2);
  ASSERT_TRUE(c_->SetTenantQuota({"team-a", 50'000, 0, 0}).ok());
  AllocationRequest r{"", "", 30, 1, 1, "", ""};
  r.tenant = "team-a";
  ASSERT_TRUE(c_->Allocate(r).ok());
  EXPECT_EQ(c_->Allocate(r).status().code(), StatusCode::kResourceExhausted);
  r.tenant = "team-b";
  EXPECT_TRUE(c_->Allocate(r).ok());
  Restart();  // the quota and the usage survive a restart
  r.tenant = "team-a";
  EXPECT_EQ(c_->Allocate(r).status().code(), StatusCode::kResourceExhausted);
}

TEST_F(ControllerTest, HigherQosPreemptsTheFewestLowerQosAllocations) {
  testing::AddNodes(*c_, 1, 1);
  auto low1 = c_->Allocate({"", "", 40, 1, 1, "low", ""});
  auto low2 = c_->Allocate({"", "", 40, 1, 1, "low", ""});
  auto med = c_->Allocate({"", "", 20, 1, 1, "medium", ""});
  ASSERT_TRUE(low1.ok() && low2.ok() && med.ok());
  // Nothing is lower than low: refused, nothing released.
  EXPECT_EQ(c_->Allocate({"", "", 10, 1, 1, "low", ""}).status().code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(c_->ListAllocations().size(), 3u);
  // Medium 30 needs one low allocation gone, not two.
  std::vector<Allocation> preempted;
  auto m2 = c_->Allocate({"", "", 30, 1, 1, "medium", ""}, &preempted);
  ASSERT_TRUE(m2.ok()) << m2.status().ToString();
  ASSERT_EQ(preempted.size(), 1u);
  EXPECT_EQ(preempted[0].qos, Qos::kLow);
  EXPECT_EQ(c_->ListAllocations().size(), 3u);
  EXPECT_EQ(c_->counters().allocations_preempted, 1u);
  // Medium 90 could only free 40 (the other low): futile, so nothing is evicted.
  preempted.clear();
  EXPECT_EQ(c_->Allocate({"", "", 90, 1, 1, "medium", ""}, &preempted).status().code(), StatusCode::kOutOfMemory);
  EXPECT_TRUE(preempted.empty());
  EXPECT_EQ(c_->ListAllocations().size(), 3u);
  // The victim's deletion and the new allocation were one commit: a restart agrees.
  Restart();
  EXPECT_EQ(c_->ListAllocations().size(), 3u);
  MilliTflops used = 0;
  for (const GpuStatus& g : c_->ListGpus("")) used += g.gpu.used_milli_tflops;
  EXPECT_EQ(used, 90000);
}

// A preempted allocation is not just gone: an eviction record (same commit) tells the node agent to
// stop its processes and `tfusion ps` why it went; the agent's report moves it to "stopped".
TEST_F(ControllerTest, PreemptionAndLostNodesLeaveEvictionsUntilStoppedAndRetentionEnds) {
  testing::AddNodes(*c_, 1, 1);
  auto low = c_->Allocate({"", "", 60, 1, 1, "low", ""});
  ASSERT_TRUE(low.ok());
  EXPECT_TRUE(c_->ListEvictions("").empty());
  auto crit = c_->Allocate({"", "", 60, 1, 1, "critical", ""});
  ASSERT_TRUE(crit.ok()) << crit.status().ToString();
  auto e = c_->GetEviction(low->id);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->reason, "preempted");
  EXPECT_EQ(e->preempted_by, crit->id);
  EXPECT_EQ(e->state, EvictionState::kStopping);
  EXPECT_EQ(e->allocation.qos, Qos::kLow);
  EXPECT_EQ(c_->ListEvictions("node-0").size(), 1u);
  EXPECT_TRUE(c_->ListEvictions("node-9").empty());
  EXPECT_EQ(c_->GetEviction(crit->id).status().code(), StatusCode::kNotFound);

  // The record is durable with the preemption: a restarted controller still has it.
  Restart();
  ASSERT_TRUE(c_->GetEviction(low->id).ok());
  EXPECT_EQ(c_->MarkEvictionStopped(low->id, -1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c_->MarkEvictionStopped("a-unknown", 0).status().code(), StatusCode::kNotFound);
  auto stopped = c_->MarkEvictionStopped(low->id, 2);
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->state, EvictionState::kStopped);
  EXPECT_EQ(stopped->processes_stopped, 2);
  EXPECT_NE(c_->MetricsText().find("tf_controller_evictions_stopping 0"), std::string::npos);

  // A lost node's allocations are evictions too, with their own reason.
  testing::AddNodes(*c_, 2, 1);  // node-0 again (kept) and node-1
  auto on1 = c_->Allocate({"", "", 10, 1, 1, "high", ""});
  ASSERT_TRUE(on1.ok());
  for (int i = 0; i < 50; ++i) {  // node-0 keeps heartbeating; the other goes silent
    clock_.AdvanceMs(1'000);
    ASSERT_TRUE(c_->Heartbeat(on1->node == "node-0" ? "node-1" : "node-0", {}).ok());
    c_->Tick();
  }
  auto lost = c_->GetEviction(on1->id);
  ASSERT_TRUE(lost.ok()) << lost.status().ToString();
  EXPECT_EQ(lost->reason, "node-lost");

  // Forgotten once the retention period has passed.
  clock_.AdvanceMs(3'600'000);
  c_->Tick();
  EXPECT_TRUE(c_->ListEvictions("").empty());
  Restart();
  EXPECT_TRUE(c_->ListEvictions("").empty());
}

TEST_F(ControllerTest, MultiGpuAllocationsStayOnOneNode) {
  testing::AddNodes(*c_, 2, 2);
  auto a = c_->Allocate({"", "", 10, 1, 2, "", ""});
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(a->vgpus.size(), 2u);
  EXPECT_NE(a->vgpus[0].gpu_uuid, a->vgpus[1].gpu_uuid);
  EXPECT_EQ(c_->Allocate({"", "", 10, 1, 3, "", ""}).status().code(), StatusCode::kOutOfMemory);
}

TEST_F(ControllerTest, WorkloadSuppliesDefaults) {
  testing::AddNodes(*c_, 1, 1);
  ASSERT_TRUE(c_->CreateWorkload({"train", "", 20'000, 4096, 1, Qos::kHigh}).ok());
  auto a = c_->Allocate({"train", "", 0, 0, 0, "", ""});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->vgpus[0].milli_tflops, 20000);
  EXPECT_EQ(a->qos, Qos::kHigh);
  EXPECT_EQ(c_->Allocate({"nope", "", 0, 0, 0, "", ""}).status().code(), StatusCode::kNotFound);
}

TEST_F(ControllerTest, RejectsBadInputWithoutChangingAnything) {
  testing::AddNodes(*c_, 1, 1);
  EXPECT_EQ(c_->Allocate({"", "", -1, 1, 1, "", ""}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c_->Allocate({"", "", 1, 1, 1, "urgent", ""}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c_->Allocate({"", "nopool", 1, 1, 1, "", ""}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c_->CreatePool("bad/name").status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(c_->ListAllocations().empty());
}

TEST_F(ControllerTest, SilentNodeIsMarkedLostThenItsAllocationsAreReleased) {
  testing::AddNodes(*c_, 2, 1);
  auto a = c_->Allocate({"", "", 100, 1, 1, "", ""});
  ASSERT_TRUE(a.ok());
  const std::string busy = a->node, other = busy == "node-0" ? "node-1" : "node-0";
  clock_.AdvanceMs(9'000);
  ASSERT_TRUE(c_->Heartbeat(other, {}).ok());
  c_->Tick();
  EXPECT_EQ(c_->GetNode(busy)->node.state, NodeState::kReady);
  clock_.AdvanceMs(2'000);  // 11 s silent
  c_->Tick();
  EXPECT_EQ(c_->GetNode(busy)->node.state, NodeState::kLost);
  EXPECT_EQ(c_->ListAllocations().size(), 1u);  // still within the grace period
  // A lost node's GPUs take no new work.
  ASSERT_TRUE(c_->Heartbeat(other, {}).ok());
  clock_.AdvanceMs(29'000);
  ASSERT_TRUE(c_->Heartbeat(other, {}).ok());
  c_->Tick();
  EXPECT_EQ(c_->ListAllocations().size(), 1u);
  clock_.AdvanceMs(1'000);
  c_->Tick();
  EXPECT_TRUE(c_->ListAllocations().empty());
  EXPECT_EQ(c_->counters().allocations_released_lost_node, 1u);
  // It comes back: ready and schedulable again.
  ASSERT_TRUE(c_->Heartbeat(busy, {}).ok());
  EXPECT_EQ(c_->GetNode(busy)->node.state, NodeState::kReady);
  EXPECT_TRUE(c_->Allocate({"", "", 100, 1, 1, "", ""}).ok());
}

TEST_F(ControllerTest, RestartRebuildsStateFromTheStore) {
  testing::AddNodes(*c_, 1, 1);
  auto a = c_->Allocate({"", "", 60, 1, 1, "", ""});
  ASSERT_TRUE(a.ok());
  Restart();
  ASSERT_EQ(c_->ListAllocations().size(), 1u);
  EXPECT_EQ(c_->ListAllocations()[0].id, a->id);
  // The capacity taken before the restart is still taken.
  EXPECT_EQ(c_->Allocate({"", "", 50, 1, 1, "", ""}).status().code(), StatusCode::kOutOfMemory);
  EXPECT_TRUE(c_->Allocate({"", "", 40, 1, 1, "", ""}).ok());
}

// A compute limit (ceiling) beside the request: placed by the request, kept in the allocation
// in TFLOPS and as a share of the GPU, stored and restored; a missing limit means the request.
// A store whose GPU usage disagrees with its allocations (edited by hand, or written by a build
// that overflowed) is repaired from the allocations on start, and stays repaired.
TEST_F(ControllerTest, UsageThatDisagreesWithTheAllocationsIsRepairedOnStart) {
  testing::AddNodes(*c_, 1, 1);
  auto a = c_->Allocate({"", "", 30, 1024, 1, "", ""});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  const std::string uuid = a->vgpus[0].gpu_uuid;
  auto kv = store_->Get(std::string(kGpuPrefix) + uuid);
  ASSERT_TRUE(kv.ok() && kv->has_value());
  nlohmann::json g = nlohmann::json::parse((*kv)->value);
  g["used_tflops"] = -9.2e15;  // as a store written before milli-TFLOPS would hold it
  g.erase("used_milli_tflops");
  g["used_vram_mib"] = 7;
  ASSERT_TRUE(store_->Commit({}, {Write::Put(std::string(kGpuPrefix) + uuid, g.dump())}).ok());
  Restart();
  for (int round = 0; round < 2; ++round) {
    auto gpus = c_->ListGpus("");
    ASSERT_EQ(gpus.size(), 1u);
    EXPECT_EQ(gpus[0].gpu.used_milli_tflops, 30000);
    EXPECT_EQ(gpus[0].gpu.used_vram_mib, 1024);
    Restart();  // the repair was written to the store
  }
}

TEST_F(ControllerTest, ComputeLimitIsCarriedStoredAndRestored) {
  testing::AddNodes(*c_, 1, 2);  // two 100-TFLOPS GPUs
  AllocationRequest by_tflops{"", "", 25, 1024, 1, "high", ""};
  by_tflops.tflops_limit = 100;
  auto a = c_->Allocate(by_tflops);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->vgpus[0].milli_tflops, 25000);
  EXPECT_EQ(a->vgpus[0].milli_tflops_limit, 100000);
  EXPECT_EQ(a->vgpus[0].share_ppm, 250'000u);
  EXPECT_EQ(a->vgpus[0].limit_ppm, 1'000'000u);
  AllocationRequest by_percent{"", "", 0, 1024, 1, "", ""};
  by_percent.percent = 10;
  by_percent.percent_limit = 40;
  auto p = c_->Allocate(by_percent);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->vgpus[0].share_ppm, 100'000u);
  EXPECT_EQ(p->vgpus[0].limit_ppm, 400'000u);
  EXPECT_EQ(p->vgpus[0].milli_tflops_limit, 40000);
  auto plain = c_->Allocate({"", "", 30, 1024, 1, "", ""});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->vgpus[0].milli_tflops_limit, 30000) << "a single value keeps its meaning: limit = request";
  EXPECT_EQ(plain->vgpus[0].limit_ppm, plain->vgpus[0].share_ppm);
  // Placement counts requests only: 25 + 10 + 30 of 200 TFLOPS are used.
  MilliTflops used = 0;
  for (const GpuStatus& g : c_->ListGpus("")) used += g.gpu.used_milli_tflops;
  EXPECT_EQ(used, 65000);

  Restart();
  auto back = c_->GetAllocation(a->id);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->vgpus[0].milli_tflops_limit, 100000);
  EXPECT_EQ(back->vgpus[0].limit_ppm, 1'000'000u);
  EXPECT_EQ(back->qos, Qos::kHigh);
  EXPECT_EQ(c_->GetAllocation(p->id)->vgpus[0].limit_ppm, 400'000u);
}

TEST(AllocationJson, ARecordWithoutALimitReadsAsLimitEqualToRequest) {
  auto a = AllocationFromJson(R"({"id":"a-1","pool":"default","node":"n","qos":"low",
      "vgpus":[{"gpu":"GPU-1","tflops":30,"vram_mib":1024,"gpu_index":0,"share_ppm":300000}]})");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->vgpus[0].milli_tflops_limit, 30000);
  EXPECT_EQ(a->vgpus[0].limit_ppm, 300'000u);
  auto w = WorkloadFromJson(R"({"name":"w","pool":"default","tflops":20,"vram_mib":1})");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->milli_tflops_limit, 20000);
  // And what is written reads back the same.
  auto again = AllocationFromJson(ToJson(*a).dump());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->vgpus[0].limit_ppm, 300'000u);
}

TEST_F(ControllerTest, BadComputeLimitsAreRefusedAndChangeNothing) {
  testing::AddNodes(*c_, 1, 1);  // one 100-TFLOPS GPU
  struct Case {
    double tflops, percent, tflops_limit, percent_limit;
    StatusCode code;
    const char* says;
  } cases[] = {
      {50, 0, 40, 0, StatusCode::kInvalidArgument, "tflops_limit 40 is below the request tflops 50"},
      {0, 30, 0, 20, StatusCode::kInvalidArgument, "percent_limit 20 is below the request percent 30"},
      {0, 30, 0, 150, StatusCode::kInvalidArgument, "percent_limit must be a number in (0, 100]"},
      {50, 0, 0, 60, StatusCode::kInvalidArgument, "in the request's unit"},
      {0, 30, 60, 0, StatusCode::kInvalidArgument, "in the request's unit"},
      {50, 0, -1, 0, StatusCode::kInvalidArgument, "tflops_limit must be a positive number"},
      {50, 0, 150, 0, StatusCode::kOutOfMemory, "tflops_limit 150 is more than any GPU in pool 'default' has"},
      {150, 0, 0, 0, StatusCode::kOutOfMemory, "tflops 150 is more than any GPU in pool 'default' has"},
  };
  for (const Case& k : cases) {
    AllocationRequest r{"", "", k.tflops, 1024, 1, "", ""};
    r.percent = k.percent;
    r.tflops_limit = k.tflops_limit;
    r.percent_limit = k.percent_limit;
    auto a = c_->Allocate(r);
    ASSERT_FALSE(a.ok()) << k.says;
    EXPECT_EQ(a.status().code(), k.code) << a.status().ToString();
    EXPECT_NE(a.status().message().find(k.says), std::string::npos) << a.status().ToString();
  }
  EXPECT_TRUE(c_->ListAllocations().empty());
  EXPECT_EQ(c_->ListGpus("")[0].gpu.used_milli_tflops, 0);
  Workload w{"w", "", 50'000, 1024, 1, Qos::kMedium, 40'000};
  EXPECT_EQ(c_->CreateWorkload(w).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(c_->ListWorkloads().empty());
}

// In a pool of GPUs of different sizes, a TFLOPS limit only lands on a GPU that can host it.
TEST_F(ControllerTest, ATflopsLimitLandsOnAGpuBigEnoughForIt) {
  NodeRegistration small{"small", "", "", {{"GPU-small", "L4", 0, 0, 120, 23034}}};
  NodeRegistration big{"big", "", "", {{"GPU-big", "H100-SXM", 0, 0, 989, 81920}}};
  ASSERT_TRUE(c_->RegisterNode(small).ok());
  ASSERT_TRUE(c_->RegisterNode(big).ok());
  for (int i = 0; i < 3; ++i) {
    AllocationRequest r{"", "", 20, 1024, 1, "", ""};
    r.tflops_limit = 500;
    auto a = c_->Allocate(r);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ(a->vgpus[0].gpu_uuid, "GPU-big");
  }
  auto plain = c_->Allocate({"", "", 20, 1024, 1, "", ""});
  ASSERT_TRUE(plain.ok());
}

TEST_F(ControllerTest, WorkloadComputeLimitIsTheAllocationsDefault) {
  testing::AddNodes(*c_, 1, 1);
  ASSERT_TRUE(c_->CreateWorkload({"burst", "", 20'000, 4096, 1, Qos::kHigh, 80'000}).ok());
  EXPECT_EQ(c_->GetWorkload("burst")->milli_tflops_limit, 80000);
  auto a = c_->Allocate({"burst", "", 0, 0, 0, "", ""});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->vgpus[0].milli_tflops, 20000);
  EXPECT_EQ(a->vgpus[0].milli_tflops_limit, 80000);
  Restart();
  EXPECT_EQ(c_->GetWorkload("burst")->milli_tflops_limit, 80000);
}

TEST_F(ControllerTest, TwoControllersOnOneStoreNeverDoubleAllocate) {
  // Without leader election both write: the GPU revision CAS must stop the second.
  testing::AddNodes(*c_, 1, 1);
  Controller other(store_.get(), &clock_, MakeSchedulerPlacement(), nullptr);
  ASSERT_TRUE(other.Rebuild().ok());
  ASSERT_TRUE(c_->Allocate({"", "", 70, 1, 1, "", ""}).ok());
  // `other` still believes the GPU is empty; its commit conflicts, it re-reads and refuses.
  EXPECT_EQ(other.Allocate({"", "", 70, 1, 1, "", ""}).status().code(), StatusCode::kOutOfMemory);
  EXPECT_GE(other.counters().commit_conflicts, 1u);
  EXPECT_TRUE(other.Allocate({"", "", 30, 1, 1, "", ""}).ok());
}

// Maintenance (trial 44, F2): a cordoned node keeps what it holds and takes nothing new, across its
// agent's re-registration, its loss and return, and a controller restart, until uncordoned.
TEST_F(ControllerTest, ACordonedNodeKeepsItsAllocationsAndTakesNoNewOnesUntilUncordoned) {
  testing::AddNodes(*c_, 2, 1);
  auto a = c_->Allocate({"", "", 30, 1, 1, "", ""});
  ASSERT_TRUE(a.ok());
  const std::string busy = a->node, other = busy == "node-0" ? "node-1" : "node-0";
  StatusOr<Node> n = c_->SetNodeCordoned(busy, true);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_TRUE(n->cordoned);
  EXPECT_EQ(n->cordoned_ms, clock_.NowMs());
  EXPECT_TRUE(c_->SetNodeCordoned(busy, true).ok());  // again: no change, no error
  ASSERT_TRUE(c_->GetAllocation(a->id).ok());
  EXPECT_EQ(c_->GetNode(busy)->allocations, 1u);
  // The default mode packs onto the busiest node; cordoned, the work goes to the other one.
  auto b = c_->Allocate({"", "", 30, 1, 1, "", ""});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->node, other);
  AllocationRequest pinned{"", "", 10, 1, 1, "", ""};
  pinned.node = busy;
  EXPECT_EQ(c_->Allocate(pinned).status().code(), StatusCode::kOutOfMemory);
  ASSERT_TRUE(c_->Allocate({"", "", 70, 1, 1, "", ""}).ok());  // the other node is full now
  EXPECT_EQ(c_->Allocate({"", "", 10, 1, 1, "", ""}).status().code(), StatusCode::kOutOfMemory)
      << "placed on the cordoned node, which has 70 TFLOPS free";
  // The agent restarts and registers again: still cordoned.
  NodeRegistration reg{busy, "", "", {{"GPU-" + busy.substr(5) + "-0", "H100-SXM", 0, 0, 100.0, 81920}}};
  ASSERT_TRUE(c_->RegisterNode(reg).ok());
  EXPECT_TRUE(c_->GetNode(busy)->node.cordoned);
  EXPECT_EQ(c_->Allocate({"", "", 10, 1, 1, "", ""}).status().code(), StatusCode::kOutOfMemory);
  // Lost and back: still cordoned, its allocation kept (within the grace period).
  clock_.AdvanceMs(11'000);
  ASSERT_TRUE(c_->Heartbeat(other, {}).ok());
  c_->Tick();
  ASSERT_EQ(c_->GetNode(busy)->node.state, NodeState::kLost);
  ASSERT_TRUE(c_->Heartbeat(busy, {}).ok());
  EXPECT_EQ(c_->GetNode(busy)->node.state, NodeState::kReady);
  EXPECT_TRUE(c_->GetNode(busy)->node.cordoned);
  // Stored with the node: a restarted controller still keeps new work off it.
  Restart();
  EXPECT_TRUE(c_->GetNode(busy)->node.cordoned);
  EXPECT_FALSE(c_->GetNode(other)->node.cordoned);
  EXPECT_TRUE(c_->GetAllocation(a->id).ok());
  EXPECT_EQ(c_->Allocate({"", "", 10, 1, 1, "", ""}).status().code(), StatusCode::kOutOfMemory);
  // Uncordoned, it takes work again.
  n = c_->SetNodeCordoned(busy, false);
  ASSERT_TRUE(n.ok());
  EXPECT_FALSE(n->cordoned);
  EXPECT_EQ(n->cordoned_ms, 0);
  auto c = c_->Allocate({"", "", 10, 1, 1, "", ""});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->node, busy);
  Restart();
  EXPECT_FALSE(c_->GetNode(busy)->node.cordoned);
  EXPECT_EQ(c_->SetNodeCordoned("no-such-node", true).status().code(), StatusCode::kNotFound);
}

TEST_F(ControllerTest, PreemptionDoesNotPlaceOnACordonedNode) {
  testing::AddNodes(*c_, 2, 1);
  auto low0 = c_->Allocate({"", "", 100, 1, 1, "low", ""});
  auto low1 = c_->Allocate({"", "", 100, 1, 1, "low", ""});
  ASSERT_TRUE(low0.ok() && low1.ok());
  ASSERT_TRUE(c_->SetNodeCordoned(low0->node, true).ok());
  std::vector<Allocation> preempted;
  auto crit = c_->Allocate({"", "", 100, 1, 1, "critical", ""}, &preempted);
  ASSERT_TRUE(crit.ok()) << crit.status().ToString();
  EXPECT_EQ(crit->node, low1->node);
  ASSERT_EQ(preempted.size(), 1u);
  EXPECT_EQ(preempted[0].id, low1->id);
  // Both cordoned: nothing to place on, and the low allocation on the cordoned node stays.
  ASSERT_TRUE(c_->SetNodeCordoned(low1->node, true).ok());
  preempted.clear();
  EXPECT_EQ(c_->Allocate({"", "", 100, 1, 1, "critical", ""}, &preempted).status().code(), StatusCode::kOutOfMemory);
  EXPECT_TRUE(preempted.empty());
  EXPECT_TRUE(c_->GetAllocation(low0->id).ok());
}

// Trial 44, F2: a node re-registered with a GPU smaller than what its allocations hold was accepted
// silently (230% of its VRAM allocated). It is refused, naming the GPU, and nothing changes.
TEST_F(ControllerTest, ReRegisteringAGpuBelowWhatItsAllocationsHoldIsRefused) {
  Pool spec;
  spec.name = "infer";
  spec.tflops_oversell_ratio = 2.0;
  ASSERT_TRUE(c_->CreatePool(spec).ok());
  NodeRegistration reg{"l4-a", "infer", "10.0.0.5:9400", {{"GPU-l4-a-0", "NVIDIA-L4", 0, 0, 121.0, 23034}}};
  ASSERT_TRUE(c_->RegisterNode(reg).ok());
  auto a = c_->Allocate({"", "infer", 121, 23034, 1, "", ""});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto gpu = [&] { return c_->ListGpus("infer").at(0).gpu; };
  NodeRegistration smaller = reg;
  smaller.address = "10.0.0.6:9400";
  smaller.gpus[0].tflops = 50;  // 100 to allocate at oversell 2: below the 121 held
  smaller.gpus[0].vram_mib = 10000;
  StatusOr<Node> n = c_->RegisterNode(smaller);
  ASSERT_EQ(n.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(HttpStatusFor(n.status()), 409);
  EXPECT_EQ(n.status().message(),
            "GPU GPU-l4-a-0 holds allocations of 121 TFLOPS and 23034 MiB but now reports 50 TFLOPS and 10000 MiB "
            "(100 TFLOPS and 10000 MiB to allocate in pool 'infer'); the registration changed nothing: release its "
            "allocations first (tfusion ps lists them) or fix the GPU's report");
  EXPECT_EQ(gpu().milli_tflops, 121000);
  EXPECT_EQ(gpu().vram_mib, 23034);
  EXPECT_EQ(c_->GetNode("l4-a")->node.address, "10.0.0.5:9400");
  // VRAM alone below what is held: refused too.
  smaller.gpus[0].tflops = 121;
  EXPECT_EQ(c_->RegisterNode(smaller).status().code(), StatusCode::kFailedPrecondition);
  // Smaller, but the oversold compute still covers what is held: accepted.
  smaller.gpus[0].tflops = 61;
  smaller.gpus[0].vram_mib = 23034;
  ASSERT_TRUE(c_->RegisterNode(smaller).ok());
  EXPECT_EQ(gpu().milli_tflops, 61000);
  // The refused agent keeps retrying and sends no heartbeats: lost past the grace period, the
  // node's allocations are released as node-lost, and then the smaller GPU registers.
  smaller.gpus[0].tflops = 10;
  smaller.gpus[0].vram_mib = 1000;
  ASSERT_EQ(c_->RegisterNode(smaller).status().code(), StatusCode::kFailedPrecondition);
  clock_.AdvanceMs(11'000);
  c_->Tick();
  clock_.AdvanceMs(31'000);
  c_->Tick();
  EXPECT_FALSE(c_->GetAllocation(a->id).ok());
  EXPECT_EQ(c_->ListEvictions("l4-a").at(0).reason, "node-lost");
  ASSERT_TRUE(c_->RegisterNode(smaller).ok());
  EXPECT_EQ(gpu().vram_mib, 1000);
}

}  // namespace
}  // namespace tf::controller

namespace tf::controller {
namespace {

// A replica that stops leading says so once (a standby that stayed silent looked like a second
// leader in its log), and says it leads again once it has rebuilt.
TEST_F(ControllerTest, AReplicaThatStopsLeadingSaysSoOnce) {
  ReplicaLoop loop(c_.get(), nullptr, 1000);
  c_->StopServing();
  ::testing::internal::CaptureStderr();
  loop.RunOnce();  // not serving: rebuilds, leads
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("this replica leads; state rebuilt from the store"),
            std::string::npos);
  c_->StopServing();  // as a lapsed lease or a fenced write leaves it
  ::testing::internal::CaptureStderr();
  loop.RunOnce();
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("this replica no longer leads"), std::string::npos) << said;
  EXPECT_NE(said.find("this replica leads; state rebuilt"), std::string::npos) << said;
  ::testing::internal::CaptureStderr();
  loop.RunOnce();  // serving: nothing to say
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("leads"), std::string::npos);
}

}  // namespace
}  // namespace tf::controller

namespace tf::controller {
namespace {

size_t Occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// An agent refused at registration retries every 2 s: the operator reads why once per node and
// reason (not once per retry), again when the reason changes or after the node registered.
TEST_F(ControllerTest, ARefusedRegistrationIsLoggedOncePerNodeAndReason) {
  testing::AddNodes(*c_, 1, 1);  // node-0 holds GPU-0-0
  NodeRegistration clone{"node-b", "", "", {{"GPU-0-0", "H100-SXM", 0, 0, 100.0, 81920}}};
  ::testing::internal::CaptureStderr();
  for (int retry = 0; retry < 3; ++retry) EXPECT_EQ(c_->RegisterNode(clone).status().code(), StatusCode::kAlreadyExists);
  std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(Occurrences(said, "registration of node node-b refused"), 1u) << said;
  EXPECT_NE(said.find("GPU GPU-0-0 is registered to node 'node-0'"), std::string::npos) << said;

  // Another reason: said again, once.
  clone.pool = "nopool";
  ::testing::internal::CaptureStderr();
  for (int retry = 0; retry < 2; ++retry) EXPECT_EQ(c_->RegisterNode(clone).status().code(), StatusCode::kNotFound);
  said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(Occurrences(said, "registration of node node-b refused"), 1u) << said;
  EXPECT_NE(said.find("pool 'nopool' not found"), std::string::npos) << said;

  // Registered (its own GPU), then refused for the first reason again: said again.
  NodeRegistration fixed{"node-b", "", "", {{"GPU-b-0", "H100-SXM", 0, 0, 100.0, 81920}}};
  ASSERT_TRUE(c_->RegisterNode(fixed).ok());
  clone.pool = "";
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(c_->RegisterNode(clone).ok());
  said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(Occurrences(said, "registration of node node-b refused"), 1u) << said;
}

}  // namespace
}  // namespace tf::controller

namespace tf::controller {
namespace {

// A lease that runs out means the command holding the allocation died or lost the controller:
// counted on its own, not as a release by request (nor as a lost node's).
TEST_F(ControllerTest, LeaseExpiriesAreCountedApartFromReleasesByRequest) {
  testing::AddNodes(*c_, 1, 1);
  AllocationRequest leased{"", "", 10, 1, 1, "", ""};
  leased.lease_ms = 60'000;
  auto dropped = c_->Allocate(leased);
  auto plain = c_->Allocate({"", "", 10, 1, 1, "", ""});
  ASSERT_TRUE(dropped.ok() && plain.ok());
  ASSERT_TRUE(c_->Release(plain->id).ok());
  for (int s = 0; s < 7; ++s) {  // 70 s: the node beats, nobody renews the lease
    clock_.AdvanceMs(10'000);
    ASSERT_TRUE(c_->Heartbeat("node-0", {}).ok());
    c_->Tick();
  }
  ASSERT_FALSE(c_->GetAllocation(dropped->id).ok());
  tf::testing::ParsedExposition m;
  const std::string text = c_->MetricsText();
  ASSERT_EQ(tf::testing::ParseExposition(text, &m), "") << text;
  EXPECT_EQ(m.families["tf_controller_allocations_lease_expired_total"].type, "counter");
  EXPECT_EQ(m.Value("tf_controller_allocations_lease_expired_total", {}), 1);
  EXPECT_EQ(m.Value("tf_controller_allocations_released_total", {}), 1) << "only the release by request";
  EXPECT_EQ(m.Value("tf_controller_allocations_released_lost_node_total", {}), 0);
}

}  // namespace
}  // namespace tf::controller

namespace tf::controller {
namespace {

// The controller's log tells what happened to a lost node: one line naming the node and the
// allocations released as node-lost when the grace ends (not repeated), one when it is back.
TEST_F(ControllerTest, ALostNodesReleasesAndItsReturnAreLogged) {
  testing::AddNodes(*c_, 2, 1);
  auto a = c_->Allocate({"", "", 10, 1, 1, "", ""});
  auto b = c_->Allocate({"", "", 10, 1, 1, "", ""});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->node, b->node);  // packed onto one node
  const std::string busy = a->node, other = busy == "node-0" ? "node-1" : "node-0";
  ::testing::internal::CaptureStderr();
  for (int s = 0; s < 45; ++s) {  // silent 45 s: lost at 10 s, released after the 30 s grace
    clock_.AdvanceMs(1'000);
    ASSERT_TRUE(c_->Heartbeat(other, {}).ok());
    c_->Tick();
  }
  std::string said = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(c_->ListAllocations().empty());
  EXPECT_EQ(Occurrences(said, "node " + busy + " lost for"), 1u) << said;
  const size_t line = said.find("node " + busy + " lost for");
  ASSERT_NE(line, std::string::npos) << said;
  const std::string released = said.substr(line, said.find('\n', line) - line);
  EXPECT_NE(released.find("released its 2 allocation(s) as node-lost"), std::string::npos) << released;
  EXPECT_NE(released.find(a->id), std::string::npos) << released;
  EXPECT_NE(released.find(b->id), std::string::npos) << released;

  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(c_->Heartbeat(busy, {}).ok());
  ASSERT_TRUE(c_->Heartbeat(busy, {}).ok());
  said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(Occurrences(said, "node " + busy + " is back after"), 1u) << said;

  // An agent that restarts while its node is lost registers instead of heartbeating: said too.
  for (int s = 0; s < 12; ++s) {
    clock_.AdvanceMs(1'000);
    ASSERT_TRUE(c_->Heartbeat(other, {}).ok());
    c_->Tick();
  }
  ASSERT_EQ(c_->GetNode(busy)->node.state, NodeState::kLost);
  ::testing::internal::CaptureStderr();
  testing::AddNodes(*c_, 2, 1);
  said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(Occurrences(said, "node " + busy + " registered again after"), 1u) << said;
  EXPECT_EQ(Occurrences(said, "node " + other + " registered again"), 0u) << said;
}

}  // namespace
}  // namespace tf::controller
