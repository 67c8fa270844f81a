// compute_tenant: one tenant of the compute-isolation test (driven by compute_share.py).
//
// Keeps the GPU saturated open-loop: always --depth kernels queued on its stream, each spinning
// --spin-us of GPU time; block 0 logs the kernel's running segments in %globaltimer ns. After
// --seconds it writes one "start end" line per segment to --out, for the coordinator to turn
// into shares of GPU time.
//
//   compute_tenant --seconds 6 --spin-us 300 --depth 8 --out FILE
//                  [--ready-file F --go-file G]   start together with the other tenants
//                  [--launch kernel|ex|coop|graph] which submission path to use (default kernel):
//                  cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel, or a one-node
//                  CUDA graph re-pointed with cuGraphExecKernelNodeSetParams and cuGraphLaunch
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gpu_harness.h"

extern "C" const unsigned char tf_fatbin_tier_kernels[];

namespace tf::gpu {
namespace {

constexpr int kSlotWords = 8;  // TF_SEGMENTS [start, end) pairs per kernel, see tier_kernels.cu
constexpr int kThreadsPerBlock = 32;

#define TF_CHECK(call)                                                              \
  do {                                                                              \
    const CUresult rc_ = (call);                                                    \
    if (rc_ != CUDA_SUCCESS) {                                                      \
      std::fprintf(stderr, "%s failed: %s\n", #call, CuErrorName(rc_).c_str());     \
      Result("error", std::string(#call).substr(0, std::string(#call).find('(')) +  \
                          ":" + CuErrorName(rc_));                                  \
      return 1;                                                                     \
    }                                                                               \
  } while (0)

int Run(const Flags& flags) {
  const double seconds = flags.Num("seconds", 6);
  const double spin_us = flags.Num("spin-us", 300);
  const int depth = static_cast<int>(flags.Num("depth", 8));
  const std::string out_path = flags.Str("out", "");
  const std::string ready_file = flags.Str("ready-file", "");
  const std::string go_file = flags.Str("go-file", "");
  const std::string mode = flags.Str("launch", "kernel");
  if (!FlagsOk(flags)) return 2;
  if (mode != "kernel" && mode != "ex" && mode != "coop" && mode != "graph") {
    std::fprintf(stderr, "--launch must be kernel, ex, coop or graph\n");
    return 2;
  }
  if (out_path.empty() || depth < 1 || seconds <= 0 || spin_us <= 0) {
    std::fprintf(stderr, "usage: compute_tenant --seconds S --spin-us U --depth N --out FILE\n");
    return 2;
  }
  DriverSession session;
  if (!session.ok()) {
    Result("error", session.failed_call() + ":" + CuErrorName(session.rc()));
    return 1;
  }
  CUmodule module = nullptr;
  CUfunction spin = nullptr;
  TF_CHECK(LoadModule(tf_fatbin_tier_kernels, &module));
  TF_CHECK(cuModuleGetFunction(&spin, module, "tf_spin"));
  const int sms = session.Attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  const unsigned grid = sms > 0 ? static_cast<unsigned>(sms) : 1u;

  // Room for every kernel the run can launch, with margin; the loop stops early if it fills.
  const uint64_t capacity = static_cast<uint64_t>(seconds * 1e6 / spin_us * 1.5) + 1024;
  const size_t log_bytes = capacity * kSlotWords * sizeof(unsigned long long);
  CUdeviceptr log = 0;
  CUstream stream = nullptr;
  TF_CHECK(cuMemAlloc(&log, log_bytes));
  TF_CHECK(cuMemsetD8(log, 0, log_bytes));
  TF_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  std::vector<CUevent> done(depth);
  for (auto& event : done) TF_CHECK(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));

  unsigned long long busy_ns = static_cast<unsigned long long>(spin_us * 1000);
  CUgraph graph = nullptr;
  CUgraphExec graph_exec = nullptr;
  CUgraphNode graph_node = nullptr;
  CUDA_KERNEL_NODE_PARAMS node = {};
  CUdeviceptr node_slot = 0;
  void* node_params[] = {&busy_ns, &node_slot};
  if (mode == "graph") {
    node.func = spin;
    node.gridDimX = grid;
    node.gridDimY = node.gridDimZ = 1;
    node.blockDimX = kThreadsPerBlock;
    node.blockDimY = node.blockDimZ = 1;
    node.kernelParams = node_params;
    TF_CHECK(cuGraphCreate(&graph, 0));
    TF_CHECK(cuGraphAddKernelNode(&graph_node, graph, nullptr, 0, &node));
    TF_CHECK(cuGraphInstantiate(&graph_exec, graph, 0));
  }
  auto launch = [&](CUdeviceptr slot) -> CUresult {
    void* params[] = {&busy_ns, &slot};
    if (mode == "ex") {
      CUlaunchConfig config = {};
      config.gridDimX = grid;
      config.gridDimY = config.gridDimZ = 1;
      config.blockDimX = kThreadsPerBlock;
      config.blockDimY = config.blockDimZ = 1;
      config.hStream = stream;
      return cuLaunchKernelEx(&config, spin, params, nullptr);
    }
    if (mode == "coop") {
      return cuLaunchCooperativeKernel(spin, grid, 1, 1, kThreadsPerBlock, 1, 1, 0, stream, params);
    }
    if (mode == "graph") {
      node_slot = slot;
      CUresult rc = cuGraphExecKernelNodeSetParams(graph_exec, graph_node, &node);
      return rc != CUDA_SUCCESS ? rc : cuGraphLaunch(graph_exec, stream);
    }
    return cuLaunchKernel(spin, grid, 1, 1, kThreadsPerBlock, 1, 1, 0, stream, params, nullptr);
  };
  // Warm-up (module load, first-launch costs), not logged.
  for (int i = 0; i < 3; ++i) TF_CHECK(launch(0));
  TF_CHECK(cuStreamSynchronize(stream));

  const std::string pid = std::to_string(getpid());
  if (!ready_file.empty() && !WriteFileAtomic(ready_file, pid + "\n")) return 2;
  if (!go_file.empty() && !WaitForFile(go_file, 60)) {
    Result("error", "go_timeout");
    return 1;
  }

  const uint64_t start = NowNs();
  const uint64_t stop = start + static_cast<uint64_t>(seconds * 1e9);
  uint64_t launched = 0;
  while (NowNs() < stop && launched < capacity) {
    CUevent& slot_done = done[launched % depth];
    if (launched >= static_cast<uint64_t>(depth)) TF_CHECK(cuEventSynchronize(slot_done));
    TF_CHECK(launch(log + launched * kSlotWords * sizeof(unsigned long long)));
    TF_CHECK(cuEventRecord(slot_done, stream));
    ++launched;
  }
  const uint64_t loop_end = NowNs();
  TF_CHECK(cuStreamSynchronize(stream));
  const uint64_t drained = NowNs();

  std::vector<unsigned long long> host(launched * kSlotWords);
  TF_CHECK(cuMemcpyDtoH(host.data(), log, host.size() * sizeof(unsigned long long)));
  FILE* out = std::fopen(out_path.c_str(), "w");
  if (out == nullptr) {
    std::perror(out_path.c_str());
    return 2;
  }
  std::fprintf(out, "# pid=%s spin_us=%.1f depth=%d kernels=%llu\n", pid.c_str(), spin_us, depth,
               static_cast<unsigned long long>(launched));
  unsigned long long first = 0;
  unsigned long long last = 0;
  uint64_t segments = 0;
  for (uint64_t k = 0; k < launched; ++k) {
    for (int s = 0; s < kSlotWords; s += 2) {
      const unsigned long long a = host[k * kSlotWords + s];
      const unsigned long long b = host[k * kSlotWords + s + 1];
      if (a == 0 || b < a) continue;
      std::fprintf(out, "%llu %llu\n", a, b);
      if (first == 0 || a < first) first = a;
      if (b > last) last = b;
      ++segments;
    }
  }
  if (std::fclose(out) != 0) return 2;

  Result("kernels", launched);
  Result("segments", segments);
  Result("sms", static_cast<uint64_t>(grid));
  ResultF("loop_s", static_cast<double>(loop_end - start) / 1e9);
  ResultF("host_kernels_per_s", static_cast<double>(launched) * 1e9 / static_cast<double>(drained - start));
  // GPU-side throughput: kernels per second between the first start and the last end.
  if (last > first) ResultF("gpu_kernels_per_s", static_cast<double>(launched) * 1e9 / static_cast<double>(last - first));
  Result("launch", mode);
  if (graph_exec != nullptr) cuGraphExecDestroy(graph_exec);
  if (graph != nullptr) cuGraphDestroy(graph);
  for (auto& event : done) cuEventDestroy(event);
  cuStreamDestroy(stream);
  cuMemFree(log);
  cuModuleUnload(module);
  return 0;
}

}  // namespace
}  // namespace tf::gpu

int main(int argc, char** argv) {
  tf::gpu::Flags flags;
  if (!flags.Parse(argc, argv, 1)) return 2;
  return tf::gpu::Run(flags);
}
