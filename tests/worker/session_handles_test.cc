// The session handle table: what a client can and cannot do with the names it was given.
#include "worker/session_handles.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <vector>

#include "client/remote_arrays.h"
#include "worker/session_arrays.h"
#include "worker/session_graph_host.h"
#include "worker/session_graphs.h"
#include "worker/session_host_memory.h"

namespace tf::worker {
namespace {

constexpr uint64_t kRealStream = 0x55550000a000;  // shaped like heap pointers
constexpr uint64_t kRealEvent = 0x55550000b000;

TEST(HandleTable, NamesAreNeitherPointersNorTheSpecialStreams) {
  HandleTable t(1234);
  const uint64_t s = t.Publish(HandleKind::kStream, kRealStream);
  EXPECT_NE(s, kRealStream);
  EXPECT_GT(s, 2u);
  EXPECT_TRUE(HandleTable::LooksLikeName(s));
  EXPECT_FALSE(HandleTable::LooksLikeName(kRealStream));
  // Not a canonical x86-64/aarch64 user or kernel address: bits 47-63 are not all equal.
  const uint64_t high = s >> 47;
  EXPECT_NE(high, 0u);
  EXPECT_NE(high, (1ull << 17) - 1);
  uint64_t real = 0;
  ASSERT_TRUE(t.Resolve(HandleKind::kStream, s, &real));
  EXPECT_EQ(real, kRealStream);
  for (uint64_t special : {0ull, 1ull, 2ull}) {
    EXPECT_EQ(t.Publish(HandleKind::kStream, special), special);
    ASSERT_TRUE(t.Resolve(HandleKind::kStream, special, &real));
    EXPECT_EQ(real, special);
  }
  EXPECT_EQ(t.Publish(HandleKind::kEvent, 0), 0u);
  EXPECT_FALSE(t.Resolve(HandleKind::kEvent, 0, &real));
  EXPECT_FALSE(t.Resolve(HandleKind::kContext, 1, &real));
}

TEST(HandleTable, SameObjectSameNameUntilRetiredThenNeverAgain) {
  HandleTable t(99);
  const uint64_t a = t.Publish(HandleKind::kFunction, kRealStream);
  EXPECT_EQ(t.Publish(HandleKind::kFunction, kRealStream), a);
  uint64_t w = 0;
  ASSERT_TRUE(t.WireOf(HandleKind::kFunction, kRealStream, &w));
  EXPECT_EQ(w, a);
  EXPECT_TRUE(t.Retire(HandleKind::kFunction, a));
  uint64_t real = 0;
  EXPECT_FALSE(t.Resolve(HandleKind::kFunction, a, &real));  // stale
  EXPECT_FALSE(t.Retire(HandleKind::kFunction, a));
  EXPECT_FALSE(t.WireOf(HandleKind::kFunction, kRealStream, &w));
  // The driver hands out the same address again (a new object): a new name, the old one stays dead.
  std::set<uint64_t> seen{a};
  for (int i = 0; i < 1000; ++i) {
    const uint64_t n = t.Publish(HandleKind::kFunction, kRealStream);
    EXPECT_TRUE(seen.insert(n).second) << "name reused after retire";
    EXPECT_FALSE(t.Resolve(HandleKind::kFunction, a, &real));
    ASSERT_TRUE(t.RetireReal(HandleKind::kFunction, kRealStream));
  }
  EXPECT_EQ(t.Live(HandleKind::kFunction), 0u);
}

// A primary context reset retires every name of a kind at once: none of them resolves again,
// other kinds keep theirs, and the same objects published again get new names.
TEST(HandleTable, RetireAllRetiresEveryNameOfOneKindOnly) {
  HandleTable t(99);
  std::vector<uint64_t> streams;
  for (uint64_t real = 0x1000; real < 0x1000 + 8 * 0x10; real += 0x10) {
    streams.push_back(t.Publish(HandleKind::kStream, real));
  }
  const uint64_t ctx = t.Publish(HandleKind::kContext, 0x9000);
  EXPECT_EQ(t.RetireAll(HandleKind::kStream), 8u);
  EXPECT_EQ(t.Live(HandleKind::kStream), 0u);
  uint64_t real = 0;
  for (uint64_t s : streams) EXPECT_FALSE(t.Resolve(HandleKind::kStream, s, &real));
  EXPECT_TRUE(t.Resolve(HandleKind::kContext, ctx, &real));
  EXPECT_EQ(real, 0x9000u);
  const uint64_t again = t.Publish(HandleKind::kStream, 0x1000);
  EXPECT_NE(again, streams[0]);
  EXPECT_EQ(t.RetireAll(HandleKind::kEvent), 0u);
}

TEST(HandleTable, ANameOfAnotherKindFails) {
  HandleTable t(7);
  const uint64_t s = t.Publish(HandleKind::kStream, kRealStream);
  const uint64_t e = t.Publish(HandleKind::kEvent, kRealEvent);
  uint64_t real = 0;
  EXPECT_FALSE(t.Resolve(HandleKind::kEvent, s, &real));
  EXPECT_FALSE(t.Resolve(HandleKind::kStream, e, &real));
  EXPECT_FALSE(t.Retire(HandleKind::kEvent, s));
  // The same real value may be two kinds' objects (a kernel and a function): two names.
  const uint64_t k = t.Publish(HandleKind::kKernel, kRealStream);
  EXPECT_NE(k, s);
  ASSERT_TRUE(t.Resolve(HandleKind::kKernel, k, &real));
  EXPECT_EQ(real, kRealStream);
  ASSERT_TRUE(t.Resolve(HandleKind::kStream, s, &real));
  EXPECT_EQ(real, kRealStream);
}

TEST(HandleTable, ANameOfAnotherSessionOrAForgedOneFails) {
  HandleTable a(0x1111), b(0x2222);
  const uint64_t na = a.Publish(HandleKind::kStream, kRealStream);
  const uint64_t nb = b.Publish(HandleKind::kStream, kRealStream);
  EXPECT_NE(na, nb);
  uint64_t real = 0;
  EXPECT_FALSE(b.Resolve(HandleKind::kStream, na, &real));
  EXPECT_FALSE(a.Resolve(HandleKind::kStream, nb, &real));
  // Forged: the real pointer, a neighbour slot, flipped check bits, an out-of-range index.
  EXPECT_FALSE(a.Resolve(HandleKind::kStream, kRealStream, &real));
  EXPECT_FALSE(a.Resolve(HandleKind::kStream, na + 1, &real));
  EXPECT_FALSE(a.Resolve(HandleKind::kStream, na ^ (1ull << 30), &real));
  EXPECT_FALSE(a.Resolve(HandleKind::kStream, (na & ~0xffffffull) | 0xfffff0, &real));
  // Two tables with random salts disagree too.
  HandleTable r1, r2;
  const uint64_t n1 = r1.Publish(HandleKind::kEvent, kRealEvent);
  EXPECT_FALSE(r2.Resolve(HandleKind::kEvent, n1, &real));
}

TEST(HandleTable, ManyLiveHandlesResolveToTheirOwnObjects) {
  HandleTable t(5);
  std::vector<uint64_t> names;
  for (uint64_t i = 0; i < 100000; ++i) names.push_back(t.Publish(HandleKind::kGraphNode, 0x1000 + i * 16));
  for (uint64_t i = 0; i < names.size(); i += 2) ASSERT_TRUE(t.Retire(HandleKind::kGraphNode, names[i]));
  uint64_t real = 0;
  for (uint64_t i = 0; i < names.size(); ++i) {
    const bool live = i % 2 == 1;
    ASSERT_EQ(t.Resolve(HandleKind::kGraphNode, names[i], &real), live);
    if (live) {
      EXPECT_EQ(real, 0x1000 + i * 16);
    }
  }
  EXPECT_EQ(t.Live(HandleKind::kGraphNode), 50000u);
}

#ifdef TF_FAKECUDA
// Graphs, graph nodes and executable graphs of a session (SessionGraphs) on the fake driver: the
// messages carry names of the session's table, never the driver's handles, and a name of another
// session, another kind, a forged or a stale one fails that call with CUDA_ERROR_INVALID_VALUE.
using driver::Fn;

// What SessionGraphs needs of its session, for calls without memory, streams or kernels.
class TestHost : public GraphHost {
 public:
  TestHost(const driver::DriverTable& d, uint64_t salt)
      : d_(d), table_(salt), host_memory_(d, 0), copies_(d, host_memory_) {}
  const driver::DriverTable& Driver() const override { return d_; }
  bool DeviceRange(uint64_t, uint64_t) const override { return false; }
  bool KnownStream(uint64_t& s) const override { return table_.Resolve(HandleKind::kStream, s, &s); }
  bool KnownEvent(uint64_t&) const override { return false; }
  bool KnownContext(uint64_t&) const override { return false; }
  HandleTable& Handles() override { return table_; }
  bool KnownDevice(int32_t d) const override { return d == 0; }
  void* HostRegionAddress(uint64_t, uint64_t) override { return nullptr; }
  GraphHostCopies& HostCopies() override { return copies_; }
  CUresult DecodeKernelNode(transport::Reader&, KernelArgs*, CUDA_KERNEL_NODE_PARAMS*) override {
    return CUDA_ERROR_INVALID_VALUE;
  }
  bool ParamSizes(uint64_t, std::vector<size_t>*) const override { return false; }
  uint64_t FunctionHandedOut(uint64_t f) override { return f; }
  void AddAllocation(uint64_t, uint64_t) override {}
  void RemoveAllocation(uint64_t) override {}
  void HostNodeFunction(uint64_t, CUhostFn*, void**) override {}
  void HostRunsEnqueued(int64_t) override {}
  uint64_t HostNodeIdOf(CUhostFn, void*) const override { return 0; }
  uint64_t ClientHostAddress(const void* p) const override { return reinterpret_cast<uint64_t>(p); }
  void UserObjectReleased(uint64_t) override {}
  bool SendCallData(uint64_t, const void*, uint64_t) override { return false; }
  uint64_t CallDataLimit() const override { return 1 << 20; }

 private:
  const driver::DriverTable& d_;
  HandleTable table_;
  SessionHostMemory host_memory_;
  GraphHostCopies copies_;
};

class SessionGraphsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    lib_ = dlopen(TF_FAKECUDA, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(lib_, nullptr) << dlerror();
    ASSERT_GT(d_.Load(lib_), 0);
    ASSERT_EQ(d_.cuInit(0), CUDA_SUCCESS);
    CUcontext ctx = nullptr;
    ASSERT_EQ(d_.cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    ASSERT_EQ(d_.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  }
  // One call: the message is built by `in`, the reply's values read by the caller from out_.
  template <class F>
  CUresult Call(SessionGraphs& g, Fn fn, F in) {
    uint8_t buf[256];
    transport::Writer w(buf, sizeof(buf));
    in(w);
    out_len_ = 0;
    transport::Writer out(out_, sizeof(out_));
    transport::Reader rd(buf, w.size());
    CUresult r = g.Call(fn, rd, out);
    out_len_ = out.size();
    return r;
  }
  uint64_t OutU64(size_t index) const {
    uint64_t v = 0;
    transport::Reader rd(out_, out_len_);
    for (size_t i = 0; i <= index; ++i) rd.U64(&v);
    return v;
  }
  CUresult Create(SessionGraphs& g, uint64_t* name) {
    CUresult r = Call(g, Fn::cuGraphCreate, [](transport::Writer& w) { w.U32(0); });
    *name = OutU64(0);
    return r;
  }
  CUresult AddEmpty(SessionGraphs& g, uint64_t graph, std::vector<uint64_t> deps, uint64_t* name) {
    CUresult r = Call(g, Fn::cuGraphAddEmptyNode, [&](transport::Writer& w) {
      w.U64(graph);
      w.U32(static_cast<uint32_t>(deps.size()));
      for (uint64_t dep : deps) w.U64(dep);
      w.U32(CU_GRAPH_NODE_TYPE_EMPTY);
    });
    *name = r == CUDA_SUCCESS ? OutU64(0) : 0;
    return r;
  }
  CUresult Nodes(SessionGraphs& g, uint64_t graph, std::vector<uint64_t>* nodes) {
    CUresult r = Call(g, Fn::cuGraphGetNodes, [&](transport::Writer& w) {
      w.U64(graph);
      w.U32(16);
    });
    nodes->clear();
    if (r == CUDA_SUCCESS) {
      for (uint64_t i = 0; i < OutU64(0); ++i) nodes->push_back(OutU64(1 + i));
    }
    return r;
  }
  CUresult One(SessionGraphs& g, Fn fn, uint64_t h) {
    return Call(g, fn, [&](transport::Writer& w) { w.U64(h); });
  }

  void* lib_ = nullptr;
  driver::DriverTable d_;
  uint8_t out_[1024];
  size_t out_len_ = 0;
};

TEST_F(SessionGraphsTest, GraphsNodesAndExecsAreNamesThatFailOutsideTheirSessionKindAndLife) {
  TestHost ha(d_, 0xaaaa), hb(d_, 0xbbbb);
  SessionGraphs a(ha), b(hb);
  uint64_t g = 0, n1 = 0, n2 = 0;
  ASSERT_EQ(Create(a, &g), CUDA_SUCCESS);
  ASSERT_EQ(AddEmpty(a, g, {}, &n1), CUDA_SUCCESS);
  ASSERT_EQ(AddEmpty(a, g, {n1}, &n2), CUDA_SUCCESS);
  for (uint64_t v : {g, n1, n2}) EXPECT_TRUE(HandleTable::LooksLikeName(v)) << std::hex << v;
  uint64_t real = 0;
  ASSERT_TRUE(ha.Handles().Resolve(HandleKind::kGraph, g, &real));
  EXPECT_NE(real, g);
  // A query names the same nodes by the same names.
  std::vector<uint64_t> listed;
  ASSERT_EQ(Nodes(a, g, &listed), CUDA_SUCCESS);
  EXPECT_EQ(std::set<uint64_t>(listed.begin(), listed.end()), (std::set<uint64_t>{n1, n2}));
  // The driver's own handle, another kind's name, a forged one, another session's: refused.
  EXPECT_EQ(Nodes(a, real, &listed), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Nodes(a, n1, &listed), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Nodes(a, g ^ (1ull << 30), &listed), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Nodes(b, g, &listed), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(One(b, Fn::cuGraphDestroy, g), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(One(a, Fn::cuGraphNodeGetType, g), CUDA_ERROR_INVALID_VALUE);
  uint64_t bad = 0;
  EXPECT_EQ(AddEmpty(a, g, {n1 ^ (1ull << 30)}, &bad), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(AddEmpty(a, g, {n2 + 1}, &bad), CUDA_ERROR_INVALID_VALUE);  // a slot not handed out
  EXPECT_EQ(AddEmpty(b, g, {}, &bad), CUDA_ERROR_INVALID_VALUE);
  // Executable graphs.
  ASSERT_EQ(Call(a, Fn::cuGraphInstantiateWithFlags, [&](transport::Writer& w) {
              w.U64(g);
              w.U64(0);
            }),
            CUDA_SUCCESS);
  const uint64_t e = OutU64(0);
  EXPECT_TRUE(HandleTable::LooksLikeName(e));
  EXPECT_EQ(One(a, Fn::cuGraphExecGetFlags, e), CUDA_SUCCESS);
  EXPECT_EQ(One(a, Fn::cuGraphExecGetFlags, g), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(One(b, Fn::cuGraphExecGetFlags, e), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(One(a, Fn::cuGraphExecDestroy, e), CUDA_SUCCESS);
  EXPECT_EQ(One(a, Fn::cuGraphExecGetFlags, e), CUDA_ERROR_INVALID_VALUE);  // stale
  EXPECT_EQ(One(a, Fn::cuGraphExecDestroy, e), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(ha.Handles().Live(HandleKind::kGraphExec), 0u);
  // A destroyed node's name, then a destroyed graph's with its nodes.
  EXPECT_EQ(One(a, Fn::cuGraphDestroyNode, n2), CUDA_SUCCESS);
  EXPECT_EQ(One(a, Fn::cuGraphNodeGetType, n2), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(One(a, Fn::cuGraphNodeGetType, n1), CUDA_SUCCESS);
  EXPECT_EQ(One(a, Fn::cuGraphDestroy, g), CUDA_SUCCESS);
  EXPECT_EQ(One(a, Fn::cuGraphNodeGetType, n1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Nodes(a, g, &listed), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(One(a, Fn::cuGraphDestroy, g), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(ha.Handles().Live(HandleKind::kGraph), 0u);
  EXPECT_EQ(ha.Handles().Live(HandleKind::kGraphNode), 0u);
  // A child graph node's graph is named when asked for, and goes with the node.
  uint64_t parent = 0, child = 0, cn = 0;
  ASSERT_EQ(Create(a, &parent), CUDA_SUCCESS);
  ASSERT_EQ(Create(a, &child), CUDA_SUCCESS);
  ASSERT_EQ(Call(a, Fn::cuGraphAddChildGraphNode, [&](transport::Writer& w) {
              w.U64(parent);
              w.U32(0);
              w.U32(CU_GRAPH_NODE_TYPE_GRAPH);
              w.U64(child);
            }),
            CUDA_SUCCESS);
  cn = OutU64(0);
  ASSERT_EQ(One(a, Fn::cuGraphChildGraphNodeGetGraph, cn), CUDA_SUCCESS);
  const uint64_t embedded = OutU64(0);
  EXPECT_TRUE(HandleTable::LooksLikeName(embedded));
  EXPECT_NE(embedded, child);
  EXPECT_EQ(One(a, Fn::cuGraphDestroy, embedded), CUDA_ERROR_INVALID_VALUE);  // the node's
  EXPECT_EQ(ha.Handles().Live(HandleKind::kGraph), 3u);
  EXPECT_EQ(One(a, Fn::cuGraphDestroyNode, cn), CUDA_SUCCESS);
  EXPECT_FALSE(ha.Handles().Resolve(HandleKind::kGraph, embedded, &real));
  EXPECT_EQ(ha.Handles().Live(HandleKind::kGraph), 2u);
  EXPECT_EQ(One(a, Fn::cuGraphDestroy, child), CUDA_SUCCESS);
  EXPECT_EQ(One(a, Fn::cuGraphDestroy, parent), CUDA_SUCCESS);
  // A new graph gets a new name, even where the driver reuses the address.
  uint64_t g2 = 0;
  ASSERT_EQ(Create(a, &g2), CUDA_SUCCESS);
  EXPECT_NE(g2, g);
  EXPECT_EQ(One(a, Fn::cuGraphDestroy, g2), CUDA_SUCCESS);
}

// User objects (the generated reference calls, their counts kept by the graph family's hooks): a
// name of another session, a forged one, a count of 0, a release beyond the references held and a
// graph that holds none fail that call only; the name is retired with the last reference.
TEST_F(SessionGraphsTest, UserObjectReferencesAreCountedPerSessionAndGraph) {
  TestHost ha(d_, 0xaaaa), hb(d_, 0xbbbb);
  SessionGraphs a(ha), b(hb);
  auto create = [&](SessionGraphs& g, uint64_t* name) {
    CUresult r = Call(g, Fn::cuUserObjectCreate, [](transport::Writer& w) {
      w.U64(7);  // the client's id of its destroy callback
      w.U32(1);
      w.U32(CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
    });
    *name = r == CUDA_SUCCESS ? OutU64(0) : 0;
    return r;
  };
  auto refs = [&](SessionGraphs& g, Fn fn, uint64_t graph, uint64_t o, uint32_t count) {
    return Call(g, fn, [&](transport::Writer& w) {
      if (fn == Fn::cuGraphRetainUserObject || fn == Fn::cuGraphReleaseUserObject) w.U64(graph);
      w.U64(o);
      w.U32(count);
      if (fn == Fn::cuGraphRetainUserObject) w.U32(0);
    });
  };
  uint64_t uo = 0, other = 0, g = 0;
  ASSERT_EQ(create(a, &uo), CUDA_SUCCESS);
  ASSERT_EQ(create(b, &other), CUDA_SUCCESS);
  ASSERT_EQ(Create(a, &g), CUDA_SUCCESS);
  EXPECT_TRUE(HandleTable::LooksLikeName(uo));
  const uint64_t forged = uo ^ (1ull << 30);
  for (uint64_t bad : {other, forged}) {
    EXPECT_EQ(refs(a, Fn::cuUserObjectRetain, 0, bad, 1), CUDA_ERROR_INVALID_VALUE) << std::hex << bad;
    EXPECT_EQ(refs(a, Fn::cuGraphRetainUserObject, g, bad, 1), CUDA_ERROR_INVALID_VALUE);
  }
  EXPECT_EQ(refs(a, Fn::cuUserObjectRetain, 0, uo, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(refs(a, Fn::cuUserObjectRelease, 0, uo, 2), CUDA_ERROR_INVALID_VALUE);  // holds 1
  EXPECT_EQ(refs(a, Fn::cuGraphReleaseUserObject, g, uo, 1), CUDA_ERROR_INVALID_VALUE);  // gave none
  ASSERT_EQ(refs(a, Fn::cuUserObjectRetain, 0, uo, 1), CUDA_SUCCESS);
  ASSERT_EQ(refs(a, Fn::cuGraphRetainUserObject, g, uo, 1), CUDA_SUCCESS);
  ASSERT_EQ(refs(a, Fn::cuUserObjectRelease, 0, uo, 2), CUDA_SUCCESS);
  uint64_t real = 0;
  EXPECT_TRUE(ha.Handles().Resolve(HandleKind::kUserObject, uo, &real));  // the graph holds one
  ASSERT_EQ(refs(a, Fn::cuGraphReleaseUserObject, g, uo, 1), CUDA_SUCCESS);
  EXPECT_EQ(ha.Handles().Live(HandleKind::kUserObject), 0u);
  EXPECT_EQ(refs(a, Fn::cuUserObjectRetain, 0, uo, 1), CUDA_ERROR_INVALID_VALUE);  // retired
  EXPECT_EQ(refs(b, Fn::cuUserObjectRelease, 0, other, 1), CUDA_SUCCESS);
}

// Arrays and mipmapped arrays of a session (SessionArrays) on the fake driver: created, copied,
// queried and destroyed by names of the session's table; a name of another session, a forged, a
// stale or the driver's own handle fails that call only; a mipmapped array's levels die with it.
class ArraysHost : public SessionArrays::Host {
 public:
  explicit ArraysHost(uint64_t salt) : table_(salt) {}
  bool DeviceRange(uint64_t, uint64_t) const override { return false; }
  bool KnownStream(uint64_t& s) const override { return table_.Resolve(HandleKind::kStream, s, &s); }
  bool SendCallData(uint64_t offset, const void* data, uint64_t n) override {
    if (received.size() < offset + n) received.resize(offset + n);
    memcpy(received.data() + offset, data, n);
    return true;
  }
  uint64_t CallDataLimit() const override { return 1 << 20; }
  void KeepUntilStreamDone(std::unique_ptr<uint8_t[]>, CUstream) override {}
  HandleTable& Handles() override { return table_; }
  bool KnownDevice(int32_t d) const override { return d == 0; }
  std::vector<uint8_t> received;  // device-to-host data of the last calls

 private:
  HandleTable table_;
};

class SessionArraysTest : public SessionGraphsTest {
 protected:
  template <class F>
  CUresult Call(SessionArrays& s, Fn fn, F in, const std::vector<uint8_t>* bulk = nullptr) {
    uint8_t buf[256];
    transport::Writer w(buf, sizeof(buf));
    in(w);
    transport::Writer out(out_, sizeof(out_));
    transport::Reader rd(buf, w.size());
    CUresult r = s.Call(fn, rd, bulk ? bulk->data() : nullptr, bulk ? bulk->size() : 0, out);
    out_len_ = out.size();
    return r;
  }
  // A 16 x 16 float array (1024 bytes), or a mipmapped one of `levels` levels.
  CUresult Create(SessionArrays& s, uint32_t levels, uint64_t* name) {
    CUDA_ARRAY3D_DESCRIPTOR d = {};
    d.Width = 16;
    d.Height = 16;
    d.Format = CU_AD_FORMAT_FLOAT;
    d.NumChannels = 1;
    CUresult r = Call(s, levels ? Fn::cuMipmappedArrayCreate : Fn::cuArray3DCreate_v2,
                      [&](transport::Writer& w) {
                        remote::WriteArrayDesc(d, w);
                        if (levels) w.U32(levels);
                      });
    *name = r == CUDA_SUCCESS ? OutU64(0) : 0;
    return r;
  }
  CUresult Level(SessionArrays& s, uint64_t mip, uint32_t level, uint64_t* name) {
    CUresult r = Call(s, Fn::cuMipmappedArrayGetLevel, [&](transport::Writer& w) {
      w.U64(mip);
      w.U32(level);
    });
    *name = r == CUDA_SUCCESS ? OutU64(0) : 0;
    return r;
  }
  CUresult HtoA(SessionArrays& s, uint64_t a, const std::vector<uint8_t>& data) {
    return Call(s, Fn::cuMemcpyHtoA_v2, [&](transport::Writer& w) {
      w.U64(a);
      w.U64(0);
    }, &data);
  }
  CUresult AtoH(SessionArrays& s, uint64_t a, uint64_t n) {
    return Call(s, Fn::cuMemcpyAtoH_v2, [&](transport::Writer& w) {
      w.U64(a);
      w.U64(0);
      w.U64(n);
    });
  }
  CUresult AtoA(SessionArrays& s, uint64_t dst, uint64_t src) {
    return Call(s, Fn::cuMemcpyAtoA_v2, [&](transport::Writer& w) {
      w.U64(dst);
      w.U64(0);
      w.U64(src);
      w.U64(0);
      w.U64(64);
    });
  }
  // A 2D copy of 4 rows of 64 bytes between two arrays.
  CUresult Copy2D(SessionArrays& s, uint64_t dst, uint64_t src) {
    return Call(s, Fn::cuMemcpy2D_v2, [&](transport::Writer& w) {
      remote::WriteCopySide(remote::CopySide{CU_MEMORYTYPE_ARRAY, src, 0, 0, 0, 0, 0}, w);
      remote::WriteCopySide(remote::CopySide{CU_MEMORYTYPE_ARRAY, dst, 0, 0, 0, 0, 0}, w);
      w.U64(64);
      w.U64(4);
      w.U64(1);
    });
  }
  CUresult Requirements(SessionArrays& s, Fn fn, uint64_t h) {
    return Call(s, fn, [&](transport::Writer& w) {
      w.U64(h);
      w.I32(0);
    });
  }
  CUresult Surface(SessionArrays& s, uint32_t type, uint64_t h) {
    // The generated message: the type, the union's bytes (the handle first), the flags.
    return Call(s, Fn::cuSurfObjectCreate, [&](transport::Writer& w) {
      CUDA_RESOURCE_DESC res = {};
      memcpy(&res.res, &h, sizeof(h));
      w.U32(type);
      w.Bytes(&res.res, sizeof(res.res));
      w.U32(0);
    });
  }
  CUresult One(SessionArrays& s, Fn fn, uint64_t h) {
    return Call(s, fn, [&](transport::Writer& w) { w.U64(h); });
  }
};

TEST_F(SessionArraysTest, ArraysAndMipmappedArraysAreNamesThatFailOutsideTheirSessionAndLife) {
  ArraysHost ha(0xaaaa), hb(0xbbbb);
  SessionArrays a(d_, ha), b(d_, hb);
  uint64_t arr = 0, arr2 = 0, other = 0;
  ASSERT_EQ(Create(a, 0, &arr), CUDA_SUCCESS);
  ASSERT_EQ(Create(a, 0, &arr2), CUDA_SUCCESS);
  ASSERT_EQ(Create(b, 0, &other), CUDA_SUCCESS);
  for (uint64_t v : {arr, arr2, other}) EXPECT_TRUE(HandleTable::LooksLikeName(v)) << std::hex << v;
  uint64_t real = 0;
  ASSERT_TRUE(ha.Handles().Resolve(HandleKind::kArray, arr, &real));
  EXPECT_NE(real, arr);
  // Data round trips through the names.
  std::vector<uint8_t> data(1024);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_EQ(HtoA(a, arr, data), CUDA_SUCCESS);
  ASSERT_EQ(AtoA(a, arr2, arr), CUDA_SUCCESS);
  ASSERT_EQ(Copy2D(a, arr2, arr), CUDA_SUCCESS);
  ha.received.clear();
  ASSERT_EQ(AtoH(a, arr2, 1024), CUDA_SUCCESS);
  EXPECT_EQ(std::vector<uint8_t>(ha.received.begin(), ha.received.begin() + 256),
            std::vector<uint8_t>(data.begin(), data.begin() + 256));
  EXPECT_EQ(Requirements(a, Fn::cuArrayGetMemoryRequirements, arr), CUDA_SUCCESS);
  // Another session's name, the driver's own handle, a forged name, a mipmapped array's kind.
  const uint64_t forged = arr ^ (1ull << 30);
  for (uint64_t bad : {other, real, forged, arr2 + 1}) {  // arr2 + 1: a slot not handed out
    EXPECT_EQ(AtoH(a, bad, 16), CUDA_ERROR_INVALID_VALUE) << std::hex << bad;
    EXPECT_EQ(HtoA(a, bad, data), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(AtoA(a, arr2, bad), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(AtoA(a, bad, arr2), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(Copy2D(a, arr2, bad), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(Copy2D(a, bad, arr2), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(Surface(a, CU_RESOURCE_TYPE_ARRAY, bad), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(Requirements(a, Fn::cuArrayGetMemoryRequirements, bad), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_EQ(One(a, Fn::cuArrayDestroy, bad), CUDA_ERROR_INVALID_HANDLE);
  }
  EXPECT_EQ(AtoH(b, arr, 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(One(b, Fn::cuArrayDestroy, arr), CUDA_ERROR_INVALID_HANDLE);
  // Nothing else changed: the array still holds its data in its own session.
  ha.received.clear();
  ASSERT_EQ(AtoH(a, arr, 1024), CUDA_SUCCESS);
  EXPECT_EQ(ha.received, data);
  EXPECT_EQ(ha.Handles().Live(HandleKind::kArray), 2u);

  // Mipmapped arrays: the levels are named arrays of the session, retired with it.
  uint64_t mip = 0, l0 = 0, l1 = 0, again = 0;
  ASSERT_EQ(Create(a, 3, &mip), CUDA_SUCCESS);
  EXPECT_TRUE(HandleTable::LooksLikeName(mip));
  ASSERT_EQ(Level(a, mip, 0, &l0), CUDA_SUCCESS);
  ASSERT_EQ(Level(a, mip, 1, &l1), CUDA_SUCCESS);
  ASSERT_EQ(Level(a, mip, 0, &again), CUDA_SUCCESS);
  EXPECT_EQ(again, l0);  // the same level, the same name
  EXPECT_TRUE(HandleTable::LooksLikeName(l1));
  EXPECT_EQ(AtoA(a, l0, arr), CUDA_SUCCESS);
  EXPECT_EQ(Requirements(a, Fn::cuMipmappedArrayGetMemoryRequirements, mip), CUDA_SUCCESS);
  EXPECT_EQ(Surface(a, CU_RESOURCE_TYPE_MIPMAPPED_ARRAY, mip), CUDA_ERROR_INVALID_VALUE);  // not surface
  uint64_t bad_level = 0;
  EXPECT_EQ(Level(b, mip, 0, &bad_level), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(Level(a, arr, 0, &bad_level), CUDA_ERROR_INVALID_HANDLE);  // an array is no mipmap
  EXPECT_EQ(Level(a, mip ^ (1ull << 30), 0, &bad_level), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(Requirements(a, Fn::cuMipmappedArrayGetMemoryRequirements, arr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(Requirements(b, Fn::cuMipmappedArrayGetMemoryRequirements, mip), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(One(a, Fn::cuArrayDestroy, l1), CUDA_ERROR_INVALID_HANDLE);  // goes with its mipmap
  EXPECT_EQ(One(b, Fn::cuMipmappedArrayDestroy, mip), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(One(a, Fn::cuMipmappedArrayDestroy, arr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(ha.Handles().Live(HandleKind::kArray), 4u);
  EXPECT_EQ(One(a, Fn::cuMipmappedArrayDestroy, mip), CUDA_SUCCESS);
  EXPECT_EQ(ha.Handles().Live(HandleKind::kArray), 2u);
  EXPECT_EQ(ha.Handles().Live(HandleKind::kMipmappedArray), 0u);
  EXPECT_EQ(AtoH(a, l0, 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(AtoA(a, l1, arr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Level(a, mip, 0, &bad_level), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(One(a, Fn::cuMipmappedArrayDestroy, mip), CUDA_ERROR_INVALID_HANDLE);

  // Destroy retires the name, and a new array never gets it again.
  ASSERT_EQ(One(a, Fn::cuArrayDestroy, arr), CUDA_SUCCESS);
  EXPECT_EQ(AtoH(a, arr, 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Copy2D(a, arr2, arr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Requirements(a, Fn::cuArrayGetMemoryRequirements, arr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(One(a, Fn::cuArrayDestroy, arr), CUDA_ERROR_INVALID_HANDLE);
  uint64_t fresh = 0;
  ASSERT_EQ(Create(a, 0, &fresh), CUDA_SUCCESS);
  EXPECT_NE(fresh, arr);
  EXPECT_EQ(AtoH(a, arr, 16), CUDA_ERROR_INVALID_VALUE);
  // The session's end destroys what is left and retires its names.
  a.Cleanup();
  b.Cleanup();
  EXPECT_EQ(ha.Handles().Live(HandleKind::kArray), 0u);
  EXPECT_EQ(hb.Handles().Live(HandleKind::kArray), 0u);
  EXPECT_EQ(AtoH(a, fresh, 16), CUDA_ERROR_INVALID_VALUE);
}

// The generated array calls (api/remote_surface.tsv) through the family: a created array's reply
// is its name and then the driver's descriptor; a malformed message, a device the session lacks
// and an array in place of a mipmapped array fail that call only and change nothing.
TEST_F(SessionArraysTest, GeneratedArrayCallsReplyWithTheDriversValuesAndRefuseBadArguments) {
  ArraysHost ha(0xaaaa);
  SessionArrays a(d_, ha);
  uint64_t arr = 0, mip = 0;
  ASSERT_EQ(Create(a, 0, &arr), CUDA_SUCCESS);
  {
    transport::Reader rd(out_, out_len_);
    uint64_t name = 0;
    CUDA_ARRAY3D_DESCRIPTOR got = {};
    rd.U64(&name);
    ASSERT_TRUE(remote::ReadArrayDesc(rd, &got));
    EXPECT_TRUE(rd.Finish());
    EXPECT_EQ(got.Width, 16u);
    EXPECT_EQ(got.Height, 16u);
    EXPECT_EQ(got.Format, CU_AD_FORMAT_FLOAT);
  }
  // cuArrayCreate_v2 takes the 2D descriptor: width, height, format, channels.
  CUresult r = Call(a, Fn::cuArrayCreate_v2, [](transport::Writer& w) {
    w.U64(8);
    w.U64(4);
    w.U32(CU_AD_FORMAT_UNSIGNED_INT8);
    w.U32(2);
  });
  ASSERT_EQ(r, CUDA_SUCCESS);
  EXPECT_TRUE(HandleTable::LooksLikeName(OutU64(0)));
  EXPECT_EQ(OutU64(1), 8u);  // the descriptor's width, after the name
  ASSERT_EQ(Create(a, 2, &mip), CUDA_SUCCESS);
  ASSERT_EQ(Requirements(a, Fn::cuArrayGetMemoryRequirements, arr), CUDA_SUCCESS);
  EXPECT_GE(OutU64(0), 16u * 16u * 4u);  // size, alignment, then the four reserved words
  EXPECT_EQ(out_len_, 8u + 8u + 4u * 4u);
  const size_t live = ha.Handles().Live(HandleKind::kArray);
  EXPECT_EQ(Call(a, Fn::cuArrayGetMemoryRequirements, [&](transport::Writer& w) {
              w.U64(arr);
              w.I32(3);  // the session has device 0 only
            }),
            CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(Call(a, Fn::cuArrayGetMemoryRequirements, [&](transport::Writer& w) { w.U64(arr); }),
            CUDA_ERROR_INVALID_VALUE);  // truncated
  EXPECT_EQ(Call(a, Fn::cuArray3DCreate_v2, [](transport::Writer& w) { w.U64(16); }),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(One(a, Fn::cuMipmappedArrayGetSparseProperties, arr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(One(a, Fn::cuArrayGetSparseProperties, mip), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(One(a, Fn::cuMipmappedArrayDestroy, arr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(ha.Handles().Live(HandleKind::kArray), live);
  EXPECT_EQ(ha.Handles().Live(HandleKind::kMipmappedArray), 1u);
  a.Cleanup();
  EXPECT_EQ(ha.Handles().Live(HandleKind::kArray), 0u);
}
#endif  // TF_FAKECUDA

}  // namespace
}  // namespace tf::worker
