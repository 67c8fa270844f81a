// Stream capture: cuStreamBeginCapture(_v2)(_ptsz), cuStreamBeginCaptureToGraph,
// cuStreamUpdateCaptureDependencies(_v2) and cuStreamEndCapture(_ptsz) are forwarded (the worker's driver records what is launched into the stream meanwhile; launches are
// forwarded as usual); the graph the capture ends with is a handle of the worker's graph table
// (cuGraphInstantiateWithFlags, cuGraphLaunch, cuGraphDestroy). The client remembers which streams
// capture, and answers cuStreamIsCapturing / cuStreamGetCaptureInfo from that. The capture mode
// of cuThreadExchangeStreamCaptureMode is kept per thread in the client and the worker's thread
// follows the mode of the last client thread that switched (see below).
#include <vector>

#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Writer;

thread_local CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

bool KnownStream(Session* s, CUstream stream) {
  uint64_t h = H(stream);
  return h <= 2 || s->streams.count(h) != 0;
}

CUresult BeginCapture(Fn fn, CUstream stream, CUstreamCaptureMode mode, bool with_mode) {
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  if (s->capturing.count(H(stream))) return CUDA_ERROR_ILLEGAL_STATE;
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  w.U64(H(stream));
  if (with_mode) w.U32(static_cast<uint32_t>(mode));
  CUresult r = CallSync(s, Op(fn), w, nullptr);
  if (r != CUDA_SUCCESS) return r;
  s->capturing[H(stream)] = {static_cast<unsigned>(mode), s->next_capture_id++};
  return CUDA_SUCCESS;
}

CUresult EndCapture(Fn fn, CUstream stream, CUgraph* graph) {
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  w.U64(H(stream));
  // No graph output: the worker's driver decides, as natively (a capture into an existing graph
  // may end without one).
  if (graph == nullptr) w.U32(1);
  ReplyView rv;
  CUresult r = CallSync(s, Op(fn), w, &rv);
  // The capture ends whatever the result (an invalidated capture too), except for a stream the
  // worker refused.
  if (r != CUDA_ERROR_INVALID_HANDLE) s->capturing.erase(H(stream));
  if (r != CUDA_SUCCESS || graph == nullptr) return r;
  uint64_t g = 0;
  if (!rv.reader.U64(&g)) return CUDA_ERROR_UNKNOWN;
  *graph = reinterpret_cast<CUgraph>(g);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult Impl_cuStreamBeginCapture(CUstream stream) {
  return BeginCapture(Fn::cuStreamBeginCapture, stream, CU_STREAM_CAPTURE_MODE_GLOBAL, false);
}
CUresult Impl_cuStreamBeginCapture_ptsz(CUstream stream) {
  return BeginCapture(Fn::cuStreamBeginCapture_ptsz, stream, CU_STREAM_CAPTURE_MODE_GLOBAL, false);
}
CUresult Impl_cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
  return BeginCapture(Fn::cuStreamBeginCapture_v2, stream, mode, true);
}
CUresult Impl_cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode) {
  return BeginCapture(Fn::cuStreamBeginCapture_v2_ptsz, stream, mode, true);
}
CUresult Impl_cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  return EndCapture(Fn::cuStreamEndCapture, stream, graph);
}
CUresult Impl_cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph) {
  return EndCapture(Fn::cuStreamEndCapture_ptsz, stream, graph);
}

CUresult Impl_cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (mode == nullptr || static_cast<unsigned>(*mode) > CU_STREAM_CAPTURE_MODE_RELAXED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUstreamCaptureMode old = t_capture_mode;
  t_capture_mode = *mode;
  *mode = old;
  // The worker makes this thread's calls on its own thread, whose mode decides whether an unsafe
  // call (cuMemAlloc) during a global capture elsewhere invalidates that capture: tell it when
  // the mode it has differs (fire-and-forget; one message per switch).
  TF_LOCK(l);
  Session* s = l.session();
  if (s->worker_capture_mode != static_cast<int>(t_capture_mode)) {
    uint8_t buf[4];
    Writer w(buf, sizeof(buf));
    w.U32(static_cast<uint32_t>(t_capture_mode));
    CUresult r = SendAsync(s, Op(Fn::cuThreadExchangeStreamCaptureMode), w);
    if (r != CUDA_SUCCESS) return r;
    s->worker_capture_mode = static_cast<int>(t_capture_mode);
  }
  return CUDA_SUCCESS;
}

CUresult Impl_cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus* status) {
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  if (!KnownStream(l.session(), stream)) return CUDA_ERROR_INVALID_HANDLE;
  *status = l.session()->capturing.count(H(stream)) ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                                                    : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
CUresult Impl_cuStreamIsCapturing_ptsz(CUstream stream, CUstreamCaptureStatus* status) {
  return Impl_cuStreamIsCapturing(stream, status);
}

// Status and id are answered from the client's record; while capturing, the capture graph and
// its current dependencies are asked of the worker (when the caller wants them). The
// dependency array stays valid until the next such call on the stream.
CUresult Impl_cuStreamGetCaptureInfo_v3(CUstream stream, CUstreamCaptureStatus* status,
                                        cuuint64_t* id, CUgraph* graph,
                                        const CUgraphNode** deps, const CUgraphEdgeData** edges,
                                        size_t* num_deps) {
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  Session* s = l.session();
  if (!KnownStream(s, stream)) return CUDA_ERROR_INVALID_HANDLE;
  auto it = s->capturing.find(H(stream));
  *status = it != s->capturing.end() ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  if (id && it != s->capturing.end()) *id = it->second.id;  // only written while capturing
  if (graph) *graph = nullptr;
  if (deps) *deps = nullptr;
  if (edges) *edges = nullptr;
  if (num_deps) *num_deps = 0;
  if (it == s->capturing.end() || (!graph && !deps && !edges && !num_deps)) return CUDA_SUCCESS;
  TF_CTX(l);
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(H(stream));
  ReplyView rv;
  CUresult r = CallSync(s, Op(Fn::cuStreamGetCaptureInfo_v3), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint32_t st = 0;
  uint64_t cid = 0, g = 0, n = 0;
  rv.reader.U32(&st);
  rv.reader.U64(&cid);
  rv.reader.U64(&g);
  if (!rv.reader.U64(&n) || n > remote::kMaxGraphDeps) return CUDA_ERROR_UNKNOWN;
  std::vector<CUgraphNode>& dv = s->capture_deps[H(stream)];
  std::vector<CUgraphEdgeData>& ev = s->capture_edges[H(stream)];
  dv.assign(n, nullptr);
  ev.assign(n, CUgraphEdgeData{});
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t h = 0;
    rv.reader.U64(&h);
    rv.reader.U8(&ev[i].from_port);
    rv.reader.U8(&ev[i].to_port);
    if (!rv.reader.U8(&ev[i].type)) return CUDA_ERROR_UNKNOWN;
    dv[i] = reinterpret_cast<CUgraphNode>(h);
  }
  *status = static_cast<CUstreamCaptureStatus>(st);
  if (graph) *graph = reinterpret_cast<CUgraph>(g);
  if (deps) *deps = n ? dv.data() : nullptr;
  if (edges) *edges = n ? ev.data() : nullptr;
  if (num_deps) *num_deps = n;
  return CUDA_SUCCESS;
}
CUresult Impl_cuStreamGetCaptureInfo_v3_ptsz(CUstream stream, CUstreamCaptureStatus* status,
                                             cuuint64_t* id, CUgraph* graph,
                                             const CUgraphNode** deps,
                                             const CUgraphEdgeData** edges, size_t* num_deps) {
  return Impl_cuStreamGetCaptureInfo_v3(stream, status, id, graph, deps, edges, num_deps);
}
CUresult Impl_cuStreamGetCaptureInfo_v2(CUstream stream, CUstreamCaptureStatus* status,
                                        cuuint64_t* id, CUgraph* graph, const CUgraphNode** deps,
                                        size_t* num_deps) {
  return Impl_cuStreamGetCaptureInfo_v3(stream, status, id, graph, deps, nullptr, num_deps);
}
CUresult Impl_cuStreamGetCaptureInfo_v2_ptsz(CUstream stream, CUstreamCaptureStatus* status,
                                             cuuint64_t* id, CUgraph* graph,
                                             const CUgraphNode** deps, size_t* num_deps) {
  return Impl_cuStreamGetCaptureInfo_v3(stream, status, id, graph, deps, nullptr, num_deps);
}
CUresult Impl_cuStreamGetCaptureInfo(CUstream stream, CUstreamCaptureStatus* status,
                                     cuuint64_t* id) {
  return Impl_cuStreamGetCaptureInfo_v3(stream, status, id, nullptr, nullptr, nullptr, nullptr);
}
CUresult Impl_cuStreamGetCaptureInfo_ptsz(CUstream stream, CUstreamCaptureStatus* status,
                                          cuuint64_t* id) {
  return Impl_cuStreamGetCaptureInfo_v3(stream, status, id, nullptr, nullptr, nullptr, nullptr);
}

namespace {
// Nodes and edge data: u32 n, n x u64, u8 present [, n x (u8 from port, u8 to port, u8 type)].
void WriteNodesAndEdges(const CUgraphNode* deps, const CUgraphEdgeData* edges, size_t n, Writer& w) {
  w.U32(static_cast<uint32_t>(n));
  for (size_t i = 0; i < n; ++i) w.U64(H(deps[i]));
  w.U8(edges ? 1 : 0);
  for (size_t i = 0; edges && i < n; ++i) {
    w.U8(edges[i].from_port);
    w.U8(edges[i].to_port);
    w.U8(edges[i].type);
  }
}

CUresult UpdateDeps(CUstream stream, CUgraphNode* deps, const CUgraphEdgeData* edges, size_t n,
                    unsigned flags) {
  if (n > remote::kMaxGraphDeps || (n > 0 && deps == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  std::vector<uint8_t> buf(32 + n * 12);
  Writer w(buf.data(), buf.size());
  w.U64(H(stream));
  w.U32(flags);
  WriteNodesAndEdges(deps, edges, n, w);
  return CallSync(l.session(), Op(Fn::cuStreamUpdateCaptureDependencies_v2), w, nullptr);
}

CUresult BeginToGraph(CUstream stream, CUgraph graph, const CUgraphNode* deps,
                      const CUgraphEdgeData* edges, size_t n, CUstreamCaptureMode mode) {
  if (n > remote::kMaxGraphDeps || (n > 0 && deps == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  if (s->capturing.count(H(stream))) return CUDA_ERROR_ILLEGAL_STATE;
  std::vector<uint8_t> buf(48 + n * 12);
  Writer w(buf.data(), buf.size());
  w.U64(H(stream));
  w.U64(H(graph));
  w.U32(static_cast<uint32_t>(mode));
  WriteNodesAndEdges(deps, edges, n, w);
  CUresult r = CallSync(s, Op(Fn::cuStreamBeginCaptureToGraph), w, nullptr);
  if (r != CUDA_SUCCESS) return r;
  s->capturing[H(stream)] = {static_cast<unsigned>(mode), s->next_capture_id++};
  return CUDA_SUCCESS;
}
}  // namespace

CUresult Impl_cuStreamUpdateCaptureDependencies_v2(CUstream stream, CUgraphNode* deps,
                                                   const CUgraphEdgeData* edges, size_t n,
                                                   unsigned int flags) {
  return UpdateDeps(stream, deps, edges, n, flags);
}
CUresult Impl_cuStreamUpdateCaptureDependencies_v2_ptsz(CUstream stream, CUgraphNode* deps,
                                                        const CUgraphEdgeData* edges, size_t n,
                                                        unsigned int flags) {
  return UpdateDeps(stream, deps, edges, n, flags);
}
CUresult Impl_cuStreamUpdateCaptureDependencies(CUstream stream, CUgraphNode* deps, size_t n,
                                                unsigned int flags) {
  return UpdateDeps(stream, deps, nullptr, n, flags);
}
CUresult Impl_cuStreamUpdateCaptureDependencies_ptsz(CUstream stream, CUgraphNode* deps, size_t n,
                                                     unsigned int flags) {
  return UpdateDeps(stream, deps, nullptr, n, flags);
}
CUresult Impl_cuStreamBeginCaptureToGraph(CUstream stream, CUgraph graph, const CUgraphNode* deps,
                                          const CUgraphEdgeData* edges, size_t n,
                                          CUstreamCaptureMode mode) {
  return BeginToGraph(stream, graph, deps, edges, n, mode);
}
CUresult Impl_cuStreamBeginCaptureToGraph_ptsz(CUstream stream, CUgraph graph,
                                               const CUgraphNode* deps,
                                               const CUgraphEdgeData* edges, size_t n,
                                               CUstreamCaptureMode mode) {
  return BeginToGraph(stream, graph, deps, edges, n, mode);
}

}  // namespace tf::client
