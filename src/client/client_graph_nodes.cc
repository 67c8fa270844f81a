// Graph nodes read back and changed: the typed getters and setters (events, host functions, copies,
// memsets, graph allocations and frees, kernel node attributes, child graphs), the generic
// cuGraphNodeSetParams and cuGraphExecNodeSetParams, nodes of clones, executable graph flags,
// cuGraphDebugDotPrint, and the legacy forms of graph calls as conversions to the current ones.
// Wire formats: remote_protocol.h "Graph nodes"; the worker side is worker/session_graph_nodes.cc.
//
// What a getter hands out stays valid as CUDA's does: a memory allocation node's access
// descriptors live as long as this process (kept per node).
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <map>
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

// u64 handle [, u32 value] -> the reply's reader in *rv. REQUIRES the lock and the context.
CUresult Ask(Session* s, Fn fn, uint64_t h, ReplyView* rv, const uint32_t* extra = nullptr) {
  uint8_t buf[12];
  Writer w(buf, sizeof(buf));
  w.U64(h);
  if (extra) w.U32(*extra);
  return CallSync(s, Op(fn), w, rv);
}

// One u64 answer about a handle.
CUresult AskU64(Fn fn, uint64_t h, uint64_t* v) {
  TF_LOCK(l);
  TF_CTX(l);
  ReplyView rv;
  CUresult r = Ask(l.session(), fn, h, &rv);
  if (r != CUDA_SUCCESS) return r;
  if (!rv.reader.U64(v)) return CUDA_ERROR_UNKNOWN;
  return CUDA_SUCCESS;
}

// u64 node, spec: the node-level setters (the context of a copy or memset travels as 0).
CUresult SetNode(Fn fn, CUgraphNode node, const NodeSpec& spec) {
  if (node == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  std::vector<uint8_t> buf(SpecBytes(spec, 0));
  Writer w(buf.data(), buf.size());
  w.U64(H(node));
  if (CUresult r = WriteSpec(l.session(), spec, w); r != CUDA_SUCCESS) return r;
  if (!w.ok()) return CUDA_ERROR_INVALID_VALUE;
  return CallSync(l.session(), Op(fn), w, nullptr);
}

// Access descriptors handed out by cuGraphMemAllocNodeGetParams: (session, node) -> descriptors.
// Guarded by State().mu (callers hold the call lock); never destroyed (handed-out pointers).
std::map<std::pair<const Session*, uint64_t>, std::vector<CUmemAccessDesc>>& AccessDescs() {
  static auto* m = new std::map<std::pair<const Session*, uint64_t>, std::vector<CUmemAccessDesc>>();
  return *m;
}

// cuGraphDebugDotPrint's file, written as the slices arrive (opened at the first).
struct DotFile {
  const char* path = nullptr;
  int fd = -1;
  uint64_t total = 0;
};
bool DotSlice(void* ctx, uint64_t offset, const uint8_t* data, uint64_t len) {
  auto* f = static_cast<DotFile*>(ctx);
  if (offset != f->total) return false;  // the worker sends them in order
  if (f->fd < 0) f->fd = open(f->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (f->fd < 0) return true;  // reported after the call, as the driver does
  for (uint64_t done = 0; done < len;) {
    ssize_t n = pwrite(f->fd, data + done, len - done, static_cast<off_t>(offset + done));
    if (n <= 0) {
      close(f->fd);
      f->fd = -2;
      return true;
    }
    done += static_cast<uint64_t>(n);
  }
  f->total += len;
  return true;
}

}  // namespace

CUresult Impl_cuGraphHostNodeGetParams(CUgraphNode node, CUDA_HOST_NODE_PARAMS* params) {
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t id = 0;
  CUresult r = AskU64(Fn::cuGraphHostNodeGetParams, H(node), &id);
  if (r != CUDA_SUCCESS) return r;
  *params = CUDA_HOST_NODE_PARAMS{};
  if (id != 0 && !HostNodeFunctionOf(id, &params->fn, &params->userData)) return CUDA_ERROR_UNKNOWN;
  return CUDA_SUCCESS;
}
CUresult Impl_cuGraphHostNodeSetParams(CUgraphNode node, const CUDA_HOST_NODE_PARAMS* params) {
  if (params == nullptr || params->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  NodeSpec n;
  n.type = CU_GRAPH_NODE_TYPE_HOST;
  n.host_fn = params->fn;
  n.host_user = params->userData;
  return SetNode(Fn::cuGraphHostNodeSetParams, node, n);
}

CUresult Impl_cuGraphMemcpyNodeGetParams(CUgraphNode node, CUDA_MEMCPY3D* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  ReplyView rv;
  CUresult r = Ask(l.session(), Fn::cuGraphMemcpyNodeGetParams, H(node), &rv);
  if (r != CUDA_SUCCESS) return r;
  CUDA_MEMCPY3D c = {};
  auto side = [&](CUmemorytype* type, const void** host, CUdeviceptr* dev, CUarray* array, size_t* x,
                  size_t* y, size_t* z, size_t* pitch, size_t* height) {
    uint32_t t = 0;
    uint64_t addr = 0, v[5] = {};
    rv.reader.U32(&t);
    rv.reader.U64(&addr);
    for (uint64_t& e : v) rv.reader.U64(&e);
    *type = static_cast<CUmemorytype>(t);
    if (t == CU_MEMORYTYPE_HOST) *host = reinterpret_cast<const void*>(addr);
    else if (t == CU_MEMORYTYPE_ARRAY) *array = reinterpret_cast<CUarray>(addr);
    else *dev = addr;
    *x = v[0];
    *y = v[1];
    *z = v[2];
    *pitch = v[3];
    *height = v[4];
  };
  side(&c.srcMemoryType, &c.srcHost, &c.srcDevice, &c.srcArray, &c.srcXInBytes, &c.srcY, &c.srcZ, &c.srcPitch,
       &c.srcHeight);
  const void* dst_host = nullptr;
  side(&c.dstMemoryType, &dst_host, &c.dstDevice, &c.dstArray, &c.dstXInBytes, &c.dstY, &c.dstZ, &c.dstPitch,
       &c.dstHeight);
  c.dstHost = const_cast<void*>(dst_host);
  uint64_t w = 0, h = 0, d = 0;
  rv.reader.U64(&w);
  rv.reader.U64(&h);
  if (!rv.reader.U64(&d)) return CUDA_ERROR_UNKNOWN;
  c.WidthInBytes = w;
  c.Height = h;
  c.Depth = d;
  *p = c;
  return CUDA_SUCCESS;
}
CUresult Impl_cuGraphMemcpyNodeSetParams(CUgraphNode node, const CUDA_MEMCPY3D* copy) {
  NodeSpec n;
  n.type = CU_GRAPH_NODE_TYPE_MEMCPY;
  n.copy = copy;
  return SetNode(Fn::cuGraphMemcpyNodeSetParams, node, n);
}

CUresult Impl_cuGraphMemsetNodeGetParams(CUgraphNode node, CUDA_MEMSET_NODE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  ReplyView rv;
  CUresult r = Ask(l.session(), Fn::cuGraphMemsetNodeGetParams, H(node), &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t dst = 0, pitch = 0, w = 0, h = 0;
  uint32_t value = 0, elem = 0;
  rv.reader.U64(&dst);
  rv.reader.U64(&pitch);
  rv.reader.U32(&value);
  rv.reader.U32(&elem);
  rv.reader.U64(&w);
  if (!rv.reader.U64(&h)) return CUDA_ERROR_UNKNOWN;
  *p = CUDA_MEMSET_NODE_PARAMS{};
  p->dst = dst;
  p->pitch = pitch;
  p->value = value;
  p->elementSize = elem;
  p->width = w;
  p->height = h;
  return CUDA_SUCCESS;
}
CUresult Impl_cuGraphMemsetNodeSetParams(CUgraphNode node, const CUDA_MEMSET_NODE_PARAMS* params) {
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  NodeSpec n;
  n.type = CU_GRAPH_NODE_TYPE_MEMSET;
  n.memset = params;
  return SetNode(Fn::cuGraphMemsetNodeSetParams, node, n);
}

CUresult Impl_cuGraphMemAllocNodeGetParams(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  ReplyView rv;
  CUresult r = Ask(l.session(), Fn::cuGraphMemAllocNodeGetParams, H(node), &rv);
  if (r != CUDA_SUCCESS) return r;
  uint32_t loc_type = 0, alloc_type = 0, n = 0;
  int32_t loc_id = 0;
  uint64_t bytes = 0, dptr = 0;
  rv.reader.U32(&loc_type);
  rv.reader.I32(&loc_id);
  rv.reader.U32(&alloc_type);
  rv.reader.U64(&bytes);
  rv.reader.U64(&dptr);
  if (!rv.reader.U32(&n) || n > remote::kMaxDevices) return CUDA_ERROR_UNKNOWN;
  std::vector<CUmemAccessDesc> descs(n);
  for (CUmemAccessDesc& a : descs) {
    uint32_t t = 0, flags = 0;
    int32_t id = 0;
    rv.reader.U32(&t);
    rv.reader.I32(&id);
    if (!rv.reader.U32(&flags)) return CUDA_ERROR_UNKNOWN;
    a.location.type = static_cast<CUmemLocationType>(t);
    a.location.id = id;
    a.flags = static_cast<CUmemAccess_flags>(flags);
  }
  auto& kept = AccessDescs()[{l.session(), H(node)}];
  kept = std::move(descs);
  *p = CUDA_MEM_ALLOC_NODE_PARAMS{};
  p->poolProps.location.type = static_cast<CUmemLocationType>(loc_type);
  p->poolProps.location.id = loc_id;
  p->poolProps.allocType = static_cast<CUmemAllocationType>(alloc_type);
  p->bytesize = bytes;
  p->dptr = dptr;
  p->accessDescs = kept.empty() ? nullptr : kept.data();
  p->accessDescCount = kept.size();
  return CUDA_SUCCESS;
}

CUresult Impl_cuGraphKernelNodeGetAttribute(CUgraphNode node, CUkernelNodeAttrID attr, CUkernelNodeAttrValue* value) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  ReplyView rv;
  const uint32_t a = static_cast<uint32_t>(attr);
  CUresult r = Ask(l.session(), Fn::cuGraphKernelNodeGetAttribute, H(node), &rv, &a);
  if (r != CUDA_SUCCESS) return r;
  CUkernelNodeAttrValue v;
  if (!rv.reader.Bytes(&v, sizeof(v))) return CUDA_ERROR_UNKNOWN;
  *value = v;
  return CUDA_SUCCESS;
}
CUresult Impl_cuGraphKernelNodeSetAttribute(CUgraphNode node, CUkernelNodeAttrID attr,
                                            const CUkernelNodeAttrValue* value) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[12 + sizeof(*value)];
  Writer w(buf, sizeof(buf));
  w.U64(H(node));
  w.U32(static_cast<uint32_t>(attr));
  w.Bytes(value, sizeof(*value));
  return CallSync(l.session(), Op(Fn::cuGraphKernelNodeSetAttribute), w, nullptr);
}

// The node types the typed setters cover (kernel, memcpy, memset, host, event record and wait).
CUresult Impl_cuGraphNodeSetParams(CUgraphNode node, CUgraphNodeParams* params) {
  NodeSpec n;
  NodeSpecStorage st;
  if (CUresult r = SpecOfParams(params, &n, &st); r != CUDA_SUCCESS) return r;
  switch (n.type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
    case CU_GRAPH_NODE_TYPE_MEMCPY:
    case CU_GRAPH_NODE_TYPE_MEMSET:
    case CU_GRAPH_NODE_TYPE_HOST:
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      return SetNode(Fn::cuGraphNodeSetParams, node, n);
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

CUresult Impl_cuGraphExecNodeSetParams(CUgraphExec exec, CUgraphNode node, CUgraphNodeParams* params) {
  NodeSpec n;
  NodeSpecStorage st;
  if (CUresult r = SpecOfParams(params, &n, &st); r != CUDA_SUCCESS) return r;
  switch (n.type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
    case CU_GRAPH_NODE_TYPE_MEMCPY:
    case CU_GRAPH_NODE_TYPE_MEMSET:
    case CU_GRAPH_NODE_TYPE_HOST:
    case CU_GRAPH_NODE_TYPE_GRAPH:
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      break;
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
  CUresult r = ExecSetParams(Fn::cuGraphExecNodeSetParams, exec, node, n);
  if (r == CUDA_SUCCESS && (n.type == CU_GRAPH_NODE_TYPE_MEMCPY || n.type == CU_GRAPH_NODE_TYPE_GRAPH)) {
    TF_LOCK(l);
    ForgetGraphHostCopies(l.session(), H(exec));
  }
  return r;
}

// The worker's driver writes the file on the worker; its bytes come back and land at `path` here.
CUresult Impl_cuGraphDebugDotPrint(CUgraph graph, const char* path, unsigned int flags) {
  if (path == nullptr || *path == '\0') return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[12];
  Writer w(buf, sizeof(buf));
  w.U64(H(graph));
  w.U32(flags);
  DotFile f;
  f.path = path;
  CUresult r = CallSyncWithData(l.session(), Op(Fn::cuGraphDebugDotPrint), w, &DotSlice, &f);
  if (r == CUDA_SUCCESS && f.fd == -1) f.fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (f.fd >= 0) close(f.fd);
  if (r == CUDA_SUCCESS && f.fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
  return r;
}

// ---- legacy forms: conversions to the implemented ones

CUresult Impl_cuGraphInstantiate_v2(CUgraphExec* exec, CUgraph graph, CUgraphNode* err, char* log, size_t log_size) {
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_GRAPH_INSTANTIATE_PARAMS p = {};
  CUresult r = Impl_cuGraphInstantiateWithParams(exec, graph, &p);
  if (err) *err = p.hErrNode_out;
  if (log && log_size) log[0] = '\0';
  return r;
}
CUresult Impl_cuGraphInstantiate(CUgraphExec* exec, CUgraph graph, CUgraphNode* err, char* log, size_t log_size) {
  return Impl_cuGraphInstantiate_v2(exec, graph, err, log, log_size);
}

namespace {
CUDA_KERNEL_NODE_PARAMS FromV1(const CUDA_KERNEL_NODE_PARAMS_v1& p) {
  CUDA_KERNEL_NODE_PARAMS v = {};
  v.func = p.func;
  v.gridDimX = p.gridDimX;
  v.gridDimY = p.gridDimY;
  v.gridDimZ = p.gridDimZ;
  v.blockDimX = p.blockDimX;
  v.blockDimY = p.blockDimY;
  v.blockDimZ = p.blockDimZ;
  v.sharedMemBytes = p.sharedMemBytes;
  v.kernelParams = p.kernelParams;
  v.extra = p.extra;
  return v;
}
}  // namespace

CUresult Impl_cuGraphAddKernelNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps, size_t ndeps,
                                   const CUDA_KERNEL_NODE_PARAMS_v1* params) {
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_KERNEL_NODE_PARAMS v = FromV1(*params);
  return Impl_cuGraphAddKernelNode_v2(node, graph, deps, ndeps, &v);
}
CUresult Impl_cuGraphKernelNodeGetParams(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS_v1* params) {
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_KERNEL_NODE_PARAMS v = {};
  CUresult r = Impl_cuGraphKernelNodeGetParams_v2(node, &v);
  if (r != CUDA_SUCCESS) return r;
  *params = CUDA_KERNEL_NODE_PARAMS_v1{v.func, v.gridDimX, v.gridDimY, v.gridDimZ, v.blockDimX, v.blockDimY,
                                       v.blockDimZ, v.sharedMemBytes, v.kernelParams, v.extra};
  return CUDA_SUCCESS;
}
CUresult Impl_cuGraphKernelNodeSetParams(CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1* params) {
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_KERNEL_NODE_PARAMS v = FromV1(*params);
  return Impl_cuGraphKernelNodeSetParams_v2(node, &v);
}
CUresult Impl_cuGraphExecKernelNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                             const CUDA_KERNEL_NODE_PARAMS_v1* params) {
  if (params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_KERNEL_NODE_PARAMS v = FromV1(*params);
  return Impl_cuGraphExecKernelNodeSetParams_v2(exec, node, &v);
}
CUresult Impl_cuGraphExecUpdate(CUgraphExec exec, CUgraph graph, CUgraphNode* err, CUgraphExecUpdateResult* result) {
  if (err == nullptr || result == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUgraphExecUpdateResultInfo info = {};
  CUresult r = Impl_cuGraphExecUpdate_v2(exec, graph, &info);
  *err = info.errorNode;
  *result = info.result;
  return r;
}

}  // namespace tf::client
