// CUDA graphs of one session (session_graphs.h). Formats: remote_protocol.h "Graphs".
#include "worker/session_graphs.h"

#include "worker/session_graph_host.h"

#include <cstring>

namespace tf::worker {
namespace {

using driver::Fn;
using transport::Reader;
using transport::Writer;

uint64_t H(const void* p) { return reinterpret_cast<uint64_t>(p); }
template <class T>
T As(uint64_t v) {
  return reinterpret_cast<T>(v);
}

#define CALL(fn, ...) (d().fn ? d().fn(__VA_ARGS__) : CUDA_ERROR_NOT_SUPPORTED)

// Copy and memset extents beyond this are refused before any arithmetic (no overflow below).
constexpr uint64_t kMaxExtent = 1ull << 40;

void WriteEdge(const CUgraphEdgeData* e, Writer& out) {
  out.U8(e ? e->from_port : 0);
  out.U8(e ? e->to_port : 0);
  out.U8(e ? e->type : 0);
}

}  // namespace

bool SessionGraphs::Handles(Fn fn) {
  switch (fn) {
    case Fn::cuGraphCreate:
    case Fn::cuGraphAddKernelNode_v2:
    case Fn::cuGraphAddMemcpyNode:
    case Fn::cuGraphAddMemsetNode:
    case Fn::cuGraphAddHostNode:
    case Fn::cuGraphAddEmptyNode:
    case Fn::cuGraphAddEventRecordNode:
    case Fn::cuGraphAddEventWaitNode:
    case Fn::cuGraphAddChildGraphNode:
    case Fn::cuGraphAddMemAllocNode:
    case Fn::cuGraphAddMemFreeNode:
    case Fn::cuGraphAddNode_v2:
    case Fn::cuGraphInstantiateWithFlags:
    case Fn::cuGraphInstantiateWithParams:
    case Fn::cuGraphLaunch:
    case Fn::cuGraphLaunch_ptsz:
    case Fn::cuGraphUpload:
    case Fn::cuGraphExecKernelNodeSetParams_v2:
    case Fn::cuGraphExecMemcpyNodeSetParams:
    case Fn::cuGraphExecMemsetNodeSetParams:
    case Fn::cuGraphExecHostNodeSetParams:
    case Fn::cuGraphExecChildGraphNodeSetParams:
    case Fn::cuGraphExecEventRecordNodeSetEvent:
    case Fn::cuGraphExecEventWaitNodeSetEvent:
    case Fn::cuGraphExecUpdate_v2:
    case Fn::cuGraphNodeSetEnabled:
    case Fn::cuGraphNodeGetEnabled:
    case Fn::cuGraphExecDestroy:
    case Fn::cuGraphDestroy:
    case Fn::cuGraphConditionalHandleCreate:
    case Fn::cuGraphGetNodes:
    case Fn::cuGraphGetRootNodes:
    case Fn::cuGraphGetEdges_v2:
    case Fn::cuGraphNodeGetDependencies_v2:
    case Fn::cuGraphKernelNodeGetParams_v2:
    case Fn::cuGraphKernelNodeSetParams_v2:
    case Fn::cuGraphAddDependencies_v2:
    case Fn::cuGraphRemoveDependencies_v2:
    case Fn::cuGraphDestroyNode:
    case Fn::cuGraphClone:
    case Fn::cuStreamBeginCapture:
    case Fn::cuStreamBeginCapture_ptsz:
    case Fn::cuStreamBeginCapture_v2:
    case Fn::cuStreamBeginCapture_v2_ptsz:
    case Fn::cuStreamBeginCaptureToGraph:
    case Fn::cuStreamEndCapture:
    case Fn::cuStreamEndCapture_ptsz:
    case Fn::cuStreamGetCaptureInfo_v3:
    case Fn::cuStreamUpdateCaptureDependencies_v2:
    case Fn::cuGraphNodeGetDependentNodes_v2:
      return true;
    default:
      return HandlesNodeCall(fn) || HandlesUserObjectCall(fn);
  }
}

CUresult SessionGraphs::Call(Fn fn, Reader& rd, Writer& out) {
  switch (fn) {
    case Fn::cuGraphCreate: {
      uint32_t flags = 0;
      if (!rd.U32(&flags) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      CUgraph g = nullptr;
      CUresult r = CALL(cuGraphCreate, &g, flags);
      if (r != CUDA_SUCCESS) return r;
      graphs_[H(g)];
      out.U64(GraphName(H(g)));
      return CUDA_SUCCESS;
    }
    case Fn::cuGraphAddKernelNode_v2:
    case Fn::cuGraphAddMemcpyNode:
    case Fn::cuGraphAddMemsetNode:
    case Fn::cuGraphAddHostNode:
    case Fn::cuGraphAddEmptyNode:
    case Fn::cuGraphAddEventRecordNode:
    case Fn::cuGraphAddEventWaitNode:
    case Fn::cuGraphAddChildGraphNode:
    case Fn::cuGraphAddMemAllocNode:
    case Fn::cuGraphAddMemFreeNode:
    case Fn::cuGraphAddNode_v2:
      return AddNode(fn, rd, out);
    case Fn::cuGraphExecKernelNodeSetParams_v2:
    case Fn::cuGraphExecMemcpyNodeSetParams:
    case Fn::cuGraphExecMemsetNodeSetParams:
    case Fn::cuGraphExecHostNodeSetParams:
    case Fn::cuGraphExecChildGraphNodeSetParams:
      return SetExecParams(fn, rd);
    case Fn::cuGraphGetNodes:
    case Fn::cuGraphGetRootNodes:
    case Fn::cuGraphGetEdges_v2:
    case Fn::cuGraphNodeGetDependencies_v2:
    case Fn::cuGraphNodeGetDependentNodes_v2:
    case Fn::cuGraphKernelNodeGetParams_v2:
      return Query(fn, rd, out);
    case Fn::cuGraphKernelNodeSetParams_v2:
    case Fn::cuGraphAddDependencies_v2:
    case Fn::cuGraphRemoveDependencies_v2:
    case Fn::cuGraphDestroyNode:
    case Fn::cuGraphClone:
    case Fn::cuGraphDestroy:
      return Edit(fn, rd, out);
    case Fn::cuGraphConditionalHandleCreate:
      return ConditionalHandle(rd, out);
    case Fn::cuStreamBeginCapture:
    case Fn::cuStreamBeginCapture_ptsz:
    case Fn::cuStreamBeginCapture_v2:
    case Fn::cuStreamBeginCapture_v2_ptsz:
    case Fn::cuStreamBeginCaptureToGraph:
    case Fn::cuStreamEndCapture:
    case Fn::cuStreamEndCapture_ptsz:
    case Fn::cuStreamGetCaptureInfo_v3:
    case Fn::cuStreamUpdateCaptureDependencies_v2:
      return Capture(fn, rd, out);
    default:
      if (IsGenerated(fn)) return GeneratedCall(fn, rd, out);
      if (HandlesNodeCall(fn)) return NodeCall(fn, rd, out);
      if (HandlesUserObjectCall(fn)) return UserObjectCall(fn, rd, out);
      return Exec(fn, rd, out);
  }
}

bool SessionGraphs::ReadNodes(Reader& rd, uint64_t g, std::vector<CUgraphNode>* nodes) {
  uint32_t n = 0;
  if (!rd.U32(&n) || n > remote::kMaxGraphDeps) return false;
  nodes->resize(n);
  for (auto& node : *nodes) {
    uint64_t h = 0;
    if (!ReadReal(rd, HandleKind::kGraphNode, &h) || !Node(h, g)) return false;
    node = As<CUgraphNode>(h);
  }
  return true;
}

bool SessionGraphs::ReadEdges(Reader& rd, size_t n, std::vector<CUgraphEdgeData>* edges) {
  uint8_t present = 0;
  if (!rd.U8(&present) || present > 1) return false;
  edges->clear();
  if (!present) return true;
  edges->resize(n);
  for (auto& e : *edges) {
    e = CUgraphEdgeData{};
    rd.U8(&e.from_port);
    rd.U8(&e.to_port);
    if (!rd.U8(&e.type)) return false;
  }
  return true;
}

// One side of a copy: u32 memory type (host or device), u64 address, u64 x (bytes), y, z,
// u64 pitch, u64 height; the extent follows both sides: u64 width (bytes), height, depth.
CUresult SessionGraphs::DecodeCopy(Reader& rd, CUDA_MEMCPY3D* c) {
  struct Side {
    uint32_t type = 0;
    uint64_t addr = 0, x = 0, y = 0, z = 0, pitch = 0, height = 0;
  } side[2];
  for (Side& s : side) {
    rd.U32(&s.type);
    rd.U64(&s.addr);
    rd.U64(&s.x);
    rd.U64(&s.y);
    rd.U64(&s.z);
    rd.U64(&s.pitch);
    rd.U64(&s.height);
  }
  uint64_t w = 0, hgt = 0, depth = 0;
  rd.U64(&w);
  rd.U64(&hgt);
  if (!rd.U64(&depth)) return CUDA_ERROR_INVALID_VALUE;
  if (w == 0 || hgt == 0 || depth == 0 || w > kMaxExtent || hgt > kMaxExtent || depth > kMaxExtent) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *c = CUDA_MEMCPY3D{};
  void* local[2] = {};
  for (int i = 0; i < 2; ++i) {
    Side& s = side[i];
    if (s.x > kMaxExtent || s.y > kMaxExtent || s.z > kMaxExtent || s.pitch > kMaxExtent ||
        s.height > kMaxExtent) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const uint64_t pitch = s.pitch ? s.pitch : w;
    const uint64_t rows = s.height ? s.height : hgt;
    if ((hgt > 1 || depth > 1) && pitch < s.x + w) return CUDA_ERROR_INVALID_VALUE;
    if (depth > 1 && rows < s.y + hgt) return CUDA_ERROR_INVALID_VALUE;
    // The bytes touched: from the first row's start to the last row's end.
    const unsigned __int128 start =
        static_cast<unsigned __int128>(s.z) * pitch * rows + static_cast<unsigned __int128>(s.y) * pitch + s.x;
    const unsigned __int128 span = static_cast<unsigned __int128>(depth - 1) * pitch * rows +
                                   static_cast<unsigned __int128>(hgt - 1) * pitch + w;
    if (start + span > kMaxExtent || s.addr + static_cast<uint64_t>(start) < s.addr) return CUDA_ERROR_INVALID_VALUE;
    const uint64_t first = s.addr + static_cast<uint64_t>(start);
    if (s.type == CU_MEMORYTYPE_DEVICE) {
      if (!h_.DeviceRange(first, static_cast<uint64_t>(span))) return CUDA_ERROR_INVALID_VALUE;
    } else if (s.type == CU_MEMORYTYPE_HOST) {
      void* p = h_.HostRegionAddress(first, static_cast<uint64_t>(span));
      if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;  // not page-locked memory shared with us
      local[i] = static_cast<uint8_t*>(p) - static_cast<uint64_t>(start);
    } else {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  c->srcMemoryType = static_cast<CUmemorytype>(side[0].type);
  c->srcXInBytes = side[0].x;
  c->srcY = side[0].y;
  c->srcZ = side[0].z;
  c->srcPitch = side[0].pitch;
  c->srcHeight = side[0].height;
  if (local[0]) c->srcHost = local[0];
  else c->srcDevice = side[0].addr;
  c->dstMemoryType = static_cast<CUmemorytype>(side[1].type);
  c->dstXInBytes = side[1].x;
  c->dstY = side[1].y;
  c->dstZ = side[1].z;
  c->dstPitch = side[1].pitch;
  c->dstHeight = side[1].height;
  if (local[1]) c->dstHost = local[1];
  else c->dstDevice = side[1].addr;
  c->WidthInBytes = w;
  c->Height = hgt;
  c->Depth = depth;
  return CUDA_SUCCESS;
}

// u64 dst, u64 pitch, u32 value, u32 element size, u64 width (elements), u64 height.
CUresult SessionGraphs::DecodeMemset(Reader& rd, CUDA_MEMSET_NODE_PARAMS* m) {
  uint64_t dst = 0, pitch = 0, w = 0, hgt = 0;
  uint32_t value = 0, elem = 0;
  rd.U64(&dst);
  rd.U64(&pitch);
  rd.U32(&value);
  rd.U32(&elem);
  rd.U64(&w);
  if (!rd.U64(&hgt)) return CUDA_ERROR_INVALID_VALUE;
  if ((elem != 1 && elem != 2 && elem != 4) || w == 0 || hgt == 0 || w > kMaxExtent ||
      hgt > kMaxExtent || pitch > kMaxExtent || (hgt > 1 && pitch < w * elem) ||
      !h_.DeviceRange(dst, (hgt - 1) * pitch + w * elem)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *m = CUDA_MEMSET_NODE_PARAMS{};
  m->dst = dst;
  m->pitch = pitch;
  m->value = value;
  m->elementSize = elem;
  m->width = w;
  m->height = hgt;
  return CUDA_SUCCESS;
}

// u64 graph, u32 n + n x u64 dependencies, edge data (cuGraphAddNode_v2 only), u32 node type,
// then the type's parameters.
CUresult SessionGraphs::AddNode(Fn fn, Reader& rd, Writer& out) {
  uint64_t g = 0;
  ReadReal(rd, HandleKind::kGraph, &g);
  if (!graphs_.count(g)) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUgraphNode> deps;
  std::vector<CUgraphEdgeData> edges;
  if (!ReadNodes(rd, g, &deps)) return CUDA_ERROR_INVALID_VALUE;
  if (fn == Fn::cuGraphAddNode_v2 && !ReadEdges(rd, deps.size(), &edges)) return CUDA_ERROR_INVALID_VALUE;
  // Edges with ports or types (programmatic dependent launch: XLA's command buffers on Hopper)
  // need the driver's generic entry point; a kernel node is added through it, other nodes refused.
  bool ported = false;
  for (const CUgraphEdgeData& e : edges) ported = ported || e.from_port || e.to_port || e.type;
  uint32_t type = 0;
  if (!rd.U32(&type)) return CUDA_ERROR_INVALID_VALUE;
  const struct {
    Fn fn;
    uint32_t type;
  } kTypes[] = {{Fn::cuGraphAddKernelNode_v2, CU_GRAPH_NODE_TYPE_KERNEL},
                {Fn::cuGraphAddMemcpyNode, CU_GRAPH_NODE_TYPE_MEMCPY},
                {Fn::cuGraphAddMemsetNode, CU_GRAPH_NODE_TYPE_MEMSET},
                {Fn::cuGraphAddHostNode, CU_GRAPH_NODE_TYPE_HOST},
                {Fn::cuGraphAddEmptyNode, CU_GRAPH_NODE_TYPE_EMPTY},
                {Fn::cuGraphAddEventRecordNode, CU_GRAPH_NODE_TYPE_EVENT_RECORD},
                {Fn::cuGraphAddEventWaitNode, CU_GRAPH_NODE_TYPE_WAIT_EVENT},
                {Fn::cuGraphAddChildGraphNode, CU_GRAPH_NODE_TYPE_GRAPH},
                {Fn::cuGraphAddMemAllocNode, CU_GRAPH_NODE_TYPE_MEM_ALLOC},
                {Fn::cuGraphAddMemFreeNode, CU_GRAPH_NODE_TYPE_MEM_FREE}};
  for (const auto& t : kTypes) {
    if (t.fn == fn && t.type != type) return CUDA_ERROR_INVALID_VALUE;
  }
  CUgraph graph = As<CUgraph>(g);
  const CUgraphNode* dp = deps.empty() ? nullptr : deps.data();
  const size_t nd = deps.size();
  CUgraphNode node = nullptr;
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  if (ported && type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_NOT_SUPPORTED;
  switch (type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      KernelArgs la;
      CUDA_KERNEL_NODE_PARAMS p = {};
      if (CUresult e = h_.DecodeKernelNode(rd, &la, &p); e != CUDA_SUCCESS) return e;
      if (ported) {
        CUgraphNodeParams np = {};
        np.type = CU_GRAPH_NODE_TYPE_KERNEL;
        np.kernel.func = p.func;
        np.kernel.gridDimX = p.gridDimX;
        np.kernel.gridDimY = p.gridDimY;
        np.kernel.gridDimZ = p.gridDimZ;
        np.kernel.blockDimX = p.blockDimX;
        np.kernel.blockDimY = p.blockDimY;
        np.kernel.blockDimZ = p.blockDimZ;
        np.kernel.sharedMemBytes = p.sharedMemBytes;
        np.kernel.kernelParams = p.kernelParams;
        np.kernel.extra = p.extra;
        r = CALL(cuGraphAddNode_v2, &node, graph, dp, edges.data(), nd, &np);
      } else {
        r = CALL(cuGraphAddKernelNode_v2, &node, graph, dp, nd, &p);
      }
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY:
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      uint64_t ctx = 0;
      rd.U64(&ctx);
      if (!h_.KnownContext(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
      if (type == CU_GRAPH_NODE_TYPE_MEMCPY) {
        CUDA_MEMCPY3D c;
        if (CUresult e = DecodeCopy(rd, &c); e != CUDA_SUCCESS) return e;
        if (!rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
        r = CALL(cuGraphAddMemcpyNode, &node, graph, dp, nd, &c, As<CUcontext>(ctx));
      } else {
        CUDA_MEMSET_NODE_PARAMS m;
        if (CUresult e = DecodeMemset(rd, &m); e != CUDA_SUCCESS) return e;
        if (!rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
        r = CALL(cuGraphAddMemsetNode, &node, graph, dp, nd, &m, As<CUcontext>(ctx));
      }
      break;
    }
    case CU_GRAPH_NODE_TYPE_HOST: {
      uint64_t id = 0;
      if (!rd.U64(&id) || !rd.Finish() || id == 0) return CUDA_ERROR_INVALID_VALUE;
      CUDA_HOST_NODE_PARAMS p = {};
      h_.HostNodeFunction(id, &p.fn, &p.userData);
      r = CALL(cuGraphAddHostNode, &node, graph, dp, nd, &p);
      break;
    }
    case CU_GRAPH_NODE_TYPE_EMPTY:
      if (!rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      r = CALL(cuGraphAddEmptyNode, &node, graph, dp, nd);
      break;
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: {
      uint64_t e = 0;
      if (!rd.U64(&e) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      if (!h_.KnownEvent(e)) return CUDA_ERROR_INVALID_HANDLE;
      r = type == CU_GRAPH_NODE_TYPE_EVENT_RECORD
              ? CALL(cuGraphAddEventRecordNode, &node, graph, dp, nd, As<CUevent>(e))
              : CALL(cuGraphAddEventWaitNode, &node, graph, dp, nd, As<CUevent>(e));
      break;
    }
    case CU_GRAPH_NODE_TYPE_GRAPH: {
      uint64_t child = 0;
      if (!ReadReal(rd, HandleKind::kGraph, &child) || !rd.Finish() || !graphs_.count(child) || child == g) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      r = CALL(cuGraphAddChildGraphNode, &node, graph, dp, nd, As<CUgraph>(child));
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: {
      // u32 location type, i32 location id, u32 allocation type, u64 bytes,
      // u32 n + n x (u32 location type, i32 location id, u32 flags) access descriptors.
      CUDA_MEM_ALLOC_NODE_PARAMS p = {};
      uint32_t loc_type = 0, alloc_type = 0, naccess = 0;
      int32_t loc_id = 0;
      uint64_t bytes = 0;
      rd.U32(&loc_type);
      rd.I32(&loc_id);
      rd.U32(&alloc_type);
      rd.U64(&bytes);
      if (!rd.U32(&naccess) || naccess > remote::kMaxDevices) return CUDA_ERROR_INVALID_VALUE;
      std::vector<CUmemAccessDesc> access(naccess);
      for (auto& a : access) ReadAccessDesc(rd, &a);  // rd.Finish() below checks the end
      if (!rd.Finish() || bytes == 0 || bytes > kMaxExtent) return CUDA_ERROR_INVALID_VALUE;
      if (loc_type == CU_MEM_LOCATION_TYPE_DEVICE && !h_.KnownDevice(loc_id)) return CUDA_ERROR_INVALID_DEVICE;
      p.poolProps.allocType = static_cast<CUmemAllocationType>(alloc_type);
      p.poolProps.location.type = static_cast<CUmemLocationType>(loc_type);
      p.poolProps.location.id = loc_id;
      p.accessDescs = access.empty() ? nullptr : access.data();
      p.accessDescCount = access.size();
      p.bytesize = bytes;
      r = CALL(cuGraphAddMemAllocNode, &node, graph, dp, nd, &p);
      if (r != CUDA_SUCCESS) return r;
      h_.AddAllocation(p.dptr, bytes);
      graphs_[g].allocs.push_back(p.dptr);
      graphs_[g].alloc_bytes[p.dptr] = bytes;
      out.U64(Learn(node, g));
      out.U64(p.dptr);
      return CUDA_SUCCESS;
    }
    case CU_GRAPH_NODE_TYPE_CONDITIONAL: {
      // u64 handle, u32 type, u32 size, u64 context -> node, u32 size, size x u64 body graph.
      uint64_t handle = 0, ctx = 0;
      uint32_t ctype = 0, size = 0;
      rd.U64(&handle);
      rd.U32(&ctype);
      rd.U32(&size);
      if (!rd.U64(&ctx) || !rd.Finish() || fn != Fn::cuGraphAddNode_v2 ||
          ctype > CU_GRAPH_COND_TYPE_SWITCH || size == 0 || size > remote::kMaxConditionalBodies) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      if (ctx != 0 && !h_.KnownContext(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
      CUgraphNodeParams np = {};
      np.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
      np.conditional.handle = handle;
      np.conditional.type = static_cast<CUgraphConditionalNodeType>(ctype);
      np.conditional.size = size;
      np.conditional.ctx = As<CUcontext>(ctx);
      r = CALL(cuGraphAddNode_v2, &node, graph, dp, edges.empty() ? nullptr : edges.data(), nd, &np);
      if (r != CUDA_SUCCESS) return r;
      if (np.conditional.phGraph_out == nullptr) return CUDA_ERROR_UNKNOWN;
      out.U64(Learn(node, g));
      out.U32(size);
      for (uint32_t i = 0; i < size; ++i) {
        const uint64_t body = H(np.conditional.phGraph_out[i]);
        graphs_[body].body_of = g;
        out.U64(GraphName(body));
      }
      return CUDA_SUCCESS;
    }
    case CU_GRAPH_NODE_TYPE_MEM_FREE: {
      uint64_t p = 0;
      // Live memory of the session, or a graph allocation between launches (a free node in
      // another graph for what an executable graph allocates again at each launch).
      if (!rd.U64(&p) || !rd.Finish() || (!h_.DeviceRange(p, 1) && !GraphAllocation(p))) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      r = CALL(cuGraphAddMemFreeNode, &node, graph, dp, nd, p);
      if (r == CUDA_SUCCESS) graphs_[g].frees.insert(p);
      break;
    }
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (r != CUDA_SUCCESS) return r;
  out.U64(Learn(node, g));
  return CUDA_SUCCESS;
}

// u64 exec, u64 node, u32 node type, the type's parameters (as for adding; a host node's id, an
// event, a child graph).
CUresult SessionGraphs::SetExecParams(Fn fn, Reader& rd) {
  uint64_t e = 0, n = 0;
  uint32_t type = 0;
  ReadExec(rd, &e);
  ReadReal(rd, HandleKind::kGraphNode, &n);
  if (!rd.U32(&type)) return CUDA_ERROR_INVALID_VALUE;
  auto eit = execs_.find(e);
  auto nit = nodes_.find(n);
  if (eit == execs_.end() || nit == nodes_.end() || !eit->second.graphs.count(nit->second)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUgraphExec exec = As<CUgraphExec>(e);
  CUgraphNode node = As<CUgraphNode>(n);
  switch (fn) {
    case Fn::cuGraphExecKernelNodeSetParams_v2: {
      if (type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
      KernelArgs la;
      CUDA_KERNEL_NODE_PARAMS p = {};
      if (CUresult r = h_.DecodeKernelNode(rd, &la, &p); r != CUDA_SUCCESS) return r;
      return CALL(cuGraphExecKernelNodeSetParams_v2, exec, node, &p);
    }
    case Fn::cuGraphExecMemcpyNodeSetParams:
    case Fn::cuGraphExecMemsetNodeSetParams: {
      uint64_t ctx = 0;
      rd.U64(&ctx);
      if (!h_.KnownContext(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
      if (fn == Fn::cuGraphExecMemcpyNodeSetParams) {
        CUDA_MEMCPY3D c;
        if (type != CU_GRAPH_NODE_TYPE_MEMCPY) return CUDA_ERROR_INVALID_VALUE;
        if (CUresult r = DecodeCopy(rd, &c); r != CUDA_SUCCESS) return r;
        if (!rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
        CUresult r = CALL(cuGraphExecMemcpyNodeSetParams, exec, node, &c, As<CUcontext>(ctx));
        if (r == CUDA_SUCCESS) h_.HostCopies().CopySet(exec, node, c);
        return r;
      }
      CUDA_MEMSET_NODE_PARAMS m;
      if (type != CU_GRAPH_NODE_TYPE_MEMSET) return CUDA_ERROR_INVALID_VALUE;
      if (CUresult r = DecodeMemset(rd, &m); r != CUDA_SUCCESS) return r;
      if (!rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      return CALL(cuGraphExecMemsetNodeSetParams, exec, node, &m, As<CUcontext>(ctx));
    }
    case Fn::cuGraphExecHostNodeSetParams: {
      uint64_t id = 0;
      if (type != CU_GRAPH_NODE_TYPE_HOST || !rd.U64(&id) || !rd.Finish() || id == 0) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      CUDA_HOST_NODE_PARAMS p = {};
      h_.HostNodeFunction(id, &p.fn, &p.userData);
      return CALL(cuGraphExecHostNodeSetParams, exec, node, &p);
    }
    case Fn::cuGraphExecChildGraphNodeSetParams: {
      uint64_t child = 0;
      if (type != CU_GRAPH_NODE_TYPE_GRAPH || !ReadReal(rd, HandleKind::kGraph, &child) || !rd.Finish() ||
          !graphs_.count(child)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      CUresult r = CALL(cuGraphExecChildGraphNodeSetParams, exec, node, As<CUgraph>(child));
      if (r == CUDA_SUCCESS) h_.HostCopies().ChildSet(exec, node, As<CUgraph>(child));
      return r;
    }
    case Fn::cuGraphExecEventRecordNodeSetEvent:
    case Fn::cuGraphExecEventWaitNodeSetEvent: {
      uint64_t ev = 0;
      if (!rd.U64(&ev) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      if (!h_.KnownEvent(ev)) return CUDA_ERROR_INVALID_HANDLE;
      return fn == Fn::cuGraphExecEventRecordNodeSetEvent
                 ? CALL(cuGraphExecEventRecordNodeSetEvent, exec, node, As<CUevent>(ev))
                 : CALL(cuGraphExecEventWaitNodeSetEvent, exec, node, As<CUevent>(ev));
    }
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

// Lists: in u64 graph or node, u32 capacity (0: count only); out u64 count, then min(count,
// capacity) entries (nodes; edges and dependencies with u8 from port, u8 to port, u8 type).
// Node handles named here join the graph's node table.
CUresult SessionGraphs::Query(Fn fn, Reader& rd, Writer& out) {
  uint64_t h = 0;
  const bool by_graph = fn == Fn::cuGraphGetNodes || fn == Fn::cuGraphGetRootNodes || fn == Fn::cuGraphGetEdges_v2;
  ReadReal(rd, by_graph ? HandleKind::kGraph : HandleKind::kGraphNode, &h);
  if (fn == Fn::cuGraphKernelNodeGetParams_v2) {
    if (!rd.Finish() || !Node(h)) return CUDA_ERROR_INVALID_VALUE;
    // u64 function, u64 kernel, u64 context (0 when the driver gave none or the session does not
    // know it), u32 grid x/y/z, block x/y/z, shared bytes, u32 n (kUnknownParamCount when the
    // arguments cannot be given back) + n blobs. cudart finds its kernel by `kern`.
    CUDA_KERNEL_NODE_PARAMS p = {};
    CUresult r = CALL(cuGraphKernelNodeGetParams_v2, As<CUgraphNode>(h), &p);
    if (r != CUDA_SUCCESS) return r;
    out.U64(h_.FunctionHandedOut(H(p.func)));
    uint64_t kern = 0, ctx = 0;
    if (p.kern != nullptr && !h_.Handles().WireOf(HandleKind::kKernel, H(p.kern), &kern)) kern = 0;
    if (p.ctx != nullptr && !h_.Handles().WireOf(HandleKind::kContext, H(p.ctx), &ctx)) ctx = 0;
    out.U64(kern);
    out.U64(ctx);
    for (unsigned v : {p.gridDimX, p.gridDimY, p.gridDimZ, p.blockDimX, p.blockDimY, p.blockDimZ,
                       p.sharedMemBytes}) {
      out.U32(v);
    }
    std::vector<size_t> sizes;
    const bool known = h_.ParamSizes(H(p.func), &sizes);
    if (!known || (!sizes.empty() && p.kernelParams == nullptr)) {
      out.U32(remote::kUnknownParamCount);
      return CUDA_SUCCESS;
    }
    out.U32(static_cast<uint32_t>(sizes.size()));
    for (size_t i = 0; i < sizes.size(); ++i) out.Blob(p.kernelParams[i], static_cast<uint32_t>(sizes[i]));
    return CUDA_SUCCESS;
  }
  uint32_t capacity = 0;
  if (!rd.U32(&capacity) || !rd.Finish() || capacity > remote::kMaxGraphDeps) return CUDA_ERROR_INVALID_VALUE;
  const bool dependents = fn == Fn::cuGraphNodeGetDependentNodes_v2;
  const bool by_node = fn == Fn::cuGraphNodeGetDependencies_v2 || dependents;
  uint64_t g = h;
  if (by_node) {
    if (!Node(h)) return CUDA_ERROR_INVALID_VALUE;
    g = nodes_[h];
  } else if (!graphs_.count(h)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  size_t count = 0;
  std::vector<CUgraphNode> a, b;
  std::vector<CUgraphEdgeData> edges;
  auto list = [&](CUgraphNode* x, CUgraphNode* y, CUgraphEdgeData* e, size_t* n) -> CUresult {
    switch (fn) {
      case Fn::cuGraphGetNodes: return CALL(cuGraphGetNodes, As<CUgraph>(h), x, n);
      case Fn::cuGraphGetRootNodes: return CALL(cuGraphGetRootNodes, As<CUgraph>(h), x, n);
      case Fn::cuGraphGetEdges_v2:
        if (d().cuGraphGetEdges_v2) return d().cuGraphGetEdges_v2(As<CUgraph>(h), x, y, e, n);
        return CALL(cuGraphGetEdges, As<CUgraph>(h), x, y, n);
      case Fn::cuGraphNodeGetDependentNodes_v2:
        if (d().cuGraphNodeGetDependentNodes_v2) {
          return d().cuGraphNodeGetDependentNodes_v2(As<CUgraphNode>(h), x, e, n);
        }
        return CALL(cuGraphNodeGetDependentNodes, As<CUgraphNode>(h), x, n);
      default:
        if (d().cuGraphNodeGetDependencies_v2) {
          return d().cuGraphNodeGetDependencies_v2(As<CUgraphNode>(h), x, e, n);
        }
        return CALL(cuGraphNodeGetDependencies, As<CUgraphNode>(h), x, n);
    }
  };
  const bool pairs = fn == Fn::cuGraphGetEdges_v2;
  CUresult r = list(nullptr, nullptr, nullptr, &count);
  if (r != CUDA_SUCCESS) return r;
  if (capacity > 0 && count > 0) {
    a.resize(count);
    b.resize(count);
    edges.assign(count, CUgraphEdgeData{});
    r = list(a.data(), pairs ? b.data() : nullptr, edges.data(), &count);
    if (r != CUDA_SUCCESS) return r;
  }
  out.U64(count);
  const bool with_edges = pairs || by_node;
  for (size_t i = 0; i < count && i < capacity; ++i) {
    out.U64(Learn(a[i], g));
    if (pairs) out.U64(Learn(b[i], g));
    if (with_edges) WriteEdge(&edges[i], out);
  }
  return CUDA_SUCCESS;
}

CUresult SessionGraphs::Edit(Fn fn, Reader& rd, Writer& out) {
  switch (fn) {
    case Fn::cuGraphKernelNodeSetParams_v2: {
      uint64_t n = 0;
      uint32_t type = 0;
      ReadReal(rd, HandleKind::kGraphNode, &n);
      if (!rd.U32(&type) || type != CU_GRAPH_NODE_TYPE_KERNEL || !Node(n)) return CUDA_ERROR_INVALID_VALUE;
      KernelArgs la;
      CUDA_KERNEL_NODE_PARAMS p = {};
      if (CUresult r = h_.DecodeKernelNode(rd, &la, &p); r != CUDA_SUCCESS) return r;
      return CALL(cuGraphKernelNodeSetParams_v2, As<CUgraphNode>(n), &p);
    }
    // u64 graph, u32 n, n x u64 from, n x u64 to, edge data.
    case Fn::cuGraphAddDependencies_v2:
    case Fn::cuGraphRemoveDependencies_v2: {
      uint64_t g = 0;
      ReadReal(rd, HandleKind::kGraph, &g);
      if (!graphs_.count(g)) return CUDA_ERROR_INVALID_VALUE;
      std::vector<CUgraphNode> from, to;
      std::vector<CUgraphEdgeData> edges;
      if (!ReadNodes(rd, g, &from) || !ReadNodes(rd, g, &to) || from.size() != to.size() ||
          !ReadEdges(rd, from.size(), &edges) || !rd.Finish()) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      const bool add = fn == Fn::cuGraphAddDependencies_v2;
      auto v2 = add ? d().cuGraphAddDependencies_v2 : d().cuGraphRemoveDependencies_v2;
      auto v1 = add ? d().cuGraphAddDependencies : d().cuGraphRemoveDependencies;
      if (v2) {
        return v2(As<CUgraph>(g), from.data(), to.data(), edges.empty() ? nullptr : edges.data(), from.size());
      }
      if (!edges.empty()) return CUDA_ERROR_NOT_SUPPORTED;
      return v1 ? v1(As<CUgraph>(g), from.data(), to.data(), from.size()) : CUDA_ERROR_NOT_SUPPORTED;
    }
    case Fn::cuGraphDestroyNode: {
      uint64_t n = 0;
      if (!ReadReal(rd, HandleKind::kGraphNode, &n) || !rd.Finish() || !Node(n)) return CUDA_ERROR_INVALID_VALUE;
      // A child graph node's graph goes with it (when the client was given its name).
      CUgraphNodeType t = CU_GRAPH_NODE_TYPE_EMPTY;
      CUgraph child = nullptr;
      if (CALL(cuGraphNodeGetType, As<CUgraphNode>(n), &t) != CUDA_SUCCESS || t != CU_GRAPH_NODE_TYPE_GRAPH ||
          CALL(cuGraphChildGraphNodeGetGraph, As<CUgraphNode>(n), &child) != CUDA_SUCCESS) {
        child = nullptr;
      }
      CUresult r = CALL(cuGraphDestroyNode, As<CUgraphNode>(n));
      if (r == CUDA_SUCCESS) {
        ForgetNode(n);
        auto c = child ? graphs_.find(H(child)) : graphs_.end();
        if (c != graphs_.end() && c->second.body_of) ForgetGraph(H(child), false);
      }
      return r;
    }
    case Fn::cuGraphClone: {
      uint64_t g = 0;
      if (!ReadReal(rd, HandleKind::kGraph, &g) || !rd.Finish() || !graphs_.count(g)) return CUDA_ERROR_INVALID_VALUE;
      CUgraph c = nullptr;
      CUresult r = CALL(cuGraphClone, &c, As<CUgraph>(g));
      if (r != CUDA_SUCCESS) return r;
      graphs_[H(c)];
      out.U64(GraphName(H(c)));
      return CUDA_SUCCESS;
    }
    case Fn::cuGraphDestroy: {
      uint64_t g = 0;
      if (!ReadReal(rd, HandleKind::kGraph, &g) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      auto it = graphs_.find(g);
      // A capture graph belongs to its capture until cuStreamEndCapture.
      // So does a conditional node's body to its node.
      if (it == graphs_.end() || it->second.capturing_stream || it->second.body_of) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      CUresult r = CALL(cuGraphDestroy, As<CUgraph>(g));
      if (r == CUDA_SUCCESS) ForgetGraph(g, true);
      return r;
    }
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

// Graph allocations that the graph itself frees live only within its launches: they leave the
// session's allocations with the graph. Others stay until cuMemFree(Async). The driver may give
// an allocation the address of one the graph freed before it: an address allocated more often
// than the graph frees it stays.
void SessionGraphs::ForgetGraph(uint64_t g, bool free_allocations) {
  auto it = graphs_.find(g);
  if (it == graphs_.end()) return;
  if (free_allocations) {
    for (const auto& [p, n] : it->second.alloc_bytes) {
      if (!it->second.Outlives(p)) h_.RemoveAllocation(p);
    }
  }
  graphs_.erase(it);
  h_.Handles().RetireReal(HandleKind::kGraph, g);
  ForgetUserObjectRefs(g);
  for (auto n = nodes_.begin(); n != nodes_.end();) {
    if (n->second == g) {
      h_.Handles().RetireReal(HandleKind::kGraphNode, n->first);
      n = nodes_.erase(n);
    } else {
      ++n;
    }
  }
  // The bodies of its conditional nodes went with it.
  std::vector<uint64_t> bodies;
  for (const auto& [b, e] : graphs_) {
    if (e.body_of == g) bodies.push_back(b);
  }
  for (uint64_t b : bodies) ForgetGraph(b, free_allocations);
}

// u64 graph, u64 context (0: the current one), u32 default value, u32 flags -> u64 handle. The
// handle is the driver's value: kernels set it on the device.
CUresult SessionGraphs::ConditionalHandle(Reader& rd, Writer& out) {
  uint64_t g = 0, ctx = 0;
  uint32_t value = 0, flags = 0;
  ReadReal(rd, HandleKind::kGraph, &g);
  rd.U64(&ctx);
  rd.U32(&value);
  if (!rd.U32(&flags) || !rd.Finish() || !graphs_.count(g)) return CUDA_ERROR_INVALID_VALUE;
  if (ctx != 0 && !h_.KnownContext(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  CUgraphConditionalHandle handle = 0;
  CUresult r = CALL(cuGraphConditionalHandleCreate, &handle, As<CUgraph>(g), As<CUcontext>(ctx), value, flags);
  if (r != CUDA_SUCCESS) return r;
  out.U64(handle);
  return CUDA_SUCCESS;
}

uint64_t SessionGraphs::CountHostNodes(CUgraph g, int depth) {
  if (depth > 16) return 0;
  size_t count = 0;
  if (CALL(cuGraphGetNodes, g, nullptr, &count) != CUDA_SUCCESS || count == 0) return 0;
  std::vector<CUgraphNode> nodes(count);
  if (CALL(cuGraphGetNodes, g, nodes.data(), &count) != CUDA_SUCCESS) return 0;
  uint64_t host = 0;
  for (size_t i = 0; i < count; ++i) {
    CUgraphNodeType t = CU_GRAPH_NODE_TYPE_EMPTY;
    if (CALL(cuGraphNodeGetType, nodes[i], &t) != CUDA_SUCCESS) continue;
    if (t == CU_GRAPH_NODE_TYPE_HOST) ++host;
    CUgraph child = nullptr;
    if (t == CU_GRAPH_NODE_TYPE_GRAPH && CALL(cuGraphChildGraphNodeGetGraph, nodes[i], &child) == CUDA_SUCCESS) {
      host += CountHostNodes(child, depth + 1);
    }
  }
  return host;
}

bool SessionGraphs::GraphAllocation(uint64_t p) const {
  for (const auto& [g, e] : graphs_) {
    if (e.alloc_bytes.count(p)) return true;
  }
  for (const auto& [e, x] : execs_) {
    for (const auto& [a, n] : x.outliving) {
      if (a == p) return true;
    }
  }
  return false;
}

std::vector<std::pair<uint64_t, uint64_t>> SessionGraphs::Outliving(uint64_t g) const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  auto it = graphs_.find(g);
  if (it == graphs_.end()) return out;
  for (const auto& [p, n] : it->second.alloc_bytes) {
    if (it->second.Outlives(p)) out.emplace_back(p, n);
  }
  return out;
}

void SessionGraphs::RecordExec(CUgraphExec e, uint64_t g) {
  ExecEntry& x = execs_[H(e)];
  x.graphs = {g};
  x.host_nodes = CountHostNodes(As<CUgraph>(g), 0);
  x.outliving = Outliving(g);
  h_.HostCopies().Instantiated(e, As<CUgraph>(g));
}

CUresult SessionGraphs::Exec(Fn fn, Reader& rd, Writer& out) {
  switch (fn) {
    // -> u64 exec, u32 host nodes per launch.
    case Fn::cuGraphInstantiateWithFlags: {
      uint64_t g = 0, flags = 0;
      ReadReal(rd, HandleKind::kGraph, &g);
      if (!rd.U64(&flags) || !rd.Finish() || !graphs_.count(g)) return CUDA_ERROR_INVALID_VALUE;
      CUgraphExec e = nullptr;
      CUresult r = CALL(cuGraphInstantiateWithFlags, &e, As<CUgraph>(g), flags);
      if (r != CUDA_SUCCESS) return r;
      RecordExec(e, g);
      execs_[H(e)].device_launch = (flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH) != 0;
      out.U64(ExecName(H(e)));
      out.U32(static_cast<uint32_t>(execs_[H(e)].host_nodes));
      return CUDA_SUCCESS;
    }
    // u64 graph, u64 flags, u64 upload stream -> i32 result, u64 exec, u32 instantiate result,
    // u64 error node, u32 host nodes (the call's own result travels inside: the outputs matter
    // when it failed too).
    case Fn::cuGraphInstantiateWithParams: {
      uint64_t g = 0, flags = 0, s = 0;
      ReadReal(rd, HandleKind::kGraph, &g);
      rd.U64(&flags);
      if (!rd.U64(&s) || !rd.Finish() || !graphs_.count(g)) return CUDA_ERROR_INVALID_VALUE;
      if (!h_.KnownStream(s)) return CUDA_ERROR_INVALID_HANDLE;
      CUDA_GRAPH_INSTANTIATE_PARAMS p = {};
      p.flags = flags;
      p.hUploadStream = As<CUstream>(s);
      CUgraphExec e = nullptr;
      CUresult r = CALL(cuGraphInstantiateWithParams, &e, As<CUgraph>(g), &p);
      if (r == CUDA_SUCCESS) {
        RecordExec(e, g);
        execs_[H(e)].device_launch = (flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH) != 0;
      }
      const uint64_t err_node = Learn(p.hErrNode_out, g);
      out.I32(r);
      out.U64(r == CUDA_SUCCESS ? ExecName(H(e)) : 0);
      out.U32(static_cast<uint32_t>(p.result_out));
      out.U64(err_node);
      out.U32(r == CUDA_SUCCESS ? static_cast<uint32_t>(execs_[H(e)].host_nodes) : 0);
      return CUDA_SUCCESS;
    }
    case Fn::cuGraphLaunch:
    case Fn::cuGraphLaunch_ptsz:
    case Fn::cuGraphUpload: {
      uint64_t e = 0, s = 0;
      ReadExec(rd, &e);
      if (!rd.U64(&s) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      auto it = execs_.find(e);
      if (it == execs_.end() || !h_.KnownStream(s)) return CUDA_ERROR_INVALID_HANDLE;
      if (fn == Fn::cuGraphUpload) return CALL(cuGraphUpload, As<CUgraphExec>(e), As<CUstream>(s));
      // Counted before the launch: a host node may run before the driver returns.
      h_.HostRunsEnqueued(static_cast<int64_t>(it->second.host_nodes));
      CUresult r = fn == Fn::cuGraphLaunch ? CALL(cuGraphLaunch, As<CUgraphExec>(e), As<CUstream>(s))
                                           : CALL(cuGraphLaunch_ptsz, As<CUgraphExec>(e), As<CUstream>(s));
      if (r != CUDA_SUCCESS) h_.HostRunsEnqueued(-static_cast<int64_t>(it->second.host_nodes));
      // Its allocations that outlive the launch are the session's again (a cuMemFree of one
      // after an earlier launch had retired it).
      if (r == CUDA_SUCCESS) {
        for (const auto& [p, n] : it->second.outliving) h_.AddAllocation(p, n);
      }
      if (r == CUDA_SUCCESS) r = h_.HostCopies().Launched(As<CUgraphExec>(e), As<CUstream>(s));
      return r;
    }
    // u64 exec, u64 graph -> i32 result, u32 update result, u64 error node, u64 error-from node,
    // u32 host nodes per launch.
    case Fn::cuGraphExecUpdate_v2: {
      uint64_t e = 0, g = 0;
      ReadExec(rd, &e);
      if (!ReadReal(rd, HandleKind::kGraph, &g) || !rd.Finish() || !execs_.count(e) || !graphs_.count(g)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      CUgraphExecUpdateResultInfo info = {};
      CUresult r = CALL(cuGraphExecUpdate_v2, As<CUgraphExec>(e), As<CUgraph>(g), &info);
      ExecEntry& x = execs_[e];
      if (r == CUDA_SUCCESS) {
        x.graphs.insert(g);
        x.host_nodes = CountHostNodes(As<CUgraph>(g), 0);
        x.outliving = Outliving(g);
        h_.HostCopies().Instantiated(As<CUgraphExec>(e), As<CUgraph>(g));
      }
      const uint64_t err_node = Learn(info.errorNode, g);
      const uint64_t err_from = Learn(info.errorFromNode, g);
      out.I32(r);
      out.U32(static_cast<uint32_t>(info.result));
      out.U64(err_node);
      out.U64(err_from);
      out.U32(static_cast<uint32_t>(x.host_nodes));
      return CUDA_SUCCESS;
    }
    case Fn::cuGraphExecDestroy: {
      uint64_t e = 0;
      if (!ReadExec(rd, &e) || !rd.Finish() || !execs_.count(e)) return CUDA_ERROR_INVALID_VALUE;
      CUresult r = CALL(cuGraphExecDestroy, As<CUgraphExec>(e));
      if (r == CUDA_SUCCESS) {
        execs_.erase(e);
        h_.Handles().RetireReal(HandleKind::kGraphExec, e);
        h_.HostCopies().Destroyed(As<CUgraphExec>(e));
      }
      return r;
    }
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

// Stream capture. Begin: u64 stream [, u32 mode]; BeginCaptureToGraph: u64 stream, u64 graph,
// u32 mode, nodes, edge data; End: u64 stream -> u64 graph; GetCaptureInfo_v3: u64 stream ->
// u32 status, u64 id, u64 graph, u64 n, n x (u64 node, edge); UpdateCaptureDependencies_v2:
// u64 stream, u32 flags, nodes, edge data. The capture graph joins the graph table while the
// capture runs (nodes can be added to it), owned by the capture until it ends.
CUresult SessionGraphs::Capture(Fn fn, Reader& rd, Writer& out) {
  uint64_t s = 0;
  rd.U64(&s);
  if (!rd.ok()) return CUDA_ERROR_INVALID_VALUE;
  if (!h_.KnownStream(s)) return CUDA_ERROR_INVALID_HANDLE;
  CUstream st = As<CUstream>(s);
  switch (fn) {
    case Fn::cuStreamBeginCapture:
    case Fn::cuStreamBeginCapture_ptsz:
    case Fn::cuStreamBeginCapture_v2:
    case Fn::cuStreamBeginCapture_v2_ptsz: {
      uint32_t mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
      if (fn == Fn::cuStreamBeginCapture_v2 || fn == Fn::cuStreamBeginCapture_v2_ptsz) rd.U32(&mode);
      if (!rd.Finish() || mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
      auto m = static_cast<CUstreamCaptureMode>(mode);
      return fn == Fn::cuStreamBeginCapture || fn == Fn::cuStreamBeginCapture_v2
                 ? CALL(cuStreamBeginCapture_v2, st, m)
                 : CALL(cuStreamBeginCapture_v2_ptsz, st, m);
    }
    case Fn::cuStreamBeginCaptureToGraph: {
      uint64_t g = 0;
      uint32_t mode = 0;
      ReadReal(rd, HandleKind::kGraph, &g);
      rd.U32(&mode);
      if (!graphs_.count(g) || mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
      std::vector<CUgraphNode> deps;
      std::vector<CUgraphEdgeData> edges;
      if (!ReadNodes(rd, g, &deps) || !ReadEdges(rd, deps.size(), &edges) || !rd.Finish()) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      return CALL(cuStreamBeginCaptureToGraph, st, As<CUgraph>(g), deps.empty() ? nullptr : deps.data(),
                  edges.empty() ? nullptr : edges.data(), deps.size(), static_cast<CUstreamCaptureMode>(mode));
    }
    case Fn::cuStreamEndCapture:
    case Fn::cuStreamEndCapture_ptsz: {
      // Optional: 1 when the program passed no graph output (the driver takes NULL for a capture
      // into an existing graph, as cudaStreamEndCapture(stream, nullptr) after
      // cudaStreamBeginCaptureToGraph does); the driver decides what NULL means, as natively.
      uint32_t no_output = 0;
      if (rd.remaining() > 0) rd.U32(&no_output);
      if (!rd.Finish() || no_output > 1) return CUDA_ERROR_INVALID_VALUE;
      CUgraph g = nullptr;
      CUgraph* gp = no_output ? nullptr : &g;
      CUresult r = fn == Fn::cuStreamEndCapture ? CALL(cuStreamEndCapture, st, gp)
                                                : CALL(cuStreamEndCapture_ptsz, st, gp);
      auto cg = capture_graphs_.find(s);
      if (cg != capture_graphs_.end()) {
        auto e = graphs_.find(cg->second);
        // Only the capture's own graph (not the program's graph it captured into) changes hands:
        // a failed capture's graph is gone (the driver destroyed it); a finished one is the
        // client's now (or, with no output, stays the session's until it ends).
        if (e != graphs_.end() && e->second.capturing_stream == s) {
          if (r != CUDA_SUCCESS || (gp != nullptr && H(g) != cg->second)) ForgetGraph(cg->second, false);
          else e->second.capturing_stream = 0;
        }
        capture_graphs_.erase(cg);
      }
      if (r != CUDA_SUCCESS) return r;
      if (gp == nullptr) return CUDA_SUCCESS;
      graphs_[H(g)].capturing_stream = 0;
      out.U64(GraphName(H(g)));
      return CUDA_SUCCESS;
    }
    case Fn::cuStreamGetCaptureInfo_v3: {
      if (!rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
      cuuint64_t id = 0;
      CUgraph g = nullptr;
      const CUgraphNode* deps = nullptr;
      const CUgraphEdgeData* edges = nullptr;
      size_t n = 0;
      CUresult r = d().cuStreamGetCaptureInfo_v3
                       ? d().cuStreamGetCaptureInfo_v3(st, &status, &id, &g, &deps, &edges, &n)
                       : CALL(cuStreamGetCaptureInfo_v2, st, &status, &id, &g, &deps, &n);
      if (r != CUDA_SUCCESS) return r;
      if (status == CU_STREAM_CAPTURE_STATUS_ACTIVE && g) {
        // A graph the session does not know yet is the capture's own; one it knows is the
        // program's (cuStreamBeginCaptureToGraph's target, a conditional node's body).
        if (!capture_graphs_.count(s) && !graphs_.count(H(g))) graphs_[H(g)].capturing_stream = s;
        capture_graphs_[s] = H(g);
      }
      if (n > remote::kMaxGraphDeps) n = remote::kMaxGraphDeps;
      out.U32(static_cast<uint32_t>(status));
      out.U64(id);
      out.U64(GraphName(H(g)));
      out.U64(n);
      for (size_t i = 0; i < n; ++i) {
        out.U64(Learn(deps[i], H(g)));
        WriteEdge(edges ? &edges[i] : nullptr, out);
      }
      return CUDA_SUCCESS;
    }
    case Fn::cuStreamUpdateCaptureDependencies_v2: {
      uint32_t flags = 0;
      rd.U32(&flags);
      auto cg = capture_graphs_.find(s);
      std::vector<CUgraphNode> deps;
      std::vector<CUgraphEdgeData> edges;
      if (!ReadNodes(rd, cg == capture_graphs_.end() ? 0 : cg->second, &deps) ||
          !ReadEdges(rd, deps.size(), &edges) || !rd.Finish()) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      if (d().cuStreamUpdateCaptureDependencies_v2) {
        return d().cuStreamUpdateCaptureDependencies_v2(st, deps.empty() ? nullptr : deps.data(),
                                                        edges.empty() ? nullptr : edges.data(),
                                                        deps.size(), flags);
      }
      if (!edges.empty()) return CUDA_ERROR_NOT_SUPPORTED;
      return CALL(cuStreamUpdateCaptureDependencies, st, deps.empty() ? nullptr : deps.data(), deps.size(), flags);
    }
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

void SessionGraphs::Cleanup() {
  for (auto& [s, g] : capture_graphs_) {
    CUgraph ended = nullptr;
    if (CALL(cuStreamEndCapture, As<CUstream>(s), &ended) == CUDA_SUCCESS && ended) {
      graphs_[H(ended)].capturing_stream = 0;
    }
    auto it = graphs_.find(g);
    if (it != graphs_.end() && it->second.capturing_stream) graphs_.erase(it);
  }
  capture_graphs_.clear();
  for (auto& [e, x] : execs_) CALL(cuGraphExecDestroy, As<CUgraphExec>(e));
  for (auto& [g, x] : graphs_) {
    if (!x.body_of) CALL(cuGraphDestroy, As<CUgraph>(g));
  }
  execs_.clear();
  graphs_.clear();
  nodes_.clear();
}

}  // namespace tf::worker
