// rt_smoke: a runtime-API program (static cudart) that must behave the same natively and under
// the limiter: kernel launches with <<<>>>, copies, a captured CUDA graph replayed, and
// cudaMemGetInfo. Prints RESULT lines; exit 0 when every check passed.
//
//   rt_smoke [LIMIT_BYTES]   with a limit, cudaMemGetInfo's total must equal it (to the MiB)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

__global__ void Saxpy(int n, float a, const float* x, float* y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

bool Check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    std::printf("RESULT error=%s:%s\n", what, cudaGetErrorName(rc));
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const unsigned long long limit = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 0;
  constexpr int kN = 1 << 24;
  constexpr int kGraphLaunches = 10;
  constexpr int kKernelsPerGraph = 10;
  std::vector<float> x(kN, 1.0f);
  std::vector<float> y(kN, 2.0f);
  float* dx = nullptr;
  float* dy = nullptr;
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  const unsigned blocks = (kN + 255) / 256;
  bool ok = Check(cudaMalloc(&dx, kN * sizeof(float)), "cudaMalloc") &&
            Check(cudaMalloc(&dy, kN * sizeof(float)), "cudaMalloc") &&
            Check(cudaMemcpy(dx, x.data(), kN * sizeof(float), cudaMemcpyHostToDevice), "HtoD") &&
            Check(cudaMemcpy(dy, y.data(), kN * sizeof(float), cudaMemcpyHostToDevice), "HtoD") &&
            Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  if (ok) {
    Saxpy<<<blocks, 256, 0, stream>>>(kN, 3.0f, dx, dy);  // y = 5
    ok = Check(cudaGetLastError(), "launch") &&
         Check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "capture");
  }
  if (ok) {
    for (int i = 0; i < kKernelsPerGraph; ++i) Saxpy<<<blocks, 256, 0, stream>>>(kN, 0.5f, dx, dy);
    ok = Check(cudaStreamEndCapture(stream, &graph), "end_capture") &&
         Check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  }
  for (int i = 0; ok && i < kGraphLaunches; ++i) ok = Check(cudaGraphLaunch(exec, stream), "graph_launch");
  ok = ok && Check(cudaStreamSynchronize(stream), "sync") &&
       Check(cudaMemcpy(y.data(), dy, kN * sizeof(float), cudaMemcpyDeviceToHost), "DtoH");
  // 5 + 10 graphs * 10 kernels * 0.5: every value is exactly representable.
  const float expected = 5.0f + 0.5f * kGraphLaunches * kKernelsPerGraph;
  int wrong = 0;
  for (int i = 0; ok && i < kN; ++i) wrong += y[i] != expected;
  std::printf("RESULT values_wrong=%d\n", wrong);
  size_t free = 0;
  size_t total = 0;
  ok = ok && Check(cudaMemGetInfo(&free, &total), "mem_get_info");
  std::printf("RESULT total_mib=%zu\nRESULT free_mib=%zu\n", total >> 20, free >> 20);
  const bool total_ok = limit == 0 || (total >> 20) == (limit >> 20);
  if (!total_ok) std::printf("RESULT reason=total_is_not_the_limit\n");
  const bool pass = ok && wrong == 0 && total_ok;
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (stream != nullptr) cudaStreamDestroy(stream);
  cudaFree(dx);
  cudaFree(dy);
  std::printf("RESULT verdict=%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
