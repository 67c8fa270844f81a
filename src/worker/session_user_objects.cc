// User objects of one session (session_graphs.h). Formats: remote_protocol.h "Graph nodes".
// The destroy callback is the client's function: the worker's callback tells the client (a
// kEvtHostFunc event carrying the client's id, with no acknowledgement awaited) and the client
// runs it once. The session counts the references the client holds and those it gave each graph,
// so a release beyond them fails that call instead of freeing an object still in use.
#include "worker/session_graphs.h"

namespace tf::worker {
namespace {

using driver::Fn;
using transport::Reader;
using transport::Writer;

uint64_t H(const void* p) { return reinterpret_cast<uint64_t>(p); }

#define CALL(fn, ...) (d().fn ? d().fn(__VA_ARGS__) : CUDA_ERROR_NOT_SUPPORTED)

// More references than this in one call are refused (the driver counts in unsigned int).
constexpr uint32_t kMaxRefs = 1u << 24;

// The destroy callback's argument: freed by the one call the driver makes.
struct ReleaseArg {
  GraphHost* host;
  uint64_t id;
};
void Released(void* p) {
  auto* a = static_cast<ReleaseArg*>(p);
  a->host->UserObjectReleased(a->id);
  delete a;
}

}  // namespace

bool SessionGraphs::HandlesUserObjectCall(Fn fn) {
  switch (fn) {
    case Fn::cuUserObjectCreate:
    case Fn::cuUserObjectRetain:
    case Fn::cuUserObjectRelease:
    case Fn::cuGraphRetainUserObject:
    case Fn::cuGraphReleaseUserObject:
      return true;
    default:
      return false;
  }
}

CUresult SessionGraphs::UserObjectCall(Fn fn, Reader& rd, Writer& out) {
  if (fn == Fn::cuUserObjectCreate) {
    // u64 client function id, u32 initial references, u32 flags -> u64 object.
    uint64_t id = 0;
    uint32_t refs = 0, flags = 0;
    rd.U64(&id);
    rd.U32(&refs);
    if (!rd.U32(&flags) || !rd.Finish() || id == 0 || refs == 0 || refs > kMaxRefs ||
        flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto* arg = new ReleaseArg{&h_, id};
    CUuserObject o = nullptr;
    CUresult r = CALL(cuUserObjectCreate, &o, arg, &Released, refs, flags);
    if (r != CUDA_SUCCESS) {
      delete arg;
      return r;
    }
    const uint64_t wire = h_.Handles().Publish(HandleKind::kUserObject, H(o));
    UserObjectEntry& e = user_objects_[wire];
    e.real = H(o);
    e.client_refs = refs;
    out.U64(wire);
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_NOT_SUPPORTED;
}

// ---- the generated reference calls (api/remote_surface.tsv, hook=check,done): the references the
// client holds and those it gave each graph, so that a release beyond them fails that call. A
// count of 0 or above kMaxRefs is CUDA_ERROR_INVALID_VALUE, as an unknown object is.

SessionGraphs::UserObjectEntry* SessionGraphs::UserObject(uint64_t real, uint32_t count, uint64_t* wire) {
  if (count == 0 || count > kMaxRefs || !h_.Handles().WireOf(HandleKind::kUserObject, real, wire)) return nullptr;
  auto it = user_objects_.find(*wire);
  return it == user_objects_.end() ? nullptr : &it->second;
}

// The object is the session's and, with `held`, the client (graph 0) or graph g holds count.
CUresult SessionGraphs::MayCount(uint64_t real, uint32_t count, bool held, uint64_t g) {
  uint64_t wire = 0;
  const UserObjectEntry* e = UserObject(real, count, &wire);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t have = held ? e->client_refs : count;
  if (held && g != 0) {
    auto gr = e->graph_refs.find(g);
    have = gr == e->graph_refs.end() ? 0 : gr->second;
  }
  return count <= have ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// After the driver: count references more (or fewer) for the client and for graph g.
CUresult SessionGraphs::Count(uint64_t real, uint32_t count, int client, int graph, uint64_t g) {
  uint64_t wire = 0;
  if (UserObjectEntry* e = UserObject(real, count, &wire)) {
    e->client_refs += static_cast<uint64_t>(int64_t{client} * count);
    if (graph != 0 && (e->graph_refs[g] += static_cast<uint64_t>(int64_t{graph} * count)) == 0) e->graph_refs.erase(g);
    RetireUserObjectIfUnused(wire);
  }
  return CUDA_SUCCESS;
}

CUresult SessionGraphs::Check_cuUserObjectRetain(uint64_t& o, uint32_t& n) { return MayCount(o, n, false, 0); }
CUresult SessionGraphs::Done_cuUserObjectRetain(const uint64_t& o, const uint32_t& n) { return Count(o, n, 1, 0, 0); }
CUresult SessionGraphs::Check_cuUserObjectRelease(uint64_t& o, uint32_t& n) { return MayCount(o, n, true, 0); }
CUresult SessionGraphs::Done_cuUserObjectRelease(const uint64_t& o, const uint32_t& n) { return Count(o, n, -1, 0, 0); }
// CU_GRAPH_USER_OBJECT_MOVE (flags=flags:0x1) moves references the client holds to the graph.
CUresult SessionGraphs::Check_cuGraphRetainUserObject(uint64_t&, uint64_t& o, uint32_t& n, uint32_t& flags) {
  return MayCount(o, n, (flags & CU_GRAPH_USER_OBJECT_MOVE) != 0, 0);
}
CUresult SessionGraphs::Done_cuGraphRetainUserObject(const uint64_t& g, const uint64_t& o, const uint32_t& n,
                                                     const uint32_t& flags) {
  return Count(o, n, (flags & CU_GRAPH_USER_OBJECT_MOVE) != 0 ? -1 : 0, 1, g);
}
CUresult SessionGraphs::Check_cuGraphReleaseUserObject(uint64_t& g, uint64_t& o, uint32_t& n) {
  return MayCount(o, n, true, g);
}
CUresult SessionGraphs::Done_cuGraphReleaseUserObject(const uint64_t& g, const uint64_t& o, const uint32_t& n) {
  return Count(o, n, 0, -1, g);
}

// A graph that goes releases what the client gave it (the driver does the same).
void SessionGraphs::ForgetUserObjectRefs(uint64_t graph) {
  std::vector<uint64_t> touched;
  for (auto& [wire, e] : user_objects_) {
    if (e.graph_refs.erase(graph)) touched.push_back(wire);
  }
  for (uint64_t wire : touched) RetireUserObjectIfUnused(wire);
}

// Neither the client nor one of its graphs holds a reference: the client cannot name the object
// any more (executable graphs may still hold it; the driver calls back when they let it go).
void SessionGraphs::RetireUserObjectIfUnused(uint64_t wire) {
  auto it = user_objects_.find(wire);
  if (it == user_objects_.end() || it->second.client_refs > 0 || !it->second.graph_refs.empty()) return;
  h_.Handles().Retire(HandleKind::kUserObject, wire);
  user_objects_.erase(it);
}

}  // namespace tf::worker
