// End-to-end check on the openb trace (skipped when the trace is not staged): our policy
// leaves fewer GPUs unallocated than the best-fit reference under the FGD protocol.
#include <gtest/gtest.h>

#include <filesystem>

#include "sim/replay.h"

namespace tf::sim {
namespace {

TEST(OpenbReplayTest, FragAwareBeatsBestFitAtSaturation) {
  const std::string dir = TF_OPENB_DIR;
  if (!std::filesystem::exists(dir + "/openb_node_list_gpu_node.csv")) GTEST_SKIP() << "no trace at " << dir;
  auto nodes = LoadNodes(dir + "/openb_node_list_gpu_node.csv");
  auto pods = LoadPods(dir + "/openb_pod_list_default.csv");
  ASSERT_TRUE(nodes.ok() && pods.ok());
  ASSERT_EQ(nodes->size(), 1213u);
  sched::SchedulerOptions refs;
  refs.k8s_integer_scores = true;
  auto best_fit = RunStatic(*nodes, *pods, sched::PlacementMode::kBestFit, 42, refs);
  auto ours = RunStatic(*nodes, *pods, sched::PlacementMode::kFragAware, 42, refs);
  ASSERT_TRUE(best_fit.ok() && ours.ok());
  EXPECT_LT(ours->unallocated_at_130, best_fit->unallocated_at_130);
  EXPECT_LT(ours->unallocated_at_130, 5.0);
  EXPECT_GT(best_fit->unallocated_at_130, 6.0);
}

}  // namespace
}  // namespace tf::sim
