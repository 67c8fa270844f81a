// src/cli/pool_allocation.h against a controller started in-process on port 0.
#include "cli/pool_allocation.h"

#include <gtest/gtest.h>

#include "controller/api_server.h"
#include "controller/sqlite_store.h"
#include "test_cluster.h"

namespace tf::controller {
namespace {

class PoolAllocationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = std::move(SqliteStore::Open(dir_.path() + "/state.db")).value();
    c_ = std::make_unique<Controller>(store_.get(), &clock_, MakeSchedulerPlacement(), nullptr);
    ASSERT_TRUE(c_->Rebuild().ok());
    testing::AddNodes(*c_, 1, 2);  // node-0: two 100-TFLOPS, 80 GiB GPUs
    api_ = std::make_unique<ApiServer>(c_.get(), "tok");
    url_ = "http://127.0.0.1:" + std::to_string(*api_->Bind("127.0.0.1", 0));
    api_->Start();
  }
  void TearDown() override { api_->Stop(); }

  testing::TempDir dir_;
  FakeClock clock_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Controller> c_;
  std::unique_ptr<ApiServer> api_;
  std::string url_;
};

TEST_F(PoolAllocationTest, RequestsAndReleasesAVgpu) {
  auto a = cli::RequestPoolAllocation(url_, "tok", 25, 0, (3ull << 30) + 1, "", "high");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->node, "node-0");
  EXPECT_EQ(a->gpu_uuid, "GPU-0-" + std::to_string(a->gpu_index));
  EXPECT_EQ(a->vram_bytes, (3ull << 30) + (1ull << 20));  // rounded up to whole MiB
  EXPECT_EQ(a->share_ppm, 250000u);
  auto stored = c_->GetAllocation(a->id);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->qos, Qos::kHigh);

  auto p = cli::RequestPoolAllocation(url_, "tok", 0, 50, 1ull << 30, "default", "");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->share_ppm, 500000u);

  ASSERT_TRUE(cli::ReleasePoolAllocation(url_, "tok", a->id).ok());
  EXPECT_EQ(cli::ReleasePoolAllocation(url_, "tok", a->id).code(), StatusCode::kNotFound);
  EXPECT_EQ(c_->ListAllocations().size(), 1u);
}

TEST_F(PoolAllocationTest, TheLimitGoesBesideTheRequestAndComesBack) {
  auto a = cli::RequestPoolAllocation(url_, "tok", 25, 0, 1ull << 30, "", "critical", "", 100);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->share_ppm, 250000u);
  EXPECT_EQ(a->limit_ppm, 1000000u);
  EXPECT_EQ(a->tflops, 25);
  EXPECT_EQ(a->tflops_limit, 100);
  EXPECT_EQ(a->qos, "critical");
  auto p = cli::RequestPoolAllocation(url_, "tok", 0, 20, 1ull << 30, "", "", "", 60);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->limit_ppm, 600000u);
  auto plain = cli::RequestPoolAllocation(url_, "tok", 0, 20, 1ull << 30, "", "");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->limit_ppm, plain->share_ppm);
  // Refused, and nothing changes: below the request, above every GPU.
  auto below = cli::RequestPoolAllocation(url_, "tok", 25, 0, 1ull << 30, "", "", "", 10);
  EXPECT_EQ(below.status().code(), StatusCode::kInvalidArgument);
  auto above = cli::RequestPoolAllocation(url_, "tok", 25, 0, 1ull << 30, "", "", "", 250);
  EXPECT_EQ(above.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(above.status().message().find("tflops_limit 250 is more than any GPU"), std::string::npos)
      << above.status().ToString();
  EXPECT_EQ(c_->ListAllocations().size(), 3u);
}

TEST_F(PoolAllocationTest, ErrorsKeepTheirMeaning) {
  EXPECT_EQ(cli::RequestPoolAllocation(url_, "tok", 10, 10, 1 << 20, "", "").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cli::RequestPoolAllocation(url_, "tok", 10, 0, 0, "", "").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cli::RequestPoolAllocation(url_, "tok", 10, 0, 1 << 20, "", "urgent").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(cli::RequestPoolAllocation(url_, "wrong", 10, 0, 1 << 20, "", "").status().code(),
            StatusCode::kUnauthenticated);
  EXPECT_EQ(cli::RequestPoolAllocation(url_, "tok", 10, 0, 1 << 20, "nopool", "").status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(cli::RequestPoolAllocation(url_, "tok", 500, 0, 1 << 20, "", "").status().code(),
            StatusCode::kOutOfMemory);
  EXPECT_EQ(cli::RequestPoolAllocation("http://127.0.0.1:1", "tok", 10, 0, 1 << 20, "", "").status().code(),
            StatusCode::kUnavailable);
  EXPECT_TRUE(c_->ListAllocations().empty());
}

// Which path `tfusion run --controller` takes once the pool has placed the vGPU.
TEST(ChooseRunPlacement, LocalGpuRunsHereAnotherNodeRunsThroughItsWorkerOrIsRefused) {
  cli::PoolAllocation a;
  a.id = "a-1";
  a.node = "gpu-node-7";
  a.gpu_uuid = "GPU-far";
  auto here = cli::ChooseRunPlacement(a, {"GPU-near", "GPU-far"}, "");
  ASSERT_TRUE(here.ok());
  EXPECT_FALSE(here->remote);
  auto remote = cli::ChooseRunPlacement(a, {"GPU-near"}, "10.0.0.7:7600");
  ASSERT_TRUE(remote.ok());
  EXPECT_TRUE(remote->remote);
  EXPECT_EQ(remote->worker_address, "10.0.0.7:7600");
  auto no_gpus_here = cli::ChooseRunPlacement(a, {}, "10.0.0.7:7600");  // a machine without GPUs
  ASSERT_TRUE(no_gpus_here.ok());
  EXPECT_TRUE(no_gpus_here->remote);
  auto refused = cli::ChooseRunPlacement(a, {"GPU-near"}, "");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("node gpu-node-7 (GPU GPU-far)"), std::string::npos);
  EXPECT_NE(refused.status().message().find("no worker address registered"), std::string::npos);
  EXPECT_NE(refused.status().message().find("--worker-address HOST:PORT"), std::string::npos);
  EXPECT_EQ(refused.status().message().find("NVML"), std::string::npos) << "this machine's GPUs were found";
  // No GPU of this machine found (its driver not where tfusion looks): say so, it may be that node.
  auto unseen = cli::ChooseRunPlacement(a, {}, "");
  ASSERT_FALSE(unseen.ok());
  EXPECT_NE(unseen.status().message().find("this machine's GPUs were not found through NVML either: if it is "
                                           "gpu-node-7, give --nvml or TFUSION_REAL_LIBNVML"),
            std::string::npos)
      << unseen.status().message();
}

TEST_F(PoolAllocationTest, NodesRegisterAValidatedWorkerAddress) {
  EXPECT_EQ(*cli::NodeWorkerAddress(url_, "tok", "node-0"), "");
  NodeRegistration reg{"node-w", "", "", {{"GPU-w", "L4", 0, 0, 100, 1024}}, "gpu-w.example:7600"};
  ASSERT_TRUE(c_->RegisterNode(reg).ok());
  EXPECT_EQ(*cli::NodeWorkerAddress(url_, "tok", "node-w"), "gpu-w.example:7600");
  EXPECT_EQ(cli::NodeWorkerAddress(url_, "tok", "node-x").status().code(), StatusCode::kNotFound);
  for (const char* bad : {"gpu-w", ":7600", "gpu-w:", "gpu-w:0", "gpu-w:70000", "gpu w:1", "a/b:1", "[zz]:1"}) {
    reg.worker_address = bad;
    EXPECT_EQ(c_->RegisterNode(reg).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  for (const char* good : {"10.0.0.5:7600", "[fd00::5]:7600", "gpu-w:1"}) {
    reg.worker_address = good;
    EXPECT_TRUE(c_->RegisterNode(reg).ok()) << good;
  }
}

}  // namespace
}  // namespace tf::controller
