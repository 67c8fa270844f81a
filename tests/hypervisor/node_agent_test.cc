#include "hypervisor/node_agent.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "controller/api_server.h"
#include "controller/sqlite_store.h"
#include "hypervisor/nvml_gpu_source.h"

namespace tf::hypervisor {
namespace {

TEST(NvmlGpuSource, MissingDriverIsReportedNotFatal) {
  NvmlGpuSource source("libnvidia-ml-does-not-exist.so.1");
  auto gpus = source.Discover();
  ASSERT_FALSE(gpus.ok());
  EXPECT_EQ(gpus.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(gpus.status().message().find("no NVIDIA driver"), std::string::npos);
}

TEST(NodeAgent, RegistersSizesFromCatalogAndHeartbeats) {
  char tmpl[] = "/tmp/tfagent-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  controller::FakeClock clock;
  auto store = std::move(controller::SqliteStore::Open(dir + "/s.db")).value();
  controller::Controller c(store.get(), &clock, controller::MakeSchedulerPlacement(), nullptr);
  ASSERT_TRUE(c.Rebuild().ok());
  controller::ApiServer api(&c, "tok");
  int port = *api.Bind("127.0.0.1", 0);
  api.Start();

  FakeGpuSource source({{0, "GPU-aaa", "NVIDIA H100 80GB HBM3", 81559, 0, 0, 0}});
  QuotaRegions regions(dir + "/regions");
  NodeAgent agent({"http://127.0.0.1:" + std::to_string(port), "tok", "gpu-host-1", "", "", ""},
                  &source, &regions, &clock);
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_EQ(regions.attached().size(), 1u);
  auto gpus = c.ListGpus("");
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_GT(gpus[0].gpu.tflops, 500);  // H100: from the catalog, not zero
  EXPECT_EQ(gpus[0].gpu.vram_mib, 81559);
  source.utilization_percent = 42;
  ASSERT_TRUE(agent.HeartbeatOnce().ok());
  EXPECT_EQ(c.ListGpus("")[0].utilization_percent, 42);
  EXPECT_NE(agent.MetricsText().find("tf_gpu_utilization_percent{gpu=\"GPU-aaa\""), std::string::npos);

  NodeAgent bad({"http://127.0.0.1:" + std::to_string(port), "wrong", "h2", "", "", ""}, &source,
                &regions, &clock);
  EXPECT_EQ(bad.Start().code(), StatusCode::kUnauthenticated);
  api.Stop();
  std::filesystem::remove_all(dir);
}

// The agent owns the per-GPU regions: one per GPU at start, one vGPU per allocation the controller
// placed on the node (limits from the allocation), removed when the allocation is released.
TEST(NodeAgent, QuotaRegionsFollowTheControllersAllocations) {
  char tmpl[] = "/tmp/tfagent-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  controller::FakeClock clock;
  auto store = std::move(controller::SqliteStore::Open(dir + "/s.db")).value();
  controller::Controller c(store.get(), &clock, controller::MakeSchedulerPlacement(), nullptr);
  ASSERT_TRUE(c.Rebuild().ok());
  controller::ApiServer api(&c, "tok");
  int port = *api.Bind("127.0.0.1", 0);
  api.Start();

  FakeGpuSource source({{0, "GPU-r0", "NVIDIA L4", 23034, 0, 0, 0},
                        {1, "GPU-r1", "NVIDIA L4", 23034, 0, 0, 0}});
  QuotaRegions regions(dir + "/regions");
  NodeAgent agent({"http://127.0.0.1:" + std::to_string(port), "tok", "host-r", "", "", ""},
                  &source, &regions, &clock);
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_EQ(regions.attached().size(), 2u);
  ASSERT_TRUE(std::filesystem::exists(dir + "/regions/gpu-GPU-r0.region"));
  const double l4 = c.ListGpus("")[0].gpu.tflops;
  ASSERT_GT(l4, 0);
  EXPECT_EQ(regions.region("GPU-r0")->capacity_mtflops(), static_cast<uint64_t>(l4 * 1000 + 0.5));

  controller::AllocationRequest req{"", "", 0, 2048, 1, "", ""};
  req.percent = 25;
  auto a = c.Allocate(req);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(agent.SyncAllocations().ok());
  limiter::GpuRegion* r = regions.region(a->vgpus[0].gpu_uuid);
  ASSERT_NE(r, nullptr);
  uint32_t index = 0;
  ASSERT_EQ(r->FindVgpu(a->id.c_str(), &index), limiter::RegionError::kOk);
  EXPECT_EQ(r->Limit(index), 2048ull << 20);
  auto snap = std::make_unique<limiter::RegionSnapshot>();
  r->Snapshot(snap.get());
  ASSERT_EQ(snap->vgpu_count, 1u);
  EXPECT_EQ(snap->vgpus[0].compute_share_ppm, 250000u);

  // A restarted agent re-attaches to the same regions and keeps the vGPU.
  QuotaRegions again(dir + "/regions");
  NodeAgent agent2({"http://127.0.0.1:" + std::to_string(port), "tok", "host-r", "", "", ""},
                   &source, &again, &clock);
  ASSERT_TRUE(agent2.Start().ok());
  ASSERT_TRUE(agent2.SyncAllocations().ok());
  EXPECT_EQ(again.region(a->vgpus[0].gpu_uuid)->FindVgpu(a->id.c_str(), &index), limiter::RegionError::kOk);

  ASSERT_TRUE(c.Release(a->id).ok());
  ASSERT_TRUE(agent.SyncAllocations().ok());
  EXPECT_EQ(r->FindVgpu(a->id.c_str(), &index), limiter::RegionError::kNotFound);
  EXPECT_NE(agent.MetricsText().find("tf_node_vgpus 0"), std::string::npos);
  api.Stop();
  std::filesystem::remove_all(dir);
}

TEST(NodeAgent, NoDriverRegistersZeroGpus) {
  char tmpl[] = "/tmp/tfagent-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  controller::FakeClock clock;
  auto store = std::move(controller::SqliteStore::Open(dir + "/s.db")).value();
  controller::Controller c(store.get(), &clock, controller::MakeSchedulerPlacement(), nullptr);
  ASSERT_TRUE(c.Rebuild().ok());
  controller::ApiServer api(&c, "tok");
  int port = *api.Bind("127.0.0.1", 0);
  api.Start();
  NvmlGpuSource source("libnvidia-ml-does-not-exist.so.1");
  QuotaRegions regions(dir + "/regions");
  NodeAgent agent({"http://127.0.0.1:" + std::to_string(port), "tok", "cpu-host", "", "", ""},
                  &source, &regions, &clock);
  ASSERT_TRUE(agent.Start().ok());
  EXPECT_NE(agent.discovery_message().find("no NVIDIA driver"), std::string::npos);
  EXPECT_EQ(c.ListNodes().size(), 1u);
  EXPECT_TRUE(c.ListGpus("").empty());
  api.Stop();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tf::hypervisor
