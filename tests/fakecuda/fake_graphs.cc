// Fake driver graphs: kernel, memory-allocation and memory-free nodes, run in insertion order on
// the launch stream. Dependencies are accepted and ignored (insertion order already respects
// them for graphs built in dependency order). Stream capture is not supported.
#include <algorithm>
#include <sys/mman.h>

#include "fake_driver.h"

using fakecuda::Driver;
using fakecuda::Graph;
using fakecuda::GraphExec;
using fakecuda::GraphNode;
using fakecuda::GraphNodeKind;

namespace {

Graph* LiveGraph(Driver& d, CUgraph handle) {
  auto* graph = reinterpret_cast<Graph*>(handle);
  return d.graphs.count(graph) != 0 ? graph : nullptr;
}

CUresult AddNode(CUgraphNode* out, CUgraph handle, std::unique_ptr<GraphNode> node) {
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  Graph* graph = LiveGraph(d, handle);
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *out = reinterpret_cast<CUgraphNode>(node.get());
  graph->nodes.push_back(std::move(node));
  return CUDA_SUCCESS;
}

// Frees a graph allocation when its free node runs. Runs on a stream worker.
void FreeGraphAllocation(uintptr_t dptr) {
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.allocations.find(dptr);
  if (it == d.allocations.end()) return;
  d.Uncharge(it->second.device, it->second.counted);
  d.allocations.erase(it);
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

CUresult cuGraphAddKernelNode_v2(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps,
                                 size_t num_deps, const CUDA_KERNEL_NODE_PARAMS* params) {
  FAKECUDA_ENTER();
  (void)deps;
  (void)num_deps;
  if (out == nullptr || params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto node = std::make_unique<GraphNode>();
  node->kind = GraphNodeKind::kKernel;
  node->launch = std::make_shared<fakecuda::LaunchArgs>();
  CUfunction f = params->func != nullptr ? params->func : reinterpret_cast<CUfunction>(params->kern);
  const unsigned grid[3] = {params->gridDimX, params->gridDimY, params->gridDimZ};
  const unsigned block[3] = {params->blockDimX, params->blockDimY, params->blockDimZ};
  if (CUresult r = fakecuda::BuildLaunch(f, grid, block, params->kernelParams, params->extra,
                                         node->launch.get());
      r != CUDA_SUCCESS) {
    return r;
  }
  return AddNode(out, graph, std::move(node));
}

CUresult cuGraphAddMemAllocNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps,
                                size_t num_deps, CUDA_MEM_ALLOC_NODE_PARAMS* params) {
  FAKECUDA_ENTER();
  (void)deps;
  (void)num_deps;
  if (out == nullptr || params == nullptr || params->bytesize == 0 ||
      params->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  int dev = params->poolProps.location.id;
  if (dev < 0 || dev >= Driver::Get().topology.device_count) return CUDA_ERROR_INVALID_DEVICE;
  // The address is fixed now; the memory is charged to the device only while a launch holds it.
  size_t bytes = params->bytesize;
  void* mem = fakecuda::MapHostMemory(bytes);
  if (mem == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  auto node = std::make_unique<GraphNode>();
  node->kind = GraphNodeKind::kMemAlloc;
  node->dptr = reinterpret_cast<uintptr_t>(mem);
  node->bytes = bytes;
  node->device = dev;
  node->region = std::shared_ptr<void>(mem, [bytes](void* p) { fakecuda::UnmapHostMemory(p, bytes); });
  uintptr_t dptr = node->dptr;
  CUresult r = AddNode(out, graph, std::move(node));
  if (r == CUDA_SUCCESS) params->dptr = dptr;
  return r;
}

CUresult cuGraphAddMemFreeNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps,
                               size_t num_deps, CUdeviceptr dptr) {
  FAKECUDA_ENTER();
  (void)deps;
  (void)num_deps;
  if (out == nullptr || dptr == 0) return CUDA_ERROR_INVALID_VALUE;
  auto node = std::make_unique<GraphNode>();
  node->kind = GraphNodeKind::kMemFree;
  node->dptr = dptr;
  return AddNode(out, graph, std::move(node));
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph handle, unsigned long long flags) {
  FAKECUDA_ENTER();
  (void)flags;
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  Graph* graph = LiveGraph(d, handle);
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto e = std::make_unique<GraphExec>();
  for (const auto& node : graph->nodes) {
    e->nodes.push_back(*node);
    e->origins.push_back(node.get());
  }
  *exec = reinterpret_cast<CUgraphExec>(e.get());
  d.graph_execs[e.get()] = std::move(e);
  return CUDA_SUCCESS;
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

CUresult cuGraphLaunch(CUgraphExec handle, CUstream stream_handle) {
  FAKECUDA_ENTER();
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<fakecuda::Stream> stream = fakecuda::ResolveStream(stream_handle, &err);
  if (stream == nullptr) return err;
  auto nodes = std::make_shared<std::vector<GraphNode>>();
  {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.graph_execs.find(reinterpret_cast<GraphExec*>(handle));
    if (it == d.graph_execs.end()) return CUDA_ERROR_INVALID_VALUE;
    *nodes = it->second->nodes;
    // Graph allocations are charged at launch, all or nothing; each becomes a live allocation
    // (freed by its free node, or later by cuMemFree/cuMemFreeAsync).
    std::vector<const GraphNode*> charged;
    CUresult failure = CUDA_SUCCESS;
    for (const GraphNode& node : *nodes) {
      if (node.kind != GraphNodeKind::kMemAlloc) continue;
      size_t counted = fakecuda::RoundUp(node.bytes, fakecuda::kGranularity);
      if (d.allocations.count(node.dptr) != 0) {
        failure = CUDA_ERROR_INVALID_VALUE;  // the previous launch's allocation is still live
      } else if (!d.Charge(node.device, counted)) {
        failure = CUDA_ERROR_OUT_OF_MEMORY;
      }
      if (failure != CUDA_SUCCESS) break;
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
      for (const GraphNode* node : charged) {
        d.Uncharge(node->device, d.allocations[node->dptr].counted);
        d.allocations.erase(node->dptr);
      }
      return failure;
    }
  }
  stream->worker.Enqueue([nodes] {
    for (const GraphNode& node : *nodes) {
      switch (node.kind) {
        case GraphNodeKind::kKernel:
          node.launch->Run();
          break;
        case GraphNodeKind::kMemAlloc:
          break;  // charged and recorded at launch
        case GraphNodeKind::kMemFree:
          FreeGraphAllocation(node.dptr);
          break;
      }
    }
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
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto launch = std::make_shared<fakecuda::LaunchArgs>();
  CUfunction f = params->func != nullptr ? params->func : reinterpret_cast<CUfunction>(params->kern);
  const unsigned grid[3] = {params->gridDimX, params->gridDimY, params->gridDimZ};
  const unsigned block[3] = {params->blockDimX, params->blockDimY, params->blockDimZ};
  if (CUresult r = fakecuda::BuildLaunch(f, grid, block, params->kernelParams, params->extra,
                                         launch.get());
      r != CUDA_SUCCESS) {
    return r;
  }
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.graph_execs.find(reinterpret_cast<GraphExec*>(handle));
  if (it == d.graph_execs.end()) return CUDA_ERROR_INVALID_VALUE;
  GraphExec& e = *it->second;
  for (size_t i = 0; i < e.origins.size(); ++i) {
    if (e.origins[i] != reinterpret_cast<const GraphNode*>(node)) continue;
    if (e.nodes[i].kind != GraphNodeKind::kKernel) return CUDA_ERROR_INVALID_VALUE;
    e.nodes[i].launch = std::move(launch);
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}
