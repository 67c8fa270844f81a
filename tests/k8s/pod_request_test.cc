// The tensor-fusion.ai/* pod annotations: what they ask for, and the exact message a bad one gets.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "controller/kube_api.h"
#include "k8s/pod_request.h"

namespace tf::k8s {
namespace {

Annotations Base() {
  return {{"tensor-fusion.ai/tflops-request", "10"}, {"tensor-fusion.ai/vram-request", "8Gi"}};
}

TEST(QuantityTest, KubernetesQuantitiesAsBytes) {
  EXPECT_EQ(*ParseQuantityBytes("8Gi"), 8ull << 30);
  EXPECT_EQ(*ParseQuantityBytes("512Mi"), 512ull << 20);
  EXPECT_EQ(*ParseQuantityBytes("1.5Gi"), 3ull << 29);
  EXPECT_EQ(*ParseQuantityBytes("8G"), 8000000000ull);
  EXPECT_EQ(*ParseQuantityBytes("500M"), 500000000ull);
  EXPECT_EQ(*ParseQuantityBytes("1k"), 1000ull);
  EXPECT_EQ(*ParseQuantityBytes("1073741824"), 1ull << 30);
  EXPECT_EQ(*ParseQuantityBytes("8e9"), 8000000000ull);
  for (const char* bad : {"", "lots", "8 Gi", "8GB", "8gi", "-1Gi", "0", "Gi", "1.2.3Mi", "8Gii", "1e99"}) {
    EXPECT_FALSE(ParseQuantityBytes(bad).ok()) << bad;
  }
}

// The reconciler's spec fields and the webhook's annotations go through the same parser.
TEST(QuantityTest, TheOneParserReadsEverySuffixAndRefusesTheRest) {
  EXPECT_DOUBLE_EQ(*controller::ParseKubeQuantity("12.5"), 12.5);
  EXPECT_DOUBLE_EQ(*controller::ParseKubeQuantity("500m"), 0.5);
  EXPECT_DOUBLE_EQ(*controller::ParseKubeQuantity("0"), 0);
  EXPECT_DOUBLE_EQ(*controller::ParseKubeQuantity("1e3"), 1000);
  EXPECT_DOUBLE_EQ(*controller::ParseKubeQuantity("2E-2"), 0.02);
  EXPECT_DOUBLE_EQ(*controller::ParseKubeQuantity("8Gi"), 8.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(*controller::ParseKubeQuantity("3k"), 3000);
  for (const char* bad : {"", "-1", "8GB", "8K", "1.2.3", "e3", "1e400", "8 Gi"}) {
    StatusOr<double> v = controller::ParseKubeQuantity(bad);
    EXPECT_FALSE(v.ok()) << bad;
  }
  EXPECT_FALSE(controller::ParseKubeQuantity(std::string(65, '1')).ok()) << "longer than 64 characters";
  // As bytes: a fraction of a byte rounds up, nothing rounds to 0.
  EXPECT_EQ(*ParseQuantityBytes("500m"), 1u);
  EXPECT_EQ(*ParseQuantityBytes("0.1Ki"), 103u);
}

TEST(PodRequestTest, ReadsTheAnnotationsAndDefaults) {
  Annotations a = Base();
  a["tensor-fusion.ai/tflops-limit"] = "40";
  a["tensor-fusion.ai/gpupool"] = "train";
  a["tensor-fusion.ai/gpu-model"] = "H100";
  a["tensor-fusion.ai/is-local-gpu"] = "false";
  a["app.kubernetes.io/name"] = "x";  // other domains are not ours
  StatusOr<PodGpuRequest> r = ParsePodAnnotations(a);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->tflops, 10);
  EXPECT_EQ(r->tflops_limit, 40);
  EXPECT_EQ(r->vram_mib, 8192);
  EXPECT_EQ(r->pool, "train");
  EXPECT_EQ(r->gpu_model, "H100");
  EXPECT_FALSE(r->local);
  EXPECT_EQ(r->qos, "medium");
  EXPECT_EQ(r->gpu_count, 1);
}

TEST(PodRequestTest, LimitsEqualToRequestsMakeHighQosAsInTensorFusion) {
  Annotations a = Base();
  a["tensor-fusion.ai/tflops-limit"] = "10";
  a["tensor-fusion.ai/vram-limit"] = "8Gi";
  EXPECT_EQ(ParsePodAnnotations(a)->qos, "high");
  a["tensor-fusion.ai/qos"] = "low";
  EXPECT_EQ(ParsePodAnnotations(a)->qos, "low");
}

TEST(PodRequestTest, AWorkloadProfileFillsWhatThePodLeavesOut) {
  WorkloadDefaults p;
  p.tflops = 30;
  p.vram_mib = 4096;
  p.qos = "critical";
  p.pool = "serve";
  Annotations a = {{"tensor-fusion.ai/workload-profile", "llm"}, {"tensor-fusion.ai/vram-request", "16Gi"}};
  StatusOr<PodGpuRequest> r = ParsePodAnnotations(a, &p);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->tflops, 30);
  EXPECT_EQ(r->vram_mib, 16384);
  EXPECT_EQ(r->qos, "critical");
  EXPECT_EQ(r->pool, "serve");
  EXPECT_EQ(r->workload_profile, "llm");
}

TEST(PodRequestTest, BadAnnotationsAreRefusedNamingTheAnnotationAndTheForm) {
  const std::vector<std::pair<std::pair<std::string, std::string>, std::string>> cases = {
      {{"vram-request", "lots"}, "tensor-fusion.ai/vram-request: \"lots\" is not a quantity (expected e.g. 8Gi)"},
      {{"tflops-request", "ten"}, "tensor-fusion.ai/tflops-request: \"ten\" is not a number of TFLOPS (expected e.g. 10)"},
      // Below what the controller counts: admitted, it would be refused by every node.
      {{"tflops-request", "0.0000001"},
       "tensor-fusion.ai/tflops-request: \"0.0000001\" is out of range (expected at least 0.001 TFLOPS, e.g. 10)"},
      {{"tflops-limit", "5"},
       "tensor-fusion.ai/tflops-limit: \"5\" is below the request of 10 TFLOPS (the limit is the ceiling: give at "
       "least the request)"},
      {{"vram-limit", "4Gi"},
       "tensor-fusion.ai/vram-limit: \"4Gi\" is below the request of 8192 MiB (the limit is the ceiling: give at "
       "least the request)"},
      {{"qos", "urgent"}, "tensor-fusion.ai/qos: \"urgent\" is not a QoS level (expected low, medium, high or critical)"},
      {{"gpu-count", "0"}, "tensor-fusion.ai/gpu-count: \"0\" is out of range (expected a whole number from 1 to 64)"},
      {{"gpu-count", "65"}, "tensor-fusion.ai/gpu-count: \"65\" is out of range (expected a whole number from 1 to 64)"},
      {{"gpu-count", "2"},
       "tensor-fusion.ai/gpu-count: \"2\" asks for more than one GPU per pod, which is not supported yet (expected 1)"},
      {{"is-local-gpu", "yes"}, "tensor-fusion.ai/is-local-gpu: \"yes\" is not a boolean (expected true or false)"},
      {{"gpupool", "my pool"},
       "tensor-fusion.ai/gpupool: \"my pool\" is not a pool name (expected 1-128 characters of A-Z a-z 0-9 . _ : -)"},
      {{"isolation", "hard"},
       "tensor-fusion.ai/isolation: \"hard\" is not supported here (expected soft: the limiter in the pod's processes)"},
      {{"compute-percent-request", "25"},
       "give tensor-fusion.ai/tflops-request or tensor-fusion.ai/compute-percent-request, not both"},
      {{"gpu-ids", "GPU-1"}, "tensor-fusion.ai/gpu-ids is written by TensorFusion, not by the pod: remove it"},
  };
  for (const auto& [kv, message] : cases) {
    Annotations a = Base();
    a["tensor-fusion.ai/" + kv.first] = kv.second;
    StatusOr<PodGpuRequest> r = ParsePodAnnotations(a);
    ASSERT_FALSE(r.ok()) << kv.first;
    EXPECT_EQ(r.status().message(), message);
  }
  Annotations percent = {{"tensor-fusion.ai/compute-percent-request", "150"}, {"tensor-fusion.ai/vram-request", "1Gi"}};
  EXPECT_EQ(ParsePodAnnotations(percent).status().message(),
            "tensor-fusion.ai/compute-percent-request: \"150\" is not a percent of one GPU (expected a number above 0 "
            "and at most 100, e.g. 25)");
  EXPECT_EQ(ParsePodAnnotations({{"tensor-fusion.ai/vram-request", "1Gi"}}).status().message(),
            "give tensor-fusion.ai/tflops-request (e.g. \"10\") or tensor-fusion.ai/compute-percent-request (e.g. \"25\")");
  EXPECT_EQ(ParsePodAnnotations({{"tensor-fusion.ai/tflops-request", "1"}}).status().message(),
            "give tensor-fusion.ai/vram-request (e.g. 8Gi)");
  Annotations unknown = Base();
  unknown["tensor-fusion.ai/gpu-indices"] = "0,1";
  EXPECT_NE(ParsePodAnnotations(unknown).status().message().find(
                "tensor-fusion.ai/gpu-indices is not supported here (supported under tensor-fusion.ai/: "),
            std::string::npos);
}

TEST(PodRequestTest, TheRecordedFormRoundTripsAndIsValidated) {
  Annotations a = Base();
  a["tensor-fusion.ai/tflops-limit"] = "20";
  PodGpuRequest r = *ParsePodAnnotations(a);
  StatusOr<PodGpuRequest> back = PodRequestFromJson(PodRequestToJson(r));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->tflops, 10);
  EXPECT_EQ(back->tflops_limit, 20);
  EXPECT_EQ(back->vram_mib, 8192);
  EXPECT_TRUE(back->local);
  for (const char* bad : {"[]", "{", R"({"tflops":10})", R"({"tflops":"10","vram_mib":1})",
                          R"({"tflops":10,"vram_mib":1,"gpu_count":4294967297})", R"({"tflops":10,"vram_mib":1,"x":1})",
                          R"({"tflops":10,"tflops_limit":5,"vram_mib":1})"}) {
    EXPECT_FALSE(PodRequestFromJson(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace tf::k8s
