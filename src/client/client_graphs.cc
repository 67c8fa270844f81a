// CUDA graphs: graphs and their nodes (kernel, memcpy, memset, host, empty, event record/wait,
// child graph, memory allocation and free), queries and edits of a graph, instantiation, launch,
// updates of an instantiated graph. Graph, node and executable-graph handles are
// the worker's; the worker checks each against its session's tables (worker/session_graphs.cc).
// Wire formats: remote_protocol.h "Graphs".
//
// Host nodes run in the client like cuLaunchHostFunc's functions (client_callbacks.cc): the
// worker's node tells the client when a launch reaches it and waits for the acknowledgement.
// Memcpy nodes copy between device memory and page-locked memory shared with the worker (a host
// region), mirrored memory, or any other memory of this process through a shadow on the worker
// (client_graph_host.cc: the bytes travel at each launch).
#include <algorithm>
#include <vector>

#include "client/client_graphs.h"
#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Reader;
using transport::Writer;

// Kernel node parameters (see worker DecodeKernelNode).
CUresult WriteKernelNode(Session* s, const CUDA_KERNEL_NODE_PARAMS* p, Writer& w) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUfunction f = p->func ? p->func : reinterpret_cast<CUfunction>(p->kern);
  if (f == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto it = s->functions.find(H(f));
  if (it == s->functions.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (p->gridDimX == 0 || p->gridDimY == 0 || p->gridDimZ == 0 || p->blockDimX == 0 ||
      p->blockDimY == 0 || p->blockDimZ == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  w.U64(H(f));
  w.U32(p->gridDimX);
  w.U32(p->gridDimY);
  w.U32(p->gridDimZ);
  w.U32(p->blockDimX);
  w.U32(p->blockDimY);
  w.U32(p->blockDimZ);
  w.U32(p->sharedMemBytes);
  MirrorKernelPointers(s, it->second, p->kernelParams);
  return WriteLaunchArgs(it->second, p->kernelParams, p->extra, w);
}

// One side of a copy (session_graphs.cc DecodeCopy). Unified pointers are resolved here: device
// when the client's allocation table knows them, else host.
CUresult WriteCopySide(Session* s, CUmemorytype type, const void* host, CUdeviceptr dev, size_t x,
                       size_t y, size_t z, size_t pitch, size_t height, Writer& w) {
  uint64_t addr = type == CU_MEMORYTYPE_HOST ? H(host) : dev;
  if (type == CU_MEMORYTYPE_UNIFIED) type = FindDeviceAlloc(s, addr) ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
  if (type == CU_MEMORYTYPE_ARRAY) return CUDA_ERROR_NOT_SUPPORTED;
  if (type != CU_MEMORYTYPE_HOST && type != CU_MEMORYTYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  w.U32(type);
  w.U64(addr);
  w.U64(x);
  w.U64(y);
  w.U64(z);
  w.U64(pitch);
  w.U64(height);
  return CUDA_SUCCESS;
}

CUresult WriteCopy(Session* s, const CUDA_MEMCPY3D* c, CUcontext ctx, Writer& w) {
  if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
  w.U64(H(ctx));
  if (CUresult r = WriteCopySide(s, c->srcMemoryType, c->srcHost, c->srcDevice, c->srcXInBytes, c->srcY,
                                 c->srcZ, c->srcPitch, c->srcHeight, w);
      r != CUDA_SUCCESS) {
    return r;
  }
  if (CUresult r = WriteCopySide(s, c->dstMemoryType, c->dstHost, c->dstDevice, c->dstXInBytes, c->dstY,
                                 c->dstZ, c->dstPitch, c->dstHeight, w);
      r != CUDA_SUCCESS) {
    return r;
  }
  w.U64(c->WidthInBytes);
  w.U64(c->Height);
  w.U64(c->Depth);
  return CUDA_SUCCESS;
}

void WriteMemset(const CUDA_MEMSET_NODE_PARAMS* m, CUcontext ctx, Writer& w) {
  w.U64(H(ctx));
  w.U64(m->dst);
  w.U64(m->pitch);
  w.U32(m->value);
  w.U32(m->elementSize);
  w.U64(m->width);
  w.U64(m->height);
}

void WriteAlloc(const CUDA_MEM_ALLOC_NODE_PARAMS* p, Writer& w) {
  w.U32(p->poolProps.location.type);
  w.I32(p->poolProps.location.id);
  w.U32(p->poolProps.allocType);
  w.U64(p->bytesize);
  w.U32(static_cast<uint32_t>(p->accessDescCount));
  for (size_t i = 0; i < p->accessDescCount; ++i) {
    w.U32(p->accessDescs[i].location.type);
    w.I32(p->accessDescs[i].location.id);
    w.U32(p->accessDescs[i].flags);
  }
}

}  // namespace

CUresult WriteSpec(Session* s, const NodeSpec& n, Writer& w) {
  w.U32(n.type);
  switch (n.type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: return WriteKernelNode(s, n.kernel, w);
    case CU_GRAPH_NODE_TYPE_MEMCPY: return WriteCopy(s, n.copy, n.ctx, w);
    case CU_GRAPH_NODE_TYPE_MEMSET:
      if (n.memset == nullptr) return CUDA_ERROR_INVALID_VALUE;
      WriteMemset(n.memset, n.ctx, w);
      return CUDA_SUCCESS;
    case CU_GRAPH_NODE_TYPE_HOST: {
      if (n.host_fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
      uint64_t id = 0;
      if (CUresult r = RegisterHostNode(s, n.host_fn, n.host_user, &id); r != CUDA_SUCCESS) return r;
      w.U64(id);
      return CUDA_SUCCESS;
    }
    case CU_GRAPH_NODE_TYPE_GRAPH:
      if (n.child == nullptr) return CUDA_ERROR_INVALID_VALUE;
      w.U64(H(n.child));
      return CUDA_SUCCESS;
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      if (n.event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      w.U64(H(n.event));
      return CUDA_SUCCESS;
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
      if (n.alloc == nullptr || n.alloc->accessDescCount > remote::kMaxDevices ||
          (n.alloc->accessDescCount > 0 && n.alloc->accessDescs == nullptr)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      WriteAlloc(n.alloc, w);
      return CUDA_SUCCESS;
    case CU_GRAPH_NODE_TYPE_MEM_FREE:
      w.U64(n.free_ptr);
      return CUDA_SUCCESS;
    case CU_GRAPH_NODE_TYPE_CONDITIONAL:
      // The handle travels unchanged: kernels set it on the device (cudaGraphSetConditional).
      if (n.cond == nullptr || n.cond->size == 0 || n.cond->size > remote::kMaxConditionalBodies) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      w.U64(n.cond->handle);
      w.U32(static_cast<uint32_t>(n.cond->type));
      w.U32(n.cond->size);
      w.U64(H(n.cond->ctx));
      return CUDA_SUCCESS;
    case CU_GRAPH_NODE_TYPE_EMPTY:
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

namespace {

void WriteHandles(const CUgraphNode* nodes, size_t n, Writer& w) {
  w.U32(static_cast<uint32_t>(n));
  for (size_t i = 0; i < n; ++i) w.U64(H(nodes[i]));
}

void WriteEdges(const CUgraphEdgeData* edges, size_t n, Writer& w) {
  w.U8(edges ? 1 : 0);
  for (size_t i = 0; edges && i < n; ++i) {
    w.U8(edges[i].from_port);
    w.U8(edges[i].to_port);
    w.U8(edges[i].type);
  }
}

}  // namespace

size_t SpecBytes(const NodeSpec& n, size_t ndeps) {
  return (n.type == CU_GRAPH_NODE_TYPE_KERNEL ? remote::kMaxKernelParamBytes : 0) + 8192 + ndeps * 12;
}

namespace {

CUresult AddNode(Fn fn, CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                 const CUgraphEdgeData* edges, size_t ndeps, const NodeSpec& spec) {
  if (node == nullptr || graph == nullptr || (ndeps > 0 && deps == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (ndeps > remote::kMaxGraphDeps) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  // Per call, not a thread_local vector (destroyed at exit before cudart's teardown may call here).
  std::vector<uint8_t> buf(SpecBytes(spec, ndeps));
  Writer w(buf.data(), buf.size());
  w.U64(H(graph));
  WriteHandles(deps, ndeps, w);
  if (fn == Fn::cuGraphAddNode_v2) WriteEdges(edges, ndeps, w);
  if (CUresult r = WriteSpec(s, spec, w); r != CUDA_SUCCESS) return r;
  if (!w.ok()) return CUDA_ERROR_INVALID_VALUE;
  ReplyView rv;
  CUresult r = CallSync(s, Op(fn), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t n = 0;
  if (!rv.reader.U64(&n)) return CUDA_ERROR_UNKNOWN;
  if (spec.type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
    uint64_t p = 0;
    if (!rv.reader.U64(&p)) return CUDA_ERROR_UNKNOWN;
    spec.alloc->dptr = p;
    // The address is fixed now: cuMemcpy's guess and pointer attributes know it from here on.
    RecordDeviceAlloc(s, p, spec.alloc->bytesize, 0);
    s->graph_allocs[H(graph)].allocs.push_back(p);
    s->graph_allocs[H(graph)].bytes[p] = spec.alloc->bytesize;
  } else if (spec.type == CU_GRAPH_NODE_TYPE_MEM_FREE) {
    s->graph_allocs[H(graph)].frees.push_back(spec.free_ptr);
  } else if (spec.type == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
    // The body graphs, in an array this side owns for the node's life (as the driver's is).
    uint32_t count = 0;
    if (!rv.reader.U32(&count) || count != spec.cond->size) return CUDA_ERROR_UNKNOWN;
    std::vector<CUgraph> bodies(count);
    for (CUgraph& b : bodies) {
      uint64_t h = 0;
      if (!rv.reader.U64(&h)) return CUDA_ERROR_UNKNOWN;
      b = reinterpret_cast<CUgraph>(h);
    }
    auto& kept = s->conditional_bodies[n];
    kept = std::move(bodies);
    spec.cond->phGraph_out = kept.data();
  }
  *node = reinterpret_cast<CUgraphNode>(n);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult ExecSetParams(Fn fn, CUgraphExec exec, CUgraphNode node, const NodeSpec& spec) {
  if (exec == nullptr || node == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  std::vector<uint8_t> buf(SpecBytes(spec, 0));
  Writer w(buf.data(), buf.size());
  w.U64(H(exec));
  w.U64(H(node));
  if (CUresult r = WriteSpec(l.session(), spec, w); r != CUDA_SUCCESS) return r;
  return CallSync(l.session(), Op(fn), w, nullptr);
}

namespace {

CUresult HandleCall(Fn fn, uint64_t h) {
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(h);
  return CallSync(l.session(), Op(fn), w, nullptr);
}

CUresult ExecOnStream(Fn fn, CUgraphExec exec, CUstream stream) {
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  w.U64(H(exec));
  w.U64(H(stream));
  if (fn != Fn::cuGraphUpload) {
    if (CUresult r = SendGraphHostSources(s, H(exec)); r != CUDA_SUCCESS) return r;
  }
  CUresult r = SendAsync(s, Op(fn), w);
  if (r == CUDA_SUCCESS && fn != Fn::cuGraphUpload) {
    auto it = s->exec_host_nodes.find(H(exec));
    if (it != s->exec_host_nodes.end() && it->second > 0) HostNodeRunsLaunched(it->second);
    if (auto o = s->exec_outliving.find(H(exec)); o != s->exec_outliving.end()) {
      for (const auto& [p, n] : o->second) {
        if (!s->allocs.count(p)) RecordDeviceAlloc(s, p, n, 0);
      }
    }
  }
  return r;
}

// A list query (session_graphs.cc Query): fills up to capacity entries, returns the count.
struct ListEntry {
  uint64_t a = 0, b = 0;
  CUgraphEdgeData edge{};
};
CUresult List(Fn fn, uint64_t h, size_t capacity, bool pairs, bool edges, std::vector<ListEntry>* out,
              uint64_t* count) {
  if (capacity > remote::kMaxGraphDeps) capacity = remote::kMaxGraphDeps;
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[12];
  Writer w(buf, sizeof(buf));
  w.U64(h);
  w.U32(static_cast<uint32_t>(capacity));
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(fn), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  if (!rv.reader.U64(count)) return CUDA_ERROR_UNKNOWN;
  const size_t n = *count < capacity ? *count : capacity;
  out->resize(n);
  for (ListEntry& e : *out) {
    if (!rv.reader.U64(&e.a)) return CUDA_ERROR_UNKNOWN;
    if (pairs && !rv.reader.U64(&e.b)) return CUDA_ERROR_UNKNOWN;
    if (edges) {
      rv.reader.U8(&e.edge.from_port);
      rv.reader.U8(&e.edge.to_port);
      if (!rv.reader.U8(&e.edge.type)) return CUDA_ERROR_UNKNOWN;
    }
  }
  return CUDA_SUCCESS;
}

// The driver's list semantics: with the array NULL, the count; else up to *n entries and the
// count of those written.
CUresult NodeList(Fn fn, uint64_t h, CUgraphNode* nodes, CUgraphEdgeData* edge_data, size_t* n,
                  bool edges) {
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<ListEntry> got;
  uint64_t count = 0;
  CUresult r = List(fn, h, nodes ? *n : 0, false, edges, &got, &count);
  if (r != CUDA_SUCCESS) return r;
  if (nodes == nullptr) {
    *n = count;
    return CUDA_SUCCESS;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    nodes[i] = reinterpret_cast<CUgraphNode>(got[i].a);
    if (edge_data) edge_data[i] = got[i].edge;
  }
  for (size_t i = got.size(); i < *n; ++i) nodes[i] = nullptr;
  *n = got.size();
  return CUDA_SUCCESS;
}

CUresult Dependencies(Fn fn, CUgraph graph, const CUgraphNode* from, const CUgraphNode* to,
                      const CUgraphEdgeData* edges, size_t n) {
  if (graph == nullptr || n > remote::kMaxGraphDeps || (n > 0 && (from == nullptr || to == nullptr))) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  TF_LOCK(l);
  TF_CTX(l);
  std::vector<uint8_t> buf(64 + n * 20);
  Writer w(buf.data(), buf.size());
  w.U64(H(graph));
  WriteHandles(from, n, w);
  WriteHandles(to, n, w);
  WriteEdges(edges, n, w);
  return CallSync(l.session(), Op(fn), w, nullptr);
}

// A graph allocation at p outlives a launch unless the graph frees it; the driver may give a later
// allocation the address of one the graph freed before it, and that one outlives it.
bool Outlives(const Session::GraphAllocs& g, uint64_t p) {
  return std::count(g.allocs.begin(), g.allocs.end(), p) > 1 ||
         std::find(g.frees.begin(), g.frees.end(), p) == g.frees.end();
}

// Reads an executable graph's host-node count from a reply and remembers it, with the graph
// allocations of `graph` that outlive a launch.
void RememberExec(Session* s, uint64_t exec, uint64_t graph, Reader& rd) {
  uint32_t host = 0;
  if (rd.U32(&host) && exec) s->exec_host_nodes[exec] = host;
  if (exec == 0) return;
  s->exec_outliving.erase(exec);
  auto g = s->graph_allocs.find(graph);
  if (g == s->graph_allocs.end()) return;
  for (const auto& [p, n] : g->second.bytes) {
    if (Outlives(g->second, p)) s->exec_outliving[exec].emplace_back(p, n);
  }
}

}  // namespace

CUresult Impl_cuGraphCreate(CUgraph* graph, unsigned int flags) {
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[4];
  Writer w(buf, sizeof(buf));
  w.U32(flags);
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuGraphCreate), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t g = 0;
  if (!rv.reader.U64(&g)) return CUDA_ERROR_UNKNOWN;
  *graph = reinterpret_cast<CUgraph>(g);
  return CUDA_SUCCESS;
}

// The handle is the worker driver's value: device code sets it (cudaGraphSetConditional).
CUresult Impl_cuGraphConditionalHandleCreate(CUgraphConditionalHandle* handle, CUgraph graph,
                                             CUcontext ctx, unsigned int default_value,
                                             unsigned int flags) {
  if (handle == nullptr || graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[24];
  Writer w(buf, sizeof(buf));
  w.U64(H(graph));
  w.U64(H(ctx));
  w.U32(default_value);
  w.U32(flags);
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuGraphConditionalHandleCreate), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t h = 0;
  if (!rv.reader.U64(&h)) return CUDA_ERROR_UNKNOWN;
  *handle = h;
  return CUDA_SUCCESS;
}

CUresult Impl_cuGraphAddKernelNode_v2(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                      size_t ndeps, const CUDA_KERNEL_NODE_PARAMS* params) {
  NodeSpec n;
  n.type = CU_GRAPH_NODE_TYPE_KERNEL;
  n.kernel = params;
  return AddNode(Fn::cuGraphAddKernelNode_v2, node, graph, deps, nullptr, ndeps, n);
}

CUresult Impl_cuGraphAddMemcpyNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                   size_t ndeps, const CUDA_MEMCPY3D* copy, CUcontext ctx) {
  NodeSpec n;
  n.type = CU_GRAPH_NODE_TYPE_MEMCPY;
  n.copy = copy;
  n.ctx = ctx;
  return AddNode(Fn::cuGraphAddMemcpyNode, node, graph, deps, nullptr, ndeps, n);
}

CUresult Impl_cuGraphAddMemsetNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                   size_t ndeps, const CUDA_MEMSET_NODE_PARAMS* params, CUcontext ctx) {
  NodeSpec n;
  n.type = CU_GRAPH_NODE_TYPE_MEMSET;
  n.memset = params;
  n.ctx = ctx;
  return AddNode(Fn::cuGraphAddMemsetNode, node, graph, deps, nullptr, ndeps, n);
}

CUresult Impl_cuGraphAddHostNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                 size_t ndeps, const CUDA_HOST_NODE_PARAMS* params) {
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  NodeSpec n;
  n.type = CU_GRAPH_NODE_TYPE_HOST;
  n.host_fn = params->fn;
  n.host_user = params->userData;
  return AddNode(Fn::cuGraphAddHostNode, node, graph, deps, nullptr, ndeps, n);
}

CUresult Impl_cuGraphAddEmptyNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps, size_t ndeps) {
  return AddNode(Fn::cuGraphAddEmptyNode, node, graph, deps, nullptr, ndeps, NodeSpec{});
}

CUresult Impl_cuGraphAddEventRecordNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                        size_t ndeps, CUevent event) {
  NodeSpec n;
  n.type = CU_GRAPH_NODE_TYPE_EVENT_RECORD;
  n.event = event;
  return AddNode(Fn::cuGraphAddEventRecordNode, node, graph, deps, nullptr, ndeps, n);
}

CUresult Impl_cuGraphAddEventWaitNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                      size_t ndeps, CUevent event) {
  NodeSpec n;
  n.type = CU_GRAPH_NODE_TYPE_WAIT_EVENT;
  n.event = event;
  return AddNode(Fn::cuGraphAddEventWaitNode, node, graph, deps, nullptr, ndeps, n);
}

CUresult Impl_cuGraphAddChildGraphNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                       size_t ndeps, CUgraph child) {
  NodeSpec n;
  n.type = CU_GRAPH_NODE_TYPE_GRAPH;
  n.child = child;
  return AddNode(Fn::cuGraphAddChildGraphNode, node, graph, deps, nullptr, ndeps, n);
}

CUresult Impl_cuGraphAddMemAllocNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                     size_t ndeps, CUDA_MEM_ALLOC_NODE_PARAMS* params) {
  NodeSpec n;
  n.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
  n.alloc = params;
  return AddNode(Fn::cuGraphAddMemAllocNode, node, graph, deps, nullptr, ndeps, n);
}

CUresult Impl_cuGraphAddMemFreeNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                    size_t ndeps, CUdeviceptr dptr) {
  NodeSpec n;
  n.type = CU_GRAPH_NODE_TYPE_MEM_FREE;
  n.free_ptr = dptr;
  return AddNode(Fn::cuGraphAddMemFreeNode, node, graph, deps, nullptr, ndeps, n);
}

CUresult SpecOfParams(CUgraphNodeParams* p, NodeSpec* out, NodeSpecStorage* st) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  NodeSpec& n = *out;
  n = NodeSpec{};
  n.type = p->type;
  CUDA_KERNEL_NODE_PARAMS& kernel = st->kernel;
  CUDA_MEMSET_NODE_PARAMS& memset = st->memset;
  CUDA_MEM_ALLOC_NODE_PARAMS& alloc = st->alloc;
  switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
      kernel.func = p->kernel.func;
      kernel.kern = p->kernel.kern;
      kernel.gridDimX = p->kernel.gridDimX;
      kernel.gridDimY = p->kernel.gridDimY;
      kernel.gridDimZ = p->kernel.gridDimZ;
      kernel.blockDimX = p->kernel.blockDimX;
      kernel.blockDimY = p->kernel.blockDimY;
      kernel.blockDimZ = p->kernel.blockDimZ;
      kernel.sharedMemBytes = p->kernel.sharedMemBytes;
      kernel.kernelParams = p->kernel.kernelParams;
      kernel.extra = p->kernel.extra;
      n.kernel = &kernel;
      break;
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      if (p->memcpy.flags != 0) return CUDA_ERROR_INVALID_VALUE;
      n.copy = &p->memcpy.copyParams;
      n.ctx = p->memcpy.copyCtx;
      break;
    case CU_GRAPH_NODE_TYPE_MEMSET:
      memset.dst = p->memset.dst;
      memset.pitch = p->memset.pitch;
      memset.value = p->memset.value;
      memset.elementSize = p->memset.elementSize;
      memset.width = p->memset.width;
      memset.height = p->memset.height;
      n.memset = &memset;
      n.ctx = p->memset.ctx;
      break;
    case CU_GRAPH_NODE_TYPE_HOST:
      n.host_fn = p->host.fn;
      n.host_user = p->host.userData;
      break;
    case CU_GRAPH_NODE_TYPE_GRAPH:
      if (p->graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE) return CUDA_ERROR_NOT_SUPPORTED;
      n.child = p->graph.graph;
      break;
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD: n.event = p->eventRecord.event; break;
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: n.event = p->eventWait.event; break;
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
      alloc.poolProps = p->alloc.poolProps;
      alloc.accessDescs = p->alloc.accessDescs;
      alloc.accessDescCount = p->alloc.accessDescCount;
      alloc.bytesize = p->alloc.bytesize;
      n.alloc = &alloc;
      break;
    case CU_GRAPH_NODE_TYPE_MEM_FREE: n.free_ptr = p->free.dptr; break;
    case CU_GRAPH_NODE_TYPE_CONDITIONAL: n.cond = &p->conditional; break;
    case CU_GRAPH_NODE_TYPE_EMPTY: break;
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}

// The generic entry point, for the node types above (the typed calls' parameters travel).
CUresult Impl_cuGraphAddNode_v2(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                const CUgraphEdgeData* edges, size_t ndeps, CUgraphNodeParams* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  NodeSpec n;
  NodeSpecStorage st;
  if (CUresult r = SpecOfParams(p, &n, &st); r != CUDA_SUCCESS) return r;
  CUDA_MEM_ALLOC_NODE_PARAMS& alloc = st.alloc;
  CUresult r = AddNode(Fn::cuGraphAddNode_v2, node, graph, deps, edges, ndeps, n);
  if (r == CUDA_SUCCESS && p->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) p->alloc.dptr = alloc.dptr;
  return r;
}

CUresult Impl_cuGraphAddNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps, size_t ndeps,
                             CUgraphNodeParams* p) {
  return Impl_cuGraphAddNode_v2(node, graph, deps, nullptr, ndeps, p);
}

CUresult Impl_cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  w.U64(H(graph));
  w.U64(flags);
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuGraphInstantiateWithFlags), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t e = 0;
  if (!rv.reader.U64(&e)) return CUDA_ERROR_UNKNOWN;
  RememberExec(l.session(), e, H(graph), rv.reader);
  *exec = reinterpret_cast<CUgraphExec>(e);
  return CUDA_SUCCESS;
}

CUresult Impl_cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph graph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  if (exec == nullptr || params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[24];
  Writer w(buf, sizeof(buf));
  w.U64(H(graph));
  w.U64(params->flags);
  w.U64(H(params->hUploadStream));
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuGraphInstantiateWithParams), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  int32_t result = 0;
  uint64_t e = 0, err_node = 0;
  uint32_t status = 0;
  rv.reader.I32(&result);
  rv.reader.U64(&e);
  rv.reader.U32(&status);
  if (!rv.reader.U64(&err_node)) return CUDA_ERROR_UNKNOWN;
  RememberExec(l.session(), e, H(graph), rv.reader);
  params->result_out = static_cast<CUgraphInstantiateResult>(status);
  params->hErrNode_out = reinterpret_cast<CUgraphNode>(err_node);
  if (result == CUDA_SUCCESS) *exec = reinterpret_cast<CUgraphExec>(e);
  return static_cast<CUresult>(result);
}
CUresult Impl_cuGraphInstantiateWithParams_ptsz(CUgraphExec* exec, CUgraph graph,
                                                CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  return Impl_cuGraphInstantiateWithParams(exec, graph, params);
}

CUresult Impl_cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  return ExecOnStream(Fn::cuGraphLaunch, exec, stream);
}
CUresult Impl_cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
  return ExecOnStream(Fn::cuGraphLaunch_ptsz, exec, stream);
}
CUresult Impl_cuGraphUpload(CUgraphExec exec, CUstream stream) {
  return ExecOnStream(Fn::cuGraphUpload, exec, stream);
}
CUresult Impl_cuGraphUpload_ptsz(CUgraphExec exec, CUstream stream) {
  return ExecOnStream(Fn::cuGraphUpload, exec, stream);
}

CUresult Impl_cuGraphExecKernelNodeSetParams_v2(CUgraphExec exec, CUgraphNode node,
                                                const CUDA_KERNEL_NODE_PARAMS* params) {
  NodeSpec n;
  n.type = CU_GRAPH_NODE_TYPE_KERNEL;
  n.kernel = params;
  return ExecSetParams(Fn::cuGraphExecKernelNodeSetParams_v2, exec, node, n);
}

CUresult Impl_cuGraphExecMemcpyNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                             const CUDA_MEMCPY3D* copy, CUcontext ctx) {
  NodeSpec n;
  n.type = CU_GRAPH_NODE_TYPE_MEMCPY;
  n.copy = copy;
  n.ctx = ctx;
  CUresult r = ExecSetParams(Fn::cuGraphExecMemcpyNodeSetParams, exec, node, n);
  if (r == CUDA_SUCCESS) {
    TF_LOCK(l);
    ForgetGraphHostCopies(l.session(), H(exec));
  }
  return r;
}

CUresult Impl_cuGraphExecMemsetNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                             const CUDA_MEMSET_NODE_PARAMS* params, CUcontext ctx) {
  NodeSpec n;
  n.type = CU_GRAPH_NODE_TYPE_MEMSET;
  n.memset = params;
  n.ctx = ctx;
  return ExecSetParams(Fn::cuGraphExecMemsetNodeSetParams, exec, node, n);
}

CUresult Impl_cuGraphExecHostNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                           const CUDA_HOST_NODE_PARAMS* params) {
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  NodeSpec n;
  n.type = CU_GRAPH_NODE_TYPE_HOST;
  n.host_fn = params->fn;
  n.host_user = params->userData;
  return ExecSetParams(Fn::cuGraphExecHostNodeSetParams, exec, node, n);
}

CUresult Impl_cuGraphExecChildGraphNodeSetParams(CUgraphExec exec, CUgraphNode node, CUgraph child) {
  NodeSpec n;
  n.type = CU_GRAPH_NODE_TYPE_GRAPH;
  n.child = child;
  CUresult r = ExecSetParams(Fn::cuGraphExecChildGraphNodeSetParams, exec, node, n);
  if (r == CUDA_SUCCESS) {
    TF_LOCK(l);
    ForgetGraphHostCopies(l.session(), H(exec));
  }
  return r;
}

CUresult Impl_cuGraphExecUpdate_v2(CUgraphExec exec, CUgraph graph, CUgraphExecUpdateResultInfo* info) {
  if (info == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  w.U64(H(exec));
  w.U64(H(graph));
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuGraphExecUpdate_v2), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  int32_t result = 0;
  uint32_t status = 0;
  uint64_t err = 0, err_from = 0;
  rv.reader.I32(&result);
  rv.reader.U32(&status);
  rv.reader.U64(&err);
  if (!rv.reader.U64(&err_from)) return CUDA_ERROR_UNKNOWN;
  RememberExec(l.session(), H(exec), H(graph), rv.reader);
  ForgetGraphHostCopies(l.session(), H(exec));
  info->result = static_cast<CUgraphExecUpdateResult>(status);
  info->errorNode = reinterpret_cast<CUgraphNode>(err);
  info->errorFromNode = reinterpret_cast<CUgraphNode>(err_from);
  return static_cast<CUresult>(result);
}

CUresult Impl_cuGraphExecDestroy(CUgraphExec exec) {
  CUresult r = HandleCall(Fn::cuGraphExecDestroy, H(exec));
  if (r == CUDA_SUCCESS) {
    TF_LOCK(l);
    l.session()->exec_host_nodes.erase(H(exec));
    l.session()->exec_outliving.erase(H(exec));
    ForgetGraphHostCopies(l.session(), H(exec));
  }
  return r;
}

// Graph allocations the graph itself frees leave the allocation table with the graph (as on the
// worker); others stay until cuMemFree(Async).
CUresult Impl_cuGraphDestroy(CUgraph graph) {
  CUresult r = HandleCall(Fn::cuGraphDestroy, H(graph));
  if (r != CUDA_SUCCESS) return r;
  TF_LOCK(l);
  Session* s = l.session();
  auto it = s->graph_allocs.find(H(graph));
  if (it == s->graph_allocs.end()) return CUDA_SUCCESS;
  for (const auto& [p, n] : it->second.bytes) {
    if (!Outlives(it->second, p)) s->allocs.erase(p);
  }
  s->graph_allocs.erase(it);
  return CUDA_SUCCESS;
}

CUresult Impl_cuGraphClone(CUgraph* clone, CUgraph graph) {
  if (clone == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(H(graph));
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuGraphClone), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t g = 0;
  if (!rv.reader.U64(&g)) return CUDA_ERROR_UNKNOWN;
  *clone = reinterpret_cast<CUgraph>(g);
  return CUDA_SUCCESS;
}

CUresult Impl_cuGraphDestroyNode(CUgraphNode node) { return HandleCall(Fn::cuGraphDestroyNode, H(node)); }


// The arguments come back by the function's layout and stay valid until the next call of this
// entry point (the driver's own copy lives as long as the node).
CUresult Impl_cuGraphKernelNodeGetParams_v2(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(H(node));
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuGraphKernelNodeGetParams_v2), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t f = 0, kern = 0, ctx = 0;
  uint32_t v[7] = {}, n = 0;
  rv.reader.U64(&f);
  rv.reader.U64(&kern);
  rv.reader.U64(&ctx);
  for (uint32_t& x : v) rv.reader.U32(&x);
  if (!rv.reader.U32(&n)) return CUDA_ERROR_UNKNOWN;
  *p = CUDA_KERNEL_NODE_PARAMS{};
  p->func = reinterpret_cast<CUfunction>(f);
  p->kern = reinterpret_cast<CUkernel>(kern);
  p->ctx = reinterpret_cast<CUcontext>(ctx);
  p->gridDimX = v[0];
  p->gridDimY = v[1];
  p->gridDimZ = v[2];
  p->blockDimX = v[3];
  p->blockDimY = v[4];
  p->blockDimZ = v[5];
  p->sharedMemBytes = v[6];
  if (n == remote::kUnknownParamCount) return CUDA_SUCCESS;
  if (n > remote::kMaxKernelParams) return CUDA_ERROR_UNKNOWN;
  s->node_args.assign(n, {});
  s->node_arg_ptrs.assign(n, nullptr);
  for (uint32_t i = 0; i < n; ++i) {
    const uint8_t* data = nullptr;
    uint32_t len = 0;
    if (!rv.reader.Blob(&data, &len, remote::kMaxKernelParamBytes)) return CUDA_ERROR_UNKNOWN;
    s->node_args[i].assign(data, data + len);
    s->node_arg_ptrs[i] = s->node_args[i].data();
  }
  p->kernelParams = n ? s->node_arg_ptrs.data() : nullptr;
  return CUDA_SUCCESS;
}

CUresult Impl_cuGraphKernelNodeSetParams_v2(CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS* params) {
  TF_LOCK(l);
  TF_CTX(l);
  std::vector<uint8_t> buf(remote::kMaxKernelParamBytes + 8192);
  Writer w(buf.data(), buf.size());
  w.U64(H(node));
  w.U32(CU_GRAPH_NODE_TYPE_KERNEL);
  if (CUresult r = WriteKernelNode(l.session(), params, w); r != CUDA_SUCCESS) return r;
  return CallSync(l.session(), Op(Fn::cuGraphKernelNodeSetParams_v2), w, nullptr);
}

CUresult Impl_cuGraphGetNodes(CUgraph graph, CUgraphNode* nodes, size_t* n) {
  return NodeList(Fn::cuGraphGetNodes, H(graph), nodes, nullptr, n, false);
}
CUresult Impl_cuGraphGetRootNodes(CUgraph graph, CUgraphNode* nodes, size_t* n) {
  return NodeList(Fn::cuGraphGetRootNodes, H(graph), nodes, nullptr, n, false);
}
CUresult Impl_cuGraphNodeGetDependencies_v2(CUgraphNode node, CUgraphNode* deps, CUgraphEdgeData* edges,
                                            size_t* n) {
  return NodeList(Fn::cuGraphNodeGetDependencies_v2, H(node), deps, edges, n, true);
}
CUresult Impl_cuGraphNodeGetDependencies(CUgraphNode node, CUgraphNode* deps, size_t* n) {
  return NodeList(Fn::cuGraphNodeGetDependencies_v2, H(node), deps, nullptr, n, true);
}

CUresult Impl_cuGraphNodeGetDependentNodes_v2(CUgraphNode node, CUgraphNode* deps, CUgraphEdgeData* edges,
                                              size_t* n) {
  return NodeList(Fn::cuGraphNodeGetDependentNodes_v2, H(node), deps, edges, n, true);
}
CUresult Impl_cuGraphNodeGetDependentNodes(CUgraphNode node, CUgraphNode* deps, size_t* n) {
  return NodeList(Fn::cuGraphNodeGetDependentNodes_v2, H(node), deps, nullptr, n, true);
}

CUresult Impl_cuGraphGetEdges_v2(CUgraph graph, CUgraphNode* from, CUgraphNode* to, CUgraphEdgeData* edges,
                                 size_t* n) {
  if (n == nullptr || ((from == nullptr) != (to == nullptr))) return CUDA_ERROR_INVALID_VALUE;
  std::vector<ListEntry> got;
  uint64_t count = 0;
  CUresult r = List(Fn::cuGraphGetEdges_v2, H(graph), from ? *n : 0, true, true, &got, &count);
  if (r != CUDA_SUCCESS) return r;
  if (from == nullptr) {
    *n = count;
    return CUDA_SUCCESS;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    from[i] = reinterpret_cast<CUgraphNode>(got[i].a);
    to[i] = reinterpret_cast<CUgraphNode>(got[i].b);
    if (edges) edges[i] = got[i].edge;
  }
  *n = got.size();
  return CUDA_SUCCESS;
}
CUresult Impl_cuGraphGetEdges(CUgraph graph, CUgraphNode* from, CUgraphNode* to, size_t* n) {
  return Impl_cuGraphGetEdges_v2(graph, from, to, nullptr, n);
}

CUresult Impl_cuGraphAddDependencies_v2(CUgraph graph, const CUgraphNode* from, const CUgraphNode* to,
                                        const CUgraphEdgeData* edges, size_t n) {
  return Dependencies(Fn::cuGraphAddDependencies_v2, graph, from, to, edges, n);
}
CUresult Impl_cuGraphAddDependencies(CUgraph graph, const CUgraphNode* from, const CUgraphNode* to, size_t n) {
  return Dependencies(Fn::cuGraphAddDependencies_v2, graph, from, to, nullptr, n);
}
CUresult Impl_cuGraphRemoveDependencies_v2(CUgraph graph, const CUgraphNode* from, const CUgraphNode* to,
                                           const CUgraphEdgeData* edges, size_t n) {
  return Dependencies(Fn::cuGraphRemoveDependencies_v2, graph, from, to, edges, n);
}
CUresult Impl_cuGraphRemoveDependencies(CUgraph graph, const CUgraphNode* from, const CUgraphNode* to,
                                        size_t n) {
  return Dependencies(Fn::cuGraphRemoveDependencies_v2, graph, from, to, nullptr, n);
}

}  // namespace tf::client
