// Fake driver: getters and setters of graph nodes, the generic cuGraphNodeSetParams and
// cuGraphExecNodeSetParams, kernel node attributes, dependent nodes, nodes of clones, the flags of
// an executable graph, user objects, cuGraphDebugDotPrint and the legacy forms of graph calls.
// Setters change the graph node only: executable graphs keep what they were instantiated with.
#include <cstdio>
#include <cstring>

#include "fake_driver.h"

using fakecuda::Driver;
using fakecuda::Graph;
using fakecuda::GraphExec;
using fakecuda::GraphNode;
using fakecuda::GraphNodeKind;

namespace fakecuda {

struct UserObject {
  void* ptr = nullptr;
  CUhostFn destroy = nullptr;
  unsigned refs = 0;
};

namespace {
std::mutex g_uo_mu;  // guards every UserObject's refs and the live set
std::set<UserObject*>& LiveUserObjects() {
  static auto* s = new std::set<UserObject*>();
  return *s;
}

// Drops n references; runs the destroy callback (without the lock) when none is left.
void Drop(UserObject* o, unsigned n) {
  CUhostFn destroy = nullptr;
  void* ptr = nullptr;
  {
    std::lock_guard<std::mutex> l(g_uo_mu);
    if (!LiveUserObjects().count(o)) return;
    o->refs = n >= o->refs ? 0 : o->refs - n;
    if (o->refs > 0) return;
    LiveUserObjects().erase(o);
    destroy = o->destroy;
    ptr = o->ptr;
  }
  delete o;
  destroy(ptr);
}
}  // namespace

void RetainUserRefs(const UserRefs& refs) {
  std::lock_guard<std::mutex> l(g_uo_mu);
  for (auto& [o, n] : refs) {
    if (LiveUserObjects().count(o)) o->refs += n;
  }
}

void ReleaseUserRefs(const UserRefs& refs) {
  for (auto& [o, n] : refs) Drop(o, n);
}

}  // namespace fakecuda

namespace {

// The graph holding `node` (top-level graphs only), or nullptr. REQUIRES mu.
Graph* Owner(Driver& d, const GraphNode* node) {
  for (auto& [g, owned] : d.graphs) {
    for (auto& n : owned->nodes) {
      if (n.get() == node) return g;
    }
  }
  return nullptr;
}

// A node of a live graph with the given kind, or nullptr. REQUIRES mu.
GraphNode* NodeOf(Driver& d, CUgraphNode handle, GraphNodeKind kind) {
  auto* node = reinterpret_cast<GraphNode*>(handle);
  return Owner(d, node) != nullptr && node->kind == kind ? node : nullptr;
}

bool LiveEvent(Driver& d, CUevent e) { return d.events.count(reinterpret_cast<fakecuda::Event*>(e)) != 0; }

CUresult GetEvent(CUgraphNode handle, CUevent* out, GraphNodeKind kind) {
  FAKECUDA_ENTER();
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  GraphNode* n = NodeOf(d, handle, kind);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *out = n->event;
  return CUDA_SUCCESS;
}

CUresult SetEvent(CUgraphNode handle, CUevent event, GraphNodeKind kind) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  if (!LiveEvent(d, event)) return CUDA_ERROR_INVALID_HANDLE;
  GraphNode* n = NodeOf(d, handle, kind);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  n->event = event;
  return CUDA_SUCCESS;
}

// Attributes a kernel node takes (the launch-only ones, and those naming events, are refused).
bool NodeAttribute(int id) {
  switch (id) {
    case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
    case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
    case CU_LAUNCH_ATTRIBUTE_PRIORITY:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
    case CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION:
      return true;
    default:
      return false;
  }
}

const char* KindName(GraphNodeKind k) {
  switch (k) {
    case GraphNodeKind::kKernel: return "kernel";
    case GraphNodeKind::kMemAlloc: return "mem_alloc";
    case GraphNodeKind::kMemFree: return "mem_free";
    case GraphNodeKind::kMemcpy: return "memcpy";
    case GraphNodeKind::kMemset: return "memset";
    case GraphNodeKind::kHost: return "host";
    case GraphNodeKind::kEmpty: return "empty";
    case GraphNodeKind::kEventRecord: return "event_record";
    case GraphNodeKind::kEventWait: return "event_wait";
    case GraphNodeKind::kChildGraph: return "graph";
    case GraphNodeKind::kConditional: return "conditional";
  }
  return "?";
}

}  // namespace

CUresult cuGraphEventRecordNodeGetEvent(CUgraphNode node, CUevent* out) {
  return GetEvent(node, out, GraphNodeKind::kEventRecord);
}
CUresult cuGraphEventWaitNodeGetEvent(CUgraphNode node, CUevent* out) {
  return GetEvent(node, out, GraphNodeKind::kEventWait);
}
CUresult cuGraphEventRecordNodeSetEvent(CUgraphNode node, CUevent event) {
  return SetEvent(node, event, GraphNodeKind::kEventRecord);
}
CUresult cuGraphEventWaitNodeSetEvent(CUgraphNode node, CUevent event) {
  return SetEvent(node, event, GraphNodeKind::kEventWait);
}

CUresult cuGraphHostNodeGetParams(CUgraphNode handle, CUDA_HOST_NODE_PARAMS* params) {
  FAKECUDA_ENTER();
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  GraphNode* n = NodeOf(d, handle, GraphNodeKind::kHost);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *params = n->host;
  return CUDA_SUCCESS;
}

CUresult cuGraphHostNodeSetParams(CUgraphNode handle, const CUDA_HOST_NODE_PARAMS* params) {
  FAKECUDA_ENTER();
  if (params == nullptr || params->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  GraphNode* n = NodeOf(d, handle, GraphNodeKind::kHost);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  n->host = *params;
  return CUDA_SUCCESS;
}

CUresult cuGraphMemcpyNodeSetParams(CUgraphNode handle, const CUDA_MEMCPY3D* params) {
  FAKECUDA_ENTER();
  if (params == nullptr || params->WidthInBytes == 0 || params->Height == 0 || params->Depth == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  GraphNode* n = NodeOf(d, handle, GraphNodeKind::kMemcpy);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  n->copy = *params;
  return CUDA_SUCCESS;
}

CUresult cuGraphMemsetNodeGetParams(CUgraphNode handle, CUDA_MEMSET_NODE_PARAMS* params) {
  FAKECUDA_ENTER();
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  GraphNode* n = NodeOf(d, handle, GraphNodeKind::kMemset);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *params = n->memset;
  return CUDA_SUCCESS;
}

CUresult cuGraphMemsetNodeSetParams(CUgraphNode handle, const CUDA_MEMSET_NODE_PARAMS* params) {
  FAKECUDA_ENTER();
  if (params == nullptr || params->dst == 0 || params->width == 0 || params->height == 0 ||
      (params->elementSize != 1 && params->elementSize != 2 && params->elementSize != 4)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  GraphNode* n = NodeOf(d, handle, GraphNodeKind::kMemset);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  n->memset = *params;
  return CUDA_SUCCESS;
}

// accessDescs points at the node's own copy (valid while the node lives), as CUDA's does.
CUresult cuGraphMemAllocNodeGetParams(CUgraphNode handle, CUDA_MEM_ALLOC_NODE_PARAMS* params) {
  FAKECUDA_ENTER();
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  GraphNode* n = NodeOf(d, handle, GraphNodeKind::kMemAlloc);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *params = CUDA_MEM_ALLOC_NODE_PARAMS{};
  params->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  params->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  params->poolProps.location.id = n->device;
  params->accessDescs = n->access.empty() ? nullptr : n->access.data();
  params->accessDescCount = n->access.size();
  params->bytesize = n->bytes;
  params->dptr = n->dptr;
  return CUDA_SUCCESS;
}

CUresult cuGraphMemFreeNodeGetParams(CUgraphNode handle, CUdeviceptr* dptr) {
  FAKECUDA_ENTER();
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  GraphNode* n = NodeOf(d, handle, GraphNodeKind::kMemFree);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *dptr = n->dptr;
  return CUDA_SUCCESS;
}

CUresult cuGraphKernelNodeGetAttribute(CUgraphNode handle, CUkernelNodeAttrID attr, CUkernelNodeAttrValue* value) {
  FAKECUDA_ENTER();
  if (value == nullptr || !NodeAttribute(attr)) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  GraphNode* n = NodeOf(d, handle, GraphNodeKind::kKernel);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = n->attrs.find(attr);
  if (it != n->attrs.end()) *value = it->second;
  else memset(value, 0, sizeof(*value));
  return CUDA_SUCCESS;
}

CUresult cuGraphKernelNodeSetAttribute(CUgraphNode handle, CUkernelNodeAttrID attr,
                                       const CUkernelNodeAttrValue* value) {
  FAKECUDA_ENTER();
  if (value == nullptr || !NodeAttribute(attr)) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  GraphNode* n = NodeOf(d, handle, GraphNodeKind::kKernel);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  n->attrs[attr] = *value;
  return CUDA_SUCCESS;
}

CUresult cuGraphKernelNodeCopyAttributes(CUgraphNode dst, CUgraphNode src) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  GraphNode* to = NodeOf(d, dst, GraphNodeKind::kKernel);
  GraphNode* from = NodeOf(d, src, GraphNodeKind::kKernel);
  if (to == nullptr || from == nullptr) return CUDA_ERROR_INVALID_VALUE;
  to->attrs = from->attrs;
  return CUDA_SUCCESS;
}

CUresult cuGraphNodeGetDependentNodes_v2(CUgraphNode handle, CUgraphNode* nodes, CUgraphEdgeData* edges,
                                         size_t* count) {
  FAKECUDA_ENTER();
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto* node = reinterpret_cast<GraphNode*>(handle);
  Graph* g = Owner(d, node);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<GraphNode*> out;
  for (auto& n : g->nodes) {
    for (auto* dep : n->deps) {
      if (dep == node) out.push_back(n.get());
    }
  }
  if (nodes == nullptr) {
    *count = out.size();
    return CUDA_SUCCESS;
  }
  size_t i = 0;
  for (; i < out.size() && i < *count; ++i) {
    nodes[i] = reinterpret_cast<CUgraphNode>(out[i]);
    if (edges) edges[i] = CUgraphEdgeData{};
  }
  for (size_t j = i; j < *count; ++j) nodes[j] = nullptr;
  *count = i;
  return CUDA_SUCCESS;
}

CUresult cuGraphNodeFindInClone(CUgraphNode* out, CUgraphNode original, CUgraph clone) {
  FAKECUDA_ENTER();
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.graphs.find(reinterpret_cast<Graph*>(clone));
  if (it == d.graphs.end()) return CUDA_ERROR_INVALID_VALUE;
  auto n = it->second->cloned_from.find(reinterpret_cast<const GraphNode*>(original));
  if (n == it->second->cloned_from.end()) return CUDA_ERROR_INVALID_VALUE;
  *out = reinterpret_cast<CUgraphNode>(n->second);
  return CUDA_SUCCESS;
}

namespace {
// The typed forms of a generic node's parameters (CUgraphNodeParams holds newer structs).
struct TypedParams {
  CUDA_KERNEL_NODE_PARAMS kernel{};
  CUDA_MEMSET_NODE_PARAMS memset{};
  CUDA_HOST_NODE_PARAMS host{};
};
void Convert(const CUgraphNodeParams& p, TypedParams* t) {
  t->kernel.func = p.kernel.func;
  t->kernel.gridDimX = p.kernel.gridDimX;
  t->kernel.gridDimY = p.kernel.gridDimY;
  t->kernel.gridDimZ = p.kernel.gridDimZ;
  t->kernel.blockDimX = p.kernel.blockDimX;
  t->kernel.blockDimY = p.kernel.blockDimY;
  t->kernel.blockDimZ = p.kernel.blockDimZ;
  t->kernel.sharedMemBytes = p.kernel.sharedMemBytes;
  t->kernel.kernelParams = p.kernel.kernelParams;
  t->kernel.extra = p.kernel.extra;
  t->kernel.kern = p.kernel.kern;
  t->memset.dst = p.memset.dst;
  t->memset.pitch = p.memset.pitch;
  t->memset.value = p.memset.value;
  t->memset.elementSize = p.memset.elementSize;
  t->memset.width = p.memset.width;
  t->memset.height = p.memset.height;
  t->host.fn = p.host.fn;
  t->host.userData = p.host.userData;
}
}  // namespace

// The typed setters by type; child graph, memory and conditional nodes are refused.
CUresult cuGraphNodeSetParams(CUgraphNode node, CUgraphNodeParams* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TypedParams t;
  Convert(*p, &t);
  switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: return cuGraphKernelNodeSetParams_v2(node, &t.kernel);
    case CU_GRAPH_NODE_TYPE_MEMCPY: return cuGraphMemcpyNodeSetParams(node, &p->memcpy.copyParams);
    case CU_GRAPH_NODE_TYPE_MEMSET: return cuGraphMemsetNodeSetParams(node, &t.memset);
    case CU_GRAPH_NODE_TYPE_HOST: return cuGraphHostNodeSetParams(node, &t.host);
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD: return cuGraphEventRecordNodeSetEvent(node, p->eventRecord.event);
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: return cuGraphEventWaitNodeSetEvent(node, p->eventWait.event);
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult cuGraphExecNodeSetParams(CUgraphExec exec, CUgraphNode node, CUgraphNodeParams* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TypedParams t;
  Convert(*p, &t);
  switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: return cuGraphExecKernelNodeSetParams_v2(exec, node, &t.kernel);
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      return cuGraphExecMemcpyNodeSetParams(exec, node, &p->memcpy.copyParams, p->memcpy.copyCtx);
    case CU_GRAPH_NODE_TYPE_MEMSET: return cuGraphExecMemsetNodeSetParams(exec, node, &t.memset, p->memset.ctx);
    case CU_GRAPH_NODE_TYPE_HOST: return cuGraphExecHostNodeSetParams(exec, node, &t.host);
    case CU_GRAPH_NODE_TYPE_GRAPH: return cuGraphExecChildGraphNodeSetParams(exec, node, p->graph.graph);
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD: return cuGraphExecEventRecordNodeSetEvent(exec, node, p->eventRecord.event);
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: return cuGraphExecEventWaitNodeSetEvent(exec, node, p->eventWait.event);
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult cuGraphExecGetFlags(CUgraphExec handle, cuuint64_t* flags) {
  FAKECUDA_ENTER();
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.graph_execs.find(reinterpret_cast<GraphExec*>(handle));
  if (it == d.graph_execs.end()) return CUDA_ERROR_INVALID_VALUE;
  *flags = it->second->flags;
  return CUDA_SUCCESS;
}

CUresult cuUserObjectCreate(CUuserObject* out, void* ptr, CUhostFn destroy, unsigned int refs, unsigned int flags) {
  FAKECUDA_ENTER();
  if (out == nullptr || destroy == nullptr || refs == 0 || flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto* o = new fakecuda::UserObject{ptr, destroy, refs};
  std::lock_guard<std::mutex> l(fakecuda::g_uo_mu);
  fakecuda::LiveUserObjects().insert(o);
  *out = reinterpret_cast<CUuserObject>(o);
  return CUDA_SUCCESS;
}

CUresult cuUserObjectRetain(CUuserObject object, unsigned int count) {
  FAKECUDA_ENTER();
  auto* o = reinterpret_cast<fakecuda::UserObject*>(object);
  std::lock_guard<std::mutex> l(fakecuda::g_uo_mu);
  if (count == 0 || !fakecuda::LiveUserObjects().count(o)) return CUDA_ERROR_INVALID_VALUE;
  o->refs += count;
  return CUDA_SUCCESS;
}

CUresult cuUserObjectRelease(CUuserObject object, unsigned int count) {
  FAKECUDA_ENTER();
  auto* o = reinterpret_cast<fakecuda::UserObject*>(object);
  {
    std::lock_guard<std::mutex> l(fakecuda::g_uo_mu);
    // Beyond the references held: CUDA's behaviour is undefined; the fake refuses.
    if (count == 0 || !fakecuda::LiveUserObjects().count(o) || count > o->refs) return CUDA_ERROR_INVALID_VALUE;
  }
  fakecuda::Drop(o, count);
  return CUDA_SUCCESS;
}

CUresult cuGraphRetainUserObject(CUgraph graph, CUuserObject object, unsigned int count, unsigned int flags) {
  FAKECUDA_ENTER();
  if (count == 0 || (flags & ~CU_GRAPH_USER_OBJECT_MOVE)) return CUDA_ERROR_INVALID_VALUE;
  auto* o = reinterpret_cast<fakecuda::UserObject*>(object);
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.graphs.find(reinterpret_cast<Graph*>(graph));
  if (it == d.graphs.end()) return CUDA_ERROR_INVALID_VALUE;
  {
    std::lock_guard<std::mutex> l(fakecuda::g_uo_mu);
    if (!fakecuda::LiveUserObjects().count(o)) return CUDA_ERROR_INVALID_VALUE;
    if (!(flags & CU_GRAPH_USER_OBJECT_MOVE)) o->refs += count;
  }
  it->second->user_refs[o] += count;
  return CUDA_SUCCESS;
}

CUresult cuGraphReleaseUserObject(CUgraph graph, CUuserObject object, unsigned int count) {
  FAKECUDA_ENTER();
  auto* o = reinterpret_cast<fakecuda::UserObject*>(object);
  {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.graphs.find(reinterpret_cast<Graph*>(graph));
    if (it == d.graphs.end() || count == 0) return CUDA_ERROR_INVALID_VALUE;
    auto r = it->second->user_refs.find(o);
    if (r == it->second->user_refs.end() || r->second < count) return CUDA_ERROR_INVALID_VALUE;
    if ((r->second -= count) == 0) it->second->user_refs.erase(r);
  }
  fakecuda::Drop(o, count);
  return CUDA_SUCCESS;
}

// One line per node (its kind) and one per edge; flags beyond CUgraphDebugDot_flags are refused,
// the others change nothing.
CUresult cuGraphDebugDotPrint(CUgraph graph, const char* path, unsigned int flags) {
  FAKECUDA_ENTER();
  if (path == nullptr || (flags >> 16) != 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.graphs.find(reinterpret_cast<Graph*>(graph));
  if (it == d.graphs.end()) return CUDA_ERROR_INVALID_VALUE;
  FILE* f = fopen(path, "w");
  if (f == nullptr) return CUDA_ERROR_OPERATING_SYSTEM;
  const auto& nodes = it->second->nodes;
  auto index = [&](const GraphNode* n) {
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i].get() == n) return i;
    }
    return nodes.size();
  };
  fprintf(f, "digraph dot {\n");
  for (size_t i = 0; i < nodes.size(); ++i) fprintf(f, "  n%zu [label=\"%s\"];\n", i, KindName(nodes[i]->kind));
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (auto* dep : nodes[i]->deps) fprintf(f, "  n%zu -> n%zu;\n", index(dep), i);
  }
  fprintf(f, "}\n");
  return fclose(f) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM;
}

// Legacy forms, declared by hand (cuda.h names them only for the driver's own build).
#undef cuGraphInstantiate
#undef cuGraphAddKernelNode
#undef cuGraphKernelNodeGetParams
#undef cuGraphKernelNodeSetParams
#undef cuGraphExecKernelNodeSetParams
#undef cuGraphExecUpdate
#undef cuGraphNodeGetDependentNodes
FAKECUDA_EXPORT CUresult cuGraphNodeGetDependentNodes(CUgraphNode node, CUgraphNode* nodes, size_t* count) {
  return cuGraphNodeGetDependentNodes_v2(node, nodes, nullptr, count);
}
FAKECUDA_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec* exec, CUgraph graph, CUgraphNode* err, char* log, size_t log_size) {
  if (err) *err = nullptr;
  if (log && log_size) log[0] = '\0';
  return cuGraphInstantiateWithFlags(exec, graph, 0);
}
FAKECUDA_EXPORT CUresult cuGraphInstantiate(CUgraphExec* exec, CUgraph graph, CUgraphNode* err, char* log, size_t log_size) {
  return cuGraphInstantiate_v2(exec, graph, err, log, log_size);
}
FAKECUDA_EXPORT CUresult cuGraphAddKernelNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t ndeps,
                              const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_KERNEL_NODE_PARAMS v2 = {};
  memcpy(&v2, p, sizeof(*p));
  return cuGraphAddKernelNode_v2(out, graph, deps, ndeps, &v2);
}
FAKECUDA_EXPORT CUresult cuGraphKernelNodeGetParams(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS_v1* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_KERNEL_NODE_PARAMS v2 = {};
  CUresult r = cuGraphKernelNodeGetParams_v2(node, &v2);
  if (r == CUDA_SUCCESS) memcpy(p, &v2, sizeof(*p));
  return r;
}
FAKECUDA_EXPORT CUresult cuGraphKernelNodeSetParams(CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_KERNEL_NODE_PARAMS v2 = {};
  memcpy(&v2, p, sizeof(*p));
  return cuGraphKernelNodeSetParams_v2(node, &v2);
}
FAKECUDA_EXPORT CUresult cuGraphExecKernelNodeSetParams(CUgraphExec exec, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_KERNEL_NODE_PARAMS v2 = {};
  memcpy(&v2, p, sizeof(*p));
  return cuGraphExecKernelNodeSetParams_v2(exec, node, &v2);
}
FAKECUDA_EXPORT CUresult cuGraphExecUpdate(CUgraphExec exec, CUgraph graph, CUgraphNode* err, CUgraphExecUpdateResult* result) {
  if (err == nullptr || result == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUgraphExecUpdateResultInfo info = {};
  CUresult r = cuGraphExecUpdate_v2(exec, graph, &info);
  *err = info.errorNode;
  *result = info.result;
  return r;
}
