// The generated driver surface: the cuGetProcAddress routing table probed on driver 580 and the
// trace formatter. A lookup must name exactly the variant the real driver returns.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "driver/procaddress.h"
#include "driver/trace.h"
#include "tf_driver_api.h"

namespace tf::driver {
namespace {

std::string Lookup(const char* base, int version, unsigned long long flags) {
  ProcLookup r = LookupProcAddress(base, version, flags);
  return r.fn < 0 ? "-" : FunctionName(static_cast<Fn>(r.fn));
}

TEST(ProcAddressTableTest, VersionsPickTheVariantTheDriverReturns) {
  EXPECT_EQ(Lookup("cuMemAlloc", 3010, CU_GET_PROC_ADDRESS_DEFAULT), "cuMemAlloc");
  EXPECT_EQ(Lookup("cuMemAlloc", 3020, CU_GET_PROC_ADDRESS_DEFAULT), "cuMemAlloc_v2");
  EXPECT_EQ(Lookup("cuMemAlloc", 13000, CU_GET_PROC_ADDRESS_DEFAULT), "cuMemAlloc_v2");
  EXPECT_EQ(Lookup("cuCtxCreate", 11040, CU_GET_PROC_ADDRESS_DEFAULT), "cuCtxCreate_v3");
  EXPECT_EQ(Lookup("cuCtxCreate", 12050, CU_GET_PROC_ADDRESS_DEFAULT), "cuCtxCreate_v4");
  EXPECT_EQ(Lookup("cuStreamGetCaptureInfo", 12030, CU_GET_PROC_ADDRESS_DEFAULT), "cuStreamGetCaptureInfo_v3");
}

TEST(ProcAddressTableTest, PerThreadStreamCallersGetThePtszAndPtdsVariants) {
  EXPECT_EQ(Lookup("cuLaunchKernel", 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM), "cuLaunchKernel");
  EXPECT_EQ(Lookup("cuLaunchKernel", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM), "cuLaunchKernel_ptsz");
  EXPECT_EQ(Lookup("cuMemcpy", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM), "cuMemcpy_ptds");
  EXPECT_EQ(Lookup("cuGraphLaunch", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM), "cuGraphLaunch_ptsz");
  EXPECT_EQ(Lookup("cuStreamGetCaptureInfo", 12030, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
            "cuStreamGetCaptureInfo_v3_ptsz");
}

TEST(ProcAddressTableTest, UnknownOrTooOldIsNotFound) {
  EXPECT_EQ(Lookup("cuNoSuchFunction", 13000, 0), "-");
  EXPECT_FALSE(LookupProcAddress("cuNoSuchFunction", 13000, 0).known_base);
  EXPECT_EQ(Lookup("", 13000, 0), "-");
  EXPECT_EQ(Lookup(nullptr, 13000, 0), "-");
  ProcLookup old = LookupProcAddress("cuLaunchKernelEx", 11000, 0);
  EXPECT_EQ(old.fn, -1);
  EXPECT_TRUE(old.known_base);
  EXPECT_TRUE(old.needs_newer_version);
  EXPECT_EQ(ProbedMaxVersion(), 13000);
}

TEST(DriverSurfaceTest, EveryExportHasAnIdAndBack) {
  for (int i = 0; i < kFunctionCount; ++i) {
    const char* name = FunctionName(static_cast<Fn>(i));
    ASSERT_NE(name, nullptr);
    EXPECT_EQ(FunctionId(name), i) << name;
  }
  EXPECT_EQ(FunctionId("cuNoSuchFunction"), -1);
  EXPECT_GT(FunctionId("cuGLInit"), -1) << "graphics-interop exports are part of the surface";
}

TEST(TraceFormatterTest, RendersACallOnOneLine) {
  TraceBuffer tb;
  tb.Begin("cuMemAlloc_v2");
  tb.Arg("dptr", reinterpret_cast<CUdeviceptr*>(0x1000));
  tb.Arg("bytesize", static_cast<size_t>(1048576));
  tb.Arg("flags", -3);
  tb.Arg("kind", CU_MEMORYTYPE_DEVICE);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  SetTraceFd(fds[1]);
  tb.End();
  SetTraceFd(2);
  char buf[256] = {};
  ASSERT_GT(read(fds[0], buf, sizeof(buf) - 1), 0);
  EXPECT_STREQ(buf, "tfusion-trace: cuMemAlloc_v2(dptr=0x1000, bytesize=1048576, flags=-3, kind=2)\n");
  close(fds[0]);
  close(fds[1]);
}

}  // namespace
}  // namespace tf::driver
