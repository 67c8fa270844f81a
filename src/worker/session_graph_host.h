// Graph memcpy nodes that name pageable memory of the client (docs/remote.md "Graph copies with
// pageable memory"). The worker cannot reach the client's memory, so such a node copies to or from
// a shadow: pinned memory of the session standing for the client's range. At every launch of an
// executable graph the client first sends the current bytes of the ranges its nodes read
// (kOpGraphHostData), and a host function of the session enqueued after the launch sends the
// bytes its nodes wrote back (kEvtGraphHostData) when the stream reaches it, before the reply of
// any call that waits for that stream.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "client/remote_protocol.h"
#include "driver/driver_table.h"
#include "transport/transport.h"
#include "worker/session_host_memory.h"

namespace tf::worker {

class GraphHostCopies {
 public:
  // One range of client memory an executable graph's nodes copy: kRegionToDevice (read at
  // launch) or kRegionToHost (written back after it).
  struct Range {
    uint64_t addr = 0, len = 0;
    uint8_t direction = remote::kRegionToDevice;
    const uint8_t* local = nullptr;  // the shadow's bytes the node copies (shadows may overlap)
  };

  // Shadows are charged to `host_memory` while they exist; events go out on t with sequence
  // numbers from *seq.
  GraphHostCopies(const driver::DriverTable& d, SessionHostMemory& host_memory)
      : d_(d), host_memory_(host_memory) {}
  GraphHostCopies(const GraphHostCopies&) = delete;
  GraphHostCopies& operator=(const GraphHostCopies&) = delete;
  void SetTransport(transport::Transport* t, std::atomic<uint64_t>* seq) {
    t_ = t;
    seq_ = seq;
  }

  // The session's memory standing for the client's [addr, addr + n): inside an existing shadow,
  // else a new shadow of exactly that range (which may overlap others in part: the client's
  // pageable copies arrive in slices, and a later node may name the whole buffer). nullptr when
  // the range is too large or exceeds the session's host-memory limit.
  void* Shadow(uint64_t addr, uint64_t n);

  // Executable graphs: what their memcpy nodes copy through shadows, found by asking the driver
  // for the nodes of the graph (child graphs included) when it is instantiated or updated.
  // Kept per node of the graph (a child graph node holds its graph's), so that the exec updates
  // of one node (cuGraphExecMemcpyNodeSetParams, cuGraphExecChildGraphNodeSetParams) replace
  // what that node copies.
  void Instantiated(CUgraphExec e, CUgraph g);                         // replaces e's ranges
  void ChildSet(CUgraphExec e, CUgraphNode node, CUgraph child);
  void CopySet(CUgraphExec e, CUgraphNode node, const CUDA_MEMCPY3D& c);
  void Destroyed(CUgraphExec e);
  // kOpGraphHostCopies: u32 n, n x (u64 address, u64 length, u8 direction).
  void Describe(CUgraphExec e, transport::Writer& out) const;
  // After a successful launch of e on stream: its written ranges go back to the client when the
  // stream reaches them (a host function of the session; nothing when e writes none).
  CUresult Launched(CUgraphExec e, CUstream stream);
  // A host node whose function argument is `user` is about to run: the bytes that the memcpy nodes
  // before it (its ancestors in the instantiated graph) wrote go to the client first, so the
  // program's callback sees them as natively. Runs on the driver's thread.
  void BeforeHostNode(const void* user);

  // kOpGraphHostData: runs (mirror_runs.h encoding) each wholly inside a shadow (written to every
  // shadow holding it), else nothing is written (CUDA_ERROR_INVALID_VALUE, logged).
  CUresult Apply(const uint8_t* payload, uint32_t payload_len, const uint8_t* bulk,
                 uint64_t bulk_len);

  // The client's address of a shadow's byte `local`; false when local is in no shadow.
  bool ClientAddress(const void* local, uint64_t* addr) const {
    std::lock_guard<std::mutex> l(mu_);
    return ClientRangeLocked(local, 1, addr);
  }

  // Frees every shadow (the caller synchronized the contexts); returns how many there were.
  size_t Clear();

 private:
  struct ShadowMem {
    uint64_t len = 0;
    uint8_t* local = nullptr;
    uint64_t map_len = 0;
    bool registered = false;
    SessionHostMemory::Charge charge;
  };
  // REQUIRES mu_.
  ShadowMem* FindLocked(uint64_t addr, uint64_t n, uint64_t* base);
  bool ClientRangeLocked(const void* local, uint64_t n, uint64_t* addr) const;
  void AddCopyLocked(const CUDA_MEMCPY3D& c, std::vector<Range>* out) const;
  using NodeRanges = std::map<uint64_t, std::vector<Range>>;  // graph node -> its ranges
  // Every memcpy node of g and of its child graphs; a child graph's ranges go under top (its node
  // in the instantiated graph) when given, else under each node itself.
  void Scan(CUgraph g, int depth, CUgraphNode top, NodeRanges* out);
  static void SendBack(void* arg);
  bool SendRanges(const std::vector<Range>& ranges);

  const driver::DriverTable& d_;
  SessionHostMemory& host_memory_;
  transport::Transport* t_ = nullptr;
  std::atomic<uint64_t>* seq_ = nullptr;
  // The session thread changes the tables; a driver thread reads shadows in SendBack.
  mutable std::mutex mu_;
  std::multimap<uint64_t, ShadowMem> shadows_;          // client address -> shadow
  std::map<uint64_t, NodeRanges> execs_;                // executable graph -> its ranges
  // Executable graph -> a host node's function argument -> its ancestors with ranges (keys of
  // execs_[e]).
  std::map<uint64_t, std::map<const void*, std::vector<uint64_t>>> host_before_;
  void HostAncestors(CUgraphExec e, CUgraph g, const NodeRanges& ranges);
};

}  // namespace tf::worker
