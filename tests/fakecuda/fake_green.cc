// Fake green contexts and device resources (the driver's CUDA_GREEN_CONTEXTS group) and
// cuCtxSetFlags. The fake device has kMultiprocessorCount SMs; an SM resource is a range of them
// (its first SM and count live in the structure's hidden bytes, as the driver keeps its own
// there). Splits follow the documented rules of compute capability 9.0: groups of at least 8 SMs,
// a multiple of 8 (2 with CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING); the result of a split
// cannot be split again; the resources of one descriptor come from one device and, when there are
// several, from one split. A green context is a Context of its own (ctx->green set) whose streams
// run work like any other; its record and wait calls act on all of its streams. Kernels here are
// host functions, so the SM partition itself has no effect on where they run.
#include <algorithm>
#include <cstring>
#include <memory>

#include "fake_driver.h"

using fakecuda::Context;
using fakecuda::Driver;
using fakecuda::Event;
using fakecuda::Stream;

namespace {

constexpr uint32_t kMagic = 0x46475243;  // "FGRC"

// What the fake keeps in CUdevResource::_internal_padding.
struct Hidden {
  uint32_t magic;
  int32_t device;
  uint32_t first_sm;
  uint32_t split;       // the split that made it (0: a whole device or green context)
  uint32_t from_split;  // 1: a result or remainder of a split
};

struct Desc {
  int32_t device = 0;
  uint32_t first_sm = 0;
  uint32_t sm_count = 0;
};

struct Green {
  uint64_t id = 0;
  Context* ctx = nullptr;  // owned by Driver::owned_contexts
  Desc sms;
};

struct GreenState {
  std::map<Desc*, std::unique_ptr<Desc>> descs;  // never freed (as the driver's)
  std::map<Green*, std::unique_ptr<Green>> greens;
  uint32_t next_split = 1;
  uint64_t next_id = 1;
};

GreenState& State() {  // REQUIRES Driver::mu
  static GreenState* s = new GreenState;
  return *s;
}

void MakeResource(CUdevResource* r, int32_t device, uint32_t first, uint32_t count, uint32_t split,
                  bool from_split, bool coscheduled) {
  memset(r, 0, sizeof(*r));
  r->type = CU_DEV_RESOURCE_TYPE_SM;
  r->sm.smCount = count;
  r->sm.minSmPartitionSize = coscheduled ? 8 : 2;
  r->sm.smCoscheduledAlignment = coscheduled ? 8 : 2;
  Hidden h{kMagic, device, first, split, from_split ? 1u : 0u};
  memcpy(r->_internal_padding, &h, sizeof(h));
}

bool ReadHidden(const CUdevResource* r, Hidden* h) {
  memcpy(h, r->_internal_padding, sizeof(*h));
  return h->magic == kMagic;
}

Green* FindGreen(CUgreenCtx g) {  // REQUIRES Driver::mu
  auto& greens = State().greens;
  auto it = greens.find(reinterpret_cast<Green*>(g));
  return it == greens.end() ? nullptr : it->second.get();
}

// The streams of a context, its NULL stream first. REQUIRES Driver::mu.
std::vector<std::shared_ptr<Stream>> ContextStreams(Context* ctx) {
  Driver& d = Driver::Get();
  std::vector<std::shared_ptr<Stream>> out = {ctx->null_stream};
  for (Stream* s : ctx->streams) {
    auto it = d.streams.find(s);
    if (it != d.streams.end()) out.push_back(it->second);
  }
  return out;
}

std::shared_ptr<Event> FindEventLocked(CUevent e) {  // REQUIRES Driver::mu
  Driver& d = Driver::Get();
  auto it = d.events.find(reinterpret_cast<Event*>(e));
  return it == d.events.end() ? nullptr : it->second;
}

}  // namespace

CUresult cuDeviceGetDevResource(CUdevice device, CUdevResource* resource, CUdevResourceType type) {
  FAKECUDA_ENTER();
  if (resource == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (device < 0 || device >= Driver::Get().topology.device_count) return CUDA_ERROR_INVALID_DEVICE;
  if (type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
  MakeResource(resource, device, 0, fakecuda::kMultiprocessorCount, 0, false, true);
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevResource(CUcontext handle, CUdevResource* resource, CUdevResourceType type) {
  FAKECUDA_ENTER();
  if (resource == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  Context* ctx = reinterpret_cast<Context*>(handle);
  if (ctx == nullptr || d.contexts.count(ctx) == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
  if (ctx->green != nullptr) {
    const Desc& s = static_cast<Green*>(ctx->green)->sms;
    MakeResource(resource, s.device, s.first_sm, s.sm_count, 0, false, true);
  } else {
    MakeResource(resource, ctx->device, 0, fakecuda::kMultiprocessorCount, 0, false, true);
  }
  return CUDA_SUCCESS;
}

CUresult cuGreenCtxGetDevResource(CUgreenCtx g, CUdevResource* resource, CUdevResourceType type) {
  FAKECUDA_ENTER();
  if (resource == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  Green* green = FindGreen(g);
  if (green == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
  MakeResource(resource, green->sms.device, green->sms.first_sm, green->sms.sm_count, 0, false, true);
  return CUDA_SUCCESS;
}

CUresult cuDevSmResourceSplitByCount(CUdevResource* result, unsigned int* groups, const CUdevResource* input,
                                     CUdevResource* remaining, unsigned int flags, unsigned int min_count) {
  FAKECUDA_ENTER();
  if (groups == nullptr || input == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if ((flags & ~static_cast<unsigned>(CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING |
                                      CU_DEV_SM_RESOURCE_SPLIT_MAX_POTENTIAL_CLUSTER_SIZE)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (input->type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
  Hidden h;
  if (!ReadHidden(input, &h) || h.from_split) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
  const uint32_t total = input->sm.smCount;
  if (min_count > total) return CUDA_ERROR_INVALID_VALUE;
  const bool coscheduled = (flags & CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING) == 0;
  const uint32_t unit = coscheduled ? 8 : 2;
  const uint32_t count = std::max(unit, (min_count + unit - 1) / unit * unit);
  const uint32_t possible = total / count;
  if (result == nullptr) {
    *groups = possible;
    return CUDA_SUCCESS;
  }
  const uint32_t n = std::min<uint32_t>(*groups, possible);
  if (n == 0) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
  uint32_t split;
  {
    std::lock_guard<std::mutex> lock(Driver::Get().mu);
    split = State().next_split++;
  }
  for (uint32_t i = 0; i < n; ++i) {
    MakeResource(&result[i], h.device, h.first_sm + i * count, count, split, true, coscheduled);
  }
  if (remaining != nullptr) {
    MakeResource(remaining, h.device, h.first_sm + n * count, total - n * count, split, true, coscheduled);
  }
  *groups = n;
  return CUDA_SUCCESS;
}

CUresult cuDevResourceGenerateDesc(CUdevResourceDesc* desc, CUdevResource* resources, unsigned int n) {
  FAKECUDA_ENTER();
  if (desc == nullptr || resources == nullptr || n == 0) return CUDA_ERROR_INVALID_VALUE;
  auto out = std::make_unique<Desc>();
  uint32_t first = UINT32_MAX;
  Hidden h0{};
  for (unsigned i = 0; i < n; ++i) {
    Hidden h;
    if (resources[i].type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    if (!ReadHidden(&resources[i], &h)) return CUDA_ERROR_INVALID_VALUE;
    if (i == 0) h0 = h;
    if (h.device != h0.device || (n > 1 && (h.split == 0 || h.split != h0.split))) {
      return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    }
    first = std::min(first, h.first_sm);
    out->sm_count += resources[i].sm.smCount;
  }
  if (out->sm_count == 0) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
  out->device = h0.device;
  out->first_sm = first;
  std::lock_guard<std::mutex> lock(Driver::Get().mu);
  *desc = reinterpret_cast<CUdevResourceDesc>(out.get());
  State().descs[out.get()] = std::move(out);
  return CUDA_SUCCESS;
}

CUresult cuGreenCtxCreate(CUgreenCtx* phCtx, CUdevResourceDesc desc, CUdevice dev, unsigned int flags) {
  FAKECUDA_ENTER();
  if (phCtx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  if (dev < 0 || dev >= d.topology.device_count) return CUDA_ERROR_INVALID_DEVICE;
  if (flags != CU_GREEN_CTX_DEFAULT_STREAM) return CUDA_ERROR_INVALID_VALUE;  // required, alone
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = State().descs.find(reinterpret_cast<Desc*>(desc));
  if (it == State().descs.end()) return CUDA_ERROR_INVALID_VALUE;
  if (it->second->device != dev) return CUDA_ERROR_INVALID_DEVICE;
  auto ctx = std::make_unique<Context>();
  ctx->device = dev;
  ctx->null_stream = std::make_shared<Stream>();
  ctx->null_stream->ctx = ctx.get();
  auto green = std::make_unique<Green>();
  green->id = State().next_id++;
  green->ctx = ctx.get();
  green->sms = *it->second;
  ctx->green = green.get();
  d.contexts.insert(ctx.get());
  d.owned_contexts.push_back(std::move(ctx));
  *phCtx = reinterpret_cast<CUgreenCtx>(green.get());
  State().greens[green.get()] = std::move(green);
  return CUDA_SUCCESS;
}

CUresult cuGreenCtxDestroy(CUgreenCtx g) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::vector<std::shared_ptr<Stream>> retired;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    Green* green = FindGreen(g);
    if (green == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    Context* ctx = green->ctx;
    retired = ContextStreams(ctx);
    for (Stream* s : ctx->streams) d.streams.erase(s);
    ctx->streams.clear();
    d.contexts.erase(ctx);
    ctx->green = nullptr;
    State().greens.erase(green);
  }
  // Queued work completes first (the Context stays allocated, as cuCtxDestroy leaves it).
  for (auto& s : retired) s->worker.Drain();
  return CUDA_SUCCESS;
}

CUresult cuCtxFromGreenCtx(CUcontext* pContext, CUgreenCtx g) {
  FAKECUDA_ENTER();
  if (pContext == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(Driver::Get().mu);
  Green* green = FindGreen(g);
  if (green == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *pContext = reinterpret_cast<CUcontext>(green->ctx);
  return CUDA_SUCCESS;
}

// The event completes once every stream of the green context has reached this point.
CUresult cuGreenCtxRecordEvent(CUgreenCtx g, CUevent e) {
  FAKECUDA_ENTER();
  std::vector<std::shared_ptr<Stream>> streams;
  std::shared_ptr<Event> event;
  {
    std::lock_guard<std::mutex> lock(Driver::Get().mu);
    Green* green = FindGreen(g);
    if (green == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    event = FindEventLocked(e);
    if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    streams = ContextStreams(green->ctx);
  }
  const uint64_t generation = event->BeginRecord();
  auto left = std::make_shared<std::atomic<size_t>>(streams.size());
  for (auto& s : streams) {
    s->worker.Enqueue([event, generation, left] {
      if (left->fetch_sub(1) == 1) event->Complete(generation);
    });
  }
  return CUDA_SUCCESS;
}

// Work queued on the green context's streams from now on waits for the event's last record.
CUresult cuGreenCtxWaitEvent(CUgreenCtx g, CUevent e) {
  FAKECUDA_ENTER();
  std::vector<std::shared_ptr<Stream>> streams;
  std::shared_ptr<Event> event;
  {
    std::lock_guard<std::mutex> lock(Driver::Get().mu);
    Green* green = FindGreen(g);
    if (green == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    event = FindEventLocked(e);
    if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    streams = ContextStreams(green->ctx);
  }
  const uint64_t generation = event->Recorded();
  for (auto& s : streams) s->worker.Enqueue([event, generation] { event->WaitFor(generation); });
  return CUDA_SUCCESS;
}

CUresult cuStreamGetGreenCtx(CUstream handle, CUgreenCtx* phCtx) {
  FAKECUDA_ENTER();
  if (phCtx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = fakecuda::ResolveStream(handle, &err);
  if (stream == nullptr) return err;
  std::lock_guard<std::mutex> lock(Driver::Get().mu);
  *phCtx = reinterpret_cast<CUgreenCtx>(stream->ctx->green);
  return CUDA_SUCCESS;
}

CUresult cuGreenCtxStreamCreate(CUstream* phStream, CUgreenCtx g, unsigned int flags, int priority) {
  FAKECUDA_ENTER();
  if (phStream == nullptr || flags != CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  Green* green = FindGreen(g);
  if (green == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  auto stream = std::make_shared<Stream>();
  stream->ctx = green->ctx;
  stream->flags = flags;
  stream->priority = std::clamp(priority, -5, 0);
  green->ctx->streams.insert(stream.get());
  *phStream = reinterpret_cast<CUstream>(stream.get());
  d.streams[stream.get()] = std::move(stream);
  return CUDA_SUCCESS;
}

CUresult cuGreenCtxGetId(CUgreenCtx g, unsigned long long* id) {
  FAKECUDA_ENTER();
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  Green* green = g != nullptr ? FindGreen(g) : nullptr;
  if (g != nullptr && green == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (g == nullptr) {
    Context* cur = d.CurrentContextLocked();
    green = cur != nullptr ? static_cast<Green*>(cur->green) : nullptr;
  }
  if (green == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *id = green->id;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetFlags(unsigned int flags) {
  FAKECUDA_ENTER();
  if ((flags & ~static_cast<unsigned>(CU_CTX_FLAGS_MASK)) != 0) return CUDA_ERROR_INVALID_VALUE;
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  std::lock_guard<std::mutex> lock(Driver::Get().mu);
  ctx->flags = flags;
  return CUDA_SUCCESS;
}
