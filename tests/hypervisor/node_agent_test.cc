#include "hypervisor/node_agent.h"

#include <gtest/gtest.h>

#include <thread>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>

#include "controller/api_server.h"
#include "exposition_parser.h"
#include "controller/http_client.h"
#include "controller/sqlite_store.h"
#include "hypervisor/nvml_gpu_source.h"
#include "hypervisor/remote_sessions.h"
#include "limiter/core/process_identity.h"

namespace tf::hypervisor {
namespace {

// The value of one series of the agent's /metrics (NaN when absent or ambiguous); the exposition
// must parse.
double Metric(const NodeAgent& agent, const std::string& name, const std::map<std::string, std::string>& labels = {}) {
  tf::testing::ParsedExposition m;
  const std::string text = agent.MetricsText();
  const std::string err = tf::testing::ParseExposition(text, &m);
  EXPECT_EQ(err, "") << text;
  return m.Value(name, labels);
}

// A controller with its API on a free port, in a temporary folder that goes with it.
struct ControllerRig {
  ControllerRig() {
    char tmpl[] = "/tmp/tfagent-XXXXXX";
    dir = mkdtemp(tmpl);
    store = std::move(controller::SqliteStore::Open(dir + "/s.db")).value();
    c = std::make_unique<controller::Controller>(store.get(), &clock, controller::MakeSchedulerPlacement(),
                                                 nullptr);
    if (!c->Rebuild().ok()) return;
    api = std::make_unique<controller::ApiServer>(c.get(), "tok");
    auto bound = api->Bind("127.0.0.1", 0);
    if (!bound.ok()) return;
    port = *bound;
    api->Start();
  }
  ~ControllerRig() {
    if (api) api->Stop();
    std::filesystem::remove_all(dir);
  }
  bool ok() const { return port > 0; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }

  std::string dir;
  controller::FakeClock clock;
  std::unique_ptr<controller::SqliteStore> store;
  std::unique_ptr<controller::Controller> c;
  std::unique_ptr<controller::ApiServer> api;
  int port = 0;
};

TEST(NvmlGpuSource, MissingDriverIsReportedNotFatal) {
  NvmlGpuSource source("libnvidia-ml-does-not-exist.so.1");
  auto gpus = source.Discover();
  ASSERT_FALSE(gpus.ok());
  EXPECT_EQ(gpus.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(gpus.status().message().find("no NVIDIA driver"), std::string::npos);
}

TEST(NodeAgent, RegistersSizesFromCatalogAndHeartbeats) {
  ControllerRig rig;
  ASSERT_TRUE(rig.ok());
  controller::Controller& c = *rig.c;

  FakeGpuSource source({{0, "GPU-aaa", "NVIDIA H100 80GB HBM3", 81559, 0, 0, 0}});
  QuotaRegions regions(rig.dir + "/regions");
  NodeAgent agent({rig.url(), "tok", "gpu-host-1", "", "", ""},
                  &source, &regions, &rig.clock);
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_EQ(regions.attached().size(), 1u);
  auto gpus = c.ListGpus("");
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_GT(gpus[0].gpu.milli_tflops, 500'000);  // H100: from the catalog, not zero
  EXPECT_EQ(gpus[0].gpu.vram_mib, 81559);
  source.utilization_percent = 42;
  ASSERT_TRUE(agent.HeartbeatOnce().ok());
  EXPECT_EQ(c.ListGpus("")[0].utilization_percent, 42);
  tf::testing::ParsedExposition m;
  ASSERT_EQ(tf::testing::ParseExposition(agent.MetricsText(), &m), "") << agent.MetricsText();
  EXPECT_EQ(m.Value("tf_gpu_utilization_ratio", {{"gpu", "GPU-aaa"}}), 0.42);
  EXPECT_EQ(m.Value("tf_gpu_vram_total_bytes", {{"gpu", "GPU-aaa"}}), 81559.0 * 1024 * 1024);

  NodeAgent bad({rig.url(), "wrong", "h2", "", "", ""}, &source,
                &regions, &rig.clock);
  EXPECT_EQ(bad.Start().code(), StatusCode::kUnauthenticated);
}

// The agent owns the per-GPU regions: one per GPU at start, one vGPU per allocation the controller
// placed on the node (limits from the allocation), removed when the allocation is released.
TEST(NodeAgent, QuotaRegionsFollowTheControllersAllocations) {
  ControllerRig rig;
  ASSERT_TRUE(rig.ok());
  controller::Controller& c = *rig.c;

  FakeGpuSource source({{0, "GPU-r0", "NVIDIA L4", 23034, 0, 0, 0},
                        {1, "GPU-r1", "NVIDIA L4", 23034, 0, 0, 0}});
  QuotaRegions regions(rig.dir + "/regions");
  NodeAgentOptions options{rig.url(), "tok", "host-r", "", "", ""};
  options.credential_file = rig.dir + "/agent/node-credential";
  NodeAgent agent(options, &source, &regions, &rig.clock);
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_EQ(regions.attached().size(), 2u);
  ASSERT_TRUE(std::filesystem::exists(rig.dir + "/regions/gpu-GPU-r0.region"));
  const double l4 = controller::ToTflops(c.ListGpus("")[0].gpu.milli_tflops);
  ASSERT_GT(l4, 0);
  EXPECT_EQ(regions.region("GPU-r0")->capacity_mtflops(), static_cast<uint64_t>(l4 * 1000 + 0.5));

  controller::AllocationRequest req{"", "", 0, 2048, 1, "", ""};
  req.percent = 25;
  auto a = c.Allocate(req);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(agent.SyncAllocations().ok());
  {  // each sync is counted by result (the failover benchmark watches it)
    tf::testing::ParsedExposition m;
    ASSERT_EQ(tf::testing::ParseExposition(agent.MetricsText(), &m), "") << agent.MetricsText();
    EXPECT_GE(m.Value("tf_node_syncs_total", {{"result", "ok"}}), 1.0);
    EXPECT_EQ(m.Value("tf_node_syncs_total", {{"result", "failed"}}), 0.0);
  }
  limiter::GpuRegion* r = regions.region(a->vgpus[0].gpu_uuid);
  ASSERT_NE(r, nullptr);
  uint32_t index = 0;
  ASSERT_EQ(r->FindVgpu(a->id.c_str(), &index), limiter::RegionError::kOk);
  EXPECT_EQ(r->Limit(index), 2048ull << 20);
  auto snap = std::make_unique<limiter::RegionSnapshot>();
  r->Snapshot(snap.get());
  ASSERT_EQ(snap->vgpu_count, 1u);
  EXPECT_EQ(snap->vgpus[0].compute_share_ppm, 250000u);

  // A restarted agent re-attaches to the same regions and keeps the vGPU.
  QuotaRegions again(rig.dir + "/regions");
  NodeAgent agent2(options, &source, &again, &rig.clock);  // the same credential file
  ASSERT_TRUE(agent2.Start().ok());
  ASSERT_TRUE(agent2.SyncAllocations().ok());
  EXPECT_EQ(again.region(a->vgpus[0].gpu_uuid)->FindVgpu(a->id.c_str(), &index), limiter::RegionError::kOk);

  ASSERT_TRUE(c.Release(a->id).ok());
  ASSERT_TRUE(agent.SyncAllocations().ok());
  EXPECT_EQ(r->FindVgpu(a->id.c_str(), &index), limiter::RegionError::kNotFound);
  EXPECT_EQ(Metric(agent, "tf_node_vgpus"), 0);
}

// A second agent claiming an enrolled node's name (a cloned machine: same --node, its own
// credential) is refused with a clear error and changes nothing; the operator can remove the node
// once it holds no allocations, and then the new agent enrolls.
TEST(NodeAgent, ACloneClaimingAnEnrolledNodeIsRefusedUntilTheNodeIsRemoved) {
  ControllerRig rig;
  ASSERT_TRUE(rig.ok());
  controller::Controller& c = *rig.c;
  FakeGpuSource source({{0, "GPU-c0", "NVIDIA L4", 23034, 0, 0, 0}});
  FakeGpuSource clone_source({{0, "GPU-c9", "NVIDIA L4", 23034, 0, 0, 0}});
  QuotaRegions regions(rig.dir + "/regions"), clone_regions(rig.dir + "/clone-regions");
  NodeAgentOptions options{rig.url(), "tok", "host-c", "", "", ""};
  options.credential_file = rig.dir + "/a/node-credential";
  NodeAgent agent(options, &source, &regions, &rig.clock);
  ASSERT_TRUE(agent.Start().ok());
  auto a = c.Allocate({"", "", 10, 100, 1, "", ""});
  ASSERT_TRUE(a.ok()) << a.status().ToString();

  NodeAgentOptions clone_options = options;
  clone_options.credential_file = rig.dir + "/b/node-credential";
  NodeAgent clone(clone_options, &clone_source, &clone_regions, &rig.clock);
  Status st = clone.Start();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("enrolled by another agent"), std::string::npos) << st.ToString();
  EXPECT_FALSE(clone.HeartbeatOnce().ok()) << "nor can it keep the node alive";
  auto gpus = c.ListGpus("");
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].gpu.uuid, "GPU-c0") << "the clone changed nothing";
  EXPECT_TRUE(agent.HeartbeatOnce().ok()) << "the enrolled agent goes on";

  // Removal waits for the allocations to go; then the other agent may enroll.
  controller::HttpClient http(rig.url(), "tok");
  EXPECT_EQ(http.Delete("/v1/nodes/host-c")->status, 409);
  ASSERT_TRUE(c.Release(a->id).ok());
  EXPECT_EQ(http.Delete("/v1/nodes/host-c")->status, 200);
  EXPECT_TRUE(c.ListGpus("").empty());
  EXPECT_TRUE(clone.Start().ok());
  EXPECT_EQ(c.ListGpus("")[0].gpu.uuid, "GPU-c9");
  // The credential is kept in its file (0600) for the next start.
  struct stat sb {};
  ASSERT_EQ(stat(clone_options.credential_file.c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 0777, 0600u);
}

// An http:// URL of a loopback port nothing listens on (bound, then closed: connections are
// refused at once); "" when no port could be had.
std::string ClosedPortUrl() {
  const int probe = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  const bool ok = probe >= 0 && bind(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  getsockname(probe, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  if (probe >= 0) close(probe);
  return ok ? "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) : "";
}

// An agent the controller refuses never heartbeats, so failed heartbeats cannot show it: its
// metrics say it is not registered and count the refusals; one that cannot reach the controller
// counts failures instead.
TEST(NodeAgent, ARefusedOrFailedRegistrationShowsInTheMetrics) {
  ControllerRig rig;
  ASSERT_TRUE(rig.ok());
  FakeGpuSource source({{0, "GPU-m0", "NVIDIA L4", 23034, 0, 0, 0}});
  QuotaRegions regions(rig.dir + "/regions"), moved_regions(rig.dir + "/moved-regions");
  NodeAgent agent({rig.url(), "tok", "host-m", "", "", ""}, &source, &regions, &rig.clock);
  EXPECT_EQ(Metric(agent, "tf_node_registered"), 0) << "not registered before it starts";
  ASSERT_TRUE(agent.Start().ok());
  EXPECT_EQ(Metric(agent, "tf_node_registered"), 1);
  EXPECT_EQ(Metric(agent, "tf_node_registrations_total", {{"result", "ok"}}), 1);

  // The same GPU on another node (a GPU moved between hosts, a cloned machine): HTTP 409, retried.
  NodeAgent moved({rig.url(), "tok", "host-n", "", "", ""}, &source, &moved_regions, &rig.clock);
  for (int retry = 0; retry < 2; ++retry) {
    Status st = moved.Start();
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  }
  EXPECT_EQ(Metric(moved, "tf_node_registered"), 0);
  EXPECT_EQ(Metric(moved, "tf_node_registrations_total", {{"result", "refused"}}), 2);
  EXPECT_EQ(Metric(moved, "tf_node_registrations_total", {{"result", "ok"}}), 0);
  EXPECT_EQ(Metric(moved, "tf_node_registrations_total", {{"result", "failed"}}), 0);

  // No controller to answer.
  const std::string url = ClosedPortUrl();
  ASSERT_FALSE(url.empty());
  QuotaRegions lone_regions(rig.dir + "/lone-regions");
  NodeAgent lone({url, "tok", "host-l", "", "", ""}, &source, &lone_regions, &rig.clock);
  EXPECT_FALSE(lone.Start().ok());
  EXPECT_EQ(Metric(lone, "tf_node_registered"), 0);
  EXPECT_EQ(Metric(lone, "tf_node_registrations_total", {{"result", "failed"}}), 1);
  EXPECT_EQ(Metric(lone, "tf_node_registrations_total", {{"result", "refused"}}), 0);
}

// An agent given several replicas' URLs follows the leader: an unreachable replica and a standby
// (503 to every request) are passed over. Behind the standby alone it never reads "no
// allocations", so the vGPUs of its tenants stay.
TEST(NodeAgent, AnAgentGivenSeveralReplicasFollowsTheLeaderAndNeverObeysAStandby) {
  ControllerRig rig;
  ASSERT_TRUE(rig.ok());
  controller::Controller& c = *rig.c;
  // A standby: a controller that has not rebuilt (does not serve), with its own API.
  controller::Controller standby(rig.store.get(), &rig.clock, controller::MakeSchedulerPlacement(), nullptr);
  controller::ApiServer standby_api(&standby, "tok");
  const int standby_port = *standby_api.Bind("127.0.0.1", 0);
  standby_api.Start();
  const std::string standby_url = "http://127.0.0.1:" + std::to_string(standby_port);
  const std::string gone_url = ClosedPortUrl();
  ASSERT_FALSE(gone_url.empty());

  FakeGpuSource source({{0, "GPU-f0", "NVIDIA L4", 23034, 0, 0, 0}});
  QuotaRegions regions(rig.dir + "/regions");
  NodeAgentOptions options{gone_url + "," + standby_url + "," + rig.url(), "tok", "host-f", "", "", ""};
  NodeAgent agent(options, &source, &regions, &rig.clock);
  ASSERT_TRUE(agent.Start().ok());
  auto a = c.Allocate({"", "", 10, 100, 1, "", ""});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(agent.HeartbeatOnce().ok());
  ASSERT_TRUE(agent.SyncAllocations().ok());
  uint32_t index = 0;
  EXPECT_EQ(regions.region("GPU-f0")->FindVgpu(a->id.c_str(), &index), limiter::RegionError::kOk);

  NodeAgentOptions behind_standby = options;
  behind_standby.controller_url = standby_url;
  NodeAgent lost(behind_standby, &source, &regions, &rig.clock);
  EXPECT_FALSE(lost.SyncAllocations().ok()) << "a standby's answer is no answer";
  EXPECT_EQ(regions.region("GPU-f0")->FindVgpu(a->id.c_str(), &index), limiter::RegionError::kOk)
      << "the tenant's vGPU stays";
  standby_api.Stop();
}

// Request, limit and QoS of an allocation reach the vGPU in the region, and the agent's metrics
// show per vGPU its request, limit, GPU-busy and throttled seconds (HELP/TYPE lines included).
TEST(NodeAgent, AnAllocationInAPoolThatOversellsVramGetsTieringInTheRegion) {
  ControllerRig rig;
  ASSERT_TRUE(rig.ok());
  controller::Controller& c = *rig.c;
  FakeGpuSource source({{0, "GPU-t0", "NVIDIA L4", 23034, 0, 0, 0}});
  QuotaRegions regions(rig.dir + "/regions");
  NodeAgent agent({rig.url(), "tok", "host-t", "", "", ""}, &source, &regions, &rig.clock);
  ASSERT_TRUE(agent.Start().ok());
  controller::AllocationRequest plain_req{"", "", 0, 1024, 1, "low", ""};
  plain_req.percent = 10;
  auto plain = c.Allocate(plain_req);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  ASSERT_TRUE(c.PatchPool("default", std::nullopt, 100, std::nullopt, std::nullopt).ok());
  controller::AllocationRequest req{"", "", 0, 1024, 1, "low", ""};
  req.percent = 10;
  auto a = c.Allocate(req);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(a->tiering);
  ASSERT_TRUE(agent.SyncAllocations().ok());
  limiter::GpuRegion* r = regions.region("GPU-t0");
  ASSERT_NE(r, nullptr);
  uint32_t index = 0;
  ASSERT_EQ(r->FindVgpu(a->id.c_str(), &index), limiter::RegionError::kOk);
  EXPECT_EQ(r->TierOfVgpu(index)->enabled.load(), 1u);
  EXPECT_EQ(r->TierOfVgpu(index)->idle_swap_ms.load(), 10'000u) << "the low QoS default";
  const uint32_t tiered = index;
  ASSERT_EQ(r->FindVgpu(plain->id.c_str(), &index), limiter::RegionError::kOk);
  EXPECT_EQ(r->TierOfVgpu(index)->enabled.load(), 0u) << "placed before the pool oversold VRAM";

  // A freeze through the API reaches the vGPU's processes once, however often the agent syncs.
  EXPECT_EQ(c.RequestTier(plain->id, true).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c.RequestTier(a->id, true).ok());
  ASSERT_TRUE(agent.SyncAllocations().ok());
  ASSERT_TRUE(agent.SyncAllocations().ok());
  EXPECT_EQ(r->TierOfVgpu(tiered)->freeze_gen.load(), 1u);
  EXPECT_EQ(r->TierOfVgpu(tiered)->thaw_gen.load(), 0u);
  // What its processes report comes back with the heartbeat.
  uint32_t slot = 0;
  ASSERT_EQ(r->AttachProcess(tiered, getpid(), &slot), limiter::RegionError::kOk);
  r->TierOfProcess(slot)->movable_bytes.store(64u << 20);
  r->TierOfProcess(slot)->host_bytes.store(64u << 20);
  r->TierOfProcess(slot)->state.store(limiter::kTierSwapped);
  ASSERT_TRUE(agent.HeartbeatOnce().ok());
  StatusOr<controller::VgpuUse> use = c.GetVgpuUse(a->id, "GPU-t0");
  ASSERT_TRUE(use.ok()) << use.status().ToString();
  EXPECT_EQ(use->tier_state, "swapped");
  EXPECT_EQ(use->swapped_bytes, int64_t{64} << 20);
  // ... and its processes (the console lists them).
  ASSERT_EQ(use->processes.size(), 1u);
  EXPECT_EQ(use->processes[0].pid, getpid());
  r->DetachProcess(slot);
}

// A suspended allocation's vGPU is held in the region (swapped out, GPU calls wait) with the least
// compute share; an agent restarted meanwhile keeps it held; when the controller resumes the
// allocation the hold is lifted, the share restored and a thaw requested.
TEST(NodeAgent, ASuspendedAllocationIsHeldAcrossAnAgentRestartAndReleasedOnResume) {
  ControllerRig rig;
  ASSERT_TRUE(rig.ok());
  controller::Controller& c = *rig.c;
  FakeGpuSource source({{0, "GPU-h0", "NVIDIA L4", 23034, 0, 0, 0}});
  ASSERT_TRUE(c.PatchPool("default", std::nullopt, 100, std::nullopt, std::nullopt).ok());
  NodeAgentOptions options{rig.url(), "tok", "host-h", "", "", ""};
  options.credential_file = rig.dir + "/agent/node-credential";  // the restarted agent is the same node
  auto regions = std::make_unique<QuotaRegions>(rig.dir + "/regions");
  auto agent = std::make_unique<NodeAgent>(options, &source, regions.get(), &rig.clock);
  ASSERT_TRUE(agent->Start().ok());
  controller::AllocationRequest low_req{"", "", 0, 1024, 1, "low", ""};
  low_req.percent = 60;
  auto low = c.Allocate(low_req);
  ASSERT_TRUE(low.ok()) << low.status().ToString();
  ASSERT_TRUE(agent->SyncAllocations().ok());
  controller::AllocationRequest crit_req{"", "", 0, 1024, 1, "critical", ""};
  crit_req.percent = 60;
  std::vector<controller::Allocation> preempted;
  auto crit = c.Allocate(crit_req, &preempted);
  ASSERT_TRUE(crit.ok()) << crit.status().ToString();
  ASSERT_EQ(preempted.size(), 1u);
  ASSERT_TRUE(preempted[0].suspended);
  ASSERT_TRUE(agent->SyncAllocations().ok());
  auto check_held = [&](limiter::GpuRegion* r, bool held) {
    uint32_t index = 0;
    ASSERT_EQ(r->FindVgpu(low->id.c_str(), &index), limiter::RegionError::kOk);
    EXPECT_EQ(r->TierOfVgpu(index)->held.load(), held ? 1u : 0u);
    auto snap = std::make_unique<limiter::RegionSnapshot>();
    r->Snapshot(snap.get());
    for (uint32_t i = 0; i < snap->vgpu_count; ++i) {
      if (snap->vgpus[i].index != index) continue;
      EXPECT_EQ(snap->vgpus[i].held, held);
      EXPECT_EQ(snap->vgpus[i].compute_share_ppm, held ? kHeldSharePpm : 600'000u);
    }
  };
  check_held(regions->region("GPU-h0"), true);
  const uint32_t thaws_before = [&] {
    uint32_t index = 0;
    regions->region("GPU-h0")->FindVgpu(low->id.c_str(), &index);
    return regions->region("GPU-h0")->TierOfVgpu(index)->thaw_gen.load();
  }();

  // The agent restarts: the region and the controller still say held.
  agent.reset();
  regions = std::make_unique<QuotaRegions>(rig.dir + "/regions");
  agent = std::make_unique<NodeAgent>(options, &source, regions.get(), &rig.clock);
  ASSERT_TRUE(agent->Start().ok());
  ASSERT_TRUE(agent->SyncAllocations().ok());
  check_held(regions->region("GPU-h0"), true);

  // The preemptor goes: the controller resumes the allocation and the agent lifts the hold.
  ASSERT_TRUE(c.Release(crit->id).ok());
  ASSERT_FALSE(c.GetAllocation(low->id)->suspended);
  ASSERT_TRUE(agent->SyncAllocations().ok());
  check_held(regions->region("GPU-h0"), false);
  uint32_t index = 0;
  ASSERT_EQ(regions->region("GPU-h0")->FindVgpu(low->id.c_str(), &index), limiter::RegionError::kOk);
  EXPECT_EQ(regions->region("GPU-h0")->TierOfVgpu(index)->thaw_gen.load(), thaws_before + 1);
}

TEST(NodeAgent, RequestLimitAndQosReachTheRegionAndTheMetrics) {
  ControllerRig rig;
  ASSERT_TRUE(rig.ok());
  controller::Controller& c = *rig.c;
  FakeGpuSource source({{0, "GPU-q0", "NVIDIA L4", 23034, 0, 0, 0}});
  QuotaRegions regions(rig.dir + "/regions");
  NodeAgent agent({rig.url(), "tok", "host-q", "", "", ""},
                  &source, &regions, &rig.clock);
  ASSERT_TRUE(agent.Start().ok());

  controller::AllocationRequest req{"", "", 0, 1024, 1, "high", ""};
  req.percent = 25;
  req.percent_limit = 100;
  auto a = c.Allocate(req);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(agent.SyncAllocations().ok());
  limiter::GpuRegion* r = regions.region("GPU-q0");
  ASSERT_NE(r, nullptr);
  uint32_t index = 0;
  ASSERT_EQ(r->FindVgpu(a->id.c_str(), &index), limiter::RegionError::kOk);
  // Some use and some throttled time, charged the way the limiter charges it.
  uint32_t slot = 0;
  ASSERT_EQ(r->AttachProcess(index, getpid(), &slot), limiter::RegionError::kOk);
  const int64_t now = limiter::MonotonicNowNs();
  r->ShareTick(slot, now, 200'000'000, 150'000'000, false, true);
  auto snap = std::make_unique<limiter::RegionSnapshot>();
  r->Snapshot(snap.get());
  ASSERT_EQ(snap->vgpu_count, 1u);
  const limiter::VgpuInfo& v = snap->vgpus[0];
  EXPECT_EQ(v.compute_share_ppm, 250000u);
  EXPECT_EQ(v.compute_limit_ppm, 1000000u);
  EXPECT_EQ(v.qos, 2u);  // high

  // The exposition is valid (the strict parser also checks the naming conventions) and carries
  // the vGPU's request, limit and counters under labels node, gpu, vgpu, qos.
  tf::testing::ParsedExposition m;
  ASSERT_EQ(tf::testing::ParseExposition(agent.MetricsText(), &m), "") << agent.MetricsText();
  const std::map<std::string, std::string> labels = {
      {"node", agent.node_name()}, {"gpu", "GPU-q0"}, {"vgpu", a->id}, {"qos", "high"}};
  EXPECT_EQ(m.families["tf_vgpu_busy_seconds_total"].type, "counter");
  EXPECT_EQ(m.families["tf_vgpu_throttled_seconds_total"].type, "counter");
  EXPECT_EQ(m.families["tf_vgpu_compute_request_ratio"].type, "gauge");
  EXPECT_EQ(m.Value("tf_vgpu_compute_request_ratio", labels), 0.25);
  EXPECT_EQ(m.Value("tf_vgpu_compute_limit_ratio", labels), 1.0);
  EXPECT_EQ(m.Value("tf_vgpu_busy_seconds_total", labels), v.busy_ns_total / 1e9);
  EXPECT_EQ(m.Value("tf_vgpu_throttled_seconds_total", labels), v.throttled_ns_total / 1e9);
  // The held tick above followed no verdict (a fresh process): counted under "others". The three
  // families add up to the throttled seconds.
  EXPECT_GT(v.throttled_ns_total, 0u);
  EXPECT_EQ(m.Value("tf_vgpu_held_turn_seconds_total", labels), 0);
  EXPECT_EQ(m.Value("tf_vgpu_held_limit_seconds_total", labels), 0);
  EXPECT_EQ(m.Value("tf_vgpu_held_others_seconds_total", labels), v.throttled_ns_total / 1e9);
  // An allocation past the vGPU's 1 GiB ceiling is refused (the tenant's CUDA out-of-memory
  // error) and counted, so that it is seen off the node too.
  EXPECT_EQ(m.families["tf_vgpu_vram_refusals_total"].type, "counter");
  EXPECT_EQ(m.Value("tf_vgpu_vram_refusals_total", labels), 0);
  ASSERT_EQ(r->Reserve(slot, 768u << 20), limiter::RegionError::kOk);
  EXPECT_EQ(r->Reserve(slot, 512u << 20), limiter::RegionError::kOutOfMemory);
  EXPECT_EQ(r->Reserve(slot, 512u << 20), limiter::RegionError::kOutOfMemory);
  EXPECT_EQ(Metric(agent, "tf_vgpu_vram_refusals_total", labels), 2);
  EXPECT_EQ(Metric(agent, "tf_vgpu_vram_used_bytes", labels), 768.0 * 1024 * 1024) << "a refusal holds nothing";
  ASSERT_EQ(r->Release(slot, 768u << 20), limiter::RegionError::kOk);
  // VRAM tiering: per-GPU swap counters always; per-vGPU tier gauges for a vGPU with tiering.
  EXPECT_EQ(m.Value("tf_gpu_swap_outs_total", {{"gpu", "GPU-q0"}}), 0);
  EXPECT_TRUE(m.families["tf_vgpu_tier_host_bytes"].samples.empty()) << "tiering is off for this vGPU";
  ASSERT_EQ(r->SetTierPolicy(index, true, 10'000), limiter::RegionError::kOk);
  r->TierOfProcess(slot)->movable_bytes.store(3u << 20);
  r->TierOfProcess(slot)->host_bytes.store(2u << 20);
  r->TierOfProcess(slot)->state.store(limiter::kTierSwapped);
  tf::testing::ParsedExposition tiered;
  ASSERT_EQ(tf::testing::ParseExposition(agent.MetricsText(), &tiered), "");
  EXPECT_EQ(tiered.Value("tf_vgpu_tier_host_bytes", labels), 2097152);
  EXPECT_EQ(tiered.Value("tf_vgpu_tier_swapped_processes", labels), 1);

  // The heartbeat carries the same counters to the controller (tfusion top shows them).
  ASSERT_TRUE(agent.HeartbeatOnce().ok());
  rig.clock.AdvanceMs(1'000);
  r->ShareTick(slot, now + 1'000'000'000, 1'000'000'000, 100'000'000, false, false);
  ASSERT_TRUE(agent.HeartbeatOnce().ok());
  StatusOr<controller::VgpuUse> use = c.GetVgpuUse(a->id, "GPU-q0");
  ASSERT_TRUE(use.ok()) << use.status().ToString();
  EXPECT_NEAR(use->use_percent, 10.0, 1e-6);  // 100 ms charged in the 1 s between heartbeats
  EXPECT_NEAR(use->throttled_seconds, v.throttled_ns_total / 1e9, 1e-9);
  EXPECT_EQ(use->turn_seconds, 0) << "reported (none of it waiting for turns), so not -1";
  r->DetachProcess(slot);
}

// The region is shared memory any tenant of the GPU can write. Counters and sizes a tenant set past
// what the controller accepts are reported clamped, so the node's heartbeat (every allocation's
// use, and the node staying alive) is never refused for them.
TEST(NodeAgent, CountersATenantScribbledOnStillHeartbeatClamped) {
  ControllerRig rig;
  ASSERT_TRUE(rig.ok());
  controller::Controller& c = *rig.c;
  FakeGpuSource source({{0, "GPU-s0", "NVIDIA L4", 23034, 0, 0, 0}});
  QuotaRegions regions(rig.dir + "/regions");
  NodeAgent agent({rig.url(), "tok", "host-s", "", "", ""}, &source, &regions, &rig.clock);
  ASSERT_TRUE(agent.Start().ok());
  controller::AllocationRequest req{"", "", 0, 1024, 1, "high", ""};
  req.percent = 25;
  auto a = c.Allocate(req);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(agent.SyncAllocations().ok());
  limiter::GpuRegion* r = regions.region("GPU-s0");
  ASSERT_NE(r, nullptr);
  uint32_t index = 0, slot = 0;
  ASSERT_EQ(r->FindVgpu(a->id.c_str(), &index), limiter::RegionError::kOk);
  ASSERT_EQ(r->AttachProcess(index, getpid(), &slot), limiter::RegionError::kOk);
  // As a tenant would: straight into the file, at the offsets of docs/shm-layout.md.
  int fd = ::open(r->path(), O_RDWR);
  ASSERT_GE(fd, 0);
  const uint64_t huge = ~uint64_t{0};
  const off_t vgpu = 512 + 256 * static_cast<off_t>(index);
  for (off_t field : {vgpu + 208, vgpu + 216, vgpu + 128, 16896 + 64 * static_cast<off_t>(slot) + 24})
    ASSERT_EQ(::pwrite(fd, &huge, sizeof huge, field), static_cast<ssize_t>(sizeof huge));
  ::close(fd);
  ASSERT_TRUE(agent.HeartbeatOnce().ok()) << "a scribbled region must not get the heartbeat refused";
  StatusOr<controller::VgpuUse> use = c.GetVgpuUse(a->id, "GPU-s0");
  ASSERT_TRUE(use.ok()) << use.status().ToString();
  EXPECT_NEAR(use->throttled_seconds, static_cast<double>(INT64_MAX) / 1e9, 1.0);
  EXPECT_NEAR(use->turn_seconds, static_cast<double>(INT64_MAX) / 1e9, 1.0);

  // Text that is not UTF-8 (a vGPU id, the GPU's name) and an idle timeout past 30 days: the
  // heartbeat is still encoded and accepted, and the metrics still parse.
  uint32_t other = 0;
  ASSERT_EQ(r->CreateOrUpdateVgpu("a-0000000000000abc", 1 << 20, 100'000, &other), limiter::RegionError::kOk);
  ASSERT_EQ(r->SetTierPolicy(index, true, 10'000), limiter::RegionError::kOk);
  r->TierOfVgpu(index)->idle_swap_ms.store(huge);
  fd = ::open(r->path(), O_RDWR);
  ASSERT_GE(fd, 0);
  const char bad[] = "\xff\xfe\x1b[2J";
  ASSERT_EQ(::pwrite(fd, bad, 4, 512 + 256 * static_cast<off_t>(other) + 64 + 2), 4);  // inside the id
  ASSERT_EQ(::pwrite(fd, bad, 4, 192), 4);                                              // the GPU's name
  ::close(fd);
  ASSERT_TRUE(agent.HeartbeatOnce().ok());
  tf::testing::ParsedExposition m;
  ASSERT_EQ(tf::testing::ParseExposition(agent.MetricsText(), &m), "") << agent.MetricsText();
  EXPECT_NE(agent.MetricsText().find("vgpu=\"a-???[000000000abc\""), std::string::npos) << agent.MetricsText();
  r->DetachProcess(slot);
}

// A child process that stands for a tenant: it ignores SIGTERM when asked to (a tenant that does
// not shut down), tells the parent it is ready, then waits to be killed. With `vgpu` it is what
// the agent takes for a tenant of that vGPU (IsTenantOfRegion): a program started with
// TFUSION_VGPU=`vgpu` that maps the region file `region` (none if empty); without, a fork of this
// process.
pid_t StartTenant(bool ignore_sigterm, const std::string& vgpu = "", const std::string& region = "") {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    if (ignore_sigterm) signal(SIGTERM, SIG_IGN);  // kept across exec
    if (!vgpu.empty()) {
      const std::string env = "TFUSION_VGPU=" + vgpu;
      const std::string fd = std::to_string(fds[1]);
      const char* script =
          "import mmap, os, signal, sys\n"
          "if sys.argv[1]:\n"
          "    f = open(sys.argv[1], 'r+b')\n"
          "    m = mmap.mmap(f.fileno(), 0)\n"
          "os.write(int(sys.argv[2]), b'1')\n"
          "while True:\n"
          "    signal.pause()\n";
      char* const argv[] = {const_cast<char*>("python3"), const_cast<char*>("-c"), const_cast<char*>(script),
                            const_cast<char*>(region.c_str()), const_cast<char*>(fd.c_str()), nullptr};
      char* const envp[] = {const_cast<char*>(env.c_str()), const_cast<char*>("PATH=/usr/bin:/bin"), nullptr};
      execvpe("python3", argv, envp);
      _exit(127);
    }
    char c = 1;
    if (write(fds[1], &c, 1) != 1) _exit(3);
    for (;;) pause();
  }
  char c;
  if (read(fds[0], &c, 1) != 1) pid = -1;
  close(fds[0]);
  close(fds[1]);
  return pid;
}

// The signal that ended `pid` (waits for it), or 0 when it is still running after `ms`.
int EndedBySignal(pid_t pid, int ms) {
  for (int waited = 0; waited <= ms; waited += 10) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFSIGNALED(status) ? WTERMSIG(status) : -1;
    usleep(10'000);
  }
  return 0;
}

class StopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tfagent-XXXXXX";
    dir_ = mkdtemp(tmpl);
    store_ = std::move(controller::SqliteStore::Open(dir_ + "/s.db")).value();
    c_ = std::make_unique<controller::Controller>(store_.get(), &clock_, controller::MakeSchedulerPlacement(), nullptr);
    ASSERT_TRUE(c_->Rebuild().ok());
    api_ = std::make_unique<controller::ApiServer>(c_.get(), "tok");
    int port = *api_->Bind("127.0.0.1", 0);
    api_->Start();
    regions_ = std::make_unique<QuotaRegions>(dir_ + "/regions");
    NodeAgentOptions o{"http://127.0.0.1:" + std::to_string(port), "tok", "host-s", "", "", "", 5'000};
    agent_ = std::make_unique<NodeAgent>(o, &source_, regions_.get(), &clock_);
    ASSERT_TRUE(agent_->Start().ok());
  }
  void TearDown() override {
    for (pid_t p : tenants_) {  // a failed test must not leave a tenant behind
      if (waitpid(p, nullptr, WNOHANG) != 0) continue;  // already reaped (or just now)
      kill(p, SIGKILL);
      waitpid(p, nullptr, 0);
    }
    api_->Stop();
    std::filesystem::remove_all(dir_);
  }
  // A tenant (StartTenant) this test kills if it fails; with `vgpu`, one of that vGPU.
  pid_t Tenant(bool ignore_sigterm, const std::string& vgpu = "") {
    pid_t p = StartTenant(ignore_sigterm, vgpu, vgpu.empty() ? "" : regions_->region("GPU-s0")->path());
    if (p > 0) tenants_.push_back(p);
    return p;
  }
  // Allocates on the one GPU, syncs the agent and starts a tenant of the vGPU for each of
  // `ignore_sigterm` (their pids in `tenants`), registered on it as its limiter would.
  controller::Allocation AllocateAndUse(const std::string& qos, const std::vector<bool>& ignore_sigterm = {},
                                        std::vector<pid_t>* tenants = nullptr) {
    controller::AllocationRequest req{"", "", 0, 1024, 1, qos, ""};
    req.percent = 60;
    auto a = c_->Allocate(req);
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_TRUE(agent_->SyncAllocations().ok());
    limiter::GpuRegion* r = regions_->region("GPU-s0");
    uint32_t index = 0, slot = 0;
    EXPECT_EQ(r->FindVgpu(a->id.c_str(), &index), limiter::RegionError::kOk);
    for (bool ignore : ignore_sigterm) {
      const pid_t p = Tenant(ignore, a->id);
      EXPECT_GT(p, 0);
      EXPECT_EQ(r->AttachProcess(index, p, &slot), limiter::RegionError::kOk);
      if (tenants != nullptr) tenants->push_back(p);
    }
    return *a;
  }
  bool HasVgpu(const std::string& id) {
    uint32_t index = 0;
    return regions_->region("GPU-s0")->FindVgpu(id.c_str(), &index) == limiter::RegionError::kOk;
  }

  std::string dir_;
  controller::FakeClock clock_;
  std::unique_ptr<controller::Store> store_;
  std::unique_ptr<controller::Controller> c_;
  std::unique_ptr<controller::ApiServer> api_;
  FakeGpuSource source_{{{0, "GPU-s0", "NVIDIA L4", 23034, 0, 0, 0}}};
  std::unique_ptr<QuotaRegions> regions_;
  std::unique_ptr<NodeAgent> agent_;
  std::vector<pid_t> tenants_;
};

// Preemption stops the victim: SIGTERM to every process on its vGPU, SIGKILL to those still
// alive after the grace period, then the vGPU goes and the controller hears it.
TEST_F(StopTest, APreemptedVgpusProcessesGetSigtermThenSigkillAfterTheGrace) {
  std::vector<pid_t> pids;
  controller::Allocation low = AllocateAndUse("low", {false, true}, &pids);
  ASSERT_EQ(pids.size(), 2u);
  const pid_t polite = pids[0], stubborn = pids[1];
  controller::AllocationRequest req{"", "", 0, 1024, 1, "critical", ""};
  req.percent = 60;
  std::vector<controller::Allocation> preempted;
  auto crit = c_->Allocate(req, &preempted);
  ASSERT_TRUE(crit.ok()) << crit.status().ToString();
  ASSERT_EQ(preempted.size(), 1u);

  ASSERT_TRUE(agent_->SyncAllocations().ok());
  EXPECT_EQ(EndedBySignal(polite, 2000), SIGTERM);
  EXPECT_EQ(EndedBySignal(stubborn, 200), 0) << "within the grace period it is not killed";
  EXPECT_TRUE(HasVgpu(low.id));
  EXPECT_EQ(c_->GetEviction(low.id)->state, controller::EvictionState::kStopping);
  EXPECT_EQ(Metric(*agent_, "tf_node_vgpus_stopping"), 1);

  clock_.AdvanceMs(4'000);
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  EXPECT_EQ(EndedBySignal(stubborn, 200), 0);
  clock_.AdvanceMs(1'000);
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  EXPECT_EQ(EndedBySignal(stubborn, 2000), SIGKILL);

  ASSERT_TRUE(agent_->SyncAllocations().ok());
  EXPECT_FALSE(HasVgpu(low.id));
  EXPECT_TRUE(HasVgpu(crit->id));
  auto e = c_->GetEviction(low.id);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->state, controller::EvictionState::kStopped);
  EXPECT_EQ(e->processes_stopped, 2);
  EXPECT_EQ(Metric(*agent_, "tf_node_process_signals_total", {{"signal", "SIGTERM"}}), 2);
  EXPECT_EQ(Metric(*agent_, "tf_node_process_signals_total", {{"signal", "SIGKILL"}}), 1);
  EXPECT_EQ(Metric(*agent_, "tf_node_vgpu_stops_total", {{"reason", "preempted"}}), 1);
  EXPECT_EQ(Metric(*agent_, "tf_node_vgpus_stopping"), 0);
}

// Released by request while processes still use it: stopped too. A vGPU this agent never saw
// wanted (e.g. from before it restarted) is stopped when the controller has no such allocation;
// one that is not named after a controller allocation (a standalone `tfusion run`) is left to end
// on its own.
TEST_F(StopTest, AReleasedVgpuInUseIsStoppedAndSoIsOneTheControllerNoLongerHas) {
  std::vector<pid_t> pids;
  controller::Allocation a = AllocateAndUse("medium", {false}, &pids);
  ASSERT_EQ(pids.size(), 1u);
  const pid_t tenant = pids[0];
  ASSERT_TRUE(c_->Release(a.id).ok());
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  EXPECT_EQ(EndedBySignal(tenant, 2000), SIGTERM);
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  EXPECT_FALSE(HasVgpu(a.id));
  EXPECT_EQ(Metric(*agent_, "tf_node_vgpu_stops_total", {{"reason", "released"}}), 1);

  pid_t other = Tenant(false, "a-0000000000000bad");
  ASSERT_GT(other, 0);
  limiter::GpuRegion* r = regions_->region("GPU-s0");
  uint32_t index = 0, slot = 0;
  ASSERT_EQ(r->CreateOrUpdateVgpu("a-0000000000000bad", 1 << 20, 100'000, &index), limiter::RegionError::kOk);
  ASSERT_EQ(r->AttachProcess(index, other, &slot), limiter::RegionError::kOk);
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  EXPECT_EQ(EndedBySignal(other, 2000), SIGTERM) << "the controller has no allocation a-0000000000000bad";
  EXPECT_EQ(Metric(*agent_, "tf_node_vgpu_stops_total", {{"reason", "released"}}), 2);
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  EXPECT_FALSE(HasVgpu("a-0000000000000bad"));

  pid_t standalone = Tenant(false);
  ASSERT_GT(standalone, 0);
  ASSERT_EQ(r->CreateOrUpdateVgpu("run-4242", 1 << 20, 100'000, &index), limiter::RegionError::kOk);
  ASSERT_EQ(r->AttachProcess(index, standalone, &slot), limiter::RegionError::kOk);
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  EXPECT_EQ(EndedBySignal(standalone, 200), 0) << "not a controller allocation's vGPU";
  EXPECT_TRUE(HasVgpu("run-4242"));
  kill(standalone, SIGKILL);
  EXPECT_EQ(EndedBySignal(standalone, 2000), SIGKILL);
}

// A worker session or a `tfusion run` killed outright leaves its vGPU, and its lock file, which
// nobody holds any more. The agent removes such vGPUs at each sync, also on a node where no
// worker or `tfusion smi` runs; a vGPU whose lock is held (its run or session lives), and one
// without a lock file (made by an older version), stay.
TEST_F(StopTest, TheAgentRemovesTheVgpusOfSessionsAndRunsThatEndedWithoutRemovingThem) {
  const std::string dir = regions_->dir();
  // Takes the lock of `id` in a child, which keeps it until killed (or gives it up at once).
  auto locker = [&](const std::string& id, bool keep) {
    int ready[2];
    EXPECT_EQ(pipe(ready), 0);
    pid_t p = fork();
    if (p == 0) {
      std::string why;
      const bool ok = HoldSessionVgpuLock(dir, id, &why) >= 0;
      (void)!write(ready[1], ok ? "y" : "n", 1);
      if (keep) pause();
      _exit(0);
    }
    char c = 0;
    EXPECT_EQ(read(ready[0], &c, 1), 1);
    EXPECT_EQ(c, 'y') << id;
    close(ready[0]);
    close(ready[1]);
    if (!keep) waitpid(p, nullptr, 0);
    else tenants_.push_back(p);
    return p;
  };
  limiter::GpuRegion* r = regions_->region("GPU-s0");
  uint32_t index = 0;
  for (const char* id : {"run-4243", "remote-4244@a-x1", "run-4245", "run-4246", "my job/1", "shared"})
    ASSERT_EQ(r->CreateOrUpdateVgpu(id, 1 << 20, 100'000, &index), limiter::RegionError::kOk) << id;
  locker("run-4243", false);          // a run killed outright, its command gone
  locker("remote-4244@a-x1", false);  // a session that died with its worker
  locker("my job/1", false);          // `tfusion run --vgpu "my job/1"`: its one run killed outright
  const pid_t live = locker("run-4245", true);
  const pid_t live_named = locker("shared", true);  // one run of `--vgpu shared` ended, one lives
  locker("shared", false);
  // run-4246: no lock file.
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  EXPECT_FALSE(HasVgpu("run-4243"));
  EXPECT_FALSE(HasVgpu("remote-4244@a-x1"));
  EXPECT_FALSE(HasVgpu("my job/1"));
  EXPECT_NE(access((SessionLockDir(dir) + "/run-4243.lock").c_str(), F_OK), 0) << "its lock file goes with it";
  EXPECT_NE(access(SessionVgpuLockPath(dir, "my job/1").c_str(), F_OK), 0) << "its lock file goes with it";
  EXPECT_TRUE(HasVgpu("run-4245")) << "its run lives";
  EXPECT_TRUE(HasVgpu("shared")) << "a run of that name lives";
  EXPECT_TRUE(HasVgpu("run-4246")) << "nothing says it ended";
  kill(live, SIGKILL);
  waitpid(live, nullptr, 0);
  kill(live_named, SIGKILL);
  waitpid(live_named, nullptr, 0);
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  EXPECT_FALSE(HasVgpu("run-4245"));
  EXPECT_FALSE(HasVgpu("shared"));
  EXPECT_TRUE(HasVgpu("run-4246"));
}

// A session or run whose id a dead one of the same pid left (its worker or run killed outright,
// no sweep since: pids are reused) starts on a fresh vGPU instead of taking over the dead one's
// counters; an id still in use, or whose vGPU has no lock file of ours, is reported taken, and
// its vGPU kept.
TEST_F(StopTest, ASessionOrRunStartsAfreshWhereADeadOneOfTheSameIdLeftItsVgpu) {
  const std::string dir = regions_->dir();
  limiter::GpuRegion* r = regions_->region("GPU-s0");
  uint32_t index = 0, slot = 0;
  for (const char* id : {"remote-4250", "run-4251", "run-4252", "run-4253"})
    ASSERT_EQ(r->CreateOrUpdateVgpu(id, 1 << 20, 100'000, &index), limiter::RegionError::kOk) << id;
  // run-4251's lock: taken by a process that then died. run-4252's: held by a live one.
  std::string why;
  pid_t ended = fork();
  if (ended == 0) _exit(HoldSessionVgpuLock(dir, "run-4251", &why) >= 0 ? 0 : 1);
  int status = 0;
  ASSERT_EQ(waitpid(ended, &status, 0), ended);
  ASSERT_EQ(status, 0);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t holder = fork();
  if (holder == 0) {
    (void)!write(ready[1], HoldSessionVgpuLock(dir, "run-4252", &why) >= 0 ? "y" : "n", 1);
    pause();
    _exit(0);
  }
  tenants_.push_back(holder);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  close(ready[0]);
  close(ready[1]);
  ASSERT_EQ(r->AttachProcess(index, holder, &slot), limiter::RegionError::kOk);  // a live process uses run-4253
  ASSERT_EQ(r->Reserve(slot, 1 << 20), limiter::RegionError::kOk);
  // No lock file in our folder: another user's (whose lock we cannot see), an older version's, or
  // one of another PID namespace (whose processes this /proc cannot judge): left, and taken.
  EXPECT_FALSE(ClearEndedVgpuOfId(dir, "remote-4250"));
  EXPECT_TRUE(HasVgpu("remote-4250"));
  EXPECT_TRUE(ClearEndedVgpuOfId(dir, "run-4251"));
  EXPECT_FALSE(HasVgpu("run-4251"));
  EXPECT_NE(access(SessionVgpuLockPath(dir, "run-4251").c_str(), F_OK), 0) << "its lock file goes with it";
  EXPECT_FALSE(ClearEndedVgpuOfId(dir, "run-4252")) << "its lock is held";
  EXPECT_TRUE(HasVgpu("run-4252"));
  EXPECT_FALSE(ClearEndedVgpuOfId(dir, "run-4253")) << "a live process uses it";
  EXPECT_TRUE(HasVgpu("run-4253"));
  EXPECT_EQ(r->Used(index), uint64_t{1} << 20) << "its counters are left as they were";
  EXPECT_TRUE(ClearEndedVgpuOfId(dir, "run-4254")) << "no vGPU of that id";
}

// The region is shared memory any tenant can write: a slot that names some other process of the
// machine (its pid and start time copied from /proc) under a vGPU the controller does not have
// must not get that process signalled. Only a process that has the region mapped and was started
// for that vGPU is its tenant.
TEST_F(StopTest, AProcessThatIsNoTenantOfTheVgpuIsNeverSignalledWhateverTheRegionSays) {
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  limiter::GpuRegion* r = regions_->region("GPU-s0");
  ASSERT_NE(r, nullptr);
  // Not a tenant: a fresh program (exec drops the mappings it was forked with).
  pid_t bystander = fork();
  if (bystander == 0) {
    execl("/bin/sleep", "sleep", "30", static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_GT(bystander, 0);
  tenants_.push_back(bystander);
  usleep(100'000);  // past the exec
  uint32_t index = 0, slot = 0;
  ASSERT_EQ(r->CreateOrUpdateVgpu("a-00000000000000ff", 1 << 20, 100'000, &index), limiter::RegionError::kOk);
  ASSERT_EQ(r->AttachProcess(index, bystander, &slot), limiter::RegionError::kOk);  // pid and start time as /proc has them
  // Started for this vGPU, but without the region mapped.
  pid_t unmapped = StartTenant(false, "a-00000000000000ff", "");
  ASSERT_GT(unmapped, 0);
  tenants_.push_back(unmapped);
  uint32_t unmapped_slot = 0;
  ASSERT_EQ(r->AttachProcess(index, unmapped, &unmapped_slot), limiter::RegionError::kOk);
  // Another vGPU's tenant: it maps the region, but was started for a-0000000000000abc.
  pid_t neighbour = Tenant(false, "a-0000000000000abc");
  ASSERT_GT(neighbour, 0);
  uint32_t neighbour_slot = 0;
  ASSERT_EQ(r->AttachProcess(index, neighbour, &neighbour_slot), limiter::RegionError::kOk);
  pid_t tenant = Tenant(false, "a-00000000000000ff");  // maps the region, started for this vGPU
  ASSERT_GT(tenant, 0);
  uint32_t tenant_slot = 0;
  ASSERT_EQ(r->AttachProcess(index, tenant, &tenant_slot), limiter::RegionError::kOk);
  // As `tfusion run`: registered itself, without the variable, the parent of a tenant with it.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t wrapper = fork();
  if (wrapper == 0) {
    const pid_t command = StartTenant(false, "a-00000000000000ff", r->path());
    if (write(fds[1], &command, sizeof command) != sizeof command) _exit(3);
    for (;;) pause();
  }
  ASSERT_GT(wrapper, 0);
  tenants_.push_back(wrapper);
  pid_t command = -1;
  ASSERT_EQ(read(fds[0], &command, sizeof command), static_cast<ssize_t>(sizeof command));
  close(fds[0]);
  close(fds[1]);
  ASSERT_GT(command, 0);
  uint32_t wrapper_slot = 0;
  ASSERT_EQ(r->AttachProcess(index, wrapper, &wrapper_slot), limiter::RegionError::kOk);
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  EXPECT_EQ(EndedBySignal(tenant, 2000), SIGTERM) << "the controller has no allocation a-00000000000000ff";
  EXPECT_EQ(EndedBySignal(wrapper, 2000), SIGTERM) << "the parent of its tenant is stopped too";
  kill(command, SIGKILL);  // not registered: left to this test (it is the wrapper's child)
  clock_.AdvanceMs(10'000);  // past the grace period: what is left would get SIGKILL
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  EXPECT_EQ(EndedBySignal(bystander, 300), 0) << "a process started for no vGPU is not a tenant";
  EXPECT_EQ(EndedBySignal(unmapped, 300), 0) << "a process without the region mapped is not a tenant";
  EXPECT_EQ(EndedBySignal(neighbour, 300), 0) << "a process started for another vGPU is not its tenant";
  // Nor is it a worker session, whatever a session-shaped vGPU id says (remote-PID@a-...).
  uint32_t session_index = 0, session_slot = 0;
  const std::string session_id = "remote-" + std::to_string(neighbour) + "@a-00000000000000ee";
  ASSERT_EQ(r->CreateOrUpdateVgpu(session_id.c_str(), 1 << 20, 100'000, &session_index), limiter::RegionError::kOk);
  ASSERT_EQ(r->AttachProcess(session_index, neighbour, &session_slot), limiter::RegionError::kOk);
  clock_.AdvanceMs(10'000);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(agent_->SyncAllocations().ok());
  EXPECT_EQ(EndedBySignal(neighbour, 300), 0) << "a process started for a vGPU is no worker session";
  // Nor is the agent (this test process) one: it would not survive the next syncs.
  uint32_t self_index = 0, self_slot = 0;
  const std::string self_id = "remote-" + std::to_string(getpid()) + "@a-00000000000000dd";
  ASSERT_EQ(r->CreateOrUpdateVgpu(self_id.c_str(), 1 << 20, 100'000, &self_index), limiter::RegionError::kOk);
  ASSERT_EQ(r->AttachProcess(self_index, getpid(), &self_slot), limiter::RegionError::kOk);
  clock_.AdvanceMs(10'000);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(agent_->SyncAllocations().ok());
  r->DetachProcess(self_slot);
}

TEST(NodeAgent, NoDriverRegistersZeroGpus) {
  ControllerRig rig;
  ASSERT_TRUE(rig.ok());
  controller::Controller& c = *rig.c;
  NvmlGpuSource source("libnvidia-ml-does-not-exist.so.1");
  QuotaRegions regions(rig.dir + "/regions");
  NodeAgent agent({rig.url(), "tok", "cpu-host", "", "", ""},
                  &source, &regions, &rig.clock);
  ASSERT_TRUE(agent.Start().ok());
  EXPECT_NE(agent.discovery_message().find("no NVIDIA driver"), std::string::npos);
  EXPECT_EQ(c.ListNodes().size(), 1u);
  EXPECT_TRUE(c.ListGpus("").empty());
}

// Per-vGPU idle overrides: the agent writes the allocation's own timeouts into its region instead
// of the QoS defaults, follows a change made on the live allocation at its next sync (and a
// return to the defaults), and reports what the region holds with its heartbeat.
TEST(NodeAgent, AnAllocationsIdleOverridesReachTheRegionAndFollowChanges) {
  ControllerRig rig;
  ASSERT_TRUE(rig.ok());
  controller::Controller& c = *rig.c;
  FakeGpuSource source({{0, "GPU-i0", "NVIDIA L4", 23034, 0, 0, 0}});
  QuotaRegions regions(rig.dir + "/regions");
  NodeAgent agent({rig.url(), "tok", "host-i", "", "", ""}, &source, &regions, &rig.clock);
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_TRUE(c.PatchPool("default", std::nullopt, 100, std::nullopt, std::nullopt).ok());
  controller::AllocationRequest req{"", "", 0, 1024, 1, "low", ""};
  req.percent = 10;
  req.idle_swap_ms = 2'500;
  req.idle_disk_ms = 0;
  auto a = c.Allocate(req);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(agent.SyncAllocations().ok());
  limiter::GpuRegion* r = regions.region("GPU-i0");
  ASSERT_NE(r, nullptr);
  uint32_t index = 0;
  ASSERT_EQ(r->FindVgpu(a->id.c_str(), &index), limiter::RegionError::kOk);
  limiter::VgpuTier* t = r->TierOfVgpu(index);
  EXPECT_EQ(t->enabled.load(), 1u);
  EXPECT_EQ(t->idle_swap_ms.load(), 2'500u) << "the override, not the low QoS default (10 s)";
  EXPECT_EQ(t->idle_disk_ms.load(), 0u) << "0: never to disk, not the low QoS default (2 min)";

  // Changed on the live allocation: applied at the next sync.
  controller::TierIdleChange change;
  change.idle_swap_ms = std::optional<int64_t>{90'000};
  ASSERT_TRUE(c.SetTierIdle(a->id, change).ok());
  ASSERT_TRUE(agent.SyncAllocations().ok());
  EXPECT_EQ(t->idle_swap_ms.load(), 90'000u);
  EXPECT_EQ(t->idle_disk_ms.load(), 0u);
  // The heartbeat reports what the region holds.
  ASSERT_TRUE(agent.HeartbeatOnce().ok());
  StatusOr<controller::VgpuUse> use = c.GetVgpuUse(a->id, "GPU-i0");
  ASSERT_TRUE(use.ok()) << use.status().ToString();
  EXPECT_EQ(use->applied_idle_swap_ms, 90'000);
  EXPECT_EQ(use->applied_idle_disk_ms, 0);
  // Back to the QoS defaults.
  change.idle_swap_ms = std::optional<int64_t>{};
  change.idle_disk_ms = std::optional<int64_t>{};
  ASSERT_TRUE(c.SetTierIdle(a->id, change).ok());
  ASSERT_TRUE(agent.SyncAllocations().ok());
  EXPECT_EQ(t->idle_swap_ms.load(), limiter::DefaultIdleSwapMs(0));
  EXPECT_EQ(t->idle_disk_ms.load(), limiter::DefaultIdleDiskMs(0));
}

// Scale to zero: the allocation's idle_zero_ms reaches the region (and the heartbeat), and each
// freeze at level zero becomes one freeze and one zero request in the region, once, also across
// an agent restart (the counters live in the region).
TEST(NodeAgent, IdleZeroAndZeroRequestsReachTheRegionOnce) {
  ControllerRig rig;
  ASSERT_TRUE(rig.ok());
  controller::Controller& c = *rig.c;
  FakeGpuSource source({{0, "GPU-z0", "NVIDIA L4", 23034, 0, 0, 0}});
  QuotaRegions regions(rig.dir + "/regions");
  NodeAgent agent({rig.url(), "tok", "host-z", "", "", ""}, &source, &regions, &rig.clock);
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_TRUE(c.PatchPool("default", std::nullopt, 100, std::nullopt, std::nullopt).ok());
  controller::AllocationRequest req{"", "", 0, 1024, 1, "low", ""};
  req.percent = 10;
  req.idle_zero_ms = 45'000;
  auto a = c.Allocate(req);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(agent.SyncAllocations().ok());
  limiter::GpuRegion* r = regions.region("GPU-z0");
  ASSERT_NE(r, nullptr);
  uint32_t index = 0;
  ASSERT_EQ(r->FindVgpu(a->id.c_str(), &index), limiter::RegionError::kOk);
  limiter::VgpuTier* t = r->TierOfVgpu(index);
  EXPECT_EQ(t->idle_zero_ms.load(), 45'000u);
  ASSERT_TRUE(agent.HeartbeatOnce().ok());
  EXPECT_EQ(c.GetVgpuUse(a->id, "GPU-z0")->applied_idle_zero_ms, 45'000);

  const uint32_t freeze0 = t->freeze_gen.load(), zero0 = t->zero_gen.load();
  ASSERT_TRUE(c.RequestTier(a->id, true, true).ok());
  ASSERT_TRUE(agent.SyncAllocations().ok());
  EXPECT_EQ(t->freeze_gen.load(), freeze0 + 1);
  EXPECT_EQ(t->zero_gen.load(), zero0 + 1);
  ASSERT_TRUE(agent.SyncAllocations().ok());
  EXPECT_EQ(t->zero_gen.load(), zero0 + 1) << "one request, passed on once";
  {
    NodeAgent restarted({rig.url(), "tok", "host-z", "", "", ""}, &source, &regions, &rig.clock);
    ASSERT_TRUE(restarted.SyncAllocations().ok());
  }
  EXPECT_EQ(t->zero_gen.load(), zero0 + 1) << "a restarted agent does not repeat it";
  ASSERT_TRUE(c.RequestTier(a->id, true, false).ok());  // a plain freeze: no zero request
  ASSERT_TRUE(agent.SyncAllocations().ok());
  EXPECT_EQ(t->freeze_gen.load(), freeze0 + 2);
  EXPECT_EQ(t->zero_gen.load(), zero0 + 1);
  // With no process on the vGPU, the agent's zero keeper has nothing to wait for.
  bool done = false;
  for (int i = 0; i < 100 && !done; ++i) {
    done = t->zero_done_gen.load() == t->zero_gen.load();
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(done);
}

// The agent sets the host tier budget it was given on every GPU's region and reports it, with the
// free space of its disk tier folder, at registration: the controller then bounds the pool's VRAM
// expansion on this node by them.
TEST(NodeAgent, ReportsItsHostAndDiskTierBudgets) {
  ControllerRig rig;
  ASSERT_TRUE(rig.ok());
  controller::Controller& c = *rig.c;
  ASSERT_TRUE(c.PatchPool("default", std::nullopt, 100, 100, std::nullopt).ok());
  FakeGpuSource source({{0, "GPU-b0", "NVIDIA L4", 23034, 0, 0, 0}, {1, "GPU-b1", "NVIDIA L4", 23034, 0, 0, 0}});
  QuotaRegions regions(rig.dir + "/regions");
  NodeAgentOptions options{rig.url(), "tok", "host-b", "", "", ""};
  options.host_tier_budget_bytes = int64_t{3} << 30;
  options.disk_tier_dir = rig.dir;
  NodeAgent agent(options, &source, &regions, &rig.clock);
  ASSERT_TRUE(agent.Start().ok());
  auto snap = std::make_unique<limiter::RegionSnapshot>();
  regions.region("GPU-b0")->Snapshot(snap.get());
  EXPECT_EQ(snap->host_tier_budget_bytes, uint64_t{3} << 30);
  const TierBudgetReport report = agent.TierBudgets();
  EXPECT_EQ(report.host_mib.at("GPU-b1"), 3072);
  EXPECT_GE(report.disk_mib, 1024) << "the test folder's file system has at least 1 GiB free";
  EXPECT_EQ(report.disk_mib % 1024, 0) << "whole GiB";

  StatusOr<controller::NodeStatus> node = c.GetNode("host-b");
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(node->node.disk_tier_budget_mib, report.disk_mib);
  for (const controller::GpuStatus& g : c.ListGpus("")) {
    EXPECT_EQ(g.gpu.host_tier_budget_mib, 3072);
    // Each GPU: its VRAM + its 3 GiB host tier + half the disk tier (two GPUs), each at most the
    // pool's 100% of VRAM.
    EXPECT_EQ(g.schedulable_vram_mib, 23034 + 3072 + std::min<int64_t>(23034, report.disk_mib / 2));
  }
}

}  // namespace
}  // namespace tf::hypervisor

namespace tf::hypervisor {

// A worker session bound to an allocation ("remote-PID@a-...", made by `tfusion worker` for a
// pooled run placed on this node): once its process has bound to it, the agent adopts the
// allocation's earlier requests without carrying them out, applies the allocation's idle timeouts,
// and passes each new freeze, zero and thaw on, once. A zero request is refused (neither the
// freeze nor the zero reaches the session) while no worker's zero keeper holds the lock. The
// heartbeat counts the session's process as the allocation's.
TEST(NodeAgent, AnAllocationsTierRequestsReachTheRemoteSessionsBoundToIt) {
  ControllerRig rig;
  ASSERT_TRUE(rig.ok());
  controller::Controller& c = *rig.c;
  FakeGpuSource source({{0, "GPU-s0", "NVIDIA L4", 23034, 0, 0, 0}});
  QuotaRegions regions(rig.dir + "/regions");
  NodeAgent agent({rig.url(), "tok", "host-s", "", "", ""}, &source, &regions, &rig.clock);
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_TRUE(c.PatchPool("default", std::nullopt, 100, std::nullopt, std::nullopt).ok());
  controller::AllocationRequest req{"", "", 0, 1024, 1, "low", ""};
  req.percent = 10;
  req.idle_swap_ms = 1'000;
  req.idle_zero_ms = 5'000;
  auto a = c.Allocate(req);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(c.RequestTier(a->id, true, true).ok());  // made before the session exists
  ASSERT_TRUE(agent.SyncAllocations().ok());
  limiter::GpuRegion* r = regions.region("GPU-s0");
  ASSERT_NE(r, nullptr);

  // What the worker does for the session (PrepareVgpu with its own timeouts, then the mark), and
  // the session process binding to it.
  const std::string vgpu = SessionVgpuId(getpid(), a->id);
  EXPECT_EQ(BoundAllocation(vgpu), a->id);
  EXPECT_EQ(BoundAllocation("remote-12@a-../x"), "");
  uint32_t index = 0, slot = 0;
  ASSERT_EQ(r->CreateOrUpdateVgpu(vgpu.c_str(), 1ull << 30, 100'000, 100'000, 0, &index), limiter::RegionError::kOk);
  ASSERT_EQ(r->SetTierPolicy(index, true, 600'000, 0), limiter::RegionError::kOk);
  ASSERT_TRUE(MarkSessionVgpuNotAdopted(r->path(), vgpu).ok());
  limiter::VgpuTier* t = r->TierOfVgpu(index);
  const uint32_t freeze0 = t->freeze_gen.load(), zero0 = t->zero_gen.load(), thaw0 = t->thaw_gen.load();
  ASSERT_TRUE(agent.SyncAllocations().ok());
  EXPECT_EQ(t->freeze_gen.load(), freeze0) << "not bound by a process yet: left alone";
  ASSERT_EQ(r->AttachProcess(index, getpid(), &slot), limiter::RegionError::kOk);
  ASSERT_TRUE(agent.SyncAllocations().ok());
  EXPECT_EQ(t->freeze_gen.load(), freeze0) << "a request made before the session is not carried out";
  EXPECT_EQ(t->zero_gen.load(), zero0);
  EXPECT_EQ(t->idle_swap_ms.load(), 1'000u);
  EXPECT_EQ(t->idle_zero_ms.load(), 5'000u);

  ASSERT_FALSE(RemoteZeroKeeperAlive(regions.dir()));
  ASSERT_TRUE(c.RequestTier(a->id, true, true).ok());
  ASSERT_TRUE(agent.SyncAllocations().ok());
  EXPECT_EQ(t->freeze_gen.load(), freeze0) << "no zero keeper: refused whole";
  EXPECT_EQ(t->zero_gen.load(), zero0);

  const int lock = HoldRemoteZeroKeeperLock(regions.dir());
  ASSERT_GE(lock, 0);
  EXPECT_TRUE(RemoteZeroKeeperAlive(regions.dir()));
  ASSERT_TRUE(c.RequestTier(a->id, true, true).ok());
  ASSERT_TRUE(agent.SyncAllocations().ok());
  EXPECT_EQ(t->freeze_gen.load(), freeze0 + 1);
  EXPECT_EQ(t->zero_gen.load(), zero0 + 1);
  ASSERT_TRUE(agent.SyncAllocations().ok());
  EXPECT_EQ(t->zero_gen.load(), zero0 + 1) << "one request, passed on once";
  ASSERT_TRUE(c.RequestTier(a->id, false, false).ok());
  ASSERT_TRUE(agent.SyncAllocations().ok());
  EXPECT_EQ(t->thaw_gen.load(), thaw0 + 1);
  close(lock);
  EXPECT_FALSE(RemoteZeroKeeperAlive(regions.dir()));

  ASSERT_TRUE(agent.HeartbeatOnce().ok());
  auto use = c.GetVgpuUse(a->id, "GPU-s0");
  ASSERT_TRUE(use.ok());
  bool listed = false;
  for (const auto& p : use->processes) listed = listed || p.pid == getpid();
  EXPECT_TRUE(listed) << "the session's process is reported as the allocation's";
  r->DetachProcess(slot);
}


// A suspension reaches the worker sessions bound to the allocation as it reaches the allocation's
// own vGPU: held with the least compute share (a session that binds meanwhile starts held), then
// the allocation's request and limit again and a thaw when the controller resumes it. A session
// whose worker has no tiering cannot be held swapped out: its session process is stopped, and no
// other process on its vGPU is.
TEST(NodeAgent, ASuspensionHoldsTheRemoteSessionsBoundToTheAllocationAndTheResumeReleasesThem) {
  ControllerRig rig;
  ASSERT_TRUE(rig.ok());
  controller::Controller& c = *rig.c;
  FakeGpuSource source({{0, "GPU-rh", "NVIDIA L4", 23034, 0, 0, 0}});
  QuotaRegions regions(rig.dir + "/regions");
  NodeAgent agent({rig.url(), "tok", "host-rh", "", "", ""}, &source, &regions, &rig.clock);
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_TRUE(c.PatchPool("default", std::nullopt, 100, std::nullopt, std::nullopt).ok());
  controller::AllocationRequest low_req{"", "", 0, 1024, 1, "low", ""};
  low_req.percent = 60;
  low_req.percent_limit = 80;
  auto low = c.Allocate(low_req);
  ASSERT_TRUE(low.ok()) << low.status().ToString();
  ASSERT_TRUE(agent.SyncAllocations().ok());
  limiter::GpuRegion* r = regions.region("GPU-rh");
  ASSERT_NE(r, nullptr);

  // The worker's session vGPU with tiering (PrepareVgpu, then the mark), not bound by a process yet.
  const std::string vgpu = SessionVgpuId(getpid(), low->id);
  EXPECT_EQ(SessionOfVgpu(vgpu), getpid());
  EXPECT_EQ(SessionOfVgpu("a-123"), -1);
  uint32_t index = 0, slot = 0;
  ASSERT_EQ(r->CreateOrUpdateVgpu(vgpu.c_str(), 1ull << 30, 600'000, 800'000, 0, &index), limiter::RegionError::kOk);
  ASSERT_EQ(r->SetTierPolicy(index, true, 600'000, 0), limiter::RegionError::kOk);
  ASSERT_TRUE(MarkSessionVgpuNotAdopted(r->path(), vgpu).ok());
  limiter::VgpuTier* t = r->TierOfVgpu(index);
  auto compute = [&](const std::string& id) {
    auto snap = std::make_unique<limiter::RegionSnapshot>();
    r->Snapshot(snap.get());
    for (uint32_t i = 0; i < snap->vgpu_count; ++i)
      if (id == snap->vgpus[i].id) return std::pair{snap->vgpus[i].compute_share_ppm, snap->vgpus[i].compute_limit_ppm};
    return std::pair<uint64_t, uint64_t>{0, 0};
  };

  controller::AllocationRequest crit_req{"", "", 0, 1024, 1, "critical", ""};
  crit_req.percent = 60;
  std::vector<controller::Allocation> preempted;
  auto crit = c.Allocate(crit_req, &preempted);
  ASSERT_TRUE(crit.ok()) << crit.status().ToString();
  ASSERT_EQ(preempted.size(), 1u);
  ASSERT_TRUE(preempted[0].suspended);
  ASSERT_TRUE(agent.SyncAllocations().ok());
  EXPECT_EQ(t->held.load(), 1u) << "held before its session binds: the session starts held";
  EXPECT_EQ(compute(vgpu), (std::pair<uint64_t, uint64_t>{kHeldSharePpm, kHeldSharePpm}));
  const uint32_t freeze0 = t->freeze_gen.load(), thaw0 = t->thaw_gen.load();

  // The session binds while held: it stays held, and nothing else happens to it.
  ASSERT_EQ(r->AttachProcess(index, getpid(), &slot), limiter::RegionError::kOk);
  ASSERT_TRUE(agent.SyncAllocations().ok());
  ASSERT_TRUE(agent.SyncAllocations().ok());
  EXPECT_EQ(t->held.load(), 1u);
  EXPECT_EQ(t->freeze_gen.load(), freeze0);
  EXPECT_EQ(t->thaw_gen.load(), thaw0) << "no thaw while held";
  EXPECT_EQ(compute(vgpu), (std::pair<uint64_t, uint64_t>{kHeldSharePpm, kHeldSharePpm}));

  // A second session of the allocation on a worker without tiering: its session process is
  // stopped (as a victim without tiering); another process on its vGPU is not.
  pid_t session = StartTenant(false), stranger = StartTenant(false);
  ASSERT_GT(session, 0);
  ASSERT_GT(stranger, 0);
  const std::string plain = SessionVgpuId(session, low->id);
  uint32_t plain_index = 0, s1 = 0, s2 = 0;
  ASSERT_EQ(r->CreateOrUpdateVgpu(plain.c_str(), 1ull << 30, 600'000, 600'000, 0, &plain_index),
            limiter::RegionError::kOk);
  ASSERT_TRUE(MarkSessionVgpuNotAdopted(r->path(), plain).ok());
  ASSERT_EQ(r->AttachProcess(plain_index, session, &s1), limiter::RegionError::kOk);
  ASSERT_EQ(r->AttachProcess(plain_index, stranger, &s2), limiter::RegionError::kOk);
  ASSERT_TRUE(agent.SyncAllocations().ok());
  EXPECT_EQ(EndedBySignal(session, 2000), SIGTERM);
  EXPECT_EQ(EndedBySignal(stranger, 300), 0) << "only the session whose pid its vGPU id names";
  EXPECT_EQ(Metric(agent, "tf_node_vgpu_stops_total", {{"reason", "preempted"}}), 1);
  kill(stranger, SIGKILL);
  EXPECT_EQ(EndedBySignal(stranger, 2000), SIGKILL);
  r->ReapDead();
  ASSERT_EQ(r->RemoveVgpu(plain_index), limiter::RegionError::kOk);  // what the worker does when a session ends

  // The preemptor goes: the controller resumes the allocation, the agent lifts the session's hold,
  // gives it the allocation's compute share back and asks for a thaw.
  ASSERT_TRUE(c.Release(crit->id).ok());
  ASSERT_FALSE(c.GetAllocation(low->id)->suspended);
  ASSERT_TRUE(agent.SyncAllocations().ok());
  EXPECT_EQ(t->held.load(), 0u);
  EXPECT_EQ(compute(vgpu), (std::pair<uint64_t, uint64_t>{600'000, 800'000}));
  EXPECT_EQ(t->thaw_gen.load(), thaw0 + 1);
  ASSERT_TRUE(agent.SyncAllocations().ok());
  EXPECT_EQ(t->thaw_gen.load(), thaw0 + 1) << "one thaw per resume";
  r->DetachProcess(slot);
}

// A session vGPU the worker has already removed is never made again by the agent's compute change.
TEST(NodeAgent, UpdatingTheComputeShareOfAVgpuNeverCreatesIt) {
  char tmpl[] = "/tmp/tfagent-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  limiter::GpuRegion r;
  ASSERT_EQ(limiter::GpuRegion::Create(dir.c_str(), "GPU-u0", "NVIDIA L4", 1ull << 34, 121'000, &r),
            limiter::RegionError::kOk);
  EXPECT_EQ(r.UpdateVgpuCompute("remote-1@a-1", 1, 1), limiter::RegionError::kNotFound);
  uint32_t index = 0;
  EXPECT_EQ(r.FindVgpu("remote-1@a-1", &index), limiter::RegionError::kNotFound);
  ASSERT_EQ(r.CreateOrUpdateVgpu("remote-1@a-1", 1 << 20, 100'000, &index), limiter::RegionError::kOk);
  EXPECT_EQ(r.UpdateVgpuCompute("remote-1@a-1", 200, 100), limiter::RegionError::kInvalidArgument);
  EXPECT_EQ(r.UpdateVgpuCompute("remote-1@a-1", 0, 100), limiter::RegionError::kInvalidArgument);
  EXPECT_EQ(r.UpdateVgpuCompute("remote-1@a-1", 1, 1), limiter::RegionError::kOk);
  auto snap = std::make_unique<limiter::RegionSnapshot>();
  r.Snapshot(snap.get());
  ASSERT_EQ(snap->vgpu_count, 1u);
  EXPECT_EQ(snap->vgpus[0].compute_share_ppm, 1u);
  EXPECT_EQ(snap->vgpus[0].compute_limit_ppm, 1u);
  EXPECT_EQ(snap->vgpus[0].vram_limit_bytes, 1u << 20) << "nothing else changes";
  std::filesystem::remove_all(dir);
}

// An allocation taken back (released) while a worker session is bound to it: the agent stops the
// session process (the worker then removes its vGPU) and reports it with the allocation's stops;
// a process on the session's vGPU that is not the session is left alone. (A session bound to an
// allocation this agent never saw: ASessionThatBindsToAnAllocationJustTakenBackIsStopped.)
TEST_F(StopTest, AnAllocationTakenBackStopsTheWorkerSessionsBoundToItAndNoOtherProcess) {
  pid_t session = Tenant(false), stranger = Tenant(false);
  ASSERT_GT(session, 0);
  ASSERT_GT(stranger, 0);
  controller::Allocation a = AllocateAndUse("medium", {});
  limiter::GpuRegion* r = regions_->region("GPU-s0");
  uint32_t index = 0, slot = 0;
  const std::string vgpu = SessionVgpuId(session, a.id);
  ASSERT_EQ(r->CreateOrUpdateVgpu(vgpu.c_str(), 1 << 30, 600'000, &index), limiter::RegionError::kOk);
  ASSERT_EQ(r->AttachProcess(index, session, &slot), limiter::RegionError::kOk);
  ASSERT_EQ(r->AttachProcess(index, stranger, &slot), limiter::RegionError::kOk);
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  EXPECT_EQ(EndedBySignal(session, 300), 0) << "its allocation is still there";

  ASSERT_TRUE(c_->Release(a.id).ok());
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  EXPECT_EQ(EndedBySignal(session, 2000), SIGTERM);
  EXPECT_EQ(EndedBySignal(stranger, 300), 0) << "not the session of its vGPU";
  EXPECT_FALSE(HasVgpu(a.id));
  EXPECT_EQ(Metric(*agent_, "tf_node_vgpu_stops_total", {{"reason", "released"}}), 1);
  EXPECT_EQ(Metric(*agent_, "tf_node_vgpus_stopping"), 1);
  clock_.AdvanceMs(6'000);  // past the grace: the stranger is still not the session's to stop
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  EXPECT_EQ(EndedBySignal(stranger, 300), 0);
  EXPECT_EQ(Metric(*agent_, "tf_node_vgpus_stopping"), 0) << "the session is gone";
  EXPECT_EQ(Metric(*agent_, "tf_node_process_signals_total", {{"signal", "SIGTERM"}}), 1);
  EXPECT_EQ(Metric(*agent_, "tf_node_process_signals_total", {{"signal", "SIGKILL"}}), 0);
  EXPECT_TRUE(HasVgpu(vgpu)) << "the worker removes a session's vGPU, not the agent";
}

// A client placed just before its allocation was deleted binds its worker session after the
// agent saw the allocation go: the session is stopped all the same, at once while the agent
// remembers allocations taken back (10 minutes), and after that because the controller answers
// that the allocation is gone. One whose allocation the controller still has is left running.
TEST_F(StopTest, ASessionThatBindsToAnAllocationJustTakenBackIsStopped) {
  pid_t late = Tenant(false), later = Tenant(false);
  ASSERT_GT(late, 0);
  ASSERT_GT(later, 0);
  controller::Allocation a = AllocateAndUse("medium", {});
  ASSERT_TRUE(c_->Release(a.id).ok());
  ASSERT_TRUE(agent_->SyncAllocations().ok());  // gone, no session bound to it yet
  limiter::GpuRegion* r = regions_->region("GPU-s0");
  uint32_t index = 0, slot = 0;
  ASSERT_EQ(r->CreateOrUpdateVgpu(SessionVgpuId(late, a.id).c_str(), 1 << 30, 600'000, &index),
            limiter::RegionError::kOk);
  ASSERT_EQ(r->AttachProcess(index, late, &slot), limiter::RegionError::kOk);
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  EXPECT_EQ(EndedBySignal(late, 2000), SIGTERM) << "bound to an allocation taken back a moment ago";
  EXPECT_EQ(Metric(*agent_, "tf_node_vgpu_stops_total", {{"reason", "released"}}), 1);

  controller::Allocation b = AllocateAndUse("medium", {});
  ASSERT_TRUE(c_->Release(b.id).ok());
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  clock_.AdvanceMs(11 * 60 * 1000);
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  ASSERT_EQ(r->CreateOrUpdateVgpu(SessionVgpuId(later, b.id).c_str(), 1 << 30, 600'000, &index),
            limiter::RegionError::kOk);
  ASSERT_EQ(r->AttachProcess(index, later, &slot), limiter::RegionError::kOk);
  ASSERT_TRUE(agent_->SyncAllocations().ok());
  EXPECT_EQ(EndedBySignal(later, 2000), SIGTERM) << "taken back 11 minutes ago: the controller says it is gone";
  EXPECT_EQ(Metric(*agent_, "tf_node_vgpu_stops_total", {{"reason", "released"}}), 2);
}

// The stopper signals a process only while its pid still names the process the region recorded
// (pid and start time), and on a session's vGPU only the session whose pid the id names.
TEST(VgpuStopper, NeverSignalsAPidThatNamesAnotherProcessNow) {
  controller::FakeClock clock;
  VgpuStopper stopper(&clock, 1'000);
  pid_t tenant = StartTenant(false), other = StartTenant(false);
  ASSERT_GT(tenant, 0);
  ASSERT_GT(other, 0);
  limiter::ProcessStat st;
  ASSERT_TRUE(limiter::ReadProcessStat(tenant, &st));
  limiter::ProcessInfo reused{};
  reused.pid = tenant;
  reused.start_time_ticks = st.start_time_ticks + 1;  // the pid, reused by another process since
  LingeringVgpu local{"GPU-x", "a-1", {reused}, "", "", false};
  stopper.Step(local, "released");
  clock.AdvanceMs(2'000);
  stopper.Step(local, "released");  // past the grace: SIGKILL round
  EXPECT_EQ(EndedBySignal(tenant, 300), 0);
  EXPECT_EQ(stopper.sigterm_total() + stopper.sigkill_total(), 0u);

  limiter::ProcessStat ost;
  ASSERT_TRUE(limiter::ReadProcessStat(other, &ost));
  limiter::ProcessInfo foreign{};
  foreign.pid = other;
  foreign.start_time_ticks = ost.start_time_ticks;
  limiter::ProcessInfo same{};
  same.pid = tenant;
  same.start_time_ticks = st.start_time_ticks;
  LingeringVgpu session{"GPU-x", SessionVgpuId(tenant, "a-1"), {foreign, same}, "a-1", "", false};
  stopper.Step(session, "released");
  EXPECT_EQ(EndedBySignal(tenant, 2000), SIGTERM);
  EXPECT_EQ(EndedBySignal(other, 300), 0) << "not the session its vGPU id names";
  EXPECT_EQ(stopper.sigterm_total(), 1u);
  kill(other, SIGKILL);
  EXPECT_EQ(EndedBySignal(other, 2000), SIGKILL);
}

// The lock a worker session holds while it lives tells a session vGPU left by a worker killed
// outright from a live one, whatever the pid in its id names here (in another PID namespace it
// may name no process, or another one): only the lock counts. Ids that are not a session's
// canonical spelling name no file; a lock folder others can use, and anything in it that is not a
// plain file, are left alone without blocking.
TEST(SessionVgpuLocks, OnlyASessionsReleasedLockMarksItsVgpuAsEnded) {
  char tmpl[] = "/tmp/tf-session-locks.XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string locks = dir + "/session-locks-" + std::to_string(geteuid());
  EXPECT_EQ(SessionLockDir(dir), locks) << "each user's own folder";
  EXPECT_EQ(SessionVgpuLockPath(dir, "remote-12"), locks + "/remote-12.lock");
  EXPECT_EQ(SessionVgpuLockPath(dir, "remote-12@a-x1"), locks + "/remote-12@a-x1.lock");
  EXPECT_EQ(SessionVgpuLockPath(dir, "run-12"), locks + "/run-12.lock") << "a `tfusion run` of its own vGPU";
  // Not a session's spelling (the worker spells its ids), a pool allocation's, or no vGPU id.
  for (const std::string& bad : std::vector<std::string>{"remote-012", "remote-12@../x", "remote-12@a-../x", "a-x1",
                                                        "a-", "", std::string(64, 'x'), std::string("x\0y", 3)})
    EXPECT_EQ(SessionVgpuLockPath(dir, bad), "") << bad;
  // Any other name a run may give its vGPU (`tfusion run --vgpu NAME`) is spelt in hex.
  EXPECT_EQ(SessionVgpuLockPath(dir, "run-12/../x"), locks + "/vgpu-72756e2d31322f2e2e2f78.lock");
  EXPECT_EQ(SessionVgpuLockPath(dir, "run-012"), locks + "/vgpu-72756e2d303132.lock");
  EXPECT_EQ(SessionVgpuLockPath(dir, std::string(63, 'x')).size(), locks.size() + 1 + 5 + 126 + 5);
  std::string why;
  EXPECT_LT(HoldSessionVgpuLock(dir, "remote-12@../x", &why), 0);
  EXPECT_NE(why.find("not a session or run vGPU id"), std::string::npos) << why;
  int held = -1;
  EXPECT_EQ(SessionVgpuState(dir, "remote-1", &held), SessionState::kUnknown) << "no lock folder: nothing is known";
  // A session in "another namespace": its id names pid 1, the lock is held by the child.
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t session = fork();
  ASSERT_GE(session, 0);
  if (session == 0) {
    std::string w;
    const bool ok = HoldSessionVgpuLock(dir, "remote-1", &w) >= 0;
    (void)!write(ready[1], ok ? "y" : "n", 1);
    pause();
    _exit(0);
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  EXPECT_EQ(c, 'y');
  struct stat st;
  ASSERT_EQ(lstat(locks.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u) << "only the worker's user may use the lock folder";
  EXPECT_EQ(SessionVgpuState(dir, "remote-1", &held), SessionState::kLive);
  EXPECT_EQ(held, -1);
  EXPECT_EQ(SessionLockIds(dir), std::vector<std::string>{"remote-1"});
  // Lock files of names are listed by name; files that spell no name this way are not.
  for (const char* file : {"vgpu-6d79206a6f62.lock", "vgpu-6D79.lock", "vgpu-6d7.lock", "vgpu-zz.lock", "vgpu-.lock",
                           "vgpu-612d78.lock", "x.lock"})
    close(open((locks + "/" + file).c_str(), O_CREAT | O_WRONLY, 0600));
  std::vector<std::string> ids = SessionLockIds(dir);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<std::string>{"my job", "remote-1"}));
  for (const char* file : {"vgpu-6d79206a6f62.lock", "vgpu-6D79.lock", "vgpu-6d7.lock", "vgpu-zz.lock", "vgpu-.lock",
                           "vgpu-612d78.lock", "x.lock"})
    unlink((locks + "/" + file).c_str());
  kill(session, SIGKILL);
  waitpid(session, nullptr, 0);
  ASSERT_EQ(SessionVgpuState(dir, "remote-1", &held), SessionState::kEnded);
  ASSERT_GE(held, 0);
  DropSessionVgpuLock(dir, "remote-1", held);
  EXPECT_NE(access((locks + "/remote-1.lock").c_str(), F_OK), 0) << "the ended session's lock file is gone";
  EXPECT_EQ(SessionVgpuState(dir, "remote-1", &held), SessionState::kUnknown);
  // A FIFO named like a lock file neither blocks nor counts as ended; a session cannot use it.
  ASSERT_EQ(mkfifo((locks + "/remote-2.lock").c_str(), 0600), 0);
  EXPECT_EQ(SessionVgpuState(dir, "remote-2", &held), SessionState::kLive);
  EXPECT_LT(HoldSessionVgpuLock(dir, "remote-2", &why), 0);
  // A lock folder another user owns is not trusted, by root either.
  if (geteuid() == 0) {
    ASSERT_EQ(chown(locks.c_str(), 65534, 65534), 0);
    EXPECT_FALSE(SessionLockDirTrusted(dir, false, &why));
    EXPECT_NE(why.find("another user owns it"), std::string::npos) << why;
    ASSERT_EQ(chown(locks.c_str(), 0, 0), 0);
  }
  // A lock folder others can use is not trusted: nothing in it is judged, and no lock is taken.
  ASSERT_EQ(chmod(locks.c_str(), 0777), 0);
  EXPECT_FALSE(SessionLockDirTrusted(dir, false, &why));
  EXPECT_NE(why.find("not 700"), std::string::npos) << why;
  EXPECT_LT(HoldSessionVgpuLock(dir, "remote-3", &why), 0);
  EXPECT_TRUE(SessionLockIds(dir).empty());
  close(ready[0]);
  close(ready[1]);
  std::filesystem::remove_all(dir);
}

}  // namespace tf::hypervisor
