// CUDA graphs, minimal: empty graphs, kernel nodes, instantiation, launch, kernel-node updates of
// an instantiated graph, destruction. Graph, node and executable-graph handles are the worker's;
// the worker checks each against its session's tables. Stream capture is not forwarded.
#include <vector>

#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Writer;

// Kernel node parameters (see session.cc DecodeKernelNode).
CUresult WriteKernelNode(Session* s, const CUDA_KERNEL_NODE_PARAMS* p, Writer& w) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (p->func == nullptr) return p->kern ? Unsupported(Fn::cuGraphAddKernelNode_v2) : CUDA_ERROR_INVALID_VALUE;
  auto it = s->functions.find(H(p->func));
  if (it == s->functions.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (p->gridDimX == 0 || p->gridDimY == 0 || p->gridDimZ == 0 || p->blockDimX == 0 ||
      p->blockDimY == 0 || p->blockDimZ == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  w.U64(H(p->func));
  w.U32(p->gridDimX);
  w.U32(p->gridDimY);
  w.U32(p->gridDimZ);
  w.U32(p->blockDimX);
  w.U32(p->blockDimY);
  w.U32(p->blockDimZ);
  w.U32(p->sharedMemBytes);
  return WriteLaunchArgs(it->second, p->kernelParams, p->extra, w);
}

CUresult HandleCall(Fn fn, uint64_t h) {
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(h);
  return CallSync(l.session(), Op(fn), w, nullptr);
}

CUresult GraphLaunch(Fn fn, CUgraphExec exec, CUstream stream) {
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  w.U64(H(exec));
  w.U64(H(stream));
  return SendAsync(l.session(), Op(fn), w);
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

CUresult Impl_cuGraphAddKernelNode_v2(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                      size_t ndeps, const CUDA_KERNEL_NODE_PARAMS* params) {
  if (node == nullptr || graph == nullptr || (ndeps > 0 && deps == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (ndeps > remote::kMaxGraphDeps) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  // Per call, not a thread_local vector (destroyed at exit before cudart's teardown may call here).
  std::vector<uint8_t> buf(remote::kMaxKernelParamBytes + 8192 + ndeps * 8);
  Writer w(buf.data(), buf.size());
  w.U64(H(graph));
  w.U32(static_cast<uint32_t>(ndeps));
  for (size_t i = 0; i < ndeps; ++i) w.U64(H(deps[i]));
  if (CUresult r = WriteKernelNode(l.session(), params, w); r != CUDA_SUCCESS) return r;
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuGraphAddKernelNode_v2), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t n = 0;
  if (!rv.reader.U64(&n)) return CUDA_ERROR_UNKNOWN;
  *node = reinterpret_cast<CUgraphNode>(n);
  return CUDA_SUCCESS;
}

CUresult Impl_cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph,
                                          unsigned long long flags) {
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
  *exec = reinterpret_cast<CUgraphExec>(e);
  return CUDA_SUCCESS;
}

CUresult Impl_cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  return GraphLaunch(Fn::cuGraphLaunch, exec, stream);
}
CUresult Impl_cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
  return GraphLaunch(Fn::cuGraphLaunch_ptsz, exec, stream);
}

CUresult Impl_cuGraphExecKernelNodeSetParams_v2(CUgraphExec exec, CUgraphNode node,
                                                const CUDA_KERNEL_NODE_PARAMS* params) {
  TF_LOCK(l);
  TF_CTX(l);
  static thread_local uint8_t buf[remote::kMaxKernelParamBytes + 8192];
  Writer w(buf, sizeof(buf));
  w.U64(H(exec));
  w.U64(H(node));
  if (CUresult r = WriteKernelNode(l.session(), params, w); r != CUDA_SUCCESS) return r;
  return CallSync(l.session(), Op(Fn::cuGraphExecKernelNodeSetParams_v2), w, nullptr);
}

CUresult Impl_cuGraphExecDestroy(CUgraphExec exec) { return HandleCall(Fn::cuGraphExecDestroy, H(exec)); }
CUresult Impl_cuGraphDestroy(CUgraph graph) { return HandleCall(Fn::cuGraphDestroy, H(graph)); }

// cuGraphGetNodes: with nodes NULL, the count; else up to *numNodes handles and the count of
// those written (the driver's semantics).
CUresult Impl_cuGraphGetNodes(CUgraph graph, CUgraphNode* nodes, size_t* numNodes) {
  if (numNodes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  size_t capacity = nodes == nullptr ? 0 : *numNodes;
  if (capacity > remote::kMaxGraphDeps) capacity = remote::kMaxGraphDeps;
  TF_LOCK(l);
  TF_CTX(l);
  uint8_t buf[12];
  Writer w(buf, sizeof(buf));
  w.U64(H(graph));
  w.U32(static_cast<uint32_t>(capacity));
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuGraphGetNodes), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t count = 0;
  if (!rv.reader.U64(&count)) return CUDA_ERROR_UNKNOWN;
  if (nodes == nullptr) {
    *numNodes = count;
    return CUDA_SUCCESS;
  }
  size_t n = count < capacity ? count : capacity;
  for (size_t i = 0; i < n; ++i) {
    uint64_t h = 0;
    if (!rv.reader.U64(&h)) return CUDA_ERROR_UNKNOWN;
    nodes[i] = reinterpret_cast<CUgraphNode>(h);
  }
  for (size_t i = n; i < *numNodes; ++i) nodes[i] = nullptr;  // as the driver does
  *numNodes = n;
  return CUDA_SUCCESS;
}

}  // namespace tf::client
