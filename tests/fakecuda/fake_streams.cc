// Fake driver streams and events. Each stream owns a worker thread (StreamWorker); an event record
// is a work item that stamps the steady-clock time when the stream reaches it.
#include <algorithm>

#include "fake_driver.h"

using fakecuda::Driver;
using fakecuda::Event;
using fakecuda::Stream;

namespace {

CUresult CreateStream(CUstream* handle, unsigned flags, int priority) {
  if (handle == nullptr || (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::Context* ctx = d.CurrentContextLocked();
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  auto stream = std::make_shared<Stream>();
  stream->ctx = ctx;
  stream->flags = flags;
  stream->priority = std::clamp(priority, -5, 0);
  ctx->streams.insert(stream.get());
  *handle = reinterpret_cast<CUstream>(stream.get());
  d.streams[stream.get()] = std::move(stream);
  return CUDA_SUCCESS;
}

std::shared_ptr<Event> FindEvent(CUevent handle) {
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.events.find(reinterpret_cast<Event*>(handle));
  return it == d.events.end() ? nullptr : it->second;
}

CUresult RecordEvent(CUevent event_handle, CUstream stream_handle) {
  std::shared_ptr<Event> event = FindEvent(event_handle);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = fakecuda::ResolveStream(stream_handle, &err);
  if (stream == nullptr) return err;
  const uint64_t generation = event->BeginRecord();
  stream->worker.Enqueue([event, generation] { event->Complete(generation); });
  return CUDA_SUCCESS;
}

// The time of the event's last record, once that record has completed.
CUresult CompletedTime(Event& event, std::chrono::steady_clock::time_point* when) {
  std::lock_guard<std::mutex> lock(event.mu);
  if (event.recorded == 0) return CUDA_ERROR_INVALID_HANDLE;
  if (event.completed < event.recorded) return CUDA_ERROR_NOT_READY;
  *when = event.when;
  return CUDA_SUCCESS;
}

}  // namespace

CUresult cuStreamCreate(CUstream* handle, unsigned int flags) {
  FAKECUDA_ENTER();
  return CreateStream(handle, flags, 0);
}

CUresult cuStreamCreateWithPriority(CUstream* handle, unsigned int flags, int priority) {
  FAKECUDA_ENTER();
  return CreateStream(handle, flags, priority);
}

CUresult cuStreamDestroy_v2(CUstream handle) {
  FAKECUDA_ENTER();
  std::shared_ptr<Stream> stream;
  {
    Driver& d = Driver::Get();
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.streams.find(reinterpret_cast<Stream*>(handle));
    if (it == d.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    stream = std::move(it->second);
    d.streams.erase(it);
    if (d.contexts.count(stream->ctx) != 0) stream->ctx->streams.erase(stream.get());
  }
  // Queued work still completes (as in CUDA); the worker thread exits once it has.
  stream->worker.Drain();
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream handle) {
  FAKECUDA_ENTER();
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = fakecuda::ResolveStream(handle, &err);
  if (stream == nullptr) return err;
  stream->worker.Drain();
  fakecuda::FlushDevicePrintf();
  return CUDA_SUCCESS;
}

CUresult cuStreamQuery(CUstream handle) {
  FAKECUDA_ENTER();
  fakecuda::g_stream_queries.fetch_add(1, std::memory_order_relaxed);
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = fakecuda::ResolveStream(handle, &err);
  if (stream == nullptr) return err;
  return stream->worker.Idle() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuStreamGetPriority(CUstream handle, int* priority) {
  FAKECUDA_ENTER();
  if (priority == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = fakecuda::ResolveStream(handle, &err);
  if (stream == nullptr) return err;
  *priority = stream->priority;
  return CUDA_SUCCESS;
}

CUresult cuStreamGetFlags(CUstream handle, unsigned int* flags) {
  FAKECUDA_ENTER();
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = fakecuda::ResolveStream(handle, &err);
  if (stream == nullptr) return err;
  *flags = stream->flags;
  return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(CUstream stream_handle, CUevent event_handle, unsigned int flags) {
  FAKECUDA_ENTER();
  (void)flags;
  std::shared_ptr<Event> event = FindEvent(event_handle);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = fakecuda::ResolveStream(stream_handle, &err);
  if (stream == nullptr) return err;
  const uint64_t generation = event->Recorded();  // the most recent record, as CUDA does
  if (generation == 0) return CUDA_SUCCESS;
  stream->worker.Enqueue([event, generation] { event->WaitFor(generation); });
  return CUDA_SUCCESS;
}

// Stream capture, minimal: kernel launches into a capturing stream become kernel nodes of the
// capture graph (in order); other work on a capturing stream is not recorded.
namespace {
thread_local CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
}  // namespace

CUresult fakecuda::CheckUnsafeDuringCapture() {
  if (t_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  bool any = false;
  for (auto& [raw, stream] : d.streams) {
    if (stream->capture != nullptr && stream->capture_global) {
      stream->capture_invalidated = true;
      any = true;
    }
  }
  return any ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture_v2(CUstream handle, CUstreamCaptureMode mode) {
  FAKECUDA_ENTER();
  if (handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = fakecuda::ResolveStream(handle, &err);
  if (stream == nullptr) return err;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  if (stream->capture != nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  auto g = std::make_unique<fakecuda::Graph>();
  stream->capture = g.get();
  stream->capture_global = mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
  stream->capture_invalidated = false;
  stream->capture_to_existing = false;
  stream->capture_deps.clear();
  static uint64_t next_id = 1;
  stream->capture_id = next_id++;
  d.graphs[g.get()] = std::move(g);
  return CUDA_SUCCESS;
}

// Captures into the caller's graph, after `deps` (nodes of it).
CUresult cuStreamBeginCaptureToGraph(CUstream handle, CUgraph graph, const CUgraphNode* deps,
                                     const CUgraphEdgeData* edges, size_t num_deps,
                                     CUstreamCaptureMode mode) {
  FAKECUDA_ENTER();
  (void)edges;
  if (handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  if (num_deps > 0 && deps == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = fakecuda::ResolveStream(handle, &err);
  if (stream == nullptr) return err;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.graphs.find(reinterpret_cast<fakecuda::Graph*>(graph));
  if (it == d.graphs.end()) return CUDA_ERROR_INVALID_VALUE;
  if (stream->capture != nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  std::vector<fakecuda::GraphNode*> dep_nodes;
  for (size_t i = 0; i < num_deps; ++i) {
    auto* n = reinterpret_cast<fakecuda::GraphNode*>(deps[i]);
    bool found = false;
    for (auto& own : it->second->nodes) found = found || own.get() == n;
    if (!found) return CUDA_ERROR_INVALID_VALUE;
    dep_nodes.push_back(n);
  }
  stream->capture = it->second.get();
  stream->capture_global = mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
  stream->capture_invalidated = false;
  stream->capture_to_existing = true;
  stream->capture_deps = dep_nodes;
  static uint64_t next_id = 1u << 20;
  stream->capture_id = next_id++;
  return CUDA_SUCCESS;
}

// Replaces (or adds to) the nodes the next captured work depends on.
CUresult cuStreamUpdateCaptureDependencies_v2(CUstream handle, CUgraphNode* deps,
                                              const CUgraphEdgeData* edges, size_t num_deps,
                                              unsigned int flags) {
  FAKECUDA_ENTER();
  (void)edges;
  if ((num_deps > 0 && deps == nullptr) || flags > CU_STREAM_SET_CAPTURE_DEPENDENCIES) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = fakecuda::ResolveStream(handle, &err);
  if (stream == nullptr) return err;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  if (stream->capture == nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  std::vector<fakecuda::GraphNode*> add;
  for (size_t i = 0; i < num_deps; ++i) {
    auto* n = reinterpret_cast<fakecuda::GraphNode*>(deps[i]);
    bool found = false;
    for (auto& own : stream->capture->nodes) found = found || own.get() == n;
    if (!found) return CUDA_ERROR_INVALID_VALUE;
    add.push_back(n);
  }
  if (flags == CU_STREAM_SET_CAPTURE_DEPENDENCIES) stream->capture_deps.clear();
  for (auto* n : add) {
    if (std::find(stream->capture_deps.begin(), stream->capture_deps.end(), n) ==
        stream->capture_deps.end()) {
      stream->capture_deps.push_back(n);
    }
  }
  return CUDA_SUCCESS;
}

// A capture into an existing graph may end without a graph output (the real driver takes NULL
// there: NVIDIA's graphConditionalNodes sample does it); a capture of its own needs one.
CUresult cuStreamEndCapture(CUstream handle, CUgraph* graph) {
  FAKECUDA_ENTER();
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = fakecuda::ResolveStream(handle, &err);
  if (stream == nullptr) return err;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  if (stream->capture == nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  if (graph == nullptr && !stream->capture_to_existing) return CUDA_ERROR_INVALID_VALUE;
  if (stream->capture_invalidated) {
    if (!stream->capture_to_existing) d.graphs.erase(stream->capture);
    stream->capture = nullptr;
    if (graph) *graph = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  if (graph) *graph = reinterpret_cast<CUgraph>(stream->capture);
  stream->capture = nullptr;
  return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream handle, CUstreamCaptureStatus* status) {
  FAKECUDA_ENTER();
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = fakecuda::ResolveStream(handle, &err);
  if (stream == nullptr) return err;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  *status = stream->capture ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

CUresult cuStreamGetCaptureInfo_v3(CUstream handle, CUstreamCaptureStatus* status, cuuint64_t* id,
                                    CUgraph* graph, const CUgraphNode** deps,
                                    const CUgraphEdgeData** edges, size_t* num_deps) {
  FAKECUDA_ENTER();
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = fakecuda::ResolveStream(handle, &err);
  if (stream == nullptr) return err;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  *status = stream->capture ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  if (id && stream->capture) *id = stream->capture_id;
  if (graph) *graph = reinterpret_cast<CUgraph>(stream->capture);
  // The array stays valid until the next call on the stream (as CUDA's).
  static thread_local std::vector<CUgraphNode> dep_array;
  dep_array.clear();
  if (stream->capture) {
    for (auto* n : stream->capture_deps) dep_array.push_back(reinterpret_cast<CUgraphNode>(n));
  }
  if (deps) *deps = dep_array.empty() ? nullptr : dep_array.data();
  if (edges) *edges = nullptr;
  if (num_deps) *num_deps = dep_array.size();
  return CUDA_SUCCESS;
}

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  FAKECUDA_ENTER();
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (static_cast<unsigned>(*mode) > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
  CUstreamCaptureMode old = t_capture_mode;
  t_capture_mode = *mode;
  *mode = old;
  return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent* handle, unsigned int flags) {
  FAKECUDA_ENTER();
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  (void)ctx;
  const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if ((flags & ~known) != 0) return CUDA_ERROR_INVALID_VALUE;
  // An interprocess event cannot be timed (cuda.h: CU_EVENT_DISABLE_TIMING must be set).
  if ((flags & CU_EVENT_INTERPROCESS) != 0 && (flags & CU_EVENT_DISABLE_TIMING) == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  auto event = std::make_shared<Event>();
  event->flags = flags;
  if ((flags & CU_EVENT_INTERPROCESS) != 0) {
    if (CUresult r = fakecuda::MakeEventShareable(event.get()); r != CUDA_SUCCESS) return r;
  }
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  *handle = reinterpret_cast<CUevent>(event.get());
  d.events[event.get()] = std::move(event);
  return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent handle) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  // Pending records and waits hold their own reference.
  if (d.events.erase(reinterpret_cast<Event*>(handle)) == 0) return CUDA_ERROR_INVALID_HANDLE;
  return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent event, CUstream stream) {
  FAKECUDA_ENTER();
  return RecordEvent(event, stream);
}

CUresult cuEventRecordWithFlags(CUevent event, CUstream stream, unsigned int flags) {
  FAKECUDA_ENTER();
  (void)flags;
  return RecordEvent(event, stream);
}

CUresult cuEventQuery(CUevent handle) {
  FAKECUDA_ENTER();
  std::shared_ptr<Event> event = FindEvent(handle);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return event->Reached(event->Recorded()) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent handle) {
  FAKECUDA_ENTER();
  std::shared_ptr<Event> event = FindEvent(handle);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  event->WaitFor(event->Recorded());
  fakecuda::FlushDevicePrintf();
  return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime_v2(float* ms, CUevent start_handle, CUevent end_handle) {
  FAKECUDA_ENTER();
  if (ms == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<Event> start = FindEvent(start_handle);
  std::shared_ptr<Event> end = FindEvent(end_handle);
  if (start == nullptr || end == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING) != 0) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  std::chrono::steady_clock::time_point t0, t1;
  if (CUresult r = CompletedTime(*start, &t0); r != CUDA_SUCCESS) return r;
  if (CUresult r = CompletedTime(*end, &t1); r != CUDA_SUCCESS) return r;
  *ms = std::chrono::duration<float, std::milli>(t1 - t0).count();
  return CUDA_SUCCESS;
}

// CUDA 12 programs call the unversioned name; the semantics are the same here.
#undef cuEventElapsedTime
FAKECUDA_EXPORT CUresult cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  return cuEventElapsedTime_v2(ms, start, end);
}
