// remote_probe mode "graphnodeaccess": graph nodes read back and changed through the getters and
// setters (events, host functions, copies, memsets, graph allocations and frees, kernel node
// attributes), the generic cuGraphNodeSetParams / cuGraphExecNodeSetParams, dependent nodes,
// nodes of clones, executable graph flags, user objects (the destroy callback runs in this
// process, once, when the last reference goes), cuGraphDebugDotPrint (the file lands here) and the
// legacy forms. Every printed value must be the same on the driver and through the worker.
#include <cuda.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "probe_util.h"

// Legacy forms (cuda.h names them for the driver's own build only).
#undef cuGraphInstantiate
#undef cuGraphAddKernelNode
#undef cuGraphKernelNodeGetParams
#undef cuGraphExecUpdate
#undef cuGraphNodeGetDependentNodes
extern "C" {
CUresult cuGraphInstantiate_v2(CUgraphExec*, CUgraph, CUgraphNode*, char*, size_t);
CUresult cuGraphAddKernelNode(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, const CUDA_KERNEL_NODE_PARAMS_v1*);
CUresult cuGraphKernelNodeGetParams(CUgraphNode, CUDA_KERNEL_NODE_PARAMS_v1*);
CUresult cuGraphExecUpdate(CUgraphExec, CUgraph, CUgraphNode*, CUgraphExecUpdateResult*);
CUresult cuGraphNodeGetDependentNodes(CUgraphNode, CUgraphNode*, size_t*);
}

namespace {

using tf_probe::Kernel;
using tf_probe::Setup;

int g_host_a = 0, g_host_b = 0;
void HostA(void* p) { ++*static_cast<int*>(p); }
void HostB(void* p) { *static_cast<int*>(p) += 10; }

std::atomic<int> g_destroyed{0};
void Destroyed(void* p) { g_destroyed += *static_cast<int*>(p); }

int Err(CUresult r) { return r == CUDA_SUCCESS ? 0 : static_cast<int>(r); }

uint32_t Read32(CUdeviceptr p, size_t index) {
  uint32_t v = 0;
  CHECK(cuMemcpyDtoH(&v, p + index * 4, 4));
  return v;
}

// Waits up to 2 s for the destroy callback (CUDA runs it asynchronously, on a thread of its own).
int WaitDestroyed(int want) {
  for (int i = 0; i < 200 && g_destroyed.load() < want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return g_destroyed.load();
}

}  // namespace

int GraphNodeAccess() {
  CUcontext ctx = Setup();
  CUfunction fill = Kernel("fill_u32");
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const size_t count = 256;
  CUdeviceptr a, b, c, d;
  for (CUdeviceptr* p : {&a, &b, &c, &d}) {
    CHECK(cuMemAlloc(p, count * 4));
    CHECK(cuMemsetD32(*p, 0, count));
  }
  CUevent ev1, ev2;
  CHECK(cuEventCreate(&ev1, 0));
  CHECK(cuEventCreate(&ev2, 0));

  // kernel(a) -> memset(b) -> memcpy(b -> c) -> record(ev1) -> wait(ev1) -> host
  CUgraph g;
  CHECK(cuGraphCreate(&g, 0));
  unsigned value = 5;
  size_t n_el = count;
  void* kargs[] = {&a, &value, &n_el};
  CUDA_KERNEL_NODE_PARAMS kp = {};
  kp.func = fill;
  kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
  kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
  kp.kernelParams = kargs;
  CUgraphNode nk, nset, ncopy, nrec, nwait, nhost;
  CHECK(cuGraphAddKernelNode(&nk, g, nullptr, 0, reinterpret_cast<CUDA_KERNEL_NODE_PARAMS_v1*>(&kp)));
  CUDA_MEMSET_NODE_PARAMS ms = {};
  ms.dst = b;
  ms.value = 0x11;
  ms.elementSize = 4;
  ms.width = count;
  ms.height = 1;
  CHECK(cuGraphAddMemsetNode(&nset, g, &nk, 1, &ms, ctx));
  CUDA_MEMCPY3D cp = {};
  cp.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  cp.srcDevice = b;
  cp.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  cp.dstDevice = c;
  cp.WidthInBytes = count * 4;
  cp.Height = 1;
  cp.Depth = 1;
  CHECK(cuGraphAddMemcpyNode(&ncopy, g, &nset, 1, &cp, ctx));
  CHECK(cuGraphAddEventRecordNode(&nrec, g, &ncopy, 1, ev1));
  CHECK(cuGraphAddEventWaitNode(&nwait, g, &nrec, 1, ev1));
  CUDA_HOST_NODE_PARAMS hp = {HostA, &g_host_a};
  CHECK(cuGraphAddHostNode(&nhost, g, &nwait, 1, &hp));

  // Events: the handles this program made come back.
  CUevent got = nullptr, got2 = nullptr;
  CHECK(cuGraphEventRecordNodeGetEvent(nrec, &got));
  CHECK(cuGraphEventWaitNodeGetEvent(nwait, &got2));
  std::printf("event_get=%d,%d\n", got == ev1, got2 == ev1);
  CHECK(cuGraphEventRecordNodeSetEvent(nrec, ev2));
  CHECK(cuGraphEventWaitNodeSetEvent(nwait, ev2));
  CHECK(cuGraphEventRecordNodeGetEvent(nrec, &got));
  CHECK(cuGraphEventWaitNodeGetEvent(nwait, &got2));
  std::printf("event_set=%d,%d\n", got == ev2, got2 == ev2);

  // Host nodes: this program's function and argument.
  CUDA_HOST_NODE_PARAMS hg = {};
  CHECK(cuGraphHostNodeGetParams(nhost, &hg));
  std::printf("host_get=%d,%d\n", hg.fn == HostA, hg.userData == &g_host_a);
  CUDA_HOST_NODE_PARAMS hb = {HostB, &g_host_b};
  CHECK(cuGraphHostNodeSetParams(nhost, &hb));
  CHECK(cuGraphHostNodeGetParams(nhost, &hg));
  std::printf("host_set=%d,%d\n", hg.fn == HostB, hg.userData == &g_host_b);

  // Copies and memsets.
  CUDA_MEMCPY3D cg = {};
  CHECK(cuGraphMemcpyNodeGetParams(ncopy, &cg));
  std::printf("copy_get=%d,%d,%d,%d,%zu,%zu,%zu\n", cg.srcMemoryType, cg.dstMemoryType, cg.srcDevice == b,
              cg.dstDevice == c, cg.WidthInBytes, cg.Height, cg.Depth);
  cp.dstDevice = d;
  cp.WidthInBytes = count * 2;
  CHECK(cuGraphMemcpyNodeSetParams(ncopy, &cp));
  CHECK(cuGraphMemcpyNodeGetParams(ncopy, &cg));
  std::printf("copy_set=%d,%zu\n", cg.dstDevice == d, cg.WidthInBytes);
  CUDA_MEMSET_NODE_PARAMS mg = {};
  CHECK(cuGraphMemsetNodeGetParams(nset, &mg));
  std::printf("memset_get=%d,%u,%u,%zu,%zu\n", mg.dst == b, mg.value, mg.elementSize, mg.width, mg.height);
  ms.value = 0x22;
  CHECK(cuGraphMemsetNodeSetParams(nset, &ms));
  CHECK(cuGraphMemsetNodeGetParams(nset, &mg));
  std::printf("memset_set=%u\n", mg.value);

  // The generic setter: the memset's value through CUgraphNodeParams.
  CUgraphNodeParams np = {};
  np.type = CU_GRAPH_NODE_TYPE_MEMSET;
  np.memset.dst = b;
  np.memset.value = 0x33;
  np.memset.elementSize = 4;
  np.memset.width = count;
  np.memset.height = 1;
  np.memset.ctx = ctx;
  CHECK(cuGraphNodeSetParams(nset, &np));
  CHECK(cuGraphMemsetNodeGetParams(nset, &mg));
  std::printf("node_set_params=%u\n", mg.value);

  // Kernel node attributes.
  CUkernelNodeAttrValue av;
  memset(&av, 0, sizeof(av));
  av.priority = 3;
  CHECK(cuGraphKernelNodeSetAttribute(nk, CU_LAUNCH_ATTRIBUTE_PRIORITY, &av));
  memset(&av, 0, sizeof(av));
  CHECK(cuGraphKernelNodeGetAttribute(nk, CU_LAUNCH_ATTRIBUTE_PRIORITY, &av));
  CUgraphNode nk2;
  CUDA_KERNEL_NODE_PARAMS kp2 = kp;
  CHECK(cuGraphAddKernelNode_v2(&nk2, g, nullptr, 0, &kp2));
  CHECK(cuGraphKernelNodeCopyAttributes(nk2, nk));
  CUkernelNodeAttrValue av2;
  memset(&av2, 0, sizeof(av2));
  CHECK(cuGraphKernelNodeGetAttribute(nk2, CU_LAUNCH_ATTRIBUTE_PRIORITY, &av2));
  std::printf("kernel_attr=%d,%d\n", av.priority, av2.priority);
  CHECK(cuGraphDestroyNode(nk2));

  // Legacy kernel node parameters.
  CUDA_KERNEL_NODE_PARAMS_v1 k1 = {};
  CHECK(cuGraphKernelNodeGetParams(nk, &k1));
  std::printf("legacy_kernel_get=%d,%u,%u\n", k1.func == fill, k1.gridDimX, k1.blockDimX);

  // Dependent nodes (v2 and legacy).
  CUgraphNode dn[4] = {};
  size_t ndn = 4;
  CHECK(cuGraphNodeGetDependentNodes_v2(nset, dn, nullptr, &ndn));
  size_t ncount = 0;
  CHECK(cuGraphNodeGetDependentNodes(nk, nullptr, &ncount));
  std::printf("dependents=%zu,%d,%zu\n", ndn, ndn == 1 && dn[0] == ncopy, ncount);

  // Clones: the copy of a node, and a node that is not of the original.
  CUgraph cl;
  CHECK(cuGraphClone(&cl, g));
  CUgraphNode in_clone = nullptr;
  CHECK(cuGraphNodeFindInClone(&in_clone, nset, cl));
  CUgraphNodeType t = CU_GRAPH_NODE_TYPE_EMPTY;
  CHECK(cuGraphNodeGetType(in_clone, &t));
  CUDA_MEMSET_NODE_PARAMS cms = {};
  CHECK(cuGraphMemsetNodeGetParams(in_clone, &cms));
  CUgraphNode none = nullptr;
  std::printf("find_in_clone=%d,%d,%u,%d\n", in_clone != nset, t, cms.value,
              Err(cuGraphNodeFindInClone(&none, in_clone, cl)) != 0);
  CHECK(cuGraphDestroy(cl));

  // Instantiate (flags come back), change the executable graph, launch.
  CUgraphExec e;
  CHECK(cuGraphInstantiateWithFlags(&e, g, CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY));
  cuuint64_t flags = 0;
  CHECK(cuGraphExecGetFlags(e, &flags));
  std::printf("exec_flags=%llu\n", static_cast<unsigned long long>(flags));
  CUgraphNodeParams ep = {};
  ep.type = CU_GRAPH_NODE_TYPE_KERNEL;
  unsigned value9 = 9;
  void* kargs9[] = {&a, &value9, &n_el};
  ep.kernel.func = fill;
  ep.kernel.gridDimX = ep.kernel.gridDimY = ep.kernel.gridDimZ = 1;
  ep.kernel.blockDimX = ep.kernel.blockDimY = ep.kernel.blockDimZ = 1;
  ep.kernel.kernelParams = kargs9;
  CHECK(cuGraphExecNodeSetParams(e, nk, &ep));
  np.memset.value = 0x44;
  CHECK(cuGraphExecNodeSetParams(e, nset, &np));
  CHECK(cuGraphLaunch(e, s));
  CHECK(cuStreamSynchronize(s));
  std::printf("run=%u,%u,%u,%u,%d,%d\n", Read32(a, 0), Read32(b, count - 1), Read32(d, 0),
              Read32(d, count / 2), g_host_a, g_host_b);

  // Legacy instantiate and update.
  CUgraphExec e2;
  CUgraphNode err_node = nullptr;
  char log[64] = "x";
  CHECK(cuGraphInstantiate_v2(&e2, g, &err_node, log, sizeof(log)));
  CUgraphExecUpdateResult ur = CU_GRAPH_EXEC_UPDATE_ERROR;
  CHECK(cuGraphExecUpdate(e2, g, &err_node, &ur));
  std::printf("legacy_instantiate=%d,%d,%d\n", err_node == nullptr, log[0] == '\0', ur);
  CHECK(cuGraphExecDestroy(e2));

  // Graph allocation and free nodes.
  CUgraph ga;
  CHECK(cuGraphCreate(&ga, 0));
  CUDA_MEM_ALLOC_NODE_PARAMS alloc = {};
  alloc.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  alloc.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  alloc.poolProps.location.id = 0;
  CUmemAccessDesc acc = {};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  alloc.accessDescs = &acc;
  alloc.accessDescCount = 1;
  alloc.bytesize = 8192;
  CUgraphNode nalloc, nfree;
  CHECK(cuGraphAddMemAllocNode(&nalloc, ga, nullptr, 0, &alloc));
  CHECK(cuGraphAddMemFreeNode(&nfree, ga, &nalloc, 1, alloc.dptr));
  CUDA_MEM_ALLOC_NODE_PARAMS ag = {};
  CHECK(cuGraphMemAllocNodeGetParams(nalloc, &ag));
  CUdeviceptr freed = 0;
  CHECK(cuGraphMemFreeNodeGetParams(nfree, &freed));
  std::printf("alloc_get=%zu,%d,%d,%zu,%d,%d\n", ag.bytesize, ag.poolProps.location.id, ag.dptr == alloc.dptr,
              ag.accessDescCount, ag.accessDescCount == 1 && ag.accessDescs[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
              freed == alloc.dptr);
  CHECK(cuGraphDestroy(ga));

  // A child graph node's graph.
  CUgraph child, got_child = nullptr;
  CHECK(cuGraphCreate(&child, 0));
  CUgraphNode cn, nchild;
  CHECK(cuGraphAddEmptyNode(&cn, child, nullptr, 0));
  CHECK(cuGraphAddChildGraphNode(&nchild, g, nullptr, 0, child));
  CHECK(cuGraphChildGraphNodeGetGraph(nchild, &got_child));
  std::printf("child_graph=%d\n", got_child != nullptr && got_child != child);

  // An executable graph's event nodes and a node's enabled state: a node of another graph fails.
  CHECK(cuGraphExecEventRecordNodeSetEvent(e, nrec, ev1));
  CHECK(cuGraphExecEventWaitNodeSetEvent(e, nwait, ev1));
  unsigned enabled_state = 7;
  CHECK(cuGraphNodeGetEnabled(e, nset, &enabled_state));
  std::printf("exec_events=%u,%d,%d,%d,%d\n", enabled_state, Err(cuGraphExecEventRecordNodeSetEvent(e, nrec, nullptr)),
              Err(cuGraphExecEventWaitNodeSetEvent(e, cn, ev1)), Err(cuGraphNodeGetEnabled(e, cn, &enabled_state)),
              Err(cuGraphNodeSetEnabled(e, cn, 0)));
  CHECK(cuDeviceGraphMemTrim(0));
  std::printf("graph_mem_trim=%d\n", Err(cuDeviceGraphMemTrim(99)));
  // Graph memory attributes (8-byte values): the high watermarks reset to 0 only; a device the
  // session lacks, an undefined attribute and a NULL value are refused.
  cuuint64_t high = 7, reset = 0, nonzero = 1;
  CHECK(cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &reset));
  CHECK(cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &high));
  std::printf("graph_mem_attr=%llu,%d,%d,%d,%d,%d\n", static_cast<unsigned long long>(high),
              Err(cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH, &nonzero)),
              Err(cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &reset)),
              Err(cuDeviceGetGraphMemAttribute(99, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &high)),
              Err(cuDeviceGetGraphMemAttribute(0, static_cast<CUgraphMem_attribute>(77), &high)),
              Err(cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, nullptr)));

  // cuGraphDebugDotPrint: the file lands where this program said.
  std::string path = "/tmp/tf-graph-dot-" + std::to_string(getpid()) + ".dot";
  unlink(path.c_str());
  CHECK(cuGraphDebugDotPrint(g, path.c_str(), CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE));
  std::ifstream in(path);
  std::stringstream dot;
  dot << in.rdbuf();
  const std::string text = dot.str();
  size_t arrows = 0;
  for (size_t p = text.find("->"); p != std::string::npos; p = text.find("->", p + 2)) ++arrows;
  std::printf("dot=%d,%d,%zu\n", !text.empty(), text.find("digraph") != std::string::npos, arrows);
  unlink(path.c_str());
  std::printf("dot_bad_dir=%d\n", Err(cuGraphDebugDotPrint(g, "/nonexistent-dir/x.dot", 0)));
  std::printf("dot_bad_flags=%d\n", Err(cuGraphDebugDotPrint(g, path.c_str(), 1u << 20)));
  unlink(path.c_str());

  // User objects: the graph takes this program's reference; an executable graph keeps the
  // object alive after the graph is gone; the callback runs once, here, when the last goes.
  int weight = 1;
  CUuserObject uo;
  CHECK(cuUserObjectCreate(&uo, &weight, Destroyed, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
  CUgraph gu;
  CHECK(cuGraphCreate(&gu, 0));
  CUgraphNode ne;
  CHECK(cuGraphAddEmptyNode(&ne, gu, nullptr, 0));
  CHECK(cuGraphRetainUserObject(gu, uo, 1, CU_GRAPH_USER_OBJECT_MOVE));
  CUgraphExec eu;
  CHECK(cuGraphInstantiateWithFlags(&eu, gu, 0));
  CHECK(cuGraphDestroy(gu));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const int after_graph = g_destroyed.load();
  CHECK(cuGraphLaunch(eu, s));
  CHECK(cuStreamSynchronize(s));
  CHECK(cuGraphExecDestroy(eu));
  const int after_exec = WaitDestroyed(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::printf("user_object=%d,%d,%d\n", after_graph, after_exec, g_destroyed.load());
  // Retain and release by the program, and a release beyond its references.
  int weight10 = 10;
  CUuserObject uo2;
  CHECK(cuUserObjectCreate(&uo2, &weight10, Destroyed, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
  CHECK(cuUserObjectRetain(uo2, 2));
  const int over = Err(cuUserObjectRelease(uo2, 4));
  CHECK(cuUserObjectRelease(uo2, 2));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const int before_last = g_destroyed.load();
  CHECK(cuUserObjectRelease(uo2, 1));
  std::printf("user_object_refs=%d,%d,%d\n", over, before_last, WaitDestroyed(11));
  // A graph's references: given, a release beyond them, counts of 0, an undefined flag, released,
  // and released again once none is left; the program's last reference then destroys the object.
  int weight100 = 100;
  CUuserObject uo3;
  CHECK(cuUserObjectCreate(&uo3, &weight100, Destroyed, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
  CUgraph gr;
  CHECK(cuGraphCreate(&gr, 0));
  CHECK(cuGraphRetainUserObject(gr, uo3, 2, 0));
  const int beyond = Err(cuGraphReleaseUserObject(gr, uo3, 3));
  const int zero = Err(cuGraphReleaseUserObject(gr, uo3, 0));
  const int zero_retain = Err(cuUserObjectRetain(uo3, 0));
  const int bad_flag = Err(cuGraphRetainUserObject(gr, uo3, 1, 2));
  const int released = Err(cuGraphReleaseUserObject(gr, uo3, 2));
  const int none_left = Err(cuGraphReleaseUserObject(gr, uo3, 1));
  CHECK(cuUserObjectRelease(uo3, 1));
  std::printf("user_object_graph_refs=%d,%d,%d,%d,%d,%d,%d\n", beyond, zero, zero_retain, bad_flag, released,
              none_left, WaitDestroyed(111));
  CHECK(cuGraphDestroy(gr));
  CUuserObject bad_uo;
  std::printf("user_object_bad=%d,%d\n",
              Err(cuUserObjectCreate(&bad_uo, &weight, Destroyed, 1, 0)),
              Err(cuUserObjectCreate(&bad_uo, &weight, nullptr, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC)));

  // Bad input fails that call only.
  CUevent none_ev = nullptr;
  CUkernelNodeAttrValue bad_av;
  std::printf("bad_null_out=%d\n", Err(cuGraphEventRecordNodeGetEvent(nrec, nullptr)));
  std::printf("bad_wrong_type=%d\n", Err(cuGraphEventRecordNodeGetEvent(nset, &none_ev)));
  std::printf("bad_forged_node=%d\n",
              Err(cuGraphMemsetNodeGetParams(reinterpret_cast<CUgraphNode>(0x1234000), &mg)));
  std::printf("bad_attr=%d,%d\n", Err(cuGraphKernelNodeGetAttribute(nk, static_cast<CUkernelNodeAttrID>(99), &bad_av)),
              Err(cuGraphKernelNodeSetAttribute(nk, CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT, &bad_av)));
  std::printf("bad_exec_flags=%d\n", Err(cuGraphExecGetFlags(e, nullptr)));
  CUgraphNodeParams bad_np = {};
  bad_np.type = CU_GRAPH_NODE_TYPE_MEM_FREE;
  std::printf("bad_node_set_type=%d\n", Err(cuGraphNodeSetParams(nset, &bad_np)) != 0);
  CHECK(cuGraphMemsetNodeGetParams(nset, &mg));
  std::printf("after_bad=%u\n", mg.value);

  CHECK(cuGraphExecDestroy(e));
  CHECK(cuGraphDestroy(g));
  CHECK(cuGraphDestroy(child));
  std::printf("done=1\n");
  return 0;
}
