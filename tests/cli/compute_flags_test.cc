// The compute flags of `tfusion run` (src/cli/compute_flags.h): request and limit in TFLOPS or
// percent, QoS, and every refusal with its message.
#include "cli/compute_flags.h"

#include <gtest/gtest.h>

namespace tf::cli {
namespace {

const GpuForShares kH100{0, "NVIDIA H100 80GB HBM3", 989.4};

ComputeShares Shares(const ComputeFlags& f, const GpuForShares& gpu = kH100) {
  StatusOr<ComputeShares> s = ResolveComputeShares(f, gpu);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : ComputeShares{};
}

TEST(ComputeFlags, ASingleValueMeansRequestEqualsLimit) {
  ComputeShares none = Shares({});
  EXPECT_EQ(none.request_ppm, 1'000'000u);
  EXPECT_EQ(none.limit_ppm, 1'000'000u);
  ComputeShares p = Shares({"", "30", "", ""});
  EXPECT_EQ(p.request_ppm, 300'000u);
  EXPECT_EQ(p.limit_ppm, 300'000u);
  ComputeShares t = Shares({"98.94", "", "", ""});
  EXPECT_EQ(t.request_ppm, 100'000u);
  EXPECT_EQ(t.limit_ppm, 100'000u);
}

TEST(ComputeFlags, RequestAndLimitInEitherUnit) {
  ComputeShares p = Shares({"", "25", "", "100"});
  EXPECT_EQ(p.request_ppm, 250'000u);
  EXPECT_EQ(p.limit_ppm, 1'000'000u);
  ComputeShares t = Shares({"98.94", "", "494.7", ""});
  EXPECT_EQ(t.request_ppm, 100'000u);
  EXPECT_EQ(t.limit_ppm, 500'000u);
  // Mixed units are converted through the GPU's capacity.
  ComputeShares mixed = Shares({"98.94", "", "", "50"});
  EXPECT_EQ(mixed.request_ppm, 100'000u);
  EXPECT_EQ(mixed.limit_ppm, 500'000u);
  ComputeShares mixed2 = Shares({"", "10", "989.4", ""});
  EXPECT_EQ(mixed2.limit_ppm, 1'000'000u);
}

TEST(ComputeFlags, BadCombinationsAreRefusedWithTheirMessage) {
  struct Case {
    ComputeFlags flags;
    const char* says;
  } cases[] = {
      {{"", "30", "", "20"},
       "--percent-limit 20 is below the request --percent 30: the limit is the ceiling and must be at least "
       "the request"},
      {{"100", "", "50", ""}, "--tflops-limit 50 is below the request --tflops 100"},
      {{"100", "", "", "5"}, "--percent-limit 5 is below the request --tflops 100 (10.1% of GPU 0"},
      {{"", "30", "100", ""}, "--tflops-limit 100 is below the request --percent 30 (296.8 TFLOPS of GPU 0"},
      {{"", "30", "", "150"}, "--percent-limit 150: must be at most 100"},
      {{"", "30", "2000", ""}, "--tflops-limit 2000: GPU 0 (NVIDIA H100 80GB HBM3) has 989.4 TFLOPS"},
      {{"", "", "", "50"}, "--percent-limit 50 needs a request: give --percent or --tflops too"},
      {{"", "", "100", ""}, "--tflops-limit 100 needs a request"},
      {{"", "30", "100", "50"}, "give either --tflops-limit or --percent-limit, not both"},
      {{"100", "20", "", ""}, "give either --tflops or --percent, not both"},
      {{"", "30", "", "0"}, "--percent-limit 0: must be greater than zero"},
      {{"", "30", "", "x"}, "--percent-limit x: not a number"},
      {{"", "0x32", "", ""}, "--percent 0x32: not a number"},  // strtod alone took it for 50
      {{"", "inf", "", ""}, "--percent inf: not a number"},
      {{"", "1e400", "", ""}, "--percent 1e400: too large"},
  };
  for (const Case& c : cases) {
    StatusOr<ComputeShares> s = ResolveComputeShares(c.flags, kH100);
    ASSERT_FALSE(s.ok()) << c.says;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(c.says), std::string::npos) << s.status().message();
  }
  // TFLOPS on a GPU the catalog lacks.
  StatusOr<ComputeShares> unknown = ResolveComputeShares({"", "10", "50", ""}, {1, "Mystery GPU", 0});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("not in the catalog"), std::string::npos);
  EXPECT_TRUE(ResolveComputeShares({"", "10", "", "50"}, {1, "Mystery GPU", 0}).ok());
}

TEST(ComputeFlags, ThePoolGetsTheLimitInTheRequestsUnit) {
  StatusOr<PoolCompute> t = PoolComputeFromFlags({"25", "", "100", ""});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->tflops, 25);
  EXPECT_EQ(t->tflops_limit, 100);
  StatusOr<PoolCompute> p = PoolComputeFromFlags({"", "", "", ""});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->percent, 100);
  EXPECT_EQ(p->percent_limit, 0);
  StatusOr<PoolCompute> mixed = PoolComputeFromFlags({"25", "", "", "50"});
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("give the limit in the request's unit"), std::string::npos);
  StatusOr<PoolCompute> below = PoolComputeFromFlags({"", "40", "", "30"});
  ASSERT_FALSE(below.ok());
  EXPECT_NE(below.status().message().find("is below the request --percent 40"), std::string::npos);
  // A remote worker takes a request and a limit (in either unit: it converts with its own GPU).
  EXPECT_TRUE(CheckRemoteComputeFlags({"", "40", "", "60"}, "high").ok());
  EXPECT_TRUE(CheckRemoteComputeFlags({"100", "", "", "60"}, "").ok());
  EXPECT_NE(CheckRemoteComputeFlags({"", "40", "", "30"}, "").message().find("is below the request --percent 40"),
            std::string::npos);
  EXPECT_NE(CheckRemoteComputeFlags({"", "40", "", ""}, "urgent").message().find("--qos: qos must be one of"),
            std::string::npos);
}

TEST(ComputeFlags, QosNamesAreTheApisOnes) {
  EXPECT_EQ(*ParseQosFlag(""), 1u);
  EXPECT_EQ(*ParseQosFlag("low"), 0u);
  EXPECT_EQ(*ParseQosFlag("medium"), 1u);
  EXPECT_EQ(*ParseQosFlag("high"), 2u);
  EXPECT_EQ(*ParseQosFlag("critical"), 3u);
  StatusOr<uint32_t> bad = ParseQosFlag("urgent");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--qos: qos must be one of low, medium, high, critical"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace tf::cli
