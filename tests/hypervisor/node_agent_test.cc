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
  controller::Controller c(store.get(), &clock, controller::MakeCompactFirstPlacement(), nullptr);
  ASSERT_TRUE(c.Rebuild().ok());
  controller::ApiServer api(&c, "tok");
  int port = *api.Bind("127.0.0.1", 0);
  api.Start();

  FakeGpuSource source({{0, "GPU-aaa", "NVIDIA H100 80GB HBM3", 81559, 0, 0, 0}});
  UnattachedQuotaRegions regions;
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

TEST(NodeAgent, NoDriverRegistersZeroGpus) {
  char tmpl[] = "/tmp/tfagent-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  controller::FakeClock clock;
  auto store = std::move(controller::SqliteStore::Open(dir + "/s.db")).value();
  controller::Controller c(store.get(), &clock, controller::MakeCompactFirstPlacement(), nullptr);
  ASSERT_TRUE(c.Rebuild().ok());
  controller::ApiServer api(&c, "tok");
  int port = *api.Bind("127.0.0.1", 0);
  api.Start();
  NvmlGpuSource source("libnvidia-ml-does-not-exist.so.1");
  UnattachedQuotaRegions regions;
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
