// The remote vGPU end to end on the fake driver: remote_probe (an unmodified driver-API program)
// runs through the client stub (libcuda.so.1 -> libtfusion-client.so), the TCP or shared-memory
// transport and a tfusion-worker whose sessions load tests/fakecuda. What is asserted is what a
// user would notice: the same results as on the driver itself, errors that arrive when CUDA would
// report them, a refused token, a dead worker that turns into errors quickly, and a dead client
// whose memory comes back.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <cuda.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/mirror_runs.h"
#include "client/remote_arrays.h"
#include "client/remote_protocol.h"
#include "nvml_types.h"
#include "transport/shm_transport.h"
#include "child_process.h"

namespace {

using tf::testing::Child;
using tf::testing::Clock;
using tf::testing::ParseKv;
using tf::testing::Result;

class RemoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tf-remote-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    // One fake device board per test: TearDown removes it, and a later test of this process must not
    // read the removed one through the fake NVML it keeps loaded.
    static int tests = 0;
    shm_name_ = "/tf-rt-" + std::to_string(getpid()) + "-" + std::to_string(++tests);
  }
  void TearDown() override {
    StopWorker();
    std::string cmd = "rm -rf '" + dir_ + "' /dev/shm" + shm_name_ + "*";
    EXPECT_EQ(system(cmd.c_str()), 0);
  }

  void StartWorker(const std::vector<std::string>& extra_env = {}, const std::string& token = "sekrit",
                   const std::vector<std::string>& extra_args = {}) {
    std::vector<std::string> env = {"FAKECUDA_SHM_NAME=" + shm_name_};
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    std::string ready = dir_ + "/ready";
    std::vector<std::string> argv = {TF_WORKER, "--listen", "127.0.0.1:0", "--listen",
                                     "unix:" + dir_ + "/worker.sock", "--token", token, "--driver",
                                     TF_FAKECUDA, "--ready-file", ready};
    argv.insert(argv.end(), extra_args.begin(), extra_args.end());
    worker_.Start(argv, env);
    for (int i = 0; i < 500; ++i) {
      std::ifstream in(ready);
      std::string kind, addr;
      while (in >> kind >> addr) {
        if (kind == "tcp") tcp_ = addr;
        if (kind == "unix") unix_ = "unix:" + addr;
      }
      if (!tcp_.empty() && !unix_.empty()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    FAIL() << "the worker did not become ready";
  }
  void StopWorker() {
    if (worker_.pid > 0) {
      kill(worker_.pid, SIGTERM);
      if (worker_.Wait(5000) < 0) kill(worker_.pid, SIGKILL);
    }
  }

  // The probe through RunRemote (what `tfusion run --remote` does).
  Result Remote(const std::string& addr, const std::string& mode, const std::string& token = "sekrit") {
    return RemoteProgram(addr, {TF_PROBE, mode}, token);
  }
  Result RemoteProgram(const std::string& addr, const std::vector<std::string>& program,
                       const std::string& token = "sekrit",
                       const std::vector<std::string>& env = {}) {
    Child c;
    std::vector<std::string> argv = {TF_REMOTE_RUN, addr, token, "--"};
    argv.insert(argv.end(), program.begin(), program.end());
    std::vector<std::string> e = {std::string("TFUSION_CLIENT_DIR=") + TF_CLIENT_INJECT};
    e.insert(e.end(), env.begin(), env.end());
    c.Start(argv, e);
    Result r;
    r.rc = c.Wait(60000);
    r.out = c.out;
    ParseKv(&r);
    return r;
  }
  // The probe on the fake driver itself.
  Result Direct(const std::string& mode) { return DirectProgram({TF_PROBE, mode}); }
  Result DirectProgram(const std::vector<std::string>& program) {
    Child c;
    c.Start(program, {std::string("LD_LIBRARY_PATH=") + TF_FAKECUDA_DIR,
                      "FAKECUDA_SHM_NAME=" + shm_name_ + "-direct"});
    Result r;
    r.rc = c.Wait(60000);
    r.out = c.out;
    ParseKv(&r);
    return r;
  }
  // The probe with the stub injected by hand, as a child the test controls.
  void StartProbe(Child* c, const std::string& addr, const std::string& mode) {
    c->Start({TF_PROBE, mode}, {std::string("LD_LIBRARY_PATH=") + TF_CLIENT_INJECT,
                                "TFUSION_REMOTE=" + addr, "TFUSION_TOKEN=sekrit"});
  }

  std::string dir_, shm_name_, tcp_, unix_;
  Child worker_;
};

TEST_F(RemoteTest, OverTcpTheProgramSeesWhatTheDriverGivesIt) {
  StartWorker();
  Result direct = Direct("basic");
  ASSERT_EQ(direct.rc, 0) << direct.out;
  Result remote = Remote(tcp_, "basic");
  ASSERT_EQ(remote.rc, 0) << remote.out;
  EXPECT_EQ(remote.kv["done"], "1");
  EXPECT_EQ(remote.kv["kernel_fill_ok"], "1");
  EXPECT_EQ(remote.kv["htod_dtod_dtoh_equal"], "1");
  EXPECT_EQ(remote.kv["elapsed_ge_20ms"], "1");
  EXPECT_EQ(remote.kv["device_name"], "Fake GPU H100");
  EXPECT_EQ(remote.out, direct.out) << "remote and direct runs differ";
}

TEST_F(RemoteTest, OverSharedMemoryTheProgramSeesWhatTheDriverGivesIt) {
  StartWorker();
  Result direct = Direct("basic");
  ASSERT_EQ(direct.rc, 0) << direct.out;
  Result remote = Remote(unix_, "basic");
  ASSERT_EQ(remote.rc, 0) << remote.out;
  EXPECT_EQ(remote.kv["done"], "1");
  EXPECT_EQ(remote.out, direct.out) << "remote and direct runs differ";
}

TEST_F(RemoteTest, AFailedAsyncLaunchSurfacesAtTheNextStreamSynchronize) {
  StartWorker({"TFUSION_WORKER_FAKE_FAIL=cuLaunchKernel:1:1"});  // CUDA_ERROR_INVALID_VALUE
  Result r = Remote(tcp_, "deferred");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.kv["launch"], "0") << "a launch is fire-and-forget";
  EXPECT_EQ(r.kv["sync1"], "1") << r.out;
  EXPECT_EQ(r.kv["sync2"], "0") << "a non-sticky error is reported once";
  EXPECT_EQ(r.kv["launch2"], "0");
  EXPECT_EQ(r.kv["sync3"], "0");
}

TEST_F(RemoteTest, AStickyAsyncErrorStaysSticky) {
  StartWorker({"TFUSION_WORKER_FAKE_FAIL=cuLaunchKernel:1:719"});  // CUDA_ERROR_LAUNCH_FAILED
  Result r = Remote(unix_, "deferred");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.kv["launch"], "0");
  EXPECT_EQ(r.kv["sync1"], "719") << r.out;
  EXPECT_EQ(r.kv["sync2"], "719");
  EXPECT_EQ(r.kv["launch2"], "719");
  EXPECT_EQ(r.kv["sync3"], "719");
}

TEST_F(RemoteTest, AWrongTokenIsRefusedAtCuInitWithAClearMessage) {
  StartWorker();
  Result r = Remote(tcp_, "init", "not-the-token");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.kv["init"], "800") << "CUDA_ERROR_NOT_PERMITTED expected\n" << r.out;
  EXPECT_NE(r.out.find("refused this client"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bad_token"), std::string::npos) << r.out;
  // No token at all is not called a wrong one.
  Result none = Remote(tcp_, "init", "");
  EXPECT_EQ(none.kv["init"], "800") << none.out;
  EXPECT_NE(none.out.find("wants a token and this client has none"), std::string::npos) << none.out;
  Result ok = Remote(tcp_, "init");
  EXPECT_EQ(ok.kv["init"], "0") << "the worker keeps serving after a refusal\n" << ok.out;
}

TEST_F(RemoteTest, BadHandlesAndPointersFailTheirCallOnly) {
  StartWorker();
  Result r = Remote(tcp_, "bad");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.kv["htod_overrun"], "1");  // CUDA_ERROR_INVALID_VALUE
  EXPECT_EQ(r.kv["dtoh_wild"], "1");
  EXPECT_EQ(r.kv["free_inside"], "1");
  EXPECT_EQ(r.kv["stream_bogus"], "400");  // CUDA_ERROR_INVALID_HANDLE
  EXPECT_EQ(r.kv["event_bogus"], "400");
  EXPECT_EQ(r.kv["module_bogus"], "400");
  EXPECT_EQ(r.kv["unsupported"], "801");  // CUDA_ERROR_NOT_SUPPORTED
  EXPECT_NE(r.out.find("cuMemBatchDecompressAsync is not supported"), std::string::npos) << r.out;
  EXPECT_EQ(r.kv["free_never_allocated"], "1");  // refused by the worker's allocation table
  EXPECT_EQ(r.kv["alloc_zero"], "1");
  EXPECT_EQ(r.kv["pitch_bad_element"], "1");
  EXPECT_EQ(r.kv["pitch_zero_height"], "1");
  EXPECT_EQ(r.kv["primary_retain_bad_device"], "101");  // CUDA_ERROR_INVALID_DEVICE
  EXPECT_EQ(r.kv["primary_release_bad_device"], "101");
  EXPECT_EQ(r.kv["primary_flags_bad_device"], "101");
  EXPECT_EQ(r.kv["forged_ctx_current"], "201");  // CUDA_ERROR_INVALID_CONTEXT
  EXPECT_EQ(r.kv["forged_ctx_destroy"], "201");
  EXPECT_EQ(r.kv["ctx_destroy_primary"], "201");  // refused by the worker: not one the program made
  EXPECT_EQ(r.kv["ctx_destroy_twice"], "0:201");
  EXPECT_EQ(r.kv["ctx_affinity"], "801");  // CUDA_ERROR_NOT_SUPPORTED
  EXPECT_NE(r.out.find("cuCtxCreate_v4 is not supported"), std::string::npos) << r.out;
  EXPECT_EQ(r.kv["still_works"], "0");
  EXPECT_EQ(r.kv["free_twice"], "0:1");
  EXPECT_EQ(r.kv["primary_release_twice"], "0:201");  // no retain left to release
  EXPECT_EQ(r.kv["procaddr_is_export"], "1");
}

// Session-scoped virtual handles: what a program can do with names it should not have.
TEST_F(RemoteTest, ForgedStaleWrongKindAndOtherSessionsHandlesFailTheirCallOnly) {
  StartWorker();
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = Remote(addr, "vhandles");
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["names_not_pointers"], "1") << r.out;
    for (const char* key : {"forged_stream", "forged_event", "forged_module", "kind_event_as_stream",
                            "kind_stream_as_event", "kind_function_as_module", "kind_context_as_event",
                            "kind_stream_as_function", "stale_stream", "stale_stream_destroy",
                            "stale_event", "stale_module", "other_session_stream",
                            "other_session_event"}) {
      EXPECT_EQ(r.kv[key], "400") << addr << " " << key << " (CUDA_ERROR_INVALID_HANDLE)\n" << r.out;
    }
    EXPECT_EQ(r.kv["after_bad_launch_sync"], "0") << addr;
    EXPECT_EQ(r.kv["fresh_stream_new_name"], "1") << addr;
    EXPECT_EQ(r.kv["fresh_stream"], "0") << addr;
    EXPECT_EQ(r.kv["other_session_own_stream"], "0") << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["child_status"], "0") << addr;
    EXPECT_EQ(r.kv["still_works"], "1") << addr << "\n" << r.out;
  }
}

// Graphs, graph nodes and executable graphs are names of the session too: forged, stale (destroyed
// directly or with their graph, child graph node or clone), another kind's and another session's
// fail that call only, with CUDA_ERROR_INVALID_VALUE (a launch: CUDA_ERROR_INVALID_HANDLE at the
// stream's synchronize).
TEST_F(RemoteTest, ForgedStaleWrongKindAndOtherSessionsGraphHandlesFailTheirCallOnly) {
  StartWorker();
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = Remote(addr, "vgraphs");
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    for (const char* key : {"names_not_pointers", "listed_same_names", "root_same_name", "fresh_graph_new_name",
                            "embedded_is_name", "clone_node_is_new_name", "captured_is_name", "still_works"}) {
      EXPECT_EQ(r.kv[key], "1") << addr << " " << key << "\n" << r.out;
    }
    for (const char* key :
         {"forged_graph", "forged_node", "forged_dep_node", "forged_exec", "kind_graph_as_node",
          "kind_node_as_graph", "kind_exec_as_graph", "kind_graph_as_exec", "kind_stream_as_graph",
          "stale_exec", "stale_exec_destroy", "stale_graph", "stale_graph_destroy", "stale_node_of_graph",
          "stale_node", "stale_node_destroy", "stale_node_dependency", "embedded_destroy", "stale_embedded",
          "stale_clone", "stale_clone_node", "other_session_graph", "other_session_node",
          "other_session_exec"}) {
      EXPECT_EQ(r.kv[key], "1") << addr << " " << key << " (CUDA_ERROR_INVALID_VALUE)\n" << r.out;
    }
    for (const char* key : {"forged_exec_launch", "kind_node_as_exec_launch", "stale_exec_launch"}) {
      EXPECT_EQ(r.kv[key], "400") << addr << " " << key << " (CUDA_ERROR_INVALID_HANDLE)\n" << r.out;
    }
    for (const char* key : {"clone_node", "captured_launch", "other_session_own_graph",
                            "child_status", "still_launches"}) {
      EXPECT_EQ(r.kv[key], "0") << addr << " " << key << "\n" << r.out;
    }
  }
}

// Keys both runs print must agree; `only_remote` keys are checked by the caller.
// A resource descriptor as the generated texture and surface calls carry it
// (api/remote_surface.tsv, bytes=pResDesc.res): its type, its union's bytes, its flags.
void WriteResource(const CUDA_RESOURCE_DESC& res, tf::transport::Writer& w) {
  w.U32(static_cast<uint32_t>(res.resType));
  w.Bytes(&res.res, sizeof(res.res));
  w.U32(res.flags);
}

// cuTexObjectCreate's message: the resource, a texture descriptor of zeros (its 26 words) and no view.
void WriteTexture(const CUDA_RESOURCE_DESC& res, tf::transport::Writer& w) {
  WriteResource(res, w);
  for (int i = 0; i < 26; ++i) w.U32(0);
  w.U8(0);
}

void ExpectSameKeys(const Result& direct, const Result& remote) {
  for (const auto& [k, v] : direct.kv) {
    if (v == "na") continue;
    EXPECT_EQ(remote.kv.count(k) ? remote.kv.at(k) : "<missing>", v) << "key " << k;
  }
}

TEST_F(RemoteTest, PointerFunctionCaptureAndContextQueriesAreAnsweredLocally) {
  StartWorker();
  Result direct = Direct("local");
  ASSERT_EQ(direct.rc, 0) << direct.out;
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = Remote(addr, "local");
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.kv["done"], "1");
    EXPECT_EQ(r.kv["ptr_type"], "2");  // CU_MEMORYTYPE_DEVICE
    EXPECT_EQ(r.kv["ptr_range"], "4096");
    EXPECT_EQ(r.kv["ptr_unknown"], "1");
    EXPECT_EQ(r.kv["ptr_attrs"], "0:2:4096");
    EXPECT_EQ(r.kv["ptr_attrs_unknown"], "0:0:0");
    EXPECT_EQ(r.kv["capturing_bogus"], "400");
    EXPECT_EQ(r.kv["priorities"], "0..-5");
    EXPECT_EQ(r.kv["pop2"], "b:a");
    EXPECT_EQ(r.kv["ctx_empty_params"], "0") << "a zeroed CUctxCreateParams is the plain form";
    EXPECT_EQ(r.kv["alloc_in_pushed"], "b");
    EXPECT_EQ(r.kv["occupancy_bogus"], "400");
    EXPECT_NE(r.kv["occupancy"], "");  // equal to the driver's (ExpectSameKeys), callback included
    EXPECT_EQ(r.kv["free_null"], "0");
    EXPECT_EQ(r.kv["vmm"], "abcd");  // reserve, create, map, set access, copy both ways
    EXPECT_EQ(r.kv["vmm_done"], "1");
    EXPECT_EQ(r.kv["pitch_alloc"], "1:77");
    EXPECT_EQ(r.kv["vmm_unmapped_copy"], "1");  // reserved but not mapped: refused
    EXPECT_EQ(r.kv["vmm_map_outside"], "1");    // outside the reservation: refused
    EXPECT_EQ(r.kv["priority_stream"], "7");
    EXPECT_EQ(r.kv["limits"], "1024:4096");  // read, set, read again (not the cached value)
    EXPECT_EQ(r.kv["module_file"], "0");
    EXPECT_EQ(r.kv["global"], "256:5eed");  // cudaMemcpyToSymbol's path
    EXPECT_EQ(r.kv["global_missing"], "500");  // CUDA_ERROR_NOT_FOUND
    EXPECT_EQ(r.kv["global_overrun"], "1");  // outside the variable: refused by the worker
    EXPECT_EQ(r.kv["module_missing"], "301");  // CUDA_ERROR_FILE_NOT_FOUND
    EXPECT_NE(r.kv["clusters"], "");  // cudaFree(0) binds cudart's context this way
    EXPECT_EQ(r.kv["ctx_sync_v2"], "0:0");
    ExpectSameKeys(direct, r);
  }
}

// Every entry point the driver exports is implemented by the stub (or generated as the per-thread
// variant of one it implements) or refused with a reason in api/client_refused.tsv, never both,
// never neither; and a refused one answers CUDA_ERROR_NOT_SUPPORTED.
TEST(RemoteSurface, EveryEntryPointIsImplementedOrRefusedWithAReason) {
  auto names = [](const char* path, bool tsv) {
    std::map<std::string, std::string> m;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      size_t tab = line.find('\t');
      if (tsv) m[line.substr(0, tab)] = tab == std::string::npos ? "" : line.substr(tab + 1);
      else m[line] = "";
    }
    return m;
  };
  auto exports = names(TF_EXPORTS_TXT, false);
  auto implemented = names(TF_CLIENT_IMPLEMENTED_TXT, false);
  auto refused = names(TF_CLIENT_REFUSED_TSV, true);
  ASSERT_GT(exports.size(), 600u);
  for (const auto& [name, unused] : exports) {
    std::string base = name;
    for (const char* suffix : {"_ptsz", "_ptds"}) {
      const size_t n = strlen(suffix);
      if (base.size() > n && base.compare(base.size() - n, n, suffix) == 0) base.resize(base.size() - n);
    }
    const bool impl = implemented.count(name) || implemented.count(base);
    const bool ref = refused.count(name) != 0;
    EXPECT_TRUE(impl || ref) << name << " is neither implemented nor refused with a reason";
    EXPECT_FALSE(impl && ref) << name << " is implemented and also listed as refused";
    if (ref) {
      EXPECT_GT(refused[name].size(), 10u) << name << ": no reason given";
    }
  }
  void* h = dlopen(TF_CLIENT, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  auto refused_call = reinterpret_cast<CUresult (*)(CUcontext*, unsigned)>(dlsym(h, "cuCtxAttach"));
  ASSERT_NE(refused_call, nullptr);
  CUcontext unused = nullptr;
  EXPECT_EQ(refused_call(&unused, 0), CUDA_ERROR_NOT_SUPPORTED);
}

// The CUDA libraries (cudart inside each of cuBLAS, cuDNN, cuFFT, cuSOLVER, cuSPARSE, cuRAND and
// NCCL) can ask the driver for the entry points in api/library_references.tsv. None of them may be
// refused for a reason that is only "not forwarded yet", except the gaps listed here (none today:
// sparse and planar arrays, multicast objects and asynchronous notifications were the last), which
// docs/remote.md ("Not forwarded yet") would name: forwarding one means deleting it from this list.
TEST(RemoteSurface, TheLibrariesReachNoEntryPointLeftUnforwardedButTheListedGaps) {
  const std::set<std::string> known_gaps = {};
  std::map<std::string, std::string> refused;
  {
    std::ifstream in(TF_CLIENT_REFUSED_TSV);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      const size_t tab = line.find('\t');
      if (tab != std::string::npos) refused[line.substr(0, tab)] = line.substr(tab + 1);
    }
  }
  std::ifstream in(TF_LIBRARY_REFERENCES_TSV);
  ASSERT_TRUE(in.good()) << TF_LIBRARY_REFERENCES_TSV;
  std::set<std::string> gaps;
  size_t reachable = 0;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    ++reachable;
    const std::string name = line.substr(0, line.find('\t'));
    auto it = refused.find(name);
    if (it != refused.end() && it->second.find("not forwarded yet") != std::string::npos) gaps.insert(name);
  }
  EXPECT_GT(reachable, 500u);
  for (const std::string& g : gaps) {
    EXPECT_TRUE(known_gaps.count(g)) << g << " is reachable from the CUDA libraries and refused as not forwarded yet: "
                                     << refused[g];
  }
  for (const std::string& k : known_gaps) {
    EXPECT_TRUE(gaps.count(k)) << k << " is listed as a gap but is no longer one: delete it from the list";
  }
}

// Stream and context queries, PCI bus ids and tensor-map encodings (what cuDNN, XLA and Triton
// ask) give over both transports what the driver gives directly; bad handles fail that call only.
TEST_F(RemoteTest, StreamContextPciAndTensorMapQueriesMatchTheDriver) {
  StartWorker();
  Result direct = DirectProgram({TF_QUERY_PROBE, "queries"});
  ASSERT_EQ(direct.rc, 0) << direct.out;
  EXPECT_EQ(direct.kv["done"], "1") << direct.out;
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = RemoteProgram(addr, {TF_QUERY_PROBE, "queries"});
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.kv["done"], "1") << r.out;
    EXPECT_EQ(r.kv["stream_a"], "-1:1");
    EXPECT_EQ(r.kv["stream_b"], "0:0");
    EXPECT_EQ(r.kv["stream_ids"], "1:1:1");  // stable, distinct, the NULL stream's its own
    EXPECT_EQ(r.kv["stream_where"], "0:1:1:1:1");
    EXPECT_EQ(r.kv["stream_bogus"], "400:400");  // CUDA_ERROR_INVALID_HANDLE
    EXPECT_EQ(r.kv["stream_new"], "-3") << "a destroyed stream's cached answers are dropped";
    EXPECT_EQ(r.kv["ctx_ids"], "1:1:1:1");
    EXPECT_EQ(r.kv["ctx_bogus"], "201");  // CUDA_ERROR_INVALID_CONTEXT
    EXPECT_EQ(r.kv["pci_bad_device"], "101");
    EXPECT_EQ(r.kv["by_pci"], "0:0");
    EXPECT_EQ(r.kv["by_pci_lower"], "0:0");
    EXPECT_EQ(r.kv["by_pci_no_domain"], "0:0");
    EXPECT_EQ(r.kv["by_pci_junk"], "1:-7");
    EXPECT_EQ(r.kv["tiled"].substr(0, 2), "0:");
    EXPECT_EQ(r.kv["tiled_bad_box"], "1");
    EXPECT_EQ(r.kv["tiled_bad_rank"], "1");
    EXPECT_EQ(r.kv["tiled_rank1"], "0");
    EXPECT_EQ(r.kv["im2col_rank2"], "1");
    EXPECT_EQ(r.kv["tiled_bad_swizzle"], "1") << "the worker refuses what cuda.h does not define";
    EXPECT_EQ(r.kv["replaced_misaligned"], "1");
    EXPECT_EQ(r.kv["function_count"].substr(1), ":1:1") << "CUDA_ERROR_INVALID_VALUE, then a stale module";
    EXPECT_EQ(r.kv["func_loaded"], "0:0:1");   // CU_FUNCTION_LOADING_STATE_LOADED
    EXPECT_EQ(r.kv["func_bad"], "400:400:1");  // CUDA_ERROR_INVALID_HANDLE, then a NULL output
    EXPECT_EQ(r.kv["stream_attr_window"], "0:0:1:65536:0.5:2:1");
    EXPECT_EQ(r.kv["stream_attr_sync"], "0:0:3");  // CU_SYNC_POLICY_YIELD
    EXPECT_EQ(r.kv["stream_attr_priority"], "0:0:0:-2:-2") << "the cached priority is dropped";
    EXPECT_EQ(r.kv["stream_attr_bad"], "1:1:1:400");
    Result d = direct;  // the fake driver does not check a swizzle: the worker does
    d.kv.erase("tiled_bad_swizzle");
    ExpectSameKeys(d, r);
    EXPECT_EQ(r.out.find("not supported by the remote vGPU"), std::string::npos) << r.out;
  }
}

// Stream memory operations (a wait really waits for another stream's write), batches of them,
// batched copies through pageable host memory, managed-memory prefetch and discard batches, peer
// copies between two contexts of the one device, peer access, the device's current pool and
// stream attribute copies give over both transports what the driver gives directly; bad input
// fails that call (or, for fire-and-forget calls, the next synchronizing one) and nothing else.
TEST_F(RemoteTest, StreamMemoryOperationsBatchesPoolsAndPeerCopiesMatchTheDriver) {
  StartWorker();
  Result direct = DirectProgram({TF_MEMOPS_PROBE, "memops"});
  ASSERT_EQ(direct.rc, 0) << direct.out;
  EXPECT_EQ(direct.kv["done"], "1") << direct.out;
  EXPECT_EQ(direct.kv["wait_blocks"], "600") << direct.out;  // CUDA_ERROR_NOT_READY
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = RemoteProgram(addr, {TF_MEMOPS_PROBE, "memops"});
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["done"], "1");
    EXPECT_EQ(r.kv["wait_blocks"], "600") << "the waiting stream ran before the write";
    EXPECT_EQ(r.kv["wait_released"], "1:7:500000001:1234567890");
    // The legacy forms (cuStreamWaitValue32, ...; the fake driver exports only the _v2 ones).
    EXPECT_EQ(r.kv["legacy_memops"], "5:700000000:6:1");
    EXPECT_EQ(r.kv["batch"], "feed:abcdef0123:5eed");
    for (const char* k : {"bad_wait_addr", "bad_write_unaligned_outside", "bad_wait_flags", "bad_write_flags",
                          "bad_batch_count", "bad_batch_flags", "bad_batch_addr", "bad_batch_op",
                          "batch_copy_no_attrs", "batch_copy_null_stream", "batch_copy_bad_order",
                          "batch_copy_bad_index", "managed_batch_not_managed", "managed_batch_flags",
                          "peer_copy_outside", "peer_enable_flags"}) {
      EXPECT_EQ(r.kv[k], "1") << k << " (CUDA_ERROR_INVALID_VALUE)";
    }
    EXPECT_EQ(r.kv["after_bad"], "3");
    EXPECT_EQ(r.kv["managed_batch"], "0:0:11111111:22222222");
    EXPECT_EQ(r.kv["managed_batch_bad_device"], "101");
    EXPECT_EQ(r.kv["peer_copy"], "c0ffee:c0ffee");
    EXPECT_EQ(r.kv["peer_copy_bad_ctx"], "201");
    EXPECT_EQ(r.kv["peer_copy_3d"], "c0ffee:0:c0ffee:0");
    EXPECT_EQ(r.kv["peer_copy_3d_bad_ctx"], "201");
    EXPECT_EQ(r.kv["peer_copy_3d_outside"], "1");
    EXPECT_EQ(r.kv["peer_enable"], "101");       // one device: not its own peer
    EXPECT_EQ(r.kv["peer_enable_self"], "201");
    EXPECT_EQ(r.kv["peer_disable"], "705");      // CUDA_ERROR_PEER_ACCESS_NOT_ENABLED
    EXPECT_EQ(r.kv["pools"], "1:1:1:1");
    EXPECT_EQ(r.kv["pool_bad_device"], "101");
    EXPECT_EQ(r.kv["pool_set_bad_device"], "101");
    EXPECT_EQ(r.kv["copy_attributes"], "0:-1") << "a stale cached priority";
    EXPECT_EQ(r.kv["copy_attributes_bad"], "400");
    // VMM queries, pools by location and pool access.
    EXPECT_EQ(r.kv["vmm_access"], "3");  // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    EXPECT_EQ(r.kv["vmm_props"], "1:1:0");
    EXPECT_EQ(r.kv["vmm_retain_same"], "1") << "the tenant's own handle name comes back";
    EXPECT_EQ(r.kv["vmm_released"], "0:0:1") << "a retained handle owes one more release";
    for (const char* k : {"vmm_access_unmapped", "vmm_props_bad", "vmm_retain_outside", "loc_pool_bad_type",
                          "loc_pool_set_bad_pool", "pool_access_bad_flags", "pool_access_bad_pool"}) {
      EXPECT_EQ(r.kv[k], "1") << k << " (CUDA_ERROR_INVALID_VALUE)";
    }
    EXPECT_EQ(r.kv["vmm_access_bad_device"], "101");
    EXPECT_EQ(r.kv["loc_pool_bad_device"], "101");
    EXPECT_EQ(r.kv["pool_access_bad_device"], "101");
    EXPECT_EQ(r.kv["loc_pools"], "1:1:1");
    EXPECT_EQ(r.kv["pool_access"], "3:0");
    EXPECT_EQ(r.kv["loc_pool_host"], "801") << "host locations are refused (CUDA_ERROR_NOT_SUPPORTED)";
    EXPECT_EQ(r.kv["loc_pool_managed"], "801:801:801") << "managed-memory pools are refused";
    // SYNC_MEMOPS set remotely and answered from what was set; atomic capabilities as the driver's.
    EXPECT_EQ(r.kv["sync_memops"], "0:1");
    EXPECT_EQ(r.kv["set_attribute_other"], "1");
    EXPECT_EQ(r.kv["set_attribute_outside"], "1");
    EXPECT_EQ(r.kv["host_atomics"], "1b:1b:8");
    EXPECT_EQ(r.kv["host_atomics_bad_device"], "101");
    EXPECT_EQ(r.kv["host_atomics_bad_op"], "1");
    EXPECT_EQ(r.kv["host_atomics_none"], "1");
    EXPECT_EQ(r.kv["p2p_atomics_self"], "101");
    EXPECT_EQ(r.kv["p2p_atomics_bad_device"], "101");
    // 3D batched copies through pageable host memory and device memory.
    EXPECT_EQ(r.kv["batch3d"], "1:0");
    for (const char* k : {"batch3d_zero_extent", "batch3d_short_row", "batch3d_flags", "batch3d_null_stream",
                          "batch3d_bad_order", "batch3d_bad_array"}) {
      EXPECT_EQ(r.kv[k], "1") << k << " (CUDA_ERROR_INVALID_VALUE)";
    }
    ExpectSameKeys(direct, r);
    EXPECT_EQ(r.out.find("not supported by the remote vGPU"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("host memory locations are not served by the remote vGPU"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("cuMemSetMemPool: type CU_MEM_ALLOCATION_TYPE_MANAGED is not served by the remote vGPU"),
              std::string::npos) << r.out;
  }
}

// Green contexts (what cuBLASLt and cuDNN 9 reference): the device's SMs split in groups, a green
// context of one group whose streams and context run kernels and copies, events recorded and
// waited across it and the primary context, and its destruction, give over both transports what
// the driver gives directly; altered resources, bad flags and stale handles fail that call only,
// and forged names, another kind's and another session's fail with CUDA_ERROR_INVALID_HANDLE
// (resources and descriptors: CUDA_ERROR_INVALID_VALUE).
TEST_F(RemoteTest, GreenContextsSplitSmsRunWorkAndRejectForeignHandles) {
  StartWorker();
  Result direct = DirectProgram({TF_GREEN_PROBE, "green"});
  ASSERT_EQ(direct.rc, 0) << direct.out;
  EXPECT_EQ(direct.kv["done"], "1") << direct.out;
  EXPECT_EQ(direct.kv["device_sms"], "132:8:8");
  EXPECT_EQ(direct.kv["split"], "2:16:16:100");
  EXPECT_EQ(direct.kv["cross_events_sum"], "1056");
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = RemoteProgram(addr, {TF_GREEN_PROBE, "green", "foreign"});
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["done"], "1") << r.out;
    EXPECT_EQ(r.kv["split_query"], "8");
    EXPECT_EQ(r.kv["green_sms"], "16:16:132");
    EXPECT_EQ(r.kv["green_ctx"], "1:1");
    EXPECT_EQ(r.kv["stream_green"], "1:1:1");
    EXPECT_EQ(r.kv["green_id"], "1:1");
    EXPECT_EQ(r.kv["green_stream_default"], "1");
    EXPECT_EQ(r.kv["green_ctx_flags"], "2");  // CU_CTX_SCHED_YIELD
    EXPECT_EQ(r.kv["ctx_flags_bad"], "1");     // CUDA_ERROR_INVALID_VALUE
    EXPECT_EQ(r.kv["cross_events_sum"], "1056");
    EXPECT_EQ(r.kv["altered_resource"], "1");  // CUDA_ERROR_INVALID_VALUE
    EXPECT_EQ(r.kv["split_again"], "915");     // CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION
    EXPECT_EQ(r.kv["green_flags"], "1:1");
    EXPECT_EQ(r.kv["green_stream_flags"], "1");
    EXPECT_EQ(r.kv["stale_green"], "400:400:400");
    EXPECT_EQ(r.kv["stale_green_stream"], "400:400");
    EXPECT_EQ(r.kv["stale_green_context"], "201");
    EXPECT_EQ(r.kv["primary_still_works"], "1");
    EXPECT_EQ(r.kv["forged_green"], "400");
    EXPECT_EQ(r.kv["forged_desc"], "1");
    EXPECT_EQ(r.kv["kind_stream_as_green"], "400");
    EXPECT_EQ(r.kv["other_session_green"], "400:400") << r.out;
    EXPECT_EQ(r.kv["other_session_desc"], "1");
    EXPECT_EQ(r.kv["other_session_resource"], "1");
    EXPECT_EQ(r.kv["other_session_own"], "0");
    EXPECT_EQ(r.kv["child_status"], "0");
    EXPECT_EQ(r.kv["other_still_works"], "1");
    ExpectSameKeys(direct, r);
    EXPECT_EQ(r.out.find("not supported by the remote vGPU"), std::string::npos) << r.out;
  }
}

// The last entry points the CUDA libraries reach (api/library_references.tsv) that were forwarded:
// planes of an NV12 array (the same plane asked twice is the same name, data goes through them,
// they go with their array and cannot be destroyed alone) and sparse properties of arrays and
// mipmapped arrays; multicast objects (granularity, a team of one device, memory bound by handle
// and by address, unbound, released with cuMemRelease); the driver's asynchronous notifications
// (an over-budget notification reaches each registered callback with its userData and handle, on
// a thread other than the program's, and no longer once unregistered). Each family gives over
// both transports what the driver gives directly; bad indexes, flags, offsets, devices, null
// outputs, wrong kinds, stale, forged and another session's names fail that call only.
TEST_F(RemoteTest, PlanesSparseArraysMulticastAndNotificationsMatchTheDriver) {
  StartWorker();
  for (const std::string mode : {"arrays", "multicast", "notify"}) {
    Result direct = DirectProgram({TF_REACH_PROBE, mode});
    ASSERT_EQ(direct.rc, 0) << mode << "\n" << direct.out;
    EXPECT_EQ(direct.kv["done"], "1") << direct.out;
    for (const std::string& addr : {tcp_, unix_}) {
      Result r = RemoteProgram(addr, {TF_REACH_PROBE, mode, "foreign"});
      ASSERT_EQ(r.rc, 0) << mode << " " << addr << "\n" << r.out;
      EXPECT_EQ(r.kv["done"], "1") << r.out;
      EXPECT_EQ(r.kv["child_status"], "0");
      EXPECT_EQ(r.kv["other_still_works"], "1") << r.out;
      ExpectSameKeys(direct, r);
      EXPECT_EQ(r.out.find("not supported by the remote vGPU"), std::string::npos) << r.out;
      if (mode == "arrays") {
        EXPECT_EQ(r.kv["plane_same"], "1:1");
        EXPECT_EQ(r.kv["plane0"], "64:32:0:1:1");  // CU_AD_FORMAT_UNSIGNED_INT8, one channel
        EXPECT_EQ(r.kv["plane1"], "32:16:0:1:2");
        EXPECT_EQ(r.kv["plane_data"], "1");
        EXPECT_EQ(r.kv["plane_bad_index"], "1");  // CUDA_ERROR_INVALID_VALUE
        EXPECT_EQ(r.kv["plane_not_planar"], "1");
        EXPECT_EQ(r.kv["plane_of_plane"], "1");
        EXPECT_EQ(r.kv["plane_null_out"], "1");
        EXPECT_EQ(r.kv["plane_destroy"], "400");  // CUDA_ERROR_INVALID_HANDLE
        EXPECT_EQ(r.kv["sparse_array"], "128:128:1:0:0:0");
        EXPECT_EQ(r.kv["sparse_mipmap"], "128:128:1:4:65536:0");
        EXPECT_EQ(r.kv["sparse_not_sparse"], "1");
        EXPECT_EQ(r.kv["sparse_null_out"], "1:1");
        EXPECT_EQ(r.kv["sparse_wrong_kind"], "400");
        EXPECT_EQ(r.kv["forged_plane"], "400");
        EXPECT_EQ(r.kv["forged_sparse"], "400:400");
        EXPECT_EQ(r.kv["other_session_plane"], "400") << r.out;
        EXPECT_EQ(r.kv["other_session_sparse"], "400:400");
        EXPECT_EQ(r.kv["stale_plane"], "400:1:400");
        EXPECT_EQ(r.kv["stale_sparse"], "400");
      } else if (mode == "multicast") {
        EXPECT_EQ(r.kv["mc_granularity"], "2097152:8388608");
        EXPECT_EQ(r.kv["mc_granularity_bad"], "1:1");
        EXPECT_EQ(r.kv["mc_create_bad"], "1:1:1");
        EXPECT_EQ(r.kv["mc_bind_early"], "1");
        EXPECT_EQ(r.kv["mc_add_again"], "1:101");  // CUDA_ERROR_INVALID_DEVICE
        EXPECT_EQ(r.kv["mc_bind_bad"], "1:1:1:1");
        EXPECT_EQ(r.kv["mc_wrong_kind"], "1:1");
        EXPECT_EQ(r.kv["mc_unbind_again"], "1:101");
        EXPECT_EQ(r.kv["mc_bind_addr_bad"], "1:1");
        EXPECT_EQ(r.kv["mc_bound_ok"], "1");
        EXPECT_EQ(r.kv["forged_mc"], "1");
        EXPECT_EQ(r.kv["other_session_mc"], "1:1") << r.out;
        EXPECT_EQ(r.kv["stale_mc"], "1:1");
      } else {
        EXPECT_EQ(r.kv["register_bad"], "1:1:101");
        EXPECT_EQ(r.kv["notified"], "1:1");
        EXPECT_EQ(r.kv["notification"], "1:12345:1:1");  // CU_ASYNC_NOTIFICATION_TYPE_OVER_BUDGET
        EXPECT_EQ(r.kv["notification_thread"], "1:1");
        EXPECT_EQ(r.kv["nested_register"], "800");  // CUDA_ERROR_NOT_PERMITTED
        EXPECT_EQ(r.kv["after_unregister"], "2:1:777");
        EXPECT_EQ(r.kv["unregister_bad"], "1:101:1");
        EXPECT_EQ(r.kv["other_session_unregister"], "1") << r.out;
      }
    }
  }
}

// cudaDeviceReset remotely (cuDevicePrimaryCtxReset_v2): the memory, stream, event and module made
// in the primary context before the reset fail afterwards, the primary context is retained and
// used again, and a new module, allocation, launch, pageable and page-locked copies, a captured
// graph and a host function work, and a library's kernel made before the reset still launches,
// over both transports with the same output as on the driver.
TEST_F(RemoteTest, PrimaryContextResetRetiresTheContextsObjectsAndNewOnesWork) {
  StartWorker();
  Result direct = DirectProgram({TF_RESET_PROBE, "reset"});
  ASSERT_EQ(direct.rc, 0) << direct.out;
  EXPECT_EQ(direct.kv["done"], "1") << direct.out;
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = RemoteProgram(addr, {TF_RESET_PROBE, "reset"});
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["done"], "1") << r.out;
    EXPECT_EQ(r.kv["reset"], "0") << r.out;
    EXPECT_EQ(r.kv["state_after_reset"], "0:1");
    for (const char* k : {"old_module", "old_stream", "old_event", "old_memory_free", "old_memory_range"}) {
      EXPECT_EQ(r.kv[k], "1") << k << "\n" << r.out;
    }
    EXPECT_EQ(r.kv["same_context"], "1");
    const std::string fill5 = std::to_string(5ull * 4096), fill6 = std::to_string(6ull * 4096);
    EXPECT_EQ(r.kv["after_pinned_sum"], fill5);
    EXPECT_EQ(r.kv["after_pageable_sum"], fill5);
    EXPECT_EQ(r.kv["after_roundtrip_sum"], std::to_string(4095ull * 4096 / 2));
    EXPECT_EQ(r.kv["after_graph_sum"], fill6);
    EXPECT_EQ(r.kv["after_host_func"], "1");
    EXPECT_EQ(r.kv["library_kernel_kept"], "1");
    EXPECT_EQ(r.kv["after_library_kernel_sum"], std::to_string(7ull * 4096));
    EXPECT_EQ(r.kv["bad_device"], "101");  // CUDA_ERROR_INVALID_DEVICE
    ExpectSameKeys(direct, r);
    EXPECT_EQ(r.out.find("not supported by the remote vGPU"), std::string::npos) << r.out;
    EXPECT_TRUE(worker_.WaitFor("primary context of device 0 reset (ok)", 5000)) << worker_.out;
    worker_.out.clear();
  }
}

// cudaDeviceReset with managed, mapped and registered memory alive (over TCP all mirrored; over
// shared memory host regions, and the unaligned registration mirrored), while a copy into the
// registered memory is in flight: the reset succeeds, the copy's bytes are in the registered
// memory, the managed and mapped memory fail afterwards as after a free, as on the driver, new
// managed and mapped memory work, and the dropped mirrors cost nothing more: no change is sent
// for them (the worker would refuse it and say so).
TEST_F(RemoteTest, PrimaryContextResetFreesManagedAndMappedMemoryAndDropsMirrors) {
  StartWorker();
  Result direct = DirectProgram({TF_RESET_PROBE, "mirrors"});
  ASSERT_EQ(direct.rc, 0) << direct.out;
  EXPECT_EQ(direct.kv["done"], "1") << direct.out;
  const std::string count = std::to_string(4096ull);
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = RemoteProgram(addr, {TF_RESET_PROBE, "mirrors"});
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["done"], "1") << r.out;
    EXPECT_EQ(r.kv["reset"], "0") << r.out;
    EXPECT_EQ(r.kv["managed_read_by_device_sum"], std::to_string(4095ull * 4096 / 2));
    EXPECT_EQ(r.kv["mapped_sum"], std::to_string(3ull * 4096));
    EXPECT_EQ(r.kv["registered_sum"], std::to_string(4ull * 4096));
    EXPECT_EQ(r.kv["registered_after_reset_sum"], std::to_string(8ull * 4096)) << r.out;
    EXPECT_EQ(r.kv["old_managed_free"], "1");      // CUDA_ERROR_INVALID_VALUE
    EXPECT_EQ(r.kv["old_managed_range"], "500");   // CUDA_ERROR_NOT_FOUND
    EXPECT_EQ(r.kv["old_mapped_free"], "1");
    EXPECT_EQ(r.kv["old_mapped_flags"], "1");
    EXPECT_EQ(r.kv["old_mapped_device_pointer"], "1");
    EXPECT_EQ(r.kv["registered_flags"], "0:2");     // CU_MEMHOSTREGISTER_DEVICEMAP
    EXPECT_EQ(r.kv["new_managed_read_by_device_sum"], std::to_string(4095ull * 4096));
    EXPECT_EQ(r.kv["new_managed_sum"], std::to_string(6ull * 4096));
    EXPECT_EQ(r.kv["new_mapped_sum"], std::to_string(7ull * 4096));
    EXPECT_EQ(r.kv["registered_host_writes_seen_sum"], count);
    EXPECT_EQ(r.kv["registered_again_sum"], std::to_string(10ull * 4096));
    ExpectSameKeys(direct, r);
    // TCP: managed, mapped and registered memory were mirrors; shared memory: the registration.
    const bool tcp = addr == tcp_;
    EXPECT_TRUE(worker_.WaitFor(tcp ? "3 mirrors dropped; 0 host regions freed"
                                    : "1 mirrors dropped; 2 host regions freed", 5000)) << worker_.out;
    EXPECT_EQ(worker_.out.find("mirror data refused"), std::string::npos) << worker_.out;
    EXPECT_EQ(worker_.out.find("mirror unmap of"), std::string::npos) << worker_.out;
    worker_.out.clear();
  }
}

// A reset while the session also has a created context is refused remotely with
// CUDA_ERROR_NOT_SUPPORTED and a log line (the driver would reset), and nothing of the session is
// lost: its allocation keeps working.
TEST_F(RemoteTest, PrimaryContextResetWithAnotherContextIsRefusedAndChangesNothing) {
  StartWorker();
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = RemoteProgram(addr, {TF_RESET_PROBE, "other_context"});
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["done"], "1") << r.out;
    EXPECT_EQ(r.kv["reset_with_other_context"], "801") << r.out;  // CUDA_ERROR_NOT_SUPPORTED
    EXPECT_EQ(r.kv["memory_kept_sum"], std::to_string(9ull * 4096));
    EXPECT_TRUE(worker_.WaitFor("refused: the session has another context", 5000)) << worker_.out;
    worker_.out.clear();
  }
}

// XLA memsets a cuMemHostAlloc(8, PORTABLE) buffer, has kernels write it and reads it back on a
// non-default stream into stack memory (JAX's matmul autotuning); over TCP that memory was plain
// client memory the worker could not reach (CUDA_ERROR_INVALID_VALUE). Kept as its own case so it
// can be re-checked on its own.
TEST_F(RemoteTest, PinnedMemoryUsedAsDeviceMemoryWorksOverBothTransports) {
  StartWorker();
  Result direct = DirectProgram({TF_QUERY_PROBE, "pinned_as_device"});
  ASSERT_EQ(direct.rc, 0) << direct.out;
  EXPECT_EQ(direct.kv["pinned_as_device"], "0:0:5eed:beef") << direct.out;
  EXPECT_EQ(direct.kv["pinned_kernel_direct"], "0:a11ce:b0b") << direct.out;
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = RemoteProgram(addr, {TF_QUERY_PROBE, "pinned_as_device"});
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.kv["pinned_as_device"], "0:0:5eed:beef") << addr << "\n" << r.out;
    // Handed to kernels directly (XLA does): mirrored at the launch over TCP.
    EXPECT_EQ(r.kv["pinned_kernel_direct"], "0:a11ce:b0b") << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["done"], "1");
  }
}

TEST_F(RemoteTest, PinnedHostMemoryLivesOnTheClient) {
  StartWorker();
  Result direct = Direct("host");
  ASSERT_EQ(direct.rc, 0) << direct.out;
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = Remote(addr, "host");
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.kv["done"], "1");
    EXPECT_EQ(r.kv["host_type"], "1");  // CU_MEMORYTYPE_HOST
    EXPECT_EQ(r.kv["pinned_roundtrip"], "7,12,786429");
    EXPECT_EQ(r.kv["register"], "0");
    EXPECT_EQ(r.kv["register_again"], "712");  // HOST_MEMORY_ALREADY_REGISTERED
    EXPECT_EQ(r.kv["registered_type"], "1");
    EXPECT_EQ(r.kv["unregister_again"], "713");
    // Kernels on the worker reach page-locked memory over both transports (shared over shared
    // memory, mirrored over TCP), and managed memory exists on both; pageable memory never.
    EXPECT_EQ(r.kv["host_dptr_rc"], "0") << addr;
    EXPECT_EQ(r.kv["host_dptr_is_host"], "1") << addr;
    EXPECT_EQ(r.kv["attr_map_host"], "1") << addr;
    EXPECT_EQ(r.kv["attr_pageable_access"], "0");
    EXPECT_EQ(r.kv["attr_managed"], "1");
    Result same = direct;  // the rest as the driver itself answers
    same.kv.erase("attr_pageable_access");
    ExpectSameKeys(same, r);
  }
}

TEST_F(RemoteTest, ExtendedLaunchesWaitsMemsetsUnifiedCopiesAndPoolsRunRemotely) {
  StartWorker();
  Result direct = Direct("async");
  ASSERT_EQ(direct.rc, 0) << direct.out;
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = Remote(addr, "async");
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.kv["done"], "1");
    EXPECT_EQ(r.kv["launch_ex"], "51");
    EXPECT_EQ(r.kv["cooperative"], "52");
    EXPECT_EQ(r.kv["wait_event_orders"], "2");
    EXPECT_EQ(r.kv["memset16"], "abcdabcd,0000abcd");
    EXPECT_EQ(r.kv["memset2d"], "9,9,0,9,0");
    EXPECT_EQ(r.kv["memset2d_overrun"], "1");
    EXPECT_EQ(r.kv["unified_copy"], "1");
    EXPECT_EQ(r.kv["unified_async"], "3,3");
    EXPECT_EQ(r.kv["alloc_async"], "77");
    EXPECT_EQ(r.kv["free_async_twice"], "1");
    EXPECT_EQ(r.kv["pool_owner_ok"], "1");
    EXPECT_EQ(r.kv["pool_alloc"], "5");
    EXPECT_EQ(r.kv["pool_trim"], "0:0:1");  // a created pool, the default pool, a bogus handle
    EXPECT_EQ(r.kv["pool_threshold"], "16777216");
    EXPECT_EQ(r.kv["pool_reuse"], "1");
    EXPECT_EQ(r.kv["pool_attr_width"], "1,-1,16777216,1") << "an int attribute writes 4 bytes";
    EXPECT_EQ(r.kv["pool_bad"], "1:1:1:1");
    EXPECT_EQ(r.kv["pool_destroy_twice"], "1");
    EXPECT_EQ(r.kv["wait_bogus_event"], "0") << "fire-and-forget";
    EXPECT_EQ(r.kv["after_bogus_sync"], "400") << "the bad handle surfaces at the next sync";
    // The worker validates what the fake driver does not (handles at a fire-and-forget call,
    // memset ranges): those keys differ by design.
    Result d = direct;
    for (const char* k : {"wait_bogus_event", "after_bogus_sync", "memset2d_overrun"}) d.kv.erase(k);
    ExpectSameKeys(d, r);
  }
}

// NVIDIA's simpleCallback: a stream callback starts a thread that frees the workload's page-locked
// memory while other streams' callbacks are still pending. Freeing a host region synchronizes the
// worker's context, which waits for those callbacks: the session must take their
// acknowledgements first (every run stalled until the 60 s bound before).
TEST_F(RemoteTest, MemoryFreedFromAStreamCallbacksThreadDoesNotStall) {
  StartWorker();
  Result direct = DirectProgram({TF_PROBE, "callbackfree", "8", "3"});
  ASSERT_EQ(direct.rc, 0) << direct.out;
  EXPECT_EQ(direct.kv["rounds_ok"], "3");
  for (const std::string& addr : {unix_, tcp_}) {
    const auto t0 = std::chrono::steady_clock::now();
    Result r = RemoteProgram(addr, {TF_PROBE, "callbackfree", "8", "3"});
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["rounds_ok"], "3") << addr;
    EXPECT_LT(s, 30.0) << addr;
  }
}

TEST_F(RemoteTest, HostFunctionsRunOnTheClientInStreamOrder) {
  StartWorker();
  Result direct = Direct("callbacks");
  ASSERT_EQ(direct.rc, 0) << direct.out;
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = Remote(addr, "callbacks");
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.kv["done"], "1");
    EXPECT_EQ(r.kv["event_during_host_fn"], "600") << "work after a host function waits for it";
    EXPECT_EQ(r.kv["host_fn_after_kernel"], "1");
    EXPECT_EQ(r.kv["event_after_sync"], "0");
    EXPECT_EQ(r.kv["later_fn_saw_flag"], "1");
    EXPECT_EQ(r.kv["ran_while_idle"], "7");
    EXPECT_EQ(r.kv["unload_after_host_fn"], "1") << "a module unload waits for a pending host function";
    EXPECT_EQ(r.kv["load_after_host_fn"], "1") << "a module load waits for a pending host function";
    EXPECT_EQ(r.kv["order"], "1234");
    ExpectSameKeys(direct, r);
  }
}

TEST_F(RemoteTest, GraphsOfKernelNodesRunAndUpdateRemotely) {
  StartWorker();
  Result direct = Direct("graphs");
  ASSERT_EQ(direct.rc, 0) << direct.out;
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = Remote(addr, "graphs");
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.kv["done"], "1");
    EXPECT_EQ(r.kv["graph_run"], "11,11,12");
    EXPECT_EQ(r.kv["graph_updated"], "11,13");
    EXPECT_EQ(r.kv["programmatic_edge"], "21,22") << "a kernel node behind a programmatic edge";
    EXPECT_EQ(r.kv["launch_bogus"], "0") << "fire-and-forget";
    EXPECT_EQ(r.kv["after_bogus_sync"], "400");
    EXPECT_EQ(r.kv["dep_bogus"], "1");
    EXPECT_EQ(r.kv["destroy_twice"], "1");
    Result d = direct;
    for (const char* k : {"launch_bogus", "after_bogus_sync", "dep_bogus"}) d.kv.erase(k);
    ExpectSameKeys(d, r);
  }
}

// simpleCudaGraphs, jacobiCudaGraphs, graphMemoryNodes: memcpy nodes and captured copies with pageable memory (heap and stack) copy
// what the host holds at each launch, and the program sees what they wrote once it synchronized
// (stream, event, context), over both transports, byte for byte as on the driver itself.
TEST_F(RemoteTest, GraphCopiesOfPageableMemoryMoveTheBytesOfEachLaunch) {
  StartWorker();
  Result direct = Direct("graphpageable");
  ASSERT_EQ(direct.rc, 0) << direct.out;
  EXPECT_EQ(direct.kv["rounds_ok"], "3");
  EXPECT_EQ(direct.kv["captured_ok"], "2");
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = Remote(addr, "graphpageable");
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["done"], "1");
    EXPECT_EQ(r.kv["rounds_ok"], "3") << addr << ": three launches, new host bytes each time";
    EXPECT_EQ(r.kv["event_sync"], "1") << addr;
    EXPECT_EQ(r.kv["exec_set"], direct.kv["exec_set"]) << addr << ": the updated node's target only";
    EXPECT_EQ(r.kv["pitched"], direct.kv["pitched"]) << addr << ": bytes between rows kept";
    EXPECT_EQ(r.kv["captured_untouched"], "1") << addr << ": a capture copies nothing";
    EXPECT_EQ(r.kv["captured_ok"], "2") << addr << ": captured copies move each launch's bytes";
    // A host function captured after a copy runs at each launch and sees the copy's bytes.
    EXPECT_EQ(r.kv["captured_big_nodes"], "2") << addr << ": a copy sent in slices is one node";
    EXPECT_EQ(r.kv["captured_big_ok"], "2") << addr;
    EXPECT_EQ(r.kv["captured_host_untouched"], "1") << addr;
    EXPECT_EQ(r.kv["captured_host_runs"], "3") << addr;
    EXPECT_EQ(r.kv["captured_host_saw_copy"], "1") << addr;
    // A node naming a whole buffer that earlier copies named in slices.
    EXPECT_EQ(r.kv["whole_after_slices_ok"], "1") << addr;
  }
}

// graphConditionalNodes: conditional handles keep the driver's value (a kernel sets it on the
// device), the client gets the bodies the driver created and fills them; IF/ELSE by the handle's
// default, SWITCH picked by a kernel, WHILE ended by a kernel, a WHILE body built by capture, as on
// the driver itself.
TEST_F(RemoteTest, ConditionalGraphNodesRunTheBodyTheDeviceChose) {
  StartWorker();
  Result direct = Direct("graphconditional");
  ASSERT_EQ(direct.rc, 0) << direct.out;
  EXPECT_EQ(direct.kv["switch"], "12");
  // A body built by capturing into it, the capture ended with no graph output (do-while).
  EXPECT_EQ(direct.kv["captured_while"], "444");
  EXPECT_EQ(direct.kv["body_nodes"], "2");
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = Remote(addr, "graphconditional");
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["done"], "1");
    for (const char* k : {"if_default_1", "if_default_0", "switch", "while", "captured_while", "body_nodes"}) {
      EXPECT_EQ(r.kv[k], direct.kv[k]) << addr << " " << k;
    }
    // A body belongs to its node: the worker refuses to destroy it (the fake driver lets it).
    EXPECT_EQ(r.kv["destroy_body_refused"], "1") << addr;
  }
}

TEST_F(RemoteTest, GraphNodesOfEveryKindRunQueryAndUpdateRemotely) {
  StartWorker();
  Result direct = Direct("graphnodes");
  ASSERT_EQ(direct.rc, 0) << direct.out;
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = Remote(addr, "graphnodes");
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.kv["done"], "1");
    // memset -> host node -> memcpy -> empty -> child graph (memset) -> event record.
    EXPECT_EQ(r.kv["run"], "21,21,0,77,H");
    EXPECT_EQ(r.kv["edges"], "5");
    EXPECT_EQ(r.kv["roots"], "1,1");
    EXPECT_EQ(r.kv["copy_deps"], "1,1");
    EXPECT_EQ(r.kv["updated"], "22,21,0") << "memset updated, copy disabled";
    EXPECT_EQ(r.kv["exec_update"], "0,21,21");
    EXPECT_EQ(r.kv["graph_alloc"], "5a,2") << "graph allocation usable and known as device memory";
    EXPECT_EQ(r.kv["graph_alloc_freed_attr"], "1");
    // An allocation at the address of one the graph freed before it outlives the graph.
    EXPECT_EQ(r.kv["graph_alloc_reused"], "1,0");
    EXPECT_EQ(r.kv["graph_alloc_reused"], direct.kv["graph_alloc_reused"]);
    EXPECT_EQ(r.kv["graph_alloc_relaunched_free"], "0") << "a relaunch allocates it again";
    EXPECT_EQ(r.kv["graph_alloc_freed_in_other_graph"], "0") << "a free node for it between launches";
    // Page-locked memory is shared over shared memory, copied through a shadow over TCP;
    // pageable memory through a shadow on both (GraphCopiesOfPageableMemory...).
    EXPECT_EQ(r.kv["pinned_copy_rc"], "0");
    EXPECT_EQ(r.kv["pinned_copy"], "21,77");
    EXPECT_EQ(r.kv["pageable_copy_rc"], "0");
    EXPECT_EQ(r.kv["bad_node_type"], "1");
    EXPECT_EQ(r.kv["bad_node_dep"], "1");
    EXPECT_EQ(r.kv["bad_child"], "1");
    EXPECT_EQ(r.kv["bad_exec_set"], "1");
    EXPECT_EQ(r.kv["bad_memset_ptr"], "1") << "a pointer outside the session's allocations";
    EXPECT_EQ(r.kv["destroyed_node_type"], "1");
    EXPECT_EQ(r.kv["after_bad"], "1");
    Result d = direct;
    for (const char* k : {"pinned_copy_rc", "pinned_copy", "pageable_copy_rc", "bad_memset_ptr"}) {
      d.kv.erase(k);
    }
    ExpectSameKeys(d, r);
  }
}

// cudaGraphNodeGetDependentNodes, cudaGraphExecGetFlags, cudaGraphKernelNodeSetAttribute,
// cudaUserObjectCreate, cudaGraphDebugDotPrint and the node getters and setters: what the program
// reads back and runs is what the driver gives it; the user object's destroy callback runs in the
// program, once; the DOT file lands on the program's machine; bad input fails that call only.
TEST_F(RemoteTest, GraphNodesReadBackAndChangeRemotelyAsNatively) {
  StartWorker();
  Result direct = Direct("graphnodeaccess");
  ASSERT_EQ(direct.rc, 0) << direct.out;
  EXPECT_EQ(direct.kv["run"], "9,68,68,0,0,10") << direct.out;
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = Remote(addr, "graphnodeaccess");
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.kv["done"], "1");
    EXPECT_EQ(r.kv["event_get"], "1,1") << "the program's own event handles come back";
    EXPECT_EQ(r.kv["host_set"], "1,1");
    EXPECT_EQ(r.kv["run"], "9,68,68,0,0,10") << "exec kernel/memset updates, node copy update, host node";
    EXPECT_EQ(r.kv["exec_flags"], "8");
    EXPECT_EQ(r.kv["user_object"], "0,1,1") << "destroyed once, after the executable graph went";
    EXPECT_EQ(r.kv["user_object_refs"], "1,1,11");
    EXPECT_EQ(r.kv["user_object_graph_refs"], "1,1,1,1,0,1,111");  // CUDA_ERROR_INVALID_VALUE but one
    EXPECT_EQ(r.kv["dot"], "1,1,5") << "the DOT file is written where the program asked";
    EXPECT_EQ(r.kv["dot_bad_dir"], "304");
    EXPECT_EQ(r.kv["bad_attr"], "1,1");
    EXPECT_EQ(r.kv["after_bad"], "51");
    EXPECT_EQ(r.kv["exec_events"], "1,400,1,1,1") << "a node of a graph the exec was not made from";
    EXPECT_EQ(r.kv["graph_mem_trim"], "101");
    EXPECT_EQ(r.kv["graph_mem_attr"], "0,1,1,101,1,1");
    ExpectSameKeys(direct, r);
  }
}

TEST_F(RemoteTest, LibrariesAndKernelsLoadAndLaunchRemotely) {
  StartWorker();
  Result direct = Direct("library");
  ASSERT_EQ(direct.rc, 0) << direct.out;
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = Remote(addr, "library");
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.kv["done"], "1");
    EXPECT_EQ(r.kv["kernel_name"], "fill_u32");
    EXPECT_EQ(r.kv["enumerated_has_fill"], "1");
    EXPECT_EQ(r.kv["kernel_attr"], "4096");  // the set is seen, not a cached earlier answer
    // Sets of the same value are answered locally, yet every change through the kernel or its
    // function is seen; a refused set is refused again.
    EXPECT_EQ(r.kv["kernel_attr_sets"], "4096,1024,4096,1024");
    EXPECT_EQ(r.kv["kernel_attr_limits"], "1,1,1,4096,50");  // CUDA_ERROR_INVALID_VALUE at once
    EXPECT_EQ(r.kv["kernel_attr_bad"], "1,1");
    EXPECT_EQ(r.kv["kernel_function_stable"], "1");
    EXPECT_EQ(r.kv["primary_state"], "1:1");
    EXPECT_EQ(r.kv["library_run"], "21,22,23,0");
    EXPECT_EQ(r.kv["library_module_bad"], "1:400");
    EXPECT_EQ(r.kv["func_names"], "0:fill_u32:0:fill_u32");
    EXPECT_EQ(r.kv["func_name_bogus"], "400");
    EXPECT_EQ(r.kv["kernel_bogus"], "400");
    EXPECT_EQ(r.kv["lib_bogus"], "400");
    EXPECT_EQ(r.kv["unload_twice"], "400");
    ExpectSameKeys(direct, r);
  }
}

// A program whose first CUDA call is a launch (NVIDIA's simpleCooperativeGroups): the kernel is
// looked up before any context exists, when the driver does not describe its parameters; the
// launch must still forward them.
TEST_F(RemoteTest, AKernelLookedUpBeforeAnyContextLaunchesWithItsParameters) {
  StartWorker();
  Result direct = Direct("libraryfirst");
  ASSERT_EQ(direct.rc, 0) << direct.out;
  EXPECT_EQ(direct.kv["context_at_lookup"], "0");
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = Remote(addr, "libraryfirst");
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.kv["context_at_lookup"], "0");
    EXPECT_EQ(r.kv["library_first_run"], "31,0");
    EXPECT_EQ(r.kv["library_first_threads_positive"], "1");
    EXPECT_EQ(r.kv["done"], "1");
    ExpectSameKeys(direct, r);
  }
}

TEST_F(RemoteTest, StreamCaptureRecordsLaunchesIntoAGraphRemotely) {
  StartWorker();
  Result direct = Direct("capture");
  ASSERT_EQ(direct.rc, 0) << direct.out;
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = Remote(addr, "capture");
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.kv["done"], "1");
    EXPECT_EQ(r.kv["before"], "0");
    EXPECT_EQ(r.kv["during"], "1");
    EXPECT_EQ(r.kv["info_during"], "1,1");
    EXPECT_EQ(r.kv["after"], "0");
    EXPECT_EQ(r.kv["not_run_yet"], "0,0");
    EXPECT_EQ(r.kv["captured_run"], "31,32");
    EXPECT_EQ(r.kv["captured_nodes"], "2:2:1:1:1");  // PyTorch checks a captured graph's nodes
    EXPECT_EQ(r.kv["global_relaxed_alloc"], "0:0");  // the worker follows the relaxed mode
    EXPECT_EQ(r.kv["global_unsafe_alloc"], "900:901");
    ExpectSameKeys(direct, r);
  }
}

TEST_F(RemoteTest, AForkedChildGetsItsOwnConnection) {
  StartWorker();
  Result r = Remote(unix_, "fork");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.kv["child_value"], "42") << r.out;
  EXPECT_EQ(r.kv["child_status"], "0");
  EXPECT_EQ(r.kv["parent_value"], "3");
}

// CUDA IPC between two clients of one worker (tests/gpu/ipc_pair.cc: a producer forks a consumer
// before cuInit; each has its own connection and session). `RESULT x_key=value` -> kv["x_key"].
std::map<std::string, std::string> IpcResults(const Result& r) {
  std::map<std::string, std::string> kv;
  for (const auto& [k, v] : r.kv) {
    if (k.rfind("RESULT ", 0) == 0) kv[k.substr(7)] = v;
  }
  return kv;
}

void ExpectIpcPairWorked(const Result& r) {
  auto kv = IpcResults(r);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(kv["verdict"], "PASS") << r.out;
  // What a user of torch.multiprocessing would notice: each side sees the other's bytes.
  EXPECT_EQ(kv["b_reads_producer_copy"], "1") << r.out;
  EXPECT_EQ(kv["b_reads_producer_memset"], "1") << r.out;
  EXPECT_EQ(kv["a_sees_consumer_memset"], "1") << r.out;
  EXPECT_EQ(kv["a_sees_consumer_copy"], "1") << r.out;
  EXPECT_EQ(kv["a_ipc_event_supported"], "1") << r.out;
  // Opened memory is device memory of the consumer: range, attributes, cuMemcpy's direction.
  EXPECT_EQ(kv["b_range_ok"], "1") << r.out;
  EXPECT_EQ(kv["b_ptr_is_device"], "1") << r.out;
  EXPECT_EQ(kv["b_unified_copy_ok"], "1") << r.out;
  EXPECT_EQ(kv["b_open_again_same_pointer"], "1") << r.out;
  // The driver's errors, never a crash.
  EXPECT_EQ(kv["b_double_close"], "1") << r.out;  // CUDA_ERROR_INVALID_VALUE
  EXPECT_EQ(kv["b_close_wild"], "1") << r.out;
  EXPECT_EQ(kv["b_open_zero_handle"], "400") << r.out;  // CUDA_ERROR_INVALID_HANDLE
  EXPECT_EQ(kv["b_open_reversed_handle"], "400") << r.out;
  EXPECT_EQ(kv["b_open_zero_event_handle"], "400") << r.out;
  EXPECT_EQ(kv["a_plain_event_handle"], "1") << r.out;
  EXPECT_EQ(kv["a_wild_pointer_handle"], "1") << r.out;
  EXPECT_EQ(kv["a_open_own_handle"], "201") << r.out;  // CUDA_ERROR_INVALID_CONTEXT
  EXPECT_EQ(kv["b_alloc_after"], "0") << r.out;
}

TEST_F(RemoteTest, IpcMemoryAndEventsPassBetweenProcessesOnTheFakeDriver) {
  Result direct = DirectProgram({TF_IPC_PAIR, "--mib", "8"});
  ExpectIpcPairWorked(direct);
}

TEST_F(RemoteTest, IpcMemoryAndEventsPassBetweenTwoClientsOfOneWorkerOverSharedMemory) {
  StartWorker();
  Result direct = DirectProgram({TF_IPC_PAIR, "--mib", "8"});
  Result remote = RemoteProgram(unix_, {TF_IPC_PAIR, "--mib", "8"});
  ExpectIpcPairWorked(remote);
  EXPECT_EQ(IpcResults(remote), IpcResults(direct)) << "remote and direct runs differ\n" << remote.out;
}

TEST_F(RemoteTest, IpcMemoryAndEventsPassBetweenTwoClientsOfOneWorkerOverTcp) {
  StartWorker();
  Result direct = DirectProgram({TF_IPC_PAIR, "--mib", "8"});
  Result remote = RemoteProgram(tcp_, {TF_IPC_PAIR, "--mib", "8"});
  ExpectIpcPairWorked(remote);
  EXPECT_EQ(IpcResults(remote), IpcResults(direct)) << "remote and direct runs differ\n" << remote.out;
}

// A consumer that exits with the memory still open and its events alive: its session closes and
// destroys them, and the producer's memory is untouched by that.
TEST_F(RemoteTest, AConsumerThatExitsWithIpcMemoryOpenHasItClosedByItsSession) {
  StartWorker();
  Result r = RemoteProgram(unix_, {TF_IPC_PAIR, "--mib", "8", "--leave-open"});
  auto kv = IpcResults(r);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(kv["verdict"], "PASS") << r.out;
  EXPECT_EQ(kv["a_sees_consumer_copy"], "1") << r.out;
  EXPECT_EQ(kv["a_free"], "0") << r.out;
  EXPECT_EQ(kv.count("b_close"), 0u) << r.out;
  EXPECT_TRUE(worker_.WaitFor("events, 0 modules, 0 graphs, 0 host regions, 0 mirrors, 1 IPC mappings", 5000))
      << worker_.out;
}

void KillWorkerAndExpectFastFailure(RemoteTest* t, Child* worker, Child* probe) {
  ASSERT_TRUE(probe->WaitFor("ready=1", 10000)) << probe->out;
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto killed = Clock::now();
  kill(worker->pid, SIGKILL);
  int rc = probe->Wait(5000);
  double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
  ASSERT_EQ(rc, 0) << "the client did not notice the dead worker within 5 s\n" << probe->out;
  EXPECT_LT(seconds, 5.0);
  EXPECT_NE(probe->out.find("loop_error=719"), std::string::npos) << probe->out;
  EXPECT_NE(probe->out.find("next_error=719"), std::string::npos) << probe->out;
  // Asked while a framework unwinds: no primary context any more, not an error (PyTorch checks it
  // where it cannot throw and would abort).
  EXPECT_NE(probe->out.find("primary_state=0:0:0"), std::string::npos) << probe->out;
  EXPECT_NE(probe->out.find("lost the connection"), std::string::npos) << probe->out;
  (void)t;
  std::printf("client noticed the dead worker after %.3f s\n", seconds);
}

TEST_F(RemoteTest, AKilledWorkerTurnsIntoErrorsWithinSecondsOverTcp) {
  StartWorker();
  Child probe;
  StartProbe(&probe, tcp_, "loop");
  KillWorkerAndExpectFastFailure(this, &worker_, &probe);
}

TEST_F(RemoteTest, AKilledWorkerTurnsIntoErrorsWithinSecondsOverSharedMemory) {
  StartWorker();
  Child probe;
  StartProbe(&probe, unix_, "loop");
  KillWorkerAndExpectFastFailure(this, &worker_, &probe);
}

// Memory in use on the fake device, as NVML sees it across processes.
struct Nvml {
  void* h = nullptr;
  int (*get_memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlDevice_t dev = nullptr;
  bool Open() {
    h = dlopen(TF_FAKENVML, RTLD_NOW | RTLD_LOCAL);
    if (!h) return false;
    auto init = reinterpret_cast<int (*)()>(dlsym(h, "nvmlInit_v2"));
    auto by_index = reinterpret_cast<int (*)(unsigned, nvmlDevice_t*)>(
        dlsym(h, "nvmlDeviceGetHandleByIndex_v2"));
    get_memory = reinterpret_cast<int (*)(nvmlDevice_t, nvmlMemory_t*)>(
        dlsym(h, "nvmlDeviceGetMemoryInfo"));
    return init && by_index && get_memory && init() == 0 && by_index(0, &dev) == 0;
  }
  uint64_t UsedMib() {
    nvmlMemory_t m = {};
    get_memory(dev, &m);
    return m.used >> 20;
  }
};

TEST_F(RemoteTest, AKilledClientsSessionEndsAndItsMemoryIsFreed) {
  StartWorker();
  setenv("FAKECUDA_SHM_NAME", shm_name_.c_str(), 1);
  Nvml nvml;
  ASSERT_TRUE(nvml.Open());
  Child probe;
  StartProbe(&probe, tcp_, "hold");
  ASSERT_TRUE(probe.WaitFor("ready=1", 10000)) << probe.out;
  EXPECT_GE(nvml.UsedMib(), 512u);
  kill(probe.pid, SIGKILL);
  probe.Wait(5000);
  auto deadline = Clock::now() + std::chrono::seconds(5);
  while (nvml.UsedMib() != 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(nvml.UsedMib(), 0u);
  ASSERT_TRUE(worker_.WaitFor("session ended: freed 1 allocations", 5000)) << worker_.out;
}


// ---- Arrays, mipmapped arrays, array and 2D/3D copies, texture and surface objects
// (tests/worker/array_probe.cc).

TEST_F(RemoteTest, ArraysAnd2D3DCopiesRoundTripDataOverBothTransports) {
  StartWorker();
  Result direct = DirectProgram({TF_ARRAY_PROBE, "arrays"});
  ASSERT_EQ(direct.rc, 0) << direct.out;
  EXPECT_EQ(direct.kv["done"], "1");
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = RemoteProgram(addr, {TF_ARRAY_PROBE, "arrays"});
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.kv["done"], "1");
    EXPECT_EQ(r.kv["array_desc"], "64,32,32,1");  // CU_AD_FORMAT_FLOAT, answered by the client
    EXPECT_EQ(r.kv["array3d_desc"], "64,32,0,0");
    EXPECT_EQ(r.kv["array_requirements"], "1");
    EXPECT_EQ(r.kv["htoa_atoh"], "1");
    EXPECT_EQ(r.kv["atoh_offset"], "1");
    EXPECT_EQ(r.kv["async_htoa_atoh"], "1");
    EXPECT_EQ(r.kv["copy2d_host_array"], "1");
    EXPECT_EQ(r.kv["copy2d_array_device"], "1");
    EXPECT_EQ(r.kv["copy2d_async"], "1");
    EXPECT_EQ(r.kv["copy2d_unified"], "1");
    EXPECT_EQ(r.kv["dtoa_atoa_atod"], "1");
    EXPECT_EQ(r.kv["copy3d"], "1");
    EXPECT_EQ(r.kv["copy3d_async"], "1");
    EXPECT_EQ(r.kv["large"], "1,1") << "copies larger than a transport slice, rows wider than one";
    EXPECT_EQ(r.kv["mip_levels"], "32x32,16x16,8x8");
    EXPECT_EQ(r.kv["mip_level_copy"], "1");
    EXPECT_EQ(r.kv["mip_requirements"], "1");
    // Generated calls: the driver's values, its errors (compared with the driver's below too).
    EXPECT_EQ(r.kv["create_null"], "1:1:1");  // CUDA_ERROR_INVALID_VALUE
    EXPECT_EQ(r.kv["requirements_bad_device"], "101:101:7");  // CUDA_ERROR_INVALID_DEVICE
    EXPECT_EQ(r.kv["array_requirements_values"], direct.kv["array_requirements_values"]);
    EXPECT_EQ(r.kv["mip_requirements_values"], direct.kv["mip_requirements_values"]);
    EXPECT_EQ(r.kv["tex_objects"], "1");
    EXPECT_EQ(r.kv["surf_object"], "1");
    EXPECT_EQ(r.kv["surf_of_linear"], "1");
    // Refused with CUDA_ERROR_INVALID_VALUE / INVALID_HANDLE, and the program goes on.
    EXPECT_EQ(r.kv["bad_region_2d"], "1");
    EXPECT_EQ(r.kv["bad_region_3d"], "1");
    EXPECT_EQ(r.kv["bad_device_rows"], "1");
    EXPECT_EQ(r.kv["good_device_rows"], "0");
    EXPECT_EQ(r.kv["bad_array_handle"], "1");
    EXPECT_EQ(r.kv["bad_linear_offset"], "1");
    EXPECT_EQ(r.kv["bad_dtoa_length"], "1");
    EXPECT_EQ(r.kv["tex_bad_linear"], "1");
    for (const char* k : {"tex_forged_array", "surf_forged_array", "tex_outside_linear", "tex_bad_type",
                          "tex_destroy_bogus", "tex_destroyed_array", "surf_destroyed_array"}) {
      EXPECT_EQ(r.kv[k], "1") << k;  // CUDA_ERROR_INVALID_VALUE, as the driver answers (ExpectSameKeys)
    }
    EXPECT_EQ(r.kv["destroy_bogus_array"], "400");
    EXPECT_EQ(r.kv["destroy_level"], "400");
    EXPECT_EQ(r.kv["after_errors"], "1");
    EXPECT_EQ(r.kv["surf_destroy_twice"], "1");
    EXPECT_EQ(r.kv["destroy_twice"], "400");
    for (const char* k : {"stale_array_copy", "stale_array_requirements", "stale_level_copy",
                          "stale_mip_level"}) {
      EXPECT_EQ(r.kv[k], "1") << k;
      EXPECT_EQ(direct.kv[k], "1") << k;
    }
    ExpectSameKeys(direct, r);
  }
}

TEST_F(RemoteTest, AKilledClientsArraysAndObjectsAreDestroyed) {
  StartWorker();
  setenv("FAKECUDA_SHM_NAME", shm_name_.c_str(), 1);
  Nvml nvml;
  ASSERT_TRUE(nvml.Open());
  for (const std::string& addr : {tcp_, unix_}) {
    Child probe;
    probe.Start({TF_ARRAY_PROBE, "hold"}, {std::string("LD_LIBRARY_PATH=") + TF_CLIENT_INJECT,
                                            "TFUSION_REMOTE=" + addr, "TFUSION_TOKEN=sekrit"});
    ASSERT_TRUE(probe.WaitFor("ready=1", 10000)) << probe.out;
    EXPECT_GE(nvml.UsedMib(), 256u);
    kill(probe.pid, SIGKILL);
    probe.Wait(5000);
    auto deadline = Clock::now() + std::chrono::seconds(5);
    while (nvml.UsedMib() != 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(nvml.UsedMib(), 0u) << addr;
    ASSERT_TRUE(worker_.WaitFor(
        "destroyed 1 arrays, 1 mipmapped arrays, 1 texture and 1 surface objects", 5000))
        << worker_.out;
    worker_.out.clear();
  }
}

// A session blocked in the driver (a 30 s synchronize) whose client is killed ends after
// TFUSION_WORKER_STUCK_S, freeing the client's memory, instead of holding it until the call returns.
TEST_F(RemoteTest, ASessionBlockedInTheDriverEndsSoonAfterItsClientDies) {
  StartWorker({"TFUSION_WORKER_STUCK_S=1"});
  setenv("FAKECUDA_SHM_NAME", shm_name_.c_str(), 1);
  Nvml nvml;
  ASSERT_TRUE(nvml.Open());
  for (const std::string& addr : {tcp_, unix_}) {
    Child probe;
    probe.Start({TF_PROBE, "stuck"}, {std::string("LD_LIBRARY_PATH=") + TF_CLIENT_INJECT, "TFUSION_REMOTE=" + addr,
                                      "TFUSION_TOKEN=sekrit"});
    ASSERT_TRUE(probe.WaitFor("stuck=1", 10000)) << probe.out;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_GE(nvml.UsedMib(), 256u);
    const auto killed = Clock::now();
    kill(probe.pid, SIGKILL);
    probe.Wait(5000);
    ASSERT_TRUE(worker_.WaitFor("client gone while this session was blocked in cuCtxSynchronize", 10000))
        << addr << "\n" << worker_.out;
    auto deadline = Clock::now() + std::chrono::seconds(5);
    while (nvml.UsedMib() != 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(nvml.UsedMib(), 0u) << addr;
    EXPECT_LT(Clock::now() - killed, std::chrono::seconds(15)) << "not after the 30 s call";
    worker_.out.clear();
  }
}

// ---- Page-locked memory shared with the worker (host regions) and bulk copies
// (tests/worker/host_region_probe.cc).

TEST_F(RemoteTest, PinnedMemoryIsSharedWithTheWorkerAtTheSameAddressOverSharedMemory) {
  StartWorker();
  Result direct = DirectProgram({TF_HOST_PROBE, "pinned"});
  ASSERT_EQ(direct.rc, 0) << direct.out;
  Result r = RemoteProgram(unix_, {TF_HOST_PROBE, "pinned"});
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.kv["done"], "1");
  EXPECT_EQ(r.kv["pinned_type"], "1");  // CU_MEMORYTYPE_HOST, answered by the client
  EXPECT_EQ(r.kv["pinned_range"], "1048576");
  EXPECT_EQ(r.kv["pinned_flags"], "3");
  // The device pointer is the worker's, equal to the host address: the worker mapped the memory
  // at the same address, and a kernel writing through it lands in this process's memory.
  EXPECT_EQ(r.kv["dptr_is_host"], "1");
  EXPECT_EQ(r.kv["kernel_wrote_pinned"], "0,abc,abc");
  // Async copies are fire-and-forget in stream order, DtoH included (no round trip).
  EXPECT_EQ(r.kv["async_calls_returned_early"], "1");
  EXPECT_EQ(r.kv["query_while_busy"], "600");
  EXPECT_EQ(r.kv["not_landed_yet"], "0");
  EXPECT_EQ(r.kv["async_roundtrip"], "5,5,1");
  EXPECT_EQ(r.kv["sync_equal"], "1");
  EXPECT_EQ(r.kv["partial_equal"], "1");
  EXPECT_EQ(r.kv["unified_equal"], "1");
  EXPECT_EQ(r.kv["sizes_ok"], "1");
  EXPECT_EQ(r.kv["free_twice"], "1");
  ExpectSameKeys(direct, r);
}

TEST_F(RemoteTest, PerThreadDefaultStreamVariantsRunRemotely) {
  StartWorker();
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = Remote(addr, "perthread");
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["done"], "1");
    // HtoD, then a memset of words 4 and 5, on the thread's default stream, in that order.
    EXPECT_EQ(r.kv["per_thread"], "0,21,5,5,7161") << addr;
    EXPECT_EQ(r.kv["per_thread_event"], "0") << addr;
  }
}

TEST_F(RemoteTest, AProgramThreadWithASmallStackStartsAndCallsTheStub) {
  StartWorker();
  Result direct = Direct("smallstack");
  ASSERT_EQ(direct.rc, 0) << direct.out;
  EXPECT_EQ(direct.kv["small_stack_thread"], "0");
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = Remote(addr, "smallstack");
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["small_stack_thread"], "0") << addr;  // not EINVAL: the stack is the program's
    EXPECT_EQ(r.kv["small_stack_calls"], "0") << addr;
    EXPECT_EQ(r.kv["small_stack_value"], "77") << addr;
    EXPECT_EQ(r.kv["done"], "1");
  }
}

TEST_F(RemoteTest, CacheConfigurationsAndLibrariesFromFilesWorkRemotely) {
  StartWorker();
  Result direct = Direct("cacheconfig");
  ASSERT_EQ(direct.rc, 0) << direct.out;
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = Remote(addr, "cacheconfig");
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["done"], "1");
    EXPECT_EQ(r.kv["ctx_cache_initial"], "0") << addr;
    EXPECT_EQ(r.kv["ctx_cache_set"], "2") << addr;  // CU_FUNC_CACHE_PREFER_L1, not a stale answer
    EXPECT_EQ(r.kv["ctx_cache_bad"], "1") << addr;  // CUDA_ERROR_INVALID_VALUE, nothing changed
    EXPECT_EQ(r.kv["ctx_cache_after_bad"], "2") << addr;
    EXPECT_EQ(r.kv["func_cache"], "0:1:400") << addr;
    EXPECT_EQ(r.kv["kernel_cache"], "0:1") << addr;
    EXPECT_EQ(r.kv["cache_run"], "41") << addr;
    // The fake driver has no cuLibraryLoadFromFile; the stub reads the file and loads its image.
    EXPECT_EQ(r.kv["library_file"], "0") << addr;
    EXPECT_EQ(r.kv["library_file_missing"], std::to_string(CUDA_ERROR_FILE_NOT_FOUND)) << addr;
    ExpectSameKeys(direct, r);
  }
}

TEST_F(RemoteTest, ModulesLoadLazilyUnlessTheClientAsksForEagerLoading) {
  StartWorker();
  for (const std::string& addr : {tcp_, unix_}) {
    Result lazy = Remote(addr, "loadingmode");
    ASSERT_EQ(lazy.rc, 0) << addr << "\n" << lazy.out;
    EXPECT_EQ(lazy.kv["loading_mode"], std::to_string(CU_MODULE_LAZY_LOADING)) << addr;
    EXPECT_EQ(lazy.kv["loading_mode_null"], std::to_string(CUDA_ERROR_INVALID_VALUE)) << addr;
    Result eager = RemoteProgram(addr, {TF_PROBE, "loadingmode"}, "sekrit", {"CUDA_MODULE_LOADING=EAGER"});
    ASSERT_EQ(eager.rc, 0) << addr << "\n" << eager.out;
    EXPECT_EQ(eager.kv["loading_mode"], std::to_string(CU_MODULE_EAGER_LOADING)) << addr;
  }
}

TEST_F(RemoteTest, PinnedMemoryWithoutHostRegionsStaysCorrect) {
  StartWorker();
  Result direct = DirectProgram({TF_HOST_PROBE, "pinned", "--no-zero-copy"});
  ASSERT_EQ(direct.rc, 0) << direct.out;
  // TCP cannot share memory; over shared memory TFUSION_HOST_REGIONS=0 turns regions off.
  for (const auto& [addr, env] : std::vector<std::pair<std::string, std::string>>{
           {tcp_, "TFUSION_HOST_REGIONS=1"}, {unix_, "TFUSION_HOST_REGIONS=0"}}) {
    Result r = RemoteProgram(addr, {TF_HOST_PROBE, "pinned", "--no-zero-copy"}, "sekrit", {env});
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["done"], "1");
    EXPECT_EQ(r.kv["async_roundtrip"], "5,5,1");
    EXPECT_EQ(r.kv["sync_equal"], "1");
    EXPECT_EQ(r.kv["sizes_ok"], "1");
    // Async DtoH into client memory is a round trip there: it waits for the stream.
    Result d = direct;
    for (const char* k : {"async_calls_returned_early", "query_while_busy", "not_landed_yet"}) {
      d.kv.erase(k);
    }
    ExpectSameKeys(d, r);
  }
}

// Zero-copy memory over TCP is mirrored (client_mirror.cc, session_mirrors.cc): what kernels,
// copies and host functions write reaches the host by the next synchronizing call or host
// function, and what the host writes reaches them before the next call.
// simpleStreams: copies between device memory and memory registered with DEVICEMAP (shared with
// the worker over shared memory, mirrored over TCP); every byte arrives both ways, synchronous and
// async, and the memory is the program's again after unregistering.
TEST_F(RemoteTest, CopiesWithRegisteredMappedMemoryArriveIntact) {
  StartWorker();
  Result direct = DirectProgram({TF_HOST_PROBE, "registered", "8", "3"});
  ASSERT_EQ(direct.rc, 0) << direct.out;
  EXPECT_EQ(direct.kv["intact"], "3");
  EXPECT_EQ(direct.kv["visible_without_call"], "1");
  EXPECT_EQ(direct.kv["after_unregister"], "5c,77,78");
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = RemoteProgram(addr, {TF_HOST_PROBE, "registered", "8", "3"});
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["intact"], "3") << addr;
    EXPECT_EQ(r.kv["after_unregister"], "5c,77,78") << addr << ": the program's bytes, writable";
  }
  // Over shared memory the registration is shared with the worker (a host region): a copy's
  // bytes land in it as natively, with no call to carry them. Over TCP it is a mirror: they
  // come with the next synchronizing call.
  Result shm = RemoteProgram(unix_, {TF_HOST_PROBE, "registered", "8", "3"});
  EXPECT_EQ(shm.kv["visible_without_call"], "1");
  Result tcp = RemoteProgram(tcp_, {TF_HOST_PROBE, "registered", "8", "3"});
  EXPECT_EQ(tcp.kv["visible_without_call"], "0");
}

TEST_F(RemoteTest, MappedMemoryIsMirroredOverTcpAndSharedOverSharedMemory) {
  StartWorker();
  Result direct = DirectProgram({TF_HOST_PROBE, "mapped"});
  ASSERT_EQ(direct.rc, 0) << direct.out;
  EXPECT_EQ(direct.kv["kernel_wrote_mapped"], "0,abc,abc");
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = RemoteProgram(addr, {TF_HOST_PROBE, "mapped"});
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["attr_map_host"], "1") << addr;
    EXPECT_EQ(r.kv["mapped_dptr_is_host"], "1") << addr;
    EXPECT_EQ(r.kv["kernel_wrote_mapped"], "0,abc,abc") << addr;
    EXPECT_EQ(r.kv["host_words_kept"], "1") << addr;
    // The host's word and the kernel's neighbouring word in the same page both survive.
    EXPECT_EQ(r.kv["same_page"], "7,9") << addr;
    EXPECT_EQ(r.kv["copy_saw_host_write"], "1234,5678") << addr;
    EXPECT_EQ(r.kv["copy_wrote_mapped"], "42,42") << addr;
    EXPECT_EQ(r.kv["host_func_saw"], "99") << addr;
    EXPECT_EQ(r.kv["after_host_func"], "77") << addr;
    EXPECT_EQ(r.kv["registered_pushed"], "1") << addr;
    EXPECT_EQ(r.kv["registered_kernel"], "cafe,cafe,1") << addr;
    EXPECT_EQ(r.kv["scattered_changes"], "1,1") << addr << ": a byte in four changed, both ways";
    EXPECT_EQ(r.kv["plain_dptr_rc"], "0") << addr;
    EXPECT_EQ(r.kv["plain_kernel"], "5,5,31") << addr;
    EXPECT_EQ(r.kv["done"], "1");
    ExpectSameKeys(direct, r);
  }
  // Without mirrors (TFUSION_MIRRORS=0) TCP keeps page-locked memory to the client, as before.
  Result off = RemoteProgram(tcp_, {TF_HOST_PROBE, "mapped"}, "sekrit", {"TFUSION_MIRRORS=0"});
  EXPECT_EQ(off.kv["attr_map_host"], "0");
  EXPECT_EQ(off.rc, 3) << off.out;  // cuMemHostGetDevicePointer: CUDA_ERROR_NOT_SUPPORTED
  EXPECT_NE(off.out.find("error=cuMemHostGetDevicePointer(&dm, mp, 0):801"), std::string::npos)
      << off.out;
}

TEST_F(RemoteTest, ManagedMemoryWorksOverBothTransports) {
  StartWorker();
  Result direct = DirectProgram({TF_HOST_PROBE, "managed"});
  ASSERT_EQ(direct.rc, 0) << direct.out;
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = RemoteProgram(addr, {TF_HOST_PROBE, "managed"});
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["attr_managed"], "1") << addr;
    EXPECT_EQ(r.kv["attr_concurrent"], "0") << addr;  // the host waits for a synchronize
    EXPECT_EQ(r.kv["bad_flags"], "1") << addr;
    EXPECT_EQ(r.kv["zero_size"], "1") << addr;
    EXPECT_EQ(r.kv["managed_words"], "27,dead,dead,48") << addr;
    EXPECT_EQ(r.kv["managed_dtoh"], "48,57") << addr;
    EXPECT_EQ(r.kv["managed_memset"], "55,55,66") << addr;
    // CU_MEMORYTYPE_DEVICE, managed, host and device pointer the same address.
    EXPECT_EQ(r.kv["managed_attrs"], "2,1,1,1,1048676") << addr;
    EXPECT_EQ(r.kv["address_range"], "1,1048676") << addr;
    EXPECT_EQ(r.kv["advice_before"], "0,-2") << addr;
    // Read-mostly, preferred location the host (CU_DEVICE_CPU), prefetched to device 0.
    EXPECT_EQ(r.kv["advice_after"], "1,-1,0") << addr;
    EXPECT_EQ(r.kv["accessed_by"], "0,-2,-2") << addr;
    EXPECT_EQ(r.kv["advise_device_memory"], "1") << addr;
    EXPECT_EQ(r.kv["attach"], "0") << addr;
    EXPECT_EQ(r.kv["attr_after_free"], "1") << addr;
    EXPECT_EQ(r.kv["done"], "1");
    Result same = direct;
    same.kv.erase("attr_concurrent");
    ExpectSameKeys(same, r);
  }
}

// Host memory the worker pins for a session stops at --session-host-mem: managed memory (no
// vGPU here), page-locked memory shared over shm and mapped memory mirrored over TCP, allocated in
// 128 MiB steps under a 1 GiB limit. The session's 64 MiB copy arena (shm's, or the one it
// registers for TCP bulk copies) counts too. The
// refused step is CUDA_ERROR_OUT_OF_MEMORY with a log line naming the limit; freeing one step
// lets it be allocated again; what the host, kernels and copies wrote stays intact; the session
// goes on (an allocation, a kernel and a copy after the refusal). Plain page-locked memory over
// TCP is the client's own memory and is not limited.
TEST_F(RemoteTest, PinnedAndManagedMemoryStopAtTheSessionsHostMemoryLimit) {
  StartWorker({}, "sekrit", {"--session-host-mem", "1GiB"});
  struct Case {
    std::string kind;
    bool shm;
    std::string steps;  // that succeed before the refusal ("12": none refused)
  };
  for (const Case& c : {Case{"managed", true, "7"}, Case{"managed", false, "7"},
                        Case{"mapped", true, "7"}, Case{"mapped", false, "7"},
                        Case{"pinned", true, "7"}, Case{"pinned", false, "12"}}) {
    const std::string& addr = c.shm ? unix_ : tcp_;
    Result r = RemoteProgram(addr, {TF_HOST_PROBE, "steps", c.kind, "128", "12"});
    const std::string what = c.kind + " via " + addr + "\n" + r.out;
    ASSERT_EQ(r.rc, 0) << what;
    EXPECT_EQ(r.kv["steps_ok"], c.steps) << what;
    EXPECT_EQ(r.kv["data_ok"], "1") << what;
    EXPECT_EQ(r.kv["done"], "1") << what;
    if (c.steps == "12") {
      EXPECT_EQ(r.kv["steps_refused"], "0") << what;
      continue;
    }
    EXPECT_EQ(r.kv["steps_refused"], "2") << what;  // CUDA_ERROR_OUT_OF_MEMORY
    EXPECT_EQ(r.kv["again_after_free"], "0") << what;
    EXPECT_EQ(r.kv["one_more"], "2") << what;
  }
  EXPECT_TRUE(worker_.WaitFor("managed memory of 128 MiB refused (CUDA_ERROR_OUT_OF_MEMORY): the "
                              "session may pin 1024 MiB of host memory (tfusion worker "
                              "--session-host-mem)", 5000)) << worker_.out;
  EXPECT_NE(worker_.out.find("mapped page-locked memory of 128 MiB refused"), std::string::npos);
  EXPECT_NE(worker_.out.find("page-locked memory of 128 MiB refused"), std::string::npos);
}

TEST_F(RemoteTest, AnUnreadableSessionHostMemoryLimitIsRefused) {
  for (const char* bad : {"lots", "0", "-1GiB", "1.5XB"}) {
    Child w;
    w.Start({TF_WORKER, "--listen", "127.0.0.1:0", "--token", "t", "--driver", TF_FAKECUDA,
             "--session-host-mem", bad}, {});
    EXPECT_EQ(w.Wait(5000), 2) << bad << ": " << w.out;
    EXPECT_NE(w.out.find("--session-host-mem"), std::string::npos) << w.out;
    EXPECT_EQ(w.out.find("listening"), std::string::npos) << w.out;
  }
}

// Managed memory over TCP allocated in 256 MiB steps up to 4 GiB: every step used to compare
// every earlier one on both sides at each call (8 steps took 7 s on the fake driver, 4 GiB did
// not finish in a minute on a GPU host); now the allocations take milliseconds. The bound is
// loose: the machine running the tests may be busy.
TEST_F(RemoteTest, ManagedMemoryInStepsOverTcpTakesBoundedTime) {
  StartWorker({}, "sekrit", {"--session-host-mem", "8GiB"});
  const auto start = Clock::now();
  Result r = RemoteProgram(tcp_, {TF_HOST_PROBE, "steps", "managed", "256", "16"});
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.kv["steps_ok"], "16") << r.out;
  EXPECT_EQ(r.kv["data_ok"], "1") << r.out;
  EXPECT_LT(std::stod(r.kv["steps_alloc_ms"]), 5000) << r.out;
  EXPECT_LT(seconds, 30) << r.out;
  std::printf("16 x 256 MiB managed over TCP: allocations %s ms, with writes %s ms\n",
              r.kv["steps_alloc_ms"].c_str(), r.kv["steps_total_ms"].c_str());
}

TEST_F(RemoteTest, LargePageableCopiesArriveIntactOverBothTransports) {
  StartWorker();
  for (const std::string& addr : {unix_, tcp_}) {
    Result r = RemoteProgram(addr, {TF_HOST_PROBE, "pageable"});
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["pageable_sync_equal"], "1") << addr;
    EXPECT_EQ(r.kv["pageable_async_equal"], "1") << addr;
    EXPECT_EQ(r.kv["pageable_odd_equal"], "1") << addr;
    EXPECT_EQ(r.kv["done"], "1");
    std::printf("%s: %s", addr.c_str(), r.out.substr(r.out.find("pageable 256")).c_str());
  }
}

TEST_F(RemoteTest, OddSizesAndOffsetsCopyExactlyOverBothTransports) {
  StartWorker();
  for (const std::string& addr : {unix_, tcp_}) {
    Result r = RemoteProgram(addr, {TF_HOST_PROBE, "odd"});
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["odd_mismatch"], "0") << addr;
    EXPECT_EQ(r.kv["odd_copies"], "40") << addr;
  }
}

// A TCP relay between a client and the worker that cuts both connections once `limit` bytes
// have gone one way (client to worker when upstream, else worker to client): a network that
// drops in the middle of a copy.
class CuttingRelay {
 public:
  CuttingRelay(const std::string& worker, bool upstream, uint64_t limit)
      : upstream_(upstream), limit_(limit) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(listen_fd_, 1) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return;
    }
    address_ = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
    const size_t colon = worker.rfind(':');
    worker_.sin_family = AF_INET;
    worker_.sin_port = htons(static_cast<uint16_t>(std::stoi(worker.substr(colon + 1))));
    inet_pton(AF_INET, worker.substr(0, colon).c_str(), &worker_.sin_addr);
    thread_ = std::thread([this] { Run(); });
  }
  ~CuttingRelay() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    close(listen_fd_);
  }
  const std::string& address() const { return address_; }
  bool cut() const { return cut_; }

 private:
  void Run() {
    pollfd lp{listen_fd_, POLLIN, 0};
    while (!stop_ && poll(&lp, 1, 50) == 0) {
    }
    if (stop_) return;
    int client = accept(listen_fd_, nullptr, nullptr);
    int worker = socket(AF_INET, SOCK_STREAM, 0);
    if (client < 0 || connect(worker, reinterpret_cast<sockaddr*>(&worker_), sizeof(worker_)) != 0) {
      close(client);
      close(worker);
      return;
    }
    std::vector<char> buf(1 << 20);
    uint64_t moved = 0;
    while (!stop_) {
      pollfd p[2] = {{client, POLLIN, 0}, {worker, POLLIN, 0}};
      if (poll(p, 2, 50) <= 0) continue;
      bool closed = false;
      for (int i = 0; i < 2 && !closed; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const bool from_client = i == 0;
        ssize_t n = read(p[i].fd, buf.data(), buf.size());
        if (n <= 0) {
          closed = true;
          break;
        }
        if (from_client == upstream_ && (moved += static_cast<uint64_t>(n)) >= limit_) {
          cut_ = true;
          closed = true;
          break;
        }
        for (ssize_t off = 0; off < n;) {
          ssize_t w = write(from_client ? worker : client, buf.data() + off, static_cast<size_t>(n - off));
          if (w <= 0) {
            closed = true;
            break;
          }
          off += w;
        }
      }
      if (closed) break;
    }
    close(client);
    close(worker);
  }

  int listen_fd_ = -1;
  sockaddr_in worker_{};
  std::string address_;
  const bool upstream_;
  const uint64_t limit_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> cut_{false};
  std::thread thread_;
};

// The network drops in the middle of a 256 MiB copy, one way and then the other: the copy
// returns a CUDA error (CUDA_ERROR_LAUNCH_FAILED, the stub's "connection lost"), so does the next
// call, the program ends on its own, and the worker ends the session.
TEST_F(RemoteTest, AConnectionCutMidCopyFailsTheCopyInsteadOfHanging) {
  StartWorker();
  for (const bool upstream : {true, false}) {
    CuttingRelay relay(tcp_, upstream, 64u << 20);
    ASSERT_FALSE(relay.address().empty());
    const auto t0 = Clock::now();
    Result r = RemoteProgram(relay.address(), {TF_HOST_PROBE, "copy-results"});
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    const std::string lost = std::to_string(static_cast<int>(CUDA_ERROR_LAUNCH_FAILED));
    EXPECT_TRUE(relay.cut()) << r.out;
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.kv["htod_result"], upstream ? lost : "0") << r.out;
    EXPECT_EQ(r.kv["dtoh_result"], lost) << r.out;
    EXPECT_EQ(r.kv["done"], "1") << r.out;
    EXPECT_LT(secs, 20) << "the copy waited for the connection instead of failing";
    EXPECT_NE(r.out.find("lost the connection to the worker"), std::string::npos) << r.out;
  }
  EXPECT_TRUE(worker_.WaitFor("session ended", 10000)) << worker_.out;
}

TEST_F(RemoteTest, AKilledClientsHostRegionsAreUnregisteredAndUnmapped) {
  StartWorker();
  Child probe;
  probe.Start({TF_HOST_PROBE, "hold"}, {std::string("LD_LIBRARY_PATH=") + TF_CLIENT_INJECT,
                                        "TFUSION_REMOTE=" + unix_, "TFUSION_TOKEN=sekrit"});
  ASSERT_TRUE(probe.WaitFor("ready=1", 10000)) << probe.out;
  kill(probe.pid, SIGKILL);
  probe.Wait(5000);
  ASSERT_TRUE(worker_.WaitFor("session ended: freed 1 allocations", 5000)) << worker_.out;
  EXPECT_TRUE(worker_.WaitFor("3 host regions", 1000)) << worker_.out;
}

// The first u64 of a reply's outputs (0 when it has fewer than 8 bytes).
uint64_t FirstU64(const std::vector<uint8_t>& v) {
  uint64_t x = 0;
  if (v.size() >= 8) memcpy(&x, v.data(), 8);
  return x;
}

// A CUmemAllocationProp of pinned memory on device 0 as the generated calls send it, field by
// field; `reserved` of its 4 reserved bytes (fewer make a malformed message).
void WriteDeviceAllocationProp(tf::transport::Writer& w, int reserved = 4) {
  w.U32(CU_MEM_ALLOCATION_TYPE_PINNED);
  w.U32(0);  // requested handle types
  w.U32(CU_MEM_LOCATION_TYPE_DEVICE);
  w.I32(0);
  w.U8(0);  // compression, RDMA, usage
  w.U8(0);
  w.U16(0);
  for (int i = 0; i < reserved; ++i) w.U8(0);
}

// A client that speaks the protocol itself and sends host-region messages the stub never would.
class RawClient {
 public:
  bool Connect(const std::string& socket_path) {
    tf::transport::ClientHello hello;
    hello.SetToken("sekrit", 6);
    tf::transport::TransportOptions opt;
    return tf::transport::ConnectShm(socket_path.c_str(), hello, opt, &t_).ok();
  }
  // A reply-expected call: its CUresult (-1 when the connection failed); outputs into *out.
  int Call(uint16_t op, const tf::transport::Writer& w, std::vector<uint8_t>* out = nullptr) {
    const uint64_t seq = Send(op, tf::transport::kFlagReplyExpected, w);
    if (seq == 0) return -1;
    for (;;) {
      tf::transport::InFrame in;
      if (!t_->Receive(&in, 5000).ok()) return -1;
      if (in.header.opcode == tf::remote::kEvtMirrorData) {
        events.push_back({std::vector<uint8_t>(in.payload, in.payload + in.payload_length),
                          std::vector<uint8_t>(in.bulk, in.bulk + in.bulk_length)});
      }
      if (in.header.opcode != static_cast<uint16_t>(tf::transport::Opcode::kCallReply) ||
          in.header.sequence != seq) {
        continue;
      }
      tf::transport::Reader rd(in.payload, in.payload_length);
      int32_t result = -1;
      if (in.header.flags & tf::transport::kFlagError) {  // a deferred error: its CUresult
        uint64_t failed_seq = 0;
        uint16_t failed_op = 0;
        rd.U64(&failed_seq);
        rd.U16(&failed_op);
      }
      rd.I32(&result);
      if (out && in.payload_length > 4) out->assign(in.payload + 4, in.payload + in.payload_length);
      return result;
    }
  }
  uint64_t Send(uint16_t op, uint16_t flags, const tf::transport::Writer& w,
                const void* bulk = nullptr, uint64_t bulk_len = 0) {
    tf::transport::OutFrame f;
    f.opcode = op;
    f.flags = flags;
    f.sequence = seq_++;
    f.payload = w.data();
    f.payload_length = static_cast<uint32_t>(w.size());
    f.bulk = bulk;
    f.bulk_length = bulk_len;
    return t_->Send(f).ok() ? f.sequence : 0;
  }
  // A fire-and-forget message of "runs" (u32 n, n x (u64 address, u64 length)) with `bulk` bytes:
  // mirror data and graph host data share the shape.
  void SendRuns(uint16_t op, const std::vector<std::pair<uint64_t, uint64_t>>& runs,
                const std::vector<uint8_t>& bulk) {
    uint8_t buf[256];
    tf::transport::Writer w(buf, sizeof(buf));
    w.U32(static_cast<uint32_t>(runs.size()));
    for (auto [a, n] : runs) {
      w.U64(a);
      w.U64(n);
    }
    Send(op, 0, w, bulk.data(), bulk.size());
  }
  // Mirror-data events received during calls (payload, bulk), in order.
  struct Event {
    std::vector<uint8_t> payload, bulk;
  };
  std::vector<Event> events;
  tf::transport::Transport* transport() { return t_.get(); }
  // The session's driver, device 0's primary context made current (what the stub does first).
  bool UsePrimaryContext() {
    uint8_t buf[16];
    std::vector<uint8_t> out;
    if (Call(tf::remote::kOpSessionInfo, tf::transport::Writer(nullptr, 0)) != 0) return false;
    tf::transport::Writer w(buf, sizeof(buf));
    w.I32(0);
    if (Call(tf::remote::Op(tf::driver::Fn::cuDevicePrimaryCtxRetain), w, &out) != 0 ||
        out.size() < 8) {
      return false;
    }
    uint64_t ctx = 0;
    memcpy(&ctx, out.data(), 8);
    tf::transport::Writer s(buf, sizeof(buf));
    s.U64(ctx);
    return Send(tf::remote::Op(tf::driver::Fn::cuCtxSetCurrent), 0, s) != 0;
  }
  // cuMemAlloc_v2: the device pointer, 0 when refused.
  uint64_t Alloc(uint64_t n) {
    uint8_t buf[8];
    std::vector<uint8_t> out;
    tf::transport::Writer w(buf, sizeof(buf));
    w.U64(n);
    uint64_t p = 0;
    if (Call(tf::remote::Op(tf::driver::Fn::cuMemAlloc_v2), w, &out) == 0 && out.size() >= 8) {
      memcpy(&p, out.data(), 8);
    }
    return p;
  }

 private:
  std::unique_ptr<tf::transport::Transport> t_;
  uint64_t seq_ = 1;
};

struct SharedBlock {
  int fd = -1;
  uint8_t* p = nullptr;
  size_t n = 0;
  explicit SharedBlock(size_t bytes) : n(bytes) {
    fd = memfd_create("tf-test-region", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, static_cast<off_t>(n)) == 0) {
      void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (m != MAP_FAILED) p = static_cast<uint8_t*>(m);
    }
  }
  ~SharedBlock() {
    if (p) munmap(p, n);
    if (fd >= 0) close(fd);
  }
  uint64_t addr() const { return reinterpret_cast<uint64_t>(p); }
};


TEST_F(RemoteTest, BadHostRegionMessagesGetAClearErrorAndChangeNothing) {
  using tf::transport::Writer;
  namespace remote = tf::remote;
  using tf::driver::Fn;
  StartWorker();
  RawClient c;
  ASSERT_TRUE(c.Connect(unix_.substr(5)));
  ASSERT_TRUE(c.UsePrimaryContext());
  uint8_t buf[256];
  std::vector<uint8_t> out;
  const uint64_t dev = c.Alloc(16384);
  ASSERT_NE(dev, 0u);
  // Offers `block` (unless null) and sends the map message.
  auto map = [&](uint64_t id, SharedBlock* block, uint64_t addr, uint64_t len, uint32_t flags) {
    if (block) {
      EXPECT_TRUE(c.transport()->OfferHostMemory(id, block->fd).ok());
    }
    Writer w(buf, sizeof(buf));
    w.U64(id);
    w.U64(addr);
    w.U64(len);
    w.U32(flags);
    return c.Call(remote::kOpHostRegionMap, w, &out);
  };
  auto copy = [&](uint8_t dir, uint64_t d, uint64_t host, uint64_t n) {
    Writer w(buf, sizeof(buf));
    w.U8(dir);
    w.U8(1);
    w.U64(d);
    w.U64(host);
    w.U64(n);
    w.U64(0);
    return c.Call(remote::kOpHostRegionCopy, w);
  };
  auto unmap = [&](uint64_t id) {
    Writer w(buf, sizeof(buf));
    w.U64(id);
    return c.Call(remote::kOpHostRegionUnmap, w);
  };

  SharedBlock good(8192), b2(8192), b3(4096), b4(4096), b5(4096), b6(8192), b7(4096);
  ASSERT_EQ(map(1, &good, good.addr(), 8192, 0), 0);
  ASSERT_EQ(out.size(), 9u);
  EXPECT_EQ(out[0], 1) << "mapped at the same address";
  // Refused, each with CUDA_ERROR_INVALID_VALUE and a reason in the worker's log.
  EXPECT_EQ(map(2, &b2, good.addr() + 4096, 8192, 0), 1);  // overlaps region 1
  EXPECT_EQ(map(3, &b3, b3.addr(), 0, 0), 1);                // zero length
  EXPECT_EQ(map(1, &b4, b4.addr(), 4096, 0), 1);             // id in use
  EXPECT_EQ(map(5, &b5, b5.addr(), 1 << 20, 0), 1);          // larger than its memory
  EXPECT_EQ(map(6, &b6, b6.addr() + 1, 4096, 0), 1);         // unaligned
  EXPECT_EQ(map(7, &b7, b7.addr(), 4096, 0x80), 1);          // unknown flags
  // Copies outside what the session owns.
  EXPECT_EQ(copy(remote::kRegionToDevice, dev, good.addr() + 4096, 8192), 1);  // past the region
  EXPECT_EQ(copy(remote::kRegionToDevice, dev, b2.addr(), 16), 1);             // not a region
  EXPECT_EQ(copy(remote::kRegionToHost, dev + 16000, good.addr(), 1000), 1);   // past the device
  EXPECT_EQ(copy(remote::kRegionToHost, dev, good.addr(), 0), 1);              // zero length
  EXPECT_EQ(copy(7, dev, good.addr(), 16), 1);                                 // bad direction
  EXPECT_EQ(unmap(99), 1);
  ASSERT_TRUE(worker_.WaitFor("range overlaps a region of this session", 2000)) << worker_.out;
  EXPECT_TRUE(worker_.WaitFor("zero or unaligned range", 1000));
  EXPECT_TRUE(worker_.WaitFor("region id already in use", 1000));
  EXPECT_TRUE(worker_.WaitFor("the shared memory is smaller than the range", 1000));

  // Region 1 still works: through the device and back into its other half.
  for (int i = 0; i < 4096; ++i) good.p[i] = static_cast<uint8_t>(i * 7);
  EXPECT_EQ(copy(remote::kRegionToDevice, dev, good.addr(), 4096), 0);
  EXPECT_EQ(copy(remote::kRegionToHost, dev, good.addr() + 4096, 4096), 0);
  EXPECT_EQ(memcmp(good.p, good.p + 4096, 4096), 0);
  EXPECT_EQ(unmap(1), 0);
  EXPECT_EQ(unmap(1), 1);
  EXPECT_EQ(copy(remote::kRegionToDevice, dev, good.addr(), 16), 1);
  // A map message without an offered descriptor.
  EXPECT_EQ(map(8, nullptr, b3.addr(), 4096, 0), 1);
  Writer w(buf, sizeof(buf));
  w.U64(dev);
  EXPECT_EQ(c.Call(remote::Op(Fn::cuMemFree_v2), w), 0) << "the session goes on";
}

// Mirror messages the stub would not send: each is refused (map and unmap at once, data as a
// deferred error at the next synchronizing call) and changes nothing; good ones keep working.
// Graph copy data for memory no graph copy of the session names, malformed runs, and a query of
// an unknown executable graph: refused (a deferred CUDA_ERROR_INVALID_VALUE) or empty, and the
// session goes on.
TEST_F(RemoteTest, BadGraphCopyDataIsRefusedAndChangesNothing) {
  using tf::transport::Writer;
  namespace remote = tf::remote;
  using tf::driver::Fn;
  StartWorker();
  RawClient c;
  ASSERT_TRUE(c.Connect(unix_.substr(5)));
  ASSERT_TRUE(c.UsePrimaryContext());
  uint8_t buf[256];
  auto data = [&](std::vector<std::pair<uint64_t, uint64_t>> runs, const std::vector<uint8_t>& bulk) {
    c.SendRuns(remote::kOpGraphHostData, runs, bulk);
  };
  auto sync = [&] { return c.Call(remote::Op(Fn::cuCtxSynchronize), Writer(nullptr, 0)); };
  const std::vector<uint8_t> four = {1, 2, 3, 4};
  data({{0x5e0000000000ull, 4}}, four);
  EXPECT_EQ(sync(), 1);
  ASSERT_TRUE(worker_.WaitFor("is not memory a graph copy of this session names", 2000)) << worker_.out;
  data({}, four);
  EXPECT_EQ(sync(), 1);
  data({{0x5e0000000000ull, 8}}, four);  // the lengths do not add up to the bytes
  EXPECT_EQ(sync(), 1);
  ASSERT_TRUE(worker_.WaitFor("graph copy data refused: malformed message", 2000)) << worker_.out;
  std::vector<uint8_t> out;
  Writer q(buf, sizeof(buf));
  q.U64(0x1234);
  EXPECT_EQ(c.Call(remote::kOpGraphHostCopies, q, &out), 0);
  EXPECT_EQ(out, std::vector<uint8_t>(4, 0)) << "an unknown executable graph copies nothing";
  EXPECT_EQ(sync(), 0) << "the session goes on";
}

// A reset drops the session's mirrors: what the device wrote into one (an async memset still in
// flight) reaches the client before the reset's reply; a reset naming host regions that are not
// the session's, or named twice, or with bytes left over, fails and changes nothing; after the
// reset, mirror data and an unmap naming the dropped mirror (a client that missed the reset) fail
// that call only, and the same address can be mirrored again.
TEST_F(RemoteTest, MirrorMessagesAfterAResetFailThatCallOnly) {
  using tf::transport::Writer;
  namespace remote = tf::remote;
  using tf::driver::Fn;
  StartWorker();
  RawClient c;
  ASSERT_TRUE(c.Connect(unix_.substr(5)));
  ASSERT_TRUE(c.UsePrimaryContext());
  uint8_t buf[256];
  std::vector<uint8_t> out;
  const uint64_t base = 0x5e0000000000ull;  // free in the worker's session process
  auto map = [&] {
    Writer w(buf, sizeof(buf));
    w.U64(base);
    w.U64(8192);
    w.U32(remote::kMirrorMapped);
    return c.Call(remote::kOpMirrorMap, w, &out);
  };
  auto reset = [&](const std::vector<uint64_t>& regions, bool extra_byte) {
    Writer w(buf, sizeof(buf));
    w.I32(0);
    w.U32(static_cast<uint32_t>(regions.size()));
    for (uint64_t id : regions) w.U64(id);
    if (extra_byte) w.U8(0);
    return c.Call(remote::Op(Fn::cuDevicePrimaryCtxReset_v2), w);
  };
  auto data = [&](uint64_t addr) { c.SendRuns(remote::kOpMirrorData, {{addr, 4}}, {1, 2, 3, 4}); };
  auto sync = [&] { return c.Call(remote::Op(Fn::cuCtxSynchronize), Writer(nullptr, 0)); };
  ASSERT_EQ(map(), 0);
  EXPECT_EQ(reset({77}, false), 1);  // CUDA_ERROR_INVALID_VALUE: not a region of this session
  EXPECT_EQ(reset({}, true), 1);
  ASSERT_TRUE(worker_.WaitFor("refused: the host regions to free are not regions", 2000)) << worker_.out;
  data(base + 8);
  EXPECT_EQ(sync(), 0) << "the mirror is still there";
  // An async memset through the device pointer, then the reset: its bytes come back first.
  Writer ms(buf, sizeof(buf));
  ms.U64(base + 32);
  ms.U8(0xab);
  ms.U64(4);
  ms.U64(0);
  ASSERT_NE(c.Send(remote::Op(Fn::cuMemsetD8Async), 0, ms), 0u);
  c.events.clear();
  EXPECT_EQ(reset({}, false), 0);
  ASSERT_EQ(c.events.size(), 1u);
  std::vector<tf::remote::MirrorRun> runs;
  ASSERT_TRUE(tf::remote::DecodeMirrorRuns(c.events[0].payload.data(),
                                           static_cast<uint32_t>(c.events[0].payload.size()),
                                           c.events[0].bulk.size(), &runs));
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].addr, base + 32);
  EXPECT_EQ(c.events[0].bulk, (std::vector<uint8_t>{0xab, 0xab, 0xab, 0xab}));
  ASSERT_TRUE(worker_.WaitFor("1 mirrors dropped", 2000)) << worker_.out;
  // What a client that missed the reset sends fails that call only.
  data(base + 8);
  EXPECT_EQ(sync(), 1);
  ASSERT_TRUE(worker_.WaitFor("is not inside a mirror of this session", 2000)) << worker_.out;
  EXPECT_EQ(sync(), 0);
  Writer u(buf, sizeof(buf));
  u.U64(base);
  EXPECT_EQ(c.Call(remote::kOpMirrorUnmap, u), 1);
  EXPECT_EQ(sync(), 0);
  ASSERT_EQ(map(), 0) << "the address is free again in the session";
  data(base + 8);
  EXPECT_EQ(sync(), 0);
}

TEST_F(RemoteTest, BadMirrorMessagesAreRefusedAndChangeNothing) {
  using tf::transport::Writer;
  namespace remote = tf::remote;
  using tf::driver::Fn;
  StartWorker();
  RawClient c;
  ASSERT_TRUE(c.Connect(unix_.substr(5)));
  ASSERT_TRUE(c.UsePrimaryContext());
  uint8_t buf[256];
  std::vector<uint8_t> out;
  auto map = [&](uint64_t addr, uint64_t len, uint32_t kind) {
    Writer w(buf, sizeof(buf));
    w.U64(addr);
    w.U64(len);
    w.U32(kind);
    return c.Call(remote::kOpMirrorMap, w, &out);
  };
  auto unmap = [&](uint64_t addr) {
    Writer w(buf, sizeof(buf));
    w.U64(addr);
    return c.Call(remote::kOpMirrorUnmap, w);
  };
  // Fire-and-forget data: runs (address, length) with `bulk` bytes.
  auto data = [&](std::vector<std::pair<uint64_t, uint64_t>> runs, const std::vector<uint8_t>& bulk) {
    c.SendRuns(remote::kOpMirrorData, runs, bulk);
  };
  auto sync = [&] { return c.Call(remote::Op(Fn::cuCtxSynchronize), Writer(nullptr, 0)); };
  const uint64_t base = 0x5e0000000000ull;  // free in the worker's session process
  ASSERT_EQ(map(base, 8192, remote::kMirrorMapped), 0);
  ASSERT_EQ(out.size(), 8u);
  uint64_t dptr = 0;
  memcpy(&dptr, out.data(), 8);
  EXPECT_EQ(dptr, base) << "the device pointer is the address";
  EXPECT_EQ(map(base + 4096, 8192, remote::kMirrorMapped), 1);  // overlaps
  EXPECT_EQ(map(base + 65536, 0, remote::kMirrorMapped), 1);    // empty
  EXPECT_EQ(map(base + 65536, 4096, 7), 1);                     // unknown kind
  EXPECT_EQ(map(0, 4096, remote::kMirrorMapped), 1);            // address 0
  ASSERT_TRUE(worker_.WaitFor("range overlaps a mirror of this session", 2000)) << worker_.out;
  EXPECT_EQ(unmap(base + 4096), 1);  // not a mirror's address
  EXPECT_EQ(sync(), 0);
  // Runs outside the mirror, a wrong byte count, no runs: refused as a whole.
  const std::vector<uint8_t> four = {1, 2, 3, 4};
  data({{base + 8190, 4}}, four);
  EXPECT_EQ(sync(), 1);
  data({{base, 2}, {base + 100, 4}}, four);
  EXPECT_EQ(sync(), 1);
  data({}, four);
  EXPECT_EQ(sync(), 1);
  data({{base + 8, 4}, {0x1000, 4}}, {1, 2, 3, 4, 5, 6, 7, 8});  // the first run is not applied
  EXPECT_EQ(sync(), 1);
  ASSERT_TRUE(worker_.WaitFor("is not inside a mirror of this session", 2000)) << worker_.out;
  // Good data is applied and not echoed back; a memset through the device pointer comes back as
  // a mirror event before the reply.
  c.events.clear();
  data({{base + 16, 4}}, four);
  EXPECT_EQ(sync(), 0);
  EXPECT_TRUE(c.events.empty()) << "the worker's twin took the client's bytes";
  Writer ms(buf, sizeof(buf));
  ms.U64(base + 18);
  ms.U8(0xee);
  ms.U64(4);
  EXPECT_EQ(c.Call(remote::Op(Fn::cuMemsetD8_v2), ms), 0);
  ASSERT_EQ(c.events.size(), 1u);
  std::vector<tf::remote::MirrorRun> runs;
  ASSERT_TRUE(tf::remote::DecodeMirrorRuns(c.events[0].payload.data(),
                                           static_cast<uint32_t>(c.events[0].payload.size()),
                                           c.events[0].bulk.size(), &runs));
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].addr, base + 18);  // bytes 16, 17 were the client's and did not change
  EXPECT_EQ(runs[0].len, 4u);
  EXPECT_EQ(c.events[0].bulk, (std::vector<uint8_t>{0xee, 0xee, 0xee, 0xee}));
  EXPECT_EQ(unmap(base), 0);
  EXPECT_EQ(unmap(base), 1);
  data({{base + 16, 4}}, four);
  EXPECT_EQ(sync(), 1);
  EXPECT_EQ(sync(), 0) << "the session goes on";
}

// The generated calls (api/remote_surface.tsv): the worker decodes and checks every argument from
// its description before calling the driver. A truncated or overlong message, an enumeration
// value cuda.h does not define, flags outside their mask, and a handle that is forged, stale or
// of another kind each fail that call with a CUDA error; the session and its objects go on.
TEST_F(RemoteTest, BadGeneratedCallsFailThatCallOnly) {
  using tf::transport::Writer;
  namespace remote = tf::remote;
  using tf::driver::Fn;
  StartWorker();
  RawClient c;
  ASSERT_TRUE(c.Connect(unix_.substr(5)));
  ASSERT_TRUE(c.UsePrimaryContext());
  uint8_t buf[64];
  std::vector<uint8_t> out;
  auto create = [&](Fn fn, uint32_t flags) -> uint64_t {
    Writer w(buf, sizeof(buf));
    w.U32(flags);
    out.clear();
    return c.Call(remote::Op(fn), w, &out) == 0 ? FirstU64(out) : 0;
  };
  auto on = [&](Fn fn, uint64_t h) {
    Writer w(buf, sizeof(buf));
    w.U64(h);
    return c.Call(remote::Op(fn), w);
  };
  auto get_limit = [&](uint32_t limit, uint64_t* v) {
    Writer w(buf, sizeof(buf));
    w.U32(limit);
    out.clear();
    int r = c.Call(remote::Op(Fn::cuCtxGetLimit), w, &out);
    *v = FirstU64(out);
    return r;
  };
  const uint64_t stream = create(Fn::cuStreamCreate, 0);
  const uint64_t event = create(Fn::cuEventCreate, 0);
  ASSERT_NE(stream, 0u);
  ASSERT_NE(event, 0u);
  uint64_t stack = 0;
  ASSERT_EQ(get_limit(CU_LIMIT_STACK_SIZE, &stack), 0);

  // Truncated and overlong messages: CUDA_ERROR_INVALID_VALUE.
  {
    Writer w(buf, sizeof(buf));
    w.U16(0);  // half of the u32 limit
    EXPECT_EQ(c.Call(remote::Op(Fn::cuCtxGetLimit), w), CUDA_ERROR_INVALID_VALUE);
    Writer h(buf, sizeof(buf));
    h.U32(static_cast<uint32_t>(stream));  // half of the u64 stream
    EXPECT_EQ(c.Call(remote::Op(Fn::cuStreamQuery), h), CUDA_ERROR_INVALID_VALUE);
    Writer e(buf, sizeof(buf));
    EXPECT_EQ(c.Call(remote::Op(Fn::cuEventCreate), e), CUDA_ERROR_INVALID_VALUE);  // empty
    Writer o(buf, sizeof(buf));
    o.U64(stream);
    o.U8(1);  // one byte too many
    EXPECT_EQ(c.Call(remote::Op(Fn::cuStreamQuery), o), CUDA_ERROR_INVALID_VALUE);
  }
  // Enumerations and flags outside what cuda.h defines.
  uint64_t v = 0;
  EXPECT_EQ(get_limit(99, &v), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(get_limit(CU_LIMIT_MAX, &v), CUDA_ERROR_INVALID_VALUE);
  {
    Writer w(buf, sizeof(buf));
    w.U32(17);  // CUfunc_cache has 0..3
    EXPECT_EQ(c.Call(remote::Op(Fn::cuCtxSetCacheConfig), w), CUDA_ERROR_INVALID_VALUE);
  }
  EXPECT_EQ(create(Fn::cuStreamCreate, 0x80), 0u);
  EXPECT_EQ(create(Fn::cuEventCreate, 0x100), 0u);
  // Handles of another kind, forged, or stale: CUDA_ERROR_INVALID_HANDLE.
  EXPECT_EQ(on(Fn::cuStreamQuery, event), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(on(Fn::cuEventQuery, stream), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(on(Fn::cuEventDestroy_v2, stream), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(on(Fn::cuStreamDestroy_v2, 0), CUDA_ERROR_INVALID_HANDLE);  // the NULL stream
  EXPECT_EQ(on(Fn::cuStreamSynchronize, 0xbad000), CUDA_ERROR_INVALID_HANDLE);
  {
    EXPECT_EQ(c.Call(remote::Op(Fn::cuStreamGetCtx), Writer(buf, 0)), CUDA_ERROR_INVALID_VALUE);
    Writer g(buf, sizeof(buf));
    g.U64(event);
    EXPECT_EQ(c.Call(remote::Op(Fn::cuStreamGetCtx), g), CUDA_ERROR_INVALID_HANDLE);
  }
  const uint64_t doomed = create(Fn::cuStreamCreate, 0);
  ASSERT_NE(doomed, 0u);
  EXPECT_EQ(on(Fn::cuStreamDestroy_v2, doomed), 0);
  EXPECT_EQ(on(Fn::cuStreamQuery, doomed), CUDA_ERROR_INVALID_HANDLE);     // stale
  EXPECT_EQ(on(Fn::cuStreamDestroy_v2, doomed), CUDA_ERROR_INVALID_HANDLE);
  // A fire-and-forget call with a handle of the wrong kind fails alone: its error is the next
  // synchronizing call's, and the one after it succeeds.
  {
    Writer w(buf, sizeof(buf));
    w.U64(stream);
    w.U64(stream);  // a stream where the event goes
    w.U32(0);
    EXPECT_NE(c.Send(remote::Op(Fn::cuStreamWaitEvent), 0, w), 0u);
    EXPECT_EQ(on(Fn::cuStreamSynchronize, stream), CUDA_ERROR_INVALID_HANDLE);
    EXPECT_EQ(on(Fn::cuStreamSynchronize, stream), 0);
  }
  // Arrays with a count (count=), structures and restricted enumerations (values=): a count
  // outside 1..64 or other than the elements sent, an operation cuda.h does not define, a
  // structure one byte short, an attribute streams do not have.
  {
    uint8_t big[1024];
    auto caps = [&](uint32_t count, uint32_t sent, uint32_t op) {
      Writer w(big, sizeof(big));
      w.U32(count);
      w.I32(0);  // the device
      for (uint32_t i = 0; i < sent; ++i) w.U32(op);
      out.clear();
      return c.Call(remote::Op(Fn::cuDeviceGetHostAtomicCapabilities), w, &out);
    };
    EXPECT_EQ(caps(2, 2, CU_ATOMIC_OPERATION_INTEGER_ADD), 0);
    EXPECT_EQ(out.size(), 8u);
    EXPECT_EQ(caps(0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(caps(65, 65, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(caps(2, 1, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(caps(1, 2, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(caps(1, 1, CU_ATOMIC_OPERATION_MAX), CUDA_ERROR_INVALID_VALUE);
    auto granularity = [&](bool short_by_one) {
      Writer w(big, sizeof(big));
      WriteDeviceAllocationProp(w, short_by_one ? 3 : 4);
      w.U32(CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      out.clear();
      return c.Call(remote::Op(Fn::cuMemGetAllocationGranularity), w, &out);
    };
    EXPECT_EQ(granularity(false), 0);
    EXPECT_EQ(out.size(), 8u);
    EXPECT_EQ(granularity(true), CUDA_ERROR_INVALID_VALUE);
    auto attribute = [&](uint32_t attr) {
      Writer w(big, sizeof(big));
      w.U64(stream);
      w.U32(attr);
      out.clear();
      return c.Call(remote::Op(Fn::cuStreamGetAttribute), w, &out);
    };
    EXPECT_EQ(attribute(CU_LAUNCH_ATTRIBUTE_PRIORITY), 0);
    EXPECT_EQ(out.size(), sizeof(CUstreamAttrValue));
    EXPECT_EQ(attribute(CU_LAUNCH_ATTRIBUTE_COOPERATIVE), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(attribute(999), CUDA_ERROR_INVALID_VALUE);
    // A field of a structure with a mask (flags=prop.handleTypes, flags=prop.flags).
    auto multicast = [&](uint64_t handle_types, uint64_t flags) {
      Writer w(big, sizeof(big));
      w.U32(1);        // devices
      w.U64(2 << 20);  // size
      w.U64(handle_types);
      w.U64(flags);
      w.U32(CU_MULTICAST_GRANULARITY_MINIMUM);
      out.clear();
      return c.Call(remote::Op(Fn::cuMulticastGetGranularity), w, &out);
    };
    EXPECT_EQ(multicast(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), 0);
    EXPECT_EQ(out.size(), 8u);
    EXPECT_EQ(multicast(0x10, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(multicast(0, 1), CUDA_ERROR_INVALID_VALUE);
    // An occupancy query naming a stream where the function goes.
    Writer occ(big, sizeof(big));
    occ.U64(stream);
    occ.I32(128);
    occ.U64(0);
    EXPECT_EQ(c.Call(remote::Op(Fn::cuOccupancyMaxActiveBlocksPerMultiprocessor), occ), CUDA_ERROR_INVALID_HANDLE);
    // Memory locations (loc=) in an array of structures (count=) with a restricted field
    // (values=): a host location, a device the session lacks, an undefined access flag, no
    // descriptor; the device's pool comes from the generated cuDeviceGetMemPool (new=).
    Writer gp(big, sizeof(big));
    gp.I32(0);
    out.clear();
    ASSERT_EQ(c.Call(remote::Op(Fn::cuDeviceGetMemPool), gp, &out), 0);
    const uint64_t pool = FirstU64(out);
    ASSERT_NE(pool, 0u);
    auto access = [&](uint64_t count, uint32_t type, int32_t id, uint32_t flags) {
      Writer w(big, sizeof(big));
      w.U64(pool);
      w.U64(count);
      for (uint64_t i = 0; i < count; ++i) {
        w.U32(i + 1 == count ? type : static_cast<uint32_t>(CU_MEM_LOCATION_TYPE_DEVICE));
        w.I32(i + 1 == count ? id : 0);
        w.U32(flags);
      }
      return c.Call(remote::Op(Fn::cuMemPoolSetAccess), w);
    };
    EXPECT_EQ(access(1, CU_MEM_LOCATION_TYPE_DEVICE, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), 0);
    EXPECT_EQ(access(2, CU_MEM_LOCATION_TYPE_HOST, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(access(2, CU_MEM_LOCATION_TYPE_DEVICE, 7, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_EQ(access(1, 0x7fff0000u, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(access(1, CU_MEM_LOCATION_TYPE_DEVICE, 0, 2), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(access(0, CU_MEM_LOCATION_TYPE_DEVICE, 0, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(access(65, CU_MEM_LOCATION_TYPE_DEVICE, 0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE), CUDA_ERROR_INVALID_VALUE);
    // Attribute values behind a void* (void=): 4 bytes for an int pool attribute, 8 for the
    // others, so a value of the other width is a malformed message; an undefined attribute.
    auto pool_set = [&](uint32_t attr, bool wide, uint64_t value) {
      Writer w(big, sizeof(big));
      w.U64(pool);
      w.U32(attr);
      if (wide) w.U64(value);
      else w.U32(static_cast<uint32_t>(value));
      return c.Call(remote::Op(Fn::cuMemPoolSetAttribute), w);
    };
    auto pool_get = [&](uint32_t attr) {
      Writer w(big, sizeof(big));
      w.U64(pool);
      w.U32(attr);
      out.clear();
      return c.Call(remote::Op(Fn::cuMemPoolGetAttribute), w, &out);
    };
    EXPECT_EQ(pool_set(CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, false, 1), 0);
    EXPECT_EQ(pool_set(CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, true, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(pool_set(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, false, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(pool_set(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, true, 1 << 20), 0);
    EXPECT_EQ(pool_set(99, true, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(pool_set(99, false, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(pool_get(CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC), 0);
    EXPECT_EQ(out.size(), 4u);
    EXPECT_EQ(pool_get(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 0);
    EXPECT_EQ(out.size(), 8u);
    EXPECT_EQ(FirstU64(out), 1u << 20);
    // Only a pool the session created may be destroyed: the device's pool and a forged one fail,
    // and the device's pool goes on serving.
    EXPECT_EQ(on(Fn::cuMemPoolDestroy, pool), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(on(Fn::cuMemPoolDestroy, 0xbad000), CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(pool_get(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 0);
    auto graph_mem = [&](int32_t dev, uint32_t attr) {
      Writer w(big, sizeof(big));
      w.I32(dev);
      w.U32(attr);
      out.clear();
      return c.Call(remote::Op(Fn::cuDeviceGetGraphMemAttribute), w, &out);
    };
    EXPECT_EQ(graph_mem(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH), 0);
    EXPECT_EQ(out.size(), 8u);
    EXPECT_EQ(graph_mem(5, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH), CUDA_ERROR_INVALID_DEVICE);
    EXPECT_EQ(graph_mem(0, 9), CUDA_ERROR_INVALID_VALUE);
  }
  // Nothing else changed: the objects and the limit are as they were.
  EXPECT_EQ(on(Fn::cuStreamQuery, stream), 0);
  EXPECT_EQ(on(Fn::cuEventQuery, event), 0);
  {
    Writer w(buf, sizeof(buf));
    w.U64(event);
    w.U64(stream);
    EXPECT_NE(c.Send(remote::Op(Fn::cuEventRecord), 0, w), 0u);
    EXPECT_EQ(on(Fn::cuEventSynchronize, event), 0);
  }
  EXPECT_EQ(get_limit(CU_LIMIT_STACK_SIZE, &v), 0);
  EXPECT_EQ(v, stack);
  EXPECT_EQ(on(Fn::cuEventDestroy_v2, event), 0);
  EXPECT_EQ(on(Fn::cuStreamDestroy_v2, stream), 0);
}

// The generated memsets (api/remote_surface.tsv: dptr=DST:N*K, rows=), sent as the stub would
// not send them: the worker refuses memory outside the session's ranges, an element count whose
// bytes wrap past 2^64, rows wider than their pitch and a pitch of 2^64 - 1 (which divided by zero
// in the hand-written check) with CUDA_ERROR_INVALID_VALUE, a malformed message likewise, a bad
// stream of an asynchronous one at the next synchronizing call; an empty rectangle succeeds
// without the driver; good memsets go on working.
TEST_F(RemoteTest, GeneratedMemsetsRefuseMemoryOutsideTheSession) {
  using tf::transport::Writer;
  namespace remote = tf::remote;
  using tf::driver::Fn;
  StartWorker();
  RawClient c;
  ASSERT_TRUE(c.Connect(unix_.substr(5)));
  ASSERT_TRUE(c.UsePrimaryContext());
  const uint64_t a = c.Alloc(4096);
  ASSERT_NE(a, 0u);
  uint8_t buf[64];
  auto memset32 = [&](uint64_t dst, uint64_t n) {
    Writer w(buf, sizeof(buf));
    w.U64(dst);
    w.U32(0x01020304);
    w.U64(n);
    return c.Call(remote::Op(Fn::cuMemsetD32_v2), w);
  };
  auto memset2d16 = [&](uint64_t dst, uint64_t pitch, uint64_t width, uint64_t height) {
    Writer w(buf, sizeof(buf));
    w.U64(dst);
    w.U64(pitch);
    w.U16(0xabcd);
    w.U64(width);
    w.U64(height);
    return c.Call(remote::Op(Fn::cuMemsetD2D16_v2), w);
  };
  auto sync = [&] { return c.Call(remote::Op(Fn::cuCtxSynchronize), Writer(nullptr, 0)); };
  EXPECT_EQ(memset32(a, 1024), CUDA_SUCCESS);
  EXPECT_EQ(memset32(a, 0), CUDA_SUCCESS);  // names no memory: the driver answers
  EXPECT_EQ(memset32(a + 4, 1024), CUDA_ERROR_INVALID_VALUE) << "one word past the allocation";
  EXPECT_EQ(memset32(a + 8192, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(memset32(a, (1ull << 62) + 1), CUDA_ERROR_INVALID_VALUE) << "N * 4 wraps to 4 bytes";
  EXPECT_EQ(memset2d16(a, 256, 128, 16), CUDA_SUCCESS);  // 16 rows of 256 bytes: all of it
  EXPECT_EQ(memset2d16(a, 256, 128, 17), CUDA_ERROR_INVALID_VALUE) << "the 17th row is outside";
  EXPECT_EQ(memset2d16(a, 128, 65, 2), CUDA_ERROR_INVALID_VALUE) << "130-byte rows 128 bytes apart";
  EXPECT_EQ(memset2d16(a, ~0ull, 1, 2), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(memset2d16(a + 8192, 256, 0, 16), CUDA_SUCCESS) << "an empty rectangle";
  {
    Writer w(buf, sizeof(buf));  // cuMemsetD8_v2 with a 32-bit value: 3 bytes too many
    w.U64(a);
    w.U32(7);
    w.U64(4);
    EXPECT_EQ(c.Call(remote::Op(Fn::cuMemsetD8_v2), w), CUDA_ERROR_INVALID_VALUE);
    Writer t(buf, sizeof(buf));  // cuMemsetD2D16_v2 without its height
    t.U64(a);
    t.U64(256);
    t.U16(1);
    t.U64(1);
    EXPECT_EQ(c.Call(remote::Op(Fn::cuMemsetD2D16_v2), t), CUDA_ERROR_INVALID_VALUE);
  }
  ASSERT_EQ(sync(), CUDA_SUCCESS);
  auto memset8_async = [&](uint64_t dst, uint64_t n, uint64_t stream) {
    Writer w(buf, sizeof(buf));
    w.U64(dst);
    w.U8(0x5a);
    w.U64(n);
    w.U64(stream);
    return c.Send(remote::Op(Fn::cuMemsetD8Async), 0, w);
  };
  ASSERT_NE(memset8_async(a, 16, 0xdead0), 0u);
  EXPECT_EQ(sync(), CUDA_ERROR_INVALID_HANDLE) << "the bad stream surfaces at the next sync";
  ASSERT_NE(memset8_async(a + 4090, 16, 0), 0u);
  EXPECT_EQ(sync(), CUDA_ERROR_INVALID_VALUE) << "past the allocation";
  ASSERT_NE(memset8_async(a, 4096, 0), 0u);
  EXPECT_EQ(sync(), CUDA_SUCCESS);
  EXPECT_EQ(memset32(a, 1024), CUDA_SUCCESS);
}

// The generated calls with hand-written hooks (hook=): VMM reservations and handles, multicast
// objects and IPC memory, sent as the stub would not send them. The generated half refuses a malformed message
// and a device the session lacks; the family's hook refuses what only its tables know (a size of
// 0, a reservation freed with another size, a handle name that is not the session's, a plain
// handle where a multicast object goes), each failing that call only.
TEST_F(RemoteTest, HookedGeneratedCallsCheckTheFamilysTables) {
  using tf::transport::Writer;
  namespace remote = tf::remote;
  using tf::driver::Fn;
  StartWorker();
  RawClient c;
  ASSERT_TRUE(c.Connect(unix_.substr(5)));
  ASSERT_TRUE(c.UsePrimaryContext());
  uint8_t buf[128];
  std::vector<uint8_t> out;
  // A call whose arguments are all u64 (sizes, addresses, handle names, flags).
  auto call = [&](Fn fn, std::initializer_list<uint64_t> args) {
    Writer w(buf, sizeof(buf));
    for (uint64_t a : args) w.U64(a);
    out.clear();
    return c.Call(remote::Op(fn), w, &out);
  };
  auto reserve = [&](uint64_t size) { return call(Fn::cuMemAddressReserve, {size, 0, 0, 0}); };
  auto free_range = [&](uint64_t p, uint64_t size) { return call(Fn::cuMemAddressFree, {p, size}); };
  auto create = [&](uint64_t size, bool short_by_one) {
    Writer w(buf, sizeof(buf));
    w.U64(size);
    WriteDeviceAllocationProp(w);
    if (!short_by_one) w.U64(0);  // flags
    else w.U32(0);
    out.clear();
    return c.Call(remote::Op(Fn::cuMemCreate), w, &out);
  };
  auto release = [&](uint64_t h) { return call(Fn::cuMemRelease, {h}); };
  auto mc_create = [&](uint32_t devices, uint64_t size) {
    Writer w(buf, sizeof(buf));
    w.U32(devices);
    w.U64(size);
    w.U64(0);  // handle types, flags
    w.U64(0);
    out.clear();
    return c.Call(remote::Op(Fn::cuMulticastCreate), w, &out);
  };
  auto mc_add = [&](uint64_t mc, int32_t dev) {
    Writer w(buf, sizeof(buf));
    w.U64(mc);
    w.I32(dev);
    return c.Call(remote::Op(Fn::cuMulticastAddDevice), w);
  };
  const uint64_t mib2 = 2u << 20;
  EXPECT_EQ(reserve(0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(reserve(4 * mib2), 0);
  const uint64_t va = FirstU64(out);
  ASSERT_NE(va, 0u);
  // IPC: only an allocation of the session is exported, only a range it opened is closed, and a
  // handle one byte short is a malformed message.
  EXPECT_EQ(call(Fn::cuIpcGetMemHandle, {va}), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(call(Fn::cuIpcCloseMemHandle, {va}), CUDA_ERROR_INVALID_VALUE);
  {
    Writer w(buf, sizeof(buf));
    for (int i = 0; i < CU_IPC_HANDLE_SIZE - 1; ++i) w.U8(0);
    w.U32(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    EXPECT_EQ(c.Call(remote::Op(Fn::cuIpcOpenMemHandle_v2), w), CUDA_ERROR_INVALID_VALUE);
  }
  EXPECT_EQ(free_range(va, mib2), CUDA_ERROR_INVALID_VALUE);  // not the whole reservation
  EXPECT_EQ(free_range(va + mib2, 3 * mib2), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(create(0, false), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(create(mib2, true), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(create(mib2, false), 0);
  const uint64_t mem = FirstU64(out);
  ASSERT_NE(mem, 0u);
  EXPECT_EQ(release(mem ^ (1ull << 30)), CUDA_ERROR_INVALID_VALUE);  // forged
  EXPECT_EQ(mc_create(0, mib2), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(mc_create(1, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(mc_create(1, mib2), 0);
  const uint64_t mc = FirstU64(out);
  ASSERT_NE(mc, 0u);
  EXPECT_EQ(mc_add(mem, 0), CUDA_ERROR_INVALID_VALUE);  // a plain handle is no multicast object
  EXPECT_EQ(mc_add(mc, 7), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(mc_add(mc ^ (1ull << 30), 7), CUDA_ERROR_INVALID_DEVICE);  // the device is checked first
  EXPECT_EQ(mc_add(mc, 0), 0);
  // Released: the names are stale; the reservation goes with its own size.
  EXPECT_EQ(release(mc), 0);
  EXPECT_EQ(mc_add(mc, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(release(mem), 0);
  EXPECT_EQ(release(mem), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(free_range(va, 4 * mib2), 0);
  EXPECT_EQ(free_range(va, 4 * mib2), CUDA_ERROR_INVALID_VALUE);
  // The session goes on: a new handle is made and released.
  ASSERT_EQ(create(mib2, false), 0);
  EXPECT_EQ(release(FirstU64(out)), 0);
}

// Allocation and context messages the stub would not send (generated calls whose hooks keep the
// session's tables): each gets its CUDA error and the session goes on.
TEST_F(RemoteTest, GeneratedAllocationAndContextCallsCheckTheSessionsTables) {
  using tf::transport::Writer;
  namespace remote = tf::remote;
  using tf::driver::Fn;
  StartWorker();
  RawClient c;
  ASSERT_TRUE(c.Connect(unix_.substr(5)));
  ASSERT_TRUE(c.UsePrimaryContext());
  uint8_t buf[64];
  std::vector<uint8_t> out;
  auto dev_call = [&](Fn fn, int32_t dev) {
    Writer w(buf, sizeof(buf));
    w.I32(dev);
    out.clear();
    return c.Call(remote::Op(fn), w, &out);
  };
  auto free_ptr = [&](uint64_t p) {
    Writer w(buf, sizeof(buf));
    w.U64(p);
    return c.Call(remote::Op(Fn::cuMemFree_v2), w);
  };
  auto pitch = [&](uint64_t width, uint64_t height) {
    Writer w(buf, sizeof(buf));
    w.U64(width);
    w.U64(height);
    w.U32(4);
    out.clear();
    return c.Call(remote::Op(Fn::cuMemAllocPitch_v2), w, &out);
  };
  EXPECT_EQ(dev_call(Fn::cuDevicePrimaryCtxRetain, 64), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(dev_call(Fn::cuDevicePrimaryCtxRetain, -1), CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(dev_call(Fn::cuDevicePrimaryCtxRelease_v2, 64), CUDA_ERROR_INVALID_DEVICE);
  {
    Writer w(buf, sizeof(buf));
    w.I32(64);
    w.U32(0);
    EXPECT_EQ(c.Call(remote::Op(Fn::cuDevicePrimaryCtxSetFlags_v2), w), CUDA_ERROR_INVALID_DEVICE);
  }
  // A retain comes back with the context's description: flags, API version, priorities, primary.
  ASSERT_EQ(dev_call(Fn::cuDevicePrimaryCtxRetain, 0), 0);
  ASSERT_EQ(out.size(), 8u + 17u);
  EXPECT_EQ(out.back(), 1) << "primary";
  // Device memory: a size of 0, an empty pitched allocation and a short message are refused; only
  // an allocation of the session is freed, once.
  EXPECT_EQ(c.Alloc(0), 0u);
  EXPECT_EQ(pitch(0, 4), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(pitch(64, 0), CUDA_ERROR_INVALID_VALUE);
  {
    Writer w(buf, sizeof(buf));
    w.U32(4096);
    EXPECT_EQ(c.Call(remote::Op(Fn::cuMemAlloc_v2), w), CUDA_ERROR_INVALID_VALUE);
  }
  const uint64_t p = c.Alloc(4096);
  ASSERT_NE(p, 0u);
  EXPECT_EQ(free_ptr(p + 16), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(free_ptr(0x7f0000100000ull), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(free_ptr(p), 0);
  EXPECT_EQ(free_ptr(p), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(pitch(64, 4), 0);
  ASSERT_EQ(out.size(), 16u);
  EXPECT_EQ(free_ptr(FirstU64(out)), 0);
  // Stream-ordered: a size of 0, a forged stream or pool are refused; the reply names the pool.
  auto async_alloc = [&](std::initializer_list<uint64_t> args, Fn fn) {
    Writer w(buf, sizeof(buf));
    for (uint64_t a : args) w.U64(a);
    out.clear();
    return c.Call(remote::Op(fn), w, &out);
  };
  EXPECT_EQ(async_alloc({0, 0}, Fn::cuMemAllocAsync), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(async_alloc({4096, 0x4a00000000000123ull}, Fn::cuMemAllocAsync), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(async_alloc({4096, 0x4f00000000000123ull, 0}, Fn::cuMemAllocFromPoolAsync), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(async_alloc({4096, 0}, Fn::cuMemAllocAsync), 0);
  ASSERT_EQ(out.size(), 16u) << "the pointer and the pool it came from";
  const uint64_t stream_ordered = FirstU64(out);
  uint64_t pool = 0;
  memcpy(&pool, out.data() + 8, 8);
  ASSERT_NE(pool, 0u);
  ASSERT_EQ(async_alloc({4096, pool, 0}, Fn::cuMemAllocFromPoolAsync), 0);
  EXPECT_EQ(out.size(), 16u);
  EXPECT_EQ(free_ptr(stream_ordered), 0);
  EXPECT_EQ(free_ptr(FirstU64(out)), 0);
  // Two retains held: two releases, and no third.
  EXPECT_EQ(dev_call(Fn::cuDevicePrimaryCtxRelease_v2, 0), 0);
  EXPECT_EQ(dev_call(Fn::cuDevicePrimaryCtxRelease_v2, 0), 0);
  EXPECT_EQ(dev_call(Fn::cuDevicePrimaryCtxRelease_v2, 0), CUDA_ERROR_INVALID_CONTEXT);
  // Contexts: execution-affinity parameters are refused, a primary context or a forged one is not
  // destroyed, a created one once.
  auto create = [&](bool params, int32_t affinity) {
    Writer w(buf, sizeof(buf));
    w.U8(params ? 1 : 0);
    if (params) w.I32(affinity);
    w.U32(0);  // flags
    w.I32(0);  // device
    out.clear();
    return c.Call(remote::Op(Fn::cuCtxCreate_v4), w, &out);
  };
  auto destroy = [&](uint64_t ctx) {
    Writer w(buf, sizeof(buf));
    w.U64(ctx);
    return c.Call(remote::Op(Fn::cuCtxDestroy_v2), w);
  };
  ASSERT_EQ(dev_call(Fn::cuDevicePrimaryCtxRetain, 0), 0);
  const uint64_t primary = FirstU64(out);
  EXPECT_EQ(create(true, 1), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(destroy(primary), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(destroy(primary ^ (1ull << 30)), CUDA_ERROR_INVALID_CONTEXT);
  ASSERT_EQ(create(true, 0), 0);  // empty parameters: the plain form
  ASSERT_EQ(out.size(), 8u + 17u);
  EXPECT_EQ(out.back(), 0) << "not primary";
  const uint64_t made = FirstU64(out);
  EXPECT_EQ(destroy(made), 0);
  EXPECT_EQ(destroy(made), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(dev_call(Fn::cuDevicePrimaryCtxRelease_v2, 0), 0);
  // The session goes on.
  ASSERT_EQ(dev_call(Fn::cuDevicePrimaryCtxRetain, 0), 0);
  Writer current(buf, sizeof(buf));
  current.U64(FirstU64(out));
  ASSERT_NE(c.Send(remote::Op(Fn::cuCtxSetCurrent), 0, current), 0u);
  EXPECT_NE(c.Alloc(4096), 0u);
}

// Array messages the stub would not send: unknown handles, regions outside the array or the
// session's allocations, malformed boxes. Each gets a CUDA error; the session goes on.
TEST_F(RemoteTest, BadArrayMessagesGetAClearErrorAndTheSessionGoesOn) {
  using tf::transport::Writer;
  namespace remote = tf::remote;
  using tf::driver::Fn;
  StartWorker();
  RawClient c;
  ASSERT_TRUE(c.Connect(unix_.substr(5)));
  ASSERT_TRUE(c.UsePrimaryContext());
  uint8_t buf[256];
  std::vector<uint8_t> out;
  const uint64_t dev = c.Alloc(4096);
  ASSERT_NE(dev, 0u);
  uint64_t array = 0;
  {
    CUDA_ARRAY3D_DESCRIPTOR d = {};
    d.Width = 16;
    d.Height = 16;
    d.Format = CU_AD_FORMAT_FLOAT;
    d.NumChannels = 1;  // rows of 64 bytes, 1024 bytes in all
    Writer w(buf, sizeof(buf));
    remote::WriteArrayDesc(d, w);
    ASSERT_EQ(c.Call(remote::Op(Fn::cuArray3DCreate_v2), w, &out), 0);
    memcpy(&array, out.data(), 8);
  }
  const uint64_t bogus = 0xbad0;
  auto atoh = [&](uint64_t a, uint64_t off, uint64_t n) {
    Writer w(buf, sizeof(buf));
    w.U64(a);
    w.U64(off);
    w.U64(n);
    return c.Call(remote::Op(Fn::cuMemcpyAtoH_v2), w);
  };
  auto dtoa = [&](uint64_t a, uint64_t d, uint64_t n) {
    Writer w(buf, sizeof(buf));
    w.U64(a);
    w.U64(0);
    w.U64(d);
    w.U64(n);
    return c.Call(remote::Op(Fn::cuMemcpyDtoA_v2), w);
  };
  auto box = [&](Fn fn, const remote::CopySide& src, const remote::CopySide& dst, uint64_t wb,
                 uint64_t h, uint64_t depth) {
    Writer w(buf, sizeof(buf));
    remote::WriteCopySide(src, w);
    remote::WriteCopySide(dst, w);
    w.U64(wb);
    w.U64(h);
    w.U64(depth);
    return c.Call(remote::Op(fn), w);
  };
  remote::CopySide arr{CU_MEMORYTYPE_ARRAY, array, 0, 0, 0, 0, 0};
  remote::CopySide bad_arr{CU_MEMORYTYPE_ARRAY, bogus, 0, 0, 0, 0, 0};
  remote::CopySide devs{CU_MEMORYTYPE_DEVICE, dev, 0, 0, 0, 256, 16};
  remote::CopySide host{CU_MEMORYTYPE_HOST};
  EXPECT_EQ(atoh(bogus, 0, 16), 1);                   // not an array of the session
  EXPECT_EQ(atoh(array, 1000, 100), 1);               // past the array's 1024 bytes
  EXPECT_EQ(atoh(array, ~0ull - 8, 16), 1);           // offset overflow
  EXPECT_EQ(dtoa(array, dev + 4000, 200), 1);         // past the allocation
  EXPECT_EQ(dtoa(array, 0x1000, 16), 1);              // not an allocation of the session
  EXPECT_EQ(box(Fn::cuMemcpy2D_v2, bad_arr, devs, 64, 4, 1), 1);
  EXPECT_EQ(box(Fn::cuMemcpy2D_v2, arr, devs, 64, 17, 1), 1);   // more rows than the array
  EXPECT_EQ(box(Fn::cuMemcpy2D_v2, arr, devs, 128, 16, 1), 1);  // rows past the pitch... and array
  EXPECT_EQ(box(Fn::cuMemcpy2D_v2, arr, remote::CopySide{CU_MEMORYTYPE_DEVICE, dev, 0, 0, 0, 512, 16},
                64, 16, 1),
            1);                                                    // the last rows leave the allocation
  EXPECT_EQ(box(Fn::cuMemcpy3D_v2, arr, devs, 64, 4, 2), 1);      // deeper than the array
  EXPECT_EQ(box(Fn::cuMemcpy2D_v2, arr, devs, 64, 4, 2), 1);      // a 2D copy with depth
  EXPECT_EQ(box(Fn::cuMemcpy2D_v2, host, host, 64, 4, 1), 1);     // host to host
  EXPECT_EQ(box(Fn::cuMemcpy2D_v2, host, arr, 64, 4, 1), 1);      // host source without data
  EXPECT_EQ(box(Fn::cuMemcpy3D_v2, arr, devs, 0, 4, 1), 1);       // empty
  {
    Writer w(buf, sizeof(buf));
    w.U8(CU_MEMORYTYPE_UNIFIED);  // never on the wire
    EXPECT_EQ(c.Call(remote::Op(Fn::cuMemcpy3D_v2), w), 1);
  }
  {
    Writer w(buf, sizeof(buf));
    w.U64(bogus);
    EXPECT_EQ(c.Call(remote::Op(Fn::cuArrayDestroy), w), 400);
    EXPECT_EQ(c.Call(remote::Op(Fn::cuMipmappedArrayDestroy), w), 400);
    EXPECT_EQ(c.Call(remote::Op(Fn::cuTexObjectDestroy), w), 1);
  }
  {
    CUDA_RESOURCE_DESC res = {};
    res.resType = CU_RESOURCE_TYPE_ARRAY;
    res.res.array.hArray = reinterpret_cast<CUarray>(bogus);
    Writer w(buf, sizeof(buf));
    WriteResource(res, w);
    EXPECT_EQ(c.Call(remote::Op(Fn::cuSurfObjectCreate), w), 1);
  }
  {
    CUDA_RESOURCE_DESC res = {};
    res.resType = CU_RESOURCE_TYPE_PITCH2D;  // 64 rows of 64 bytes, 256 apart: past the 4096 bytes
    res.res.pitch2D.devPtr = dev;
    res.res.pitch2D.format = CU_AD_FORMAT_FLOAT;
    res.res.pitch2D.numChannels = 1;
    res.res.pitch2D.width = 16;
    res.res.pitch2D.height = 64;
    res.res.pitch2D.pitchInBytes = 256;
    Writer w(buf, sizeof(buf));
    WriteTexture(res, w);
    EXPECT_EQ(c.Call(remote::Op(Fn::cuTexObjectCreate), w), 1);
  }
  // The session goes on: a copy into the array and back.
  EXPECT_EQ(box(Fn::cuMemcpy2D_v2, devs, arr, 64, 16, 1), 0);
  EXPECT_EQ(atoh(array, 0, 1024), 0);
  Writer w(buf, sizeof(buf));
  w.U64(array);
  EXPECT_EQ(c.Call(remote::Op(Fn::cuArrayDestroy), w), 0);
  EXPECT_EQ(c.Call(remote::Op(Fn::cuArrayDestroy), w), 400);
}

// Arrays and mipmapped arrays are names of their session (the worker's handle table): another
// session's name, a forged one or a destroyed one fails that call (CUDA_ERROR_INVALID_VALUE for
// copies, CUDA_ERROR_INVALID_HANDLE for destroys and levels), and both sessions go on.
TEST_F(RemoteTest, ArrayNamesFailInAnotherSessionForgedOrAfterDestroy) {
  using tf::transport::Writer;
  namespace remote = tf::remote;
  using tf::driver::Fn;
  StartWorker();
  RawClient c1, c2;
  ASSERT_TRUE(c1.Connect(unix_.substr(5)));
  ASSERT_TRUE(c1.UsePrimaryContext());
  ASSERT_TRUE(c2.Connect(unix_.substr(5)));
  ASSERT_TRUE(c2.UsePrimaryContext());
  uint8_t buf[256];
  std::vector<uint8_t> out;
  CUDA_ARRAY3D_DESCRIPTOR d = {};
  d.Width = 16;
  d.Height = 16;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  auto create = [&](RawClient& c, uint32_t levels) {
    Writer w(buf, sizeof(buf));
    remote::WriteArrayDesc(d, w);
    if (levels) w.U32(levels);
    uint64_t name = 0;
    out.clear();
    if (c.Call(remote::Op(levels ? Fn::cuMipmappedArrayCreate : Fn::cuArray3DCreate_v2), w, &out) == 0 &&
        out.size() >= 8) {
      memcpy(&name, out.data(), 8);
    }
    return name;
  };
  auto level = [&](RawClient& c, uint64_t mip, uint32_t l, uint64_t* name) {
    Writer w(buf, sizeof(buf));
    w.U64(mip);
    w.U32(l);
    out.clear();
    int r = c.Call(remote::Op(Fn::cuMipmappedArrayGetLevel), w, &out);
    if (r == 0 && out.size() >= 8) memcpy(name, out.data(), 8);
    return r;
  };
  auto atoh = [&](RawClient& c, uint64_t a) {
    Writer w(buf, sizeof(buf));
    w.U64(a);
    w.U64(0);
    w.U64(64);
    return c.Call(remote::Op(Fn::cuMemcpyAtoH_v2), w);
  };
  auto one = [&](RawClient& c, Fn fn, uint64_t h) {
    Writer w(buf, sizeof(buf));
    w.U64(h);
    return c.Call(remote::Op(fn), w);
  };
  // A texture over an array or a range of device memory: the object (0 when refused).
  auto texture = [&](RawClient& c, uint32_t type, uint64_t h, uint64_t* object) {
    CUDA_RESOURCE_DESC res = {};
    res.resType = static_cast<CUresourcetype>(type);
    if (type == CU_RESOURCE_TYPE_ARRAY) {
      res.res.array.hArray = reinterpret_cast<CUarray>(h);
    } else {
      res.res.linear.devPtr = h;
      res.res.linear.format = CU_AD_FORMAT_FLOAT;
      res.res.linear.numChannels = 1;
      res.res.linear.sizeInBytes = 256;
    }
    Writer w(buf, sizeof(buf));
    WriteTexture(res, w);
    out.clear();
    *object = 0;
    int r = c.Call(remote::Op(Fn::cuTexObjectCreate), w, &out);
    if (r == 0 && out.size() >= 8) memcpy(object, out.data(), 8);
    return r;
  };
  const uint64_t a1 = create(c1, 0), a2 = create(c2, 0);
  ASSERT_NE(a1, 0u);
  ASSERT_NE(a2, 0u);
  EXPECT_EQ(a1 >> 56 & 0xf0, 0x40u) << std::hex << a1;  // a name, not a pointer
  // Texture objects: only over this session's arrays and memory (CUDA_ERROR_INVALID_VALUE), and
  // destroyed only by the session that made them.
  const uint64_t dev1 = c1.Alloc(4096);
  ASSERT_NE(dev1, 0u);
  uint64_t t1 = 0, t2 = 0, tl = 0;
  ASSERT_EQ(texture(c1, CU_RESOURCE_TYPE_ARRAY, a1, &t1), 0);
  EXPECT_EQ(texture(c2, CU_RESOURCE_TYPE_ARRAY, a1, &t2), 1);                // another session's
  EXPECT_EQ(texture(c1, CU_RESOURCE_TYPE_ARRAY, a1 ^ (1ull << 30), &t2), 1);  // forged
  EXPECT_EQ(texture(c1, CU_RESOURCE_TYPE_LINEAR, dev1 + 3840, &tl), 0);      // its last 256 bytes
  EXPECT_EQ(one(c1, Fn::cuTexObjectDestroy, tl), 0);
  EXPECT_EQ(texture(c1, CU_RESOURCE_TYPE_LINEAR, dev1 + 3841, &tl), 1);      // one byte past
  EXPECT_EQ(texture(c2, CU_RESOURCE_TYPE_LINEAR, dev1, &tl), 1);             // another session's memory
  EXPECT_EQ(one(c2, Fn::cuTexObjectDestroy, t1), 1);                         // another session's object
  EXPECT_EQ(one(c1, Fn::cuTexObjectDestroy, t1), 0);
  EXPECT_EQ(one(c1, Fn::cuTexObjectDestroy, t1), 1);
  EXPECT_EQ(atoh(c1, a1), 0);
  EXPECT_EQ(atoh(c2, a1), 1);                              // another session's
  EXPECT_EQ(one(c2, Fn::cuArrayDestroy, a1), 400);
  EXPECT_EQ(atoh(c1, a1 ^ (1ull << 30)), 1);               // forged
  EXPECT_EQ(one(c1, Fn::cuArrayDestroy, a1 ^ (1ull << 30)), 400);
  EXPECT_EQ(atoh(c1, a1), 0);                              // untouched
  // A mipmapped array's levels are names that die with it.
  const uint64_t mip = create(c1, 3);
  ASSERT_NE(mip, 0u);
  uint64_t l0 = 0, bad = 0;
  ASSERT_EQ(level(c1, mip, 0, &l0), 0);
  EXPECT_EQ(atoh(c1, l0), 0);
  EXPECT_EQ(atoh(c2, l0), 1);
  EXPECT_EQ(level(c2, mip, 0, &bad), 400);
  EXPECT_EQ(one(c2, Fn::cuMipmappedArrayDestroy, mip), 400);
  EXPECT_EQ(one(c1, Fn::cuArrayDestroy, l0), 400);
  EXPECT_EQ(one(c1, Fn::cuMipmappedArrayDestroy, mip), 0);
  EXPECT_EQ(atoh(c1, l0), 1);
  EXPECT_EQ(level(c1, mip, 0, &bad), 400);
  EXPECT_EQ(one(c1, Fn::cuMipmappedArrayDestroy, mip), 400);
  // Destroy retires the name; a new array gets another.
  EXPECT_EQ(one(c1, Fn::cuArrayDestroy, a1), 0);
  EXPECT_EQ(atoh(c1, a1), 1);
  EXPECT_EQ(texture(c1, CU_RESOURCE_TYPE_ARRAY, a1, &t1), 1);  // a destroyed array
  EXPECT_EQ(one(c1, Fn::cuArrayDestroy, a1), 400);
  const uint64_t a3 = create(c1, 0);
  ASSERT_NE(a3, 0u);
  EXPECT_NE(a3, a1);
  EXPECT_EQ(atoh(c1, a3), 0);
  EXPECT_EQ(atoh(c2, a2), 0);  // the other session went on
  EXPECT_EQ(one(c2, Fn::cuArrayDestroy, a2), 0);
}

}  // namespace

namespace {

// The stub as a library: every driver entry point is a real ELF symbol, it needs nothing but libc,
// and it fails cleanly before cuInit and without a worker.
TEST(RemoteStub, ExportsEveryDriverEntryPointAndNeedsOnlyLibc) {
  void* h = dlopen(TF_CLIENT, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  std::ifstream in(TF_EXPORTS_TXT);
  std::string name;
  int n = 0;
  while (std::getline(in, name)) {
    if (name.empty() || name[0] == '#') continue;
    EXPECT_NE(dlsym(h, name.c_str()), nullptr) << name;
    ++n;
  }
  EXPECT_GT(n, 600);
  EXPECT_NE(dlsym(h, "tfusion_client_version"), nullptr);
  FILE* p = popen((std::string("readelf -d ") + TF_CLIENT + " 2>/dev/null").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t k;
  while ((k = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, k);
  pclose(p);
  if (out.empty()) GTEST_SKIP() << "readelf not available";
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.find("(NEEDED)") == std::string::npos) continue;
    EXPECT_TRUE(line.find("[libc.so.6]") != std::string::npos ||
                line.find("[ld-linux-x86-64.so.2]") != std::string::npos)
        << line;
  }
  EXPECT_NE(out.find("Library soname: [libcuda.so.1]"), std::string::npos);
}

TEST(RemoteStub, FailsCleanlyBeforeCuInitAndWithoutAWorker) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    unsetenv("TFUSION_REMOTE");
    void* h = dlopen(TF_CLIENT, RTLD_NOW | RTLD_LOCAL);
    if (!h) _exit(10);
    auto alloc = reinterpret_cast<int (*)(unsigned long long*, size_t)>(dlsym(h, "cuMemAlloc_v2"));
    auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(h, "cuInit"));
    auto count = reinterpret_cast<int (*)(int*)>(dlsym(h, "cuDeviceGetCount"));
    unsigned long long p;
    int c = 0;
    if (alloc(&p, 64) != 3) _exit(11);   // CUDA_ERROR_NOT_INITIALIZED
    if (init(0) != 100) _exit(12);       // CUDA_ERROR_NO_DEVICE
    if (count(&c) != 3) _exit(13);
    setenv("TFUSION_REMOTE", "127.0.0.1:1", 1);  // nobody listens on port 1
    if (init(0) != 100) _exit(14);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace

namespace {

// ---- Device printf, JIT options, the linker and 32 KB kernel parameters (jit_console_probe)

// Where two outputs first differ (they can be hundreds of KiB: never print them whole).
std::string FirstDifference(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  const size_t from = i > 80 ? i - 80 : 0;
  return "sizes " + std::to_string(a.size()) + " and " + std::to_string(b.size()) +
         ", first difference at byte " + std::to_string(i) + ":\n<<<" + a.substr(from, 200) +
         ">>>\n<<<" + b.substr(from, 200) + ">>>";
}

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST_F(RemoteTest, DevicePrintfReachesTheClientsStdoutAtEachSynchronizingCall) {
  StartWorker();
  Result direct = DirectProgram({TF_JIT_PROBE, "console", "2000"});
  ASSERT_EQ(direct.rc, 0) << direct.out.substr(0, 4000);
  // More than a pipe's 64 KiB between two synchronizing calls, each line before the call's return.
  ASSERT_GT(direct.out.size(), 128u * 1024);
  ASSERT_LT(direct.out.find("tag=7 line=1999 "), direct.out.find("after_ctx_sync=1"));
  ASSERT_LT(direct.out.find("tag=8 line=2 "), direct.out.find("after_stream_sync=1"));
  ASSERT_LT(direct.out.find("tag=9 line=1 "), direct.out.find("after_event_sync=1"));
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = RemoteProgram(addr, {TF_JIT_PROBE, "console", "2000"});
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out.substr(0, 4000);
    EXPECT_EQ(r.kv["done"], "1");
    EXPECT_TRUE(r.out == direct.out) << addr << ": " << FirstDifference(direct.out, r.out);
  }
  // The worker's own log still goes where it went (its stderr), and no device line went there.
  EXPECT_TRUE(worker_.WaitFor("session ended", 10000)) << worker_.out;
  EXPECT_EQ(worker_.out.find("device printf tag="), std::string::npos) << worker_.out;
}

TEST_F(RemoteTest, DevicePrintfIsNotLostWhenTheClientExitsRightAfterASync) {
  StartWorker();
  Result direct = DirectProgram({TF_JIT_PROBE, "console_exit", "1500"});
  ASSERT_EQ(direct.rc, 0) << direct.out.substr(0, 2000);
  ASSERT_EQ(Count(direct.out, "device printf tag=5 "), 1500u);
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = RemoteProgram(addr, {TF_JIT_PROBE, "console_exit", "1500"});
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out.substr(0, 2000);
    EXPECT_EQ(Count(r.out, "device printf tag=5 "), 1500u) << addr;
    EXPECT_NE(r.out.find("tag=5 line=1499 "), std::string::npos) << addr;
  }
}

TEST_F(RemoteTest, JitOptionsFillTheClientsLogBuffersAndOutValues) {
  StartWorker();
  Result direct = DirectProgram({TF_JIT_PROBE, "jit"});
  ASSERT_EQ(direct.rc, 0) << direct.out;
  EXPECT_NE(direct.out.find("jit_info=[fakecuda jit: loaded module builtin\n]"), std::string::npos)
      << direct.out;
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = RemoteProgram(addr, {TF_JIT_PROBE, "jit"});
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["jit_result"], "0");
    EXPECT_EQ(r.kv["jit_info_size"], "36") << "the size option comes back as the bytes written";
    EXPECT_EQ(r.kv["jit_wall"], "0.25");
    EXPECT_EQ(r.kv["jit_kernel_ok"], "1");
    EXPECT_EQ(r.kv["bad_result"], "200") << "CUDA_ERROR_INVALID_IMAGE";
    EXPECT_NE(r.out.find("bad_error=[fakecuda jit: not a fakecuda image"), std::string::npos)
        << "the error log comes back with the failure\n" << r.out;
    EXPECT_EQ(r.kv["small_info"], "[fakecuda ji]") << "bounded by the application's size";
    EXPECT_EQ(r.out, direct.out) << addr;
  }
}

TEST_F(RemoteTest, LinkingTwoUnitsGivesTheClientACubinItCanLoad) {
  StartWorker();
  const std::string unit = dir_ + "/linkpart.ptx";
  {
    std::ofstream f(unit);
    f << "fakecuda:linkpart";
  }
  Result direct = DirectProgram({TF_JIT_PROBE, "link", unit});
  ASSERT_EQ(direct.rc, 0) << direct.out;
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = RemoteProgram(addr, {TF_JIT_PROBE, "link", unit});
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["bad_unit"], "218") << "CUDA_ERROR_INVALID_PTX";
    EXPECT_NE(r.out.find("bad_unit_error=[fakecuda link: bad.ptx: not a fakecuda image"),
              std::string::npos) << r.out;
    EXPECT_EQ(r.kv["missing_file"], "301") << "CUDA_ERROR_FILE_NOT_FOUND";
    EXPECT_EQ(r.kv["cubin"], "[fakecuda:builtin+linkpart]");
    EXPECT_NE(r.out.find("fakecuda link: added " + unit), std::string::npos)
        << "cuLinkAddFile names the unit by its path\n" << r.out;
    EXPECT_NE(r.out.find("fakecuda link: linked 2 units"), std::string::npos) << r.out;
    EXPECT_EQ(r.kv["linked_kernels"], "84") << "kernels of both units ran";
    EXPECT_EQ(r.kv["destroy_again"], "400") << "CUDA_ERROR_INVALID_HANDLE";
    EXPECT_EQ(r.kv["done"], "1");
    EXPECT_EQ(r.out, direct.out) << addr;
  }
}

TEST_F(RemoteTest, AKernelTakesA32000ByteStructByValue) {
  StartWorker();
  Result direct = DirectProgram({TF_JIT_PROBE, "params32k"});
  ASSERT_EQ(direct.rc, 0) << direct.out;
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = RemoteProgram(addr, {TF_JIT_PROBE, "params32k"});
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["params32k_kernel_params"], "1") << addr;
    EXPECT_EQ(r.kv["params32k_extra"], "1") << addr;
    EXPECT_EQ(r.out, direct.out) << addr;
  }
}

// A client speaking the protocol itself: bad link handles, too many or pointer-valued JIT options
// and unknown images get an error and the session goes on.
TEST_F(RemoteTest, BadLinkAndJitMessagesGetAnErrorAndChangeNothing) {
  using tf::transport::Writer;
  namespace remote = tf::remote;
  using tf::driver::Fn;
  StartWorker();
  RawClient c;
  ASSERT_TRUE(c.Connect(unix_.substr(5)));
  uint8_t buf[2048];
  std::vector<uint8_t> out;
  ASSERT_TRUE(c.UsePrimaryContext());
  auto options = [&](Writer& w, uint32_t n, uint32_t id) {
    w.U32(n);
    for (uint32_t i = 0; i < n; ++i) {
      w.U32(id);
      w.U64(1);
    }
  };
  {
    Writer w(buf, sizeof(buf));
    options(w, remote::kMaxJitOptions + 1, CU_JIT_OPTIMIZATION_LEVEL);
    EXPECT_EQ(c.Call(remote::Op(Fn::cuLinkCreate_v2), w), 1) << "too many options";
  }
  {
    Writer w(buf, sizeof(buf));
    options(w, 1, CU_JIT_GLOBAL_SYMBOL_NAMES);
    EXPECT_EQ(c.Call(remote::Op(Fn::cuLinkCreate_v2), w), 1) << "a client pointer as an option";
  }
  {
    Writer w(buf, sizeof(buf));
    options(w, 1, CU_JIT_NUM_OPTIONS);
    EXPECT_EQ(c.Call(remote::Op(Fn::cuLinkCreate_v2), w), 1) << "an unknown option";
  }
  for (Fn fn : {Fn::cuLinkComplete, Fn::cuLinkDestroy}) {
    Writer w(buf, sizeof(buf));
    w.U64(0x1234);
    EXPECT_EQ(c.Call(remote::Op(fn), w), 400) << "not a link state of this session";
  }
  {
    Writer w(buf, sizeof(buf));
    w.U64(1);
    w.U64(2);
    w.U64(17);
    options(w, 0, 0);
    EXPECT_EQ(c.Call(remote::Op(Fn::cuModuleLoadDataEx), w), 200) << "an image never sent";
  }
  // A real link state, then an input of an unknown type and one never sent.
  uint64_t link = 0;
  {
    Writer w(buf, sizeof(buf));
    options(w, 0, 0);
    ASSERT_EQ(c.Call(remote::Op(Fn::cuLinkCreate_v2), w, &out), 0);
    ASSERT_GE(out.size(), 4u + 4 + 4 + 4 + 8);
    int32_t driver_result = 0;
    memcpy(&driver_result, out.data(), 4);
    ASSERT_EQ(driver_result, 0);
    memcpy(&link, out.data() + out.size() - 8, 8);
  }
  for (uint32_t type : {static_cast<uint32_t>(CU_JIT_NUM_INPUT_TYPES), 1u}) {
    Writer w(buf, sizeof(buf));
    w.U64(link);
    w.U32(type);
    w.U64(5);
    w.U64(6);
    w.U64(7);
    w.Blob("x", 1);
    options(w, 0, 0);
    EXPECT_EQ(c.Call(remote::Op(Fn::cuLinkAddData_v2), w), type == 1u ? 200 : 1) << type;
  }
  Writer w(buf, sizeof(buf));
  w.U64(link);
  EXPECT_EQ(c.Call(remote::Op(Fn::cuLinkDestroy), w), 0) << "the session goes on";
}

// ---- NVML in the client (src/client/nvml): libnvidia-ml.so.1 in the inject folder answers from
// the session, so a program's NVML and CUDA agree on the devices and their memory.

TEST_F(RemoteTest, TheClientsNvmlReportsTheSessionsDevicesOverBothTransports) {
  StartWorker();
  for (const std::string& addr : {tcp_, unix_}) {
    Result r = RemoteProgram(addr, {TF_NVML_PROBE, "list"});
    ASSERT_EQ(r.rc, 0) << addr << "\n" << r.out;
    EXPECT_EQ(r.kv["init"], "0") << r.out;
    EXPECT_EQ(r.kv["is_tfusion"], "1") << "the client's NVML, not the machine's";
    EXPECT_EQ(r.kv["count"], "1");
    EXPECT_EQ(r.kv["name_0"], "Fake GPU H100");
    EXPECT_EQ(r.kv["uuid_0"], "GPU-fa4ec0da-0000-4000-8000-000000000000");
    EXPECT_EQ(r.kv["mem_result_0"], "0");
    EXPECT_EQ(r.kv["mem_total_mib_0"], "16384");
    EXPECT_EQ(r.kv["mem_v2_total_mib_0"], "16384");
    EXPECT_EQ(r.kv["mem_used_mib_0"], "0") << "this process has allocated nothing";
    EXPECT_EQ(r.kv["cc_0"], "9.0");
    EXPECT_EQ(r.kv["pci_0"], "00000000:18:00.0");
    EXPECT_EQ(r.kv["by_uuid_0"], "0");
    EXPECT_EQ(r.kv["by_pci_0"], "0");
    EXPECT_EQ(r.kv["procs_0"], "0/0") << "no context: no process";
    EXPECT_EQ(r.kv["mig_0"], "0");
    EXPECT_EQ(r.kv["cuda_driver_version"], std::to_string(CUDA_VERSION));
    EXPECT_EQ(r.kv["shutdown"], "0");
    EXPECT_EQ(r.kv["count_after_shutdown"], "1") << "NVML_ERROR_UNINITIALIZED after the last shutdown";
    EXPECT_EQ(r.kv["done"], "1");
  }
}

TEST_F(RemoteTest, TheClientsNvmlMemoryAndProcessesAgreeWithCuda) {
  StartWorker();
  Result r = RemoteProgram(tcp_, {TF_NVML_PROBE, "alloc"});
  ASSERT_EQ(r.rc, 0) << r.out;
  ASSERT_EQ(r.kv["cuda_setup"], "0") << r.out;
  EXPECT_EQ(r.kv["init"], "0");
  EXPECT_EQ(r.kv["nvml_total"], r.kv["cuda_total"]) << r.out;
  EXPECT_EQ(r.kv["nvml_free"], r.kv["cuda_free"]) << r.out;
  EXPECT_NE(r.kv["nvml_used"], "0") << r.out;
  EXPECT_EQ(r.kv["procs_probe"], "7/1") << "INSUFFICIENT_SIZE with the count needed";
  EXPECT_EQ(r.kv["procs"], "0/1");
  EXPECT_EQ(r.kv["proc_is_me"], "1");
  EXPECT_EQ(r.kv["proc_used_mib"], "8") << "the process's own allocation";
}

TEST_F(RemoteTest, TheClientsNvmlChecksItsArguments) {
  StartWorker();
  Result r = RemoteProgram(unix_, {TF_NVML_PROBE, "args"});
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::map<std::string, std::string> want = {
      {"count_before_init", "1"}, {"shutdown_before_init", "1"}, {"init", "0"},
      {"count_null", "2"}, {"index_out_of_range", "2"}, {"handle_null", "2"},
      {"name_short", "7"}, {"uuid_40", "7"}, {"uuid_41", "0"}, {"name_null", "2"},
      {"bad_handle", "2"}, {"null_handle", "2"}, {"mem_v2_bad_version", "25"}, {"mem_null", "2"},
      {"unknown_uuid", "6"}, {"unknown_bus", "6"}, {"garbage_bus", "2"}, {"procs_null_count", "2"},
      {"procs_none", "0/0"}, {"power_usage", "3"}, {"driver_version_short", "7"},
      {"error_string_7", "Insufficient Size"}, {"shutdown", "0"}, {"shutdown_again", "1"},
      {"done", "1"}};
  for (const auto& [k, v] : want) EXPECT_EQ(r.kv[k], v) << k << "\n" << r.out;
}

TEST_F(RemoteTest, TheClientsNvmlExportsEveryNvmlName) {
  void* h = dlopen((std::string(TF_CLIENT_INJECT) + "/libnvidia-ml.so.1").c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr) << dlerror();
  std::ifstream in(TF_NVML_EXPORTS_TXT);
  std::string name;
  int n = 0;
  while (in >> name) {
    EXPECT_NE(dlsym(h, name.c_str()), nullptr) << name;
    ++n;
  }
  EXPECT_GT(n, 400);
  EXPECT_NE(dlsym(h, "tfusion_client_nvml_version"), nullptr);
  // An export it does not answer: NOT_SUPPORTED, whatever the arguments.
  auto power = reinterpret_cast<int (*)(void*, unsigned*)>(dlsym(h, "nvmlDeviceGetPowerUsage"));
  unsigned mw = 0;
  EXPECT_EQ(power(nullptr, &mw), 3);
  dlclose(h);
}

TEST_F(RemoteTest, WithoutAWorkerTheClientsNvmlFailsToInitialiseQuicklyAndSaysWhy) {
  for (const std::string& addr : {std::string("unix:") + dir_ + "/nobody.sock", std::string("127.0.0.1:1")}) {
    Child c;
    auto start = Clock::now();
    c.Start({TF_NVML_PROBE, "list"}, {std::string("LD_LIBRARY_PATH=") + TF_CLIENT_INJECT,
                                      "TFUSION_REMOTE=" + addr, "TFUSION_TOKEN=sekrit"});
    Result r;
    r.rc = c.Wait(30000);
    r.out = c.out;
    ParseKv(&r);
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(15));
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.kv["init"], "9") << "NVML_ERROR_DRIVER_NOT_LOADED\n" << r.out;
    EXPECT_EQ(r.kv["init_error"], "Driver Not Loaded");
    EXPECT_EQ(r.kv["count_uninit"], "1");
    EXPECT_NE(r.out.find("tfusion-client-nvml: the remote vGPU session is not available"),
              std::string::npos) << r.out;
    EXPECT_NE(r.out.find("cannot connect to the worker"), std::string::npos) << r.out;
  }
}

TEST_F(RemoteTest, TheClientsNvmlBesideARealDriverRefusesToInitialise) {
  // A program whose libcuda.so.1 is a driver (here the fake one), not the stub.
  std::string lib = dir_ + "/lib";
  ASSERT_EQ(mkdir(lib.c_str(), 0755), 0);
  ASSERT_EQ(symlink((std::string(TF_CLIENT_INJECT) + "/libnvidia-ml.so.1").c_str(),
                    (lib + "/libnvidia-ml.so.1").c_str()), 0);
  ASSERT_EQ(symlink(TF_FAKECUDA, (lib + "/libcuda.so.1").c_str()), 0);
  Child c;
  c.Start({TF_NVML_PROBE, "list"}, {"LD_LIBRARY_PATH=" + lib, "FAKECUDA_SHM_NAME=" + shm_name_ + "-d"});
  Result r;
  r.rc = c.Wait(30000);
  r.out = c.out;
  ParseKv(&r);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.kv["init"], "9") << r.out;
  EXPECT_NE(r.out.find("is not the TensorFusion remote client stub"), std::string::npos) << r.out;
}

}  // namespace
