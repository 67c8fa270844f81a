#include "common/gpu_catalog.h"

#include <gtest/gtest.h>

namespace tf {
namespace {

double Tflops(const GpuCatalog& c, const char* name) {
  auto s = c.Lookup(name);
  EXPECT_TRUE(s.ok()) << name << ": " << s.status().ToString();
  return s.ok() ? s->fp16_tflops : -1;
}

TEST(GpuCatalogTest, ResolvesNvmlDeviceNames) {
  GpuCatalog c;
  EXPECT_DOUBLE_EQ(Tflops(c, "NVIDIA H100 80GB HBM3"), 989.4);
  EXPECT_DOUBLE_EQ(Tflops(c, "NVIDIA H100 PCIe"), 756.0);
  EXPECT_DOUBLE_EQ(Tflops(c, "NVIDIA H200"), 989.4);
  EXPECT_DOUBLE_EQ(Tflops(c, "NVIDIA B200"), 2250.0);
  EXPECT_DOUBLE_EQ(Tflops(c, "Tesla T4"), 65.0);
  EXPECT_DOUBLE_EQ(Tflops(c, "NVIDIA A10"), 125.0);
  EXPECT_DOUBLE_EQ(Tflops(c, "NVIDIA L4"), 121.0);
  EXPECT_DOUBLE_EQ(Tflops(c, "NVIDIA L40S"), 362.0);
  EXPECT_DOUBLE_EQ(Tflops(c, "NVIDIA GeForce RTX 4090"), 165.2);
  EXPECT_DOUBLE_EQ(Tflops(c, "NVIDIA GeForce RTX 5090"), 209.5);
  EXPECT_EQ(c.Lookup("Tesla V100-SXM2-32GB")->vram_mib, 32768);
  EXPECT_EQ(c.Lookup("Tesla V100-SXM2-16GB")->vram_mib, 16384);
  EXPECT_EQ(c.Lookup("NVIDIA A100-SXM4-80GB")->vram_mib, 81920);
  EXPECT_EQ(c.Lookup("NVIDIA A100-PCIE-40GB")->vram_mib, 40960);
  EXPECT_EQ(c.Lookup("NVIDIA H200")->vram_mib, 141 * 1024);
  EXPECT_EQ(c.Lookup("nvidia h100 80gb hbm3")->sm_count, 132);
}

TEST(GpuCatalogTest, SimilarNamesDoNotCollide) {
  GpuCatalog c;
  EXPECT_EQ(c.Lookup("NVIDIA A10")->name, "A10");        // not A100
  EXPECT_EQ(c.Lookup("NVIDIA A100 80GB PCIe")->name, "A100-80GB");
  EXPECT_EQ(c.Lookup("NVIDIA L40S")->name, "L40S");       // not L4
  EXPECT_EQ(c.Lookup("H100-SXM")->name, "H100-SXM");
  EXPECT_EQ(c.Lookup("V100M32")->name, "V100-SXM2-32GB");  // openb trace model codes
}

TEST(GpuCatalogTest, UnknownNameIsNotFound) {
  GpuCatalog c;
  auto s = c.Lookup("Matrox G200");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
  EXPECT_NE(s.status().message().find("Matrox G200"), std::string::npos);
  EXPECT_FALSE(c.Lookup("").ok());
}

TEST(GpuCatalogTest, OverridesWinAndKeepBuiltinVram) {
  GpuCatalog c;
  ASSERT_TRUE(c.LoadOverrides("# lab tuning\n4090 82.6\n\nG2 100 32768  # internal code\n").ok());
  auto r = c.Lookup("NVIDIA GeForce RTX 4090");
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->fp16_tflops, 82.6);
  EXPECT_EQ(r->vram_mib, 24576);
  auto g2 = c.Lookup("g2");
  ASSERT_TRUE(g2.ok());
  EXPECT_EQ(g2->vram_mib, 32768);
  // A later override for the same substring replaces the earlier one.
  ASSERT_TRUE(c.LoadOverrides("4090 100").ok());
  EXPECT_DOUBLE_EQ(c.Lookup("RTX 4090")->fp16_tflops, 100.0);
}

TEST(GpuCatalogTest, BadOverridesAreRejectedWholesale) {
  GpuCatalog c;
  for (const char* bad : {"H100", "H100 abc", "H100 -5", "H100 0", "H100 100 12x", "H100 100 -1",
                          "H100 100 1 2", "H100 nan", "H100 inf"}) {
    Status s = c.LoadOverrides(std::string("T4 1\n") + bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("line 2"), std::string::npos) << s.message();
  }
  EXPECT_DOUBLE_EQ(c.Lookup("Tesla T4")->fp16_tflops, 65.0);  // nothing applied
}

TEST(GpuCatalogTest, ShareFromTflopsValidates) {
  EXPECT_DOUBLE_EQ(*ShareFromTflops(156, 312), 0.5);
  EXPECT_DOUBLE_EQ(*ShareFromTflops(312, 312), 1.0);
  EXPECT_FALSE(ShareFromTflops(0, 312).ok());
  EXPECT_FALSE(ShareFromTflops(-1, 312).ok());
  EXPECT_FALSE(ShareFromTflops(313, 312).ok());
  EXPECT_FALSE(ShareFromTflops(1, 0).ok());
}

}  // namespace
}  // namespace tf
