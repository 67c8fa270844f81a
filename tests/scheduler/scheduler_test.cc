#include "scheduler/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "scheduler_test_util.h"

namespace tf::sched {
namespace {

using testing::Node;
using testing::Req;

Scheduler Cluster(PlacementMode mode, std::initializer_list<NodeSpec> nodes, double oversell = 1.0) {
  Scheduler s;
  EXPECT_TRUE(s.AddPool(PoolSpec{"p", oversell, mode}).ok());
  for (const NodeSpec& n : nodes) EXPECT_TRUE(s.AddNode(n).ok()) << n.name;
  return s;
}

TEST(ValidateRequestTest, RejectsMalformedRequestsWithReasons) {
  Request r = Req("a", 10);
  EXPECT_TRUE(ValidateRequest(r).ok());
  auto expect_bad = [](Request bad, const std::string& needle) {
    Status s = ValidateRequest(bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  Request x = r;
  x.id = "";
  expect_bad(x, "id");
  x = r;
  x.compute_percent_request = 50;
  expect_bad(x, "exactly one");
  x = r;
  x.tflops_request = 0;
  expect_bad(x, "exactly one");
  x = r;
  x.tflops_limit = 5;
  expect_bad(x, "limit is below");
  x = r;
  x.vram_limit_mib = 10;
  expect_bad(x, "VRAM limit");
  x = r;
  x.gpu_count = 65;
  expect_bad(x, "gpu_count");
  x = r;
  x.tflops_request = std::nan("");
  expect_bad(x, "finite");
  x = r;
  x.remote = true;
  x.cpu_milli = 100;
  expect_bad(x, "remote");
  x = r;
  x.tflops_request = 0;
  x.compute_percent_request = 150;
  expect_bad(x, "(0, 100]");
}

TEST(SchedulerTest, VramLimitAboveRequestIsAllowedAndOnlyTheRequestCounts) {
  Scheduler s = Cluster(PlacementMode::kCompactFirst, {Node("n1", 1, "A100-80GB", 312, 10000)});
  Request a = Req("a", 10, 6000);
  a.vram_limit_mib = 20000;
  ASSERT_TRUE(s.Schedule(a).ok());
  EXPECT_EQ(s.Schedule(Req("b", 10, 5000)).status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(s.Schedule(Req("c", 10, 4000)).ok());
}

TEST(SchedulerTest, CompactFirstPacksLowLoadFirstSpreads) {
  Scheduler pack = Cluster(PlacementMode::kCompactFirst, {Node("n1", 2), Node("n2", 2)});
  auto a = pack.Schedule(Req("a", 100));
  auto b = pack.Schedule(Req("b", 100));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->node_name, b->node_name);
  EXPECT_EQ(a->gpus, b->gpus);

  Scheduler spread = Cluster(PlacementMode::kLowLoadFirst, {Node("n1", 2), Node("n2", 2)});
  a = spread.Schedule(Req("a", 100));
  b = spread.Schedule(Req("b", 100));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->node_name, b->node_name);
}

TEST(SchedulerTest, NodeCompactGpuLowLoadPacksNodesButSpreadsGpus) {
  Scheduler s = Cluster(PlacementMode::kNodeCompactGpuLowLoad, {Node("n1", 2), Node("n2", 2)});
  auto a = s.Schedule(Req("a", 100));
  auto b = s.Schedule(Req("b", 100));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->node_name, b->node_name);  // the loaded node
  EXPECT_NE(a->gpus, b->gpus);            // its idle GPU
}

TEST(SchedulerTest, ARequestForOneNodeGoesThereOrNowhereAndRankNodesSaysWhy) {
  Scheduler s = Cluster(PlacementMode::kNodeCompactGpuLowLoad, {Node("n1", 1, "A100-80GB", 312, 81920),
                                                                 Node("n2", 1, "A100-80GB", 312, 81920)});
  ASSERT_TRUE(s.Schedule(Req("busy", 300)).ok());  // n1 (lowest index on a tie)
  Request on_n1 = Req("x", 100);
  on_n1.node = "n1";
  EXPECT_EQ(s.Place(on_n1).status().message(), "request 'x': node 'n1' of pool 'p' has no room");
  EXPECT_EQ(s.Place(Req("huge", 100, 1024, Qos::kMedium, 2)).status().message(),
            "request 'huge': no node in pool 'p' has room (nor would it with nothing placed: no node of it has 2 "
            "GPU(s) of the allowed models with that much TFLOPS and VRAM)");
  Request on_n2 = Req("y", 100);
  on_n2.node = "n2";
  EXPECT_EQ(s.Place(on_n2)->node_name, "n2");
  auto ranks = s.RankNodes(Req("z", 100));
  ASSERT_TRUE(ranks.ok());
  ASSERT_EQ(ranks->size(), 2u);
  EXPECT_FALSE((*ranks)[0].fits);
  EXPECT_EQ((*ranks)[0].why_not,
            "0 of its GPUs have 100 TFLOPS and 1024 MiB VRAM free (needs 1); the most free: 12 TFLOPS, 80896 MiB VRAM");
  EXPECT_TRUE((*ranks)[1].fits);
}

TEST(SchedulerTest, PercentRequestScalesWithTheGpu) {
  Scheduler s = Cluster(PlacementMode::kCompactFirst, {Node("h", 1, "H100-SXM", 989.4)});
  Request r = Req("a", 0);
  r.tflops_request = 0;
  r.compute_percent_request = 50;
  auto p = s.Schedule(r);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->compute_per_gpu, ToMilliTflops(494.7));
}

TEST(SchedulerTest, MultiGpuIsAllOrNothingAndPrefersNvlinkPeers) {
  NodeSpec n = Node("n1", 4);
  // GPUs 1 and 3 are NVLink peers; 0 and 2 are not linked to anyone.
  n.gpus[1].nvlink_peers = 1u << 3;
  n.gpus[3].nvlink_peers = 1u << 1;
  Scheduler s = Cluster(PlacementMode::kCompactFirst, {n});
  auto p = s.Schedule(Req("pair", 100, 1024, Qos::kMedium, 2));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->gpus, (std::vector<int>{1, 3}));
  EXPECT_EQ(s.Schedule(Req("five", 100, 1024, Qos::kMedium, 5)).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(s.state().node(0).used_sum, 2 * ToMilliTflops(100));  // the failed one took nothing
}

TEST(SchedulerTest, MultiGpuPrefersOneNumaNode) {
  Scheduler s = Cluster(PlacementMode::kLowLoadFirst, {Node("n1", 4)});  // GPUs 0,1 NUMA 0; 2,3 NUMA 1
  ASSERT_TRUE(s.Schedule(Req("x", 50)).ok());  // loads one GPU of one NUMA node
  auto p = s.Schedule(Req("pair", 100, 1024, Qos::kMedium, 2));
  ASSERT_TRUE(p.ok());
  const auto& gpus = s.state().node(0).gpus;
  EXPECT_EQ(gpus[static_cast<size_t>(p->gpus[0])].numa_node, gpus[static_cast<size_t>(p->gpus[1])].numa_node);
}

TEST(SchedulerTest, ModelAllowListIsHonoured) {
  Scheduler s = Cluster(PlacementMode::kCompactFirst, {Node("a100", 1), Node("h100", 1, "H100-SXM", 989.4)});
  Request r = Req("r", 10);
  r.gpu_models = {"H100-SXM"};
  auto p = s.Schedule(r);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->node_name, "h100");
  r.id = "r2";
  r.gpu_models = {"B200"};
  EXPECT_EQ(s.Schedule(r).status().code(), StatusCode::kUnavailable);
}

TEST(SchedulerTest, OversellRatioAdmitsMoreTflopsThanPhysical) {
  Scheduler plain = Cluster(PlacementMode::kCompactFirst, {Node("n", 1, "A100-80GB", 100)});
  ASSERT_TRUE(plain.Schedule(Req("a", 80)).ok());
  EXPECT_FALSE(plain.Schedule(Req("b", 80)).ok());
  Scheduler sold = Cluster(PlacementMode::kCompactFirst, {Node("n", 1, "A100-80GB", 100)}, 2.0);
  ASSERT_TRUE(sold.Schedule(Req("a", 80)).ok());
  EXPECT_TRUE(sold.Schedule(Req("b", 80)).ok());
  EXPECT_FALSE(sold.Schedule(Req("c", 80)).ok());
}

TEST(SchedulerTest, HostCpuIsCountedForLocalButNotRemote) {
  NodeSpec n = Node("n", 2);
  n.cpu_milli = 4000;
  Scheduler s = Cluster(PlacementMode::kCompactFirst, {n});
  Request local = Req("local", 10);
  local.cpu_milli = 3000;
  ASSERT_TRUE(s.Schedule(local).ok());
  Request local2 = local;
  local2.id = "local2";
  EXPECT_EQ(s.Schedule(local2).status().code(), StatusCode::kUnavailable);
  Request remote = Req("remote", 10);
  remote.remote = true;
  EXPECT_TRUE(s.Schedule(remote).ok());
}

TEST(SchedulerTest, TenantQuotaIsEnforcedAndFreedOnRelease) {
  Scheduler s = Cluster(PlacementMode::kCompactFirst, {Node("n", 4)});
  s.SetTenantQuota("t", TenantQuota{150, 0, 0});
  ASSERT_TRUE(s.Schedule(Req("a", 100)).ok());
  auto over = s.Schedule(Req("b", 100));
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  // In the user's units, with what it asks: not "100.000000 of 150.000000".
  EXPECT_NE(over.status().message().find("would exceed its TFLOPS quota: uses 100 of 150 TFLOPS and asks 100"),
            std::string::npos)
      << over.status().message();
  ASSERT_TRUE(s.Release("a").ok());
  EXPECT_TRUE(s.Schedule(Req("b", 100)).ok());
  s.SetTenantQuota("t", TenantQuota{0, 0, 1});
  EXPECT_EQ(s.Schedule(Req("c", 1)).status().code(), StatusCode::kResourceExhausted);
}

TEST(SchedulerTest, PreemptionPicksFewestVictimsOnOneGpu) {
  Scheduler s = Cluster(PlacementMode::kCompactFirst, {Node("n", 2, "A100-80GB", 100)});
  // GPU A: three small lows; GPU B: one big low. The big one is the single victim that suffices.
  ASSERT_TRUE(s.Schedule(Req("big", 90, 1024, Qos::kLow)).ok());
  for (const char* id : {"s1", "s2", "s3"}) ASSERT_TRUE(s.Schedule(Req(id, 30, 1024, Qos::kLow)).ok());
  Request hi = Req("hi", 80, 1024, Qos::kHigh);
  ASSERT_EQ(s.Place(hi).status().code(), StatusCode::kUnavailable);
  auto plan = s.PlanPreemption(hi);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->victims, (std::vector<std::string>{"big"}));
  auto evicted = s.ExecutePreemption(hi, *plan);
  ASSERT_TRUE(evicted.ok());
  EXPECT_NE(s.state().FindAllocation("hi"), nullptr);
  EXPECT_EQ(s.state().FindAllocation("big"), nullptr);
}

// A victim whose VRAM can be swapped out is suspended, not evicted: it stays bound to its GPU but
// takes no room (the preemptor fits), is never a victim again, still counts for its tenant's
// quota, and resumes on the same GPU once the room is back, not before.
// A GPU's quota region holds 64 vGPUs: small slices that still fit by TFLOPS and VRAM go to another
// GPU after the 64th, and where none has a slot left the request is refused, saying why. A
// suspended allocation keeps its vGPU (and its slot) on the node.
// With no workload mix configured (the controller's case), the fragmentation-aware modes count
// whole GPUs and a whole node as later demand: 24 slices of 100 TFLOPS on two 8-GPU and two 4-GPU
// nodes of 312-TFLOPS GPUs pack three to a GPU on the small nodes, as BestFit does, and both
// 8-GPU jobs fit afterwards. Scored against copies of the slice only, FGD spread them so that
// neither fitted, and FragAware left room for one.
TEST(SchedulerTest, WithoutAMixFragmentationAwareModesKeepWholeNodesForWholeNodeJobs) {
  for (PlacementMode mode : {PlacementMode::kFragAware, PlacementMode::kFgd, PlacementMode::kBestFit}) {
    SCOPED_TRACE(std::string(PlacementModeName(mode)));
    Scheduler s = Cluster(mode, {Node("n8a", 8), Node("n8b", 8), Node("n4a", 4), Node("n4b", 4)});
    for (int i = 0; i < 24; ++i) ASSERT_TRUE(s.Schedule(Req("s" + std::to_string(i), 100, 10240)).ok()) << i;
    for (const char* big : {"big1", "big2"}) {
      auto p = s.Schedule(Req(big, 312, 81920, Qos::kMedium, 8));
      EXPECT_TRUE(p.ok()) << big << ": " << p.status().ToString();
    }
  }
}

TEST(SchedulerTest, AGpuTakesNoMoreThan64VgpusHoweverSmallTheSlices) {
  Scheduler s = Cluster(PlacementMode::kCompactFirst, {Node("n", 2, "H100", 989.4, 81920)});
  for (int i = 0; i < 2 * kMaxVgpusPerGpu; ++i) {
    auto p = s.Schedule(Req("s" + std::to_string(i), 1, 100));
    ASSERT_TRUE(p.ok()) << i << ": " << p.status().ToString();
    EXPECT_EQ(p->gpus, (std::vector<int>{i < kMaxVgpusPerGpu ? 0 : 1})) << i;
  }
  EXPECT_EQ(s.state().node(0).gpus[0].vgpus, kMaxVgpusPerGpu);
  auto refused = s.Place(Req("one-more", 1, 100));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message(),
            "request 'one-more': no node in pool 'p' has room (1 node(s) have the TFLOPS and VRAM, but their GPUs "
            "hold 64 vGPUs each, the most a GPU can)");
  auto ranks = s.RankNodes(Req("one-more", 1, 100));
  ASSERT_TRUE(ranks.ok());
  ASSERT_EQ(ranks->size(), 1u);
  EXPECT_EQ((*ranks)[0].why_not,
            "2 of its GPUs with room hold 64 vGPUs each, the most a GPU can (needs 1 GPU(s) with room for one more)");
  // A released slice frees its slot; a suspended one does not.
  ASSERT_TRUE(s.Release("s3").ok());
  EXPECT_EQ(s.Place(Req("one-more", 1, 100))->gpus, (std::vector<int>{0}));
  Request low = Req("low", 1, 100, Qos::kLow);
  low.suspendable = true;
  ASSERT_TRUE(s.Commit(low, Placement{"low", 0, "n", {0}, ToMilliTflops(1), 100}).ok());
  EXPECT_FALSE(s.PlanPreemption(Req("med", 1, 100)).ok()) << "suspending the low one would free no slot";
  ASSERT_TRUE(s.Suspend("low").ok());
  EXPECT_FALSE(s.Place(Req("one-more", 1, 100)).ok()) << "the suspended allocation keeps its vGPU";
  ASSERT_TRUE(s.Release("low").ok());
  EXPECT_TRUE(s.Place(Req("one-more", 1, 100)).ok());
  // Evicting a lower-QoS slice does free one.
  ASSERT_TRUE(s.Schedule(Req("fill", 1, 100, Qos::kLow)).ok());
  auto plan = s.PlanPreemption(Req("med", 1, 100));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->victims, (std::vector<std::string>{"fill"}));
}

TEST(SchedulerTest, ASuspendableVictimIsSuspendedAndResumesOnItsGpuWhenTheRoomIsBack) {
  Scheduler s = Cluster(PlacementMode::kCompactFirst, {Node("n", 2, "A100-80GB", 100, 40960)});
  Request low = Req("low", 70, 30000, Qos::kLow);
  low.suspendable = true;
  ASSERT_TRUE(s.Commit(low, Placement{"low", 0, "n", {1}, ToMilliTflops(70), 30000}).ok());
  ASSERT_TRUE(s.Schedule(Req("other", 70, 30000, Qos::kMedium)).ok());  // GPU 0
  const int64_t used_before = s.usage("t").vram_mib;
  Request hi = Req("hi", 60, 20000, Qos::kHigh);
  ASSERT_EQ(s.Place(hi).status().code(), StatusCode::kUnavailable);
  auto plan = s.PlanPreemption(hi);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->victims, (std::vector<std::string>{"low"}));  // the lowest QoS
  EXPECT_EQ(plan->suspended, (std::vector<std::string>{"low"}));
  auto evicted = s.ExecutePreemption(hi, *plan);
  ASSERT_TRUE(evicted.ok()) << evicted.status().ToString();
  EXPECT_TRUE(evicted->empty()) << "a suspended victim is not evicted";
  const Allocation* a = s.state().FindAllocation("low");
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(a->suspended);
  EXPECT_EQ(a->placement.gpus, (std::vector<int>{1}));
  // GPU 1 counts only the preemptor.
  const GpuState& g = s.state().node(0).gpus[1];
  EXPECT_EQ(plan->placement.gpus, (std::vector<int>{1}));
  EXPECT_EQ(g.used, ToMilliTflops(60));
  EXPECT_EQ(g.vram_used_mib, 20000);
  EXPECT_EQ(s.usage("t").vram_mib, used_before + 20000) << "the tenant's quota still counts it";
  // Never a victim twice: another high request can only take the medium one's room.
  auto plan2 = s.PlanPreemption(Req("hi2", 45, 1000, Qos::kHigh));
  ASSERT_TRUE(plan2.ok()) << plan2.status().ToString();
  EXPECT_EQ(plan2->victims, (std::vector<std::string>{"other"}));
  // No room yet: resuming changes nothing.
  EXPECT_EQ(s.Resume("low").code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(s.state().FindAllocation("low")->suspended);
  // The preemptor leaves: the victim counts again, on the same GPU.
  ASSERT_TRUE(s.Release("hi").ok());
  ASSERT_TRUE(s.Resume("low").ok());
  EXPECT_FALSE(s.state().FindAllocation("low")->suspended);
  EXPECT_EQ(s.state().node(0).gpus[1].used, ToMilliTflops(70));
  EXPECT_EQ(s.state().node(0).gpus[1].vram_used_mib, 30000);
  // Releasing a suspended allocation frees nothing twice.
  ASSERT_TRUE(s.Suspend("low").ok());
  ASSERT_TRUE(s.Release("low").ok());
  EXPECT_EQ(s.state().node(0).gpus[1].used, 0);
  EXPECT_EQ(s.state().node(0).gpus[1].vram_used_mib, 0);
  EXPECT_EQ(s.usage("t").vram_mib, 30000);  // "other" only
  EXPECT_EQ(s.Resume("low").code(), StatusCode::kNotFound);
}

// A rebuild from stored state records a suspended allocation even where its GPU is full.
TEST(SchedulerTest, ASuspendedAllocationIsRecordedWithoutRoom) {
  Scheduler s = Cluster(PlacementMode::kCompactFirst, {Node("n", 1, "A100-80GB", 100, 40960)});
  ASSERT_TRUE(s.Schedule(Req("hi", 90, 40000, Qos::kHigh)).ok());
  Request low = Req("low", 50, 30000, Qos::kLow);
  low.suspendable = true;
  Placement p{"low", 0, "n", {0}, ToMilliTflops(50), 30000};
  EXPECT_EQ(s.Commit(low, p).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s.CommitSuspended(low, p).ok());
  EXPECT_TRUE(s.state().FindAllocation("low")->suspended);
  EXPECT_EQ(s.state().node(0).gpus[0].vram_used_mib, 40000);
  EXPECT_EQ(s.CommitSuspended(low, p).code(), StatusCode::kAlreadyExists);
}

TEST(SchedulerTest, PreemptionIsNeverFutileOrUpward) {
  Scheduler s = Cluster(PlacementMode::kCompactFirst, {Node("n", 1, "A100-80GB", 100)});
  ASSERT_TRUE(s.Schedule(Req("crit", 60, 1024, Qos::kCritical)).ok());
  ASSERT_TRUE(s.Schedule(Req("low", 40, 1024, Qos::kLow)).ok());
  // Evicting "low" frees 40, the request needs 50: futile, so nothing is proposed.
  EXPECT_EQ(s.PlanPreemption(Req("hi", 50, 1024, Qos::kHigh)).status().code(), StatusCode::kUnavailable);
  // Equal QoS never preempts.
  EXPECT_FALSE(s.PlanPreemption(Req("low2", 30, 1024, Qos::kLow)).ok());
  EXPECT_NE(s.state().FindAllocation("low"), nullptr);
}

TEST(SchedulerTest, FailedNodeReleasesItsWorkloads) {
  Scheduler s = Cluster(PlacementMode::kCompactFirst, {Node("n1", 1), Node("n2", 1)});
  auto a = s.Schedule(Req("a", 10));
  ASSERT_TRUE(a.ok());
  auto displaced = s.FailNode(a->node_name);
  ASSERT_TRUE(displaced.ok());
  ASSERT_EQ(displaced->size(), 1u);
  auto again = s.Schedule(Req("a", 10));
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->node_name, a->node_name);
}

TEST(SchedulerTest, FgdAvoidsBreakingAWholeGpuWhenAPartialOneFits) {
  Scheduler s = Cluster(PlacementMode::kFgd, {Node("n1", 2, "A100-80GB", 1000), Node("n2", 2, "A100-80GB", 1000)});
  WorkloadShape whole;
  whole.gpu_milli = 1000;
  WorkloadShape half;
  half.gpu_milli = 500;
  s.SetWorkloadMix(WorkloadMix({whole, half}));
  ASSERT_TRUE(s.Schedule(Req("h1", 500)).ok());
  auto h2 = s.Schedule(Req("h2", 500));
  ASSERT_TRUE(h2.ok());
  // The second half shares the first one's GPU, keeping three whole GPUs free.
  EXPECT_EQ(h2->node_name, s.state().FindAllocation("h1")->placement.node_name);
  EXPECT_EQ(h2->gpus, s.state().FindAllocation("h1")->placement.gpus);
}

TEST(SchedulerTest, DecisionsStayCorrectAcrossCachedShapes) {
  // The same shape repeatedly: the cache must see each commit.
  Scheduler s = Cluster(PlacementMode::kLowLoadFirst, {Node("n1", 1, "A100-80GB", 100), Node("n2", 1, "A100-80GB", 100)});
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s.Schedule(Req("r" + std::to_string(i), 50)).ok()) << i;
  EXPECT_FALSE(s.Schedule(Req("r4", 50)).ok());
  ASSERT_TRUE(s.Release("r2").ok());
  EXPECT_TRUE(s.Schedule(Req("r4", 50)).ok());
}

// A pool's VRAM expansion is bounded per GPU by its node's tier budgets; unreported budgets (-1)
// bound nothing, and without budgets the figure is exactly VRAM x (100 + host + disk) / 100.
TEST(SchedulerTest, TierBudgetsBoundThePoolsVramExpansion) {
  PoolSpec pool{"p", 1.0, PlacementMode::kCompactFirst, 100, 50};
  EXPECT_EQ(GpuSchedulableCapacity(100, 81559, pool).vram_mib, 81559 * 250 / 100);
  EXPECT_EQ(GpuSchedulableCapacity(100, 16384, pool, {2048, 0}).vram_mib, 16384 + 2048);
  EXPECT_EQ(GpuSchedulableCapacity(100, 16384, pool, {65536, 65536}).vram_mib, 16384 * 250 / 100)
      << "budgets above the expansion do not add to it";
  EXPECT_EQ(GpuSchedulableCapacity(100, 16384, pool, {-1, 1024}).vram_mib, 16384 + 16384 + 1024);
  Scheduler s;
  ASSERT_TRUE(s.AddPool(pool).ok());
  NodeSpec tight{"tight", "p", {{"L4", 100, 16384, 0, 0, 2048, 0}}, 0, 0};
  ASSERT_TRUE(s.AddNode(tight).ok());
  Request r = Req("big", 10);
  r.pool = "p";
  r.vram_request_mib = 20000;
  EXPECT_FALSE(s.Schedule(r).ok()) << "16 GiB + a 2 GiB host tier cannot hold 20000 MiB";
  NodeSpec roomy{"roomy", "p", {{"L4", 100, 16384, 0, 0, 8192, 0}}, 0, 0};
  ASSERT_TRUE(s.AddNode(roomy).ok());
  StatusOr<Placement> p = s.Schedule(r);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->node_name, "roomy");
}

}  // namespace
}  // namespace tf::sched
