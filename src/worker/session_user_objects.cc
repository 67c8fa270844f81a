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
  // Retain/Release: u64 object, u32 count. Graph{Retain,Release}UserObject: u64 graph, u64 object,
  // u32 count [, u32 flags: Retain].
  uint64_t g = 0, wire = 0;
  uint32_t count = 0, flags = 0;
  const bool graph = fn == Fn::cuGraphRetainUserObject || fn == Fn::cuGraphReleaseUserObject;
  if (graph) ReadReal(rd, HandleKind::kGraph, &g);
  rd.U64(&wire);
  rd.U32(&count);
  if (fn == Fn::cuGraphRetainUserObject) rd.U32(&flags);
  if (!rd.Finish() || count == 0 || count > kMaxRefs) return CUDA_ERROR_INVALID_VALUE;
  auto it = user_objects_.find(wire);
  if (it == user_objects_.end()) return CUDA_ERROR_INVALID_VALUE;
  if (graph && !graphs_.count(g)) return CUDA_ERROR_INVALID_VALUE;
  UserObjectEntry& e = it->second;
  CUuserObject o = reinterpret_cast<CUuserObject>(e.real);
  CUresult r = CUDA_SUCCESS;
  switch (fn) {
    case Fn::cuUserObjectRetain:
      r = CALL(cuUserObjectRetain, o, count);
      if (r == CUDA_SUCCESS) e.client_refs += count;
      return r;
    case Fn::cuUserObjectRelease:
      if (count > e.client_refs) return CUDA_ERROR_INVALID_VALUE;
      r = CALL(cuUserObjectRelease, o, count);
      if (r == CUDA_SUCCESS) e.client_refs -= count;
      break;
    case Fn::cuGraphRetainUserObject: {
      const bool move = (flags & CU_GRAPH_USER_OBJECT_MOVE) != 0;
      if ((flags & ~CU_GRAPH_USER_OBJECT_MOVE) || (move && count > e.client_refs)) return CUDA_ERROR_INVALID_VALUE;
      r = CALL(cuGraphRetainUserObject, reinterpret_cast<CUgraph>(g), o, count, flags);
      if (r == CUDA_SUCCESS) {
        e.graph_refs[g] += count;
        if (move) e.client_refs -= count;
      }
      break;
    }
    case Fn::cuGraphReleaseUserObject: {
      auto gr = e.graph_refs.find(g);
      if (gr == e.graph_refs.end() || count > gr->second) return CUDA_ERROR_INVALID_VALUE;
      r = CALL(cuGraphReleaseUserObject, reinterpret_cast<CUgraph>(g), o, count);
      if (r == CUDA_SUCCESS && (gr->second -= count) == 0) e.graph_refs.erase(gr);
      break;
    }
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
  RetireUserObjectIfUnused(wire);
  return r;
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
