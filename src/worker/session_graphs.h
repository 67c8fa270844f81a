// CUDA graphs of one session: graphs, their nodes, executable graphs and stream capture, replayed
// on the session's driver. Every graph, node, executable-graph, event, stream and context handle
// and every device and host range a message names is checked against the session's tables first;
// a bad one fails that call only. Wire formats: src/client/remote_protocol.h ("Graphs").
// Not thread-safe: used by the session's dispatch thread only.
#pragma once

#include <cstdint>
#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "client/remote_protocol.h"
#include "driver/driver_table.h"
#include "worker/generated_calls.h"
#include "worker/session_handles.h"

namespace tf::worker {

class GraphHostCopies;

// One CUmemAccessDesc as the client encodes it (location type, location id, flags), for
// cuMemSetAccess and a memory node's access list; the values are the driver's to judge. False
// when the message ended early.
inline bool ReadAccessDesc(transport::Reader& rd, CUmemAccessDesc* d) {
  uint32_t type = 0, flags = 0;
  int32_t id = 0;
  rd.U32(&type);
  rd.I32(&id);
  const bool ok = rd.U32(&flags);
  d->location.type = static_cast<CUmemLocationType>(type);
  d->location.id = id;
  d->flags = static_cast<CUmemAccess_flags>(flags);
  return ok;
}

// Decoded kernel arguments; the pointers point into the frame's private copy.
struct KernelArgs {
  void* params[remote::kMaxKernelParams];
  void* extra[5] = {};
  size_t extra_size = 0;
  void** kernel_params = nullptr;
  void** extra_p = nullptr;
};

// What the graph tables need from their session.
class GraphHost {
 public:
  virtual ~GraphHost() = default;
  virtual const driver::DriverTable& Driver() const = 0;
  // [p, p + n) lies inside one device allocation (or mapped range) of the session.
  virtual bool DeviceRange(uint64_t p, uint64_t n) const = 0;
  // Each Known* takes a handle's wire name (session_handles.h) and resolves it in place to the
  // real handle; false when it is not a live name of that kind in this session.
  virtual bool KnownStream(uint64_t& s) const = 0;
  virtual bool KnownEvent(uint64_t& e) const = 0;
  virtual bool KnownContext(uint64_t& c) const = 0;
  // The session's handle table: handles given back to the client are published in it.
  virtual HandleTable& Handles() = 0;
  virtual bool KnownDevice(int32_t d) const = 0;
  // This process's address of the client's page-locked [host, host + n) when it lies in one
  // host region shared with the session, else nullptr.
  virtual void* HostRegionAddress(uint64_t host, uint64_t n) = 0;
  // Graph copies of the client's pageable memory (session_graph_host.h).
  virtual GraphHostCopies& HostCopies() = 0;
  // Decodes kernel-node parameters (u64 function, geometry, arguments) and checks them.
  virtual CUresult DecodeKernelNode(transport::Reader& rd, KernelArgs* a,
                                    CUDA_KERNEL_NODE_PARAMS* p) = 0;
  // The parameter sizes of function f when its layout is known.
  virtual bool ParamSizes(uint64_t f, std::vector<size_t>* sizes) const = 0;
  // A function handle the driver gave back in a graph node (cuGraphKernelNodeGetParams): the
  // client may ask for its name (cuFuncGetName) though it never looked it up. Returns the name
  // the client gets (the function's, or the kernel's when the driver gave a CUkernel back).
  virtual uint64_t FunctionHandedOut(uint64_t f) = 0;
  // Graph allocations join (and leave) the session's device allocations.
  virtual void AddAllocation(uint64_t p, uint64_t n) = 0;
  virtual void RemoveAllocation(uint64_t p) = 0;
  // The function and argument a host node runs for the client's host function `id` (they stay
  // valid until the session ends).
  virtual void HostNodeFunction(uint64_t id, CUhostFn* fn, void** arg) = 0;
  // A launch enqueues n host-node runs (negative: it failed after all), each acknowledged by the
  // client like a host function.
  virtual void HostRunsEnqueued(int64_t n) = 0;
  // The client's id of a host node's function (the inverse of HostNodeFunction); 0 when fn is not
  // a host node of this session.
  virtual uint64_t HostNodeIdOf(CUhostFn fn, void* arg) const = 0;
  // The client's address of memory this process names for it (a host region's mapping, a graph
  // copy's shadow); other addresses are the client's own (mirrors, same-address regions).
  virtual uint64_t ClientHostAddress(const void* local) const = 0;
  // A user object's destroy callback: the client runs its function `id` (kEvtHostFunc, without
  // an acknowledgement). Called on whatever thread the driver releases the object from.
  virtual void UserObjectReleased(uint64_t id) = 0;
  // Call data for the client (kEvtCopyData slices of at most CallDataLimit bytes) before the reply.
  virtual bool SendCallData(uint64_t offset, const void* data, uint64_t n) = 0;
  virtual uint64_t CallDataLimit() const = 0;
};

class GraphGeneratedHost;

class SessionGraphs : public GeneratedHooks {
 public:
  explicit SessionGraphs(GraphHost& host) : h_(host) {}

  // Whether Call handles fn.
  static bool Handles(driver::Fn fn);
  CUresult Call(driver::Fn fn, transport::Reader& rd, transport::Writer& out);
  // Ends captures still under way and destroys every executable graph and graph left.
  void Cleanup();
  size_t graph_count() const { return graphs_.size(); }

  // hook=check,done (api/remote_surface.tsv): the generated user-object reference calls check and
  // keep the counts below (session_user_objects.cc).
  CUresult Check_cuUserObjectRetain(uint64_t& o, uint32_t& count) override;
  CUresult Done_cuUserObjectRetain(const uint64_t& o, const uint32_t& count) override;
  CUresult Check_cuUserObjectRelease(uint64_t& o, uint32_t& count) override;
  CUresult Done_cuUserObjectRelease(const uint64_t& o, const uint32_t& count) override;
  CUresult Check_cuGraphRetainUserObject(uint64_t& g, uint64_t& o, uint32_t& count, uint32_t& flags) override;
  CUresult Done_cuGraphRetainUserObject(const uint64_t& g, const uint64_t& o, const uint32_t& count,
                                        const uint32_t& flags) override;
  CUresult Check_cuGraphReleaseUserObject(uint64_t& g, uint64_t& o, uint32_t& count) override;
  CUresult Done_cuGraphReleaseUserObject(const uint64_t& g, const uint64_t& o, const uint32_t& count) override;

 private:
  friend class GraphGeneratedHost;  // the generated graph calls (session_graph_nodes.cc)
  struct GraphEntry {
    std::vector<uint64_t> allocs;  // graph allocations its mem-alloc nodes made
    std::map<uint64_t, uint64_t> alloc_bytes;  // their sizes
    std::set<uint64_t> frees;      // pointers its mem-free nodes free
    uint64_t capturing_stream = 0;  // a capture graph the driver owns until the capture ends
    uint64_t body_of = 0;  // a conditional node's body: the driver destroys it with this graph
    // The allocation at p outlives a launch unless the graph frees it (an address the driver
    // gave again after the graph freed it outlives it).
    bool Outlives(uint64_t p) const {
      return std::count(allocs.begin(), allocs.end(), p) > 1 || !frees.count(p);
    }
  };
  struct ExecEntry {
    std::set<uint64_t> graphs;  // instantiated from, or updated with
    uint64_t host_nodes = 0;    // host-node runs per launch
    // Graph allocations that outlive a launch (not freed in the graph): live again after each
    // launch, until cuMemFree(Async) or a graph that frees them.
    std::vector<std::pair<uint64_t, uint64_t>> outliving;
    bool device_launch = false;  // CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH: named by its real handle
  };
  const driver::DriverTable& d() const { return h_.Driver(); }
  std::vector<std::pair<uint64_t, uint64_t>> Outliving(uint64_t g) const;
  // p is the address of a graph allocation of a graph or executable graph the session knows.
  bool GraphAllocation(uint64_t p) const;
  CUresult AddNode(driver::Fn fn, transport::Reader& rd, transport::Writer& out);
  CUresult SetExecParams(driver::Fn fn, transport::Reader& rd);
  CUresult Query(driver::Fn fn, transport::Reader& rd, transport::Writer& out);
  CUresult Edit(driver::Fn fn, transport::Reader& rd, transport::Writer& out);
  CUresult Exec(driver::Fn fn, transport::Reader& rd, transport::Writer& out);
  CUresult Capture(driver::Fn fn, transport::Reader& rd, transport::Writer& out);
  CUresult ConditionalHandle(transport::Reader& rd, transport::Writer& out);
  // Getters and setters of nodes, generic node updates, kernel node attributes, executable graph
  // flags and cuGraphDebugDotPrint (session_graph_nodes.cc).
  static bool HandlesNodeCall(driver::Fn fn);
  CUresult NodeCall(driver::Fn fn, transport::Reader& rd, transport::Writer& out);
  CUresult SetNode(driver::Fn fn, transport::Reader& rd);
  // A generated call served on the graph tables (session_graph_nodes.cc): those Handles() lists
  // (a node's getters, the enabled state, ...) and any other graph call the session sends here.
  CUresult GeneratedCall(driver::Fn fn, transport::Reader& rd, transport::Writer& out);
  CUresult DotPrint(transport::Reader& rd);
  // User objects (session_user_objects.cc): the references the client holds and those it gave
  // graphs; a name is retired when neither holds one. UserObjectCall serves cuUserObjectCreate,
  // the generated reference calls come through GeneratedCall and the hooks above.
  static bool HandlesUserObjectCall(driver::Fn fn);
  CUresult UserObjectCall(driver::Fn fn, transport::Reader& rd, transport::Writer& out);
  void ForgetUserObjectRefs(uint64_t graph);
  void RetireUserObjectIfUnused(uint64_t wire);
  // Reads u32 n, n x u64 node (each a node of graph g; any graph when g is 0).
  bool ReadNodes(transport::Reader& rd, uint64_t g, std::vector<CUgraphNode>* nodes);
  // Reads u8 present [, n x (u8 from port, u8 to port, u8 type)]; edges stays empty when absent.
  bool ReadEdges(transport::Reader& rd, size_t n, std::vector<CUgraphEdgeData>* edges);
  CUresult DecodeCopy(transport::Reader& rd, CUDA_MEMCPY3D* c);
  CUresult DecodeMemset(transport::Reader& rd, CUDA_MEMSET_NODE_PARAMS* m);
  bool Node(uint64_t n, uint64_t g = 0) const {
    auto it = nodes_.find(n);
    return it != nodes_.end() && (g == 0 || it->second == g);
  }
  // Graphs, nodes and executable graphs are virtual handles of the session (session_handles.h):
  // the tables below hold the driver's handles, the wire carries names. Real() is the driver's
  // handle behind a name, 0 when it is not a live name of that kind in this session (no table
  // holds 0, so the call fails as for any unknown handle); ReadReal() reads a name and resolves it.
  uint64_t Real(HandleKind k, uint64_t wire) {
    uint64_t real = 0;
    return h_.Handles().Resolve(k, wire, &real) ? real : 0;
  }
  bool ReadReal(transport::Reader& rd, HandleKind k, uint64_t* real) {
    uint64_t wire = 0;
    const bool ok = rd.U64(&wire);
    *real = Real(k, wire);
    return ok;
  }
  // Executable graphs: as ReadReal and Name, except that one instantiated for device launch keeps
  // its real handle on the wire (kernels launch it from the GPU, where no table translates).
  bool ReadExec(transport::Reader& rd, uint64_t* real) {
    uint64_t wire = 0;
    const bool ok = rd.U64(&wire);
    *real = RealExec(wire);
    return ok;
  }
  uint64_t RealExec(uint64_t wire) {
    const uint64_t real = Real(HandleKind::kGraphExec, wire);
    if (real != 0) return real;
    auto it = execs_.find(wire);
    return it != execs_.end() && it->second.device_launch ? wire : 0;
  }
  uint64_t ExecName(uint64_t e) {
    auto it = execs_.find(e);
    return it != execs_.end() && it->second.device_launch ? e : Name(HandleKind::kGraphExec, e);
  }
  // The name the client gets for a driver's handle (0 stays 0).
  uint64_t Name(HandleKind k, uint64_t real) { return h_.Handles().Publish(k, real); }
  uint64_t GraphName(uint64_t g) { return Name(HandleKind::kGraph, g); }
  // Nodes the driver named join the graph's node table; returns the node's name.
  uint64_t Learn(CUgraphNode n, uint64_t g) {
    if (!n) return 0;
    nodes_[reinterpret_cast<uint64_t>(n)] = g;
    return Name(HandleKind::kGraphNode, reinterpret_cast<uint64_t>(n));
  }
  // A node that went away: its name fails from now on.
  void ForgetNode(uint64_t n) {
    nodes_.erase(n);
    h_.Handles().RetireReal(HandleKind::kGraphNode, n);
  }
  // Host nodes of g, child graphs included (the driver is asked).
  uint64_t CountHostNodes(CUgraph g, int depth);
  void ForgetGraph(uint64_t g, bool free_allocations);
  void RecordExec(CUgraphExec e, uint64_t g);

  GraphHost& h_;
  std::map<uint64_t, GraphEntry> graphs_;
  std::map<uint64_t, uint64_t> nodes_;  // node -> its graph
  std::map<uint64_t, ExecEntry> execs_;
  std::map<uint64_t, uint64_t> capture_graphs_;  // capturing stream -> its capture graph
  struct UserObjectEntry {
    uint64_t real = 0;
    uint64_t client_refs = 0;
    std::map<uint64_t, uint64_t> graph_refs;  // graph -> references the client gave it
  };
  std::map<uint64_t, UserObjectEntry> user_objects_;  // by wire name
  // The entry of the user object `real` (its wire name in *wire), or nullptr when the session has
  // none or count is 0 or too large for one call.
  UserObjectEntry* UserObject(uint64_t real, uint32_t count, uint64_t* wire);
  // The hooks' check (CUDA_ERROR_INVALID_VALUE) and bookkeeping (session_user_objects.cc).
  CUresult MayCount(uint64_t real, uint32_t count, bool held, uint64_t graph);
  CUresult Count(uint64_t real, uint32_t count, int client, int graph, uint64_t g);
};

}  // namespace tf::worker
