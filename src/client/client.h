// Internal interface of the remote client stub (libtfusion-client.so): the one connection of this
// process to its worker session, and the call helpers the Impl_ functions use.
//
// Threading: one process-wide mutex serialises every exchange with the worker (an async call is a
// queue push on TCP, a ring write on shared memory; a synchronous call holds it until its reply).
// The current context is per thread, as in CUDA; before a call that depends on it the stub tells
// the session which context to use (an asynchronous cuCtxSetCurrent) when it changed.
//
// Failure: when the transport breaks (worker died, network gone) every later call returns
// kLostConnectionError, logged once. Errors never escape as exceptions (built -fno-exceptions).
#pragma once

#include <cuda.h>
#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <tuple>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "client/remote_protocol.h"
#include "transport/transport.h"

namespace tf::client {

inline constexpr CUresult kLostConnectionError = CUDA_ERROR_LAUNCH_FAILED;

void ClientLog(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

struct DeviceInfo {
  char name[remote::kMaxDeviceName + 1] = {};
  CUuuid uuid = {};
  uint64_t total_mem = 0;
  std::vector<int> attrs;
};

struct FunctionInfo {
  std::string name;      // as looked up (cuModuleGetFunction, cuLibraryGetKernel): cuFuncGetName
  uint64_t module = 0;
  uint64_t library = 0;  // functions and kernels of a library (client_library.cc)
  bool layout_known = false;
  std::vector<uint64_t> offsets, sizes;
  std::vector<int> attrs;  // CUfunction_attribute values, fetched with the handle
};

// A device allocation the client made (cuMemAlloc, cuMemAllocAsync, pools): answers pointer
// attributes locally and tells device from host pointers under unified addressing.
struct DeviceAlloc {
  uint64_t size = 0;
  uint64_t ctx = 0;
  int device = 0;
  uint64_t pool = 0;     // stream-ordered allocations
  uint64_t buffer_id = 0;
  bool sync_memops = false;  // cuPointerSetAttribute(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS)
};

// What the client caches about a context (fetched with its handle).
struct ContextInfo {
  int device = 0;
  unsigned flags = 0;
  unsigned api_version = 0;
  int least_priority = 0, greatest_priority = 0;
  bool primary = false;
};

// Everything that belongs to one connection. Dropped (and leaked, never closed) in a forked child.
struct Session {
  std::unique_ptr<transport::Transport> transport;
  std::atomic<uint64_t> next_seq{1};  // atomic: host-function acks are sent without mu
  CUresult sticky = CUDA_SUCCESS;   // a sticky CUDA error or the lost connection
  uint64_t worker_ctx = ~0ull;      // the context the session was last told to use; ~0 unknown
  int driver_version = 0;
  bool limits_refused = false;      // the worker refused the vGPU limits asked for (said so already)
  std::vector<DeviceInfo> devices;
  std::unordered_set<uint64_t> images_sent;  // by hash_lo ^ rotated hash_hi
  std::unordered_map<uint64_t, FunctionInfo> functions;
  // Names of functions the client only saw in graph nodes, asked of the worker once (cuFuncGetName).
  std::unordered_map<uint64_t, std::string> other_function_names;
  std::unordered_map<uint64_t, int> contexts;  // context -> device
  std::unordered_map<uint64_t, ContextInfo> context_info;
  std::map<uint64_t, DeviceAlloc> allocs;      // base -> allocation
  std::unordered_set<uint64_t> streams;        // streams created through this session
  // Libraries and kernels (client_library.cc): kernel -> its library and name.
  struct KernelInfo {
    uint64_t library = 0;
    std::string name;
  };
  std::unordered_set<uint64_t> libraries;
  std::unordered_map<uint64_t, KernelInfo> kernels;
  // Streams capturing (client_capture.cc): stream -> mode, capture id.
  struct Capture {
    unsigned mode = 0;
    uint64_t id = 0;
  };
  std::unordered_map<uint64_t, Capture> capturing;
  uint64_t next_capture_id = 1;
  uint64_t next_buffer_id = 1;
  // Host regions (client_host.cc): the worker accepts them and the transport can share memory.
  bool host_regions = false;
  bool managed_regions = false;  // managed memory is marked so in region maps (kRegionManaged)
  uint64_t next_region_id = 1;
  // Mirrored memory (client_mirror.cc): the worker accepts it (used where regions cannot serve).
  // mirror_count > 0: every call the stub sends first pushes what changed in the mirrors.
  bool mirrors = false;
  std::atomic<int> mirror_count{0};
  // Pageable copies travel in kPipelinedCopySlice slices (the transport has zero-copy bulk).
  bool pipelined_copies = false;
  // Arrays, mipmapped arrays, texture and surface objects (client_arrays.cc), with what their
  // descriptor queries answer.
  struct ArrayInfo {
    CUDA_ARRAY3D_DESCRIPTOR desc = {};
    uint64_t mipmap = 0;  // a level of this mipmapped array (destroyed with it)
    uint64_t plane_of = 0;  // a plane of this array (cuArrayGetPlane: destroyed with it)
  };
  struct TextureInfo {
    CUDA_RESOURCE_DESC res = {};
    CUDA_TEXTURE_DESC tex = {};
    bool has_view = false;
    CUDA_RESOURCE_VIEW_DESC view = {};
  };
  std::unordered_map<uint64_t, ArrayInfo> arrays;
  std::unordered_set<uint64_t> mipmaps;
  std::unordered_map<uint64_t, TextureInfo> textures;
  std::unordered_map<uint64_t, CUDA_RESOURCE_DESC> surfaces;
  int worker_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;  // of the worker's calling thread
  // Answers of queries whose result only this client can change (client_internal.h, Answer*):
  // (entry point, four arguments) -> the 64-bit answer.
  std::map<std::tuple<int, uint64_t, uint64_t, uint64_t, uint64_t>, uint64_t> answers;
  // The same for text answers (CachedText: a device's PCI bus id).
  std::map<std::tuple<int, uint64_t, uint64_t, uint64_t, uint64_t>, std::string> text_answers;
  std::vector<uint8_t> reply_copy;             // scratch
  // Graphs (client_graphs.cc): host-node runs per launch of each executable graph; the graph
  // allocations of each graph and the pointers its free nodes free; what the last
  // cuGraphKernelNodeGetParams and cuStreamGetCaptureInfo handed out (valid until the next).
  std::unordered_map<uint64_t, uint32_t> exec_host_nodes;
  struct GraphAllocs {
    std::vector<uint64_t> allocs;
    std::unordered_map<uint64_t, uint64_t> bytes;  // their sizes
    std::vector<uint64_t> frees;
  };
  std::unordered_map<uint64_t, GraphAllocs> graph_allocs;
  // Executable graph -> the graph allocations that outlive each launch (not freed in the graph):
  // known again after every launch, until cuMemFree(Async).
  std::unordered_map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>> exec_outliving;
  // Conditional nodes (client_graphs.cc): node -> its body graphs, the array handed out as
  // CUDA_CONDITIONAL_NODE_PARAMS::phGraph_out (kept for the session's life).
  std::unordered_map<uint64_t, std::vector<CUgraph>> conditional_bodies;
  std::vector<std::vector<uint8_t>> node_args;
  std::vector<void*> node_arg_ptrs;
  std::unordered_map<uint64_t, std::vector<CUgraphNode>> capture_deps;
  std::unordered_map<uint64_t, std::vector<CUgraphEdgeData>> capture_edges;
};

struct ClientState {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  bool init_called = false;     // the application called cuInit (reconnect after fork)
  CUresult init_result = CUDA_ERROR_NOT_INITIALIZED;
  Session* session = nullptr;   // null until connected
};
ClientState& State();

// The thread's current context (0 when none).
uint64_t CurrentContext();
void SetCurrentContext(uint64_t ctx);

// Locks the state and makes sure a session exists (connecting after a fork). Holders use the
// Locked object's session; its result() is the error to return when there is none.
class Locked {
 public:
  Locked();
  ~Locked();
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;
  Session* session() const { return s_; }
  CUresult result() const { return r_; }

 private:
  Session* s_ = nullptr;
  CUresult r_ = CUDA_SUCCESS;
};

// Connects to TFUSION_REMOTE and fetches the device snapshot. Caller holds State().mu.
CUresult ConnectLocked();

// The helpers below require the caller to hold State().mu with a live session.
// needs_ctx: the call acts on the thread's current context (INVALID_CONTEXT when there is none).
CUresult PrepareContext(Session* s, bool needs_ctx);
// Sets the worker's context to the calling thread's when it has one; succeeds without one.
CUresult PrepareContextIfAny(Session* s);
// Fire-and-forget.
CUresult SendAsync(Session* s, uint16_t op, const transport::Writer& payload,
                   const void* bulk = nullptr, uint64_t bulk_len = 0);
// Sends and waits for the reply. On CUDA_SUCCESS, *reader reads the outputs (valid until the next
// call) and *bulk/*bulk_len give the reply's bulk.
struct ReplyView {
  transport::Reader reader{nullptr, 0};
  const uint8_t* bulk = nullptr;
  uint64_t bulk_len = 0;
};
CUresult CallSync(Session* s, uint16_t op, const transport::Writer& payload, ReplyView* reply,
                  const void* bulk = nullptr, uint64_t bulk_len = 0);
// CallSync for a call whose data arrives as kEvtCopyData frames before its reply: each one is
// handed to sink(ctx, offset, bytes, length) (views valid during the call only); the sink
// returns false for a slice it refuses (out of bounds), which breaks the connection.
// With `place`, a slice's bytes are read from the connection straight into place(ctx, offset,
// length) where the transport can (TCP), and the sink then gets that memory as the data; place
// returns nullptr for a slice it refuses (the bytes then land in the transport's memory and the
// sink decides).
using CopyDataSink = bool (*)(void* ctx, uint64_t offset, const uint8_t* data, uint64_t len);
using CopyDataPlace = uint8_t* (*)(void* ctx, uint64_t offset, uint64_t len);
CUresult CallSyncWithData(Session* s, uint16_t op, const transport::Writer& payload,
                          CopyDataSink sink, void* sink_ctx, CopyDataPlace place = nullptr);
// Hook for event frames (opcode >= 0x8100) that arrive while a call waits for its reply
// (host functions, client_callbacks.cc). The frame's views are valid during the call only.
void HandleEventFrame(Session* s, const transport::InFrame& in);

// Mirrored memory (client_mirror.cc). MirrorMap asks the worker to mirror [base, base + size)
// (kind: remote::kMirrorMapped or kMirrorManaged; anonymous: the stub mapped that memory itself,
// private and anonymous, so pages never populated need no compare); CUDA_ERROR_NOT_SUPPORTED when
// it cannot (the memory then stays this process's own), CUDA_ERROR_OUT_OF_MEMORY when the worker's
// limits refuse it. MirrorUnmap ends a mirror. PushMirrors sends the bytes
// of this session's mirrors that changed since the worker last saw them (fire-and-forget; the
// callback thread calls it without State().mu). ApplyMirrorData applies a kEvtMirrorData event:
// false when a run lies outside this session's mirrors (nothing is applied then).
// MirrorMap/Unmap require State().mu with a live session.
CUresult MirrorMap(Session* s, uint64_t base, uint64_t size, uint32_t kind, bool anonymous);
CUresult MirrorUnmap(Session* s, uint64_t base);
// A primary-context reset dropped every mirror of s on the worker (client_reset.cc): their twins
// go here too, without a message, so no later call compares or sends them. The memory itself
// stays mapped (the caller frees what the driver would). REQUIRES State().mu.
void ForgetMirrors(Session* s);
void PushMirrors(Session* s);
bool ApplyMirrorData(Session* s, const transport::InFrame& in);

// Graph copies of pageable memory (client_graph_host.cc). SendGraphHostSources (State().mu held)
// sends, before a launch of exec, the current bytes of the memory its memcpy nodes read (asking
// the worker which, once per executable graph); ForgetGraphHostCopies after exec was updated or
// destroyed; ApplyGraphHostData writes a kEvtGraphHostData event's bytes: false when a run lies
// outside what this session's executable graphs write (nothing is written then).
CUresult SendGraphHostSources(Session* s, uint64_t exec);
void ForgetGraphHostCopies(Session* s, uint64_t exec);
bool ApplyGraphHostData(Session* s, const transport::InFrame& in);

// Marks the session broken (logged once) and returns kLostConnectionError.
CUresult LoseConnection(Session* s, const transport::TransportStatus& why);

}  // namespace tf::client
