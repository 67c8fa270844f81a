// Getters and setters of graph nodes, the generic node updates, kernel node attributes, the flags of
// an executable graph and cuGraphDebugDotPrint, for one session (session_graphs.h). Formats:
// remote_protocol.h "Graph nodes". Every node, graph, executable graph and event is checked against
// the session's tables before the driver sees it; handles given back are the names the client
// knows (events are virtual; nodes and graphs are the driver's, learned into the tables).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "worker/session_graphs.h"

namespace tf::worker {
namespace {

using driver::Fn;
using transport::Reader;
using transport::Writer;

template <class T>
T As(uint64_t v) {
  return reinterpret_cast<T>(v);
}

#define CALL(fn, ...) (d().fn ? d().fn(__VA_ARGS__) : CUDA_ERROR_NOT_SUPPORTED)

// The largest DOT file sent back (bytes).
constexpr uint64_t kMaxDotBytes = 64ull << 20;
// Every CUgraphDebugDot_flags bit of CUDA 13.0.
constexpr uint32_t kDotFlags = (1u << 16) - 1;

// Launch attributes a kernel node may be asked for: those whose value holds no handle of the
// session (the event attributes are for launches only).
bool NodeAttribute(uint32_t id) {
  switch (id) {
    case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
    case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
    case CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY:
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
    case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
    case CU_LAUNCH_ATTRIBUTE_PRIORITY:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
    case CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION:
    case CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE:
    case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      return true;
    default:
      return false;
  }
}

// The typed setter of a node type: what cuGraphNodeSetParams and cuGraphExecNodeSetParams become.
Fn NodeSetter(uint32_t type) {
  switch (type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: return Fn::cuGraphKernelNodeSetParams_v2;
    case CU_GRAPH_NODE_TYPE_MEMCPY: return Fn::cuGraphMemcpyNodeSetParams;
    case CU_GRAPH_NODE_TYPE_MEMSET: return Fn::cuGraphMemsetNodeSetParams;
    case CU_GRAPH_NODE_TYPE_HOST: return Fn::cuGraphHostNodeSetParams;
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD: return Fn::cuGraphEventRecordNodeSetEvent;
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: return Fn::cuGraphEventWaitNodeSetEvent;
    default: return Fn::cuGraphNodeSetParams;
  }
}
Fn ExecSetter(uint32_t type) {
  switch (type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: return Fn::cuGraphExecKernelNodeSetParams_v2;
    case CU_GRAPH_NODE_TYPE_MEMCPY: return Fn::cuGraphExecMemcpyNodeSetParams;
    case CU_GRAPH_NODE_TYPE_MEMSET: return Fn::cuGraphExecMemsetNodeSetParams;
    case CU_GRAPH_NODE_TYPE_HOST: return Fn::cuGraphExecHostNodeSetParams;
    case CU_GRAPH_NODE_TYPE_GRAPH: return Fn::cuGraphExecChildGraphNodeSetParams;
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD: return Fn::cuGraphExecEventRecordNodeSetEvent;
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: return Fn::cuGraphExecEventWaitNodeSetEvent;
    default: return Fn::cuGraphExecNodeSetParams;
  }
}

}  // namespace

// The graph tables as the generated calls see them: handles resolve as the hand-written graph
// calls resolve them (a node, graph or executable graph must be in the tables, an executable
// graph for device launch passes by its real handle, events and contexts as the session knows
// them, user objects by the session's references); `of=` asks the node table, `publish=` files a
// clone's node under its graph and a child graph under its node's graph; the user-object
// reference calls keep their counts through the family's hooks. Nothing is created or destroyed
// by the generated graph calls.
class GraphGeneratedHost final : public GeneratedHost {
 public:
  explicit GraphGeneratedHost(SessionGraphs& g) : g_(g), h_(g.h_) {}
  const driver::DriverTable& Driver() const override { return h_.Driver(); }
  HandleTable& Handles() override { return h_.Handles(); }
  bool KnownDevice(int32_t d) const override { return h_.KnownDevice(d); }
  bool DeviceRange(uint64_t p, uint64_t n) const override { return h_.DeviceRange(p, n); }
  void Created(HandleKind, uint64_t) override {}
  void Destroyed(HandleKind, uint64_t) override {}
  void AfterCall(Fn, CUresult) override {}
  GeneratedHooks& Hooks(Fn) override { return g_; }  // the user-object reference counts
  bool Resolve(HandleKind k, uint64_t wire, uint64_t* real) override {
    uint64_t v = wire;
    switch (k) {
      case HandleKind::kGraphExec: *real = g_.RealExec(wire); return g_.execs_.count(*real) != 0;
      case HandleKind::kGraphNode: *real = g_.Real(k, wire); return g_.Node(*real);
      case HandleKind::kGraph: *real = g_.Real(k, wire); return g_.graphs_.count(*real) != 0;
      case HandleKind::kEvent: if (!h_.KnownEvent(v)) return false; *real = v; return true;
      case HandleKind::kContext: if (!h_.KnownContext(v)) return false; *real = v; return true;
      case HandleKind::kUserObject: return g_.user_objects_.count(wire) && h_.Handles().Resolve(k, wire, real);
      default: return h_.Handles().Resolve(k, wire, real);
    }
  }
  bool Belongs(HandleKind k, uint64_t real, HandleKind owner_kind, uint64_t owner) override {
    auto n = g_.nodes_.find(real);
    if (k != HandleKind::kGraphNode || n == g_.nodes_.end()) return false;
    if (owner_kind == HandleKind::kGraph) return n->second == owner;
    auto e = g_.execs_.find(owner);
    return owner_kind == HandleKind::kGraphExec && e != g_.execs_.end() && e->second.graphs.count(n->second);
  }
  uint64_t Learn(HandleKind k, uint64_t real, HandleKind parent_kind, uint64_t parent) override {
    if (k == HandleKind::kGraphNode && parent_kind == HandleKind::kGraph) {
      return g_.Learn(reinterpret_cast<CUgraphNode>(real), parent);
    }
    // A child graph node's graph belongs to the node (the driver destroys it with its parent).
    if (k == HandleKind::kGraph && parent_kind == HandleKind::kGraphNode) {
      if (real != 0 && !g_.graphs_.count(real)) g_.graphs_[real].body_of = g_.nodes_[parent];
      return g_.GraphName(real);
    }
    return h_.Handles().Publish(k, real);
  }

 private:
  SessionGraphs& g_;
  GraphHost& h_;
};

CUresult SessionGraphs::GeneratedCall(Fn fn, Reader& rd, Writer& out) {
  GraphGeneratedHost host(*this);
  return DispatchGenerated(fn, rd, out, host);
}

// The generated ones among them (api/remote_surface.tsv) go to GeneratedCall.
bool SessionGraphs::HandlesNodeCall(Fn fn) {
  switch (fn) {
    case Fn::cuGraphEventRecordNodeSetEvent:
    case Fn::cuGraphEventWaitNodeSetEvent:
    case Fn::cuGraphHostNodeGetParams:
    case Fn::cuGraphHostNodeSetParams:
    case Fn::cuGraphMemcpyNodeGetParams:
    case Fn::cuGraphMemcpyNodeSetParams:
    case Fn::cuGraphMemsetNodeGetParams:
    case Fn::cuGraphMemsetNodeSetParams:
    case Fn::cuGraphMemAllocNodeGetParams:
    case Fn::cuGraphMemFreeNodeGetParams:
    case Fn::cuGraphKernelNodeGetAttribute:
    case Fn::cuGraphKernelNodeSetAttribute:
    case Fn::cuGraphChildGraphNodeGetGraph:
    case Fn::cuGraphNodeFindInClone:
    case Fn::cuGraphNodeSetParams:
    case Fn::cuGraphExecNodeSetParams:
    case Fn::cuGraphExecGetFlags:
    case Fn::cuGraphDebugDotPrint:
      return true;
    default:
      return false;
  }
}

CUresult SessionGraphs::NodeCall(Fn fn, Reader& rd, Writer& out) {
  switch (fn) {
    case Fn::cuGraphNodeSetParams: {
      // u64 node, u32 type, the type's parameters: the typed setter's message.
      Reader peek = rd;
      uint64_t n = 0;
      uint32_t type = 0;
      peek.U64(&n);
      if (!peek.U32(&type)) return CUDA_ERROR_INVALID_VALUE;
      const Fn typed = NodeSetter(type);
      if (typed == Fn::cuGraphNodeSetParams) return CUDA_ERROR_NOT_SUPPORTED;
      if (typed == Fn::cuGraphKernelNodeSetParams_v2) return Edit(typed, rd, out);
      return SetNode(typed, rd);
    }
    case Fn::cuGraphExecNodeSetParams: {
      // u64 exec, u64 node, u32 type, the type's parameters: the typed exec setter's message.
      Reader peek = rd;
      uint64_t e = 0, n = 0;
      uint32_t type = 0;
      peek.U64(&e);
      peek.U64(&n);
      if (!peek.U32(&type)) return CUDA_ERROR_INVALID_VALUE;
      const Fn typed = ExecSetter(type);
      if (typed == Fn::cuGraphExecNodeSetParams) return CUDA_ERROR_NOT_SUPPORTED;
      return SetExecParams(typed, rd);
    }
    case Fn::cuGraphHostNodeSetParams:
    case Fn::cuGraphMemcpyNodeSetParams:
    case Fn::cuGraphMemsetNodeSetParams:
      return SetNode(fn, rd);
    case Fn::cuGraphDebugDotPrint:
      return DotPrint(rd);
    case Fn::cuGraphKernelNodeSetAttribute: {
      // u64 node, u32 attribute, 64-byte value.
      uint64_t n = 0;
      uint32_t attr = 0;
      CUkernelNodeAttrValue v;
      static_assert(sizeof(v) == 64, "CUlaunchAttributeValue is 64 bytes");
      ReadReal(rd, HandleKind::kGraphNode, &n);
      rd.U32(&attr);
      if (!rd.Bytes(&v, sizeof(v)) || !rd.Finish() || !Node(n) || !NodeAttribute(attr)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      return CALL(cuGraphKernelNodeSetAttribute, As<CUgraphNode>(n), static_cast<CUkernelNodeAttrID>(attr), &v);
    }
    default:
      break;
  }
  // The getters: u64 node [, u32 attribute].
  uint64_t n = 0;
  uint32_t attr = 0;
  ReadReal(rd, HandleKind::kGraphNode, &n);
  if (fn == Fn::cuGraphKernelNodeGetAttribute) rd.U32(&attr);
  if (!rd.Finish() || !Node(n)) return CUDA_ERROR_INVALID_VALUE;
  CUgraphNode node = As<CUgraphNode>(n);
  switch (fn) {
    // -> u64 the client's host function id (0: not one the client registered).
    case Fn::cuGraphHostNodeGetParams: {
      CUDA_HOST_NODE_PARAMS p = {};
      CUresult r = CALL(cuGraphHostNodeGetParams, node, &p);
      if (r != CUDA_SUCCESS) return r;
      out.U64(h_.HostNodeIdOf(p.fn, p.userData));
      return CUDA_SUCCESS;
    }
    // -> per side (source, destination) u32 memory type, u64 address, u64 x, y, z, pitch, height;
    // then u64 width, height, depth. Host addresses are the client's; arrays are named.
    case Fn::cuGraphMemcpyNodeGetParams: {
      CUDA_MEMCPY3D c = {};
      CUresult r = CALL(cuGraphMemcpyNodeGetParams, node, &c);
      if (r != CUDA_SUCCESS) return r;
      // An array side (a captured array copy) carries the array's name in the session.
      auto side = [&](CUmemorytype t, const void* host, CUdeviceptr dev, CUarray array, size_t x,
                      size_t y, size_t z, size_t pitch, size_t height) {
        uint64_t array_name = 0;
        if (t == CU_MEMORYTYPE_ARRAY) {
          h_.Handles().WireOf(HandleKind::kArray, reinterpret_cast<uint64_t>(array), &array_name);
        }
        out.U32(t);
        out.U64(t == CU_MEMORYTYPE_HOST ? h_.ClientHostAddress(host)
                : t == CU_MEMORYTYPE_ARRAY ? array_name
                                           : dev);
        out.U64(x);
        out.U64(y);
        out.U64(z);
        out.U64(pitch);
        out.U64(height);
      };
      side(c.srcMemoryType, c.srcHost, c.srcDevice, c.srcArray, c.srcXInBytes, c.srcY, c.srcZ, c.srcPitch,
           c.srcHeight);
      side(c.dstMemoryType, c.dstHost, c.dstDevice, c.dstArray, c.dstXInBytes, c.dstY, c.dstZ, c.dstPitch,
           c.dstHeight);
      out.U64(c.WidthInBytes);
      out.U64(c.Height);
      out.U64(c.Depth);
      return CUDA_SUCCESS;
    }
    // -> u64 dst, u64 pitch, u32 value, u32 element size, u64 width, u64 height.
    case Fn::cuGraphMemsetNodeGetParams: {
      CUDA_MEMSET_NODE_PARAMS m = {};
      CUresult r = CALL(cuGraphMemsetNodeGetParams, node, &m);
      if (r != CUDA_SUCCESS) return r;
      out.U64(m.dst);
      out.U64(m.pitch);
      out.U32(m.value);
      out.U32(m.elementSize);
      out.U64(m.width);
      out.U64(m.height);
      return CUDA_SUCCESS;
    }
    // -> u32 location type, i32 location id, u32 allocation type, u64 bytes, u64 pointer,
    // u32 n + n x (u32 location type, i32 location id, u32 flags).
    case Fn::cuGraphMemAllocNodeGetParams: {
      CUDA_MEM_ALLOC_NODE_PARAMS p = {};
      CUresult r = CALL(cuGraphMemAllocNodeGetParams, node, &p);
      if (r != CUDA_SUCCESS) return r;
      const size_t count = p.accessDescs ? std::min<size_t>(p.accessDescCount, remote::kMaxDevices) : 0;
      out.U32(p.poolProps.location.type);
      out.I32(p.poolProps.location.id);
      out.U32(p.poolProps.allocType);
      out.U64(p.bytesize);
      out.U64(p.dptr);
      out.U32(static_cast<uint32_t>(count));
      for (size_t i = 0; i < count; ++i) {
        out.U32(p.accessDescs[i].location.type);
        out.I32(p.accessDescs[i].location.id);
        out.U32(p.accessDescs[i].flags);
      }
      return CUDA_SUCCESS;
    }
    // -> 64-byte value.
    case Fn::cuGraphKernelNodeGetAttribute: {
      if (!NodeAttribute(attr)) return CUDA_ERROR_INVALID_VALUE;
      CUkernelNodeAttrValue v;
      memset(&v, 0, sizeof(v));
      CUresult r = CALL(cuGraphKernelNodeGetAttribute, node, static_cast<CUkernelNodeAttrID>(attr), &v);
      out.Bytes(&v, sizeof(v));
      return r;
    }
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

// u64 node, u32 node type, the type's parameters (remote_protocol.h "Graphs": params; a memcpy or
// memset node's context is ignored, 0 or a context of the session).
CUresult SessionGraphs::SetNode(Fn fn, Reader& rd) {
  uint64_t n = 0;
  uint32_t type = 0;
  ReadReal(rd, HandleKind::kGraphNode, &n);
  if (!rd.U32(&type) || !Node(n)) return CUDA_ERROR_INVALID_VALUE;
  CUgraphNode node = As<CUgraphNode>(n);
  switch (fn) {
    case Fn::cuGraphEventRecordNodeSetEvent:
    case Fn::cuGraphEventWaitNodeSetEvent: {
      const uint32_t want = fn == Fn::cuGraphEventRecordNodeSetEvent ? CU_GRAPH_NODE_TYPE_EVENT_RECORD
                                                                     : CU_GRAPH_NODE_TYPE_WAIT_EVENT;
      uint64_t e = 0;
      if (type != want || !rd.U64(&e) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      if (!h_.KnownEvent(e)) return CUDA_ERROR_INVALID_HANDLE;
      return fn == Fn::cuGraphEventRecordNodeSetEvent ? CALL(cuGraphEventRecordNodeSetEvent, node, As<CUevent>(e))
                                                      : CALL(cuGraphEventWaitNodeSetEvent, node, As<CUevent>(e));
    }
    case Fn::cuGraphHostNodeSetParams: {
      uint64_t id = 0;
      if (type != CU_GRAPH_NODE_TYPE_HOST || !rd.U64(&id) || !rd.Finish() || id == 0) return CUDA_ERROR_INVALID_VALUE;
      CUDA_HOST_NODE_PARAMS p = {};
      h_.HostNodeFunction(id, &p.fn, &p.userData);
      return CALL(cuGraphHostNodeSetParams, node, &p);
    }
    case Fn::cuGraphMemcpyNodeSetParams:
    case Fn::cuGraphMemsetNodeSetParams: {
      const bool copy = fn == Fn::cuGraphMemcpyNodeSetParams;
      if (type != (copy ? CU_GRAPH_NODE_TYPE_MEMCPY : CU_GRAPH_NODE_TYPE_MEMSET)) return CUDA_ERROR_INVALID_VALUE;
      uint64_t ctx = 0;
      if (!rd.U64(&ctx)) return CUDA_ERROR_INVALID_VALUE;
      if (ctx != 0 && !h_.KnownContext(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
      if (copy) {
        CUDA_MEMCPY3D c;
        if (CUresult r = DecodeCopy(rd, &c); r != CUDA_SUCCESS) return r;
        if (!rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
        return CALL(cuGraphMemcpyNodeSetParams, node, &c);
      }
      CUDA_MEMSET_NODE_PARAMS m;
      if (CUresult r = DecodeMemset(rd, &m); r != CUDA_SUCCESS) return r;
      if (!rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      return CALL(cuGraphMemsetNodeSetParams, node, &m);
    }
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

// u64 graph, u32 flags. The driver writes a private file of this process; its bytes go to the
// client as call data (the client writes them to the path its program gave).
CUresult SessionGraphs::DotPrint(Reader& rd) {
  uint64_t g = 0;
  uint32_t flags = 0;
  ReadReal(rd, HandleKind::kGraph, &g);
  if (!rd.U32(&flags) || !rd.Finish() || !graphs_.count(g) || (flags & ~kDotFlags)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const char* tmp = getenv("TMPDIR");
  std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/tfusion-graph-dot-XXXXXX";
  int fd = mkstemp(path.data());
  if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
  struct Remove {
    int fd;
    const std::string& path;
    ~Remove() {
      close(fd);
      unlink(path.c_str());
    }
  } remove{fd, path};
  CUresult r = CALL(cuGraphDebugDotPrint, As<CUgraph>(g), path.c_str(), flags);
  if (r != CUDA_SUCCESS) return r;
  struct stat sb;
  if (fstat(fd, &sb) != 0 || sb.st_size < 0) return CUDA_ERROR_OPERATING_SYSTEM;
  if (static_cast<uint64_t>(sb.st_size) > kMaxDotBytes) return CUDA_ERROR_OUT_OF_MEMORY;
  std::vector<uint8_t> slice(std::max<uint64_t>(1, std::min<uint64_t>(h_.CallDataLimit(), 1u << 20)));
  for (uint64_t off = 0; off < static_cast<uint64_t>(sb.st_size);) {
    ssize_t got = pread(fd, slice.data(), slice.size(), static_cast<off_t>(off));
    if (got <= 0) return CUDA_ERROR_OPERATING_SYSTEM;
    if (!h_.SendCallData(off, slice.data(), static_cast<uint64_t>(got))) return CUDA_ERROR_UNKNOWN;
    off += static_cast<uint64_t>(got);
  }
  return CUDA_SUCCESS;
}

}  // namespace tf::worker
