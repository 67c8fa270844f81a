// Samples of the graph node surface (docs/remote.md "Graphs"): a graph's nodes read back through
// the getters, changed through the setters and cudaGraphExecNodeSetParams, then launched; a user
// object destroyed once, after the last executable graph holding it; cudaGraphDebugDotPrint's file.
// What must be equal natively and remotely: the launch's output and the counts the samples see.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "samples.h"

namespace {

__global__ void gn_scale(const float* in, float* out, int n, float f) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * f;
}

void CountUp(void* p) { ++*static_cast<int*>(p); }

std::atomic<int> g_released{0};
void Release(void* p) { g_released += *static_cast<int*>(p); }

}  // namespace

TF_SAMPLE(graph_nodes_get_set) {
  const int n = 1024;
  std::vector<float> host(n);
  for (int i = 0; i < n; ++i) host[i] = tf_samples::Input(i, 1);
  float *in = nullptr, *out = nullptr, *copy = nullptr, *zeroed = nullptr;
  RT(o, cudaMalloc(&in, n * sizeof(float)));
  RT(o, cudaMalloc(&out, n * sizeof(float)));
  RT(o, cudaMalloc(&copy, n * sizeof(float)));
  RT(o, cudaMalloc(&zeroed, n * sizeof(float)));
  RT(o, cudaMemcpy(in, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  cudaStream_t s;
  RT(o, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t ev1, ev2;
  RT(o, cudaEventCreate(&ev1));
  RT(o, cudaEventCreate(&ev2));

  // kernel(in -> out) -> memset(zeroed) -> memcpy(out -> copy) -> event record -> host
  cudaGraph_t g;
  RT(o, cudaGraphCreate(&g, 0));
  int n_arg = n;
  float f = 2.0f;
  void* args[] = {&in, &out, &n_arg, &f};
  cudaKernelNodeParams kp = {};
  kp.func = reinterpret_cast<void*>(gn_scale);
  kp.gridDim = dim3((n + 255) / 256);
  kp.blockDim = dim3(256);
  kp.kernelParams = args;
  cudaGraphNode_t nk, nset, ncopy, nrec, nhost;
  RT(o, cudaGraphAddKernelNode(&nk, g, nullptr, 0, &kp));
  cudaMemsetParams mp = {};
  mp.dst = zeroed;
  mp.value = 0x3f800000u;  // 1.0f
  mp.elementSize = 4;
  mp.width = n;
  mp.height = 1;
  RT(o, cudaGraphAddMemsetNode(&nset, g, &nk, 1, &mp));
  RT(o, cudaGraphAddMemcpyNode1D(&ncopy, g, &nset, 1, copy, out, n * sizeof(float), cudaMemcpyDeviceToDevice));
  RT(o, cudaGraphAddEventRecordNode(&nrec, g, &ncopy, 1, ev1));
  int runs_a = 0, runs_b = 0;
  cudaHostNodeParams hp = {CountUp, &runs_a};
  RT(o, cudaGraphAddHostNode(&nhost, g, &nrec, 1, &hp));

  // Getters: what was given comes back.
  cudaKernelNodeParams kg = {};
  RT(o, cudaGraphKernelNodeGetParams(nk, &kg));
  if (kg.gridDim.x != kp.gridDim.x || kg.blockDim.x != 256) o.Fail("kernel node geometry differs");
  cudaMemsetParams mg = {};
  RT(o, cudaGraphMemsetNodeGetParams(nset, &mg));
  if (mg.dst != zeroed || mg.value != mp.value || mg.width != static_cast<size_t>(n)) o.Fail("memset node differs");
  cudaMemcpy3DParms cg = {};
  RT(o, cudaGraphMemcpyNodeGetParams(ncopy, &cg));
  if (cg.extent.width * cg.extent.height * cg.extent.depth != n * sizeof(float)) o.Fail("memcpy node extent differs");
  cudaEvent_t got = nullptr;
  RT(o, cudaGraphEventRecordNodeGetEvent(nrec, &got));
  if (got != ev1) o.Fail("event record node's event differs");
  cudaHostNodeParams hg = {};
  RT(o, cudaGraphHostNodeGetParams(nhost, &hg));
  if (hg.fn != CountUp || hg.userData != &runs_a) o.Fail("host node differs");
  size_t dependents = 0;
  RT(o, cudaGraphNodeGetDependentNodes(nk, nullptr, nullptr, &dependents));
  if (dependents != 1) o.Fail("the kernel node has one dependent");

  // Setters on the graph: another factor, memset value, event and host argument.
  f = 3.0f;
  RT(o, cudaGraphKernelNodeSetParams(nk, &kp));
  mp.value = 0x40000000u;  // 2.0f
  RT(o, cudaGraphMemsetNodeSetParams(nset, &mp));
  RT(o, cudaGraphEventRecordNodeSetEvent(nrec, ev2));
  RT(o, cudaGraphEventRecordNodeGetEvent(nrec, &got));
  if (got != ev2) o.Fail("event record node's event not set");
  cudaHostNodeParams hb = {CountUp, &runs_b};
  RT(o, cudaGraphHostNodeSetParams(nhost, &hb));
  cudaLaunchAttributeValue av = {};
  av.priority = 0;
  RT(o, cudaGraphKernelNodeSetAttribute(nk, cudaLaunchAttributePriority, &av));
  cudaLaunchAttributeValue ag = {};
  RT(o, cudaGraphKernelNodeGetAttribute(nk, cudaLaunchAttributePriority, &ag));
  if (ag.priority != av.priority) o.Fail("kernel node priority differs");

  cudaGraphExec_t e;
  RT(o, cudaGraphInstantiate(&e, g, cudaGraphInstantiateFlagUseNodePriority));
  unsigned long long flags = 0;
  RT(o, cudaGraphExecGetFlags(e, &flags));
  // What the driver reports differs from what was asked (an H100 and an H200 with driver 580 leave
  // UseNodePriority out): compared with native through the result, not against the request.
  o.Result(&flags, sizeof(flags));
  // The executable graph's kernel: factor 5 through the generic setter.
  float f5 = 5.0f;
  void* args5[] = {&in, &out, &n_arg, &f5};
  cudaGraphNodeParams np = {};
  np.type = cudaGraphNodeTypeKernel;
  np.kernel.func = reinterpret_cast<void*>(gn_scale);
  np.kernel.gridDim = kp.gridDim;
  np.kernel.blockDim = kp.blockDim;
  np.kernel.kernelParams = args5;
  RT(o, cudaGraphExecNodeSetParams(e, nk, &np));
  RT(o, cudaGraphLaunch(e, s));
  RT(o, cudaGraphLaunch(e, s));
  RT(o, cudaStreamSynchronize(s));
  std::vector<float> got_copy(n), got_zeroed(n);
  RT(o, cudaMemcpy(got_copy.data(), copy, n * sizeof(float), cudaMemcpyDeviceToHost));
  RT(o, cudaMemcpy(got_zeroed.data(), zeroed, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    if (got_copy[i] != host[i] * 5.0f || got_zeroed[i] != 2.0f) {
      o.Fail("graph output differs at " + std::to_string(i));
      break;
    }
  }
  if (runs_a != 0 || runs_b != 2) o.Fail("host node runs: " + std::to_string(runs_a) + "," + std::to_string(runs_b));
  o.Result(got_copy.data(), n * sizeof(float));
  o.Result(got_zeroed.data(), n * sizeof(float));
  o.Result(&runs_b, sizeof(runs_b));
  cudaGraphExecDestroy(e);
  cudaGraphDestroy(g);
  cudaEventDestroy(ev1);
  cudaEventDestroy(ev2);
  cudaStreamDestroy(s);
  cudaFree(in);
  cudaFree(out);
  cudaFree(copy);
  cudaFree(zeroed);
}

// The graph takes the program's reference; the executable graph keeps the object after the graph
// is destroyed; the destroy callback runs once when the executable graph goes (CUDA may run it on
// a thread of its own, a little later: the sample waits up to a second).
TF_SAMPLE(graph_nodes_user_object) {
  g_released = 0;
  int weight = 1;
  cudaUserObject_t obj;
  RT(o, cudaUserObjectCreate(&obj, &weight, Release, 1, cudaUserObjectNoDestructorSync));
  cudaGraph_t g;
  RT(o, cudaGraphCreate(&g, 0));
  cudaGraphNode_t empty;
  RT(o, cudaGraphAddEmptyNode(&empty, g, nullptr, 0));
  RT(o, cudaGraphRetainUserObject(g, obj, 1, cudaGraphUserObjectMove));
  cudaGraphExec_t e;
  RT(o, cudaGraphInstantiate(&e, g, 0));
  RT(o, cudaGraphLaunch(e, 0));
  RT(o, cudaStreamSynchronize(0));
  RT(o, cudaGraphDestroy(g));
  const int after_graph = g_released.load();
  RT(o, cudaGraphExecDestroy(e));
  RT(o, cudaDeviceSynchronize());
  for (int i = 0; i < 100 && g_released.load() < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int released[2] = {after_graph, g_released.load()};
  if (released[0] != 0 || released[1] != 1) {
    o.Fail("destroy callback runs: " + std::to_string(released[0]) + "," + std::to_string(released[1]));
  }
  o.Result(released, sizeof(released));
}

// The DOT file lands where the program asked (remotely: on the program's machine).
TF_SAMPLE(graph_nodes_dot_print) {
  float* buf = nullptr;
  RT(o, cudaMalloc(&buf, 4096));
  cudaGraph_t g;
  RT(o, cudaGraphCreate(&g, 0));
  cudaMemsetParams mp = {};
  mp.dst = buf;
  mp.elementSize = 4;
  mp.width = 1024;
  mp.height = 1;
  cudaGraphNode_t a, b;
  RT(o, cudaGraphAddMemsetNode(&a, g, nullptr, 0, &mp));
  RT(o, cudaGraphAddEmptyNode(&b, g, &a, 1));
  const std::string path = "/tmp/tf-sample-graph-" + std::to_string(getpid()) + ".dot";
  unlink(path.c_str());
  RT(o, cudaGraphDebugDotPrint(g, path.c_str(), cudaGraphDebugDotFlagsVerbose));
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  unlink(path.c_str());
  const int seen[2] = {!text.str().empty(), text.str().find("digraph") != std::string::npos};
  if (!seen[0] || !seen[1]) o.Fail("the DOT file is empty or not a digraph");
  o.Result(seen, sizeof(seen));
  cudaGraphDestroy(g);
  cudaFree(buf);
}
