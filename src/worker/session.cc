// The session replay loop: one frame at a time, in order, on one thread.
#include "worker/session.h"
#include "worker/session_ticket.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <map>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "client/op_times.h"
#include "client/remote_protocol.h"
#include "driver/driver_table.h"
#include "worker/generated_calls.h"
#include "worker/session_console.h"
#include "worker/session_arrays.h"
#include "worker/session_graphs.h"
#include "worker/session_green.h"
#include "worker/session_multicast.h"
#include "worker/session_notifications.h"
#include "worker/session_handles.h"
#include "worker/session_host_memory.h"
#include "worker/session_link.h"
#include "worker/session_memops.h"
#include "worker/session_graph_host.h"
#include "worker/session_mirrors.h"

namespace tf::worker {

void SessionLog(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  fprintf(stderr, "tfusion-worker[%d]: %s\n", static_cast<int>(getpid()), buf);
}

namespace {

using driver::Fn;
using remote::Op;
using transport::InFrame;
using transport::OutFrame;
using transport::Reader;
using transport::TransportStatus;
using transport::Writer;

uint64_t H(const void* p) { return reinterpret_cast<uint64_t>(p); }
template <class T>
T As(uint64_t v) {
  return reinterpret_cast<T>(v);
}


struct Staged {
  std::unique_ptr<uint8_t[]> bytes;
  CUevent done = nullptr;
};

struct Image {
  std::vector<uint8_t> bytes;
  uint64_t filled = 0;
};

class Session : public GraphHost, private SessionArrays::Host, private GeneratedHost, private GeneratedHooks,
                private SessionMemops::Host, private SessionGreen::Host,
                private SessionMulticast::Host, private SessionNotifications::Host {
 public:
  Session(const WorkerOptions& o, std::unique_ptr<transport::Transport> t, std::string ticket_limits)
      : ticket_limits_(std::move(ticket_limits)), opt_(o), t_(std::move(t)) {
    graph_host_.SetTransport(t_.get(), &event_seq_);
  }

  int Run();

 private:
  // SessionArrays::Host (arrays, 2D/3D copies, texture and surface objects: session_arrays.cc);
  // DeviceRange and KnownStream serve both hosts.
  bool SendCallData(uint64_t offset, const void* data, uint64_t n) override {
    return SendCopyData(offset, data, n, false);
  }
  uint64_t CallDataLimit() const override { return std::min<uint64_t>(t_->max_bulk_bytes(), 8ull << 20); }
  void KeepUntilStreamDone(std::unique_ptr<uint8_t[]> bytes, CUstream st) override;
  // Dispatch of one driver call. Returns the CUresult; outputs go to out/out_bulk.
  CUresult Dispatch(uint16_t op, Reader& rd, const uint8_t* bulk, uint64_t bulk_len, Writer& out);
  void Reply(uint64_t seq, CUresult r, const Writer& out);
  void ReplyDeferred(uint64_t seq);
  CUresult SessionInfo(Writer& out);
  CUresult LaunchCall(Fn fn, Reader& rd);
  using LaunchArgs = KernelArgs;
  CUresult DecodeLaunchArgs(Reader& rd, uint64_t f, LaunchArgs* a);
  // GraphHost (session_graphs.h): what the graph tables check and change.
  const driver::DriverTable& Driver() const override { return d_; }
  bool DeviceRange(uint64_t p, uint64_t n) const override { return n > 0 && Range(p, n); }
  bool MappedRange(uint64_t p, uint64_t n) const override { return InsideOne(vmm_mapped_, p, n); }
  bool KnownStream(uint64_t& s) const override { return Stream(s); }
  bool KnownEvent(uint64_t& e) const override { return Event(e); }
  bool KnownContext(uint64_t& c) const override { return Context(c); }
  HandleTable& Handles() override { return handles_; }
  bool KnownDevice(int32_t d) const override { return Device(d); }
  // GeneratedHost (the generated calls, api/remote_surface.tsv): the handle table (above), and the
  // session's own tables of streams, events and contexts kept in step with it.
  void Created(HandleKind k, uint64_t real) override {
    if (k == HandleKind::kContext) contexts_.insert(real);  // created, or a primary context retained (new=)
    if (k == HandleKind::kStream) streams_.insert(real);
    if (k == HandleKind::kEvent) events_.insert(real);
    if (k == HandleKind::kMemPool) pools_.insert(real);  // a device's or location's pool (new=)
  }
  void Destroyed(HandleKind k, uint64_t real) override {
    if (k == HandleKind::kContext) {
      created_contexts_.erase(real);
      contexts_.erase(real);
    }
    if (k == HandleKind::kStream) streams_.erase(real);
    if (k == HandleKind::kEvent) events_.erase(real);
    if (k == HandleKind::kMemPool) {
      created_pools_.erase(real);
      pools_.erase(real);
    }
  }
  // publish=pMod:library (cuLibraryGetModule): a library's module joins the library's tables.
  uint64_t Learn(HandleKind k, uint64_t real, HandleKind parent_kind, uint64_t parent) override {
    if (k == HandleKind::kModule && parent_kind == HandleKind::kLibrary && real != 0) {
      library_modules_[real] = parent;
      libraries_[parent].modules.insert(real);
    }
    return Publish(k, real);
  }
  // Only pools and contexts the session created may be destroyed (not a device's default or
  // current pool, a primary or a green context).
  bool MayDestroy(HandleKind k, uint64_t real) const override {
    if (k == HandleKind::kContext) return created_contexts_.count(real) != 0;
    return k != HandleKind::kMemPool || created_pools_.count(real) != 0;
  }
  void AfterCall(Fn fn, CUresult r) override {
    if (fn == Fn::cuStreamSynchronize || fn == Fn::cuStreamQuery) PollStaged(false);
    if (fn == Fn::cuMemCreate && r != CUDA_SUCCESS) host_mem_.Release(&vmm_pending_charge_);
  }
  // Contexts, functions, modules, libraries and kernels resolve as in the hand-written calls: a
  // function may be a kernel in its place, and each must be in the session's own table too.
  bool Resolve(HandleKind k, uint64_t wire, uint64_t* real) override {
    uint64_t v = wire;
    bool ok = false;
    switch (k) {
      case HandleKind::kContext: ok = Context(v); break;
      case HandleKind::kFunction: ok = Function(v) && functions_.count(v) != 0; break;
      case HandleKind::kModule: ok = Module(v); break;
      case HandleKind::kLibrary: ok = Library(v); break;
      case HandleKind::kKernel: ok = Kernel(v); break;
      default: return handles_.Resolve(k, wire, real);
    }
    if (ok) *real = v;
    return ok;
  }
  // SessionGreen::Host (green contexts and device resources: session_green.cc).
  void GreenContextAdded(uint64_t c) override { contexts_.insert(c); }
  void GreenContextRemoved(uint64_t c) override { contexts_.erase(c); }
  void WriteGreenContextInfo(uint64_t c, int32_t dev, Writer& out) override {
    WriteContextInfo(As<CUcontext>(c), dev, false, out);
  }
  std::vector<uint64_t> SessionStreams() const override { return {streams_.begin(), streams_.end()}; }
  // The families whose generated calls have hand-written hooks (`hook=`): multicast objects, and
  // the session's own tables, kept by the hooks below: VMM reservations, handles, retains and
  // mappings (with the pinned-memory charges of host-located handles), IPC opens, created pools.
  GeneratedHooks& Hooks(Fn fn) override {
    if (SessionMulticast::Hooked(fn)) return multicast_;
    return *this;
  }
  // Contexts: without execution-affinity parameters (their pointers never travel); a created one
  // is the session's to destroy, and the client gets its description after it.
  CUresult Check_cuCtxCreate_v4(CUctxCreateParams* params, uint32_t&, int32_t&) override {
    return params != nullptr && params->numExecAffinityParams != 0 ? CUDA_ERROR_NOT_SUPPORTED : CUDA_SUCCESS;
  }
  CUresult Done_cuCtxCreate_v4(CUcontext& c, const CUctxCreateParams*, const uint32_t&, const int32_t& dev,
                               Writer& reply) override {
    created_contexts_.insert(H(c));
    WriteContextInfo(c, dev, false, reply);
    return CUDA_SUCCESS;
  }
  // Primary contexts: the retains the client holds per device (released at the session's end),
  // and each retained context's device; the client gets the context's description after it.
  CUresult Check_cuDevicePrimaryCtxRetain(int32_t&) override { return CUDA_SUCCESS; }
  CUresult Done_cuDevicePrimaryCtxRetain(CUcontext& c, const int32_t& dev, Writer& reply) override {
    primary_ctx_[H(c)] = dev;
    ++primary_retains_[dev];
    WriteContextInfo(c, dev, true, reply);
    return CUDA_SUCCESS;
  }
  // Only a retain the client holds may be released.
  CUresult Check_cuDevicePrimaryCtxRelease_v2(int32_t& dev) override {
    return primary_retains_[dev] == 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
  }
  CUresult Done_cuDevicePrimaryCtxRelease_v2(const int32_t& dev) override {
    --primary_retains_[dev];
    return CUDA_SUCCESS;
  }
  // Device memory, stream-ordered included: the session's allocations (base -> bytes), which every
  // device range is checked against; only an allocation of the session may be freed.
  CUresult Check_cuMemAlloc_v2(uint64_t& n) override { return n == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS; }
  CUresult Done_cuMemAlloc_v2(CUdeviceptr& p, const uint64_t& n) override {
    allocs_[p] = n;
    return CUDA_SUCCESS;
  }
  CUresult Check_cuMemAllocPitch_v2(uint64_t& width, uint64_t& height, uint32_t&) override {
    return width == 0 || height == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  }
  CUresult Done_cuMemAllocPitch_v2(CUdeviceptr& p, size_t& pitch, const uint64_t&, const uint64_t& height,
                                   const uint32_t&) override {
    allocs_[p] = static_cast<uint64_t>(pitch) * height;
    return CUDA_SUCCESS;
  }
  CUresult Check_cuMemAllocAsync(uint64_t& n, uint64_t&) override { return n == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS; }
  CUresult Done_cuMemAllocAsync(CUdeviceptr& p, const uint64_t& n, const uint64_t& stream, Writer& reply) override;
  CUresult Check_cuMemAllocFromPoolAsync(uint64_t& n, uint64_t& pool, uint64_t&) override {
    return n == 0 || !pools_.count(pool) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  }
  CUresult Done_cuMemAllocFromPoolAsync(CUdeviceptr& p, const uint64_t& n, const uint64_t& pool, const uint64_t&,
                                        Writer& reply) override {
    allocs_[p] = n;
    reply.U64(Publish(HandleKind::kMemPool, pool));
    return CUDA_SUCCESS;
  }
  CUresult Check_cuMemFreeAsync(uint64_t& p, uint64_t&) override {
    return allocs_.count(p) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  }
  CUresult Done_cuMemFreeAsync(const uint64_t& p, const uint64_t&) override {
    allocs_.erase(p);
    return CUDA_SUCCESS;
  }
  CUresult Check_cuMemFree_v2(uint64_t& p) override {
    return allocs_.count(p) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  }
  CUresult Done_cuMemFree_v2(const uint64_t& p) override {
    allocs_.erase(p);
    return CUDA_SUCCESS;
  }
  CUresult Check_cuMemAddressReserve(uint64_t& size, uint64_t&, uint64_t&, uint64_t&) override {
    return size == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  }
  CUresult Done_cuMemAddressReserve(CUdeviceptr& p, const uint64_t& size, const uint64_t&, const uint64_t&,
                                    const uint64_t&) override {
    vmm_reserved_[p] = size;
    return CUDA_SUCCESS;
  }
  // A whole reservation of the session, by its base and size.
  CUresult Check_cuMemAddressFree(uint64_t& p, uint64_t& size) override {
    auto it = vmm_reserved_.find(p);
    return it == vmm_reserved_.end() || it->second != size ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  }
  CUresult Done_cuMemAddressFree(const uint64_t& p, const uint64_t&) override {
    vmm_reserved_.erase(p);
    return CUDA_SUCCESS;
  }
  CUresult Check_cuMemCreate(uint64_t& size, CUmemAllocationProp& prop, uint64_t& flags) override;
  CUresult Done_cuMemCreate(CUmemGenericAllocationHandle& h, const uint64_t& size, const CUmemAllocationProp& prop,
                            const uint64_t& flags) override;
  // A VMM handle name of the session (cuMemCreate's, a retained one, or a multicast object),
  // resolved in place.
  CUresult VmmName(uint64_t& h) const {
    return Resolve(HandleKind::kMemHandle, h) && vmm_handles_.count(h) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  }
  CUresult Check_cuMemRelease(uint64_t& h) override { return VmmName(h); }
  CUresult Done_cuMemRelease(const uint64_t& h) override;
  CUresult Check_cuMemGetAllocationPropertiesFromHandle(uint64_t& h) override { return VmmName(h); }
  // The address lies in a range the session mapped (vmm=addr:1).
  CUresult Check_cuMemRetainAllocationHandle(uint64_t&) override { return CUDA_SUCCESS; }
  CUresult Done_cuMemRetainAllocationHandle(CUmemGenericAllocationHandle& h, const uint64_t&) override;
  CUresult Check_cuMemMap(uint64_t& p, uint64_t& size, uint64_t& offset, uint64_t& h, uint64_t& flags) override;
  CUresult Done_cuMemMap(const uint64_t& p, const uint64_t& size, const uint64_t&, const uint64_t&,
                         const uint64_t&) override {
    vmm_mapped_[p] = size;
    return CUDA_SUCCESS;
  }
  CUresult Check_cuMemUnmap(uint64_t& p, uint64_t& size) override;
  CUresult Done_cuMemUnmap(const uint64_t& p, const uint64_t& size) override {
    vmm_mapped_.erase(vmm_mapped_.lower_bound(p), vmm_mapped_.lower_bound(p + size));
    return CUDA_SUCCESS;
  }
  // Only a pointer inside one of the session's cuMemAlloc allocations may be exported (not any
  // device range).
  CUresult Check_cuIpcGetMemHandle(uint64_t& p) override {
    return InsideOne(allocs_, p, 1) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  }
  CUresult Check_cuIpcOpenMemHandle_v2(CUipcMemHandle&, uint32_t&) override { return CUDA_SUCCESS; }
  CUresult Done_cuIpcOpenMemHandle_v2(CUdeviceptr& p, const CUipcMemHandle& handle, const uint32_t& flags,
                                      Writer& reply) override;
  // A pointer the session opened and has not closed as often.
  CUresult Check_cuIpcCloseMemHandle(uint64_t& p) override {
    return ipc_opens_.count(p) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  }
  CUresult Done_cuIpcCloseMemHandle(const uint64_t& p, Writer& reply) override;
  // Pools on a device of the session without IPC handle types (the generated half publishes the
  // pool; the session may destroy it).
  CUresult Check_cuMemPoolCreate(CUmemPoolProps& props) override;
  CUresult Done_cuMemPoolCreate(CUmemoryPool& pool, const CUmemPoolProps&) override {
    created_pools_.insert(H(pool));
    return CUDA_SUCCESS;
  }
  // SessionMulticast::Host (multicast objects are VMM handles: session_multicast.cc).
  bool KnownVmmHandle(uint64_t& h, uint64_t* size) const override {
    if (!Resolve(HandleKind::kMemHandle, h)) return false;
    auto it = vmm_handles_.find(h);
    if (it == vmm_handles_.end()) return false;
    *size = it->second;
    return true;
  }
  uint64_t PublishVmmHandle(uint64_t real, uint64_t size) override {
    vmm_handles_[real] = size;
    return Publish(HandleKind::kMemHandle, real);
  }
  // SessionNotifications::Host (the driver's asynchronous notifications: session_notifications.cc).
  void SendAsyncNotification(const Writer& w) override {
    OutFrame f;
    f.opcode = remote::kEvtAsyncNotification;
    f.sequence = event_seq_++;
    f.payload = w.data();
    f.payload_length = static_cast<uint32_t>(w.size());
    (void)t_->Send(f);  // thread-safe; a client that is gone has nothing left to call
  }
  void StreamGone(uint64_t s) override { streams_.erase(s); }
  void* HostRegionAddress(uint64_t host, uint64_t n) override {
    uint64_t base = 0;
    HostRegion* r = n > 0 ? FindRegion(host, n, &base) : nullptr;
    if (r) return r->local + (host - base);
    // Mirrored memory is at the same address here; anything else gets a shadow.
    if (mirrors_.Contains(host, n)) return reinterpret_cast<void*>(host);
    return graph_host_.Shadow(host, n);
  }
  GraphHostCopies& HostCopies() override { return graph_host_; }
  CUresult DecodeKernelNode(Reader& rd, LaunchArgs* a, CUDA_KERNEL_NODE_PARAMS* p) override;
  bool ParamSizes(uint64_t f, std::vector<size_t>* sizes) const override {
    auto it = functions_.find(f);
    if (it == functions_.end() || !it->second.layout_known) return false;
    *sizes = it->second.sizes;
    return true;
  }
  uint64_t FunctionHandedOut(uint64_t f) override {
    uint64_t wire = 0;
    if (handles_.WireOf(HandleKind::kFunction, f, &wire) || handles_.WireOf(HandleKind::kKernel, f, &wire)) {
      return wire;
    }
    if (!functions_.count(f)) handed_out_functions_.insert(f);
    return handles_.Publish(HandleKind::kFunction, f);
  }
  void AddAllocation(uint64_t p, uint64_t n) override { allocs_[p] = n; }
  void RemoveAllocation(uint64_t p) override { allocs_.erase(p); }
  void HostNodeFunction(uint64_t id, CUhostFn* fn, void** arg) override;
  uint64_t HostNodeIdOf(CUhostFn fn, void* arg) const override {
    if (fn != &Session::HostNodeTrampoline) return 0;
    for (const auto& [id, a] : host_node_args_) {
      if (a.get() == arg) return id;
    }
    return 0;
  }
  uint64_t ClientHostAddress(const void* local) const override;
  void UserObjectReleased(uint64_t id) override;
  void HostRunsEnqueued(int64_t n) override {
    std::lock_guard<std::mutex> g(hf_mu_);
    hf_outstanding_ += n;
  }
  // Libraries and kernels (cuLibrary*, cuKernel*).
  CUresult LibraryCall(Fn fn, Reader& rd, Writer& out);
  CUresult ClusterOccupancy(Fn fn, Reader& rd, Writer& out);
  // cuMemSetAccess (the rest of virtual memory management is generated, with the hooks above).
  CUresult SetAccess(Reader& rd);
  // cuMemGetAddressRange_v2 for pointers the client does not know the allocation of (memory
  // opened from an IPC handle included).
  CUresult AddressRange(Reader& rd, Writer& out);
  void EraseLibrary(uint64_t lib);
  // Host functions (cuLaunchHostFunc, cuStreamAddCallback): the driver's stream thread tells the
  // client and waits for its acknowledgement (kOpHostFuncDone), so later work on the stream runs
  // after the client ran the function.
  struct HostFuncArg {
    Session* self;
    uint64_t id;
  };
  static void HostFuncTrampoline(void* arg);
  // A host node's function: as HostFuncTrampoline, for every run of the node (arg is kept).
  static void HostNodeTrampoline(void* arg);
  std::map<uint64_t, std::unique_ptr<HostFuncArg>> host_node_args_;  // by client id
  // node: a graph's host node (it runs again at the next launch), not a one-time host function.
  void HostFuncReached(uint64_t id, bool node = false);
  void HostFuncDone(uint64_t id);
  // Before a call that blocks on streams: waits until every host function the client enqueued has
  // run, reading acknowledgements (the only frames a client sends while it waits for a reply).
  // False when the client went away.
  bool DrainHostFuncs();
  bool HostFuncsOutstanding() {
    std::lock_guard<std::mutex> g(hf_mu_);
    return hf_outstanding_ != 0;
  }
  // Host regions (remote_protocol.h kOpHostRegion*): page-locked memory the client shares.
  CUresult HostRegionCall(uint16_t op, Reader& rd, Writer& out);
  // The region holding [host, host + n) by client address (*base: its client address), or
  // nullptr.
  struct HostRegion;
  HostRegion* FindRegion(uint64_t host, uint64_t n, uint64_t* base = nullptr);
  // Registers the transport's bulk memory with the driver once (pageable copies DMA from and to
  // it); needs a current context. arena_state_ says how it went.
  void RegisterArena();
  // cuMemcpyHtoDAsync_v2 from a bulk view: holds the view until the stream has copied it (a host
  // function releases it), so nothing is staged. False when the view cannot be held.
  bool CopyFromHeldBulk(uint64_t dst, const uint8_t* bulk, uint64_t n, CUstream st, CUresult* r);
  // A device-to-host copy into the client's pageable memory: kEvtCopyData slices, then the reply.
  CUresult CopyToClient(uint64_t src, uint64_t n, CUstream st, bool async);
  bool SendCopyData(uint64_t offset, const void* data, uint64_t n, bool reserved);
  bool Capturing(CUstream st);
  // kOpMirrorData: applied to the mirrors, or a deferred CUDA_ERROR_INVALID_VALUE for the next
  // synchronizing reply. (Apply reads each field of the payload once.)
  void MirrorData(const InFrame& in) {
    CUresult r = mirrors_.Apply(in.payload, in.payload_length, in.bulk, in.bulk_length);
    const uint64_t seq = in.header.sequence;
    if (r != CUDA_SUCCESS && pending_ == CUDA_SUCCESS) {
      pending_ = r;
      pending_seq_ = seq;
      pending_op_ = remote::kOpMirrorData;
    }
  }
  void WriteContextInfo(CUcontext c, int32_t dev, bool primary, Writer& out);
  bool LoadDriver();
  // The client's first request may carry the vGPU limits it asks for (docs/protocol.md): "" when
  // none or when they were prepared, else why they were refused.
  std::string PrepareLimits(Reader& rd);
  std::vector<std::pair<std::string, std::string>> limits_env_;
  std::string limits_driver_;
  // The limits digest of the session ticket the client proved (session_ticket.h); "" when its
  // credential binds none (the token, a tkt1 ticket).
  std::string ticket_limits_;
  void PollStaged(bool wait);
  void Cleanup();
  // cuDevicePrimaryCtxReset_v2 (below Cleanup): everything the session made in the device's
  // primary context goes, its names retired; every mirror is dropped, the host regions the
  // client names are freed, and the others are registered again afterwards.
  CUresult PrimaryCtxReset(Reader& rd);
  void DestroyObjects();

  // [p, p + n) lies wholly inside one range of `ranges` (base -> size).
  static bool InsideOne(const std::map<uint64_t, uint64_t>& ranges, uint64_t p, uint64_t n) {
    auto it = ranges.upper_bound(p);
    if (it == ranges.begin()) return false;
    --it;
    return p >= it->first && n <= it->second && p - it->first <= it->second - n;
  }
  bool Range(uint64_t p, uint64_t n) const {
    if (n == 0) return true;
    // An allocation, or a range mapped with cuMemMap.
    if (InsideOne(allocs_, p, n) || InsideOne(vmm_mapped_, p, n)) return true;
    // Host memory the driver maps at its own address: shared regions and mirrors (managed
    // memory, zero-copy buffers), which memsets and device-to-device copies may name too.
    if (InsideOne(mapped_host_, p, n) || mirrors_.Contains(p, n)) return true;
    // Another session's allocation opened from its IPC handle.
    if (InsideOne(ipc_opened_, p, n)) return true;
    // A module's or library's global variable (cudaMemcpyToSymbol and friends).
    auto g = globals_.upper_bound(p);
    if (g == globals_.begin()) return false;
    --g;
    return p >= g->first && n <= g->second.size && p - g->first <= g->second.size - n;
  }
  // Forgets the globals of a module or library that goes away.
  void EraseGlobals(uint64_t owner) {
    for (auto it = globals_.begin(); it != globals_.end();) {
      if (it->second.owner == owner) it = globals_.erase(it);
      else ++it;
    }
  }
  // Session-scoped virtual handles (session_handles.h). Each of these resolves a wire name in
  // place to the real handle, false when it is not a live name of that kind in this session (v may
  // then be left as it was).
  HandleTable handles_;
  uint64_t Publish(HandleKind k, uint64_t real) { return handles_.Publish(k, real); }
  bool Resolve(HandleKind k, uint64_t& v) const { return handles_.Resolve(k, v, &v); }
  bool Stream(uint64_t& s) const { return Resolve(HandleKind::kStream, s); }
  bool Event(uint64_t& e) const { return Resolve(HandleKind::kEvent, e) && events_.count(e); }
  bool Context(uint64_t& c) const { return Resolve(HandleKind::kContext, c) && contexts_.count(c); }
  bool Module(uint64_t& m) const {
    return Resolve(HandleKind::kModule, m) && (modules_.count(m) || library_modules_.count(m));
  }
  // A function, or a kernel in its place (CUDA launches a CUkernel cast to CUfunction).
  bool Function(uint64_t& f) const {
    return Resolve(HandleKind::kFunction, f) || Resolve(HandleKind::kKernel, f);
  }
  bool Library(uint64_t& l) const { return Resolve(HandleKind::kLibrary, l) && libraries_.count(l); }
  bool Kernel(uint64_t& k) const { return Resolve(HandleKind::kKernel, k) && kernels_.count(k); }
  bool Pool(uint64_t& p) const { return Resolve(HandleKind::kMemPool, p) && pools_.count(p); }
  bool Device(int32_t d) const { return d >= 0 && d < device_count_; }

  const WorkerOptions& opt_;
  std::unique_ptr<transport::Transport> t_;
  driver::DriverTable d_;
  int device_count_ = 0;
  bool initialised_ = false;

  std::map<uint64_t, uint64_t> allocs_;  // base -> size
  struct Global {
    uint64_t size = 0;
    uint64_t owner = 0;  // the module or library
  };
  std::map<uint64_t, Global> globals_;
  std::map<uint64_t, uint64_t> vmm_reserved_;  // cuMemAddressReserve: base -> size
  std::map<uint64_t, uint64_t> vmm_handles_;   // cuMemCreate: handle -> size
  std::map<uint64_t, int> vmm_retains_;        // cuMemRetainAllocationHandle: releases still owed
  std::map<uint64_t, uint64_t> vmm_mapped_;    // cuMemMap: base -> size
  // cuIpcOpenMemHandle_v2: base -> size of the opened allocation (the driver's address range),
  // and the opens not yet closed (the driver counts opens of one handle per context).
  std::map<uint64_t, uint64_t> ipc_opened_;
  std::map<uint64_t, int> ipc_opens_;
  std::set<uint64_t> contexts_, created_contexts_, streams_, events_;
  std::set<uint64_t> pools_, created_pools_;
  SessionGraphs graphs_{*this};
  std::mutex hf_mu_;
  std::condition_variable hf_cv_;
  // Acknowledged, not yet seen by their stream thread (a host node's id may be run twice at once).
  std::multiset<uint64_t> hf_done_;
  // For the watchdog (a session blocked in the driver while its client is gone ends rather than
  // keep the client's GPU memory): a count the session thread bumps when it enters a call (odd)
  // and leaves it (even), and the call's opcode. No clock is read on the call path.
  std::atomic<uint64_t> dispatch_seq_{0};
  std::atomic<uint16_t> dispatch_op_{0};
  void StartWatchdog();
  int64_t hf_outstanding_ = 0;  // enqueued on the driver, not yet finished
  bool hf_stopping_ = false;    // the session ends: release every waiting stream thread
  std::atomic<uint64_t> event_seq_{1};
  std::vector<uint8_t> bulk_copy_;  // every pool handle the client got; those it created
  std::map<int32_t, int> primary_retains_;  // device -> retains held by the client
  // Device 0's primary context, retained the first time a library's kernel was described while
  // the client had no context current (the driver answers a kernel's parameters only in one);
  // released at the session's end.
  CUcontext lookup_ctx_ = nullptr;
  bool told_unknown_layout_ = false;  // a function without a parameter layout was logged
  std::map<uint64_t, int32_t> primary_ctx_;  // context -> device
  std::map<uint64_t, std::set<uint64_t>> modules_;  // module -> its functions
  struct FunctionEntry {
    uint64_t module = 0;
    uint64_t library = 0;  // functions and kernels of a library (module 0)
    bool layout_known = false;
    std::vector<size_t> sizes;  // each parameter's size, when known
  };
  std::map<uint64_t, FunctionEntry> functions_;
  std::set<uint64_t> handed_out_functions_;  // functions known only from graph nodes' parameters
  // Libraries: their kernels, the functions got from those kernels, the modules got from them.
  struct LibraryEntry {
    std::set<uint64_t> kernels, functions, modules;
  };
  std::map<uint64_t, LibraryEntry> libraries_;
  std::map<uint64_t, uint64_t> kernels_;          // kernel -> its library
  std::map<uint64_t, uint64_t> library_modules_;  // module of a library -> the library
  // Writes a function's parameter layout and attributes (the client caches them) and records
  // the layout in fe. kernel: a CUkernel, queried through the cuKernel* calls the driver has.
  void WriteFunctionInfo(uint64_t handle, bool kernel, FunctionEntry& fe, Writer& out);
  // Records f, just looked up in module m (ours, or a library's: the caller checked), fresh.
  FunctionEntry& RecordModuleFunction(uint64_t m, uint64_t f);
  std::map<std::pair<uint64_t, uint64_t>, Image> images_;
  std::deque<Staged> staged_;

  struct HostRegion {
    uint64_t id = 0;
    uint64_t length = 0;
    uint8_t* local = nullptr;  // where this process maps it (== the client address when same)
    bool same_address = false;
    SessionHostMemory::Charge charge;
    unsigned reg = 0;  // cuMemHostRegister flags (registered again after a primary context reset)
  };
  std::map<uint64_t, HostRegion> regions_;     // client address -> region
  std::map<uint64_t, uint64_t> region_ids_;    // region id -> client address
  std::map<uint64_t, uint64_t> mapped_host_;   // regions whose device pointer is their address
  SessionHostMemory host_mem_{d_, opt_.session_host_mem};  // pinned memory and its limits
  SessionMirrors mirrors_{d_, host_mem_};      // mirrored host memory (session_mirrors.h)
  GraphHostCopies graph_host_{d_, host_mem_};  // graph copies of pageable memory (session_graph_host.h)
  SessionHostMemory::Charge arena_charge_;     // the registered bulk arena
  std::map<uint64_t, SessionHostMemory::Charge> vmm_host_charges_;  // host-located cuMemCreate
  SessionHostMemory::Charge vmm_pending_charge_;  // of the cuMemCreate between its hooks
  bool unified_addressing_ = false;            // device 0 reports unified addressing
  int arena_state_ = 0;                        // 0 not tried, 1 registered, -1 unavailable
  void* arena_base_ = nullptr;
  std::vector<CUevent> copy_events_;           // CopyToClient's slices in flight
  uint64_t cur_seq_ = 0;                       // the sequence of the frame being dispatched

  // The first failure of an asynchronous call since the last synchronizing reply.
  uint64_t pending_seq_ = 0;
  uint16_t pending_op_ = 0;
  CUresult pending_ = CUDA_SUCCESS;
  CUresult sticky_ = CUDA_SUCCESS;

  std::vector<uint8_t> payload_;  // a private copy of the frame's payload
  std::vector<uint8_t> out_buf_ = std::vector<uint8_t>(64 * 1024);
  std::vector<uint8_t> reply_bulk_;
  uint64_t reply_bulk_len_ = 0;

  ConsoleCapture console_;  // device printf to the client (session_console.h)
  JitSession jit_{d_, handles_};      // cuModuleLoadDataEx with options, cuLink* (session_link.h)
  const std::vector<uint8_t>* FindImage(uint64_t lo, uint64_t hi, uint64_t n) {
    auto it = images_.find({lo, hi});
    if (it == images_.end() || it->second.filled != n || it->second.bytes.size() != n) return nullptr;
    return &it->second.bytes;
  }
  JitSession::ImageLookup Images() {
    return [this](uint64_t lo, uint64_t hi, uint64_t n) { return FindImage(lo, hi, n); };
  }
  SessionArrays arrays_{d_, *this};
  SessionMemops memops_{d_, *this};
  SessionGreen green_{d_, *this};
  SessionMulticast multicast_{*this};
  SessionNotifications notifications_{d_, *this};
};

#define CALL(fn, ...) (d_.fn ? d_.fn(__VA_ARGS__) : CUDA_ERROR_NOT_SUPPORTED)

bool IsSyncPoint(uint16_t op) {
  static const Fn kSync[] = {Fn::cuCtxSynchronize,    Fn::cuStreamSynchronize, Fn::cuStreamQuery,
                             Fn::cuEventSynchronize,  Fn::cuEventQuery,        Fn::cuMemcpyHtoD_v2,
                             Fn::cuMemcpyDtoH_v2,     Fn::cuMemcpyDtoD_v2,     Fn::cuMemsetD8_v2,
                             Fn::cuMemsetD32_v2,      Fn::cuMemFree_v2,        Fn::cuMemcpyDtoHAsync_v2,
                             Fn::cuMemsetD16_v2,      Fn::cuMemsetD2D8_v2,     Fn::cuMemsetD2D16_v2,
                             Fn::cuMemsetD2D32_v2};
  for (Fn f : kSync) {
    if (Op(f) == op) return true;
  }
  return transport::IsDriverCallOpcode(op) &&
         SessionArrays::IsSyncPoint(static_cast<Fn>(transport::DriverCallId(op)));
}

// Calls that wait for streams (host functions on them must have run first): the sync points, and
// the calls the driver makes wait while a host function of the context runs: those that load or
// unload code (measured on driver 580: cuModuleLoadData blocked until XLA's pending host function
// returned) and those that release memory or a context. Without draining first the session would
// wait for an acknowledgement this thread is not there to read.
bool IsBlocking(uint16_t op) {
  static const Fn kWaitForWork[] = {
      Fn::cuModuleLoad,         Fn::cuModuleLoadData,         Fn::cuModuleLoadDataEx,   Fn::cuModuleLoadFatBinary,
      Fn::cuModuleUnload,       Fn::cuLibraryLoadData,        Fn::cuLibraryLoadFromFile, Fn::cuLibraryUnload,
      Fn::cuLinkComplete,       Fn::cuModuleGetFunction,      Fn::cuLibraryGetKernel,    Fn::cuLibraryGetModule,
      Fn::cuKernelGetFunction,  Fn::cuMemFreeHost,            Fn::cuMemHostUnregister,  Fn::cuArrayDestroy,
      Fn::cuMipmappedArrayDestroy, Fn::cuCtxDestroy_v2,       Fn::cuDevicePrimaryCtxRelease_v2,
      Fn::cuDevicePrimaryCtxReset_v2};
  for (Fn f : kWaitForWork) {
    if (Op(f) == op) return true;
  }
  // Unmapping a host region (cuMemFreeHost, cuMemHostUnregister over shared memory) or a mirror
  // synchronizes the context first: NVIDIA's simpleCallback frees page-locked memory from a thread
  // its stream callback started while other streams' callbacks are still to run.
  if (op == remote::kOpHostRegionUnmap || op == remote::kOpMirrorUnmap) return true;
  return IsSyncPoint(op) && op != Op(Fn::cuStreamQuery) && op != Op(Fn::cuEventQuery);
}

bool Session::LoadDriver() {
  for (const auto& [k, v] : opt_.session_env) setenv(k.c_str(), v.c_str(), 1);
  for (const auto& [k, v] : limits_env_) setenv(k.c_str(), v.c_str(), 1);
  const std::string& path = limits_driver_.empty() ? opt_.driver_path : limits_driver_;
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    SessionLog("cannot load the driver %s: %s", path.c_str(), dlerror());
    return false;
  }
  d_.Load(h);
  host_mem_.BindDriver(h);
  // Test hook for the fake driver: TFUSION_WORKER_FAKE_FAIL=name:n:error arms fakecuda_fail_nth.
  if (const char* spec = getenv("TFUSION_WORKER_FAKE_FAIL"); spec && *spec) {
    using FailNth = void (*)(const char*, int, int);
    auto fail = reinterpret_cast<FailNth>(dlsym(h, "fakecuda_fail_nth"));
    char name[128] = {};
    int n = 0, err = 0;
    if (fail && sscanf(spec, "%127[^:]:%d:%d", name, &n, &err) == 3) fail(name, n, err);
  }
  return true;
}

CUresult Session::SessionInfo(Writer& out) {
  CUresult r = CALL(cuInit, 0);
  int version = 0;
  CALL(cuDriverGetVersion, &version);
  int count = 0;
  if (r == CUDA_SUCCESS) r = CALL(cuDeviceGetCount, &count);
  if (r != CUDA_SUCCESS) count = 0;
  if (count > static_cast<int>(remote::kMaxDevices)) count = remote::kMaxDevices;
  device_count_ = count;
  initialised_ = r == CUDA_SUCCESS;
  if (count > 0) {
    int unified = 0;
    CALL(cuDeviceGetAttribute, &unified, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0);
    unified_addressing_ = unified != 0;
  }
  out.I32(r);
  out.I32(version);
  out.U32(static_cast<uint32_t>(count));
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    CALL(cuDeviceGet, &dev, i);
    char name[remote::kMaxDeviceName] = {};
    CALL(cuDeviceGetName, name, sizeof(name) - 1, dev);
    out.Blob(name, static_cast<uint32_t>(strnlen(name, sizeof(name))));
    CUuuid uuid = {};
    if (d_.cuDeviceGetUuid_v2) d_.cuDeviceGetUuid_v2(&uuid, dev);
    else CALL(cuDeviceGetUuid, &uuid, dev);
    out.Bytes(uuid.bytes, sizeof(uuid.bytes));
    size_t total = 0;
    CALL(cuDeviceTotalMem_v2, &total, dev);
    out.U64(total);
    out.U32(CU_DEVICE_ATTRIBUTE_MAX);
    for (int a = 0; a < CU_DEVICE_ATTRIBUTE_MAX; ++a) {
      int v = 0;
      if (a == 0 || CALL(cuDeviceGetAttribute, &v, static_cast<CUdevice_attribute>(a), dev) !=
                        CUDA_SUCCESS) {
        v = 0;
      }
      out.I32(v);
    }
  }
  return CUDA_SUCCESS;
}

// What the client caches about a context: u32 flags, u32 api version, i32 least and greatest
// stream priority, u8 primary. Queried with the context pushed, so the session's current
// context is unchanged.
void Session::WriteContextInfo(CUcontext c, int32_t dev, bool primary, Writer& out) {
  unsigned flags = 0, api = 0;
  int least = 0, greatest = 0;
  if (primary) {
    int active = 0;
    CALL(cuDevicePrimaryCtxGetState, dev, &flags, &active);
  }
  CALL(cuCtxGetApiVersion, c, &api);
  if (CALL(cuCtxPushCurrent_v2, c) == CUDA_SUCCESS) {
    if (!primary) CALL(cuCtxGetFlags, &flags);
    CALL(cuCtxGetStreamPriorityRange, &least, &greatest);
    CUcontext popped = nullptr;
    CALL(cuCtxPopCurrent_v2, &popped);
  }
  out.U32(flags);
  out.U32(api);
  out.I32(least);
  out.I32(greatest);
  out.U8(primary ? 1 : 0);
}

void Session::KeepUntilStreamDone(std::unique_ptr<uint8_t[]> bytes, CUstream st) {
  Staged s;
  s.bytes = std::move(bytes);
  if (CALL(cuEventCreate, &s.done, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS ||
      CALL(cuEventRecord, s.done, st) != CUDA_SUCCESS) {
    if (s.done) CALL(cuEventDestroy_v2, s.done);
    s.done = nullptr;
    CALL(cuStreamSynchronize, st);
  }
  staged_.push_back(std::move(s));
}

void Session::PollStaged(bool wait) {
  while (!staged_.empty()) {
    Staged& s = staged_.front();
    CUresult q = s.done ? (wait ? CALL(cuEventSynchronize, s.done) : CALL(cuEventQuery, s.done))
                        : CUDA_SUCCESS;
    if (q == CUDA_ERROR_NOT_READY) return;
    if (s.done) CALL(cuEventDestroy_v2, s.done);
    staged_.pop_front();
  }
}

CUresult Session::Dispatch(uint16_t op, Reader& rd, const uint8_t* bulk, uint64_t bulk_len,
                           Writer& out) {
  if (remote::IsHostRegionOp(op)) return HostRegionCall(op, rd, out);
  if (!initialised_) return CUDA_ERROR_NOT_INITIALIZED;
  if (remote::IsMirrorOp(op)) return mirrors_.Call(op, rd, out);
  const Fn fn = static_cast<Fn>(transport::DriverCallId(op));
  if (SessionGraphs::Handles(fn)) return graphs_.Call(fn, rd, out);
  if (SessionArrays::Handles(fn)) return arrays_.Call(fn, rd, bulk, bulk_len, out);
  if (SessionMemops::Handles(fn)) return memops_.Call(fn, rd, out);
  if (SessionGreen::Handles(fn)) return green_.Call(fn, rd, out);
  if (SessionNotifications::Handles(fn)) return notifications_.Call(fn, rd, out);
  if (IsGenerated(fn)) return DispatchGenerated(fn, rd, out, *this);
  switch (fn) {
    case Fn::cuCtxSetCurrent: {
      uint64_t c = 0;
      if (!rd.U64(&c) || (c != 0 && !Context(c))) return CUDA_ERROR_INVALID_CONTEXT;
      return CALL(cuCtxSetCurrent, As<CUcontext>(c));
    }
    case Fn::cuDevicePrimaryCtxReset_v2:
      return PrimaryCtxReset(rd);
    case Fn::cuDevicePrimaryCtxGetState: {
      int32_t dev = 0;
      if (!rd.I32(&dev) || !Device(dev)) return CUDA_ERROR_INVALID_DEVICE;
      unsigned flags = 0;
      int active = 0;
      CUresult r = CALL(cuDevicePrimaryCtxGetState, dev, &flags, &active);
      out.U32(flags);
      out.I32(active);
      return r;
    }
    case Fn::cuMemSetAccess:
      return SetAccess(rd);
    case Fn::cuMemGetAddressRange_v2:
      return AddressRange(rd, out);
    case Fn::cuMemcpyHtoD_v2: {
      uint64_t dst = 0;
      if (!rd.U64(&dst) || bulk == nullptr || !Range(dst, bulk_len)) return CUDA_ERROR_INVALID_VALUE;
      RegisterArena();  // the view lies in it: DMA straight from it
      return CALL(cuMemcpyHtoD_v2, dst, bulk, bulk_len);
    }
    case Fn::cuMemcpyHtoDAsync_v2: {
      uint64_t dst = 0, s = 0, host = 0;
      rd.U64(&dst);
      if (!rd.U64(&s) || bulk == nullptr || !Range(dst, bulk_len)) return CUDA_ERROR_INVALID_VALUE;
      // A slice of a larger copy also names the whole one: host address and length.
      uint64_t whole_host = 0, whole_n = 0;
      if (rd.remaining() > 0 && !rd.U64(&host)) return CUDA_ERROR_INVALID_VALUE;
      if (rd.remaining() > 0 && (!rd.U64(&whole_host) || !rd.U64(&whole_n))) return CUDA_ERROR_INVALID_VALUE;
      if (!rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      if (whole_n != 0 && (host < whole_host || host - whole_host > whole_n ||
                           bulk_len > whole_n - (host - whole_host) || dst < host - whole_host ||
                           !Range(dst - (host - whole_host), whole_n))) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      if (!Stream(s)) return CUDA_ERROR_INVALID_HANDLE;
      // Captured: the graph copies from a shadow of the client's memory, refreshed at each launch
      // (session_graph_host.h). The slices of one copy fill one shadow, and the last one records
      // the whole copy as one node (the program's graph has the nodes it has natively).
      if (host != 0 && Capturing(As<CUstream>(s))) {
        if (whole_n == 0) {  // sent whole: the copy is this message
          whole_host = host;
          whole_n = bulk_len;
        }
        auto* shadow = static_cast<uint8_t*>(graph_host_.Shadow(whole_host, whole_n));
        if (shadow == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
        const uint64_t off = host - whole_host;
        memcpy(shadow + off, bulk, bulk_len);
        if (off + bulk_len < whole_n) return CUDA_SUCCESS;
        return CALL(cuMemcpyHtoDAsync_v2, dst - off, shadow, whole_n, As<CUstream>(s));
      }
      CUresult held = CUDA_SUCCESS;
      if (CopyFromHeldBulk(dst, bulk, bulk_len, As<CUstream>(s), &held)) return held;
      // The bulk view dies at the next Receive: stage it until the copy has run.
      Staged st;
      st.bytes.reset(new uint8_t[bulk_len]);
      memcpy(st.bytes.get(), bulk, bulk_len);
      CUresult r = CALL(cuMemcpyHtoDAsync_v2, dst, st.bytes.get(), bulk_len, As<CUstream>(s));
      if (r != CUDA_SUCCESS) return r;
      if (CALL(cuEventCreate, &st.done, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS ||
          CALL(cuEventRecord, st.done, As<CUstream>(s)) != CUDA_SUCCESS) {
        if (st.done) CALL(cuEventDestroy_v2, st.done);
        st.done = nullptr;
        CALL(cuStreamSynchronize, As<CUstream>(s));
      }
      staged_.push_back(std::move(st));
      return CUDA_SUCCESS;
    }
    case Fn::cuMemcpyDtoH_v2:
    case Fn::cuMemcpyDtoHAsync_v2: {
      uint64_t src = 0, n = 0, s = 0, host = 0;
      rd.U64(&src);
      rd.U64(&n);
      if (fn == Fn::cuMemcpyDtoHAsync_v2) rd.U64(&s);
      if (fn == Fn::cuMemcpyDtoHAsync_v2 && rd.remaining() > 0) rd.U64(&host);
      if (!rd.Finish() || n == 0 || !Range(src, n)) return CUDA_ERROR_INVALID_VALUE;
      if (!Stream(s)) return CUDA_ERROR_INVALID_HANDLE;
      // Captured: the graph copies into a shadow, whose bytes go to the client after each launch.
      if (host != 0 && Capturing(As<CUstream>(s))) {
        void* shadow = graph_host_.Shadow(host, n);
        if (shadow == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
        return CALL(cuMemcpyDtoHAsync_v2, shadow, src, n, As<CUstream>(s));
      }
      return CopyToClient(src, n, As<CUstream>(s), fn == Fn::cuMemcpyDtoHAsync_v2);
    }
    case Fn::cuMemcpyDtoD_v2:
    case Fn::cuMemcpyDtoDAsync_v2: {
      uint64_t dst = 0, src = 0, n = 0, s = 0;
      rd.U64(&dst);
      rd.U64(&src);
      rd.U64(&n);
      if (fn == Fn::cuMemcpyDtoDAsync_v2) rd.U64(&s);
      if (!rd.ok() || !Range(dst, n) || !Range(src, n)) return CUDA_ERROR_INVALID_VALUE;
      if (!Stream(s)) return CUDA_ERROR_INVALID_HANDLE;
      return fn == Fn::cuMemcpyDtoD_v2 ? CALL(cuMemcpyDtoD_v2, dst, src, n)
                                       : CALL(cuMemcpyDtoDAsync_v2, dst, src, n, As<CUstream>(s));
    }
    case Fn::cuLaunchHostFunc:
    case Fn::cuStreamAddCallback: {
      uint64_t s = 0, id = 0;
      uint32_t flags = 0;
      rd.U64(&s);
      rd.U64(&id);
      if (fn == Fn::cuStreamAddCallback) rd.U32(&flags);
      if (!rd.Finish() || flags != 0) return CUDA_ERROR_INVALID_VALUE;
      if (!Stream(s)) return CUDA_ERROR_INVALID_HANDLE;
      if (Capturing(As<CUstream>(s))) {
        // Captured: a host node of the capture graph, which runs at every launch of the graph
        // (counted per launch like other host nodes), so its argument stays.
        if (fn == Fn::cuStreamAddCallback) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        CUhostFn node_fn = nullptr;
        void* node_arg = nullptr;
        HostNodeFunction(id, &node_fn, &node_arg);
        return CALL(cuLaunchHostFunc, As<CUstream>(s), node_fn, node_arg);
      }
      auto* arg = new HostFuncArg{this, id};
      {
        std::lock_guard<std::mutex> g(hf_mu_);
        ++hf_outstanding_;
      }
      // Both become a host function here: the client passes the callback its own arguments.
      CUresult r = CALL(cuLaunchHostFunc, As<CUstream>(s), &Session::HostFuncTrampoline, arg);
      if (r != CUDA_SUCCESS) {
        delete arg;
        std::lock_guard<std::mutex> g(hf_mu_);
        --hf_outstanding_;
      }
      return r;
    }
    case Fn::cuModuleLoadData: {
      uint64_t lo = 0, hi = 0, n = 0;
      rd.U64(&lo);
      rd.U64(&hi);
      if (!rd.U64(&n)) return CUDA_ERROR_INVALID_VALUE;
      auto it = images_.find({lo, hi});
      if (it == images_.end() || it->second.filled != n || it->second.bytes.size() != n) {
        return CUDA_ERROR_INVALID_IMAGE;
      }
      CUmodule m = nullptr;
      CUresult r = CALL(cuModuleLoadData, &m, it->second.bytes.data());
      if (r != CUDA_SUCCESS) return r;
      modules_[H(m)];
      out.U64(Publish(HandleKind::kModule, H(m)));
      return CUDA_SUCCESS;
    }
    case Fn::cuModuleLoadDataEx: {
      uint64_t m = 0;
      CUresult r = jit_.LoadDataEx(rd, Images(), out, &m);
      if (m != 0) modules_[m];
      return r;
    }
    case Fn::cuLinkCreate_v2:
    case Fn::cuLinkAddData_v2:
    case Fn::cuLinkComplete:
    case Fn::cuLinkDestroy:
      return jit_.Link(fn, rd, Images(), out, &reply_bulk_, &reply_bulk_len_, t_->max_bulk_bytes());
    case Fn::cuModuleGetFunction: {
      uint64_t m = 0;
      const uint8_t* name = nullptr;
      uint32_t len = 0;
      rd.U64(&m);
      if (!rd.Blob(&name, &len, remote::kMaxFunctionName)) return CUDA_ERROR_INVALID_VALUE;
      if (!Module(m)) return CUDA_ERROR_INVALID_HANDLE;
      std::string fname(reinterpret_cast<const char*>(name), len);
      CUfunction f = nullptr;
      CUresult r = CALL(cuModuleGetFunction, &f, As<CUmodule>(m), fname.c_str());
      if (r != CUDA_SUCCESS) return r;
      FunctionEntry& fe = RecordModuleFunction(m, H(f));
      out.U64(Publish(HandleKind::kFunction, H(f)));
      WriteFunctionInfo(H(f), false, fe, out);
      return CUDA_SUCCESS;
    }
    case Fn::cuFuncGetName: {
      // u64 function -> blob name. For functions the client did not look up itself (those it did
      // it names locally): kernels of graph nodes.
      uint64_t f = 0;
      if (!rd.U64(&f) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      if (!Function(f) || (!functions_.count(f) && !handed_out_functions_.count(f) && !kernels_.count(f))) {
        return CUDA_ERROR_INVALID_HANDLE;
      }
      const char* fname = nullptr;
      CUresult r = CALL(cuFuncGetName, &fname, As<CUfunction>(f));
      if (r != CUDA_SUCCESS) return r;
      if (fname == nullptr) fname = "";
      out.Blob(fname, static_cast<uint32_t>(strnlen(fname, remote::kMaxFunctionName)));
      return CUDA_SUCCESS;
    }
    case Fn::cuModuleEnumerateFunctions: {
      // u64 module, u32 num -> u32 n, n x (u64 function, blob name, function info).
      uint64_t m = 0;
      uint32_t num = 0;
      rd.U64(&m);
      if (!rd.U32(&num) || !rd.Finish() || num == 0 || num > remote::kMaxLibraryKernels) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      if (!Module(m)) return CUDA_ERROR_INVALID_HANDLE;
      unsigned count = 0;
      CUresult r = CALL(cuModuleGetFunctionCount, &count, As<CUmodule>(m));
      if (r != CUDA_SUCCESS) return r;
      const uint32_t n = std::min<uint32_t>(num, count);
      std::vector<CUfunction> fs(n ? n : 1);
      if (n > 0) r = CALL(cuModuleEnumerateFunctions, fs.data(), n, As<CUmodule>(m));
      if (r != CUDA_SUCCESS) return r;
      out.U32(n);
      for (uint32_t i = 0; i < n; ++i) {
        const char* fname = nullptr;
        if (CALL(cuFuncGetName, &fname, fs[i]) != CUDA_SUCCESS || fname == nullptr) fname = "";
        FunctionEntry& fe = RecordModuleFunction(m, H(fs[i]));
        out.U64(Publish(HandleKind::kFunction, H(fs[i])));
        out.Blob(fname, static_cast<uint32_t>(strnlen(fname, remote::kMaxFunctionName)));
        WriteFunctionInfo(H(fs[i]), false, fe, out);
      }
      return CUDA_SUCCESS;
    }
    case Fn::cuModuleUnload: {
      uint64_t m = 0;
      if (!rd.U64(&m) || !Resolve(HandleKind::kModule, m) || !modules_.count(m)) {
        return CUDA_ERROR_INVALID_HANDLE;
      }
      CUresult r = CALL(cuModuleUnload, As<CUmodule>(m));
      if (r == CUDA_SUCCESS) {
        for (uint64_t f : modules_[m]) {
          functions_.erase(f);
          handles_.RetireReal(HandleKind::kFunction, f);
        }
        for (uint64_t f : handed_out_functions_) handles_.RetireReal(HandleKind::kFunction, f);
        handles_.RetireReal(HandleKind::kModule, m);
        modules_.erase(m);
        EraseGlobals(m);
        handed_out_functions_.clear();  // which module they came from is not known
      }
      return r;
    }
    case Fn::cuModuleGetGlobal_v2:
      return LibraryCall(fn, rd, out);
    case Fn::cuLibraryLoadData:
    case Fn::cuLibraryUnload:
    case Fn::cuLibraryGetKernel:
    case Fn::cuLibraryGetGlobal:
    case Fn::cuLibraryEnumerateKernels:
    case Fn::cuKernelGetFunction:
    case Fn::cuKernelGetAttribute:
    case Fn::cuKernelSetAttribute:
    case Fn::cuFuncSetAttribute:
    case Fn::cuOccupancyMaxPotentialBlockSize:
    case Fn::cuOccupancyMaxPotentialBlockSizeWithFlags:
      return LibraryCall(fn, rd, out);
    case Fn::cuLaunchKernel:
    case Fn::cuLaunchKernel_ptsz:
    case Fn::cuLaunchCooperativeKernel:
    case Fn::cuLaunchCooperativeKernel_ptsz:
    case Fn::cuLaunchKernelEx:
    case Fn::cuLaunchKernelEx_ptsz:
      return LaunchCall(fn, rd);
    // The capture mode of the calling client thread, sent (fire-and-forget) when it changes:
    // libraries switch to relaxed around calls that are unsafe during a global capture
    // (cuMemAlloc in PyTorch's allocator), and this thread makes those calls for them.
    case Fn::cuThreadExchangeStreamCaptureMode: {
      uint32_t mode = 0;
      if (!rd.U32(&mode) || !rd.Finish() || mode > CU_STREAM_CAPTURE_MODE_RELAXED) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      auto m = static_cast<CUstreamCaptureMode>(mode);
      return CALL(cuThreadExchangeStreamCaptureMode, &m);
    }
    case Fn::cuOccupancyMaxActiveClusters:
    case Fn::cuOccupancyMaxPotentialClusterSize:
      return ClusterOccupancy(fn, rd, out);
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

void Session::HostFuncTrampoline(void* arg) {
  auto* a = static_cast<HostFuncArg*>(arg);
  a->self->HostFuncReached(a->id);
  delete a;
}

void Session::HostNodeTrampoline(void* arg) {
  auto* a = static_cast<HostFuncArg*>(arg);
  a->self->graph_host_.BeforeHostNode(arg);  // what the graph's copies wrote before this node
  a->self->HostFuncReached(a->id, true);
}

uint64_t Session::ClientHostAddress(const void* local) const {
  const auto* p = static_cast<const uint8_t*>(local);
  for (const auto& [base, r] : regions_) {
    if (p >= r.local && p < r.local + r.length) return base + static_cast<uint64_t>(p - r.local);
  }
  uint64_t addr = 0;
  if (graph_host_.ClientAddress(local, &addr)) return addr;
  return reinterpret_cast<uint64_t>(local);  // mirrored memory: the same address on both sides
}

// Sent from whichever thread the driver releases the object on; nothing waits for an answer.
void Session::UserObjectReleased(uint64_t id) {
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(id);
  OutFrame f;
  f.opcode = remote::kEvtHostFunc;
  f.sequence = event_seq_++;
  f.payload = w.data();
  f.payload_length = static_cast<uint32_t>(w.size());
  (void)t_->Send(f);  // thread-safe; a client that is gone has nothing left to run
}

void Session::HostNodeFunction(uint64_t id, CUhostFn* fn, void** arg) {
  std::unique_ptr<HostFuncArg>& a = host_node_args_[id];
  if (!a) a.reset(new HostFuncArg{this, id});
  *fn = &Session::HostNodeTrampoline;
  *arg = a.get();
}


// ---- host regions and zero-copy bulk

Session::HostRegion* Session::FindRegion(uint64_t host, uint64_t n, uint64_t* base) {
  auto it = regions_.upper_bound(host);
  if (it == regions_.begin()) return nullptr;
  --it;
  const uint64_t off = host - it->first;
  if (off >= it->second.length || n > it->second.length - off) return nullptr;
  if (base) *base = it->first;
  return &it->second;
}

CUresult Session::HostRegionCall(uint16_t op, Reader& rd, Writer& out) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (op == remote::kOpHostRegionMap) {
    uint64_t id = 0, addr = 0, len = 0;
    uint32_t flags = 0;
    rd.U64(&id);
    rd.U64(&addr);
    rd.U64(&len);
    rd.U32(&flags);
    const bool managed = (flags & remote::kRegionManaged) != 0;
    flags &= ~remote::kRegionManaged;
    if (!t_->CanShareHostMemory()) return CUDA_ERROR_NOT_SUPPORTED;
    // Take the offered descriptor whatever the message says: offers are consumed in order.
    int fd = -1;
    TransportStatus ts = t_->TakeHostMemory(id, 1000, &fd);
    if (!ts.ok()) {
      SessionLog("host region %llu refused: %s", static_cast<unsigned long long>(id), ts.message());
      return CUDA_ERROR_INVALID_VALUE;
    }
    struct Closer {
      int fd;
      ~Closer() { close(fd); }
    } closer{fd};
    const char* why = nullptr;
    struct stat sb;
    if (!rd.Finish()) why = "malformed message";
    else if (!initialised_) why = "the driver is not initialised";
    else if (len == 0 || addr == 0 || len % page || addr % page) why = "zero or unaligned range";
    else if (len > remote::kMaxHostRegionBytes || addr + len < addr) why = "range too large";
    else if (flags & ~(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                       CU_MEMHOSTALLOC_WRITECOMBINED)) why = "unknown flags";
    else if (fstat(fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) < len) {
      why = "the shared memory is smaller than the range";
    } else if (region_ids_.count(id)) {
      why = "region id already in use";
    } else if (FindRegion(addr, 1) ||
               regions_.lower_bound(addr) != regions_.upper_bound(addr + len - 1)) {
      why = "range overlaps a region of this session";
    }
    if (why) {
      SessionLog("host region %llu [0x%llx, +%llu) refused: %s", static_cast<unsigned long long>(id),
          static_cast<unsigned long long>(addr), static_cast<unsigned long long>(len), why);
      return CUDA_ERROR_INVALID_VALUE;
    }
    SessionHostMemory::Charge charge;
    CUresult charged = managed ? host_mem_.ChargeManaged(len, &charge)
                               : host_mem_.ChargePinned(len, "page-locked memory", &charge);
    if (charged != CUDA_SUCCESS) return charged;
    // The same virtual address as the client when it is free here (never replacing a mapping);
    // elsewhere otherwise, and addresses are translated.
    void* p = mmap(As<void*>(addr), len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE,
                   fd, 0);
    const bool same = p != MAP_FAILED && H(p) == addr;
    if (p != MAP_FAILED && !same) munmap(p, len);
    if (!same) p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      host_mem_.Release(&charge);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    // Under unified addressing page-locked memory is portable and mapped whatever the flags say.
    unsigned reg = 0;
    if ((flags & CU_MEMHOSTALLOC_PORTABLE) || unified_addressing_) reg |= CU_MEMHOSTREGISTER_PORTABLE;
    if ((flags & CU_MEMHOSTALLOC_DEVICEMAP) || unified_addressing_) reg |= CU_MEMHOSTREGISTER_DEVICEMAP;
    CUresult r = CALL(cuMemHostRegister_v2, p, len, reg);
    if (r != CUDA_SUCCESS) {
      munmap(p, len);
      host_mem_.Release(&charge);
      return r;
    }
    CUdeviceptr dptr = 0;
    if (CALL(cuMemHostGetDevicePointer_v2, &dptr, p, 0) != CUDA_SUCCESS) dptr = 0;
    HostRegion& region = regions_[addr];
    region.id = id;
    region.length = len;
    region.local = static_cast<uint8_t*>(p);
    region.same_address = same;
    region.charge = charge;
    region.reg = reg;
    region_ids_[id] = addr;
    if (same && dptr == addr) mapped_host_[addr] = len;
    out.U8(same ? 1 : 0);
    out.U64(dptr);
    return CUDA_SUCCESS;
  }
  if (op == remote::kOpHostRegionUnmap) {
    uint64_t id = 0;
    rd.U64(&id);
    auto idit = region_ids_.find(id);
    if (!rd.Finish() || idit == region_ids_.end()) return CUDA_ERROR_INVALID_VALUE;
    auto it = regions_.find(idit->second);
    // As cuMemFreeHost: nothing may still be copying from or to it.
    CALL(cuCtxSynchronize);
    CUresult r = CALL(cuMemHostUnregister, it->second.local);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED) return r;
    munmap(it->second.local, it->second.length);
    host_mem_.Release(&it->second.charge);
    mapped_host_.erase(it->first);
    regions_.erase(it);
    region_ids_.erase(idit);
    return CUDA_SUCCESS;
  }
  // kOpHostRegionCopy
  uint8_t dir = 0, sync = 0;
  uint64_t dptr = 0, host = 0, n = 0, stream = 0;
  rd.U8(&dir);
  rd.U8(&sync);
  rd.U64(&dptr);
  rd.U64(&host);
  rd.U64(&n);
  rd.U64(&stream);
  if (!initialised_) return CUDA_ERROR_NOT_INITIALIZED;
  if (!rd.Finish() || dir > remote::kRegionToHost || sync > 1 || n == 0) return CUDA_ERROR_INVALID_VALUE;
  uint64_t base = 0;
  HostRegion* region = FindRegion(host, n, &base);
  // Mirrored memory (registered or mapped memory the worker cannot share) is at the same address
  // here: the copy uses it directly, and the bytes travel only as the mirror's changes.
  const bool mirrored = region == nullptr && mirrors_.Contains(host, n);
  if ((region == nullptr && !mirrored) || !Range(dptr, n)) return CUDA_ERROR_INVALID_VALUE;
  if (!Stream(stream)) return CUDA_ERROR_INVALID_HANDLE;
  uint8_t* local = mirrored ? reinterpret_cast<uint8_t*>(host) : region->local + (host - base);
  CUstream st = As<CUstream>(stream);
  if (dir == remote::kRegionToDevice) {
    return sync ? CALL(cuMemcpyHtoD_v2, dptr, local, n) : CALL(cuMemcpyHtoDAsync_v2, dptr, local, n, st);
  }
  return sync ? CALL(cuMemcpyDtoH_v2, local, dptr, n) : CALL(cuMemcpyDtoHAsync_v2, local, dptr, n, st);
}

void Session::RegisterArena() {
  if (arena_state_ != 0) return;
  uint64_t len = 0;
  if (!t_->BulkMemory(&arena_base_, &len)) {
    arena_state_ = -1;
    return;
  }
  CUresult r = CALL(cuMemHostRegister_v2, arena_base_, len, CU_MEMHOSTREGISTER_PORTABLE);
  arena_state_ = r == CUDA_SUCCESS ? 1 : -1;
  if (r != CUDA_SUCCESS) {
    host_mem_.Release(&arena_charge_);
    SessionLog("cannot register the transport's bulk memory with the driver (error %d): pageable copies "
        "are staged", static_cast<int>(r));
  }
}

bool Session::Capturing(CUstream st) {
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  return d_.cuStreamIsCapturing && d_.cuStreamIsCapturing(st, &cs) == CUDA_SUCCESS &&
         cs != CU_STREAM_CAPTURE_STATUS_NONE;
}

namespace {
struct HeldBulk {
  transport::Transport* t;
  uint64_t token;
};
void ReleaseHeldBulk(void* arg) {
  auto* h = static_cast<HeldBulk*>(arg);
  h->t->ReleaseBulk(h->token);
  delete h;
}
}  // namespace

bool Session::CopyFromHeldBulk(uint64_t dst, const uint8_t* bulk, uint64_t n, CUstream st,
                               CUresult* r) {
  // A capturing stream would record the release too: stage instead.
  if (Capturing(st)) return false;
  RegisterArena();
  uint64_t token = 0;
  if (!t_->HoldBulk(&token)) return false;
  *r = CALL(cuMemcpyHtoDAsync_v2, dst, bulk, n, st);
  auto* held = *r == CUDA_SUCCESS ? new (std::nothrow) HeldBulk{t_.get(), token} : nullptr;
  if (held != nullptr && CALL(cuLaunchHostFunc, st, &ReleaseHeldBulk, held) == CUDA_SUCCESS) {
    return true;
  }
  // No release in stream order: wait for the copy, then release now.
  if (*r == CUDA_SUCCESS) CALL(cuStreamSynchronize, st);
  delete held;
  t_->ReleaseBulk(token);
  return true;
}

bool Session::SendCopyData(uint64_t offset, const void* data, uint64_t n, bool reserved) {
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  w.U64(cur_seq_);
  w.U64(offset);
  OutFrame f;
  f.opcode = remote::kEvtCopyData;
  f.sequence = event_seq_++;
  f.payload = w.data();
  f.payload_length = static_cast<uint32_t>(w.size());
  f.bulk = data;
  f.bulk_length = n;
  f.bulk_reserved = reserved;
  return t_->Send(f).ok();
}

CUresult Session::CopyToClient(uint64_t src, uint64_t n, CUstream st, bool async) {
  RegisterArena();
  if (arena_state_ != 1) {
    // Staged through reply_bulk_, one slice at a time.
    const uint64_t slice = std::min<uint64_t>(t_->max_bulk_bytes(), 8ull << 20);
    for (uint64_t off = 0; off < n; off += slice) {
      const uint64_t len = std::min(slice, n - off);
      if (reply_bulk_.size() < len) reply_bulk_.resize(len);
      CUresult r = async ? CALL(cuMemcpyDtoHAsync_v2, reply_bulk_.data(), src + off, len, st)
                         : CALL(cuMemcpyDtoH_v2, reply_bulk_.data(), src + off, len);
      if (r == CUDA_SUCCESS && async) r = CALL(cuStreamSynchronize, st);
      if (r != CUDA_SUCCESS) return r;
      if (!SendCopyData(off, reply_bulk_.data(), len, false)) return CUDA_ERROR_UNKNOWN;
    }
    return CUDA_SUCCESS;
  }
  // Zero copy: the DMA writes into reserved slices of the transport's (registered) memory, up to
  // kDepth slices in flight; each goes to the client once its DMA completed, in order. A
  // synchronous copy's first slice is a synchronous cuMemcpyDtoH (it waits for the blocking
  // streams, as the legacy stream does); the rest follow it on the legacy stream.
  // TFUSION_COPY_SLICE_KIB (64..65536) and TFUSION_COPY_DEPTH (1..16) tune the pipeline.
  static const uint64_t slice_setting = [] {
    const char* v = getenv("TFUSION_COPY_SLICE_KIB");
    const unsigned long kib = v ? strtoul(v, nullptr, 10) : 0;
    return kib >= 64 && kib <= 65536 ? static_cast<uint64_t>(kib) << 10 : remote::kPipelinedCopySlice;
  }();
  static const size_t kDepth = [] {
    const char* v = getenv("TFUSION_COPY_DEPTH");
    const unsigned long d = v ? strtoul(v, nullptr, 10) : 0;
    return d >= 1 && d <= 16 ? static_cast<size_t>(d) : size_t{4};
  }();
  const uint64_t slice = std::min<uint64_t>(t_->max_bulk_bytes(), slice_setting);
  while (copy_events_.size() < kDepth) {
    CUevent e = nullptr;
    if (CALL(cuEventCreate, &e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) break;
    copy_events_.push_back(e);
  }
  struct InFlight {
    void* data;
    uint64_t off, len;
    CUevent done;  // nullptr: nothing to wait for
  };
  std::deque<InFlight> q;
  // TFUSION_COPY_PROFILE=1: where the time of a large copy goes, logged per copy.
  static const bool profile = [] {
    const char* v = getenv("TFUSION_COPY_PROFILE");
    return v != nullptr && *v == '1';
  }();
  int64_t t_start = profile ? transport::MonotonicNowNs() : 0, t_reserve = 0, t_issue = 0,
          t_wait = 0, t_send = 0, t0 = 0;
  auto tick = [&](int64_t* acc) {
    if (!profile) return;
    const int64_t now = transport::MonotonicNowNs();
    if (acc) *acc += now - t0;
    t0 = now;
  };
  CUresult r = CUDA_SUCCESS;
  uint64_t next = 0;
  size_t ev = 0;
  while ((r == CUDA_SUCCESS && next < n) || !q.empty()) {
    while (r == CUDA_SUCCESS && next < n && q.size() < kDepth) {
      const uint64_t len = std::min(slice, n - next);
      void* data = nullptr;
      // Waiting for space only when nothing is in flight: the client frees space as it reads.
      tick(nullptr);
      TransportStatus ts = t_->ReserveBulk(len, q.empty() ? 10000 : 0, &data);
      tick(&t_reserve);
      if (ts.code() == transport::TransportErrc::kTimeout && !q.empty()) break;
      if (!ts.ok()) return CUDA_ERROR_UNKNOWN;  // the client is gone or stuck
      CUevent done = nullptr;
      CUresult cr;
      if (!async && next == 0) {
        cr = CALL(cuMemcpyDtoH_v2, data, src, len);
      } else {
        cr = CALL(cuMemcpyDtoHAsync_v2, data, src + next, len, st);
        if (cr == CUDA_SUCCESS && !copy_events_.empty()) {
          done = copy_events_[ev++ % copy_events_.size()];
          if (CALL(cuEventRecord, done, st) != CUDA_SUCCESS) {
            done = nullptr;
            cr = CALL(cuStreamSynchronize, st);
          }
        } else if (cr == CUDA_SUCCESS) {
          cr = CALL(cuStreamSynchronize, st);
        }
      }
      if (cr != CUDA_SUCCESS) r = cr;  // the reserved slice still goes out, in order
      tick(&t_issue);
      q.push_back({data, next, len, done});
      next += len;
    }
    InFlight f = q.front();
    q.pop_front();
    tick(nullptr);
    if (f.done != nullptr) {
      CUresult er = CALL(cuEventSynchronize, f.done);
      if (er != CUDA_SUCCESS && r == CUDA_SUCCESS) r = er;
    }
    tick(&t_wait);
    if (!SendCopyData(f.off, f.data, f.len, true)) return CUDA_ERROR_UNKNOWN;
    tick(&t_send);
  }
  if (profile && n >= (1u << 20)) {
    SessionLog("copy profile: DtoH %llu bytes: %.3f ms; waiting for bulk space %.3f, issuing %.3f, "
        "waiting for the DMA %.3f, sending %.3f",
        static_cast<unsigned long long>(n), (transport::MonotonicNowNs() - t_start) / 1e6,
        t_reserve / 1e6, t_issue / 1e6, t_wait / 1e6, t_send / 1e6);
  }
  return r;
}

void Session::HostFuncReached(uint64_t id, bool node) {
  static const bool trace = [] {
    const char* t = getenv("TFUSION_WORKER_TRACE");
    return t != nullptr && *t == '1';
  }();
  if (trace) SessionLog("trace: host function %llu reached", static_cast<unsigned long long>(id));
  console_.Forward(t_.get(), &event_seq_);  // what was printed before the callback comes first
  mirrors_.Pull(t_.get(), &event_seq_);     // the host function sees what the stream wrote
  uint8_t buf[12];
  Writer w(buf, sizeof(buf));
  w.U64(id);
  if (node) w.U32(remote::kHostFuncNodeRun);  // the client keeps the function for the next run
  OutFrame f;
  f.opcode = remote::kEvtHostFunc;
  f.sequence = event_seq_++;
  f.payload = w.data();
  f.payload_length = static_cast<uint32_t>(w.size());
  (void)t_->Send(f);  // thread-safe; a dead client releases us through hf_stopping_
  std::unique_lock<std::mutex> lk(hf_mu_);
  hf_cv_.wait(lk, [&] { return hf_done_.count(id) != 0 || hf_stopping_; });
  if (auto it = hf_done_.find(id); it != hf_done_.end()) hf_done_.erase(it);
  --hf_outstanding_;
  hf_cv_.notify_all();
}

void Session::HostFuncDone(uint64_t id) {
  std::lock_guard<std::mutex> g(hf_mu_);
  hf_done_.insert(id);
  hf_cv_.notify_all();
}

bool Session::DrainHostFuncs() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(hf_mu_);
      if (hf_outstanding_ == 0) return true;
    }
    InFrame in;
    TransportStatus st = t_->Receive(&in, 10);
    if (st.code() == transport::TransportErrc::kTimeout) continue;
    if (!st.ok()) return false;
    Reader rd(in.payload, in.payload_length);
    uint64_t id = 0;
    if (in.header.opcode == remote::kOpHostFuncDone && rd.U64(&id) && rd.Finish()) {
      HostFuncDone(id);
    } else if (in.header.opcode == remote::kOpMirrorData) {
      // What a host function wrote into mirrors, sent before its acknowledgement.
      MirrorData(in);
    } else {
      SessionLog("unexpected frame 0x%04x while the client waits for a reply: ignored", in.header.opcode);
    }
  }
}

// A launch's arguments (u32 mode + encoding) for function f. Pointers point into payload_, our
// private copy, which outlives the call; the driver copies arguments at launch (and when a graph
// node is added or updated).
CUresult Session::DecodeLaunchArgs(Reader& rd, uint64_t f, LaunchArgs* a) {
  uint32_t mode = 0;
  if (!rd.U32(&mode)) return CUDA_ERROR_INVALID_VALUE;
  auto fit = functions_.find(f);
  if (fit == functions_.end()) return CUDA_ERROR_INVALID_HANDLE;
  const FunctionEntry& fe = fit->second;
  if (mode == remote::kLaunchParams) {
    uint32_t n = 0;
    // The driver reads every parameter the kernel declares: the client must send exactly
    // those, each of its size, or the session would read past what arrived.
    if (!rd.U32(&n) || !fe.layout_known || n != fe.sizes.size()) return CUDA_ERROR_INVALID_VALUE;
    for (uint32_t i = 0; i < n; ++i) {
      const uint8_t* p = nullptr;
      uint32_t len = 0;
      if (!rd.Blob(&p, &len, remote::kMaxKernelParamBytes) || len != fe.sizes[i]) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      a->params[i] = const_cast<uint8_t*>(p);
    }
    a->kernel_params = a->params;
  } else if (mode == remote::kLaunchExtraBuffer) {
    const uint8_t* p = nullptr;
    uint32_t len = 0;
    if (!rd.Blob(&p, &len, remote::kMaxKernelParamBytes)) return CUDA_ERROR_INVALID_VALUE;
    a->extra_size = len;
    a->extra[0] = CU_LAUNCH_PARAM_BUFFER_POINTER;
    a->extra[1] = const_cast<uint8_t*>(p);
    a->extra[2] = CU_LAUNCH_PARAM_BUFFER_SIZE;
    a->extra[3] = &a->extra_size;
    a->extra[4] = CU_LAUNCH_PARAM_END;
    a->extra_p = a->extra;
  } else if (mode != remote::kLaunchNoParams || (fe.layout_known && !fe.sizes.empty())) {
    return CUDA_ERROR_INVALID_VALUE;  // a kernel with parameters launched without them
  }
  return CUDA_SUCCESS;
}

// Kernel node parameters: u64 function, u32 grid[3], u32 block[3], u32 shared bytes, arguments.
CUresult Session::DecodeKernelNode(Reader& rd, LaunchArgs* a, CUDA_KERNEL_NODE_PARAMS* p) {
  uint64_t f = 0;
  rd.U64(&f);
  rd.U32(&p->gridDimX);
  rd.U32(&p->gridDimY);
  rd.U32(&p->gridDimZ);
  rd.U32(&p->blockDimX);
  rd.U32(&p->blockDimY);
  rd.U32(&p->blockDimZ);
  if (!rd.U32(&p->sharedMemBytes)) return CUDA_ERROR_INVALID_VALUE;
  if (!Function(f)) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = DecodeLaunchArgs(rd, f, a); r != CUDA_SUCCESS) return r;
  if (!rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
  p->func = As<CUfunction>(f);
  p->kernelParams = a->kernel_params;
  p->extra = a->extra_p;
  return CUDA_SUCCESS;
}

// cuLaunchKernel(_ptsz), cuLaunchCooperativeKernel(_ptsz), cuLaunchKernelEx(_ptsz).
CUresult Session::LaunchCall(Fn fn, Reader& rd) {
  uint64_t f = 0, s = 0;
  uint32_t g[3] = {}, b[3] = {}, shmem = 0;
  rd.U64(&f);
  for (auto& v : g) rd.U32(&v);
  for (auto& v : b) rd.U32(&v);
  rd.U32(&shmem);
  rd.U64(&s);
  const bool ex = fn == Fn::cuLaunchKernelEx || fn == Fn::cuLaunchKernelEx_ptsz;
  CUlaunchAttribute attrs[remote::kMaxLaunchAttributes];
  uint32_t nattrs = 0;
  if (ex) {
    if (!rd.U32(&nattrs) || nattrs > remote::kMaxLaunchAttributes) return CUDA_ERROR_INVALID_VALUE;
    for (uint32_t i = 0; i < nattrs; ++i) {
      CUlaunchAttribute& a = attrs[i];
      memset(&a, 0, sizeof(a));
      uint32_t id = 0;
      if (!rd.U32(&id)) return CUDA_ERROR_INVALID_VALUE;
      a.id = static_cast<CUlaunchAttributeID>(id);
      if (id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT || id == CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT) {
        uint64_t e = 0;
        int32_t flags = 0, trigger = 0;
        rd.U64(&e);
        rd.I32(&flags);
        if (!rd.I32(&trigger)) return CUDA_ERROR_INVALID_VALUE;
        if (!Event(e)) return CUDA_ERROR_INVALID_HANDLE;
        if (id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT) {
          a.value.programmaticEvent.event = As<CUevent>(e);
          a.value.programmaticEvent.flags = flags;
          a.value.programmaticEvent.triggerAtBlockStart = trigger;
        } else {
          a.value.launchCompletionEvent.event = As<CUevent>(e);
          a.value.launchCompletionEvent.flags = flags;
        }
      } else if (id == CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW) {
        uint64_t base = 0, bytes = 0;
        uint32_t ratio = 0, hit = 0, miss = 0;
        rd.U64(&base);
        rd.U64(&bytes);
        rd.U32(&ratio);
        rd.U32(&hit);
        if (!rd.U32(&miss)) return CUDA_ERROR_INVALID_VALUE;
        a.value.accessPolicyWindow.base_ptr = As<void*>(base);  // a cache hint, never dereferenced
        a.value.accessPolicyWindow.num_bytes = bytes;
        memcpy(&a.value.accessPolicyWindow.hitRatio, &ratio, sizeof(ratio));
        a.value.accessPolicyWindow.hitProp = static_cast<CUaccessProperty>(hit);
        a.value.accessPolicyWindow.missProp = static_cast<CUaccessProperty>(miss);
      } else if (remote::IsPlainLaunchAttribute(id)) {
        if (!rd.Bytes(&a.value, sizeof(a.value))) return CUDA_ERROR_INVALID_VALUE;
      } else {
        return CUDA_ERROR_NOT_SUPPORTED;
      }
    }
  }
  if (!Stream(s) || !Function(f)) return CUDA_ERROR_INVALID_HANDLE;
  LaunchArgs la;
  if (CUresult r = DecodeLaunchArgs(rd, f, &la); r != CUDA_SUCCESS) return r;
  if (!rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
  void** kernel_params = la.kernel_params;
  void** extra_p = la.extra_p;
  CUfunction func = As<CUfunction>(f);
  CUstream st = As<CUstream>(s);
  switch (fn) {
    case Fn::cuLaunchKernel:
    case Fn::cuLaunchKernel_ptsz: {
      auto launch = fn == Fn::cuLaunchKernel ? d_.cuLaunchKernel : d_.cuLaunchKernel_ptsz;
      if (launch == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
      return launch(func, g[0], g[1], g[2], b[0], b[1], b[2], shmem, st, kernel_params, extra_p);
    }
    case Fn::cuLaunchCooperativeKernel:
    case Fn::cuLaunchCooperativeKernel_ptsz: {
      if (extra_p != nullptr) return CUDA_ERROR_INVALID_VALUE;
      auto launch = fn == Fn::cuLaunchCooperativeKernel ? d_.cuLaunchCooperativeKernel
                                                        : d_.cuLaunchCooperativeKernel_ptsz;
      if (launch == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
      return launch(func, g[0], g[1], g[2], b[0], b[1], b[2], shmem, st, kernel_params);
    }
    default: {
      CUlaunchConfig cfg = {};
      cfg.gridDimX = g[0];
      cfg.gridDimY = g[1];
      cfg.gridDimZ = g[2];
      cfg.blockDimX = b[0];
      cfg.blockDimY = b[1];
      cfg.blockDimZ = b[2];
      cfg.sharedMemBytes = shmem;
      cfg.hStream = st;
      cfg.attrs = nattrs ? attrs : nullptr;
      cfg.numAttrs = nattrs;
      auto launch = fn == Fn::cuLaunchKernelEx ? d_.cuLaunchKernelEx : d_.cuLaunchKernelEx_ptsz;
      if (launch == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
      return launch(&cfg, func, kernel_params, extra_p);
    }
  }
}

Session::FunctionEntry& Session::RecordModuleFunction(uint64_t m, uint64_t f) {
  FunctionEntry& fe = functions_[f];
  fe = FunctionEntry();
  if (auto mod = modules_.find(m); mod != modules_.end()) {
    mod->second.insert(f);
    fe.module = m;
  } else {
    fe.library = library_modules_[m];
    libraries_[fe.library].functions.insert(f);
  }
  return fe;
}

void Session::WriteFunctionInfo(uint64_t h, bool kernel, FunctionEntry& fe, Writer& out) {
  // A library is loaded before any context exists when a program's first CUDA call is a launch
  // (cudart loads its image and looks the kernel up, then retains the primary context): the
  // driver then fails cuKernelGetParamInfo with CUDA_ERROR_INVALID_CONTEXT, and the kernel's
  // attributes with it. Such a kernel is described in device 0's primary context, which the
  // client is about to retain anyway.
  CUcontext current = nullptr;
  bool pushed = false;
  if (kernel && CALL(cuCtxGetCurrent, &current) == CUDA_SUCCESS && current == nullptr) {
    if (lookup_ctx_ == nullptr && CALL(cuDevicePrimaryCtxRetain, &lookup_ctx_, 0) != CUDA_SUCCESS) {
      lookup_ctx_ = nullptr;
    }
    pushed = lookup_ctx_ != nullptr && CALL(cuCtxPushCurrent_v2, lookup_ctx_) == CUDA_SUCCESS;
  }
  CUdevice dev = 0;
  CALL(cuCtxGetDevice, &dev);
  auto param_info = [&](size_t i, size_t* off, size_t* size) {
    if (kernel && d_.cuKernelGetParamInfo) return d_.cuKernelGetParamInfo(As<CUkernel>(h), i, off, size);
    return CALL(cuFuncGetParamInfo, As<CUfunction>(h), i, off, size);
  };
  auto attribute = [&](int* v, CUfunction_attribute a) {
    if (kernel && d_.cuKernelGetAttribute) return d_.cuKernelGetAttribute(v, a, As<CUkernel>(h), dev);
    return CALL(cuFuncGetAttribute, v, a, As<CUfunction>(h));
  };
  // The parameter layout, so that the client can serialise kernelParams by size.
  std::vector<std::pair<size_t, size_t>> layout;
  CUresult pr = CUDA_SUCCESS;
  for (size_t i = 0; i < remote::kMaxKernelParams; ++i) {
    size_t off = 0, size = 0;
    pr = param_info(i, &off, &size);
    if (pr != CUDA_SUCCESS) break;
    layout.emplace_back(off, size);
  }
  fe.sizes.clear();
  fe.layout_known = false;
  if (pr != CUDA_ERROR_INVALID_VALUE) {
    if (!told_unknown_layout_) {  // once per session: a module may hold many such functions
      told_unknown_layout_ = true;
      SessionLog("the driver does not describe the parameters of %s %#llx (parameter %zu: error %d): "
                 "the client cannot forward its kernelParams", kernel ? "kernel" : "function",
                 static_cast<unsigned long long>(h), layout.size(), static_cast<int>(pr));
    }
    out.U32(remote::kUnknownParamCount);
  } else {
    fe.layout_known = true;
    for (auto [off, size] : layout) fe.sizes.push_back(size);
    out.U32(static_cast<uint32_t>(layout.size()));
    for (auto [off, size] : layout) {
      out.U64(off);
      out.U64(size);
    }
  }
  // Every function attribute, so that cuFuncGetAttribute is answered by the client.
  out.U32(CU_FUNC_ATTRIBUTE_MAX);
  for (int a = 0; a < CU_FUNC_ATTRIBUTE_MAX; ++a) {
    int v = 0;
    if (attribute(&v, static_cast<CUfunction_attribute>(a)) != CUDA_SUCCESS) v = 0;
    out.I32(v);
  }
  if (pushed) {
    CUcontext popped = nullptr;
    CALL(cuCtxPopCurrent_v2, &popped);
  }
}

// Forgets a library's kernels, functions and modules (they die with it).
void Session::EraseLibrary(uint64_t lib) {
  auto it = libraries_.find(lib);
  if (it == libraries_.end()) return;
  auto erase_owned = [&](uint64_t h) {
    auto f = functions_.find(h);
    if (f != functions_.end() && f->second.library == lib) functions_.erase(f);
  };
  for (uint64_t k : it->second.kernels) {
    kernels_.erase(k);
    erase_owned(k);
    handles_.RetireReal(HandleKind::kKernel, k);
  }
  for (uint64_t f : it->second.functions) {
    erase_owned(f);
    handles_.RetireReal(HandleKind::kFunction, f);
  }
  for (uint64_t m : it->second.modules) {
    library_modules_.erase(m);
    handles_.RetireReal(HandleKind::kModule, m);
  }
  handles_.RetireReal(HandleKind::kLibrary, lib);
  EraseGlobals(lib);
  libraries_.erase(it);
}

// Libraries (context-independent images) and their kernels. Every handle is checked against the
// session's tables. A kernel is also recorded as a function: CUDA accepts a CUkernel cast to
// CUfunction in launches.
CUresult Session::LibraryCall(Fn fn, Reader& rd, Writer& out) {
  auto record_kernel = [&](uint64_t lib, uint64_t k) {
    libraries_[lib].kernels.insert(k);
    kernels_[k] = lib;
    FunctionEntry& fe = functions_[k];
    fe = FunctionEntry();
    fe.library = lib;
    WriteFunctionInfo(k, true, fe, out);
  };
  switch (fn) {
    case Fn::cuLibraryLoadData: {
      uint64_t lo = 0, hi = 0, n = 0;
      uint32_t njit = 0, nlib = 0;
      rd.U64(&lo);
      rd.U64(&hi);
      rd.U64(&n);
      rd.U32(&njit);
      if (!rd.U32(&nlib) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      auto it = images_.find({lo, hi});
      if (it == images_.end() || it->second.filled != n || it->second.bytes.size() != n) {
        return CUDA_ERROR_INVALID_IMAGE;
      }
      // JIT and library options are not forwarded (docs/remote.md): the client's log buffers and
      // pointers mean nothing here; the driver's defaults apply.
      CUlibrary lib = nullptr;
      CUresult r = CALL(cuLibraryLoadData, &lib, it->second.bytes.data(), nullptr, nullptr, 0,
                        nullptr, nullptr, 0);
      if (r != CUDA_SUCCESS) return r;
      libraries_[H(lib)];
      out.U64(Publish(HandleKind::kLibrary, H(lib)));
      return CUDA_SUCCESS;
    }
    case Fn::cuLibraryUnload: {
      uint64_t lib = 0;
      if (!rd.U64(&lib) || !rd.Finish() || !Library(lib)) return CUDA_ERROR_INVALID_HANDLE;
      CUresult r = CALL(cuLibraryUnload, As<CUlibrary>(lib));
      if (r == CUDA_SUCCESS) {
        EraseLibrary(lib);
        for (uint64_t f : handed_out_functions_) handles_.RetireReal(HandleKind::kFunction, f);
        handed_out_functions_.clear();
      }
      return r;
    }
    case Fn::cuLibraryGetKernel: {
      uint64_t lib = 0;
      const uint8_t* name = nullptr;
      uint32_t len = 0;
      rd.U64(&lib);
      if (!rd.Blob(&name, &len, remote::kMaxFunctionName) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      if (!Library(lib)) return CUDA_ERROR_INVALID_HANDLE;
      std::string kname(reinterpret_cast<const char*>(name), len);
      CUkernel k = nullptr;
      CUresult r = CALL(cuLibraryGetKernel, &k, As<CUlibrary>(lib), kname.c_str());
      if (r != CUDA_SUCCESS) return r;
      out.U64(Publish(HandleKind::kKernel, H(k)));
      record_kernel(lib, H(k));
      return CUDA_SUCCESS;
    }
    // A global variable: in U64 library or module, blob name; out U64 address, U64 size. The
    // range joins the session's valid device memory (copies to and from it) until its owner goes.
    case Fn::cuLibraryGetGlobal:
    case Fn::cuModuleGetGlobal_v2: {
      uint64_t owner = 0;
      const uint8_t* name = nullptr;
      uint32_t len = 0;
      rd.U64(&owner);
      if (!rd.Blob(&name, &len, remote::kMaxFunctionName) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      bool lib = fn == Fn::cuLibraryGetGlobal;
      if (lib ? !Library(owner) : !Module(owner)) {
        return CUDA_ERROR_INVALID_HANDLE;
      }
      std::string gname(reinterpret_cast<const char*>(name), len);
      CUdeviceptr p = 0;
      size_t bytes = 0;
      CUresult r = lib ? CALL(cuLibraryGetGlobal, &p, &bytes, As<CUlibrary>(owner), gname.c_str())
                       : CALL(cuModuleGetGlobal_v2, &p, &bytes, As<CUmodule>(owner), gname.c_str());
      if (r != CUDA_SUCCESS) return r;
      auto lm = library_modules_.find(owner);
      uint64_t keeper = (!lib && lm != library_modules_.end()) ? lm->second : owner;
      if (bytes > 0) globals_[p] = Global{bytes, keeper};
      out.U64(p);
      out.U64(bytes);
      return CUDA_SUCCESS;
    }
    case Fn::cuLibraryEnumerateKernels: {
      // Reply: u32 n, n x (u64 kernel, blob name, function info).
      uint64_t lib = 0;
      uint32_t num = 0;
      rd.U64(&lib);
      if (!rd.U32(&num) || !rd.Finish() || num == 0 || num > remote::kMaxLibraryKernels) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      if (!Library(lib)) return CUDA_ERROR_INVALID_HANDLE;
      unsigned count = 0;
      CUresult r = CALL(cuLibraryGetKernelCount, &count, As<CUlibrary>(lib));
      if (r != CUDA_SUCCESS) return r;
      std::vector<CUkernel> ks(num);
      r = CALL(cuLibraryEnumerateKernels, ks.data(), num, As<CUlibrary>(lib));
      if (r != CUDA_SUCCESS) return r;
      uint32_t n = std::min<uint32_t>(num, count);
      out.U32(n);
      for (uint32_t i = 0; i < n; ++i) {
        const char* kname = nullptr;
        if (CALL(cuKernelGetName, &kname, ks[i]) != CUDA_SUCCESS || kname == nullptr) kname = "";
        out.U64(Publish(HandleKind::kKernel, H(ks[i])));
        out.Blob(kname, static_cast<uint32_t>(strnlen(kname, remote::kMaxFunctionName)));
        record_kernel(lib, H(ks[i]));
      }
      return CUDA_SUCCESS;
    }
    case Fn::cuKernelGetFunction: {
      uint64_t k = 0;
      if (!rd.U64(&k) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      if (!Resolve(HandleKind::kKernel, k)) return CUDA_ERROR_INVALID_HANDLE;
      auto kit = kernels_.find(k);
      if (kit == kernels_.end()) return CUDA_ERROR_INVALID_HANDLE;
      CUfunction f = nullptr;
      CUresult r = CALL(cuKernelGetFunction, &f, As<CUkernel>(k));
      if (r != CUDA_SUCCESS) return r;
      if (H(f) != k) {
        FunctionEntry& fe = functions_[H(f)];
        fe = functions_[k];  // same kernel: same layout (the client copies its cache too)
        fe.library = kit->second;
      }
      libraries_[kit->second].functions.insert(H(f));
      out.U64(Publish(HandleKind::kFunction, H(f)));
      return CUDA_SUCCESS;
    }
    case Fn::cuKernelGetAttribute:
    case Fn::cuKernelSetAttribute: {
      int32_t attr = 0, value = 0, dev = 0;
      uint64_t k = 0;
      rd.I32(&attr);
      if (fn == Fn::cuKernelSetAttribute) rd.I32(&value);
      rd.U64(&k);
      if (!rd.I32(&dev) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      if (!Kernel(k)) return CUDA_ERROR_INVALID_HANDLE;
      if (!Device(dev)) return CUDA_ERROR_INVALID_DEVICE;
      auto a = static_cast<CUfunction_attribute>(attr);
      if (fn == Fn::cuKernelSetAttribute) return CALL(cuKernelSetAttribute, a, value, As<CUkernel>(k), dev);
      int v = 0;
      CUresult r = CALL(cuKernelGetAttribute, &v, a, As<CUkernel>(k), dev);
      out.I32(v);
      return r;
    }
    case Fn::cuFuncSetAttribute: {
      uint64_t f = 0;
      int32_t attr = 0, value = 0;
      rd.U64(&f);
      rd.I32(&attr);
      if (!rd.I32(&value) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      if (!Function(f) || !functions_.count(f)) return CUDA_ERROR_INVALID_HANDLE;
      return CALL(cuFuncSetAttribute, As<CUfunction>(f), static_cast<CUfunction_attribute>(attr), value);
    }
    // in U64 function or kernel, U32 CUfunc_cache (and for a kernel I32 device).
    // The largest potential block size of a function (or of a kernel, which the driver accepts in
    // its place) without a block-size-to-shared-memory callback (with one, the client searches
    // itself through the generated active-blocks query): in U64 function, I32 block size limit,
    // U64 dynamic shared memory, U32 flags; out I32 grid, I32 block size.
    case Fn::cuOccupancyMaxPotentialBlockSize:
    case Fn::cuOccupancyMaxPotentialBlockSizeWithFlags: {
      uint64_t f = 0, smem = 0;
      int32_t limit = 0;
      uint32_t flags = 0;
      rd.U64(&f);
      rd.I32(&limit);
      rd.U64(&smem);
      if (!rd.U32(&flags) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
      if (!Function(f) || (!functions_.count(f) && !kernels_.count(f))) return CUDA_ERROR_INVALID_HANDLE;
      CUfunction func = As<CUfunction>(f);
      int grid = 0, block = 0;
      CUresult r = fn == Fn::cuOccupancyMaxPotentialBlockSize
                       ? CALL(cuOccupancyMaxPotentialBlockSize, &grid, &block, func, nullptr, smem, limit)
                       : CALL(cuOccupancyMaxPotentialBlockSizeWithFlags, &grid, &block, func, nullptr,
                              smem, limit, flags);
      out.I32(grid);
      out.I32(block);
      return r;
    }
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

// Cluster occupancy: the launch configuration as the client sends it for these queries (grid,
// block, shared memory, stream, plain-valued attributes), checked like a launch's.
CUresult Session::ClusterOccupancy(Fn fn, Reader& rd, Writer& out) {
  uint64_t f = 0, s = 0;
  uint32_t g[3] = {}, b[3] = {}, shmem = 0, nattrs = 0;
  rd.U64(&f);
  for (uint32_t& v : g) rd.U32(&v);
  for (uint32_t& v : b) rd.U32(&v);
  rd.U32(&shmem);
  rd.U64(&s);
  if (!rd.U32(&nattrs) || nattrs > remote::kMaxLaunchAttributes) return CUDA_ERROR_INVALID_VALUE;
  CUlaunchAttribute attrs[remote::kMaxLaunchAttributes] = {};
  for (uint32_t i = 0; i < nattrs; ++i) {
    uint32_t id = 0;
    if (!rd.U32(&id) || !remote::IsPlainLaunchAttribute(id)) return CUDA_ERROR_INVALID_VALUE;
    attrs[i].id = static_cast<CUlaunchAttributeID>(id);
    if (!rd.Bytes(&attrs[i].value, sizeof(attrs[i].value))) return CUDA_ERROR_INVALID_VALUE;
  }
  if (!rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
  if (!Function(f) || (!functions_.count(f) && !kernels_.count(f))) return CUDA_ERROR_INVALID_HANDLE;
  if (!Stream(s)) return CUDA_ERROR_INVALID_HANDLE;
  CUlaunchConfig cfg = {};
  cfg.gridDimX = g[0];
  cfg.gridDimY = g[1];
  cfg.gridDimZ = g[2];
  cfg.blockDimX = b[0];
  cfg.blockDimY = b[1];
  cfg.blockDimZ = b[2];
  cfg.sharedMemBytes = shmem;
  cfg.hStream = As<CUstream>(s);
  cfg.attrs = nattrs ? attrs : nullptr;
  cfg.numAttrs = nattrs;
  int v = 0;
  CUresult r = fn == Fn::cuOccupancyMaxActiveClusters
                   ? CALL(cuOccupancyMaxActiveClusters, &v, As<CUfunction>(f), &cfg)
                   : CALL(cuOccupancyMaxPotentialClusterSize, &v, As<CUfunction>(f), &cfg);
  out.I32(v);
  return r;
}

// Virtual memory management (reservations and handles are made, queried and released by generated
// calls with the hooks above and below). The session keeps
// what it reserved, created and mapped: a mapping must lie inside one of its reservations and
// within one of its allocations, an unmap or free must match, and mapped ranges are device
// memory the client may copy to and from.
//
// Host-located physical memory is pinned host memory of the session: charged before the driver
// makes it (nothing is made beyond the limit), the charge given back if the driver fails.
CUresult Session::Check_cuMemCreate(uint64_t& size, CUmemAllocationProp& prop, uint64_t&) {
  if (size == 0) return CUDA_ERROR_INVALID_VALUE;
  host_mem_.Release(&vmm_pending_charge_);  // a call that never reached the driver
  if (static_cast<uint32_t>(prop.location.type) == CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_SUCCESS;
  return host_mem_.ChargePinned(size, "host-located cuMemCreate memory", &vmm_pending_charge_);
}

CUresult Session::Done_cuMemCreate(CUmemGenericAllocationHandle& h, const uint64_t& size, const CUmemAllocationProp&,
                                   const uint64_t&) {
  if (vmm_pending_charge_.bytes != 0) {
    vmm_host_charges_[h] = vmm_pending_charge_;
    vmm_pending_charge_ = {};
  }
  vmm_handles_[h] = size;
  h = Publish(HandleKind::kMemHandle, h);
  return CUDA_SUCCESS;
}

CUresult Session::Done_cuMemRelease(const uint64_t& h) {
  if (auto owed = vmm_retains_.find(h); owed != vmm_retains_.end()) {
    // A retained handle: this release balanced a cuMemRetainAllocationHandle.
    if (--owed->second == 0) vmm_retains_.erase(owed);
    return CUDA_SUCCESS;
  }
  vmm_handles_.erase(h);
  handles_.RetireReal(HandleKind::kMemHandle, h);
  if (auto c = vmm_host_charges_.find(h); c != vmm_host_charges_.end()) {
    host_mem_.Release(&c->second);
    vmm_host_charges_.erase(c);
  }
  return CUDA_SUCCESS;
}

// The answer is the name cuMemCreate gave (mem handles are virtual); the session owes the driver
// one more cuMemRelease of it, which the client's next release (or the session's end) makes.
CUresult Session::Done_cuMemRetainAllocationHandle(CUmemGenericAllocationHandle& h, const uint64_t&) {
  if (!vmm_handles_.count(h)) {  // mapped by this session, so never expected
    CALL(cuMemRelease, h);
    return CUDA_ERROR_INVALID_VALUE;
  }
  ++vmm_retains_[h];
  h = Publish(HandleKind::kMemHandle, h);
  return CUDA_SUCCESS;
}

// A mapping: [p, p + size) inside one reservation of the session, overlapping no mapping, of
// [offset, offset + size) of one of its VMM handles.
CUresult Session::Check_cuMemMap(uint64_t& p, uint64_t& size, uint64_t& offset, uint64_t& h, uint64_t&) {
  if (size == 0 || VmmName(h) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t bytes = vmm_handles_[h];
  if (offset > bytes || size > bytes - offset) return CUDA_ERROR_INVALID_VALUE;
  if (!InsideOne(vmm_reserved_, p, size)) return CUDA_ERROR_INVALID_VALUE;
  auto it = vmm_mapped_.lower_bound(p);
  if (it != vmm_mapped_.end() && it->first < p + size) return CUDA_ERROR_INVALID_VALUE;
  if (it != vmm_mapped_.begin() && std::prev(it)->first + std::prev(it)->second > p) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

// Whole mappings only, one or several back to back.
CUresult Session::Check_cuMemUnmap(uint64_t& p, uint64_t& size) {
  const uint64_t end = p + size;
  if (size == 0 || end < p) return CUDA_ERROR_INVALID_VALUE;
  uint64_t at = p;
  for (auto it = vmm_mapped_.find(p); it != vmm_mapped_.end() && it->first == at && at < end; ++it) at += it->second;
  return at == end ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// cuMemSetAccess: [p, p + size) inside one reservation of the session; the descriptors are the
// driver's to judge.
CUresult Session::SetAccess(Reader& rd) {
  uint64_t p = 0, size = 0;
  uint32_t count = 0;
  rd.U64(&p);
  rd.U64(&size);
  if (!rd.U32(&count) || count == 0 || count > 64) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUmemAccessDesc> desc(count);
  for (auto& d : desc) {
    if (!ReadAccessDesc(rd, &d)) return CUDA_ERROR_INVALID_VALUE;
  }
  if (!rd.Finish() || size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (!InsideOne(vmm_reserved_, p, size)) return CUDA_ERROR_INVALID_VALUE;
  return CALL(cuMemSetAccess, p, size, desc.data(), count);
}

// IPC handles are the driver's 64 opaque bytes, passed through unchanged: another session of this
// worker (same host, same driver) opens them. What the client names is checked against this
// session's tables; a handle's bytes are the driver's to judge. An opened range is counted per
// open; the reply tells the client its size (the client records it like an allocation).
CUresult Session::Done_cuIpcOpenMemHandle_v2(CUdeviceptr& p, const CUipcMemHandle&, const uint32_t&, Writer& reply) {
  if (!ipc_opens_.count(p)) {
    CUdeviceptr base = 0;
    size_t size = 0;
    const CUresult r = CALL(cuMemGetAddressRange_v2, &base, &size, p);
    if (r != CUDA_SUCCESS || base != p || size == 0) {
      CALL(cuIpcCloseMemHandle, p);
      return r != CUDA_SUCCESS ? r : CUDA_ERROR_UNKNOWN;
    }
    ipc_opened_[p] = size;
  }
  ++ipc_opens_[p];
  reply.U64(ipc_opened_[p]);
  return CUDA_SUCCESS;
}

// The reply tells the client the opens left (it forgets the range at 0).
CUresult Session::Done_cuIpcCloseMemHandle(const uint64_t& p, Writer& reply) {
  const int left = --ipc_opens_[p];
  if (left == 0) {
    ipc_opens_.erase(p);
    ipc_opened_.erase(p);
  }
  reply.U32(static_cast<uint32_t>(left));
  return CUDA_SUCCESS;
}

CUresult Session::AddressRange(Reader& rd, Writer& out) {
  uint64_t p = 0;
  if (!rd.U64(&p) || !rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
  if (!Range(p, 1)) return CUDA_ERROR_NOT_FOUND;
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = CALL(cuMemGetAddressRange_v2, &base, &size, p);
  out.U64(base);
  out.U64(size);
  return r;
}

// Stream-ordered allocations and memory pools.
CUresult Session::Check_cuMemPoolCreate(CUmemPoolProps& props) {
  // No IPC handle types remotely.
  if (static_cast<uint32_t>(props.handleTypes) != CU_MEM_HANDLE_TYPE_NONE) return CUDA_ERROR_NOT_SUPPORTED;
  if (static_cast<uint32_t>(props.location.type) == CU_MEM_LOCATION_TYPE_DEVICE) {
    return Device(props.location.id) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
  }
  // Its allocations would be pinned host memory outside the session's host-memory limit (and the
  // device reports host-located pools as unsupported).
  SessionLog("cuMemPoolCreate refused: pools of host-located memory are not served remotely");
  return CUDA_ERROR_NOT_SUPPORTED;
}

// Stream-ordered allocation: the allocation joins the session's table, and the reply names the
// pool it came from (the stream's device's current pool for cuMemAllocAsync, which joins the
// session's pool table), which the client keeps with it.
CUresult Session::Done_cuMemAllocAsync(CUdeviceptr& p, const uint64_t& n, const uint64_t&, Writer& reply) {
  uint64_t pool = 0;
  CUmemoryPool used = nullptr;
  if (CALL(cuPointerGetAttribute, &used, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p) == CUDA_SUCCESS) {
    pool = H(used);
    if (pool) pools_.insert(pool);
  }
  allocs_[p] = n;
  reply.U64(Publish(HandleKind::kMemPool, pool));
  return CUDA_SUCCESS;
}

void Session::Reply(uint64_t seq, CUresult r, const Writer& out) {
  console_.Forward(t_.get(), &event_seq_);  // device printf of this call, before its reply
  mirrors_.Pull(t_.get(), &event_seq_, true);  // what kernels and copies wrote into mirrors
  uint8_t head[4];
  Writer w(head, sizeof(head));
  w.I32(r);
  // result + outputs in one payload
  std::vector<uint8_t> payload(4 + (r == CUDA_SUCCESS ? out.size() : 0));
  memcpy(payload.data(), head, 4);
  if (r == CUDA_SUCCESS && out.size()) memcpy(payload.data() + 4, out.data(), out.size());
  OutFrame f;
  f.opcode = static_cast<uint16_t>(transport::Opcode::kCallReply);
  f.sequence = seq;
  f.payload = payload.data();
  f.payload_length = static_cast<uint32_t>(payload.size());
  if (r == CUDA_SUCCESS && reply_bulk_len_ > 0) {
    f.bulk = reply_bulk_.data();
    f.bulk_length = reply_bulk_len_;
  }
  // Delivered promptly without a Flush (transport.h); a dead client is noticed by the next Receive.
  (void)t_->Send(f);
}

void Session::ReplyDeferred(uint64_t seq) {
  console_.Forward(t_.get(), &event_seq_);
  mirrors_.Pull(t_.get(), &event_seq_, true);
  uint8_t buf[16];
  Writer w(buf, sizeof(buf));
  w.U64(pending_seq_);
  w.U16(pending_op_);
  w.I32(pending_);
  OutFrame f;
  f.opcode = static_cast<uint16_t>(transport::Opcode::kCallReply);
  f.flags = transport::kFlagError;
  f.sequence = seq;
  f.payload = w.data();
  f.payload_length = static_cast<uint32_t>(w.size());
  (void)t_->Send(f);
  pending_ = CUDA_SUCCESS;
}

void Session::Cleanup() {
  {
    // Release every stream thread waiting for a host function, and wait (bounded) until they
    // have left this object.
    std::unique_lock<std::mutex> lk(hf_mu_);
    hf_stopping_ = true;
    hf_cv_.notify_all();
    hf_cv_.wait_for(lk, std::chrono::seconds(10), [&] { return hf_outstanding_ == 0; });
  }
  if (!initialised_) return;
  // Nothing may still run that uses the transport (held bulk slices) or the host regions.
  for (uint64_t c : contexts_) {
    if (CALL(cuCtxSetCurrent, As<CUcontext>(c)) == CUDA_SUCCESS) CALL(cuCtxSynchronize);
  }
  uint64_t any_ctx = contexts_.empty() ? 0 : *contexts_.begin();
  if (any_ctx) CALL(cuCtxSetCurrent, As<CUcontext>(any_ctx));
  PollStaged(true);
  for (CUevent e : copy_events_) CALL(cuEventDestroy_v2, e);
  const size_t regions = regions_.size();
  for (auto& [addr, region] : regions_) {
    CALL(cuMemHostUnregister, region.local);
    munmap(region.local, region.length);
    host_mem_.Release(&region.charge);
  }
  regions_.clear();
  region_ids_.clear();
  mapped_host_.clear();
  const size_t mirrors = mirrors_.Clear();
  if (arena_state_ == 1) CALL(cuMemHostUnregister, arena_base_);
  host_mem_.Release(&arena_charge_);
  arena_state_ = -1;
  const size_t graphs = graphs_.graph_count();
  DestroyObjects();
  for (auto& [lib, e] : libraries_) CALL(cuLibraryUnload, As<CUlibrary>(lib));
  green_.Cleanup();
  notifications_.Cleanup();
  for (uint64_t c : created_contexts_) CALL(cuCtxDestroy_v2, As<CUcontext>(c));
  for (auto& [dev, n] : primary_retains_) {
    for (int i = 0; i < n; ++i) CALL(cuDevicePrimaryCtxRelease_v2, dev);
  }
  if (lookup_ctx_ != nullptr) CALL(cuDevicePrimaryCtxRelease_v2, 0);
  lookup_ctx_ = nullptr;
  SessionLog("session ended: freed %zu allocations, %zu streams, %zu events, %zu modules, %zu graphs, "
      "%zu host regions, %zu mirrors, %zu IPC mappings",
      allocs_.size(), streams_.size(), events_.size(), modules_.size(), graphs, regions, mirrors,
      ipc_opened_.size());
  allocs_.clear();
}

// The driver objects the session made, for its end and for a primary-context reset (libraries,
// green and created contexts, and primary-context retains are the caller's); the tables are left
// for the caller to count and clear.
void Session::DestroyObjects() {
  arrays_.Cleanup();
  for (uint64_t e : events_) CALL(cuEventDestroy_v2, As<CUevent>(e));
  for (uint64_t st : streams_) CALL(cuStreamDestroy_v2, As<CUstream>(st));
  graphs_.Cleanup();
  graph_host_.Clear();
  jit_.DestroyAll();
  for (auto& [m, fns] : modules_) CALL(cuModuleUnload, As<CUmodule>(m));
  for (auto& [p, n] : allocs_) CALL(cuMemFree_v2, p);
  for (auto& [p, opens] : ipc_opens_) {
    for (int i = 0; i < opens; ++i) CALL(cuIpcCloseMemHandle, p);
  }
  for (auto& [p, n] : vmm_mapped_) CALL(cuMemUnmap, p, n);
  for (auto& [h, n] : vmm_retains_) {
    for (int i = 0; i < n; ++i) CALL(cuMemRelease, h);
  }
  for (auto& [h, n] : vmm_handles_) CALL(cuMemRelease, h);
  for (auto& [p, n] : vmm_reserved_) CALL(cuMemAddressFree, p, n);
  for (uint64_t p : created_pools_) CALL(cuMemPoolDestroy, As<CUmemoryPool>(p));
}

CUresult Session::PrimaryCtxReset(Reader& rd) {
  int32_t dev = 0;
  if (!rd.I32(&dev) || !Device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  // The host regions the client frees with the context (its page-locked allocations and managed
  // memory, which the driver frees): each a region of this session, named once. A client that
  // names none (or sends only the device) keeps them all.
  std::set<uint64_t> freed;
  if (rd.remaining() != 0) {
    uint32_t n = 0;
    bool ok = rd.U32(&n) && n <= region_ids_.size();
    for (uint32_t i = 0; ok && i < n; ++i) {
      uint64_t id = 0;
      ok = rd.U64(&id) && region_ids_.count(id) != 0 && freed.insert(id).second;
    }
    if (!ok || !rd.Finish()) {
      SessionLog("cuDevicePrimaryCtxReset(%d) refused: the host regions to free are not regions of "
                 "this session, or named twice", dev);
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  // What the session holds is only known to belong to one context while it has no other: with
  // a created or green context, or another device's primary context, the reset is refused.
  uint64_t primary = 0;
  for (uint64_t c : contexts_) {
    auto it = primary_ctx_.find(c);
    if (it == primary_ctx_.end() || it->second != dev) {
      SessionLog("cuDevicePrimaryCtxReset(%d) refused: the session has another context", dev);
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    primary = c;
  }
  // Host functions were drained before this call (IsBlocking); wait for the context's work, so
  // that copies and kernels still in flight into mirrored memory have finished.
  if (primary != 0 && CALL(cuCtxSetCurrent, As<CUcontext>(primary)) == CUDA_SUCCESS) CALL(cuCtxSynchronize);
  // Every mirror goes, after what the device wrote into it has gone to the client (registered
  // memory stays the program's, with those bytes); the client forgets its twins after the reply.
  mirrors_.Pull(t_.get(), &event_seq_);
  const size_t mirrors = mirrors_.Clear();
  // The regions the driver frees with the context: unregistered and unmapped, as at cuMemFreeHost.
  for (uint64_t id : freed) {
    auto it = regions_.find(region_ids_[id]);
    CALL(cuMemHostUnregister, it->second.local);
    munmap(it->second.local, it->second.length);
    host_mem_.Release(&it->second.charge);
    mapped_host_.erase(it->first);
    regions_.erase(it);
    region_ids_.erase(id);
  }
  if (primary == 0) {  // nothing else of the session in it
    CUresult r = CALL(cuDevicePrimaryCtxReset_v2, dev);
    SessionLog("primary context of device %d reset (%s): %zu mirrors dropped, %zu host regions freed",
               dev, r == CUDA_SUCCESS ? "ok" : "failed", mirrors, freed.size());
    return r;
  }
  PollStaged(true);
  for (CUevent e : copy_events_) CALL(cuEventDestroy_v2, e);
  copy_events_.clear();
  for (auto& [addr, region] : regions_) CALL(cuMemHostUnregister, region.local);
  if (arena_state_ == 1) CALL(cuMemHostUnregister, arena_base_);
  if (arena_state_ == 1) arena_state_ = 0;  // registered again at the next pageable copy
  // Libraries and their kernels are context-independent: they stay (the driver loads them into
  // the context again when used); their modules and functions in this context go.
  DestroyObjects();
  for (auto& [h, c] : vmm_host_charges_) host_mem_.Release(&c);
  const size_t allocations = allocs_.size(), streams = streams_.size(), events = events_.size(),
               modules = modules_.size();
  // Every name of the context's objects fails from now on; the context, libraries and kernels
  // keep theirs.
  size_t retired = 0;
  for (int k = 1; k <= kHandleKindCount; ++k) {
    const auto kind = static_cast<HandleKind>(k);
    if (kind == HandleKind::kContext || kind == HandleKind::kDevResourceDesc ||
        kind == HandleKind::kLibrary || kind == HandleKind::kKernel ||
        kind == HandleKind::kAsyncCallback) {  // registered on the device, not in the context
      continue;
    }
    retired += handles_.RetireAll(kind);
  }
  for (auto& [lib, e] : libraries_) {
    e.functions.clear();
    e.modules.clear();
  }
  for (auto it = functions_.begin(); it != functions_.end();) {
    if (kernels_.count(it->first)) ++it;  // a kernel's layout (launched as a function)
    else it = functions_.erase(it);
  }
  allocs_.clear();
  globals_.clear();
  vmm_reserved_.clear();
  vmm_handles_.clear();
  vmm_retains_.clear();
  vmm_mapped_.clear();
  vmm_host_charges_.clear();
  ipc_opened_.clear();
  ipc_opens_.clear();
  streams_.clear();
  events_.clear();
  pools_.clear();
  created_pools_.clear();
  modules_.clear();
  handed_out_functions_.clear();
  library_modules_.clear();
  CUresult r = CALL(cuDevicePrimaryCtxReset_v2, dev);
  // The client's page-locked memory stays shared with this process: registered with the driver
  // again (a region that cannot be is dropped, and fails like unknown memory from then on).
  CALL(cuCtxSetCurrent, As<CUcontext>(primary));
  size_t dropped = 0;
  for (auto it = regions_.begin(); it != regions_.end();) {
    HostRegion& region = it->second;
    CUdeviceptr dptr = 0;
    if (CALL(cuMemHostRegister_v2, region.local, region.length, region.reg) == CUDA_SUCCESS &&
        (mapped_host_.count(it->first) == 0 ||
         (CALL(cuMemHostGetDevicePointer_v2, &dptr, region.local, 0) == CUDA_SUCCESS && dptr == it->first))) {
      ++it;
      continue;
    }
    if (region.local) CALL(cuMemHostUnregister, region.local);
    munmap(region.local, region.length);
    host_mem_.Release(&region.charge);
    region_ids_.erase(region.id);
    mapped_host_.erase(it->first);
    it = regions_.erase(it);
    ++dropped;
  }
  SessionLog("primary context of device %d reset (%s): freed %zu allocations, %zu streams, %zu events, "
             "%zu modules; %zu names retired; %zu mirrors dropped; %zu host regions freed, %zu kept, "
             "%zu dropped",
             dev, r == CUDA_SUCCESS ? "ok" : "failed", allocations, streams, events, modules, retired,
             mirrors, freed.size(), regions_.size(), dropped);
  return r;
}

std::string Session::PrepareLimits(Reader& rd) {
  SessionLimits l;
  if (!payload_.empty()) {  // empty: a client that asked for nothing (the worker's policy applies)
    uint32_t version = 0;
    // Version 1: vram, tflops, percent; version 2 adds the GPU; version 3 the compute limit
    // (tflops, percent) and the QoS; version 4 the tier idle timeouts (swap, disk); version 5 the
    // idle zero timeout and the allocation.
    if (!rd.U32(&version) || version < 1 || version > 5) return "unknown limits record";
    std::string* fields[] = {&l.vram, &l.tflops, &l.percent, &l.gpu, &l.tflops_limit, &l.percent_limit, &l.qos,
                             &l.idle_swap, &l.idle_disk, &l.idle_zero, &l.allocation};
    const size_t count = version == 1 ? 3 : version == 2 ? 4 : version == 3 ? 7 : version == 4 ? 9 : 11;
    for (size_t i = 0; i < count; ++i) {
      const uint8_t* p = nullptr;
      uint32_t n = 0;
      if (!rd.Blob(&p, &n, 64)) return "malformed limits record";
      fields[i]->assign(reinterpret_cast<const char*>(p), n);
    }
    if (!rd.Finish()) return "malformed limits record";
  }
  if (!ticket_limits_.empty() && SessionLimitsDigest(l) != ticket_limits_) {
    SessionLog("refused: the client's limits are not those its session ticket was made for");
    return "the limits this client asks for (TFUSION_REMOTE_*) are not those its session ticket was made for: "
           "run it through `tfusion run --remote` with the limits it should have";
  }
  const bool asked = !l.vram.empty() || !l.tflops.empty() || !l.percent.empty() || !l.gpu.empty() ||
                     !l.tflops_limit.empty() || !l.percent_limit.empty() || !l.qos.empty();
  if (!asked && !opt_.vgpu_for_every_session) return "";
  if (!opt_.prepare_limits) return "this worker does not make vGPUs per client";
  std::string why = opt_.prepare_limits(l, getpid(), &limits_env_, &limits_driver_);
  if (why.empty()) {
    auto shown = [](const std::string& v) { return v.empty() ? "-" : v.c_str(); };
    SessionLog("client's vGPU: vram %s, tflops %s, percent %s, GPU %s, tflops limit %s, percent limit %s, qos %s%s%s%s%s%s%s%s%s",
        shown(l.vram), shown(l.tflops), shown(l.percent), l.gpu.empty() ? "0" : l.gpu.c_str(),
        shown(l.tflops_limit), shown(l.percent_limit), l.qos.empty() ? "medium" : l.qos.c_str(),
        l.idle_swap.empty() ? "" : ", idle swap ", l.idle_swap.c_str(), l.idle_disk.empty() ? "" : ", idle disk ",
        l.idle_disk.c_str(), l.idle_zero.empty() ? "" : ", idle zero ", l.idle_zero.c_str(),
        l.allocation.empty() ? "" : ", allocation ", l.allocation.c_str());
  }
  return why;
}

namespace {
// TFUSION_WORKER_PROFILE=1: at the end of a session, how its time split between waiting for the
// client and working on its calls (is the worker the bottleneck, or the delivery of calls?).
// Per opcode it also counts the calls and the time spent in each (the top ones are logged).
struct RunProfile {
  bool on = false;
  int64_t last = 0, wait_ns = 0, work_ns = 0;
  uint64_t frames = 0, waits = 0;
  remote::OpTimes ops;
  void LogTop() const {
    for (const auto& r : ops.Top(15)) {
      SessionLog("profile:   %-34s %9llu calls %10.1f ms %8.2f us/call", r.name,
                 static_cast<unsigned long long>(r.e.calls), r.e.ns / 1e6, r.e.ns / 1e3 / r.e.calls);
    }
  }
  bool trace = false;  // TFUSION_WORKER_TRACE=1: every dispatched call, before and after
  void Start() {
    const char* v = getenv("TFUSION_WORKER_PROFILE");
    on = v != nullptr && *v == '1';
    const char* t = getenv("TFUSION_WORKER_TRACE");
    trace = t != nullptr && *t == '1';
    if (on) last = transport::MonotonicNowNs();
  }
  void Mark(int64_t* acc) {
    if (!on) return;
    const int64_t now = transport::MonotonicNowNs();
    *acc += now - last;
    last = now;
  }
};
}  // namespace

// TFUSION_WORKER_TRACE=1: which call the session thread entered and left (a session that stops
// answering shows the call it is blocked in).
void TraceOp(const char* what, uint16_t op, CUresult r, const uint8_t* payload = nullptr,
             size_t n = 0) {
  char call[256];
  if (payload != nullptr && transport::IsDriverCallOpcode(op) &&
      FormatGeneratedCall(static_cast<Fn>(transport::DriverCallId(op)), payload, n, call, sizeof(call))) {
    SessionLog("trace: %s %s", what, call);  // a generated call, with its arguments
  } else if (transport::IsDriverCallOpcode(op)) {
    SessionLog("trace: %s %s -> %d", what, driver::FunctionName(static_cast<Fn>(transport::DriverCallId(op))),
               static_cast<int>(r));
  } else {
    SessionLog("trace: %s op 0x%04x -> %d", what, op, static_cast<int>(r));
  }
}

// TFUSION_WORKER_STUCK_S (default 10, 1 to 3600): how long the session thread may be inside one
// call while its client is gone before the watchdog ends the session process. The driver then
// frees the context, its memory included; the worker reaps the session as after a crash.
void Session::StartWatchdog() {
  int64_t stuck_s = 10;
  if (const char* v = getenv("TFUSION_WORKER_STUCK_S"); v != nullptr && *v != 0) {
    char* end = nullptr;
    long x = strtol(v, &end, 10);
    if (end != v && *end == 0 && x >= 1 && x <= 3600) {
      stuck_s = x;
    } else {
      SessionLog("TFUSION_WORKER_STUCK_S=%s is not a number of seconds from 1 to 3600: using 10", v);
    }
  }
  std::thread([this, stuck_ns = stuck_s * 1'000'000'000] {
    uint64_t seen = 0;
    int64_t since = 0;  // when `seen` was first observed
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(stuck_ns >= 4'000'000'000 ? 1000 : 200));
      const uint64_t seq = dispatch_seq_.load(std::memory_order_acquire);
      const int64_t now = transport::MonotonicNowNs();
      if (seq != seen) {
        seen = seq;
        since = now;
      }
      if ((seq & 1) == 0 || now - since < stuck_ns || !t_->PeerGone()) continue;
      const uint16_t op = dispatch_op_.load(std::memory_order_relaxed);
      const char* name = transport::IsDriverCallOpcode(op)
                             ? driver::FunctionName(static_cast<Fn>(transport::DriverCallId(op)))
                             : "a worker operation";
      SessionLog("client gone while this session was blocked in %s for %lld s: ending the session (the "
                 "driver frees its context and memory)", name,
                 static_cast<long long>((transport::MonotonicNowNs() - since) / 1'000'000'000));
      fflush(stderr);
      _exit(3);
    }
  }).detach();
}

int Session::Run() {
  bool loaded = false;
  StartWatchdog();
  console_.Start();
  RunProfile prof;
  prof.Start();
  struct ReportAtEnd {
    RunProfile& p;
    ~ReportAtEnd() {
      if (!p.on) return;
      SessionLog("profile: %llu frames; working %.1f ms, waiting for the client %.1f ms in %llu waits",
          static_cast<unsigned long long>(p.frames), p.work_ns / 1e6, p.wait_ns / 1e6,
          static_cast<unsigned long long>(p.waits));  // waits: longer than 20 us
      p.LogTop();
    }
  } report{prof};
  for (;;) {
    InFrame in;
    prof.Mark(&prof.work_ns);
    const int64_t before_wait = prof.wait_ns;
    TransportStatus st = t_->Receive(&in, 100);
    prof.Mark(&prof.wait_ns);
    prof.waits += prof.wait_ns - before_wait > 20000;  // blocked, not just reading a queued frame
    ++prof.frames;
    if (st.code() == transport::TransportErrc::kTimeout) {
      PollStaged(false);
      continue;
    }
    if (!st.ok()) {
      if (st.code() != transport::TransportErrc::kPeerClosed) {
        SessionLog("client gone: %s: %s", transport::TransportErrcName(st.code()), st.message());
      }
      break;
    }
    const uint16_t op = in.header.opcode;
    const bool wants_reply = in.header.flags & transport::kFlagReplyExpected;
    if (op == static_cast<uint16_t>(transport::Opcode::kGoodbye)) break;
    payload_.assign(in.payload, in.payload + in.payload_length);
    Reader rd(payload_.data(), payload_.size());
    if (!loaded) {
      // The driver loads at the client's first request, which may ask for a vGPU of its own.
      std::string refused;
      // A session of a ticket bound to limits checks them whatever the client sends, and only
      // its session info may come first (the stub always sends it first; anything else would run
      // on the driver before its limits were checked).
      if (op == remote::kOpSessionInfo &&
          (!payload_.empty() || opt_.vgpu_for_every_session || !ticket_limits_.empty())) {
        refused = PrepareLimits(rd);
      } else if (!ticket_limits_.empty()) {
        refused = "a session of a ticket bound to limits must ask for them in its first request";
      }
      if (!refused.empty() || !LoadDriver()) {
        if (!refused.empty()) SessionLog("refused the client's vGPU limits: %s", refused.c_str());
        if (op == remote::kOpSessionInfo && wants_reply) {
          Writer fail(out_buf_.data(), out_buf_.size());
          fail.I32(refused.empty() ? CUDA_ERROR_NO_DEVICE : CUDA_ERROR_INVALID_VALUE);
          fail.I32(0);
          fail.U32(0);
          if (!refused.empty() && (t_->session().features & transport::kFeatureRefusalReason) != 0) {
            fail.Blob(refused.data(), static_cast<uint32_t>(
                                          std::min<size_t>(refused.size(), transport::kMaxRefusalReasonBytes)));
          }
          OutFrame f;
          f.opcode = static_cast<uint16_t>(transport::Opcode::kCallReply);
          f.sequence = in.header.sequence;
          f.payload = fail.data();
          f.payload_length = static_cast<uint32_t>(fail.size());
          (void)t_->Send(f);
          (void)t_->Flush();
        }
        t_->Close();
        return 1;
      }
      loaded = true;
      rd = Reader(payload_.data(), payload_.size());
      // The bulk arena is pinned for the session (at its first pageable copy) like its
      // page-locked memory, and counted from the start: what the client may pin besides is the
      // same whatever it does first. Beyond the limit, pageable copies are staged instead.
      void* base = nullptr;
      uint64_t len = 0;
      if (t_->BulkMemory(&base, &len) &&
          host_mem_.ChargePinned(len, "the copy arena (pageable copies are staged instead)",
                                 &arena_charge_) != CUDA_SUCCESS) {
        arena_state_ = -1;
      }
    }
    Writer out(out_buf_.data(), out_buf_.size());
    reply_bulk_len_ = 0;
    CUresult r;
    if (op == remote::kOpSessionInfo) {
      r = SessionInfo(out);
      if (!out.ok()) r = CUDA_ERROR_UNKNOWN;
      if (wants_reply) {
        // The session info is the payload itself (its first field is cuInit's result).
        OutFrame f;
        f.opcode = static_cast<uint16_t>(transport::Opcode::kCallReply);
        f.sequence = in.header.sequence;
        f.payload = out.data();
        f.payload_length = static_cast<uint32_t>(out.size());
        (void)t_->Send(f);
      }
      continue;
    }
    if (op == remote::kOpHostFuncDone) {
      uint64_t id = 0;
      if (rd.U64(&id) && rd.Finish()) HostFuncDone(id);
      continue;
    }
    if (op == remote::kOpMirrorData) {
      MirrorData(in);
      continue;
    }
    if (op == remote::kOpGraphHostData) {
      CUresult gr = graph_host_.Apply(in.payload, in.payload_length, in.bulk, in.bulk_length);
      if (gr != CUDA_SUCCESS && pending_ == CUDA_SUCCESS) {
        pending_ = gr;
        pending_seq_ = in.header.sequence;
        pending_op_ = op;
      }
      continue;
    }
    if (op == remote::kOpGraphHostCopies) {
      uint64_t e = 0, real = 0;  // an executable graph's name
      if (rd.U64(&e) && rd.Finish()) {
        // (A device-launch graph's real handle finds its own ranges; anything else none.)
        if (!handles_.Resolve(HandleKind::kGraphExec, e, &real)) real = e;
        graph_host_.Describe(reinterpret_cast<CUgraphExec>(real), out);
      }
      if (wants_reply) Reply(in.header.sequence, out.ok() ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN, out);
      continue;
    }
    if (op == remote::kOpImageChunk) {
      uint64_t lo = 0, hi = 0, total = 0, off = 0;
      rd.U64(&lo);
      rd.U64(&hi);
      rd.U64(&total);
      rd.U64(&off);
      if (rd.Finish() && total > 0 && total <= remote::kMaxImageBytes && off <= total &&
          in.bulk_length <= total - off) {
        Image& img = images_[{lo, hi}];
        if (img.bytes.empty()) img.bytes.resize(total);
        if (img.bytes.size() == total) {
          memcpy(img.bytes.data() + off, in.bulk, in.bulk_length);
          img.filled += in.bulk_length;
        }
      }
      continue;
    }
    if (!transport::IsDriverCallOpcode(op) && !remote::IsHostRegionOp(op) &&
        !remote::IsMirrorOp(op)) {
      if (wants_reply) Reply(in.header.sequence, CUDA_ERROR_NOT_SUPPORTED, out);
      continue;
    }
    // A synchronous copy with a host region is a synchronizing call like cuMemcpyHtoD/DtoH.
    const bool region_sync = op == remote::kOpHostRegionCopy && wants_reply;
    if (sticky_ != CUDA_SUCCESS) {
      if (wants_reply) Reply(in.header.sequence, sticky_, out);
      continue;
    }
    const uint8_t* bulk = in.bulk;
    if (wants_reply && (IsBlocking(op) || region_sync) && HostFuncsOutstanding()) {
      // Draining reads frames, which releases this frame's bulk view: keep a copy.
      if (bulk != nullptr) {
        bulk_copy_.assign(bulk, bulk + in.bulk_length);
        bulk = bulk_copy_.data();
      }
      if (!DrainHostFuncs()) break;
    }
    cur_seq_ = in.header.sequence;
    // Mapping host memory makes the device write none; anything else may (mirrors_.Pull).
    if (op != remote::kOpMirrorMap && op != remote::kOpHostRegionMap) mirrors_.NoteWork();
    const int64_t dispatched = prof.on ? transport::MonotonicNowNs() : 0;
    if (prof.trace) TraceOp("call", op, CUDA_SUCCESS, in.payload, in.payload_length);
    // This thread is the only writer: plain stores, no read-modify-write on the call path.
    dispatch_op_.store(op, std::memory_order_relaxed);
    dispatch_seq_.store(dispatch_seq_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    r = Dispatch(op, rd, bulk, in.bulk_length, out);
    dispatch_seq_.store(dispatch_seq_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    if (prof.trace) TraceOp("done", op, r);
    if (prof.on) prof.ops.Add(op, transport::MonotonicNowNs() - dispatched);
    if (!out.ok()) r = CUDA_ERROR_UNKNOWN;
    if (r != CUDA_SUCCESS && remote::IsStickyError(r)) sticky_ = r;
    if (!wants_reply) {
      if (r != CUDA_SUCCESS && pending_ == CUDA_SUCCESS) {
        pending_ = r;
        pending_seq_ = in.header.sequence;
        pending_op_ = op;
      }
      continue;
    }
    if (pending_ != CUDA_SUCCESS && (IsSyncPoint(op) || region_sync)) {
      ReplyDeferred(in.header.sequence);
      continue;
    }
    Reply(in.header.sequence, r, out);
  }
  Cleanup();
  console_.Forward(t_.get(), &event_seq_);
  console_.Stop();
  t_->Close();
  return 0;
}

}  // namespace

int RunSession(const WorkerOptions& options, std::unique_ptr<transport::Transport> transport,
               const std::string& credential_id) {
  Session s(options, std::move(transport), TicketLimitsDigest(credential_id));
  return s.Run();
}

}  // namespace tf::worker
