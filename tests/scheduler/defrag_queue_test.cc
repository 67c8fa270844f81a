#include <gtest/gtest.h>

#include "scheduler/defrag.h"
#include "scheduler/workload_queue.h"
#include "scheduler_test_util.h"

namespace tf::sched {
namespace {

using testing::Node;
using testing::Req;

TEST(DefragTest, EmptiesALightNodeOnlyWhenEveryWorkloadHasATarget) {
  Scheduler s;
  ASSERT_TRUE(s.AddPool(PoolSpec{"p", 1.0, PlacementMode::kLowLoadFirst}).ok());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(s.AddNode(Node("n" + std::to_string(i), 1, "A100-80GB", 100)).ok());
  // Spread: one 30-TFLOPS workload per node on n0..n2.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s.Schedule(Req("w" + std::to_string(i), 30)).ok());
  auto plan = PlanDefrag(s, "p", DefragOptions{0.3, Qos::kHigh});
  ASSERT_TRUE(plan.ok());
  ASSERT_FALSE(plan->moves.empty());
  EXPECT_LE(plan->nodes_touched, 3);
  for (const DefragMove& m : plan->moves) EXPECT_NE(m.from_node, m.to_node);
  // Nothing changed in the live state.
  EXPECT_EQ(s.state().allocations().size(), 3u);

  // A node whose workload fits nowhere else is left alone.
  Scheduler full;
  ASSERT_TRUE(full.AddPool(PoolSpec{"p", 1.0, PlacementMode::kLowLoadFirst}).ok());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(full.AddNode(Node("n" + std::to_string(i), 1, "A100-80GB", 100)).ok());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(full.Schedule(Req("w" + std::to_string(i), 60)).ok());
  plan = PlanDefrag(full, "p", DefragOptions{0.5, Qos::kHigh});
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->moves.empty());
}

TEST(DefragTest, RespectsTheNodeBudget) {
  Scheduler s;
  ASSERT_TRUE(s.AddPool(PoolSpec{"p", 1.0, PlacementMode::kLowLoadFirst}).ok());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(s.AddNode(Node("n" + std::to_string(i), 1, "A100-80GB", 100)).ok());
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(s.Schedule(Req("w" + std::to_string(i), 10)).ok());
  auto plan = PlanDefrag(s, "p", DefragOptions{0.2, Qos::kHigh});
  ASSERT_TRUE(plan.ok());
  EXPECT_LE(plan->nodes_touched, 2);
  EXPECT_EQ(PlanDefrag(s, "nope", {}).status().code(), StatusCode::kNotFound);
}

TEST(WorkloadQueueTest, ReleasedCapacityGoesToTheHighestQosFirst) {
  Scheduler s;
  ASSERT_TRUE(s.AddPool(PoolSpec{"p", 1.0, PlacementMode::kCompactFirst}).ok());
  ASSERT_TRUE(s.AddNode(Node("n", 1, "A100-80GB", 100)).ok());
  WorkloadQueue q(&s, /*allow_preemption=*/false);
  ASSERT_TRUE(q.Submit(Req("first", 100)).ok());
  ASSERT_TRUE(q.Submit(Req("low", 100, 1024, Qos::kLow)).ok());
  ASSERT_TRUE(q.Submit(Req("high", 100, 1024, Qos::kHigh)).ok());
  EXPECT_EQ(q.pending_count(), 2u);
  ASSERT_TRUE(q.Release("first").ok());
  EXPECT_EQ(q.status("high")->phase, WorkloadPhase::kRunning);
  EXPECT_EQ(q.status("low")->phase, WorkloadPhase::kPending);
  EXPECT_EQ(q.Submit(Req("high", 1)).code(), StatusCode::kAlreadyExists);
  Request bad = Req("bad", -1);
  EXPECT_EQ(q.Submit(bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(q.status("bad"), nullptr);
}

TEST(WorkloadQueueTest, PreemptedAndDisplacedWorkloadsWaitAgain) {
  Scheduler s;
  ASSERT_TRUE(s.AddPool(PoolSpec{"p", 1.0, PlacementMode::kCompactFirst}).ok());
  ASSERT_TRUE(s.AddNode(Node("n1", 1, "A100-80GB", 100)).ok());
  WorkloadQueue q(&s);
  ASSERT_TRUE(q.Submit(Req("low", 80, 1024, Qos::kLow)).ok());
  ASSERT_TRUE(q.Submit(Req("crit", 80, 1024, Qos::kCritical)).ok());
  EXPECT_EQ(q.status("crit")->phase, WorkloadPhase::kRunning);
  EXPECT_EQ(q.status("low")->phase, WorkloadPhase::kPending);
  EXPECT_EQ(q.status("low")->times_preempted, 1);
  ASSERT_TRUE(q.FailNode("n1").ok());
  EXPECT_EQ(q.status("crit")->phase, WorkloadPhase::kPending);
  EXPECT_EQ(q.status("crit")->times_displaced, 1);
}

// A suspendable victim waits suspended on its GPU, not in the queue: when the preemptor leaves it
// resumes there before a pending workload of its own QoS takes the room, while a pending workload
// of a higher QoS still goes first.
TEST(WorkloadQueueTest, ASuspendedVictimResumesBeforeEqualQosWorkButAfterHigherQosWork) {
  Scheduler s;
  ASSERT_TRUE(s.AddPool(PoolSpec{"p", 1.0, PlacementMode::kCompactFirst}).ok());
  ASSERT_TRUE(s.AddNode(Node("n1", 1, "A100-80GB", 100)).ok());
  WorkloadQueue q(&s);
  Request low = Req("low", 80, 1024, Qos::kLow);
  low.suspendable = true;
  ASSERT_TRUE(q.Submit(low).ok());
  ASSERT_TRUE(q.Submit(Req("crit", 80, 1024, Qos::kCritical)).ok());
  EXPECT_EQ(q.status("crit")->phase, WorkloadPhase::kRunning);
  EXPECT_EQ(q.status("low")->phase, WorkloadPhase::kSuspended);
  EXPECT_EQ(q.status("low")->node, "n1");
  EXPECT_EQ(q.status("low")->times_preempted, 1);
  EXPECT_EQ(q.suspended_count(), 1u);
  EXPECT_EQ(q.pending_count(), 0u);
  ASSERT_TRUE(q.Submit(Req("low2", 80, 1024, Qos::kLow)).ok());  // waits: equal QoS, no preemption
  EXPECT_EQ(q.pending_count(), 1u);
  bool suspended_event = false;
  for (const QueueEvent& e : q.TakeEvents()) suspended_event |= e.kind == QueueEvent::Kind::kSuspended && e.request_id == "low";
  EXPECT_TRUE(suspended_event);
  ASSERT_TRUE(q.Release("crit").ok());
  EXPECT_EQ(q.status("low")->phase, WorkloadPhase::kRunning) << "the suspended one resumes first";
  EXPECT_EQ(q.status("low2")->phase, WorkloadPhase::kPending);
  EXPECT_FALSE(s.state().FindAllocation("low")->suspended);
  bool resumed_event = false;
  for (const QueueEvent& e : q.TakeEvents()) resumed_event |= e.kind == QueueEvent::Kind::kResumed && e.request_id == "low";
  EXPECT_TRUE(resumed_event);

  // Suspended again; this time a medium workload waits too and takes the room first.
  ASSERT_TRUE(q.Submit(Req("crit2", 80, 1024, Qos::kCritical)).ok());
  EXPECT_EQ(q.status("low")->phase, WorkloadPhase::kSuspended);
  ASSERT_TRUE(q.Submit(Req("med", 80, 1024, Qos::kMedium)).ok());
  ASSERT_TRUE(q.Release("crit2").ok());
  EXPECT_EQ(q.status("med")->phase, WorkloadPhase::kRunning);
  EXPECT_EQ(q.status("low")->phase, WorkloadPhase::kSuspended);
  // Deleting a suspended workload frees it for good; its GPU is then the medium one's alone.
  ASSERT_TRUE(q.Release("low").ok());
  EXPECT_EQ(q.status("low"), nullptr);
  EXPECT_EQ(q.suspended_count(), 0u);
  EXPECT_EQ(s.state().node(0).gpus[0].used, ToMilliTflops(80));
  // A failed node turns a suspended workload into a pending one.
  ASSERT_TRUE(q.Release("med").ok());
  ASSERT_TRUE(q.Release("low2").ok());
  Request low3 = Req("low3", 80, 1024, Qos::kLow);
  low3.suspendable = true;
  ASSERT_TRUE(q.Submit(low3).ok());
  ASSERT_TRUE(q.Submit(Req("crit3", 80, 1024, Qos::kCritical)).ok());
  ASSERT_EQ(q.status("low3")->phase, WorkloadPhase::kSuspended);
  ASSERT_TRUE(q.FailNode("n1").ok());
  EXPECT_EQ(q.status("low3")->phase, WorkloadPhase::kPending);
  EXPECT_EQ(q.suspended_count(), 0u);
  EXPECT_EQ(q.pending_count(), 2u);
}

}  // namespace
}  // namespace tf::sched
