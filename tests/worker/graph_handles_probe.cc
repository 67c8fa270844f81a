// remote_probe mode "vgraphs" (run remotely only): graphs, graph nodes and executable graphs are
// names of the session, not the driver's handles. A forged name, a stale one (destroyed, or gone
// with its graph, its child graph node or its clone), one of another kind or of another session
// fails its call (CUDA_ERROR_INVALID_VALUE; a launch's CUDA_ERROR_INVALID_HANDLE surfaces at the
// stream's synchronize) and nothing else: the session's own graphs keep working.
#include <cuda.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>

#include "probe_util.h"

namespace {

using tf_probe::Setup;

template <class T>
uint64_t U(T h) {
  return reinterpret_cast<uint64_t>(h);
}
template <class T>
T Forge(uint64_t v) {
  return reinterpret_cast<T>(v);
}
// Names carry 0x40 | kind in their top byte (src/worker/session_handles.h).
bool LooksLikeName(uint64_t v) { return (v >> 56) > 0x40 && (v >> 56) <= 0x5f; }

int Err(CUresult r) { return static_cast<int>(r); }

CUgraphNode AddMemset(CUgraph g, const CUgraphNode* deps, size_t n, CUdeviceptr dst, unsigned value,
                      CUcontext ctx) {
  CUDA_MEMSET_NODE_PARAMS m = {};
  m.dst = dst;
  m.value = value;
  m.elementSize = 4;
  m.width = 16;
  m.height = 1;
  CUgraphNode node;
  CHECK(cuGraphAddMemsetNode(&node, g, deps, n, &m, ctx));
  return node;
}

int NodeType(CUgraphNode n) {
  CUgraphNodeType t;
  return Err(cuGraphNodeGetType(n, &t));
}

int NodeCount(CUgraph g) {
  size_t n = 0;
  return Err(cuGraphGetNodes(g, nullptr, &n));
}

int ExecFlags(CUgraphExec e) {
  cuuint64_t f = 0;
  return Err(cuGraphExecGetFlags(e, &f));
}

// A launch is fire-and-forget: its error shows at the stream's synchronize.
int Launch(CUgraphExec e, CUstream s) {
  CUresult r = cuGraphLaunch(e, s);
  CUresult sync = cuStreamSynchronize(s);
  return Err(r != CUDA_SUCCESS ? r : sync);
}

}  // namespace

int GraphHandles() {
  CUcontext ctx = Setup();
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, 64));
  CUgraph g;
  CHECK(cuGraphCreate(&g, 0));
  CUgraphNode n1 = AddMemset(g, nullptr, 0, d, 7, ctx);
  CUgraphNode n_empty;
  CHECK(cuGraphAddEmptyNode(&n_empty, g, &n1, 1));
  CUgraphExec e;
  CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
  CHECK(cuGraphLaunch(e, s));
  CHECK(cuStreamSynchronize(s));
  std::printf("names_not_pointers=%d\n",
              LooksLikeName(U(g)) && LooksLikeName(U(n1)) && LooksLikeName(U(n_empty)) && LooksLikeName(U(e)));
  // Names the worker gave back by a query are the same names.
  CUgraphNode listed[4] = {};
  size_t count = 4;
  CHECK(cuGraphGetNodes(g, listed, &count));
  std::printf("listed_same_names=%d\n", count == 2 && ((listed[0] == n1 && listed[1] == n_empty) ||
                                                        (listed[0] == n_empty && listed[1] == n1)));
  count = 4;
  CHECK(cuGraphGetRootNodes(g, listed, &count));
  std::printf("root_same_name=%d\n", count == 1 && listed[0] == n1);

  // Forged: a flipped bit of the check, a neighbour slot, a pointer-shaped value.
  CUgraphNode tmp;
  std::printf("forged_graph=%d\n", Err(cuGraphAddEmptyNode(&tmp, Forge<CUgraph>(U(g) ^ (1ull << 30)), nullptr, 0)));
  std::printf("forged_node=%d\n", NodeType(Forge<CUgraphNode>(U(n1) ^ (1ull << 30))));
  CUgraphNode forged_dep = Forge<CUgraphNode>(U(n_empty) ^ (1ull << 40));
  std::printf("forged_dep_node=%d\n", Err(cuGraphAddEmptyNode(&tmp, g, &forged_dep, 1)));
  std::printf("forged_exec=%d\n", ExecFlags(Forge<CUgraphExec>(0x7f0000002000)));
  std::printf("forged_exec_launch=%d\n", Launch(Forge<CUgraphExec>(U(e) ^ (1ull << 33)), s));

  // Another kind's name.
  std::printf("kind_graph_as_node=%d\n", NodeType(Forge<CUgraphNode>(U(g))));
  std::printf("kind_node_as_graph=%d\n", NodeCount(Forge<CUgraph>(U(n1))));
  CUgraph clone_bad;
  std::printf("kind_exec_as_graph=%d\n", Err(cuGraphClone(&clone_bad, Forge<CUgraph>(U(e)))));
  std::printf("kind_graph_as_exec=%d\n", ExecFlags(Forge<CUgraphExec>(U(g))));
  std::printf("kind_stream_as_graph=%d\n", NodeCount(Forge<CUgraph>(U(s))));
  std::printf("kind_node_as_exec_launch=%d\n", Launch(Forge<CUgraphExec>(U(n1)), s));

  // Stale: an executable graph destroyed; a graph destroyed with its nodes; a node destroyed.
  CUgraph g2;
  CHECK(cuGraphCreate(&g2, 0));
  CUgraphNode n2 = AddMemset(g2, nullptr, 0, d, 9, ctx);
  CUgraphExec e2;
  CHECK(cuGraphInstantiateWithFlags(&e2, g2, 0));
  CHECK(cuGraphExecDestroy(e2));
  std::printf("stale_exec=%d\n", ExecFlags(e2));
  std::printf("stale_exec_destroy=%d\n", Err(cuGraphExecDestroy(e2)));
  std::printf("stale_exec_launch=%d\n", Launch(e2, s));
  CHECK(cuGraphDestroy(g2));
  std::printf("stale_graph=%d\n", NodeCount(g2));
  std::printf("stale_graph_destroy=%d\n", Err(cuGraphDestroy(g2)));
  std::printf("stale_node_of_graph=%d\n", NodeType(n2));
  CUgraph g3;
  CHECK(cuGraphCreate(&g3, 0));
  std::printf("fresh_graph_new_name=%d\n", U(g3) != U(g2));
  CUgraphNode n3;
  CHECK(cuGraphAddEmptyNode(&n3, g3, nullptr, 0));
  CHECK(cuGraphDestroyNode(n3));
  std::printf("stale_node=%d\n", NodeType(n3));
  std::printf("stale_node_destroy=%d\n", Err(cuGraphDestroyNode(n3)));
  std::printf("stale_node_dependency=%d\n", Err(cuGraphAddEmptyNode(&tmp, g3, &n3, 1)));

  // A child graph node's graph goes with the node; a clone's nodes go with the clone.
  CUgraph child;
  CHECK(cuGraphCreate(&child, 0));
  AddMemset(child, nullptr, 0, d, 5, ctx);
  CUgraphNode cn;
  CHECK(cuGraphAddChildGraphNode(&cn, g3, nullptr, 0, child));
  CUgraph embedded;
  CHECK(cuGraphChildGraphNodeGetGraph(cn, &embedded));
  std::printf("embedded_is_name=%d\n", LooksLikeName(U(embedded)) && embedded != child);
  std::printf("embedded_destroy=%d\n", Err(cuGraphDestroy(embedded)));  // the node's, not the client's
  CHECK(cuGraphDestroyNode(cn));
  std::printf("stale_embedded=%d\n", Err(cuGraphDestroy(embedded)));
  CUgraph cl;
  CHECK(cuGraphClone(&cl, g));
  CUgraphNode in_clone;
  CHECK(cuGraphNodeFindInClone(&in_clone, n1, cl));
  std::printf("clone_node_is_new_name=%d\n", LooksLikeName(U(in_clone)) && in_clone != n1);
  std::printf("clone_node=%d\n", NodeType(in_clone));
  CHECK(cuGraphDestroy(cl));
  std::printf("stale_clone=%d\n", NodeCount(cl));
  std::printf("stale_clone_node=%d\n", NodeType(in_clone));

  // Stream capture: the captured graph is a name; instantiated and launched like any other.
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  CHECK(cuMemsetD32Async(d + 32, 3, 8, s));
  CUgraph captured;
  CHECK(cuStreamEndCapture(s, &captured));
  CUgraphExec ce;
  CHECK(cuGraphInstantiateWithFlags(&ce, captured, 0));
  std::printf("captured_is_name=%d\n", LooksLikeName(U(captured)) && LooksLikeName(U(ce)));
  std::printf("captured_launch=%d\n", Launch(ce, s));
  std::fflush(stdout);

  // Another session's names: a forked child gets a session of its own.
  pid_t pid = fork();
  if (pid == 0) {
    Setup();
    CUgraph mine;
    CHECK(cuGraphCreate(&mine, 0));
    CUgraphNode my_node;
    CHECK(cuGraphAddEmptyNode(&my_node, mine, nullptr, 0));
    std::printf("other_session_graph=%d\n", NodeCount(g));
    std::printf("other_session_node=%d\n", NodeType(n1));
    std::printf("other_session_exec=%d\n", ExecFlags(e));
    std::printf("other_session_own_graph=%d\n", NodeCount(mine));
    std::fflush(stdout);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  std::printf("child_status=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);

  // Nothing else changed: the session's own graphs still work.
  CHECK(cuMemsetD32(d, 0, 16));
  std::printf("still_launches=%d\n", Launch(e, s));
  uint32_t v[16] = {};
  CHECK(cuMemcpyDtoH(v, d, sizeof(v)));
  std::printf("still_works=%d\n", v[0] == 7 && v[15] == 7 && NodeType(n1) == 0 && ExecFlags(e) == 0);
  CHECK(cuGraphExecDestroy(ce));
  CHECK(cuGraphDestroy(captured));
  CHECK(cuGraphExecDestroy(e));
  CHECK(cuGraphDestroy(g));
  CHECK(cuGraphDestroy(g3));
  CHECK(cuGraphDestroy(child));
  return 0;
}
