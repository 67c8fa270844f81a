// samples: our own programs covering what NVIDIA's public CUDA samples exercise, one subcommand
// each, so the same binary runs natively and through the remote vGPU and the outputs can be
// compared line by line (tests/gpu/remote_compare.sh, phase "samples").
//
//   samples                 every sample, each in a child process of its own (a sticky error or a
//                           crash in one cannot spoil the next; each child opens its own session)
//   samples --only a,b      the named samples
//   samples --list          the names
//   samples --no-fork ...   run in this process
//
// Per sample it prints `SAMPLE <name> PASS|FAIL <detail>` and, when the sample computed something,
// `RESULT <name> <checksum>` (FNV-1a over the result bytes: equal natively and remotely on the
// same GPU). device_printf also prints `EXPECT_LINE device_printf <text>` for each line its kernel
// prints, which must appear in stdout. Exit status: 0 when every sample passed.
//
// Kernels for the driver-API samples come from files beside this one, built by GpuTier.cmake:
// samples_kernels.cu (a fatbin), samples_jit.cu (PTX), samples_link_a.cu and samples_link_b.cu
// (relocatable PTX), embedded as the symbols declared below.
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

// The driver-API samples load these kernels from the embedded fatbin; the runtime-API samples
// launch the same source, compiled into this program, with <<<>>>.
#include "samples_kernels.cu"
#include "samples.h"

extern "C" const unsigned char tf_samples_kernels_fatbin[];
extern "C" const char tf_samples_jit_ptx[];
extern "C" const char tf_samples_link_a_ptx[];
extern "C" const char tf_samples_link_b_ptx[];

namespace {

using tf_samples::Input;
using tf_samples::Outcome;


__global__ void AffineInPlace(float* x, int n, float a, float b) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = a * x[i] + b;
}

__global__ void FillInt(int* x, int n, int v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = v;
}

__global__ void AddInt(int* x, int n, int v) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += v;
}

__global__ void Spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

__global__ void WriteHost(volatile int* host, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) host[i] = i * 3 + 1;
}

__global__ void PrintLines(int value) {
  printf("samples printf block=%d thread=%d value=%d\n", static_cast<int>(blockIdx.x),
         static_cast<int>(threadIdx.x), value + static_cast<int>(blockIdx.x * 10 + threadIdx.x));
}

// ~32000 bytes by value: allowed since CUDA 12.1 on Volta and newer.
struct BigParams {
  int values[8000];
};

__global__ void SumBig(BigParams p, long long* out) {
  long long s = 0;
  for (int i = threadIdx.x; i < 8000; i += blockDim.x) s += static_cast<long long>(p.values[i]) * (i % 17 + 1);
  atomicAdd(reinterpret_cast<unsigned long long*>(out), static_cast<unsigned long long>(s));
}

int Blocks(int n, int threads) { return (n + threads - 1) / threads; }

// ---- samples

void VecAddDriver(Outcome& o) {
  constexpr int n = 1 << 20;
  std::vector<float> a(n), b(n), c(n);
  for (int i = 0; i < n; ++i) {
    a[i] = Input(i, 1);
    b[i] = Input(i, 2);
  }
  CUmodule mod = nullptr;
  DRV(o, cuModuleLoadData(&mod, tf_samples_kernels_fatbin));
  CUfunction f = nullptr;
  DRV(o, cuModuleGetFunction(&f, mod, "samples_vecadd"));
  CUdeviceptr da = 0, db = 0, dc = 0;
  DRV(o, cuMemAlloc(&da, n * sizeof(float)));
  DRV(o, cuMemAlloc(&db, n * sizeof(float)));
  DRV(o, cuMemAlloc(&dc, n * sizeof(float)));
  DRV(o, cuMemcpyHtoD(da, a.data(), n * sizeof(float)));
  DRV(o, cuMemcpyHtoD(db, b.data(), n * sizeof(float)));
  int count = n;
  void* params[] = {&da, &db, &dc, &count};
  DRV(o, cuLaunchKernel(f, Blocks(n, 256), 1, 1, 256, 1, 1, 0, nullptr, params, nullptr));
  DRV(o, cuMemcpyDtoH(c.data(), dc, n * sizeof(float)));
  for (int i = 0; i < n; ++i) {
    if (c[i] != a[i] + b[i]) {
      o.Fail("c[" + std::to_string(i) + "] wrong");
      break;
    }
  }
  o.Result(c.data(), n * sizeof(float));
  DRV(o, cuMemFree(da));
  DRV(o, cuMemFree(db));
  DRV(o, cuMemFree(dc));
  DRV(o, cuModuleUnload(mod));
  if (o.pass) o.detail = "1M floats, cuModuleLoadData(fatbin) + cuLaunchKernel";
}

void VecAddRuntime(Outcome& o) {
  constexpr int n = 1 << 20;
  std::vector<float> a(n), b(n), c(n);
  for (int i = 0; i < n; ++i) {
    a[i] = Input(i, 3);
    b[i] = Input(i, 4);
  }
  float *da = nullptr, *db = nullptr, *dc = nullptr;
  RT(o, cudaMalloc(&da, n * sizeof(float)));
  RT(o, cudaMalloc(&db, n * sizeof(float)));
  RT(o, cudaMalloc(&dc, n * sizeof(float)));
  RT(o, cudaMemcpy(da, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  RT(o, cudaMemcpy(db, b.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  samples_vecadd<<<Blocks(n, 256), 256>>>(da, db, dc, n);
  RT(o, cudaGetLastError());
  RT(o, cudaMemcpy(c.data(), dc, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    if (c[i] != a[i] + b[i]) {
      o.Fail("c[" + std::to_string(i) + "] wrong");
      break;
    }
  }
  o.Result(c.data(), n * sizeof(float));
  RT(o, cudaFree(da));
  RT(o, cudaFree(db));
  RT(o, cudaFree(dc));
  if (o.pass) o.detail = "1M floats, <<<>>>";
}

// Host reference of C = A * B (exact: the inputs are small multiples of 1/4).
void MatMulReference(const std::vector<float>& a, const std::vector<float>& b, std::vector<float>& c, int n) {
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int k = 0; k < n; ++k) s += static_cast<double>(a[i * n + k]) * b[k * n + j];
      c[i * n + j] = static_cast<float>(s);
    }
  }
}

void CheckMatMul(Outcome& o, const std::vector<float>& a, const std::vector<float>& b,
                 const std::vector<float>& c, int n) {
  std::vector<float> ref(n * n);
  MatMulReference(a, b, ref, n);
  for (int i = 0; i < n * n; ++i) {
    if (std::fabs(ref[i] - c[i]) > 1e-3f * (1.0f + std::fabs(ref[i]))) {
      o.Fail("C[" + std::to_string(i) + "] = " + std::to_string(c[i]) + ", expected " + std::to_string(ref[i]));
      return;
    }
  }
  o.Result(c.data(), c.size() * sizeof(float));
}

void MatMulDriver(Outcome& o) {
  constexpr int n = 256;
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (int i = 0; i < n * n; ++i) {
    a[i] = Input(i, 5);
    b[i] = Input(i * 3, 6);
  }
  CUmodule mod = nullptr;
  DRV(o, cuModuleLoadData(&mod, tf_samples_kernels_fatbin));
  CUfunction f = nullptr;
  DRV(o, cuModuleGetFunction(&f, mod, "samples_matmul"));
  CUdeviceptr da = 0, db = 0, dc = 0;
  const size_t bytes = n * n * sizeof(float);
  DRV(o, cuMemAlloc(&da, bytes));
  DRV(o, cuMemAlloc(&db, bytes));
  DRV(o, cuMemAlloc(&dc, bytes));
  DRV(o, cuMemcpyHtoD(da, a.data(), bytes));
  DRV(o, cuMemcpyHtoD(db, b.data(), bytes));
  int dim = n;
  void* params[] = {&da, &db, &dc, &dim};
  DRV(o, cuLaunchKernel(f, n / 16, n / 16, 1, 16, 16, 1, 0, nullptr, params, nullptr));
  DRV(o, cuCtxSynchronize());
  DRV(o, cuMemcpyDtoH(c.data(), dc, bytes));
  CheckMatMul(o, a, b, c, n);
  DRV(o, cuMemFree(da));
  DRV(o, cuMemFree(db));
  DRV(o, cuMemFree(dc));
  DRV(o, cuModuleUnload(mod));
  if (o.pass) o.detail = "256x256, driver API, checked against the CPU";
}

void MatMulRuntime(Outcome& o) {
  constexpr int n = 256;
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (int i = 0; i < n * n; ++i) {
    a[i] = Input(i, 7);
    b[i] = Input(i * 5, 8);
  }
  const size_t bytes = n * n * sizeof(float);
  float *da = nullptr, *db = nullptr, *dc = nullptr;
  RT(o, cudaMalloc(&da, bytes));
  RT(o, cudaMalloc(&db, bytes));
  RT(o, cudaMalloc(&dc, bytes));
  RT(o, cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
  RT(o, cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice));
  // The cache preferences many of NVIDIA's samples set first (hints; the device's answer is
  // recorded with the result).
  RT(o, cudaDeviceSetCacheConfig(cudaFuncCachePreferShared));
  RT(o, cudaFuncSetCacheConfig(samples_matmul, cudaFuncCachePreferShared));
  cudaFuncCache cache = cudaFuncCachePreferNone;
  RT(o, cudaDeviceGetCacheConfig(&cache));
  samples_matmul<<<dim3(n / 16, n / 16), dim3(16, 16)>>>(da, db, dc, n);
  RT(o, cudaGetLastError());
  RT(o, cudaDeviceSynchronize());
  RT(o, cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost));
  CheckMatMul(o, a, b, c, n);
  o.Result(&cache, sizeof(cache));
  RT(o, cudaDeviceSetCacheConfig(cudaFuncCachePreferNone));
  RT(o, cudaFree(da));
  RT(o, cudaFree(db));
  RT(o, cudaFree(dc));
  if (o.pass) o.detail = "256x256, runtime API, cache preferences set, checked against the CPU";
}

void AsyncOverlap(Outcome& o) {
  constexpr int kStreams = 4, kChunks = 16;
  constexpr int n = 1 << 22;
  constexpr int chunk = n / kChunks;
  float* host = nullptr;
  RT(o, cudaMallocHost(&host, n * sizeof(float)));
  for (int i = 0; i < n; ++i) host[i] = Input(i, 9);
  float* dev = nullptr;
  RT(o, cudaMalloc(&dev, n * sizeof(float)));
  cudaStream_t streams[kStreams];
  for (auto& s : streams) RT(o, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int c = 0; c < kChunks; ++c) {
    cudaStream_t s = streams[c % kStreams];
    float* h = host + c * chunk;
    float* d = dev + c * chunk;
    RT(o, cudaMemcpyAsync(d, h, chunk * sizeof(float), cudaMemcpyHostToDevice, s));
    AffineInPlace<<<Blocks(chunk, 256), 256, 0, s>>>(d, chunk, 2.0f, 1.0f);
    RT(o, cudaGetLastError());
    RT(o, cudaMemcpyAsync(h, d, chunk * sizeof(float), cudaMemcpyDeviceToHost, s));
  }
  for (auto& s : streams) RT(o, cudaStreamSynchronize(s));
  for (int i = 0; i < n; ++i) {
    if (host[i] != 2.0f * Input(i, 9) + 1.0f) {
      o.Fail("element " + std::to_string(i) + " wrong");
      break;
    }
  }
  o.Result(host, n * sizeof(float));
  for (auto& s : streams) RT(o, cudaStreamDestroy(s));
  RT(o, cudaFree(dev));
  RT(o, cudaFreeHost(host));
  if (o.pass) o.detail = "4 streams x 16 chunks, pinned HtoD/kernel/DtoH";
}

void MultiStream(Outcome& o) {
  constexpr int n = 1 << 20;
  int* d = nullptr;
  RT(o, cudaMalloc(&d, n * sizeof(int)));
  cudaStream_t a, b, c;
  RT(o, cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  RT(o, cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  RT(o, cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
  cudaEvent_t produced, added, start, stop;
  RT(o, cudaEventCreateWithFlags(&produced, cudaEventDisableTiming));
  RT(o, cudaEventCreateWithFlags(&added, cudaEventDisableTiming));
  RT(o, cudaEventCreate(&start));
  RT(o, cudaEventCreate(&stop));
  RT(o, cudaEventRecord(start, a));
  // Stream a spins first, so b and c really have to wait for the events.
  Spin<<<1, 1, 0, a>>>(20 * 1000 * 1000);
  FillInt<<<Blocks(n, 256), 256, 0, a>>>(d, n, 5);
  RT(o, cudaEventRecord(produced, a));
  RT(o, cudaStreamWaitEvent(b, produced, 0));
  AddInt<<<Blocks(n, 256), 256, 0, b>>>(d, n, 7);
  RT(o, cudaEventRecord(added, b));
  RT(o, cudaStreamWaitEvent(c, added, 0));
  AddInt<<<Blocks(n, 256), 256, 0, c>>>(d, n, 30);
  RT(o, cudaEventRecord(stop, c));
  std::vector<int> host(n);
  RT(o, cudaMemcpyAsync(host.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost, c));
  RT(o, cudaStreamSynchronize(c));
  float ms = -1;
  RT(o, cudaEventElapsedTime(&ms, start, stop));
  for (int i = 0; i < n; ++i) {
    if (host[i] != 42) {
      o.Fail("element " + std::to_string(i) + " = " + std::to_string(host[i]) + ", expected 42");
      break;
    }
  }
  if (!(ms > 0)) o.Fail("elapsed time across streams " + std::to_string(ms) + " ms");
  o.Result(host.data(), n * sizeof(int));
  for (cudaEvent_t e : {produced, added, start, stop}) RT(o, cudaEventDestroy(e));
  for (cudaStream_t s : {a, b, c}) RT(o, cudaStreamDestroy(s));
  RT(o, cudaFree(d));
  if (o.pass) o.detail = "3 streams chained by events, elapsed " + std::to_string(static_cast<int>(ms)) + " ms";
}

struct CallbackLog {
  std::mutex mu;
  std::vector<int> order;
  int* pinned = nullptr;
  std::vector<int> seen;  // pinned[0] when each ran
  void Add(int id) {
    std::lock_guard<std::mutex> g(mu);
    order.push_back(id);
    seen.push_back(pinned[0]);
  }
};

void HostFn(void* user) {
  auto* p = static_cast<std::pair<CallbackLog*, int>*>(user);
  p->first->Add(p->second);
}

void StreamCallback(cudaStream_t, cudaError_t status, void* user) {
  auto* p = static_cast<std::pair<CallbackLog*, int>*>(user);
  p->first->Add(status == cudaSuccess ? p->second : -p->second);
}

void HostCallbacks(Outcome& o) {
  constexpr int n = 1024;
  CallbackLog log;
  RT(o, cudaMallocHost(&log.pinned, sizeof(int) * n));
  log.pinned[0] = 0;
  int* d = nullptr;
  RT(o, cudaMalloc(&d, n * sizeof(int)));
  cudaStream_t s;
  RT(o, cudaStreamCreate(&s));
  std::pair<CallbackLog*, int> one{&log, 1}, two{&log, 2}, three{&log, 3};
  FillInt<<<Blocks(n, 256), 256, 0, s>>>(d, n, 11);
  RT(o, cudaMemcpyAsync(log.pinned, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  RT(o, cudaLaunchHostFunc(s, HostFn, &one));
  AddInt<<<Blocks(n, 256), 256, 0, s>>>(d, n, 11);
  RT(o, cudaMemcpyAsync(log.pinned, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  RT(o, cudaStreamAddCallback(s, StreamCallback, &two, 0));
  AddInt<<<Blocks(n, 256), 256, 0, s>>>(d, n, 11);
  RT(o, cudaMemcpyAsync(log.pinned, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  RT(o, cudaLaunchHostFunc(s, HostFn, &three));
  RT(o, cudaStreamSynchronize(s));
  const std::vector<int> want_order = {1, 2, 3}, want_seen = {11, 22, 33};
  if (log.order != want_order) {
    std::string got;
    for (int v : log.order) got += std::to_string(v) + " ";
    o.Fail("callbacks ran as [" + got + "], expected [1 2 3]");
  } else if (log.seen != want_seen) {
    o.Fail("callbacks did not see the copies before them in stream order");
  }
  o.Result(log.order.data(), log.order.size() * sizeof(int));
  o.Result(log.seen.data(), log.seen.size() * sizeof(int));
  RT(o, cudaStreamDestroy(s));
  RT(o, cudaFree(d));
  RT(o, cudaFreeHost(log.pinned));
  if (o.pass) o.detail = "cudaLaunchHostFunc + cudaStreamAddCallback in stream order";
}

cudaKernelNodeParams AddIntNode(void** args, int n) {
  cudaKernelNodeParams p = {};
  p.func = reinterpret_cast<void*>(AddInt);
  p.gridDim = dim3(Blocks(n, 256));
  p.blockDim = dim3(256);
  p.sharedMemBytes = 0;
  p.kernelParams = args;
  p.extra = nullptr;
  return p;
}

void GraphUpdate(Outcome& o) {
  constexpr int n = 4096;
  int* d = nullptr;
  RT(o, cudaMalloc(&d, n * sizeof(int)));
  RT(o, cudaMemset(d, 0, n * sizeof(int)));
  cudaStream_t s;
  RT(o, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<int> host(n);
  auto expect = [&](int v, const char* step) {
    if (!o.Rt(cudaStreamSynchronize(s), step)) return false;
    if (!o.Rt(cudaMemcpy(host.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost), step)) return false;
    for (int i = 0; i < n; ++i) {
      if (host[i] != v) {
        return o.Fail(std::string(step) + ": " + std::to_string(host[i]) + ", expected " + std::to_string(v));
      }
    }
    o.Result(host.data(), n * sizeof(int));
    return true;
  };

  // 1. Stream capture -> instantiate -> launch -> set the kernel node's parameters -> launch.
  cudaGraph_t captured = nullptr;
  cudaGraphExec_t exec = nullptr;
  RT(o, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  AddInt<<<Blocks(n, 256), 256, 0, s>>>(d, n, 1);
  RT(o, cudaStreamEndCapture(s, &captured));
  RT(o, cudaGraphInstantiate(&exec, captured, 0));
  RT(o, cudaGraphLaunch(exec, s));
  if (!expect(1, "captured graph")) return;
  size_t count = 0;
  RT(o, cudaGraphGetNodes(captured, nullptr, &count));
  if (count != 1) {
    o.Fail("captured graph has " + std::to_string(count) + " nodes, expected 1");
    return;
  }
  cudaGraphNode_t node = nullptr;
  RT(o, cudaGraphGetNodes(captured, &node, &count));
  int count_arg = n, add10 = 10;
  void* args10[] = {&d, &count_arg, &add10};
  cudaKernelNodeParams p10 = AddIntNode(args10, n);
  RT(o, cudaGraphExecKernelNodeSetParams(exec, node, &p10));
  RT(o, cudaGraphLaunch(exec, s));
  if (!expect(11, "after cudaGraphExecKernelNodeSetParams")) return;

  // 2. A graph built by hand, then updated from another graph of the same shape.
  int add100 = 100, add1000 = 1000;
  void* args100[] = {&d, &count_arg, &add100};
  void* args1000[] = {&d, &count_arg, &add1000};
  cudaGraph_t g1 = nullptr, g2 = nullptr;
  cudaGraphNode_t n1 = nullptr, n2 = nullptr;
  cudaKernelNodeParams p100 = AddIntNode(args100, n), p1000 = AddIntNode(args1000, n);
  RT(o, cudaGraphCreate(&g1, 0));
  RT(o, cudaGraphAddKernelNode(&n1, g1, nullptr, 0, &p100));
  cudaGraphExec_t exec1 = nullptr;
  RT(o, cudaGraphInstantiate(&exec1, g1, 0));
  RT(o, cudaGraphLaunch(exec1, s));
  if (!expect(111, "manual graph")) return;
  RT(o, cudaGraphCreate(&g2, 0));
  RT(o, cudaGraphAddKernelNode(&n2, g2, nullptr, 0, &p1000));
  cudaGraphExecUpdateResultInfo info = {};
  RT(o, cudaGraphExecUpdate(exec1, g2, &info));
  if (info.result != cudaGraphExecUpdateSuccess) {
    o.Fail("cudaGraphExecUpdate result " + std::to_string(static_cast<int>(info.result)));
    return;
  }
  RT(o, cudaGraphLaunch(exec1, s));
  if (!expect(1111, "after cudaGraphExecUpdate")) return;
  RT(o, cudaGraphExecDestroy(exec1));
  RT(o, cudaGraphExecDestroy(exec));
  RT(o, cudaGraphDestroy(g1));
  RT(o, cudaGraphDestroy(g2));
  RT(o, cudaGraphDestroy(captured));
  RT(o, cudaStreamDestroy(s));
  RT(o, cudaFree(d));
  if (o.pass) o.detail = "capture + exec kernel-node params, manual graph + cudaGraphExecUpdate";
}

void StreamOrderedAlloc(Outcome& o) {
  constexpr int n = 1 << 18;
  int dev = 0;
  RT(o, cudaGetDevice(&dev));
  int supported = 0;
  RT(o, cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, dev));
  if (!supported) {
    o.Fail("memory pools not supported");
    return;
  }
  cudaMemPool_t def = nullptr;
  RT(o, cudaDeviceGetDefaultMemPool(&def, dev));
  uint64_t keep = UINT64_MAX;
  RT(o, cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, &keep));
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = dev;
  cudaMemPool_t pool = nullptr;
  RT(o, cudaMemPoolCreate(&pool, &props));
  uint64_t threshold = 64ull << 20;
  RT(o, cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  cudaStream_t s;
  RT(o, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<int> host(n);
  long long total = 0;
  for (int round = 0; round < 8; ++round) {
    int* a = nullptr;
    int* b = nullptr;
    RT(o, cudaMallocAsync(&a, n * sizeof(int), s));
    RT(o, cudaMallocFromPoolAsync(&b, n * sizeof(int), pool, s));
    FillInt<<<Blocks(n, 256), 256, 0, s>>>(a, n, round);
    FillInt<<<Blocks(n, 256), 256, 0, s>>>(b, n, round * 2);
    AddInt<<<Blocks(n, 256), 256, 0, s>>>(a, n, 1);
    RT(o, cudaMemcpyAsync(host.data(), a, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    RT(o, cudaFreeAsync(a, s));
    RT(o, cudaFreeAsync(b, s));
    RT(o, cudaStreamSynchronize(s));
    if (host[0] != round + 1 || host[n - 1] != round + 1) {
      o.Fail("round " + std::to_string(round) + " read " + std::to_string(host[0]));
      return;
    }
    total += host[0];
  }
  uint64_t reserved = 0;
  RT(o, cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  if (reserved == 0) o.Fail("the pool released its memory despite the release threshold");
  o.Result(&total, sizeof(total));
  RT(o, cudaStreamDestroy(s));
  RT(o, cudaMemPoolDestroy(pool));
  if (o.pass) o.detail = "cudaMallocAsync/FromPoolAsync/FreeAsync x 8, pool keeps " + std::to_string(reserved >> 20) + " MiB";
}

void ZeroCopy(Outcome& o) {
  constexpr int n = 1 << 16;
  int* host = nullptr;
  RT(o, cudaHostAlloc(&host, n * sizeof(int), cudaHostAllocMapped));
  memset(host, 0, n * sizeof(int));
  int* dptr = nullptr;
  RT(o, cudaHostGetDevicePointer(&dptr, host, 0));
  WriteHost<<<Blocks(n, 256), 256>>>(dptr, n);
  RT(o, cudaGetLastError());
  RT(o, cudaDeviceSynchronize());
  for (int i = 0; i < n; ++i) {
    if (host[i] != i * 3 + 1) {
      o.Fail("host[" + std::to_string(i) + "] = " + std::to_string(host[i]));
      break;
    }
  }
  o.Result(host, n * sizeof(int));
  RT(o, cudaFreeHost(host));
  if (o.pass) o.detail = "a kernel wrote mapped host memory";
}

// Managed memory: filled on the host, advised and prefetched, updated by a kernel, read on the host
// after synchronizing (remotely: a host region over shared memory, a mirror over TCP).
void Managed(Outcome& o) {
  constexpr int n = 1 << 20;
  int attr = 0;
  RT(o, cudaDeviceGetAttribute(&attr, cudaDevAttrManagedMemory, 0));
  if (attr != 1) {
    o.Fail("the device reports no managed memory");
    return;
  }
  int* m = nullptr;
  RT(o, cudaMallocManaged(&m, n * sizeof(int)));
  for (int i = 0; i < n; ++i) m[i] = i % 1000;
  const CUdeviceptr p = reinterpret_cast<CUdeviceptr>(m);
  CUmemLocation dev0 = {};
  dev0.type = CU_MEM_LOCATION_TYPE_DEVICE;
  dev0.id = 0;
  CUmemLocation host = {};
  host.type = CU_MEM_LOCATION_TYPE_HOST;
  DRV(o, cuMemAdvise_v2(p, n * sizeof(int), CU_MEM_ADVISE_SET_READ_MOSTLY, dev0));
  DRV(o, cuMemAdvise_v2(p, n * sizeof(int), CU_MEM_ADVISE_SET_ACCESSED_BY, dev0));
  DRV(o, cuMemPrefetchAsync_v2(p, n * sizeof(int), dev0, 0, nullptr));
  AddInt<<<Blocks(n, 256), 256>>>(m, n, 7);
  RT(o, cudaGetLastError());
  DRV(o, cuMemPrefetchAsync_v2(p, n * sizeof(int), host, 0, nullptr));
  RT(o, cudaDeviceSynchronize());
  for (int i = 0; i < n; ++i) {
    if (m[i] != i % 1000 + 7) {
      o.Fail("m[" + std::to_string(i) + "] = " + std::to_string(m[i]));
      break;
    }
  }
  int read_mostly = -1, last = -9, is_managed = -1;
  DRV(o, cuMemRangeGetAttribute(&read_mostly, sizeof(int), CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, p,
                                n * sizeof(int)));
  DRV(o, cuMemRangeGetAttribute(&last, sizeof(int), CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION,
                                p, n * sizeof(int)));
  DRV(o, cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p + 64));
  if (read_mostly != 1 || last != CU_DEVICE_CPU || is_managed != 1) {
    o.Fail("range attributes read_mostly " + std::to_string(read_mostly) + ", last prefetch " +
           std::to_string(last) + ", is_managed " + std::to_string(is_managed));
  }
  o.Result(m, n * sizeof(int));
  RT(o, cudaFree(m));
  if (o.pass) o.detail = "host fill, advise, prefetch, kernel, host check of 4 MiB managed memory";
}

// Reads everything available on fd without blocking.
std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t k = read(fd, buf, sizeof(buf));
    if (k > 0) {
      out.append(buf, static_cast<size_t>(k));
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    return out;
  }
}

void DevicePrintf(Outcome& o) {
  constexpr int kBlocks = 2, kThreads = 4, kValue = 500;
  std::vector<std::string> expected;
  char line[128];
  for (int b = 0; b < kBlocks; ++b) {
    for (int t = 0; t < kThreads; ++t) {
      snprintf(line, sizeof(line), "samples printf block=%d thread=%d value=%d", b, t, kValue + b * 10 + t);
      expected.push_back(line);
      std::printf("EXPECT_LINE device_printf %s\n", line);
    }
  }
  // The kernel's lines land on this process's stdout (natively: printed by the driver; remotely:
  // forwarded by the stub) by the time cudaDeviceSynchronize returns: catch fd 1 in a pipe to check.
  fflush(stdout);
  int p[2];
  if (pipe(p) != 0) {
    o.Fail("pipe failed");
    return;
  }
  const int saved = dup(1);
  dup2(p[1], 1);
  close(p[1]);
  PrintLines<<<kBlocks, kThreads>>>(kValue);
  cudaError_t launched = cudaGetLastError();
  cudaError_t synced = cudaDeviceSynchronize();
  fflush(stdout);
  dup2(saved, 1);
  close(saved);
  fcntl(p[0], F_SETFL, O_NONBLOCK);
  const std::string caught = ReadAll(p[0]);
  close(p[0]);
  std::fwrite(caught.data(), 1, caught.size(), stdout);  // the lines, for the log and the summary
  RT(o, launched);
  RT(o, synced);
  int found = 0;
  for (const std::string& want : expected) {
    if (caught.find(want + "\n") != std::string::npos) ++found;
  }
  if (found != static_cast<int>(expected.size())) {
    o.Fail(std::to_string(found) + " of " + std::to_string(expected.size()) +
           " device lines on stdout by cudaDeviceSynchronize");
    return;
  }
  o.Result(&found, sizeof(found));
  o.detail = std::to_string(found) + " device lines on stdout by cudaDeviceSynchronize";
}

void Params32k(Outcome& o) {
  auto* big = new BigParams;
  long long expect = 0;
  for (int i = 0; i < 8000; ++i) {
    big->values[i] = (i * 37) % 1001 - 500;
    expect += static_cast<long long>(big->values[i]) * (i % 17 + 1);
  }
  long long* d = nullptr;
  RT(o, cudaMalloc(&d, sizeof(long long)));
  RT(o, cudaMemset(d, 0, sizeof(long long)));
  SumBig<<<1, 256>>>(*big, d);
  RT(o, cudaGetLastError());
  long long got = 0;
  RT(o, cudaMemcpy(&got, d, sizeof(got), cudaMemcpyDeviceToHost));
  if (got != expect) o.Fail("sum " + std::to_string(got) + ", expected " + std::to_string(expect));
  o.Result(&got, sizeof(got));
  RT(o, cudaFree(d));
  delete big;
  if (o.pass) o.detail = std::to_string(sizeof(BigParams)) + "-byte struct by value";
}

void* Slot(uintptr_t v) { return reinterpret_cast<void*>(v); }

void PtxJit(Outcome& o) {
  constexpr int n = 1 << 16;
  char info[8192] = {}, error[8192] = {};
  CUjit_option opts[] = {CU_JIT_INFO_LOG_BUFFER,  CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                         CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                         CU_JIT_LOG_VERBOSE,      CU_JIT_WALL_TIME,
                         CU_JIT_OPTIMIZATION_LEVEL};
  void* vals[] = {info, Slot(sizeof(info)), error, Slot(sizeof(error)), Slot(1), nullptr, Slot(3)};
  CUmodule mod = nullptr;
  DRV(o, cuModuleLoadDataEx(&mod, tf_samples_jit_ptx, 7, opts, vals));
  float wall = -1;
  memcpy(&wall, &vals[5], sizeof(wall));
  const unsigned info_len = static_cast<unsigned>(reinterpret_cast<uintptr_t>(vals[1]));
  CUfunction f = nullptr;
  DRV(o, cuModuleGetFunction(&f, mod, "samples_jit_saxpy"));
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = Input(i, 10);
    y[i] = Input(i, 11);
  }
  CUdeviceptr dx = 0, dy = 0;
  DRV(o, cuMemAlloc(&dx, n * sizeof(float)));
  DRV(o, cuMemAlloc(&dy, n * sizeof(float)));
  DRV(o, cuMemcpyHtoD(dx, x.data(), n * sizeof(float)));
  DRV(o, cuMemcpyHtoD(dy, y.data(), n * sizeof(float)));
  float a = 2.0f;
  int count = n;
  void* params[] = {&a, &dx, &dy, &count};
  DRV(o, cuLaunchKernel(f, Blocks(n, 256), 1, 1, 256, 1, 1, 0, nullptr, params, nullptr));
  std::vector<float> out(n);
  DRV(o, cuMemcpyDtoH(out.data(), dy, n * sizeof(float)));
  for (int i = 0; i < n; ++i) {
    if (out[i] != 2.0f * x[i] + y[i]) {
      o.Fail("y[" + std::to_string(i) + "] wrong");
      break;
    }
  }
  o.Result(out.data(), n * sizeof(float));
  DRV(o, cuMemFree(dx));
  DRV(o, cuMemFree(dy));
  DRV(o, cuModuleUnload(mod));
  // Broken PTX: the driver refuses it and says why in the error log (remotely too).
  const char* broken = ".version 8.0\n.target sm_90\n.address_size 64\nthis is not ptx\n";
  char error2[4096] = {};
  CUjit_option eopts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* evals[] = {error2, Slot(sizeof(error2))};
  CUmodule bad = nullptr;
  const CUresult r = cuModuleLoadDataEx(&bad, broken, 2, eopts, evals);
  if (r == CUDA_SUCCESS) {
    o.Fail("broken PTX was accepted");
  } else if (error2[0] == '\0') {
    o.Fail("broken PTX refused (" + std::to_string(r) + ") with an empty error log");
  }
  if (o.pass) {
    o.detail = "cuModuleLoadDataEx: info log " + std::to_string(info_len) + " bytes, wall " +
               std::to_string(wall) + " ms; broken PTX: error " + std::to_string(r) + ", log " +
               std::to_string(strlen(error2)) + " bytes";
  }
}

void CuLink(Outcome& o) {
  constexpr int n = 1 << 16;
  char info[8192] = {}, error[8192] = {};
  CUjit_option opts[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                         CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                         CU_JIT_LOG_VERBOSE, CU_JIT_WALL_TIME};
  void* vals[] = {info, Slot(sizeof(info)), error, Slot(sizeof(error)), Slot(1), nullptr};
  CUlinkState link = nullptr;
  DRV(o, cuLinkCreate(6, opts, vals, &link));
  // Unit A from memory; unit B from a file (cuLinkAddFile).
  const std::string a_text = tf_samples_link_a_ptx;
  if (!o.Drv(cuLinkAddData(link, CU_JIT_INPUT_PTX, const_cast<char*>(a_text.c_str()), a_text.size() + 1,
                           "samples_link_a.ptx", 0, nullptr, nullptr),
             "cuLinkAddData")) {
    o.detail += std::string(" [") + error + "]";
    cuLinkDestroy(link);
    return;
  }
  char path[] = "/tmp/samples_link_b_XXXXXX.ptx";
  const int fd = mkstemps(path, 4);
  if (fd < 0) {
    o.Fail("mkstemps failed");
    cuLinkDestroy(link);
    return;
  }
  const size_t b_len = strlen(tf_samples_link_b_ptx);
  const bool written = write(fd, tf_samples_link_b_ptx, b_len) == static_cast<ssize_t>(b_len);
  close(fd);
  const CUresult added = written ? cuLinkAddFile(link, CU_JIT_INPUT_PTX, path, 0, nullptr, nullptr)
                                 : CUDA_ERROR_FILE_NOT_FOUND;
  unlink(path);
  if (!o.Drv(added, "cuLinkAddFile")) {
    o.detail += std::string(" [") + error + "]";
    cuLinkDestroy(link);
    return;
  }
  void* cubin = nullptr;
  size_t cubin_size = 0;
  if (!o.Drv(cuLinkComplete(link, &cubin, &cubin_size), "cuLinkComplete")) {
    o.detail += std::string(" [") + error + "]";
    cuLinkDestroy(link);
    return;
  }
  float wall = -1;
  memcpy(&wall, &vals[5], sizeof(wall));
  CUmodule mod = nullptr;
  DRV(o, cuModuleLoadData(&mod, cubin));
  DRV(o, cuLinkDestroy(link));  // the module keeps what it loaded
  CUfunction f = nullptr;
  DRV(o, cuModuleGetFunction(&f, mod, "samples_link_kernel"));
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) x[i] = Input(i, 12);
  CUdeviceptr dx = 0, dy = 0;
  DRV(o, cuMemAlloc(&dx, n * sizeof(float)));
  DRV(o, cuMemAlloc(&dy, n * sizeof(float)));
  DRV(o, cuMemcpyHtoD(dx, x.data(), n * sizeof(float)));
  int count = n;
  void* params[] = {&dx, &dy, &count};
  DRV(o, cuLaunchKernel(f, Blocks(n, 256), 1, 1, 256, 1, 1, 0, nullptr, params, nullptr));
  DRV(o, cuMemcpyDtoH(y.data(), dy, n * sizeof(float)));
  for (int i = 0; i < n; ++i) {
    if (y[i] != 3.0f * x[i] + static_cast<float>(i % 5)) {
      o.Fail("y[" + std::to_string(i) + "] wrong");
      break;
    }
  }
  o.Result(y.data(), n * sizeof(float));
  DRV(o, cuMemFree(dx));
  DRV(o, cuMemFree(dy));
  DRV(o, cuModuleUnload(mod));
  if (o.pass) {
    o.detail = "2 PTX units (data + file) linked to a " + std::to_string(cubin_size) +
               "-byte cubin, info log " + std::to_string(strlen(info)) + " bytes, wall " +
               std::to_string(wall) + " ms";
  }
}

using tf_samples::Sample;

// Order: the host-memory samples last (zero-copy and managed memory are mirrored over TCP).
const Sample kBuiltIn[] = {
    {"vecadd_driver", VecAddDriver},
    {"vecadd_runtime", VecAddRuntime},
    {"matmul_driver", MatMulDriver},
    {"matmul_runtime", MatMulRuntime},
    {"async_overlap", AsyncOverlap},
    {"multi_stream", MultiStream},
    {"host_callbacks", HostCallbacks},
    {"graph_update", GraphUpdate},
    {"stream_ordered_alloc", StreamOrderedAlloc},
    {"device_printf", DevicePrintf},
    {"params_32k", Params32k},
    {"ptx_jit", PtxJit},
    {"culink", CuLink},
    {"zero_copy", ZeroCopy},
    {"managed", Managed},
};

// The built-in samples, then those of the samples_surface_*.cu files by name.
std::vector<Sample> AllSamples() {
  std::vector<Sample> all(std::begin(kBuiltIn), std::end(kBuiltIn));
  std::vector<Sample> extra = tf_samples::Registered();
  std::sort(extra.begin(), extra.end(), [](const Sample& a, const Sample& b) { return strcmp(a.name, b.name) < 0; });
  all.insert(all.end(), extra.begin(), extra.end());
  return all;
}

// Runs one sample in this process: the runtime's primary context is current for the driver-API
// samples too. Returns whether it passed.
bool RunSample(const Sample& s) {
  Outcome o;
  cudaError_t e = cudaSetDevice(0);
  if (e == cudaSuccess) e = cudaFree(nullptr);  // creates the primary context
  if (e != cudaSuccess) {
    o.Rt(e, "cudaSetDevice/cudaFree(0)");
  } else {
    s.run(o);
    cudaError_t sticky = cudaDeviceSynchronize();
    if (sticky != cudaSuccess) o.Rt(sticky, "cudaDeviceSynchronize at the end");
  }
  std::printf("SAMPLE %s %s %s\n", s.name, o.pass ? "PASS" : "FAIL", o.detail.c_str());
  if (o.has_result) std::printf("RESULT %s %016llx\n", s.name, static_cast<unsigned long long>(o.checksum));
  std::fflush(stdout);
  return o.pass;
}

// Runs one sample in a child process (bounded by timeout_s); a crash or hang is a FAIL line.
bool RunIsolated(const Sample& s, int timeout_s) {
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) {
    std::printf("SAMPLE %s FAIL fork: %s\n", s.name, strerror(errno));
    return false;
  }
  if (pid == 0) {
    alarm(static_cast<unsigned>(timeout_s));
    _exit(RunSample(s) ? 0 : 1);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status) == 0;
  const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  std::printf("SAMPLE %s FAIL %s (signal %d)\n", s.name, sig == SIGALRM ? "timed out" : "crashed", sig);
  std::fflush(stdout);
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<Sample> kSamples = AllSamples();
  bool fork_each = true;
  std::vector<std::string> only;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--no-fork") {
      fork_each = false;
    } else if (arg == "--list") {
      for (const Sample& s : kSamples) std::printf("%s\n", s.name);
      return 0;
    } else if (arg == "--only" && i + 1 < argc) {
      std::string list = argv[++i];
      for (size_t start = 0; start <= list.size();) {
        size_t comma = list.find(',', start);
        if (comma == std::string::npos) comma = list.size();
        if (comma > start) only.push_back(list.substr(start, comma - start));
        start = comma + 1;
      }
    } else {
      only.push_back(arg);  // a subcommand: the sample's name
    }
  }
  for (const std::string& name : only) {
    bool known = false;
    for (const Sample& s : kSamples) known = known || name == s.name;
    if (!known) {
      std::fprintf(stderr, "samples: unknown sample %s (--list shows them)\n", name.c_str());
      return 2;
    }
  }
  int failed = 0, ran = 0;
  for (const Sample& s : kSamples) {
    if (!only.empty()) {
      bool wanted = false;
      for (const std::string& name : only) wanted = wanted || name == s.name;
      if (!wanted) continue;
    }
    ++ran;
    const bool ok = fork_each ? RunIsolated(s, 300) : RunSample(s);
    failed += ok ? 0 : 1;
  }
  std::printf("SAMPLES ran=%d failed=%d\n", ran, failed);
  return failed == 0 ? 0 : 1;
}
