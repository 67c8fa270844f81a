// Entry points the stub answers without a round trip: pointer attributes of the allocations it
// made, function attributes cached with the handle, stream capture state (never capturing: capture
// is not forwarded), context queries from what came with the context handle, the per-thread
// context stack and current context, and the device queries (from the snapshot taken at connect).
#include <pthread.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

// The context stack under the current context, per thread. Not a thread_local std::vector: the
// main thread's thread_local destructors run at exit() before the atexit handlers, among them a
// static cudart's teardown, which may still push and pop contexts (a destroyed vector's buffer
// would be freed twice). Allocated on first push, freed at thread exit by a pthread key (which
// does not run for the main thread at exit()).
pthread_key_t g_stack_key;
pthread_once_t g_stack_once = PTHREAD_ONCE_INIT;
thread_local std::vector<uint64_t>* t_ctx_below = nullptr;

std::vector<uint64_t>& CtxBelow() {
  if (t_ctx_below == nullptr) {
    pthread_once(&g_stack_once, [] {
      pthread_key_create(&g_stack_key, [](void* p) { delete static_cast<std::vector<uint64_t>*>(p); });
    });
    t_ctx_below = new std::vector<uint64_t>();
    pthread_setspecific(g_stack_key, t_ctx_below);
  }
  return *t_ctx_below;
}

struct StackForkReset {
  StackForkReset() {
    pthread_atfork(nullptr, nullptr, [] {
      if (t_ctx_below != nullptr) t_ctx_below->clear();
    });
  }
} g_stack_fork_reset;

// Size in bytes of each pointer attribute's value; 0 for those the stub does not answer.
size_t AttributeSize(CUpointer_attribute a) {
  switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      return 8;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    case CU_POINTER_ATTRIBUTE_MAPPED:
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
      return 4;
    default:
      return 0;
  }
}

template <class T>
void Put(void* data, T v) {
  memcpy(data, &v, sizeof(v));
}

CUresult PointerAttribute(Session* s, void* data, CUpointer_attribute attr, CUdeviceptr ptr) {
  uint64_t base = 0;
  const DeviceAlloc* a = FindDeviceAlloc(s, ptr, &base);
  HostRange h;
  const bool host = a == nullptr && FindHostRange(ptr, &h);
  if (a == nullptr && !host) return CUDA_ERROR_INVALID_VALUE;
  if (host) base = h.base;
  const uint64_t ctx = host ? h.ctx : a->ctx;
  // Managed memory is host memory here, but the driver describes it as device memory that the
  // host may also dereference (IS_MANAGED 1, host and device pointer the same address).
  const bool managed = host && h.managed;
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: Put<uint64_t>(data, ctx); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      Put<uint32_t>(data, host && !managed ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: Put<uint64_t>(data, ptr); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (!host) return CUDA_ERROR_INVALID_VALUE;
      Put<uint64_t>(data, ptr);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      Put<uint64_t>(data, host ? h.base : a->buffer_id);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: Put<int32_t>(data, managed ? 1 : 0); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      Put<int32_t>(data, host ? h.device : a->device);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: Put<uint64_t>(data, base); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      Put<uint64_t>(data, host ? h.size : a->size);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED: Put<int32_t>(data, 1); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
      Put<int32_t>(data, !host && a->sync_memops ? 1 : 0);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      Put<uint64_t>(data, host ? 0 : a->pool);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: Put<uint64_t>(data, 0); return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

const ContextInfo* CurrentContextInfo(Session* s) {
  auto it = s->context_info.find(CurrentContext());
  return it == s->context_info.end() ? nullptr : &it->second;
}

}  // namespace

const DeviceAlloc* FindDeviceAlloc(Session* s, uint64_t p, uint64_t* base) {
  auto it = s->allocs.upper_bound(p);
  if (it == s->allocs.begin()) return nullptr;
  --it;
  if (p - it->first >= it->second.size) return nullptr;
  if (base) *base = it->first;
  return &it->second;
}

void RecordDeviceAlloc(Session* s, uint64_t p, uint64_t size, uint64_t pool) {
  DeviceAlloc a;
  a.size = size;
  a.ctx = CurrentContext();
  auto c = s->contexts.find(a.ctx);
  a.device = c == s->contexts.end() ? 0 : c->second;
  a.pool = pool;
  a.buffer_id = s->next_buffer_id++;
  s->allocs[p] = a;
}

void PushCurrentContext(uint64_t ctx) {
  if (CurrentContext() != 0) CtxBelow().push_back(CurrentContext());
  SetCurrentContext(ctx);
}

// ---- pointer attributes

CUresult Impl_cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  return PointerAttribute(l.session(), data, attribute, ptr);
}

CUresult Impl_cuPointerGetAttributes(unsigned int n, CUpointer_attribute* attributes, void** data,
                                     CUdeviceptr ptr) {
  if (n == 0 || attributes == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  for (unsigned i = 0; i < n; ++i) {
    size_t size = AttributeSize(attributes[i]);
    if (size == 0 || data[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
  }
  // Unlike cuPointerGetAttribute, an unknown pointer is not an error: its attributes read as 0.
  for (unsigned i = 0; i < n; ++i) {
    if (PointerAttribute(l.session(), data[i], attributes[i], ptr) != CUDA_SUCCESS) {
      memset(data[i], 0, AttributeSize(attributes[i]));
    }
  }
  return CUDA_SUCCESS;
}

// ---- functions

CUresult Impl_cuFuncGetAttribute(int* pi, CUfunction_attribute attrib, CUfunction hfunc) {
  if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  auto it = l.session()->functions.find(H(hfunc));
  if (it == l.session()->functions.end()) return CUDA_ERROR_INVALID_HANDLE;
  int a = static_cast<int>(attrib);
  if (a < 0 || static_cast<size_t>(a) >= it->second.attrs.size()) return CUDA_ERROR_INVALID_VALUE;
  *pi = it->second.attrs[a];
  return CUDA_SUCCESS;
}

// ---- context queries and the context stack

CUresult Impl_cuCtxGetApiVersion(CUcontext ctx, unsigned int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  uint64_t c = ctx ? H(ctx) : CurrentContext();
  auto it = l.session()->context_info.find(c);
  if (it == l.session()->context_info.end()) return CUDA_ERROR_INVALID_CONTEXT;
  *version = it->second.api_version;
  return CUDA_SUCCESS;
}

CUresult Impl_cuCtxGetFlags(unsigned int* flags) {
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  const ContextInfo* info = CurrentContextInfo(l.session());
  if (info == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *flags = info->flags;
  return CUDA_SUCCESS;
}

CUresult Impl_cuCtxGetStreamPriorityRange(int* least, int* greatest) {
  TF_LOCK(l);
  const ContextInfo* info = CurrentContextInfo(l.session());
  if (info == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (least) *least = info->least_priority;
  if (greatest) *greatest = info->greatest_priority;
  return CUDA_SUCCESS;
}

CUresult Impl_cuCtxPushCurrent_v2(CUcontext ctx) {
  TF_LOCK(l);
  if (ctx == nullptr || !l.session()->contexts.count(H(ctx))) return CUDA_ERROR_INVALID_CONTEXT;
  PushCurrentContext(H(ctx));
  return CUDA_SUCCESS;
}

CUresult Impl_cuCtxPopCurrent_v2(CUcontext* pctx) {
  TF_LOCK(l);
  uint64_t cur = CurrentContext();
  if (cur == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx) *pctx = reinterpret_cast<CUcontext>(cur);
  std::vector<uint64_t>& below = CtxBelow();
  if (below.empty()) {
    SetCurrentContext(0);
  } else {
    SetCurrentContext(below.back());
    below.pop_back();
  }
  return CUDA_SUCCESS;
}

// ---- devices: from the snapshot taken at connect

CUresult Impl_cuDeviceGetCount(int* count) {
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  *count = static_cast<int>(l.session()->devices.size());
  return CUDA_SUCCESS;
}

CUresult Impl_cuDeviceGet(CUdevice* device, int ordinal) {
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  if (!FindDevice(l.session(), ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult Impl_cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  const DeviceInfo* d = FindDevice(l.session(), dev);
  if (!d) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, static_cast<size_t>(len), "%s", d->name);
  return CUDA_SUCCESS;
}

CUresult Impl_cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  const DeviceInfo* d = FindDevice(l.session(), dev);
  if (!d) return CUDA_ERROR_INVALID_DEVICE;
  *uuid = d->uuid;
  return CUDA_SUCCESS;
}
CUresult Impl_cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) { return Impl_cuDeviceGetUuid_v2(uuid, dev); }

CUresult Impl_cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  const DeviceInfo* d = FindDevice(l.session(), dev);
  if (!d) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = d->total_mem;
  return CUDA_SUCCESS;
}

CUresult Impl_cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  const DeviceInfo* d = FindDevice(l.session(), dev);
  if (!d) return CUDA_ERROR_INVALID_DEVICE;
  int a = static_cast<int>(attrib);
  if (a < 0 || static_cast<size_t>(a) >= d->attrs.size()) return CUDA_ERROR_INVALID_VALUE;
  *pi = d->attrs[a];
  return CUDA_SUCCESS;
}

// ---- the thread's current context, from the client's context table

CUresult Impl_cuCtxGetCurrent(CUcontext* pctx) {
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  *pctx = reinterpret_cast<CUcontext>(CurrentContext());
  return CUDA_SUCCESS;
}

CUresult Impl_cuCtxSetCurrent(CUcontext ctx) {
  TF_LOCK(l);
  if (ctx != nullptr && !l.session()->contexts.count(H(ctx))) return CUDA_ERROR_INVALID_CONTEXT;
  SetCurrentContext(H(ctx));
  return CUDA_SUCCESS;
}

CUresult Impl_cuCtxGetDevice(CUdevice* device) {
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  auto it = l.session()->contexts.find(CurrentContext());
  if (it == l.session()->contexts.end()) return CUDA_ERROR_INVALID_CONTEXT;
  *device = it->second;
  return CUDA_SUCCESS;
}

CUresult Impl_cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  auto it = l.session()->contexts.find(ctx != nullptr ? H(ctx) : CurrentContext());
  if (it == l.session()->contexts.end()) return CUDA_ERROR_INVALID_CONTEXT;
  *device = it->second;
  return CUDA_SUCCESS;
}

}  // namespace tf::client
