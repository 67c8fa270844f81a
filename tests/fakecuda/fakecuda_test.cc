// Behaviour of the fake driver (libcuda.so.1) and fake NVML (libnvidia-ml.so.1), loaded with
// dlopen by path the way programs find the real driver.
#include <cuda.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "fakecuda_api.h"
#include "nvml_types.h"

namespace {

constexpr int kDevices = 2;
constexpr size_t kTotalMiB = 1024;
constexpr size_t kMiB = 1u << 20;

#define FAKE_API(X)                                                                            \
  X(cuInit) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetUuid_v2)       \
  X(cuDeviceGetAttribute) X(cuDeviceTotalMem_v2) X(cuDevicePrimaryCtxRetain)                  \
  X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxSynchronize) X(cuMemAlloc_v2) X(cuMemFree_v2)  \
  X(cuMemGetInfo_v2) X(cuMemAllocPitch_v2) X(cuMemcpyHtoD_v2) X(cuMemcpyDtoH_v2)               \
  X(cuMemsetD32_v2) X(cuStreamCreate) X(cuStreamDestroy_v2) X(cuStreamQuery)                  \
  X(cuStreamSynchronize) X(cuEventCreate) X(cuEventRecord) X(cuEventSynchronize)              \
  X(cuEventElapsedTime_v2) X(cuEventDestroy_v2) X(cuModuleLoadData) X(cuModuleGetFunction)    \
  X(cuLaunchKernel) X(cuLaunchKernelEx) X(cuGraphCreate) X(cuGraphAddMemAllocNode)            \
  X(cuGraphAddKernelNode_v2) X(cuGraphAddMemFreeNode) X(cuGraphInstantiateWithFlags)          \
  X(cuGraphLaunch) X(cuGraphExecDestroy) X(cuGraphDestroy) X(cuGetProcAddress_v2)             \
  X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) X(cuMemMap)       \
  X(cuMemUnmap) X(cuMemSetAccess) X(cuArrayCreate_v2) X(cuArrayDestroy)                        \
  X(cuPointerGetAttribute) X(cuMemAllocHost_v2) X(cuMemFreeHost) X(cuMemAllocAsync)            \
  X(cuMemFreeAsync) X(cuLibraryLoadData) X(cuLibraryGetKernel) X(cuKernelGetFunction)         \
  X(cuGetErrorName) X(cuMemsetD8Async) X(cuMemRetainAllocationHandle)                          \
  X(cuMemGetAllocationPropertiesFromHandle) X(cuMemExportToShareableHandle)                    \
  X(cuMemImportFromShareableHandle) X(cuDeviceGraphMemTrim) X(cuDeviceGetGraphMemAttribute)    \
  X(cuIpcGetMemHandle)

struct FakeCuda {
#define DECLARE(name) decltype(&::name) name = nullptr;
  FAKE_API(DECLARE)
#undef DECLARE
  fakecuda_register_kernel_ex_t register_kernel_ex = nullptr;
  fakecuda_register_kernel_t register_kernel = nullptr;
  fakecuda_fail_nth_t fail_nth = nullptr;
  void* handle = nullptr;
};

struct FakeNvml {
  nvmlReturn_t (*nvmlInit_v2)() = nullptr;
  nvmlReturn_t (*nvmlShutdown)() = nullptr;
  nvmlReturn_t (*nvmlDeviceGetCount_v2)(unsigned*) = nullptr;
  nvmlReturn_t (*nvmlDeviceGetHandleByIndex_v2)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*nvmlDeviceGetUUID)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*nvmlDeviceGetName)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*nvmlDeviceGetMemoryInfo)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*nvmlDeviceGetMemoryInfo_v2)(nvmlDevice_t, nvmlMemory_v2_t*) = nullptr;
  nvmlReturn_t (*nvmlDeviceGetMultiProcessorCount)(nvmlDevice_t, unsigned*) = nullptr;
};

template <typename T>
void Resolve(void* handle, const char* name, T* out) {
  *out = reinterpret_cast<T>(dlsym(handle, name));
  ASSERT_NE(*out, nullptr) << name;
}

const FakeCuda& Cuda() {
  static FakeCuda* api = [] {
    auto* a = new FakeCuda;
    a->handle = dlopen(FAKECUDA_LIBRARY_PATH, RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(a->handle, nullptr) << dlerror();
#define RESOLVE(name) Resolve(a->handle, #name, &a->name);
    FAKE_API(RESOLVE)
#undef RESOLVE
    Resolve(a->handle, "fakecuda_register_kernel_ex", &a->register_kernel_ex);
    Resolve(a->handle, "fakecuda_register_kernel", &a->register_kernel);
    Resolve(a->handle, "fakecuda_fail_nth", &a->fail_nth);
    return a;
  }();
  return *api;
}

const FakeNvml& Nvml() {
  static FakeNvml* api = [] {
    auto* n = new FakeNvml;
    void* h = dlopen(FAKENVML_LIBRARY_PATH, RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(h, nullptr) << dlerror();
    Resolve(h, "nvmlInit_v2", &n->nvmlInit_v2);
    Resolve(h, "nvmlShutdown", &n->nvmlShutdown);
    Resolve(h, "nvmlDeviceGetCount_v2", &n->nvmlDeviceGetCount_v2);
    Resolve(h, "nvmlDeviceGetHandleByIndex_v2", &n->nvmlDeviceGetHandleByIndex_v2);
    Resolve(h, "nvmlDeviceGetUUID", &n->nvmlDeviceGetUUID);
    Resolve(h, "nvmlDeviceGetName", &n->nvmlDeviceGetName);
    Resolve(h, "nvmlDeviceGetMemoryInfo", &n->nvmlDeviceGetMemoryInfo);
    Resolve(h, "nvmlDeviceGetMemoryInfo_v2", &n->nvmlDeviceGetMemoryInfo_v2);
    Resolve(h, "nvmlDeviceGetMultiProcessorCount", &n->nvmlDeviceGetMultiProcessorCount);
    return n;
  }();
  return *api;
}

bool g_initialized = false;

// Every test starts with the driver initialized and device 0's primary context current.
class FakeCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_initialized = true;
    ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
    ASSERT_EQ(cu().cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  }
  void TearDown() override { EXPECT_EQ(cu().cuCtxSynchronize(), CUDA_SUCCESS); }

  static const FakeCuda& cu() { return Cuda(); }
  size_t FreeBytes() {
    size_t free_bytes = 0, total = 0;
    EXPECT_EQ(cu().cuMemGetInfo_v2(&free_bytes, &total), CUDA_SUCCESS);
    return free_bytes;
  }
  CUfunction Builtin(const char* name) {
    CUmodule module = nullptr;
    EXPECT_EQ(cu().cuModuleLoadData(&module, "fakecuda:builtin"), CUDA_SUCCESS);
    CUfunction f = nullptr;
    EXPECT_EQ(cu().cuModuleGetFunction(&f, module, name), CUDA_SUCCESS);
    return f;
  }
  void LaunchSleep(CUstream stream, unsigned microseconds) {
    void* params[] = {&microseconds};
    ASSERT_EQ(cu().cuLaunchKernel(Builtin("sleep_us"), 1, 1, 1, 1, 1, 1, 0, stream, params,
                                  nullptr),
              CUDA_SUCCESS);
  }

  CUcontext ctx_ = nullptr;
};

// Must run first in the process (gtest keeps file order): nothing has called cuInit yet.
TEST(FakeCudaBeforeInit, CallsFailWithNotInitialized) {
  if (g_initialized) GTEST_SKIP() << "cuInit already ran in this process";
  int count = 0;
  EXPECT_EQ(Cuda().cuDeviceGetCount(&count), CUDA_ERROR_NOT_INITIALIZED);
  CUdeviceptr p = 0;
  EXPECT_EQ(Cuda().cuMemAlloc_v2(&p, 1), CUDA_ERROR_NOT_INITIALIZED);
}

TEST_F(FakeCudaTest, DevicesLookLikeConfiguredH100s) {
  int count = 0;
  ASSERT_EQ(cu().cuDeviceGetCount(&count), CUDA_SUCCESS);
  EXPECT_EQ(count, kDevices);
  char name[64];
  ASSERT_EQ(cu().cuDeviceGetName(name, sizeof(name), 0), CUDA_SUCCESS);
  EXPECT_STREQ(name, "Fake GPU H100");
  int value = 0;
  cu().cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0);
  EXPECT_EQ(value, 132);
  cu().cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0);
  EXPECT_EQ(value, 9);
  cu().cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0);
  EXPECT_EQ(value, 32);
  size_t total = 0;
  ASSERT_EQ(cu().cuDeviceTotalMem_v2(&total, 0), CUDA_SUCCESS);
  EXPECT_EQ(total, kTotalMiB * kMiB);
  CUuuid a, b, a_again;
  cu().cuDeviceGetUuid_v2(&a, 0);
  cu().cuDeviceGetUuid_v2(&b, 1);
  cu().cuDeviceGetUuid_v2(&a_again, 0);
  EXPECT_NE(std::string(a.bytes, 16), std::string(b.bytes, 16));
  EXPECT_EQ(std::string(a.bytes, 16), std::string(a_again.bytes, 16));
  EXPECT_EQ(cu().cuDeviceGetName(name, sizeof(name), kDevices), CUDA_ERROR_INVALID_DEVICE);
}

TEST_F(FakeCudaTest, CallsNeedingAContextFailWithoutOne) {
  CUresult alloc_result = CUDA_SUCCESS;
  std::thread([&] {
    CUdeviceptr p = 0;
    alloc_result = cu().cuMemAlloc_v2(&p, 1024);
  }).join();
  EXPECT_EQ(alloc_result, CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(FakeCudaTest, AllocatingPastTotalFailsUntilSomethingIsFreed) {
  std::vector<CUdeviceptr> blocks;
  CUdeviceptr p = 0;
  CUresult r;
  while ((r = cu().cuMemAlloc_v2(&p, 64 * kMiB)) == CUDA_SUCCESS) blocks.push_back(p);
  EXPECT_EQ(r, CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(blocks.size(), kTotalMiB / 64);
  ASSERT_EQ(cu().cuMemFree_v2(blocks.back()), CUDA_SUCCESS);
  blocks.pop_back();
  ASSERT_EQ(cu().cuMemAlloc_v2(&p, 64 * kMiB), CUDA_SUCCESS);
  blocks.push_back(p);
  for (CUdeviceptr b : blocks) EXPECT_EQ(cu().cuMemFree_v2(b), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, MemGetInfoReflectsAllocationsAtTwoMiBGranularity) {
  size_t before = FreeBytes();
  CUdeviceptr small = 0, big = 0;
  ASSERT_EQ(cu().cuMemAlloc_v2(&small, 100), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemAlloc_v2(&big, 10 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(before - FreeBytes(), 2 * kMiB + 10 * kMiB);
  size_t pitch = 0;
  CUdeviceptr pitched = 0;
  ASSERT_EQ(cu().cuMemAllocPitch_v2(&pitched, &pitch, 1000, 3, 4), CUDA_SUCCESS);
  EXPECT_EQ(pitch, 1024u);
  EXPECT_EQ(cu().cuMemFree_v2(small), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemFree_v2(big), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemFree_v2(pitched), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), before);
  EXPECT_EQ(cu().cuMemFree_v2(big), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(FakeCudaTest, CopiesRoundTripThroughDeviceMemory) {
  CUdeviceptr d = 0;
  ASSERT_EQ(cu().cuMemAlloc_v2(&d, 16 * sizeof(unsigned)), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemsetD32_v2(d, 7, 16), CUDA_SUCCESS);
  std::vector<unsigned> host(16, 0);
  ASSERT_EQ(cu().cuMemcpyDtoH_v2(host.data(), d, 16 * sizeof(unsigned)), CUDA_SUCCESS);
  EXPECT_EQ(host, std::vector<unsigned>(16, 7));
  unsigned memory_type = 0;
  ASSERT_EQ(cu().cuPointerGetAttribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 8),
            CUDA_SUCCESS);
  EXPECT_EQ(memory_type, static_cast<unsigned>(CU_MEMORYTYPE_DEVICE));
  EXPECT_EQ(cu().cuMemFree_v2(d), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, SleepingKernelKeepsStreamBusyUntilSynchronized) {
  CUstream stream = nullptr;
  ASSERT_EQ(cu().cuStreamCreate(&stream, 0), CUDA_SUCCESS);
  LaunchSleep(stream, 200000);
  EXPECT_EQ(cu().cuStreamQuery(stream), CUDA_ERROR_NOT_READY);
  EXPECT_EQ(cu().cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuStreamQuery(stream), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuStreamDestroy_v2(stream), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, EventElapsedTimeMeasuresTheWorkBetweenRecords) {
  CUstream stream = nullptr;
  CUevent start = nullptr, end = nullptr;
  ASSERT_EQ(cu().cuStreamCreate(&stream, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuEventCreate(&start, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuEventCreate(&end, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuEventRecord(start, stream), CUDA_SUCCESS);
  LaunchSleep(stream, 50000);
  ASSERT_EQ(cu().cuEventRecord(end, stream), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuEventSynchronize(end), CUDA_SUCCESS);
  float ms = 0;
  ASSERT_EQ(cu().cuEventElapsedTime_v2(&ms, start, end), CUDA_SUCCESS);
  EXPECT_GE(ms, 45.0f);
  EXPECT_LT(ms, 2000.0f);
  cu().cuEventDestroy_v2(start);
  cu().cuEventDestroy_v2(end);
  cu().cuStreamDestroy_v2(stream);
}

// A registered kernel: out[i] = in[i] * factor, one "thread" per element of grid_x * block_x.
void Scale(void** params, unsigned grid_x, unsigned, unsigned, unsigned block_x, unsigned,
           unsigned, void* user) {
  auto* out = reinterpret_cast<float*>(*static_cast<CUdeviceptr*>(params[0]));
  auto* in = reinterpret_cast<const float*>(*static_cast<CUdeviceptr*>(params[1]));
  float factor = *static_cast<float*>(params[2]);
  for (unsigned i = 0; i < grid_x * block_x; ++i) out[i] = in[i] * factor;
  ++*static_cast<int*>(user);
}

TEST_F(FakeCudaTest, RegisteredKernelComputesIntoDeviceMemory) {
  static int calls = 0;
  const size_t sizes[] = {sizeof(CUdeviceptr), sizeof(CUdeviceptr), sizeof(float)};
  ASSERT_EQ(cu().register_kernel_ex("test_math", "scale", Scale, &calls, 3, sizes), 0);
  CUmodule module = nullptr;
  ASSERT_EQ(cu().cuModuleLoadData(&module, "fakecuda:test_math"), CUDA_SUCCESS);
  CUfunction scale = nullptr;
  ASSERT_EQ(cu().cuModuleGetFunction(&scale, module, "scale"), CUDA_SUCCESS);
  CUfunction missing = nullptr;
  EXPECT_EQ(cu().cuModuleGetFunction(&missing, module, "nope"), CUDA_ERROR_NOT_FOUND);

  std::vector<float> host(256);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i);
  CUdeviceptr in = 0, out = 0;
  ASSERT_EQ(cu().cuMemAlloc_v2(&in, 256 * sizeof(float)), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemAlloc_v2(&out, 256 * sizeof(float)), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemcpyHtoD_v2(in, host.data(), 256 * sizeof(float)), CUDA_SUCCESS);
  {
    float factor = 2.0f;
    void* params[] = {&out, &in, &factor};
    ASSERT_EQ(cu().cuLaunchKernel(scale, 2, 1, 1, 128, 1, 1, 0, nullptr, params, nullptr),
              CUDA_SUCCESS);
    factor = 100.0f;  // arguments were copied at launch
  }
  std::vector<float> result(256);
  ASSERT_EQ(cu().cuMemcpyDtoH_v2(result.data(), out, 256 * sizeof(float)), CUDA_SUCCESS);
  for (size_t i = 0; i < result.size(); ++i) ASSERT_EQ(result[i], 2.0f * i) << i;
  EXPECT_EQ(calls, 1);

  // The built-in fill through cuLaunchKernelEx and the library API.
  CUlibrary library = nullptr;
  ASSERT_EQ(cu().cuLibraryLoadData(&library, "fakecuda:builtin", nullptr, nullptr, 0, nullptr,
                                   nullptr, 0),
            CUDA_SUCCESS);
  CUkernel kernel = nullptr;
  ASSERT_EQ(cu().cuLibraryGetKernel(&kernel, library, "fill_u32"), CUDA_SUCCESS);
  CUfunction fill = nullptr;
  ASSERT_EQ(cu().cuKernelGetFunction(&fill, kernel), CUDA_SUCCESS);
  CUlaunchConfig config{};
  config.gridDimX = config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = config.blockDimY = config.blockDimZ = 1;
  unsigned value = 0xabcdef;
  size_t count = 256;
  void* params[] = {&out, &value, &count};
  ASSERT_EQ(cu().cuLaunchKernelEx(&config, fill, params, nullptr), CUDA_SUCCESS);
  std::vector<unsigned> filled(256);
  ASSERT_EQ(cu().cuMemcpyDtoH_v2(filled.data(), out, 256 * sizeof(unsigned)), CUDA_SUCCESS);
  EXPECT_EQ(filled, std::vector<unsigned>(256, 0xabcdef));
  cu().cuMemFree_v2(in);
  cu().cuMemFree_v2(out);
}

TEST_F(FakeCudaTest, FaultInjectionFailsExactlyTheNthCall) {
  cu().fail_nth("cuMemAlloc", 3, CUDA_ERROR_OUT_OF_MEMORY);
  size_t before = FreeBytes();
  CUdeviceptr p[4] = {};
  EXPECT_EQ(cu().cuMemAlloc_v2(&p[0], 4096), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemAlloc_v2(&p[1], 4096), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemAlloc_v2(&p[2], 4096), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(p[2], 0u);  // the failed call did nothing
  EXPECT_EQ(cu().cuMemAlloc_v2(&p[3], 4096), CUDA_SUCCESS);
  EXPECT_EQ(before - FreeBytes(), 3 * 2 * kMiB);
  for (CUdeviceptr x : {p[0], p[1], p[3]}) EXPECT_EQ(cu().cuMemFree_v2(x), CUDA_SUCCESS);

  cu().fail_nth("cuStreamSynchronize", 1, CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_EQ(cu().cuStreamSynchronize(nullptr), CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_EQ(cu().cuStreamSynchronize(nullptr), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, GraphAllocatesRunsKernelAndFrees) {
  size_t before = FreeBytes();
  CUgraph graph = nullptr;
  ASSERT_EQ(cu().cuGraphCreate(&graph, 0), CUDA_SUCCESS);
  CUDA_MEM_ALLOC_NODE_PARAMS alloc{};
  alloc.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  alloc.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  alloc.poolProps.location.id = 0;
  alloc.bytesize = 3 * kMiB;
  CUgraphNode alloc_node = nullptr, fill_node = nullptr, free_node = nullptr;
  ASSERT_EQ(cu().cuGraphAddMemAllocNode(&alloc_node, graph, nullptr, 0, &alloc), CUDA_SUCCESS);
  ASSERT_NE(alloc.dptr, 0u);

  CUdeviceptr result = 0;
  ASSERT_EQ(cu().cuMemAlloc_v2(&result, sizeof(unsigned)), CUDA_SUCCESS);
  size_t after_result = FreeBytes();
  unsigned value = 42;
  size_t count = alloc.bytesize / sizeof(unsigned);
  CUdeviceptr dptr = alloc.dptr;
  void* params[] = {&dptr, &value, &count};
  CUDA_KERNEL_NODE_PARAMS kernel{};
  kernel.func = Builtin("fill_u32");
  kernel.gridDimX = kernel.gridDimY = kernel.gridDimZ = 1;
  kernel.blockDimX = kernel.blockDimY = kernel.blockDimZ = 1;
  kernel.kernelParams = params;
  ASSERT_EQ(cu().cuGraphAddKernelNode_v2(&fill_node, graph, &alloc_node, 1, &kernel),
            CUDA_SUCCESS);
  ASSERT_EQ(cu().cuGraphAddMemFreeNode(&free_node, graph, &fill_node, 1, alloc.dptr),
            CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cu().cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);

  CUstream stream = nullptr;
  ASSERT_EQ(cu().cuStreamCreate(&stream, 0), CUDA_SUCCESS);
  LaunchSleep(stream, 100000);  // holds the graph back so its allocation is observable
  ASSERT_EQ(cu().cuGraphLaunch(exec, stream), CUDA_SUCCESS);
  EXPECT_EQ(after_result - FreeBytes(), 4 * kMiB);  // 3 MiB rounded to the granularity
  ASSERT_EQ(cu().cuStreamSynchronize(stream), CUDA_SUCCESS);
  // Freed by its free node, the memory stays reserved for the graph's next launch (as the driver's
  // graph memory pool keeps it) until a trim gives it back.
  auto graph_mem = [](CUgraphMem_attribute attr) {
    cuuint64_t v = 7;
    EXPECT_EQ(cu().cuDeviceGetGraphMemAttribute(0, attr, &v), CUDA_SUCCESS);
    return v;
  };
  EXPECT_EQ(after_result - FreeBytes(), 4 * kMiB);
  EXPECT_EQ(graph_mem(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT), 0u);
  EXPECT_EQ(graph_mem(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), 4 * kMiB);
  EXPECT_EQ(graph_mem(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH), 4 * kMiB);
  ASSERT_EQ(cu().cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
  EXPECT_EQ(graph_mem(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), 0u);
  EXPECT_EQ(FreeBytes(), after_result);
  // The kernel node wrote the graph allocation (its address stays mapped while the graph lives).
  EXPECT_EQ(reinterpret_cast<unsigned*>(alloc.dptr)[count - 1], 42u);

  // A second launch works again because the free node released the first allocation; a third
  // reuses what the pool kept instead of charging the device again.
  ASSERT_EQ(cu().cuGraphLaunch(exec, stream), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamSynchronize(stream), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuGraphLaunch(exec, stream), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuStreamSynchronize(stream), CUDA_SUCCESS);
  EXPECT_EQ(after_result - FreeBytes(), 4 * kMiB);
  EXPECT_EQ(cu().cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuGraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuStreamDestroy_v2(stream), CUDA_SUCCESS);
  EXPECT_EQ(cu().cuMemFree_v2(result), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuDeviceGraphMemTrim(0), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), before);
}

TEST_F(FakeCudaTest, VirtualMemoryMapsPhysicalAllocations) {
  size_t before = FreeBytes();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemGenericAllocationHandle handle = 0;
  EXPECT_EQ(cu().cuMemCreate(&handle, kMiB, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cu().cuMemCreate(&handle, 4 * kMiB, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(before - FreeBytes(), 4 * kMiB);
  CUdeviceptr va = 0;
  ASSERT_EQ(cu().cuMemAddressReserve(&va, 8 * kMiB, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemMap(va, 4 * kMiB, 0, handle, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemMap(va + 4 * kMiB, 4 * kMiB, 0, handle, 0), CUDA_SUCCESS);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(cu().cuMemSetAccess(va, 8 * kMiB, &access, 1), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemsetD32_v2(va, 5, 16), CUDA_SUCCESS);
  unsigned seen = 0;
  ASSERT_EQ(cu().cuMemcpyDtoH_v2(&seen, va + 4 * kMiB, sizeof(seen)), CUDA_SUCCESS);
  EXPECT_EQ(seen, 5u);  // both mappings alias the same physical memory
  ASSERT_EQ(cu().cuMemRelease(handle), CUDA_SUCCESS);
  EXPECT_EQ(before - FreeBytes(), 4 * kMiB);  // still mapped
  ASSERT_EQ(cu().cuMemUnmap(va, 4 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemUnmap(va + 4 * kMiB, 4 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), before);
  EXPECT_EQ(cu().cuMemAddressFree(va, 8 * kMiB), CUDA_SUCCESS);
}

// A handle found by address owes one more release; an exportable handle travels as a file
// descriptor and its import maps the same memory without charging it again. Legacy IPC refuses
// VMM memory, as driver 580 does.
TEST_F(FakeCudaTest, VirtualMemoryHandlesAreRetainedExportedAndImported) {
  size_t before = FreeBytes();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle handle = 0, retained = 0, imported = 0;
  ASSERT_EQ(cu().cuMemCreate(&handle, 2 * kMiB, &prop, 0), CUDA_SUCCESS);
  CUmemAllocationProp seen{};
  ASSERT_EQ(cu().cuMemGetAllocationPropertiesFromHandle(&seen, handle), CUDA_SUCCESS);
  EXPECT_EQ(seen.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  EXPECT_EQ(seen.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
  CUdeviceptr va = 0;
  ASSERT_EQ(cu().cuMemAddressReserve(&va, 4 * kMiB, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemMap(va, 2 * kMiB, 0, handle, 0), CUDA_SUCCESS);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(cu().cuMemSetAccess(va, 2 * kMiB, &access, 1), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemsetD32_v2(va, 7, 16), CUDA_SUCCESS);
  CUipcMemHandle legacy{};
  EXPECT_EQ(cu().cuIpcGetMemHandle(&legacy, va), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cu().cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(va + 64)), CUDA_SUCCESS);
  EXPECT_EQ(retained, handle);
  int fd = -1;
  ASSERT_EQ(cu().cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            CUDA_SUCCESS);
  close(fd);
  ASSERT_EQ(cu().cuMemMap(va + 2 * kMiB, 2 * kMiB, 0, imported, 0), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemSetAccess(va + 2 * kMiB, 2 * kMiB, &access, 1), CUDA_SUCCESS);
  unsigned word = 0;
  ASSERT_EQ(cu().cuMemcpyDtoH_v2(&word, va + 2 * kMiB, sizeof(word)), CUDA_SUCCESS);
  EXPECT_EQ(word, 7u);
  EXPECT_EQ(before - FreeBytes(), 2 * kMiB);  // the import is not charged again
  ASSERT_EQ(cu().cuMemUnmap(va + 2 * kMiB, 2 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemRelease(imported), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemUnmap(va, 2 * kMiB), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuMemRelease(handle), CUDA_SUCCESS);
  EXPECT_EQ(before - FreeBytes(), 2 * kMiB);  // the retain still holds it
  ASSERT_EQ(cu().cuMemRelease(retained), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), before);
  EXPECT_EQ(cu().cuMemRelease(handle), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cu().cuMemAddressFree(va, 4 * kMiB), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, ArraysAndAsyncAllocationsCountAgainstTheDevice) {
  size_t before = FreeBytes();
  CUDA_ARRAY_DESCRIPTOR desc{};
  desc.Width = 1024;
  desc.Height = 1024;
  desc.Format = CU_AD_FORMAT_FLOAT;
  desc.NumChannels = 2;  // 8 MiB
  CUarray array = nullptr;
  ASSERT_EQ(cu().cuArrayCreate_v2(&array, &desc), CUDA_SUCCESS);
  EXPECT_EQ(before - FreeBytes(), 8 * kMiB);
  EXPECT_EQ(cu().cuArrayDestroy(array), CUDA_SUCCESS);

  CUdeviceptr p = 0;
  ASSERT_EQ(cu().cuMemAllocAsync(&p, kMiB, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(before - FreeBytes(), 2 * kMiB);
  ASSERT_EQ(cu().cuMemFreeAsync(p, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cu().cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), before);

  void* host = nullptr;
  ASSERT_EQ(cu().cuMemAllocHost_v2(&host, 64 * kMiB), CUDA_SUCCESS);
  EXPECT_EQ(FreeBytes(), before);  // host memory is not device memory
  EXPECT_EQ(cu().cuMemFreeHost(host), CUDA_SUCCESS);
}

TEST_F(FakeCudaTest, GetProcAddressFindsTheNewestExport) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status;
  ASSERT_EQ(cu().cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 0, &status), CUDA_SUCCESS);
  EXPECT_EQ(fn, reinterpret_cast<void*>(cu().cuMemAlloc_v2));
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  EXPECT_EQ(cu().cuGetProcAddress_v2("cuNoSuchThing", &fn, 13000, 0, &status),
            CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  const char* name = nullptr;
  ASSERT_EQ(cu().cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &name), CUDA_SUCCESS);
  EXPECT_STREQ(name, "CUDA_ERROR_OUT_OF_MEMORY");
}

TEST_F(FakeCudaTest, ConcurrentThreadsShareTheDeviceSafely) {
  size_t before = FreeBytes();
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      if (cu().cuCtxSetCurrent(ctx_) != CUDA_SUCCESS) ++failures;
      CUstream stream = nullptr;
      if (cu().cuStreamCreate(&stream, 0) != CUDA_SUCCESS) ++failures;
      for (int i = 0; i < 50; ++i) {
        CUdeviceptr p = 0;
        if (cu().cuMemAlloc_v2(&p, 4096) != CUDA_SUCCESS) ++failures;
        if (cu().cuMemsetD8Async(p, 1, 4096, stream) != CUDA_SUCCESS) ++failures;
        if (cu().cuMemFreeAsync(p, stream) != CUDA_SUCCESS) ++failures;
      }
      if (cu().cuStreamSynchronize(stream) != CUDA_SUCCESS) ++failures;
      if (cu().cuStreamDestroy_v2(stream) != CUDA_SUCCESS) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(FreeBytes(), before);
}

TEST_F(FakeCudaTest, NvmlReportsTheSameDevicesAndMemoryInUse) {
  const FakeNvml& nvml = Nvml();
  ASSERT_EQ(nvml.nvmlInit_v2(), NVML_SUCCESS);
  unsigned count = 0;
  ASSERT_EQ(nvml.nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
  EXPECT_EQ(count, static_cast<unsigned>(kDevices));
  nvmlDevice_t device = nullptr;
  ASSERT_EQ(nvml.nvmlDeviceGetHandleByIndex_v2(0, &device), NVML_SUCCESS);

  char uuid[NVML_DEVICE_UUID_BUFFER_SIZE];
  ASSERT_EQ(nvml.nvmlDeviceGetUUID(device, uuid, sizeof(uuid)), NVML_SUCCESS);
  CUuuid cuda_uuid;
  ASSERT_EQ(cu().cuDeviceGetUuid_v2(&cuda_uuid, 0), CUDA_SUCCESS);
  const auto* b = reinterpret_cast<const unsigned char*>(cuda_uuid.bytes);
  char expected[64];
  std::snprintf(expected, sizeof(expected),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                b[14], b[15]);
  EXPECT_STREQ(uuid, expected);
  char small[8];
  EXPECT_EQ(nvml.nvmlDeviceGetUUID(device, small, sizeof(small)), NVML_ERROR_INSUFFICIENT_SIZE);

  unsigned sms = 0;
  ASSERT_EQ(nvml.nvmlDeviceGetMultiProcessorCount(device, &sms), NVML_SUCCESS);
  EXPECT_EQ(sms, 132u);

  nvmlMemory_t before{};
  ASSERT_EQ(nvml.nvmlDeviceGetMemoryInfo(device, &before), NVML_SUCCESS);
  EXPECT_EQ(before.total, kTotalMiB * kMiB);
  CUdeviceptr p = 0;
  ASSERT_EQ(cu().cuMemAlloc_v2(&p, 32 * kMiB), CUDA_SUCCESS);
  nvmlMemory_v2_t during{};
  during.version = nvmlMemory_v2;
  ASSERT_EQ(nvml.nvmlDeviceGetMemoryInfo_v2(device, &during), NVML_SUCCESS);
  EXPECT_EQ(during.used - before.used, 32 * kMiB);
  EXPECT_EQ(during.free + during.used, during.total);
  ASSERT_EQ(cu().cuMemFree_v2(p), CUDA_SUCCESS);
  nvmlMemory_t after{};
  ASSERT_EQ(nvml.nvmlDeviceGetMemoryInfo(device, &after), NVML_SUCCESS);
  EXPECT_EQ(after.used, before.used);
  EXPECT_EQ(nvml.nvmlShutdown(), NVML_SUCCESS);
}

}  // namespace

int main(int argc, char** argv) {
  // The fakes read their configuration once, at cuInit / nvmlInit. A per-process shared-memory
  // name keeps parallel test processes from seeing each other's allocations through NVML.
  setenv("FAKECUDA_DEVICES", std::to_string(kDevices).c_str(), 1);
  setenv("FAKECUDA_TOTAL_MIB", std::to_string(kTotalMiB).c_str(), 1);
  std::string shm = "fakecuda-test-" + std::to_string(getpid());
  setenv("FAKECUDA_SHM_NAME", shm.c_str(), 1);
  ::testing::InitGoogleTest(&argc, argv);
  int result = RUN_ALL_TESTS();
  for (int i = 0; i < kDevices; ++i) shm_unlink(("/" + shm + "-dev" + std::to_string(i)).c_str());
  shm_unlink(("/" + shm + "-ckpt").c_str());
  return result;
}
