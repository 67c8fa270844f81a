#include "deviceplugin/vgpu_devices.h"

#include <gtest/gtest.h>

namespace tf::deviceplugin {
namespace {

hypervisor::DiscoveredGpu Gpu(const std::string& uuid, int numa = -1) {
  hypervisor::DiscoveredGpu g;
  g.uuid = uuid;
  g.numa_node = numa;
  return g;
}

const RegionMount kRegions{"/host/shm", "/dev/shm/tensorfusion"};

TEST(VgpuDeviceTable, AdvertisesSlotsPerGpuWithTheirNumaNode) {
  VgpuDeviceTable t(3);
  bool changed = false;
  ASSERT_TRUE(t.Discovered({Gpu("GPU-a", 1), Gpu("GPU-b")}, &changed).ok());
  EXPECT_TRUE(changed);
  auto d = t.Devices();
  ASSERT_EQ(d.size(), 6u);
  EXPECT_EQ(d[0].id, "GPU-a::0");
  EXPECT_EQ(d[0].numa_node, 1);
  EXPECT_EQ(d[5].id, "GPU-b::2");
  EXPECT_EQ(d[5].numa_node, -1);
  ASSERT_TRUE(t.Discovered({Gpu("GPU-a", 1), Gpu("GPU-b")}, &changed).ok());
  EXPECT_FALSE(changed);
}

TEST(VgpuDeviceTable, AGpuThatGoesMissingStaysListedAsUnhealthy) {
  VgpuDeviceTable t(2);
  ASSERT_TRUE(t.Discovered({Gpu("GPU-a"), Gpu("GPU-b")}).ok());
  bool changed = false;
  ASSERT_TRUE(t.Discovered({Gpu("GPU-b")}, &changed).ok());
  EXPECT_TRUE(changed);
  auto d = t.Devices();
  ASSERT_EQ(d.size(), 4u);
  EXPECT_FALSE(d[0].healthy);
  EXPECT_TRUE(d[2].healthy);
  EXPECT_TRUE(t.Present({"GPU-a", "GPU-b"}));
  EXPECT_FALSE(t.Present({"GPU-a", "GPU-b"}));
  EXPECT_TRUE(t.Devices()[0].healthy);
}

TEST(VgpuDeviceTable, RefusesAGpuWhoseDeviceIdsWouldBeTooLongForTheKubelet) {
  VgpuDeviceTable t(100);
  Status st = t.Discovered({Gpu("GPU-" + std::string(56, 'f'))});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("63 characters"), std::string::npos) << st.message();
  EXPECT_EQ(t.gpu_count(), 0u);
}

TEST(VgpuDeviceTable, BindRefusesUnknownRepeatedAndUnhealthyDevices) {
  VgpuDeviceTable t(2);
  ASSERT_TRUE(t.Discovered({Gpu("GPU-a"), Gpu("GPU-b")}).ok());
  for (const char* bad : {"GPU-a::2", "GPU-a::-1", "GPU-a::01", "GPU-a::", "GPU-c::0", "", "GPU-a::1 "}) {
    auto b = t.Bind({std::string(bad)}, kRegions);
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(t.Bind({"GPU-a::0", "GPU-a::0"}, kRegions).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Bind({}, kRegions).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(t.Discovered({Gpu("GPU-a")}).ok());
  EXPECT_EQ(t.Bind({"GPU-b::0"}, kRegions).status().code(), StatusCode::kFailedPrecondition);
  auto ok = t.Bind({"GPU-a::1"}, kRegions);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->envs.at("TFUSION_REGION"), "/dev/shm/tensorfusion/gpu-GPU-a.region");
  ASSERT_EQ(ok->mounts.size(), 1u);
  EXPECT_EQ(ok->mounts[0].host_path, "/host/shm");
}

TEST(VgpuDeviceTable, PreferFillsTheTightestGpuFirstAndSpillsOverToTheLargest) {
  VgpuDeviceTable t(4);
  ASSERT_TRUE(t.Discovered({Gpu("GPU-a"), Gpu("GPU-b"), Gpu("GPU-c")}).ok());
  // Free: a has 1, b has 4, c has 2.
  std::vector<std::string> free = {"GPU-a::3", "GPU-b::0", "GPU-b::1", "GPU-b::2", "GPU-b::3", "GPU-c::0", "GPU-c::2"};
  auto two = t.Prefer(free, {}, 2);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(*two, (std::vector<std::string>{"GPU-c::0", "GPU-c::2"}));
  auto five = t.Prefer(free, {}, 5);  // no GPU holds 5: the largest (b) first, then the tightest fit (a)
  ASSERT_TRUE(five.ok());
  EXPECT_EQ(*five, (std::vector<std::string>{"GPU-b::0", "GPU-b::1", "GPU-b::2", "GPU-b::3", "GPU-a::3"}));
  EXPECT_EQ(t.Prefer(free, {}, 8).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Prefer(free, {"GPU-a::3", "GPU-b::0"}, 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Prefer({"GPU-a::3", "GPU-a::3"}, {}, 1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tf::deviceplugin
