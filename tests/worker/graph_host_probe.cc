// remote_probe mode "graphpageable": graph memcpy nodes that copy to and from pageable memory of
// the program (heap and stack), as NVIDIA's simpleCudaGraphs and jacobiCudaGraphs do. Remotely
// the worker copies through a shadow; what the program sees must be what it sees natively.
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "probe_util.h"

namespace {

using tf_probe::Setup;

CUDA_MEMCPY3D Linear(CUmemorytype st, const void* sh, CUdeviceptr sd, CUmemorytype dt, void* dh,
                     CUdeviceptr dd, size_t n) {
  CUDA_MEMCPY3D c = {};
  c.srcMemoryType = st;
  c.srcHost = sh;
  c.srcDevice = sd;
  c.dstMemoryType = dt;
  c.dstHost = dh;
  c.dstDevice = dd;
  c.WidthInBytes = n;
  c.Height = 1;
  c.Depth = 1;
  return c;
}

uint64_t Sum(const uint8_t* p, size_t n) {
  uint64_t s = 0;
  for (size_t i = 0; i < n; ++i) s = s * 31 + p[i];
  return s;
}

// Builds the graph (`result` is a stack variable of the caller) and, unless *keep is asked for,
// destroys it before its executable is launched (as the samples do).
CUgraphExec Build(CUcontext ctx, CUdeviceptr dev, const uint8_t* src, uint8_t* dst, size_t n,
                  double* result, CUdeviceptr dev_result, CUgraphNode* to_dst, CUgraph* keep) {
  CUgraph g;
  CHECK(cuGraphCreate(&g, 0));
  CUgraphNode up, down, res;
  CUDA_MEMCPY3D c = Linear(CU_MEMORYTYPE_HOST, src, 0, CU_MEMORYTYPE_DEVICE, nullptr, dev, n);
  CHECK(cuGraphAddMemcpyNode(&up, g, nullptr, 0, &c, ctx));
  c = Linear(CU_MEMORYTYPE_DEVICE, nullptr, dev, CU_MEMORYTYPE_HOST, dst, 0, n);
  CHECK(cuGraphAddMemcpyNode(&down, g, &up, 1, &c, ctx));
  c = Linear(CU_MEMORYTYPE_DEVICE, nullptr, dev_result, CU_MEMORYTYPE_UNIFIED, nullptr,
             reinterpret_cast<CUdeviceptr>(result), sizeof(double));
  CHECK(cuGraphAddMemcpyNode(&res, g, &up, 1, &c, ctx));
  *to_dst = down;
  CUgraphExec e;
  CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
  if (keep) *keep = g;
  else CHECK(cuGraphDestroy(g));
  return e;
}

}  // namespace

int GraphPageable() {
  CUcontext ctx = Setup();
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const size_t n = (3u << 20) + 123;  // an odd length, several MiB
  std::vector<uint8_t> src(n), dst(n, 0), other(n, 0);
  CUdeviceptr dev, dev_result;
  CHECK(cuMemAlloc(&dev, n));
  CHECK(cuMemAlloc(&dev_result, sizeof(double)));
  double result = 0;
  CUgraphNode to_dst;
  CUgraphExec e = Build(ctx, dev, src.data(), dst.data(), n, &result, dev_result, &to_dst, nullptr);
  // Each launch copies what the host holds at the launch; the program sees the copies' bytes
  // once it has synchronized with the stream.
  int rounds_ok = 0;
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i * 7 + round * 13);
    const double want = 1.5 + round;
    CHECK(cuMemcpyHtoD(dev_result, &want, sizeof(want)));
    result = -1;
    CHECK(cuGraphLaunch(e, s));
    CHECK(cuStreamSynchronize(s));
    if (memcmp(src.data(), dst.data(), n) == 0 && result == want) ++rounds_ok;
    std::memset(dst.data(), 0, n);
  }
  std::printf("rounds_ok=%d\n", rounds_ok);
  // An event recorded after the launch is a synchronization point too.
  CUevent ev;
  CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i ^ 0x5a);
  CHECK(cuGraphLaunch(e, s));
  CHECK(cuEventRecord(ev, s));
  CHECK(cuEventSynchronize(ev));
  std::printf("event_sync=%d\n", memcmp(src.data(), dst.data(), n) == 0);
  CHECK(cuGraphExecDestroy(e));
  // The executable's device-to-host node now writes other memory (its graph still exists: the
  // node is named by it).
  CUgraph kept;
  e = Build(ctx, dev, src.data(), dst.data(), n, &result, dev_result, &to_dst, &kept);
  CUDA_MEMCPY3D c = Linear(CU_MEMORYTYPE_DEVICE, nullptr, dev, CU_MEMORYTYPE_HOST, other.data(), 0, n);
  CHECK(cuGraphExecMemcpyNodeSetParams(e, to_dst, &c, ctx));
  std::memset(dst.data(), 0, n);
  CHECK(cuGraphLaunch(e, s));
  CHECK(cuCtxSynchronize());
  std::printf("exec_set=%d,%llx\n", memcmp(src.data(), other.data(), n) == 0,
              static_cast<unsigned long long>(Sum(dst.data(), 64)));
  CHECK(cuGraphExecDestroy(e));
  CHECK(cuGraphDestroy(kept));
  // A pitched device-to-host copy into the middle of a larger host buffer: the bytes between the
  // rows stay the program's.
  const size_t width = 100, pitch = 256, rows = 5;
  std::vector<uint8_t> grid(pitch * rows + 64, 0xee);
  std::vector<uint8_t> rowsrc(width * rows);
  for (size_t i = 0; i < rowsrc.size(); ++i) rowsrc[i] = static_cast<uint8_t>(i);
  CUdeviceptr dgrid;
  CHECK(cuMemAlloc(&dgrid, rowsrc.size()));
  CHECK(cuMemcpyHtoD(dgrid, rowsrc.data(), rowsrc.size()));
  CUgraph g;
  CHECK(cuGraphCreate(&g, 0));
  CUDA_MEMCPY3D p = {};
  p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  p.srcDevice = dgrid;
  p.srcPitch = width;
  p.dstMemoryType = CU_MEMORYTYPE_HOST;
  p.dstHost = grid.data();
  p.dstXInBytes = 10;
  p.dstPitch = pitch;
  p.WidthInBytes = width;
  p.Height = rows;
  p.Depth = 1;
  CUgraphNode pn;
  CHECK(cuGraphAddMemcpyNode(&pn, g, nullptr, 0, &p, ctx));
  CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
  // The program writes between the rows after building the graph: the launch must keep it.
  for (size_t r = 0; r < rows; ++r) grid[r * pitch + 200] = 0x42;
  CHECK(cuGraphLaunch(e, s));
  CHECK(cuStreamSynchronize(s));
  std::printf("pitched=%llx\n", static_cast<unsigned long long>(Sum(grid.data(), grid.size())));
  CHECK(cuGraphExecDestroy(e));
  CHECK(cuGraphDestroy(g));
  // Stream capture (graphMemoryNodes): async copies with pageable memory on a capturing stream
  // become memcpy nodes; nothing is copied until the graph runs.
  std::vector<uint8_t> in(n), out(n, 0);
  uint32_t word = 0;
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<uint8_t>(i * 3);
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(cuMemcpyHtoDAsync(dev, in.data(), n, s));
  CHECK(cuMemcpyDtoHAsync(out.data(), dev, n, s));
  CHECK(cuMemcpyDtoHAsync(&word, dev + 4, sizeof(word), s));
  CHECK(cuStreamEndCapture(s, &g));
  std::printf("captured_untouched=%d\n", out[1] == 0 && word == 0);
  CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
  CHECK(cuGraphDestroy(g));
  int captured_ok = 0;
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < n; ++i) in[i] = static_cast<uint8_t>(i * 3 + round * 101);
    CHECK(cuGraphLaunch(e, s));
    CHECK(cuStreamSynchronize(s));
    uint32_t want;
    std::memcpy(&want, in.data() + 4, sizeof(want));
    if (memcmp(in.data(), out.data(), n) == 0 && word == want) ++captured_ok;
  }
  std::printf("captured_ok=%d\n", captured_ok);
  CHECK(cuGraphExecDestroy(e));
  // simpleCudaGraphs over TCP: a captured copy larger than one slice of the transport is one node
  // of the graph, as natively, and moves every byte at each launch.
  {
    const size_t big = 40u << 20;
    CUdeviceptr bdev;
    CHECK(cuMemAlloc(&bdev, big));
    std::vector<uint8_t> bin(big), bout(big, 0);
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuMemcpyHtoDAsync(bdev, bin.data(), big, s));
    CHECK(cuMemcpyDtoHAsync(bout.data(), bdev, big, s));
    CHECK(cuStreamEndCapture(s, &g));
    size_t nodes = 0;
    CHECK(cuGraphGetNodes(g, nullptr, &nodes));
    std::printf("captured_big_nodes=%zu\n", nodes);
    CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
    int big_ok = 0;
    for (int round = 0; round < 2; ++round) {
      for (size_t i = 0; i < big; ++i) bin[i] = static_cast<uint8_t>(i * 5 + (i >> 20) + round * 7);
      CHECK(cuGraphLaunch(e, s));
      CHECK(cuStreamSynchronize(s));
      big_ok += memcmp(bin.data(), bout.data(), big) == 0;
    }
    std::printf("captured_big_ok=%d\n", big_ok);
    CHECK(cuGraphExecDestroy(e));
    CHECK(cuGraphDestroy(g));
    CHECK(cuMemFree(bdev));
  }
  // simpleCudaGraphs: a host function captured after a copy into a stack variable runs at every
  // launch and sees what the copy wrote.
  {
    struct Seen {
      const uint32_t* word;
      std::vector<uint32_t> values;
    } seen{&word, {}};
    auto record = [](void* p) {
      auto* x = static_cast<Seen*>(p);
      x->values.push_back(*x->word);
    };
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuMemcpyHtoDAsync(dev, in.data(), n, s));
    CHECK(cuMemcpyDtoHAsync(&word, dev + 8, sizeof(word), s));
    CHECK(cuLaunchHostFunc(s, record, &seen));
    CHECK(cuStreamEndCapture(s, &g));
    std::printf("captured_host_untouched=%d\n", seen.values.empty());
    CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
    std::vector<uint32_t> want;
    for (int round = 0; round < 3; ++round) {
      for (size_t i = 0; i < n; ++i) in[i] = static_cast<uint8_t>(i * 7 + round * 13);
      uint32_t w;
      std::memcpy(&w, in.data() + 8, sizeof(w));
      want.push_back(w);
      CHECK(cuGraphLaunch(e, s));
      CHECK(cuStreamSynchronize(s));
    }
    std::printf("captured_host_runs=%zu\ncaptured_host_saw_copy=%d\n", seen.values.size(),
                seen.values == want);
    CHECK(cuGraphExecDestroy(e));
    CHECK(cuGraphDestroy(g));
  }
  // graphMemoryNodes: a node naming a whole buffer that captured copies named in slices.
  {
    CHECK(cuGraphCreate(&g, 0));
    CUDA_MEMCPY3D c = Linear(CU_MEMORYTYPE_HOST, in.data(), 0, CU_MEMORYTYPE_DEVICE, nullptr, dev, n);
    CUgraphNode node;
    CHECK(cuGraphAddMemcpyNode(&node, g, nullptr, 0, &c, ctx));
    CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
    for (size_t i = 0; i < n; ++i) in[i] = static_cast<uint8_t>(i * 5 + 1);
    CHECK(cuGraphLaunch(e, s));
    CHECK(cuStreamSynchronize(s));
    std::vector<uint8_t> back(n, 0);
    CHECK(cuMemcpyDtoH(back.data(), dev, n));
    std::printf("whole_after_slices_ok=%d\n", back == in);
    CHECK(cuGraphExecDestroy(e));
    CHECK(cuGraphDestroy(g));
  }
  std::printf("done=1\n");
  return 0;
}

namespace {

CUgraphNode KernelNode(CUgraph g, const CUgraphNode* deps, size_t ndeps, CUfunction f, void** args) {
  CUDA_KERNEL_NODE_PARAMS k = {};
  k.func = f;
  k.gridDimX = k.gridDimY = k.gridDimZ = 1;
  k.blockDimX = k.blockDimY = k.blockDimZ = 1;
  k.kernelParams = args;
  CUgraphNode n;
  CHECK(cuGraphAddKernelNode(&n, g, deps, ndeps, &k));
  return n;
}

CUgraphNode Conditional(CUgraph g, const CUgraphNode* deps, size_t ndeps, CUgraphConditionalHandle h,
                        CUgraphConditionalNodeType type, unsigned size, CUcontext ctx, CUgraph** bodies) {
  CUgraphNodeParams p = {};
  p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  p.conditional.handle = h;
  p.conditional.type = type;
  p.conditional.size = size;
  p.conditional.ctx = ctx;
  CUgraphNode n;
  CHECK(cuGraphAddNode(&n, g, deps, nullptr, ndeps, &p));
  *bodies = p.conditional.phGraph_out;
  return n;
}

unsigned Read(CUdeviceptr p) {
  unsigned v = 0;
  CHECK(cuMemcpyDtoH(&v, p, sizeof(v)));
  return v;
}

}  // namespace

// remote_probe mode "graphconditional" (NVIDIA's graphConditionalNodes): conditional nodes whose
// handle a kernel sets on the device (the fake driver's set_conditional kernel), IF with an else
// body, SWITCH, WHILE; nodes added to the bodies the driver created.
int GraphConditional() {
  CUcontext ctx = Setup();
  CUfunction fill = tf_probe::Kernel("fill_u32");
  CUfunction set = tf_probe::Kernel("set_conditional");
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr out;
  CHECK(cuMemAlloc(&out, 16));
  size_t one = 1;
  auto fill_node = [&](CUgraph g, const CUgraphNode* deps, size_t nd, CUdeviceptr* dst, unsigned* v) {
    void* args[] = {dst, v, &one};
    return KernelNode(g, deps, nd, fill, args);
  };
  // IF/ELSE, the value from the handle's default at each launch.
  unsigned if_then = 0x111, if_else = 0x222;
  for (unsigned dflt : {1u, 0u}) {
    CUgraph g;
    CHECK(cuGraphCreate(&g, 0));
    CUgraphConditionalHandle h;
    CHECK(cuGraphConditionalHandleCreate(&h, g, ctx, dflt, CU_GRAPH_COND_ASSIGN_DEFAULT));
    CUgraph* bodies = nullptr;
    Conditional(g, nullptr, 0, h, CU_GRAPH_COND_TYPE_IF, 2, ctx, &bodies);
    fill_node(bodies[0], nullptr, 0, &out, &if_then);
    fill_node(bodies[1], nullptr, 0, &out, &if_else);
    CUgraphExec e;
    CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
    CHECK(cuGraphLaunch(e, s));
    CHECK(cuStreamSynchronize(s));
    std::printf("if_default_%u=%x\n", dflt, Read(out));
    CHECK(cuGraphExecDestroy(e));
    CHECK(cuGraphDestroy(g));
  }
  // SWITCH: a kernel before the node sets the handle on the device; body i writes 10 + i.
  {
    CUgraph g;
    CHECK(cuGraphCreate(&g, 0));
    CUgraphConditionalHandle h;
    CHECK(cuGraphConditionalHandleCreate(&h, g, ctx, 0, CU_GRAPH_COND_ASSIGN_DEFAULT));
    unsigned pick = 2;
    void* set_args[] = {&h, &pick};
    CUgraphNode k = KernelNode(g, nullptr, 0, set, set_args);
    CUgraph* bodies = nullptr;
    Conditional(g, &k, 1, h, CU_GRAPH_COND_TYPE_SWITCH, 3, ctx, &bodies);
    unsigned values[3] = {10, 11, 12};
    for (int i = 0; i < 3; ++i) fill_node(bodies[i], nullptr, 0, &out, &values[i]);
    CUgraphExec e;
    CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
    CHECK(cuGraphLaunch(e, s));
    CHECK(cuStreamSynchronize(s));
    std::printf("switch=%u\n", Read(out));
    CUresult bad = cuGraphDestroy(bodies[0]);
    std::printf("destroy_body_refused=%d\n", bad != CUDA_SUCCESS);
    CHECK(cuGraphExecDestroy(e));
    CHECK(cuGraphDestroy(g));
  }
  // WHILE: the body writes, then clears the handle; one iteration.
  {
    CUgraph g;
    CHECK(cuGraphCreate(&g, 0));
    CUgraphConditionalHandle h;
    CHECK(cuGraphConditionalHandleCreate(&h, g, ctx, 1, CU_GRAPH_COND_ASSIGN_DEFAULT));
    CUgraph* bodies = nullptr;
    Conditional(g, nullptr, 0, h, CU_GRAPH_COND_TYPE_WHILE, 1, ctx, &bodies);
    unsigned w = 0x333, zero = 0;
    CUgraphNode f = fill_node(bodies[0], nullptr, 0, &out, &w);
    void* clear_args[] = {&h, &zero};
    KernelNode(bodies[0], &f, 1, set, clear_args);
    CUgraphExec e;
    CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
    CHECK(cuGraphLaunch(e, s));
    CHECK(cuStreamSynchronize(s));
    std::printf("while=%x\n", Read(out));
    CHECK(cuGraphExecDestroy(e));
    CHECK(cuGraphDestroy(g));
  }
  // WHILE whose body is built by capturing into it, the capture ended without a graph output
  // (NVIDIA's graphConditionalNodes, simpleDoWhileGraph).
  {
    CUgraph g;
    CHECK(cuGraphCreate(&g, 0));
    CUgraphConditionalHandle h;
    CHECK(cuGraphConditionalHandleCreate(&h, g, ctx, 1, CU_GRAPH_COND_ASSIGN_DEFAULT));
    CUgraph* bodies = nullptr;
    Conditional(g, nullptr, 0, h, CU_GRAPH_COND_TYPE_WHILE, 1, ctx, &bodies);
    CUstream cs;
    CHECK(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamBeginCaptureToGraph(cs, bodies[0], nullptr, nullptr, 0, CU_STREAM_CAPTURE_MODE_GLOBAL));
    unsigned w = 0x444, zero = 0;
    void* fill_args[] = {&out, &w, &one};
    CHECK(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, cs, fill_args, nullptr));
    void* clear_args[] = {&h, &zero};
    CHECK(cuLaunchKernel(set, 1, 1, 1, 1, 1, 1, 0, cs, clear_args, nullptr));
    CHECK(cuStreamEndCapture(cs, nullptr));
    CHECK(cuStreamDestroy(cs));
    size_t body_nodes = 0;
    CHECK(cuGraphGetNodes(bodies[0], nullptr, &body_nodes));
    CUgraphExec e;
    CHECK(cuGraphInstantiateWithFlags(&e, g, 0));
    CHECK(cuGraphLaunch(e, s));
    CHECK(cuStreamSynchronize(s));
    std::printf("captured_while=%x\nbody_nodes=%zu\n", Read(out), body_nodes);
    CHECK(cuGraphExecDestroy(e));
    CHECK(cuGraphDestroy(g));
  }
  std::printf("done=1\n");
  return 0;
}
