// Internal state of the fake CUDA driver (libcuda.so.1 built from tests/fakecuda). Not a public
// header: tests talk to the fake only through the exported C ABI (cuda.h plus fakecuda_api.h).
//
// Locking: Driver::mu guards every table in Driver. It is never held while waiting for a stream
// (stream work items may take it themselves). Objects reachable from work items (streams, events,
// kernels) are shared_ptr-owned so that a concurrent destroy cannot free them under a worker.
#ifndef TF_TESTS_FAKECUDA_FAKE_DRIVER_H_
#define TF_TESTS_FAKECUDA_FAKE_DRIVER_H_

// Everything cuda.h declares is defined with default visibility; the version script decides what
// the library exports.
#pragma GCC visibility push(default)
#include <cuda.h>

#include "fakecuda_api.h"
#pragma GCC visibility pop

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "fake_device_identity.h"
#include "stream_worker.h"

#define FAKECUDA_EXPORT extern "C" __attribute__((visibility("default")))

namespace fakecuda {

inline constexpr size_t kGranularity = 2u << 20;  // VMM and array granularity, bytes
inline constexpr size_t kPitchAlignment = 512;     // bytes

inline size_t RoundUp(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

struct Context;
struct PhysicalMemory;

struct Graph;
struct GraphNode;

// Ids of streams and contexts (cuStreamGetId, cuCtxGetId): unique in the process, never reused.
inline std::atomic<uint64_t> g_next_stream_id{16};
inline std::atomic<uint64_t> g_next_context_id{1};

struct Stream {
  uint64_t id = g_next_stream_id.fetch_add(1);
  Context* ctx = nullptr;
  unsigned flags = 0;
  int priority = 0;
  StreamWorker worker;
  Graph* capture = nullptr;  // stream capture: kernel launches become nodes of this graph
  uint64_t capture_id = 0;
  bool capture_global = false;       // begun in CU_STREAM_CAPTURE_MODE_GLOBAL
  bool capture_invalidated = false;  // an unsafe call ran during it (EndCapture then fails)
  bool capture_to_existing = false;  // cuStreamBeginCaptureToGraph: the graph is the caller's
  std::vector<GraphNode*> capture_deps;  // what the next captured node depends on
  // cuStreamSetAttribute's values but the priority's (fake_stream_attributes.cc); guarded by
  // Driver::mu.
  std::map<int, CUlaunchAttributeValue> attributes;
};

// The counters of an interprocess event (CU_EVENT_INTERPROCESS) live in a shared page (a memfd
// named in its IPC handle), so that every process that opened the handle records and waits on the
// same ones (fake_ipc.cc).
struct IpcEventWords {
  std::atomic<uint64_t> recorded{0};
  std::atomic<uint64_t> completed{0};
};

// Records and waits go through the methods: they use the shared page of an interprocess event and
// the members guarded by mu otherwise.
struct Event {
  unsigned flags = 0;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // records issued (guarded by mu)
  uint64_t completed = 0;  // records whose stream position was reached (guarded by mu)
  std::chrono::steady_clock::time_point when;  // time of the last completed record
  IpcEventWords* shared = nullptr;  // interprocess events: the counters (unmapped with the event)
  int shared_fd = -1;               // the memfd behind `shared` in the creating process, else -1
  unsigned char ipc_handle[CU_IPC_HANDLE_SIZE] = {};  // what cuIpcGetEventHandle returns

  Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();
  // A record was issued: its generation (the value Complete and WaitFor take).
  uint64_t BeginRecord();
  // The stream reached the record of `generation`.
  void Complete(uint64_t generation);
  // The generation of the most recent record (0: never recorded).
  uint64_t Recorded();
  bool Reached(uint64_t generation);
  // Blocks until the record of `generation` completed (interprocess events: polls the page).
  void WaitFor(uint64_t generation);
};

struct Context {
  uint64_t id = g_next_context_id.fetch_add(1);
  CUdevice device = 0;
  unsigned flags = 0;
  bool primary = false;
  std::shared_ptr<Stream> null_stream;
  std::set<Stream*> streams;  // streams created in this context, besides null_stream
  void* green = nullptr;      // the green context (fake_green.cc) this is the context of
};

// A host function standing in for a device kernel. Parameter layout is known when registered
// through fakecuda_register_kernel_ex; then launch arguments are copied at launch time as CUDA does.
struct Kernel {
  std::string module;
  std::string name;
  FakecudaKernelFn fn = nullptr;
  void* user = nullptr;
  bool layout_known = false;
  std::vector<size_t> offsets;  // bytes into the argument buffer
  std::vector<size_t> sizes;    // bytes
  size_t buffer_bytes = 0;
};

// Arguments captured for one launch. With a known layout they are a private copy.
struct LaunchArgs {
  std::shared_ptr<Kernel> kernel;
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  std::vector<unsigned char> buffer;
  std::vector<void*> params;
  void** raw_params = nullptr;  // used when the layout is unknown
  void Run() const;
};

// kHostRegistered: a range of the caller's memory registered with cuMemHostRegister (not owned).
// kIpcOpened: another process's allocation mapped by cuIpcOpenMemHandle (not charged; closed with
// cuIpcCloseMemHandle, never freed).
enum class MemoryKind { kDevice, kManaged, kHost, kGraph, kVmmMapping, kHostRegistered, kIpcOpened };
inline bool IsHostKind(MemoryKind k) { return k == MemoryKind::kHost || k == MemoryKind::kHostRegistered; }

struct MemPool {
  CUdevice device = 0;
  std::map<int, uint64_t> attributes;  // stored as given
  uint64_t used_bytes = 0;
  std::map<int, CUmemAccess_flags> access;  // cuMemPoolSetAccess: device -> flags (not the owner)
};

struct Allocation {
  uintptr_t base = 0;
  size_t size = 0;         // bytes requested
  size_t mapped = 0;       // bytes of host mapping owned by this record (0: not owned)
  size_t counted = 0;      // bytes charged against the device (0 for host and VMM mappings)
  MemoryKind kind = MemoryKind::kDevice;
  CUdevice device = 0;
  Context* ctx = nullptr;
  MemPool* pool = nullptr;                // stream-ordered allocations
  PhysicalMemory* physical = nullptr;     // kVmmMapping: the mapped handle
  size_t vmm_offset = 0;                  // kVmmMapping: where in the handle the mapping starts
  unsigned vmm_access = 0;                // kVmmMapping: the flags cuMemSetAccess gave it
  bool sync_memops = false;               // cuPointerSetAttribute(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS)
  unsigned graph_reallocs = 0;            // kGraph: later alloc nodes of the launch at this address
  unsigned host_flags = 0;                // kHost, kHostRegistered: cuMemHostAlloc/Register flags
  // IPC (fake_ipc.cc). An exported kDevice allocation is backed by a memfd from its first
  // cuIpcGetMemHandle on (ipc_fd, closed when it is freed); an opened one is counted per open.
  int ipc_fd = -1;
  uint64_t ipc_serial = 0;   // exported: the number in its memfd's name; opened: the exporter's
  uint32_t ipc_pid = 0;      // kIpcOpened: the exporting process
  int ipc_opens = 0;         // kIpcOpened: opens not yet closed
};

struct PhysicalMemory {
  CUdevice device = 0;
  size_t size = 0;
  int fd = -1;
  uint64_t serial = 0;  // in its memfd's name, "fakecuda-vmm-PID-SERIAL"
  int mappings = 0;
  bool released = false;
  int retains = 0;                          // cuMemRetainAllocationHandle, each released once more
  CUmemAllocationHandleType handle_types{};  // requested at creation: what it may be exported as
  bool imported = false;                    // from a shareable handle: charged to its exporter
  CUmemAllocationProp prop{};      // as cuMemCreate was given it
  // A multicast object (fake_multicast.cc): not charged to a device; the devices of its team
  // added so far, and the ranges bound to it ((device of the memory, object offset) -> bytes).
  bool multicast = false;
  unsigned team = 0;
  std::set<int> team_added;
  std::map<std::pair<int, size_t>, size_t> bound;
};

// An array, a mipmapped array, or a level of one (a view into its owner's memory). Elements lie
// row-major without padding: rows of Width elements, Height rows (1 when 0) per slice.
struct FakeArray {
  CUdevice device = 0;
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  unsigned levels = 1;
  size_t bytes = 0;  // counted against the device (0 for a level view)
  void* mem = nullptr;
  bool mipmapped = false;              // a CUmipmappedArray
  FakeArray* owner = nullptr;          // a level view: the mipmapped array it belongs to
  std::vector<FakeArray*> level_views;  // mipmapped: views made so far, by level (in arrays)
};

// A texture or surface object: what it was created from.
struct TexObject {
  CUDA_RESOURCE_DESC res{};
  CUDA_TEXTURE_DESC tex{};
  bool has_view = false;
  CUDA_RESOURCE_VIEW_DESC view{};
  bool surface = false;
};

struct Module {
  std::string name;
  bool library = false;  // cuLibraryLoadData: context-independent (a context reset keeps it)
};

enum class GraphNodeKind {
  kKernel, kMemAlloc, kMemFree, kMemcpy, kMemset, kHost, kEmpty, kEventRecord, kEventWait, kChildGraph,
  kConditional
};
struct GraphExec;

// User objects (cuUserObjectCreate, fake_graph_nodes.cc): graphs and executable graphs hold
// references; the destroy callback runs when the last one goes.
struct UserObject;
using UserRefs = std::map<UserObject*, unsigned>;
void RetainUserRefs(const UserRefs& refs);
void ReleaseUserRefs(const UserRefs& refs);

struct GraphNode {
  GraphNodeKind kind = GraphNodeKind::kKernel;
  std::shared_ptr<LaunchArgs> launch;  // kKernel
  CUfunction func = nullptr;           // kKernel: as given (cuGraphKernelNodeGetParams)
  uintptr_t dptr = 0;                  // kMemAlloc, kMemFree
  size_t bytes = 0;                    // kMemAlloc
  CUdevice device = 0;                 // kMemAlloc
  std::shared_ptr<void> region;        // kMemAlloc: the host range behind dptr (unmapped last)
  CUDA_MEMCPY3D copy{};                // kMemcpy
  CUDA_MEMSET_NODE_PARAMS memset{};    // kMemset
  CUDA_HOST_NODE_PARAMS host{};        // kHost
  CUevent event = nullptr;             // kEventRecord, kEventWait
  std::shared_ptr<Graph> child;        // kChildGraph: the node's own clone of the graph
  CUDA_CONDITIONAL_NODE_PARAMS cond{};  // kConditional (phGraph_out points to bodies)
  std::shared_ptr<std::vector<CUgraph>> bodies;             // kConditional: live graphs of the driver
  std::vector<std::shared_ptr<GraphExec>> body_execs;      // kConditional, instantiated
  std::vector<GraphNode*> deps;        // nodes of the same graph this one depends on
  bool enabled = true;                 // in an executable graph (cuGraphNodeSetEnabled)
  std::map<int, CUlaunchAttributeValue> attrs;  // kKernel: cuGraphKernelNodeSetAttribute
  std::vector<CUmemAccessDesc> access;          // kMemAlloc: as given
};

struct Graph {
  std::vector<std::unique_ptr<GraphNode>> nodes;  // insertion order breaks dependency ties
  std::map<const GraphNode*, GraphNode*> cloned_from;  // a clone: original node -> its copy
  UserRefs user_refs;                                  // released when the graph goes
  ~Graph() { ReleaseUserRefs(user_refs); }
};

// An instantiated graph: the nodes in dependency order, child graphs flattened into it.
struct GraphExec {
  std::vector<GraphNode> nodes;
  std::vector<const GraphNode*> origins;  // the graph node each entry was instantiated from
  std::vector<const GraphNode*> tops;     // the top-level node it belongs to (itself or a child graph node)
  unsigned long long flags = 0;           // as instantiated (cuGraphExecGetFlags)
  UserRefs user_refs;                     // the graph's, taken at instantiation
  ~GraphExec() { ReleaseUserRefs(user_refs); }
};

struct DeviceState {
  uint64_t used_bytes = 0;
  std::unique_ptr<Context> primary;
  unsigned primary_flags = 0;
  int primary_refs = 0;
  std::unique_ptr<MemPool> default_pool;
  MemPool* current_pool = nullptr;
  // Graph memory: what graphs freed stays charged to the device, reserved for their next launches
  // (which take it before charging more), until cuDeviceGraphMemTrim gives it back, as the
  // driver's graph memory pool does. The high watermarks: since the last reset (bytes).
  uint64_t graph_idle = 0;
  uint64_t graph_used_high = 0;
  uint64_t graph_reserved_high = 0;
};

class Driver {
 public:
  static Driver& Get();

  std::mutex mu;
  std::atomic<bool> initialized{false};
  FakeTopology topology;                    // fixed at cuInit; device_count: visible ones
  std::vector<int> ordinal_to_physical;     // device ordinal -> physical device (CUDA_VISIBLE_DEVICES)
  std::vector<DeviceState> devices;         // guarded by mu
  std::set<Context*> contexts;              // live contexts (primary ones included)
  std::vector<std::unique_ptr<Context>> owned_contexts;  // from cuCtxCreate
  std::map<Stream*, std::shared_ptr<Stream>> streams;
  std::map<Event*, std::shared_ptr<Event>> events;
  std::map<uintptr_t, Allocation> allocations;
  std::map<MemPool*, std::unique_ptr<MemPool>> pools;
  std::map<PhysicalMemory*, std::unique_ptr<PhysicalMemory>> physical;
  std::map<uintptr_t, size_t> reservations;  // VMM address reservations: base -> bytes
  std::map<FakeArray*, std::unique_ptr<FakeArray>> arrays;
  std::map<unsigned long long, TexObject> objects;  // texture and surface objects by handle
  unsigned long long next_object = 1;
  std::map<Module*, std::unique_ptr<Module>> modules;
  std::map<Graph*, std::unique_ptr<Graph>> graphs;
  std::map<GraphExec*, std::unique_ptr<GraphExec>> graph_execs;
  std::map<int, size_t> limits;  // cuCtxSetLimit values (CUlimit -> value)
  int cache_config = 0;          // cuCtxSetCacheConfig (CUfunc_cache), shared by the contexts
  // cuIpcOpenMemHandle: (exporting pid, serial) -> the base of the kIpcOpened allocation.
  std::map<std::pair<uint32_t, uint64_t>, uintptr_t> ipc_opened;

  // REQUIRES mu. Charges `bytes` to `device`; false (nothing charged) when it would exceed total.
  bool Charge(CUdevice device, size_t bytes);
  // REQUIRES mu.
  void Uncharge(CUdevice device, size_t bytes);
  // REQUIRES mu. The allocation containing `ptr`, or nullptr.
  Allocation* FindAllocation(uintptr_t ptr);
  // REQUIRES mu. The current thread's context if it is alive, else nullptr.
  Context* CurrentContextLocked();
};

// Current context of the calling thread (validated), or an error through `err`.
Context* CurrentContext(CUresult* err);

// The stream behind a handle (NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD mean the current
// context's null stream), or nullptr and an error.
std::shared_ptr<Stream> ResolveStream(CUstream handle, CUresult* err);

// Conditional graph nodes: the builtin kernel set_conditional(handle, value) sets a handle's
// value (cudaGraphSetConditional on the device). Unknown handles are ignored.
void SetConditional(uint64_t handle, unsigned value);

// For calls that are unsafe during a global stream capture (cuMemAlloc): when a global capture is
// under way and the calling thread's capture mode is not relaxed, invalidates those captures and
// returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, as the driver does; else CUDA_SUCCESS.
CUresult CheckUnsafeDuringCapture();

// Blocks until all blocking streams of `ctx` are idle (what the legacy default stream's
// synchronous calls wait for). Takes mu briefly.
void SynchronizeContextStreams(Context* ctx, bool blocking_only);

// Returns the injected error for this call of `function` if one is armed (see
// fakecuda_fail_nth), else CUDA_SUCCESS.
// Blocks the caller first while another process holds this one locked for a checkpoint.
CUresult InjectedFault(const char* function);
void ArmFaultsFromEnv();
// FAKECUDA_CALL_LOG: at exit, one line per process that initialised with how often it called
// cuStreamQuery (tests assert what the limiter's governor asked the driver).
extern std::atomic<long> g_stream_queries;
void LogCallsAtExit();
// fake_checkpoint.cc: at cuInit, this process's slot in the shared checkpoint table and its
// restore thread; at every entry, blocks (and counts the call) while the process is locked.
void CheckpointRegister();
void CheckpointGate();

// Interprocess events (fake_ipc.cc): gives `event` its shared page (cuEventCreate with
// CU_EVENT_INTERPROCESS). CUDA_ERROR_OUT_OF_MEMORY when no memfd can be made.
CUresult MakeEventShareable(Event* event);

// Maps host-backed "device" memory: page aligned, zero-filled, lazily committed.
void* MapHostMemory(size_t bytes);
void UnmapHostMemory(void* ptr, size_t bytes);

// REQUIRES not holding mu. Looks up a kernel by CUfunction / CUkernel handle.
std::shared_ptr<Kernel> FindKernel(const void* handle);
// Builds the captured arguments for a launch; CUDA_ERROR_INVALID_VALUE on a bad configuration.
CUresult BuildLaunch(CUfunction f, const unsigned grid[3], const unsigned block[3],
                     void** kernel_params, void** extra, LaunchArgs* out);

// Device printf and JIT (fake_jit.cc). The built-in kernel printf_lines appends to a FIFO that
// the synchronizing calls write to stdout (FlushDevicePrintf), as the driver prints kernel printf
// output at synchronizing points.
void AppendDevicePrintf(const std::string& text);
void FlushDevicePrintf();
// Built-in kernels (module "builtin" unless noted): printf_lines(unsigned lines, unsigned tag);
// checksum_params(CUdeviceptr out, a kChecksumParamBytes-byte struct by value) writes the FNV-1a
// hash of the struct's bytes as a u64; add_u32(CUdeviceptr, unsigned, size_t) in module
// "linkpart" adds the value to each element.
inline constexpr size_t kChecksumParamBytes = 32000;
void PrintfLines(void**, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*);
void ChecksumParams(void**, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*);
void AddU32(void**, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*);
// notify_over_budget(unsigned long long bytes): an over-budget notification to every registered
// asynchronous-notification callback (fake_notifications.cc).
void NotifyOverBudget(unsigned long long bytes);
// Writes cuModuleLoadDataEx's log messages into the caller's JIT log buffers.
void JitLoadLog(unsigned n, CUjit_option* options, void** values, const void* image, bool ok);

}  // namespace fakecuda

// Entry checks every exported function starts with: an injected fault first, then cuInit.
#define FAKECUDA_ENTER()                                                      \
  do {                                                                        \
    if (CUresult fault_ = ::fakecuda::InjectedFault(__func__); fault_ != CUDA_SUCCESS) \
      return fault_;                                                          \
    if (!::fakecuda::Driver::Get().initialized.load(std::memory_order_acquire)) \
      return CUDA_ERROR_NOT_INITIALIZED;                                      \
  } while (0)

#define FAKECUDA_REQUIRE_CONTEXT(ctx_var)                                     \
  CUresult ctx_err_ = CUDA_SUCCESS;                                           \
  ::fakecuda::Context* ctx_var = ::fakecuda::CurrentContext(&ctx_err_);       \
  if (ctx_var == nullptr) return ctx_err_

namespace fakecuda {

// Runs `op` ordered after the work already queued on the legacy default stream (and the other
// blocking streams) of the current context, as the driver's synchronous copies are.
template <typename Op>
CUresult RunSynchronous(Op op) {
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  SynchronizeContextStreams(ctx, /*blocking_only=*/true);
  op();
  return CUDA_SUCCESS;
}

// Queues `op` on a stream (NULL and the special handles: the context's null stream).
template <typename Op>
CUresult RunAsync(CUstream handle, Op op) {
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<Stream> stream = ResolveStream(handle, &err);
  if (stream == nullptr) return err;
  stream->worker.Enqueue(op);
  return CUDA_SUCCESS;
}

}  // namespace fakecuda

#endif  // TF_TESTS_FAKECUDA_FAKE_DRIVER_H_
