// Fake driver graphs. Node kinds: kernel, memcpy (linear memory: host, device, unified; no
// arrays), memset, host, empty, event record, event wait, child graph, memory allocation and
// free. Dependencies are kept as edges; instantiation orders the nodes by them (ties in insertion
// order) and flattens child graphs, and a launch runs that order on the launch stream.
#include <algorithm>
#include <cstring>
#include <sys/mman.h>

#include "fake_driver.h"

using fakecuda::Driver;
using fakecuda::Graph;
using fakecuda::GraphExec;
using fakecuda::GraphNode;
using fakecuda::GraphNodeKind;

namespace {

// Conditional handles (cuGraphConditionalHandleCreate): value, default, flags. Own lock: the
// set_conditional kernel runs on a stream worker.
struct ConditionalHandle {
  unsigned value = 0, default_value = 0, flags = 0;
};
std::mutex g_cond_mu;
std::map<uint64_t, ConditionalHandle>& Conditionals() {
  static auto* m = new std::map<uint64_t, ConditionalHandle>();
  return *m;
}
uint64_t g_next_conditional = 0x100;  // guarded by g_cond_mu

unsigned ConditionalValue(uint64_t h) {
  std::lock_guard<std::mutex> l(g_cond_mu);
  auto it = Conditionals().find(h);
  return it == Conditionals().end() ? 0 : it->second.value;
}

Graph* LiveGraph(Driver& d, CUgraph handle) {
  auto* graph = reinterpret_cast<Graph*>(handle);
  return d.graphs.count(graph) != 0 ? graph : nullptr;
}

GraphExec* LiveExec(Driver& d, CUgraphExec handle) {
  auto it = d.graph_execs.find(reinterpret_cast<GraphExec*>(handle));
  return it == d.graph_execs.end() ? nullptr : it->second.get();
}

// The graph holding `node`, or nullptr. REQUIRES mu.
Graph* OwnerOf(Driver& d, const GraphNode* node) {
  for (auto& [g, owned] : d.graphs) {
    for (auto& n : owned->nodes) {
      if (n.get() == node) return g;
    }
  }
  return nullptr;
}

bool InGraph(const Graph& g, const GraphNode* node) {
  for (auto& n : g.nodes) {
    if (n.get() == node) return true;
  }
  return false;
}

CUresult AddNode(CUgraphNode* out, CUgraph handle, const CUgraphNode* deps, size_t num_deps,
                 std::unique_ptr<GraphNode> node) {
  if (out == nullptr || (num_deps > 0 && deps == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  Graph* graph = LiveGraph(d, handle);
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < num_deps; ++i) {
    auto* dep = reinterpret_cast<GraphNode*>(deps[i]);
    if (!InGraph(*graph, dep)) return CUDA_ERROR_INVALID_VALUE;
    if (std::find(node->deps.begin(), node->deps.end(), dep) == node->deps.end()) {
      node->deps.push_back(dep);
    }
  }
  *out = reinterpret_cast<CUgraphNode>(node.get());
  graph->nodes.push_back(std::move(node));
  return CUDA_SUCCESS;
}

// A deep copy; *map (when given) says which copy each node became.
std::unique_ptr<Graph> CloneGraph(const Graph& g, std::map<const GraphNode*, GraphNode*>* map) {
  auto copy = std::make_unique<Graph>();
  std::map<const GraphNode*, GraphNode*> local;
  for (auto& n : g.nodes) {
    auto c = std::make_unique<GraphNode>(*n);
    if (n->child) c->child = CloneGraph(*n->child, nullptr);
    local[n.get()] = c.get();
    copy->nodes.push_back(std::move(c));
  }
  for (auto& c : copy->nodes) {
    for (auto*& dep : c->deps) dep = local[dep];
  }
  if (map) *map = std::move(local);
  return copy;
}

// Appends g's nodes in dependency order (ties in insertion order), child graphs flattened.
// `top`: the top-level node they belong to (nullptr: each node itself).
bool Flatten(const Graph& g, const GraphNode* top, GraphExec* e) {
  std::vector<const GraphNode*> done;
  while (done.size() < g.nodes.size()) {
    bool progress = false;
    for (auto& n : g.nodes) {
      if (std::find(done.begin(), done.end(), n.get()) != done.end()) continue;
      bool ready = true;
      for (auto* dep : n->deps) {
        ready = ready && std::find(done.begin(), done.end(), dep) != done.end();
      }
      if (!ready) continue;
      done.push_back(n.get());
      progress = true;
      const GraphNode* t = top ? top : n.get();
      if (n->kind == GraphNodeKind::kChildGraph) {
        if (!Flatten(*n->child, t, e)) return false;
        continue;
      }
      e->nodes.push_back(*n);
      if (n->kind == GraphNodeKind::kConditional) {
        for (CUgraph b : *n->bodies) {
          auto body = std::make_shared<GraphExec>();
          if (!Flatten(*reinterpret_cast<Graph*>(b), nullptr, body.get())) return false;
          e->nodes.back().body_execs.push_back(std::move(body));
        }
      }
      e->origins.push_back(n.get());
      e->tops.push_back(t);
    }
    if (!progress) return false;  // a cycle
  }
  return true;
}

std::unique_ptr<GraphExec> Instantiate(const Graph& g) {
  auto e = std::make_unique<GraphExec>();
  if (!Flatten(g, nullptr, e.get())) return nullptr;
  return e;
}

// REQUIRES d.mu. Bytes of the live graph allocations of `device`.
uint64_t GraphMemoryUsed(Driver& d, CUdevice device) {
  uint64_t live = 0;
  for (auto& [base, a] : d.allocations) {
    if (a.kind == fakecuda::MemoryKind::kGraph && a.device == device) live += a.counted;
  }
  return live;
}

// REQUIRES d.mu. Raises the graph memory high watermarks of `device` to what it holds now.
void NoteGraphMemoryHighs(Driver& d, CUdevice device) {
  fakecuda::DeviceState& st = d.devices[device];
  const uint64_t used = GraphMemoryUsed(d, device);
  st.graph_used_high = std::max(st.graph_used_high, used);
  st.graph_reserved_high = std::max(st.graph_reserved_high, used + st.graph_idle);
}

// Frees a graph allocation when its free node runs. Runs on a stream worker.
void FreeGraphAllocation(uintptr_t dptr) {
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.allocations.find(dptr);
  if (it == d.allocations.end()) return;
  if (it->second.graph_reallocs > 0) {
    --it->second.graph_reallocs;  // a later alloc node of the launch takes the address again
    return;
  }
  d.devices[it->second.device].graph_idle += it->second.counted;  // kept by the graph memory pool
  d.allocations.erase(it);
}

bool LinearType(CUmemorytype t) {
  return t == CU_MEMORYTYPE_HOST || t == CU_MEMORYTYPE_DEVICE || t == CU_MEMORYTYPE_UNIFIED;
}

CUresult CheckCopy(const CUDA_MEMCPY3D* p) {
  if (p == nullptr || p->WidthInBytes == 0 || p->Height == 0 || p->Depth == 0) return CUDA_ERROR_INVALID_VALUE;
  if (!LinearType(p->srcMemoryType) || !LinearType(p->dstMemoryType)) return CUDA_ERROR_NOT_SUPPORTED;
  return CUDA_SUCCESS;
}

CUresult CheckMemset(const CUDA_MEMSET_NODE_PARAMS* p) {
  if (p == nullptr || p->dst == 0 || p->width == 0 || p->height == 0) return CUDA_ERROR_INVALID_VALUE;
  if (p->elementSize != 1 && p->elementSize != 2 && p->elementSize != 4) return CUDA_ERROR_INVALID_VALUE;
  if (p->height > 1 && p->pitch < p->width * p->elementSize) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

// A 3D copy of linear memory (device pointers are host addresses here).
void RunCopy(const CUDA_MEMCPY3D& p) {
  auto base = [](CUmemorytype t, const void* host, CUdeviceptr dev) {
    return t == CU_MEMORYTYPE_HOST ? reinterpret_cast<uintptr_t>(host) : static_cast<uintptr_t>(dev);
  };
  const uintptr_t src = base(p.srcMemoryType, p.srcHost, p.srcDevice);
  const uintptr_t dst = base(p.dstMemoryType, p.dstHost, p.dstDevice);
  const size_t spitch = p.srcPitch ? p.srcPitch : p.WidthInBytes;
  const size_t dpitch = p.dstPitch ? p.dstPitch : p.WidthInBytes;
  const size_t sheight = p.srcHeight ? p.srcHeight : p.Height;
  const size_t dheight = p.dstHeight ? p.dstHeight : p.Height;
  for (size_t z = 0; z < p.Depth; ++z) {
    for (size_t y = 0; y < p.Height; ++y) {
      const uintptr_t s = src + p.srcXInBytes + (p.srcY + y) * spitch + (p.srcZ + z) * spitch * sheight;
      const uintptr_t t = dst + p.dstXInBytes + (p.dstY + y) * dpitch + (p.dstZ + z) * dpitch * dheight;
      memmove(reinterpret_cast<void*>(t), reinterpret_cast<const void*>(s), p.WidthInBytes);
    }
  }
}

void RunMemset(const CUDA_MEMSET_NODE_PARAMS& p) {
  for (size_t y = 0; y < p.height; ++y) {
    auto* row = reinterpret_cast<unsigned char*>(p.dst + y * p.pitch);
    for (size_t x = 0; x < p.width; ++x) {
      if (p.elementSize == 1) row[x] = static_cast<unsigned char>(p.value);
      else if (p.elementSize == 2) reinterpret_cast<uint16_t*>(row)[x] = static_cast<uint16_t>(p.value);
      else reinterpret_cast<uint32_t*>(row)[x] = p.value;
    }
  }
}

std::shared_ptr<fakecuda::Event> LiveEvent(Driver& d, CUevent e) {
  auto it = d.events.find(reinterpret_cast<fakecuda::Event*>(e));
  return it == d.events.end() ? nullptr : it->second;
}

// The entry of exec `e` instantiated from top-level node `node`, or -1.
long ExecIndex(const GraphExec& e, CUgraphNode node) {
  for (size_t i = 0; i < e.origins.size(); ++i) {
    if (e.origins[i] == reinterpret_cast<const GraphNode*>(node)) return static_cast<long>(i);
  }
  return -1;
}

// Applies fn to the exec entry of `node` of kind `kind`. REQUIRES not holding mu.
template <class Fn>
CUresult EditExecNode(CUgraphExec handle, CUgraphNode node, GraphNodeKind kind, Fn fn) {
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  GraphExec* e = LiveExec(d, handle);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  long i = ExecIndex(*e, node);
  if (i < 0 || e->nodes[i].kind != kind) return CUDA_ERROR_INVALID_VALUE;
  return fn(e->nodes[i]);
}

CUresult BuildKernelNode(const CUDA_KERNEL_NODE_PARAMS* params, GraphNode* node) {
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  node->kind = GraphNodeKind::kKernel;
  node->launch = std::make_shared<fakecuda::LaunchArgs>();
  CUfunction f = params->func != nullptr ? params->func : reinterpret_cast<CUfunction>(params->kern);
  node->func = f;
  const unsigned grid[3] = {params->gridDimX, params->gridDimY, params->gridDimZ};
  const unsigned block[3] = {params->blockDimX, params->blockDimY, params->blockDimZ};
  return fakecuda::BuildLaunch(f, grid, block, params->kernelParams, params->extra, node->launch.get());
}

}  // namespace

CUresult cuGraphCreate(CUgraph* graph, unsigned int flags) {
  FAKECUDA_ENTER();
  if (graph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto g = std::make_unique<Graph>();
  *graph = reinterpret_cast<CUgraph>(g.get());
  d.graphs[g.get()] = std::move(g);
  return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph handle) {
  FAKECUDA_ENTER();
  std::unique_ptr<Graph> graph;  // destroyed after the lock is released
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.graphs.find(reinterpret_cast<Graph*>(handle));
  if (it == d.graphs.end()) return CUDA_ERROR_INVALID_VALUE;
  graph = std::move(it->second);
  d.graphs.erase(it);
  return CUDA_SUCCESS;
}

CUresult cuGraphClone(CUgraph* out, CUgraph handle) {
  FAKECUDA_ENTER();
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  Graph* graph = LiveGraph(d, handle);
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::map<const GraphNode*, GraphNode*> map;
  std::unique_ptr<Graph> copy = CloneGraph(*graph, &map);
  copy->cloned_from = std::move(map);
  *out = reinterpret_cast<CUgraph>(copy.get());
  d.graphs[copy.get()] = std::move(copy);
  return CUDA_SUCCESS;
}

CUresult cuGraphGetNodes(CUgraph handle, CUgraphNode* nodes, size_t* count) {
  FAKECUDA_ENTER();
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  Graph* graph = LiveGraph(d, handle);
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (nodes == nullptr) {
    *count = graph->nodes.size();
    return CUDA_SUCCESS;
  }
  size_t n = std::min(*count, graph->nodes.size());
  for (size_t i = 0; i < n; ++i) nodes[i] = reinterpret_cast<CUgraphNode>(graph->nodes[i].get());
  for (size_t i = n; i < *count; ++i) nodes[i] = nullptr;
  *count = n;
  return CUDA_SUCCESS;
}

CUresult cuGraphGetRootNodes(CUgraph handle, CUgraphNode* nodes, size_t* count) {
  FAKECUDA_ENTER();
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  Graph* graph = LiveGraph(d, handle);
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUgraphNode> roots;
  for (auto& n : graph->nodes) {
    if (n->deps.empty()) roots.push_back(reinterpret_cast<CUgraphNode>(n.get()));
  }
  if (nodes == nullptr) {
    *count = roots.size();
    return CUDA_SUCCESS;
  }
  size_t n = std::min(*count, roots.size());
  for (size_t i = 0; i < n; ++i) nodes[i] = roots[i];
  *count = n;
  return CUDA_SUCCESS;
}

// Edges in node insertion order, then each node's dependencies in the order they were added.
CUresult cuGraphGetEdges_v2(CUgraph handle, CUgraphNode* from, CUgraphNode* to,
                            CUgraphEdgeData* edges, size_t* count) {
  FAKECUDA_ENTER();
  if (count == nullptr || ((from == nullptr) != (to == nullptr))) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  Graph* graph = LiveGraph(d, handle);
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  size_t total = 0, i = 0;
  for (auto& n : graph->nodes) {
    for (auto* dep : n->deps) {
      if (from != nullptr && i < *count) {
        from[i] = reinterpret_cast<CUgraphNode>(dep);
        to[i] = reinterpret_cast<CUgraphNode>(n.get());
        if (edges) edges[i] = CUgraphEdgeData{};
        ++i;
      }
      ++total;
    }
  }
  *count = from == nullptr ? total : i;
  return CUDA_SUCCESS;
}

CUresult cuGraphNodeGetDependencies_v2(CUgraphNode handle, CUgraphNode* deps,
                                       CUgraphEdgeData* edges, size_t* count) {
  FAKECUDA_ENTER();
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto* node = reinterpret_cast<GraphNode*>(handle);
  if (OwnerOf(d, node) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (deps == nullptr) {
    *count = node->deps.size();
    return CUDA_SUCCESS;
  }
  size_t n = std::min(*count, node->deps.size());
  for (size_t i = 0; i < n; ++i) {
    deps[i] = reinterpret_cast<CUgraphNode>(node->deps[i]);
    if (edges) edges[i] = CUgraphEdgeData{};
  }
  *count = n;
  return CUDA_SUCCESS;
}

CUresult cuGraphAddDependencies_v2(CUgraph handle, const CUgraphNode* from, const CUgraphNode* to,
                                   const CUgraphEdgeData* edges, size_t count) {
  FAKECUDA_ENTER();
  (void)edges;
  if (count > 0 && (from == nullptr || to == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  Graph* graph = LiveGraph(d, handle);
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    auto* f = reinterpret_cast<GraphNode*>(from[i]);
    auto* t = reinterpret_cast<GraphNode*>(to[i]);
    if (f == t || !InGraph(*graph, f) || !InGraph(*graph, t)) return CUDA_ERROR_INVALID_VALUE;
    if (std::find(t->deps.begin(), t->deps.end(), f) != t->deps.end()) return CUDA_ERROR_INVALID_VALUE;
  }
  for (size_t i = 0; i < count; ++i) {
    reinterpret_cast<GraphNode*>(to[i])->deps.push_back(reinterpret_cast<GraphNode*>(from[i]));
  }
  return CUDA_SUCCESS;
}

CUresult cuGraphRemoveDependencies_v2(CUgraph handle, const CUgraphNode* from,
                                      const CUgraphNode* to, const CUgraphEdgeData* edges,
                                      size_t count) {
  FAKECUDA_ENTER();
  (void)edges;
  if (count > 0 && (from == nullptr || to == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  Graph* graph = LiveGraph(d, handle);
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    auto* f = reinterpret_cast<GraphNode*>(from[i]);
    auto* t = reinterpret_cast<GraphNode*>(to[i]);
    if (!InGraph(*graph, t) || std::find(t->deps.begin(), t->deps.end(), f) == t->deps.end()) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  for (size_t i = 0; i < count; ++i) {
    auto& deps = reinterpret_cast<GraphNode*>(to[i])->deps;
    deps.erase(std::find(deps.begin(), deps.end(), reinterpret_cast<GraphNode*>(from[i])));
  }
  return CUDA_SUCCESS;
}

CUresult cuGraphDestroyNode(CUgraphNode handle) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto* node = reinterpret_cast<GraphNode*>(handle);
  Graph* graph = OwnerOf(d, node);
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (auto& n : graph->nodes) {
    n->deps.erase(std::remove(n->deps.begin(), n->deps.end(), node), n->deps.end());
  }
  graph->nodes.erase(std::find_if(graph->nodes.begin(), graph->nodes.end(),
                                  [&](const std::unique_ptr<GraphNode>& n) { return n.get() == node; }));
  return CUDA_SUCCESS;
}

CUresult cuGraphNodeGetType(CUgraphNode handle, CUgraphNodeType* type) {
  FAKECUDA_ENTER();
  if (type == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto* node = reinterpret_cast<GraphNode*>(handle);
  if (OwnerOf(d, node) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (node->kind) {
    case GraphNodeKind::kKernel: *type = CU_GRAPH_NODE_TYPE_KERNEL; break;
    case GraphNodeKind::kMemAlloc: *type = CU_GRAPH_NODE_TYPE_MEM_ALLOC; break;
    case GraphNodeKind::kMemFree: *type = CU_GRAPH_NODE_TYPE_MEM_FREE; break;
    case GraphNodeKind::kMemcpy: *type = CU_GRAPH_NODE_TYPE_MEMCPY; break;
    case GraphNodeKind::kMemset: *type = CU_GRAPH_NODE_TYPE_MEMSET; break;
    case GraphNodeKind::kHost: *type = CU_GRAPH_NODE_TYPE_HOST; break;
    case GraphNodeKind::kEmpty: *type = CU_GRAPH_NODE_TYPE_EMPTY; break;
    case GraphNodeKind::kEventRecord: *type = CU_GRAPH_NODE_TYPE_EVENT_RECORD; break;
    case GraphNodeKind::kEventWait: *type = CU_GRAPH_NODE_TYPE_WAIT_EVENT; break;
    case GraphNodeKind::kChildGraph: *type = CU_GRAPH_NODE_TYPE_GRAPH; break;
    case GraphNodeKind::kConditional: *type = CU_GRAPH_NODE_TYPE_CONDITIONAL; break;
  }
  return CUDA_SUCCESS;
}

CUresult cuGraphMemcpyNodeGetParams(CUgraphNode handle, CUDA_MEMCPY3D* params) {
  FAKECUDA_ENTER();
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto* node = reinterpret_cast<GraphNode*>(handle);
  if (OwnerOf(d, node) == nullptr || node->kind != GraphNodeKind::kMemcpy) return CUDA_ERROR_INVALID_VALUE;
  *params = node->copy;
  return CUDA_SUCCESS;
}

CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode handle, CUgraph* graph) {
  FAKECUDA_ENTER();
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto* node = reinterpret_cast<GraphNode*>(handle);
  if (OwnerOf(d, node) == nullptr || node->kind != GraphNodeKind::kChildGraph) return CUDA_ERROR_INVALID_VALUE;
  *graph = reinterpret_cast<CUgraph>(node->child.get());
  return CUDA_SUCCESS;
}

CUresult cuGraphConditionalHandleCreate(CUgraphConditionalHandle* out, CUgraph graph, CUcontext ctx,
                                        unsigned int default_value, unsigned int flags) {
  FAKECUDA_ENTER();
  (void)ctx;
  if (out == nullptr || (flags & ~static_cast<unsigned>(CU_GRAPH_COND_ASSIGN_DEFAULT)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    if (LiveGraph(d, graph) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard<std::mutex> l(g_cond_mu);
  const uint64_t h = g_next_conditional++;
  Conditionals()[h] = {default_value, default_value, flags};
  *out = h;
  return CUDA_SUCCESS;
}

CUresult cuGraphAddKernelNode_v2(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps,
                                 size_t num_deps, const CUDA_KERNEL_NODE_PARAMS* params) {
  FAKECUDA_ENTER();
  auto node = std::make_unique<GraphNode>();
  if (CUresult r = BuildKernelNode(params, node.get()); r != CUDA_SUCCESS) return r;
  return AddNode(out, graph, deps, num_deps, std::move(node));
}

// The generic entry point, for kernel nodes only. Edge data (ports, programmatic types) is
// accepted and ordered like a full dependency, as cuGraphAddDependencies_v2 here does.
CUresult cuGraphAddNode_v2(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, const CUgraphEdgeData* edges,
                           size_t num_deps, CUgraphNodeParams* params) {
  FAKECUDA_ENTER();
  (void)edges;
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (params->type == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
    CUDA_CONDITIONAL_NODE_PARAMS& c = params->conditional;
    const bool size_ok = c.type == CU_GRAPH_COND_TYPE_SWITCH ? c.size > 0 && c.size <= 64
                         : c.type == CU_GRAPH_COND_TYPE_IF   ? c.size == 1 || c.size == 2
                         : c.type == CU_GRAPH_COND_TYPE_WHILE && c.size == 1;
    if (!size_ok) return CUDA_ERROR_INVALID_VALUE;
    {
      std::lock_guard<std::mutex> l(g_cond_mu);
      if (!Conditionals().count(c.handle)) return CUDA_ERROR_INVALID_VALUE;
    }
    auto node = std::make_unique<GraphNode>();
    node->kind = GraphNodeKind::kConditional;
    node->bodies = std::make_shared<std::vector<CUgraph>>();
    {
      Driver& d = Driver::Get();
      std::lock_guard<std::mutex> lock(d.mu);
      for (unsigned i = 0; i < c.size; ++i) {
        auto body = std::make_unique<Graph>();
        node->bodies->push_back(reinterpret_cast<CUgraph>(body.get()));
        d.graphs[body.get()] = std::move(body);
      }
    }
    c.phGraph_out = node->bodies->data();
    node->cond = c;
    return AddNode(out, graph, deps, num_deps, std::move(node));
  }
  if (params->type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_NOT_SUPPORTED;
  CUDA_KERNEL_NODE_PARAMS k = {};
  k.func = params->kernel.func;
  k.gridDimX = params->kernel.gridDimX;
  k.gridDimY = params->kernel.gridDimY;
  k.gridDimZ = params->kernel.gridDimZ;
  k.blockDimX = params->kernel.blockDimX;
  k.blockDimY = params->kernel.blockDimY;
  k.blockDimZ = params->kernel.blockDimZ;
  k.sharedMemBytes = params->kernel.sharedMemBytes;
  k.kernelParams = params->kernel.kernelParams;
  k.extra = params->kernel.extra;
  auto node = std::make_unique<GraphNode>();
  if (CUresult r = BuildKernelNode(&k, node.get()); r != CUDA_SUCCESS) return r;
  return AddNode(out, graph, deps, num_deps, std::move(node));
}

// The launch geometry and function of a kernel node. Arguments are not given back.
CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode handle, CUDA_KERNEL_NODE_PARAMS* params) {
  FAKECUDA_ENTER();
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto* node = reinterpret_cast<GraphNode*>(handle);
  if (OwnerOf(d, node) == nullptr || node->kind != GraphNodeKind::kKernel) return CUDA_ERROR_INVALID_VALUE;
  *params = CUDA_KERNEL_NODE_PARAMS{};
  params->func = node->func;
  params->gridDimX = node->launch->grid[0];
  params->gridDimY = node->launch->grid[1];
  params->gridDimZ = node->launch->grid[2];
  params->blockDimX = node->launch->block[0];
  params->blockDimY = node->launch->block[1];
  params->blockDimZ = node->launch->block[2];
  return CUDA_SUCCESS;
}

CUresult cuGraphKernelNodeSetParams_v2(CUgraphNode handle, const CUDA_KERNEL_NODE_PARAMS* params) {
  FAKECUDA_ENTER();
  GraphNode built;
  if (CUresult r = BuildKernelNode(params, &built); r != CUDA_SUCCESS) return r;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto* node = reinterpret_cast<GraphNode*>(handle);
  if (OwnerOf(d, node) == nullptr || node->kind != GraphNodeKind::kKernel) return CUDA_ERROR_INVALID_VALUE;
  node->launch = built.launch;
  node->func = built.func;
  return CUDA_SUCCESS;
}

CUresult cuGraphAddMemcpyNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps,
                              size_t num_deps, const CUDA_MEMCPY3D* copy, CUcontext ctx) {
  FAKECUDA_ENTER();
  (void)ctx;
  if (CUresult r = CheckCopy(copy); r != CUDA_SUCCESS) return r;
  auto node = std::make_unique<GraphNode>();
  node->kind = GraphNodeKind::kMemcpy;
  node->copy = *copy;
  return AddNode(out, graph, deps, num_deps, std::move(node));
}

CUresult cuGraphAddMemsetNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps,
                              size_t num_deps, const CUDA_MEMSET_NODE_PARAMS* params, CUcontext ctx) {
  FAKECUDA_ENTER();
  (void)ctx;
  if (CUresult r = CheckMemset(params); r != CUDA_SUCCESS) return r;
  auto node = std::make_unique<GraphNode>();
  node->kind = GraphNodeKind::kMemset;
  node->memset = *params;
  return AddNode(out, graph, deps, num_deps, std::move(node));
}

CUresult cuGraphAddHostNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps,
                            size_t num_deps, const CUDA_HOST_NODE_PARAMS* params) {
  FAKECUDA_ENTER();
  if (params == nullptr || params->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto node = std::make_unique<GraphNode>();
  node->kind = GraphNodeKind::kHost;
  node->host = *params;
  return AddNode(out, graph, deps, num_deps, std::move(node));
}

CUresult cuGraphAddEmptyNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps,
                             size_t num_deps) {
  FAKECUDA_ENTER();
  auto node = std::make_unique<GraphNode>();
  node->kind = GraphNodeKind::kEmpty;
  return AddNode(out, graph, deps, num_deps, std::move(node));
}

namespace {
CUresult AddEventNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t num_deps,
                      CUevent event, GraphNodeKind kind) {
  {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    if (LiveEvent(d, event) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  }
  auto node = std::make_unique<GraphNode>();
  node->kind = kind;
  node->event = event;
  return AddNode(out, graph, deps, num_deps, std::move(node));
}
}  // namespace

CUresult cuGraphAddEventRecordNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps,
                                   size_t num_deps, CUevent event) {
  FAKECUDA_ENTER();
  return AddEventNode(out, graph, deps, num_deps, event, GraphNodeKind::kEventRecord);
}

CUresult cuGraphAddEventWaitNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps,
                                 size_t num_deps, CUevent event) {
  FAKECUDA_ENTER();
  return AddEventNode(out, graph, deps, num_deps, event, GraphNodeKind::kEventWait);
}

CUresult cuGraphAddChildGraphNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps,
                                  size_t num_deps, CUgraph child) {
  FAKECUDA_ENTER();
  auto node = std::make_unique<GraphNode>();
  node->kind = GraphNodeKind::kChildGraph;
  {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    Graph* c = LiveGraph(d, child);
    if (c == nullptr || c == reinterpret_cast<Graph*>(graph)) return CUDA_ERROR_INVALID_VALUE;
    for (auto& n : c->nodes) {
      if (n->kind == GraphNodeKind::kMemAlloc || n->kind == GraphNodeKind::kMemFree) {
        return CUDA_ERROR_NOT_SUPPORTED;  // as CUDA: no memory nodes in child graphs
      }
    }
    node->child = CloneGraph(*c, nullptr);
  }
  return AddNode(out, graph, deps, num_deps, std::move(node));
}

CUresult cuGraphAddMemAllocNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps,
                                size_t num_deps, CUDA_MEM_ALLOC_NODE_PARAMS* params) {
  FAKECUDA_ENTER();
  if (out == nullptr || params == nullptr || params->bytesize == 0 ||
      params->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  int dev = params->poolProps.location.id;
  if (dev < 0 || dev >= Driver::Get().topology.device_count) return CUDA_ERROR_INVALID_DEVICE;
  // The address is fixed now; the memory is charged to the device only while a launch holds it.
  size_t bytes = params->bytesize;
  auto node = std::make_unique<GraphNode>();
  node->kind = GraphNodeKind::kMemAlloc;
  node->bytes = bytes;
  node->device = dev;
  if (params->accessDescs != nullptr) {
    node->access.assign(params->accessDescs, params->accessDescs + params->accessDescCount);
  }
  {
    // As the driver does: an allocation after a free node of the same graph (a direct
    // dependency) reuses the freed address when it fits (NVIDIA's graphMemoryNodes checks it).
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    Graph* g = LiveGraph(d, graph);
    for (size_t i = 0; g != nullptr && deps != nullptr && i < num_deps && !node->region; ++i) {
      auto* dep = reinterpret_cast<GraphNode*>(deps[i]);
      if (!InGraph(*g, dep) || dep->kind != GraphNodeKind::kMemFree) continue;
      for (auto& n : g->nodes) {
        if (n->kind == GraphNodeKind::kMemAlloc && n->dptr == dep->dptr && n->bytes >= bytes) {
          node->dptr = n->dptr;
          node->region = n->region;
          break;
        }
      }
    }
  }
  if (!node->region) {
    void* mem = fakecuda::MapHostMemory(bytes);
    if (mem == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    node->dptr = reinterpret_cast<uintptr_t>(mem);
    node->region = std::shared_ptr<void>(mem, [bytes](void* p) { fakecuda::UnmapHostMemory(p, bytes); });
  }
  uintptr_t dptr = node->dptr;
  CUresult r = AddNode(out, graph, deps, num_deps, std::move(node));
  if (r == CUDA_SUCCESS) params->dptr = dptr;
  return r;
}

CUresult cuGraphAddMemFreeNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps,
                               size_t num_deps, CUdeviceptr dptr) {
  FAKECUDA_ENTER();
  if (dptr == 0) return CUDA_ERROR_INVALID_VALUE;
  auto node = std::make_unique<GraphNode>();
  node->kind = GraphNodeKind::kMemFree;
  node->dptr = dptr;
  return AddNode(out, graph, deps, num_deps, std::move(node));
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph handle, unsigned long long flags) {
  FAKECUDA_ENTER();
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  Graph* graph = LiveGraph(d, handle);
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::unique_ptr<GraphExec> e = Instantiate(*graph);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  e->flags = flags;
  e->user_refs = graph->user_refs;
  fakecuda::RetainUserRefs(e->user_refs);
  *exec = reinterpret_cast<CUgraphExec>(e.get());
  d.graph_execs[e.get()] = std::move(e);
  return CUDA_SUCCESS;
}

CUresult cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph graph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  FAKECUDA_ENTER();
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = cuGraphInstantiateWithFlags(exec, graph, params->flags);
  params->hErrNode_out = nullptr;
  params->result_out = r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
  return r;
}

CUresult cuGraphExecDestroy(CUgraphExec handle) {
  FAKECUDA_ENTER();
  std::unique_ptr<GraphExec> exec;  // destroyed after the lock is released
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.graph_execs.find(reinterpret_cast<GraphExec*>(handle));
  if (it == d.graph_execs.end()) return CUDA_ERROR_INVALID_VALUE;
  exec = std::move(it->second);
  d.graph_execs.erase(it);
  return CUDA_SUCCESS;
}

// Nothing to upload: checks the handles.
CUresult cuGraphUpload(CUgraphExec handle, CUstream stream_handle) {
  FAKECUDA_ENTER();
  CUresult err = CUDA_SUCCESS;
  if (fakecuda::ResolveStream(stream_handle, &err) == nullptr) return err;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  return LiveExec(d, handle) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

namespace {

using LaunchEvents = std::vector<std::pair<std::shared_ptr<fakecuda::Event>, uint64_t>>;

// Runs an instantiated graph's nodes in order on a stream worker. events: the event nodes' events
// and generations, by index (nullptr in conditional bodies: their event nodes are skipped).
void RunNodes(const std::vector<GraphNode>& nodes, LaunchEvents* events) {
  for (size_t i = 0; i < nodes.size(); ++i) {
    const GraphNode& node = nodes[i];
    if (!node.enabled) continue;
    switch (node.kind) {
      case GraphNodeKind::kKernel: node.launch->Run(); break;
      case GraphNodeKind::kMemcpy: RunCopy(node.copy); break;
      case GraphNodeKind::kMemset: RunMemset(node.memset); break;
      case GraphNodeKind::kHost: node.host.fn(node.host.userData); break;
      case GraphNodeKind::kEventRecord:
        if (events) (*events)[i].first->Complete((*events)[i].second);
        break;
      case GraphNodeKind::kEventWait:
        if (events) (*events)[i].first->WaitFor((*events)[i].second);
        break;
      case GraphNodeKind::kMemFree: FreeGraphAllocation(node.dptr); break;
      case GraphNodeKind::kConditional: {
        const auto& b = node.body_execs;
        const uint64_t h = node.cond.handle;
        if (node.cond.type == CU_GRAPH_COND_TYPE_WHILE) {
          for (int guard = 0; guard < (1 << 20) && !b.empty() && ConditionalValue(h) != 0; ++guard) {
            RunNodes(b[0]->nodes, nullptr);
          }
        } else if (node.cond.type == CU_GRAPH_COND_TYPE_IF) {
          const unsigned v = ConditionalValue(h);
          if (v != 0 && !b.empty()) RunNodes(b[0]->nodes, nullptr);
          if (v == 0 && b.size() == 2) RunNodes(b[1]->nodes, nullptr);
        } else {
          const unsigned v = ConditionalValue(h);
          if (v < b.size()) RunNodes(b[v]->nodes, nullptr);
        }
        break;
      }
      case GraphNodeKind::kMemAlloc:  // charged and recorded at launch
      case GraphNodeKind::kEmpty:
      case GraphNodeKind::kChildGraph:  // flattened at instantiation
        break;
    }
  }
}

}  // namespace

void fakecuda::SetConditional(uint64_t handle, unsigned value) {
  std::lock_guard<std::mutex> l(g_cond_mu);
  auto it = Conditionals().find(handle);
  if (it != Conditionals().end()) it->second.value = value;
}

CUresult cuGraphLaunch(CUgraphExec handle, CUstream stream_handle) {
  FAKECUDA_ENTER();
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<fakecuda::Stream> stream = fakecuda::ResolveStream(stream_handle, &err);
  if (stream == nullptr) return err;
  auto nodes = std::make_shared<std::vector<GraphNode>>();
  // Event nodes: the events and the record generation each waits for / completes.
  auto events = std::make_shared<LaunchEvents>();
  {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    GraphExec* e = LiveExec(d, handle);
    if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *nodes = e->nodes;
    for (const GraphNode& node : *nodes) {
      std::shared_ptr<fakecuda::Event> ev;
      uint64_t generation = 0;
      if (node.kind == GraphNodeKind::kEventRecord || node.kind == GraphNodeKind::kEventWait) {
        ev = LiveEvent(d, node.event);
        if (ev == nullptr) return CUDA_ERROR_INVALID_HANDLE;
        generation = node.kind == GraphNodeKind::kEventRecord ? ev->BeginRecord() : ev->Recorded();
      }
      events->emplace_back(ev, generation);
    }
    // Graph allocations are charged at launch, all or nothing; each becomes a live allocation
    // (freed by its free node, or later by cuMemFree/cuMemFreeAsync).
    std::vector<const GraphNode*> charged;
    CUresult failure = CUDA_SUCCESS;
    for (const GraphNode& node : *nodes) {
      if (node.kind != GraphNodeKind::kMemAlloc) continue;
      size_t counted = fakecuda::RoundUp(node.bytes, fakecuda::kGranularity);
      auto again = std::find_if(charged.begin(), charged.end(),
                                [&](const GraphNode* c) { return c->dptr == node.dptr; });
      if (again != charged.end()) {
        ++d.allocations[node.dptr].graph_reallocs;  // an address the graph frees, then reuses
        continue;
      }
      // What the graph memory pool keeps from earlier launches is used first.
      uint64_t& idle = d.devices[node.device].graph_idle;
      const size_t reused = std::min<uint64_t>(idle, counted);
      if (d.allocations.count(node.dptr) != 0) {
        failure = CUDA_ERROR_INVALID_VALUE;  // the previous launch's allocation is still live
      } else if (reused < counted && !d.Charge(node.device, counted - reused)) {
        failure = CUDA_ERROR_OUT_OF_MEMORY;
      }
      if (failure != CUDA_SUCCESS) break;
      idle -= reused;
      fakecuda::Allocation a;
      a.base = node.dptr;
      a.size = node.bytes;
      a.counted = counted;
      a.kind = fakecuda::MemoryKind::kGraph;
      a.device = node.device;
      a.ctx = d.CurrentContextLocked();
      d.allocations[a.base] = a;
      charged.push_back(&node);
    }
    if (failure != CUDA_SUCCESS) {
      for (const GraphNode* node : charged) {  // their memory stays in the graph memory pool
        d.devices[node->device].graph_idle += d.allocations[node->dptr].counted;
        d.allocations.erase(node->dptr);
      }
      return failure;
    }
    for (const GraphNode* node : charged) NoteGraphMemoryHighs(d, node->device);
  }
  stream->worker.Enqueue([nodes, events] {
    // Conditional handles with CU_GRAPH_COND_ASSIGN_DEFAULT start each launch at their default.
    for (const GraphNode& node : *nodes) {
      if (node.kind != GraphNodeKind::kConditional) continue;
      std::lock_guard<std::mutex> l(g_cond_mu);
      auto it = Conditionals().find(node.cond.handle);
      if (it != Conditionals().end() && (it->second.flags & CU_GRAPH_COND_ASSIGN_DEFAULT)) {
        it->second.value = it->second.default_value;
      }
    }
    RunNodes(*nodes, events.get());
  });
  return CUDA_SUCCESS;
}

FAKECUDA_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec handle, CUstream stream_handle) {
  return cuGraphLaunch(handle, stream_handle);
}

// Replaces the arguments and configuration of one kernel node of an instantiated graph; later
// launches use them (launches already queued keep theirs).
CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec handle, CUgraphNode node,
                                           const CUDA_KERNEL_NODE_PARAMS* params) {
  FAKECUDA_ENTER();
  GraphNode built;
  if (CUresult r = BuildKernelNode(params, &built); r != CUDA_SUCCESS) return r;
  return EditExecNode(handle, node, GraphNodeKind::kKernel, [&](GraphNode& n) {
    n.launch = built.launch;
    n.func = built.func;
    return CUDA_SUCCESS;
  });
}

CUresult cuGraphExecMemcpyNodeSetParams(CUgraphExec handle, CUgraphNode node,
                                        const CUDA_MEMCPY3D* copy, CUcontext ctx) {
  FAKECUDA_ENTER();
  (void)ctx;
  if (CUresult r = CheckCopy(copy); r != CUDA_SUCCESS) return r;
  return EditExecNode(handle, node, GraphNodeKind::kMemcpy, [&](GraphNode& n) {
    n.copy = *copy;
    return CUDA_SUCCESS;
  });
}

CUresult cuGraphExecMemsetNodeSetParams(CUgraphExec handle, CUgraphNode node,
                                        const CUDA_MEMSET_NODE_PARAMS* params, CUcontext ctx) {
  FAKECUDA_ENTER();
  (void)ctx;
  if (CUresult r = CheckMemset(params); r != CUDA_SUCCESS) return r;
  return EditExecNode(handle, node, GraphNodeKind::kMemset, [&](GraphNode& n) {
    n.memset = *params;
    return CUDA_SUCCESS;
  });
}

CUresult cuGraphExecHostNodeSetParams(CUgraphExec handle, CUgraphNode node,
                                      const CUDA_HOST_NODE_PARAMS* params) {
  FAKECUDA_ENTER();
  if (params == nullptr || params->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return EditExecNode(handle, node, GraphNodeKind::kHost, [&](GraphNode& n) {
    n.host = *params;
    return CUDA_SUCCESS;
  });
}

namespace {
CUresult SetExecEvent(CUgraphExec handle, CUgraphNode node, CUevent event, GraphNodeKind kind) {
  {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    if (LiveEvent(d, event) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  }
  return EditExecNode(handle, node, kind, [&](GraphNode& n) {
    n.event = event;
    return CUDA_SUCCESS;
  });
}
}  // namespace

CUresult cuGraphExecEventRecordNodeSetEvent(CUgraphExec handle, CUgraphNode node, CUevent event) {
  FAKECUDA_ENTER();
  return SetExecEvent(handle, node, event, GraphNodeKind::kEventRecord);
}

CUresult cuGraphExecEventWaitNodeSetEvent(CUgraphExec handle, CUgraphNode node, CUevent event) {
  FAKECUDA_ENTER();
  return SetExecEvent(handle, node, event, GraphNodeKind::kEventWait);
}

// Replaces the nodes a child graph node was flattened into; the new graph must have the same
// shape (node count and kinds in order).
CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec handle, CUgraphNode node, CUgraph child) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  GraphExec* e = LiveExec(d, handle);
  Graph* c = LiveGraph(d, child);
  if (e == nullptr || c == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* top = reinterpret_cast<const GraphNode*>(node);
  GraphExec flat;
  if (!Flatten(*c, top, &flat)) return CUDA_ERROR_INVALID_VALUE;
  std::vector<size_t> slots;
  for (size_t i = 0; i < e->tops.size(); ++i) {
    if (e->tops[i] == top && e->origins[i] != top) slots.push_back(i);
  }
  if (slots.empty() || slots.size() != flat.nodes.size()) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (e->nodes[slots[i]].kind != flat.nodes[i].kind) return CUDA_ERROR_INVALID_VALUE;
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    e->nodes[slots[i]] = flat.nodes[i];
    e->origins[slots[i]] = flat.origins[i];
  }
  return CUDA_SUCCESS;
}

// Takes the parameters of `graph` when it has the same shape as the executable graph's (node
// count and kinds in dependency order); else CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE.
CUresult cuGraphExecUpdate_v2(CUgraphExec handle, CUgraph graph, CUgraphExecUpdateResultInfo* info) {
  FAKECUDA_ENTER();
  if (info == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *info = CUgraphExecUpdateResultInfo{};
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  GraphExec* e = LiveExec(d, handle);
  Graph* g = LiveGraph(d, graph);
  if (e == nullptr || g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::unique_ptr<GraphExec> fresh = Instantiate(*g);
  info->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
  if (fresh == nullptr || fresh->nodes.size() != e->nodes.size()) return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  for (size_t i = 0; i < e->nodes.size(); ++i) {
    if (fresh->nodes[i].kind != e->nodes[i].kind) {
      info->result = CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
      info->errorNode = reinterpret_cast<CUgraphNode>(const_cast<GraphNode*>(fresh->origins[i]));
      return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    }
  }
  for (size_t i = 0; i < e->nodes.size(); ++i) {
    bool enabled = e->nodes[i].enabled;
    e->nodes[i] = fresh->nodes[i];
    e->nodes[i].enabled = enabled;
  }
  info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
  return CUDA_SUCCESS;
}

CUresult cuGraphNodeSetEnabled(CUgraphExec handle, CUgraphNode node, unsigned int enabled) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  GraphExec* e = LiveExec(d, handle);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  long i = ExecIndex(*e, node);
  if (i < 0) return CUDA_ERROR_INVALID_VALUE;
  GraphNodeKind k = e->nodes[i].kind;
  if (k != GraphNodeKind::kKernel && k != GraphNodeKind::kMemcpy && k != GraphNodeKind::kMemset) {
    return CUDA_ERROR_INVALID_VALUE;  // as CUDA: kernel, memcpy and memset nodes only
  }
  e->nodes[i].enabled = enabled != 0;
  return CUDA_SUCCESS;
}

CUresult cuGraphNodeGetEnabled(CUgraphExec handle, CUgraphNode node, unsigned int* enabled) {
  FAKECUDA_ENTER();
  if (enabled == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  GraphExec* e = LiveExec(d, handle);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  long i = ExecIndex(*e, node);
  if (i < 0) return CUDA_ERROR_INVALID_VALUE;
  *enabled = e->nodes[i].enabled ? 1 : 0;
  return CUDA_SUCCESS;
}

// Graph memory: used is what live graph allocations hold; reserved adds what the graphs freed and
// the pool keeps (DeviceState::graph_idle), which a trim gives back to the device.
CUresult cuDeviceGraphMemTrim(CUdevice device) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  if (device < 0 || device >= d.topology.device_count) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(d.mu);
  d.Uncharge(device, d.devices[device].graph_idle);
  d.devices[device].graph_idle = 0;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void* value) {
  FAKECUDA_ENTER();
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  if (device < 0 || device >= d.topology.device_count) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(d.mu);
  NoteGraphMemoryHighs(d, device);
  const fakecuda::DeviceState& st = d.devices[device];
  switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
      *static_cast<cuuint64_t*>(value) = GraphMemoryUsed(d, device);
      return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
      *static_cast<cuuint64_t*>(value) = GraphMemoryUsed(d, device) + st.graph_idle;
      return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
      *static_cast<cuuint64_t*>(value) = st.graph_used_high;
      return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
      *static_cast<cuuint64_t*>(value) = st.graph_reserved_high;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// Only the high watermarks may be set, and only to 0 (a reset), as CUDA.
CUresult cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void* value) {
  FAKECUDA_ENTER();
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  if (device < 0 || device >= d.topology.device_count) return CUDA_ERROR_INVALID_DEVICE;
  if ((attr != CU_GRAPH_MEM_ATTR_USED_MEM_HIGH && attr != CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH) ||
      *static_cast<cuuint64_t*>(value) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard<std::mutex> lock(d.mu);
  if (attr == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH) d.devices[device].graph_used_high = 0;
  else d.devices[device].graph_reserved_high = 0;
  return CUDA_SUCCESS;
}
