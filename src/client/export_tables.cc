// The export tables of the remote client stub (see export_tables.h and docs/export-tables.md).
// Every slot of every table holds a function: the ones whose meaning is known are implemented on
// top of the stub's own entry points; the others log their first call on stderr and return a
// per-table default (an error code where the slot is known to return a CUresult, zero in the
// tools tables, whose zero means "no tool attached"), so that a call cudart makes through a slot we
// do not know never jumps to NULL.
#include "client/export_tables.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "client/client.h"
#include "client/integrity_hash.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

// ---- trace

bool Tracing() {
  static const bool on = [] {
    const char* v = getenv("TFUSION_CLIENT_TRACE");
    return v != nullptr && v[0] != '\0' && strcmp(v, "0") != 0;
  }();
  return on;
}

#define TF_TRACE(...)                    \
  do {                                   \
    if (Tracing()) ClientLog(__VA_ARGS__); \
  } while (0)

void UuidText(const CUuuid& id, char out[33]) {
  for (int i = 0; i < 16; ++i) {
    snprintf(out + 2 * i, 3, "%02x", static_cast<unsigned char>(id.bytes[i]));
  }
}

constexpr CUuuid MakeUuid(const unsigned char (&b)[16]) {
  CUuuid u{};
  for (int i = 0; i < 16; ++i) u.bytes[i] = static_cast<char>(b[i]);
  return u;
}

bool SameUuid(const CUuuid& a, const CUuuid& b) { return memcmp(a.bytes, b.bytes, 16) == 0; }

// ---- the tables we know (UUID bytes in memory order)

enum TableId : int {
  kCudartInterface,
  kToolsTls,
  kToolsRuntimeCallbackHooks,
  kContextLocalStorage,
  kIntegrityCheck,
  kContextChecks,
  kContextQueries,
  kLibraryObjects,
  kToolsModules,
  kTableCount
};

// Slot counts as the driver (580.159.04) reports them in slot 0.
constexpr size_t kSlots[kTableCount] = {13, 3, 7, 4, 3, 4, 93, 17, 99};
constexpr size_t kMaxSlots = 128;

const ExportTableInfo kInfo[kTableCount] = {
    {"CUDART_INTERFACE",
     MakeUuid({0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd,
               0x9d, 0xf9}),
     kSlots[kCudartInterface], true},
    {"TOOLS_TLS",
     MakeUuid({0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a,
               0xec, 0xdc}),
     kSlots[kToolsTls], true},
    {"TOOLS_RUNTIME_CALLBACK_HOOKS",
     MakeUuid({0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c,
               0x0a, 0x66}),
     kSlots[kToolsRuntimeCallbackHooks], true},
    {"CONTEXT_LOCAL_STORAGE_INTERFACE_V0301",
     MakeUuid({0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8,
               0x95, 0x93}),
     kSlots[kContextLocalStorage], false},
    {"INTEGRITY_CHECK",
     MakeUuid({0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66,
               0xe1, 0xf2}),
     kSlots[kIntegrityCheck], true},
    {"CONTEXT_CHECKS",
     MakeUuid({0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d,
               0xfa, 0x7e}),
     kSlots[kContextChecks], true},
    // Undocumented; named here after what cuBLAS was seen to use them for (docs/export-tables.md).
    {"CONTEXT_QUERIES",
     MakeUuid({0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24,
               0xc8, 0xf2}),
     kSlots[kContextQueries], true},
    {"LIBRARY_OBJECTS",
     MakeUuid({0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd,
               0x8b, 0xca}),
     kSlots[kLibraryObjects], true},
    // Called the tools "module/function" table by public analyses; cuFFT asks for it.
    {"TOOLS_MODULES",
     MakeUuid({0x6e, 0x16, 0x3f, 0xbe, 0xb9, 0x58, 0x44, 0x4d, 0x83, 0x5c, 0xe1, 0x82, 0xaf, 0xf1,
               0x99, 0x1e}),
     kSlots[kToolsModules], true},
};

// What a slot we do not understand returns: CUDA_ERROR_NOT_SUPPORTED where the table's known slots
// return a CUresult, 0 in the tools tables.
constexpr uint64_t kUnknownSlotResult[kTableCount] = {
    CUDA_ERROR_NOT_SUPPORTED, 0, 0, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED, 0,
    CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED};

std::atomic<bool> g_unknown_logged[kTableCount][kMaxSlots];

// The slot takes no parameters here: whatever the caller passes in registers is ignored (SysV
// x86-64 and AArch64 leave argument clean-up to nobody), and the 64-bit result covers callers
// that expect an int, a pointer or nothing.
template <int T, int S>
uint64_t UnknownSlot() {
  if (!g_unknown_logged[T][S].exchange(true) || Tracing()) {
    ClientLog("export table %s: the program called slot %d, whose meaning is unknown: returning "
              "%" PRIu64 " (see docs/export-tables.md)",
              kInfo[T].name, S, kUnknownSlotResult[T]);
  }
  return kUnknownSlotResult[T];
}

template <int T, int S>
const void* Unknown() {
  return reinterpret_cast<const void*>(&UnknownSlot<T, S>);
}

const void* SizeWord(int t) { return reinterpret_cast<const void*>(kSlots[t] * sizeof(void*)); }

template <typename F>
const void* Fn(F* f) {
  return reinterpret_cast<const void*>(f);
}

// ---- CUDART_INTERFACE

// Process-lifetime state here is heap-allocated and never destroyed: a static cudart registers its
// exit-time teardown before it dlopens this library, so at exit our static destructors would run
// first and cudart would then call the CLS table (delete, get) on destroyed maps, freeing their
// nodes a second time ("free(): double free detected in tcache 2" on the H200).
pthread_mutex_t g_primary_mu = PTHREAD_MUTEX_INITIALIZER;
std::map<int, CUcontext>& g_primary = *new std::map<int, CUcontext>();  // device -> primary
                                                                         // context, retained once

CUresult GetModuleFromCubin(CUmodule* module, const void* fatbin_wrapper) {
  CUresult r = module == nullptr || fatbin_wrapper == nullptr
                   ? CUDA_ERROR_INVALID_VALUE
                   : Impl_cuModuleLoadData(module, fatbin_wrapper);
  TF_TRACE("export table CUDART_INTERFACE[1] get_module_from_cubin(wrapper=%p) -> %d, module=%p",
           fatbin_wrapper, r, r == CUDA_SUCCESS ? static_cast<void*>(*module) : nullptr);
  return r;
}

// The device's primary context without making it current. The driver hands out the handle
// without retaining it; the stub has no handle before a retain, so it retains once per device
// (the session releases it when the connection ends).
CUresult GetPrimaryContext(CUcontext* pctx, CUdevice dev) {
  CUresult r = CUDA_SUCCESS;
  if (pctx == nullptr) {
    r = CUDA_ERROR_INVALID_VALUE;
  } else {
    pthread_mutex_lock(&g_primary_mu);
    auto it = g_primary.find(dev);
    CUcontext ctx = it == g_primary.end() ? nullptr : it->second;
    pthread_mutex_unlock(&g_primary_mu);
    if (ctx == nullptr) {
      r = Impl_cuDevicePrimaryCtxRetain(&ctx, dev);
      if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&g_primary_mu);
        g_primary[dev] = ctx;
        pthread_mutex_unlock(&g_primary_mu);
      }
    }
    if (r == CUDA_SUCCESS) *pctx = ctx;
  }
  TF_TRACE("export table CUDART_INTERFACE[2] get_primary_context(dev=%d) -> %d, ctx=%p", dev, r,
           r == CUDA_SUCCESS ? static_cast<void*>(*pctx) : nullptr);
  return r;
}

CUresult GetModuleFromCubinExt1(CUmodule* module, const void* fatbin_wrapper, void* arg3,
                                void* arg4, uint32_t arg5) {
  CUresult r;
  if (module == nullptr || fatbin_wrapper == nullptr) r = CUDA_ERROR_INVALID_VALUE;
  else if (arg3 != nullptr || arg4 != nullptr || arg5 != 0) r = CUDA_ERROR_NOT_SUPPORTED;
  else r = Impl_cuModuleLoadData(module, fatbin_wrapper);
  if (r == CUDA_ERROR_NOT_SUPPORTED || Tracing()) {
    ClientLog("export table CUDART_INTERFACE[6] get_module_from_cubin_ext1(wrapper=%p, %p, %p, "
              "%u) -> %d%s",
              fatbin_wrapper, arg3, arg4, arg5, r,
              r == CUDA_ERROR_NOT_SUPPORTED ? " (extra arguments are not supported)" : "");
  }
  return r;
}

void CudartNoop7(size_t arg) { TF_TRACE("export table CUDART_INTERFACE[7] (%zu): no-op", arg); }

CUresult GetModuleFromCubinExt2(const void* fatbin_header, CUmodule* module, void* arg3,
                                void* arg4, uint32_t arg5) {
  CUresult r;
  if (module == nullptr || fatbin_header == nullptr) r = CUDA_ERROR_INVALID_VALUE;
  else if (arg3 != nullptr || arg4 != nullptr || arg5 != 0) r = CUDA_ERROR_NOT_SUPPORTED;
  else r = Impl_cuModuleLoadData(module, fatbin_header);
  if (r == CUDA_ERROR_NOT_SUPPORTED || Tracing()) {
    ClientLog("export table CUDART_INTERFACE[8] get_module_from_cubin_ext2(fatbin=%p, %p, %p, "
              "%u) -> %d%s",
              fatbin_header, arg3, arg4, arg5, r,
              r == CUDA_ERROR_NOT_SUPPORTED ? " (extra arguments are not supported)" : "");
  }
  return r;
}

// The driver loads its JIT compilers here (PTX compiler, NVVM, Tile IR); JIT runs on the worker.
CUresult LoadCompilers() {
  TF_TRACE("export table CUDART_INTERFACE[12] load_compilers() -> 0");
  return CUDA_SUCCESS;
}

// ---- TOOLS_RUNTIME_CALLBACK_HOOKS: two driver-owned scratch buffers, zeroed (no tool attached).
// Sized generously: callers are known to be handed 1024 and 14 (units not established).

alignas(64) uint32_t g_hook_buffer1[2048];
alignas(64) uint32_t g_hook_buffer2[64];

void GetHookBuffer1(void** ptr, size_t* size) {
  if (ptr) *ptr = g_hook_buffer1;
  if (size) *size = 1024;
  TF_TRACE("export table TOOLS_RUNTIME_CALLBACK_HOOKS[2] get_buffer -> %p, 1024",
           static_cast<void*>(g_hook_buffer1));
}

void GetHookBuffer2(void** ptr, size_t* size) {
  if (ptr) *ptr = g_hook_buffer2;
  if (size) *size = 14;
  TF_TRACE("export table TOOLS_RUNTIME_CALLBACK_HOOKS[6] get_buffer -> %p, 14",
           static_cast<void*>(g_hook_buffer2));
}

// ---- TOOLS_TLS (42d85a81…): [2](void** out) stores the calling thread's current context (the
// top of its context stack, NULL when none) and returns 0; before cuInit it returns
// CUDA_ERROR_NOT_INITIALIZED and stores nothing (measured on driver 580, docs/export-tables.md).
// XLA calls it around every kernel it launches.

CUresult ToolsCurrentContext(void** out) {
  ClientState& st = State();
  pthread_mutex_lock(&st.mu);
  const bool initialised = st.init_called || st.session != nullptr;
  pthread_mutex_unlock(&st.mu);
  CUresult r = CUDA_SUCCESS;
  if (!initialised) r = CUDA_ERROR_NOT_INITIALIZED;
  else if (out == nullptr) r = CUDA_ERROR_INVALID_VALUE;
  else *out = reinterpret_cast<void*>(CurrentContext());
  TF_TRACE("export table TOOLS_TLS[2] current_context(%p) -> %d, ctx=0x%" PRIx64,
           static_cast<void*>(out), r, r == CUDA_SUCCESS ? CurrentContext() : 0);
  return r;
}

// ---- CONTEXT_LOCAL_STORAGE_INTERFACE_V0301: (context, key) -> value, with a destructor run when
// the context is destroyed. Kept in this process, keyed by the stub's context handles.

using ClsDestructor = void (*)(CUcontext, void*, void*);
struct ClsEntry {
  void* value;
  ClsDestructor dtor;
};
pthread_mutex_t g_cls_mu = PTHREAD_MUTEX_INITIALIZER;
std::map<std::pair<uint64_t, uintptr_t>, ClsEntry>& g_cls =
    *new std::map<std::pair<uint64_t, uintptr_t>, ClsEntry>();  // never destroyed (see g_primary)

// The context a CLS call means: its own, or the thread's current one for NULL.
CUresult ClsContext(CUcontext ctx, uint64_t* out) {
  *out = ctx != nullptr ? reinterpret_cast<uint64_t>(ctx) : CurrentContext();
  return *out == 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

CUresult ClsPut(CUcontext ctx, void* key, void* value, ClsDestructor dtor) {
  uint64_t c = 0;
  CUresult r = ClsContext(ctx, &c);
  if (r == CUDA_SUCCESS) {
    Locked l;  // the context must be one the session knows
    if (l.session() == nullptr) r = l.result();
    else if (!l.session()->contexts.count(c)) r = CUDA_ERROR_INVALID_CONTEXT;
  }
  if (r == CUDA_SUCCESS) {
    pthread_mutex_lock(&g_cls_mu);
    g_cls[{c, reinterpret_cast<uintptr_t>(key)}] = ClsEntry{value, dtor};
    pthread_mutex_unlock(&g_cls_mu);
  }
  TF_TRACE("export table CONTEXT_LOCAL_STORAGE[0] put(ctx=%p -> 0x%" PRIx64
           ", key=%p, value=%p, dtor=%p) -> %d",
           static_cast<void*>(ctx), c, key, value, reinterpret_cast<void*>(dtor), r);
  return r;
}

CUresult ClsDelete(CUcontext ctx, void* key) {
  uint64_t c = 0;
  CUresult r = ClsContext(ctx, &c);
  if (r == CUDA_SUCCESS) {
    pthread_mutex_lock(&g_cls_mu);
    g_cls.erase({c, reinterpret_cast<uintptr_t>(key)});
    pthread_mutex_unlock(&g_cls_mu);
  }
  TF_TRACE("export table CONTEXT_LOCAL_STORAGE[1] delete(ctx=%p -> 0x%" PRIx64 ", key=%p) -> %d",
           static_cast<void*>(ctx), c, key, r);
  return r;
}

// A key never put (or deleted) is CUDA_ERROR_INVALID_HANDLE: cudart then builds its per-context
// state and puts it.
CUresult ClsGet(void** value, CUcontext ctx, void* key) {
  uint64_t c = 0;
  CUresult r = value == nullptr ? CUDA_ERROR_INVALID_VALUE : ClsContext(ctx, &c);
  if (r == CUDA_SUCCESS) {
    pthread_mutex_lock(&g_cls_mu);
    auto it = g_cls.find({c, reinterpret_cast<uintptr_t>(key)});
    if (it == g_cls.end()) r = CUDA_ERROR_INVALID_HANDLE;
    else *value = it->second.value;
    pthread_mutex_unlock(&g_cls_mu);
  }
  TF_TRACE("export table CONTEXT_LOCAL_STORAGE[2] get(ctx=%p -> 0x%" PRIx64 ", key=%p) -> %d, "
           "value=%p",
           static_cast<void*>(ctx), c, key, r, r == CUDA_SUCCESS ? *value : nullptr);
  return r;
}

// ---- INTEGRITY_CHECK

const void* g_tables[kTableCount][kMaxSlots];

CUresult IntegrityCheck(uint32_t version, uint64_t unix_seconds, uint64_t* result) {
  if (result == nullptr) return CUDA_ERROR_INVALID_VALUE;
  integrity::CheckInput in{};
  in.caller_version = version;
  in.unix_seconds = unix_seconds;
  in.pid = static_cast<uint32_t>(getpid());
  in.tid = static_cast<uint32_t>(pthread_self());
  in.cudart_table = reinterpret_cast<uint64_t>(&g_tables[kCudartInterface][0]);
  in.integrity_table = reinterpret_cast<uint64_t>(&g_tables[kIntegrityCheck][0]);
  in.check_function = reinterpret_cast<uint64_t>(g_tables[kIntegrityCheck][1]);
  std::vector<integrity::DeviceRecord> devices;
  CUresult r = CUDA_SUCCESS;
  if (version % 10 > 1) {  // the fixed answers need no device
    Locked l;
    if (l.session() == nullptr) {
      r = l.result();
    } else {
      in.driver_version = static_cast<uint32_t>(l.session()->driver_version);
      for (const DeviceInfo& d : l.session()->devices) {
        integrity::DeviceRecord rec{};
        memcpy(rec.uuid, d.uuid.bytes, 16);
        auto attr = [&d](CUdevice_attribute a) {
          size_t i = static_cast<size_t>(a);
          return i < d.attrs.size() ? d.attrs[i] : 0;
        };
        rec.pci_domain = attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
        rec.pci_bus = attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
        rec.pci_device = attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
        devices.push_back(rec);
      }
    }
  }
  if (r == CUDA_SUCCESS) integrity::Compute(in, devices.data(), devices.size(), result);
  TF_TRACE("export table INTEGRITY_CHECK[1] check(version=%u, time=%" PRIu64 ") -> %d, "
           "%016" PRIx64 "%016" PRIx64,
           version, unix_seconds, r, r == CUDA_SUCCESS ? result[0] : 0,
           r == CUDA_SUCCESS ? result[1] : 0);
  return r;
}

// ---- CONTEXT_CHECKS: flags the driver keeps per context that are never set on an ordinary one.

CUresult ContextCheck(CUcontext ctx, uint32_t* result1, const void** result2) {
  if (result1) *result1 = 0;
  TF_TRACE("export table CONTEXT_CHECKS[2] check(ctx=%p, %p, %p) -> 0", static_cast<void*>(ctx),
           static_cast<void*>(result1), static_cast<const void*>(result2));
  return CUDA_SUCCESS;
}

uint32_t ContextCheck3() {
  TF_TRACE("export table CONTEXT_CHECKS[3] () -> 0");
  return 0;
}

// ---- CONTEXT_QUERIES (21318c60…), measured on driver 580 (docs/export-tables.md):
// [4](context, u64* out) is the context's id as cuCtxGetId gives it (0 stored for a NULL context);
// cuBLAS asks before each GEMM. [51](context, stream, void** out, flag) resolves a stream handle to
// the driver's stream object (NULL means the legacy stream, or the per-thread one when flag is
// set); [39](context, object, u64* out) gives that stream's id as cuStreamGetId does. cuSOLVER
// calls [51] then [39] on each call. Our objects are client memory: 512 zeroed bytes per
// (context, stream) with the two fields the driver's object was seen to start with (u32 1 at 0,
// the context at 16) and the stream id where the driver keeps it (0x150), never freed, so a
// pointer a library kept stays readable.

CUresult ContextQuery4(CUcontext ctx, uint64_t* out) {
  CUresult r = CUDA_SUCCESS;
  uint64_t id = 0;
  if (out == nullptr) {
    r = CUDA_ERROR_UNKNOWN;  // what the driver returns for a NULL out
  } else {
    unsigned long long v = 0;
    // A context the session cannot name gets 0, which cuBLAS was measured to accept.
    if (ctx != nullptr && Impl_cuCtxGetId(ctx, &v) == CUDA_SUCCESS) id = v;
    *out = id;
  }
  TF_TRACE("export table CONTEXT_QUERIES[4] context_id(ctx=%p, out=%p) -> %d, %" PRIu64,
           static_cast<void*>(ctx), static_cast<void*>(out), r, id);
  return r;
}

constexpr size_t kStreamObjectBytes = 512;
constexpr size_t kStreamObjectIdOffset = 0x150;
struct alignas(64) StreamObject {
  unsigned char bytes[kStreamObjectBytes];
};
pthread_mutex_t g_stream_objects_mu = PTHREAD_MUTEX_INITIALIZER;
// (context, stream handle) -> its object; never destroyed (see g_primary).
std::map<std::pair<uint64_t, uint64_t>, StreamObject*>& g_stream_objects =
    *new std::map<std::pair<uint64_t, uint64_t>, StreamObject*>();

CUresult ContextQuery51(CUcontext ctx, CUstream stream, void** out, int per_thread) {
  const uint64_t c = ctx != nullptr ? reinterpret_cast<uint64_t>(ctx) : CurrentContext();
  uint64_t h = reinterpret_cast<uint64_t>(stream);
  if (h == 0) h = per_thread ? 2 : 1;  // CU_STREAM_PER_THREAD : CU_STREAM_LEGACY
  CUresult r = CUDA_SUCCESS;
  unsigned long long id = 0;
  StreamObject* obj = nullptr;
  if (out == nullptr) {
    r = CUDA_ERROR_INVALID_VALUE;
  } else if (h == ~0ull) {
    r = CUDA_ERROR_INVALID_HANDLE;
  } else if (c == 0) {
    r = CUDA_ERROR_INVALID_CONTEXT;
  } else {
    // The legacy and per-thread streams are the context's: ask in that context.
    const uint64_t saved = CurrentContext();
    SetCurrentContext(c);
    r = Impl_cuStreamGetId(reinterpret_cast<CUstream>(h), &id);
    SetCurrentContext(saved);
  }
  if (r == CUDA_SUCCESS) {
    pthread_mutex_lock(&g_stream_objects_mu);
    StreamObject*& slot = g_stream_objects[{c, h}];
    if (slot == nullptr) {
      slot = new StreamObject();
      const uint32_t one = 1;
      memcpy(slot->bytes, &one, sizeof(one));
      memcpy(slot->bytes + 16, &c, sizeof(c));
    }
    const uint64_t v = id;  // refreshed: a destroyed stream's handle may come back
    memcpy(slot->bytes + kStreamObjectIdOffset, &v, sizeof(v));
    obj = slot;
    pthread_mutex_unlock(&g_stream_objects_mu);
    *out = obj;
  }
  TF_TRACE("export table CONTEXT_QUERIES[51] stream_object(ctx=%p, stream=%p, per_thread=%d) -> %d, "
           "%p (stream id %llu)",
           static_cast<void*>(ctx), static_cast<void*>(stream), per_thread, r,
           static_cast<void*>(obj), id);
  return r;
}

CUresult ContextQuery39(CUcontext ctx, const void* object, uint64_t* out) {
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  uint64_t id = 0;
  if (out != nullptr && object != nullptr) {
    pthread_mutex_lock(&g_stream_objects_mu);
    for (const auto& [key, obj] : g_stream_objects) {
      if (obj == object) {
        memcpy(&id, obj->bytes + kStreamObjectIdOffset, sizeof(id));
        r = CUDA_SUCCESS;
        break;
      }
    }
    pthread_mutex_unlock(&g_stream_objects_mu);
    if (r == CUDA_SUCCESS) *out = id;
  }
  TF_TRACE("export table CONTEXT_QUERIES[39] stream_id(ctx=%p, object=%p) -> %d, %" PRIu64,
           static_cast<void*>(ctx), object, r, id);
  return r;
}

// ---- TOOLS_MODULES (6e163fbe…): cuFFT, and PyTorch's and JAX's FFTs, call only [7] at plan
// creation, right after loading a module: [7](context, module, callback, user, …). Measured on the
// real driver (docs/export-tables.md): it called the callback, a host function that stores its
// second argument through its first, so that `user` received a CUfunction of the module, which
// cuFFT then queried and launched; it returned 1 (its modules held one kernel each). Refusing the
// whole table makes cuFFT fail with CUFFT_INTERNAL_ERROR. So [7] visits the module's functions,
// calling callback(user, function) for each (outside the stub's lock: the callback is the
// program's), and returns how many it visited; a module the session does not know is
// CUDA_ERROR_INVALID_HANDLE without a call.

using ModuleFunctionVisitor = void (*)(void* user, CUfunction function);

uint64_t ToolsModules7(void* ctx, void* module, void* callback, void* user) {
  unsigned count = 0;
  CUresult r = Impl_cuModuleGetFunctionCount(&count, static_cast<CUmodule>(module));
  std::vector<CUfunction> functions(count ? count : 1);
  if (r == CUDA_SUCCESS && count > 0) {
    r = Impl_cuModuleEnumerateFunctions(functions.data(), count, static_cast<CUmodule>(module));
  }
  TF_TRACE("export table TOOLS_MODULES[7] (ctx=%p, module=%p, callback=%p, user=%p) -> %u functions, %d",
           ctx, module, callback, user, count, static_cast<int>(r));
  if (r != CUDA_SUCCESS) return r;
  if (callback != nullptr) {
    for (unsigned i = 0; i < count; ++i) reinterpret_cast<ModuleFunctionVisitor>(callback)(user, functions[i]);
  }
  return count;
}

// ---- LIBRARY_OBJECTS (1734dc26…): cuBLASLt asks [4](void** a, void** b, …) for two driver
// objects and hands them back to [13](a, b) at once. Refusing [4] was measured to leave cuBLASLt
// working on the real driver (a NULL table crashes it), so [4] refuses and [13] has nothing to free.

CUresult LibraryObjectsCreate(void** a, void** b) {
  TF_TRACE("export table LIBRARY_OBJECTS[4] (%p, %p) -> %d (not emulated)", static_cast<void*>(a),
           static_cast<void*>(b), static_cast<int>(CUDA_ERROR_NOT_SUPPORTED));
  return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult LibraryObjectsDestroy(void* a, void* b) {
  TF_TRACE("export table LIBRARY_OBJECTS[13] (%p, %p) -> 0", a, b);
  return CUDA_SUCCESS;
}

// ---- the tables themselves

template <int T, size_t... S>
void FillUnknown(std::index_sequence<S...>) {
  ((g_tables[T][S] = Unknown<T, static_cast<int>(S)>()), ...);
}

void AtForkChild() {
  // The child's connection is new and its contexts are not the parent's: forget both (without
  // running destructors: the contexts were the parent's).
  pthread_mutex_init(&g_cls_mu, nullptr);
  pthread_mutex_init(&g_primary_mu, nullptr);
  pthread_mutex_init(&g_stream_objects_mu, nullptr);
  g_cls.clear();
  g_primary.clear();
  g_stream_objects.clear();  // leaked: the parent's library may still hold pointers to them
}

struct Setup {
  Setup() {
    FillUnknown<kCudartInterface>(std::make_index_sequence<kSlots[kCudartInterface]>());
    FillUnknown<kToolsTls>(std::make_index_sequence<kSlots[kToolsTls]>());
    FillUnknown<kToolsRuntimeCallbackHooks>(
        std::make_index_sequence<kSlots[kToolsRuntimeCallbackHooks]>());
    FillUnknown<kContextLocalStorage>(std::make_index_sequence<kSlots[kContextLocalStorage]>());
    FillUnknown<kIntegrityCheck>(std::make_index_sequence<kSlots[kIntegrityCheck]>());
    FillUnknown<kContextChecks>(std::make_index_sequence<kSlots[kContextChecks]>());
    FillUnknown<kContextQueries>(std::make_index_sequence<kSlots[kContextQueries]>());
    FillUnknown<kLibraryObjects>(std::make_index_sequence<kSlots[kLibraryObjects]>());
    FillUnknown<kToolsModules>(std::make_index_sequence<kSlots[kToolsModules]>());
    for (int t = 0; t < kTableCount; ++t) {
      if (kInfo[t].has_size_word) g_tables[t][0] = SizeWord(t);
    }
    const void** c = g_tables[kCudartInterface];
    c[1] = Fn(&GetModuleFromCubin);
    c[2] = Fn(&GetPrimaryContext);
    c[6] = Fn(&GetModuleFromCubinExt1);
    c[7] = Fn(&CudartNoop7);
    c[8] = Fn(&GetModuleFromCubinExt2);
    c[12] = Fn(&LoadCompilers);
    const void** h = g_tables[kToolsRuntimeCallbackHooks];
    h[2] = Fn(&GetHookBuffer1);
    h[6] = Fn(&GetHookBuffer2);
    const void** s = g_tables[kContextLocalStorage];
    s[0] = Fn(&ClsPut);
    s[1] = Fn(&ClsDelete);
    s[2] = Fn(&ClsGet);
    g_tables[kIntegrityCheck][1] = Fn(&IntegrityCheck);
    g_tables[kContextChecks][2] = Fn(&ContextCheck);
    g_tables[kContextChecks][3] = Fn(&ContextCheck3);
    g_tables[kToolsTls][2] = Fn(&ToolsCurrentContext);
    g_tables[kContextQueries][4] = Fn(&ContextQuery4);
    g_tables[kContextQueries][39] = Fn(&ContextQuery39);
    g_tables[kContextQueries][51] = Fn(&ContextQuery51);
    g_tables[kToolsModules][7] = Fn(&ToolsModules7);
    g_tables[kLibraryObjects][4] = Fn(&LibraryObjectsCreate);
    g_tables[kLibraryObjects][13] = Fn(&LibraryObjectsDestroy);
    pthread_atfork(nullptr, nullptr, &AtForkChild);
  }
};

// Built on first use: another library's constructor may ask before ours ran.
void EnsureTables() { static Setup setup; }

}  // namespace

CUresult GetExportTable(const void** table, const CUuuid* id) {
  char text[33] = "(null)";
  if (id != nullptr) UuidText(*id, text);
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  const char* name = "unknown";
  EnsureTables();
  if (table != nullptr && id != nullptr) {
    *table = nullptr;
    for (int t = 0; t < kTableCount; ++t) {
      if (SameUuid(*id, kInfo[t].id)) {
        *table = g_tables[t];
        name = kInfo[t].name;
        r = CUDA_SUCCESS;
        break;
      }
    }
  }
  TF_TRACE("cuGetExportTable(%s) %s -> %d, table=%p", text, name, r,
           table != nullptr ? *table : nullptr);
  return r;
}

void ReleaseContextStorage(uint64_t ctx) {
  std::vector<std::pair<uintptr_t, ClsEntry>> run;
  pthread_mutex_lock(&g_cls_mu);
  for (auto it = g_cls.lower_bound({ctx, 0}); it != g_cls.end() && it->first.first == ctx;) {
    run.emplace_back(it->first.second, it->second);
    it = g_cls.erase(it);
  }
  pthread_mutex_unlock(&g_cls_mu);
  for (const auto& [key, e] : run) {
    TF_TRACE("context 0x%" PRIx64 " destroyed: CONTEXT_LOCAL_STORAGE destructor %p(key=%p, "
             "value=%p)",
             ctx, reinterpret_cast<void*>(e.dtor), reinterpret_cast<void*>(key), e.value);
    if (e.dtor != nullptr) e.dtor(reinterpret_cast<CUcontext>(ctx), reinterpret_cast<void*>(key), e.value);
  }
  pthread_mutex_lock(&g_primary_mu);
  for (auto it = g_primary.begin(); it != g_primary.end();) {
    if (reinterpret_cast<uint64_t>(it->second) == ctx) it = g_primary.erase(it);
    else ++it;
  }
  pthread_mutex_unlock(&g_primary_mu);
}

CUresult Impl_cuGetExportTable(const void** table, const CUuuid* id) { return GetExportTable(table, id); }

size_t KnownExportTables(const ExportTableInfo** out) {
  *out = kInfo;
  return kTableCount;
}

}  // namespace tf::client
