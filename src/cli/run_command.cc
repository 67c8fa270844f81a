#include "cli/run_command.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "cli/compute_flags.h"
#include "cli/forward_signals.h"
#include "cli/local_vgpu.h"
#include "cli/pool_allocation.h"
#include "cli/quantity.h"
#include "cli/remote_run.h"
#include "cli/worker_sessions.h"
#include "common/gpu_catalog.h"
#include "controller/model.h"
#include "hypervisor/mps.h"
#include "hypervisor/process_checkpoint.h"
#include "hypervisor/quota_regions.h"
#include "hypervisor/remote_sessions.h"
#include "hypervisor/vgpu_metrics.h"
#include "limiter/core/gpu_region.h"

namespace tf::cli {
namespace {

using limiter::GpuRegion;
using limiter::RegionError;

int Fail(const std::string& message) {
  std::fprintf(stderr, "tfusion run: %s\n", message.c_str());
  return 2;
}

pid_t g_child = 0;

// Limits in the region's units from the flags: VRAM bytes, compute request and limit in parts
// per million of the GPU, QoS 0..3.
struct Limits {
  uint64_t vram_bytes = 0;
  uint64_t share_ppm = limiter::kShareWholeGpuPpm;  // the request
  uint64_t limit_ppm = limiter::kShareWholeGpuPpm;  // the ceiling, >= share_ppm
  uint32_t qos = limiter::kDefaultQos;
};

uint64_t CapacityMtflops(const std::string& name) {
  StatusOr<GpuCatalog> catalog = LoadCatalog();
  if (!catalog.ok()) return 0;
  auto spec = catalog->Lookup(name);
  return spec.ok() ? static_cast<uint64_t>(spec->fp16_tflops * 1000) : 0;
}

// "50.0% of the GPU" (request = limit) or "request 25.0%, limit 100.0% of the GPU".
std::string ShareText(const Limits& l) {
  char buf[96];
  if (l.limit_ppm <= l.share_ppm) {
    std::snprintf(buf, sizeof(buf), "%.1f%% of the GPU", l.share_ppm / 10'000.0);
  } else {
    std::snprintf(buf, sizeof(buf), "request %.1f%%, limit %.1f%% of the GPU", l.share_ppm / 10'000.0,
                  l.limit_ppm / 10'000.0);
  }
  return buf;
}

StatusOr<Limits> ResolveLimits(const RunOptions& o, const LocalGpu& gpu) {
  Limits l;
  l.vram_bytes = gpu.total_bytes;
  if (!o.vram.empty()) {
    auto v = ParseVramSize("--vram", o.vram);
    if (!v.ok()) return v.status();
    if (*v > gpu.total_bytes) {
      return InvalidArgument("--vram " + o.vram + " is more than GPU " + std::to_string(gpu.index) +
                             " (" + gpu.name + ") has: " + FormatBytes(gpu.total_bytes));
    }
    l.vram_bytes = *v;
  }
  const ComputeFlags flags = ComputeFlagsOf(o);
  TF_RETURN_IF_ERROR(CheckComputeFlags(flags));
  GpuForShares target{gpu.index, gpu.name, 0};
  if (!o.tflops.empty() || !o.tflops_limit.empty()) {
    StatusOr<GpuCatalog> catalog = LoadCatalog();
    if (!catalog.ok()) return catalog.status();
    if (auto spec = catalog->Lookup(gpu.name); spec.ok()) target.capacity_tflops = spec->fp16_tflops;
  }
  StatusOr<ComputeShares> shares = ResolveComputeShares(flags, target);
  if (!shares.ok()) return shares.status();
  l.share_ppm = shares->request_ppm;
  l.limit_ppm = shares->limit_ppm;
  StatusOr<uint32_t> qos = ParseQosFlag(o.qos);
  if (!qos.ok()) return qos.status();
  l.qos = *qos;
  return l;
}

// The GPU `o` names: by UUID when o.gpu_uuid is set, else by NVML index; nullptr when none is.
const LocalGpu* SelectGpu(const std::vector<LocalGpu>& gpus, const RunOptions& o) {
  for (const auto& g : gpus) {
    if (o.gpu_uuid.empty() ? g.index == o.gpu : g.uuid == o.gpu_uuid) return &g;
  }
  return nullptr;
}

std::string NoSuchGpu(const std::vector<LocalGpu>& gpus, const RunOptions& o) {
  std::string m = "--gpu " + (o.gpu_uuid.empty() ? std::to_string(o.gpu) : o.gpu_uuid) +
                  ": this machine has " + std::to_string(gpus.size()) + " GPU(s)";
  const char* sep = ": ";
  for (const auto& g : gpus) {
    m += sep + std::to_string(g.index) + " " + g.uuid;
    sep = ", ";
  }
  return m;
}

struct Pooled {
  std::string allocation_id;  // empty: no controller reachable, run on this machine's own
  std::string gpu_uuid;       // the GPU the pool chose
  Limits limits;
  std::string node;           // the node of that GPU
  std::string remote_worker;  // not empty: the GPU is on another node, reached through this worker
  bool tiering = false;       // the pool oversubscribes VRAM
  std::string qos;            // as granted, for a remote worker (empty: medium)
  int64_t idle_swap_ms = -1;  // the allocation's tier idle overrides (ms); -1: the QoS default
  int64_t idle_disk_ms = -1;
  int64_t idle_zero_ms = -1;
};

// Asks the controller for a vGPU. An unreachable controller is not an error: the command then
// runs with a local vGPU, as without --controller. A placement on another machine runs through
// that node's worker (ChooseRunPlacement), or is refused when it registered none.
StatusOr<Pooled> PlaceThroughController(const RunOptions& o, const std::vector<LocalGpu>& gpus,
                                        std::optional<uint64_t> idle_swap_ms, std::optional<uint64_t> idle_disk_ms,
                                        std::optional<uint64_t> idle_zero_ms) {
  Pooled out;
  if (o.vram.empty()) return InvalidArgument("--vram is required when a controller places the vGPU");
  auto vram = ParseVramSize("--vram", o.vram);
  if (!vram.ok()) return vram.status();
  StatusOr<PoolCompute> compute = PoolComputeFromFlags(ComputeFlagsOf(o));
  if (!compute.ok()) return compute.status();
  StatusOr<uint32_t> qos = ParseQosFlag(o.qos);
  if (!qos.ok()) return qos.status();
  const double limit = compute->tflops > 0 ? compute->tflops_limit : compute->percent_limit;
  auto a = RequestPoolAllocation(o.controller, o.token, compute->tflops, compute->percent, *vram, o.pool, o.qos,
                                 o.tenant, limit, kRunLeaseSeconds,
                                 idle_swap_ms ? static_cast<int64_t>(*idle_swap_ms) : -1,
                                 idle_disk_ms ? static_cast<int64_t>(*idle_disk_ms) : -1,
                                 idle_zero_ms ? static_cast<int64_t>(*idle_zero_ms) : -1);
  if (!a.ok()) {
    if (a.status().code() == StatusCode::kUnavailable) {
      std::fprintf(stderr, "tfusion run: controller %s not reachable (%s): using a local vGPU\n",
                   o.controller.c_str(), a.status().message().c_str());
      return out;
    }
    return Status(a.status().code(), "the controller refused the vGPU: " + a.status().message());
  }
  std::vector<std::string> local;
  const LocalGpu* gpu = nullptr;
  for (const auto& g : gpus) {
    local.push_back(g.uuid);
    if (g.uuid == a->gpu_uuid) gpu = &g;
  }
  StatusOr<std::string> worker = std::string();
  if (gpu == nullptr) worker = NodeWorkerAddress(o.controller, o.token, a->node);
  StatusOr<RunPlacement> where = worker.ok() ? ChooseRunPlacement(*a, local, *worker) : worker.status();
  if (where.ok() && where->remote) {
    // A worker that is down would fail the command's first CUDA call instead: say so now.
    if (Status up = ProbeWorkerAddress(where->worker_address, 3000); !up.ok()) {
      where = FailedPrecondition("the controller placed this vGPU on node " + a->node + " (GPU " + a->gpu_uuid +
                                 "), whose worker does not answer (" + up.message() + "); the allocation was "
                                 "released. Start `tfusion worker` there, or run the command on " + a->node);
    }
  }
  if (!where.ok()) {
    ReleasePoolAllocation(o.controller, o.token, a->id);
    return where.status();
  }
  out.allocation_id = a->id;
  out.gpu_uuid = a->gpu_uuid;
  out.node = a->node;
  out.limits.vram_bytes = a->vram_bytes;
  out.limits.share_ppm = a->share_ppm;
  out.limits.limit_ppm = std::max(a->limit_ppm, a->share_ppm);
  StatusOr<uint32_t> granted_qos = ParseQosFlag(a->qos);
  out.limits.qos = granted_qos.ok() ? *granted_qos : *qos;
  out.tiering = a->tiering;
  out.idle_swap_ms = a->idle_swap_ms;
  out.idle_disk_ms = a->idle_disk_ms;
  out.idle_zero_ms = a->idle_zero_ms;
  const std::string granted = ShareText(out.limits);
  if (where->remote) {
    out.remote_worker = where->worker_address;
    std::fprintf(stderr, "tfusion run: allocation %s on node %s (GPU %s): %s VRAM, %s; "
                 "running remotely through its worker %s\n", a->id.c_str(), a->node.c_str(),
                 a->gpu_uuid.c_str(), FormatBytes(a->vram_bytes).c_str(), granted.c_str(),
                 out.remote_worker.c_str());
    out.qos = a->qos;
    return out;
  }
  std::fprintf(stderr, "tfusion run: allocation %s on GPU %d (%s): %s VRAM, %s\n", a->id.c_str(), gpu->index,
               gpu->name.c_str(), FormatBytes(a->vram_bytes).c_str(), granted.c_str());
  return out;
}

// Renews a pool allocation's lease every kRunRenewSeconds while the command runs, so that an
// allocation whose `tfusion run` died (kill -9, a lost machine) is released by the controller
// within kRunLeaseSeconds instead of holding its capacity forever.
class LeaseKeeper {
 public:
  LeaseKeeper(const RunOptions& o, std::string id) : o_(o), id_(std::move(id)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~LeaseKeeper() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    int64_t failing_since = 0;  // seconds since the epoch of the first failed renewal in a row
    while (!cv_.wait_for(lock, std::chrono::seconds(kRunRenewSeconds), [this] { return stop_; })) {
      lock.unlock();
      Status st = RenewPoolAllocation(o_.controller, o_.token, id_);
      const int64_t now = static_cast<int64_t>(time(nullptr));
      if (st.code() == StatusCode::kNotFound) {
        // Taken back: nothing to renew any more, and the node agent stops the command.
        StatusOr<std::string> why = EvictionReason(o_.controller, o_.token, id_);
        std::fprintf(stderr, "tfusion run: allocation %s is no longer held by the controller (%s): its node agent "
                     "stops the command\n", id_.c_str(),
                     why.ok() ? why->c_str()
                              : failing_since > 0 ? "its lease ran out while no replica could renew it"
                                                  : "released");
        return;
      }
      if (st.ok()) {
        if (failing_since > 0)
          std::fprintf(stderr, "tfusion run: allocation %s renewed again\n", id_.c_str());
        failing_since = 0;
      } else {
        if (failing_since == 0) failing_since = now;
        const bool one_url = o_.controller.find(',') == std::string::npos;
        std::fprintf(stderr, "tfusion run: renewing allocation %s: %s (its lease runs out %lld s after the last "
                     "renewal%s)\n", id_.c_str(), st.ToString().c_str(),
                     std::max<long long>(0, kRunLeaseSeconds - (now - failing_since) - kRunRenewSeconds),
                     one_url ? "; give --controller every replica, comma-separated, to follow a failover" : "");
      }
      lock.lock();
    }
  }
  const RunOptions& o_;
  const std::string id_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// Releases the run's pool allocation once the command has ended; when it was already gone, says
// why (preempted, node lost), so the command's exit status (usually 143, SIGTERM) is explained.
void ReleaseAfterRun(const RunOptions& o, const std::string& id) {
  // A controller restarting or failing over for a moment: tried for about 6 s, then the lease
  // releases it (within kRunLeaseSeconds).
  Status released = ReleasePoolAllocation(o.controller, o.token, id);
  auto passing = [](const Status& s) {  // no replica reachable, or none serving (503) for now
    return s.code() == StatusCode::kUnavailable ||
           (s.code() == StatusCode::kFailedPrecondition && s.message().find("(HTTP 503") != std::string::npos);
  };
  for (int retry = 0; retry < 4 && passing(released); ++retry) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500 << retry));
    released = ReleasePoolAllocation(o.controller, o.token, id);
  }
  if (released.code() == StatusCode::kNotFound) {
    StatusOr<std::string> why = EvictionReason(o.controller, o.token, id);
    if (why.ok())
      std::fprintf(stderr, "tfusion run: allocation %s was %s while the command ran\n", id.c_str(), why->c_str());
  } else if (!released.ok()) {
    std::fprintf(stderr, "tfusion run: releasing allocation %s: %s (the controller releases it when its lease "
                 "runs out, within %d s)\n", id.c_str(), released.ToString().c_str(), kRunLeaseSeconds);
  }
}

// The GPUs of this machine for the controller's placement; none (not an error) on a machine
// without driver or GPUs, which can still run commands placed elsewhere through a worker.
std::vector<LocalGpu> LocalGpusIfAny(const RunOptions& o) {
  auto nvml = FindDriverLibrary("libnvidia-ml.so.1", o.nvml, "TFUSION_REAL_LIBNVML");
  if (!nvml.ok()) return {};
  auto gpus = DiscoverGpus(*nvml);
  return gpus.ok() ? *gpus : std::vector<LocalGpu>{};
}

}  // namespace

int RunCommand(const RunOptions& o) {
  if (o.command.empty()) return Fail("no command given (usage: tfusion run [flags] -- CMD ARGS)");
  // Checked before anything is made (the region folder, the GPU list).
  if (o.vgpu.size() >= limiter::kVgpuIdBytes) return Fail("--vgpu: the name is longer than 63 characters");
  // Names are shown in tables, logs and metrics labels, and name lock files: plain ASCII only.
  for (char c : o.vgpu) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')
      continue;
    return Fail("--vgpu: a vGPU name may hold only letters, digits, '.', '_' and '-'");
  }
  if (o.vgpu.rfind("a-", 0) == 0) {
    return Fail("--vgpu " + o.vgpu + ": names starting with a- are the pool's allocations, which the node agent "
                "makes and removes: choose another name");
  }
  if (o.gpu < 0) return Fail("--gpu must be 0 or more");
  const bool tiering = o.tiering || !o.idle_swap.empty() || !o.disk_tier.empty() || !o.idle_zero.empty();
  std::optional<uint64_t> idle_swap_ms, idle_disk_ms, idle_zero_ms;
  if (!o.idle_swap.empty()) {
    auto ms = ParseDurationMs("--idle-swap", o.idle_swap);
    if (!ms.ok()) return Fail(ms.status().message());
    idle_swap_ms = *ms;
  }
  if (!o.idle_disk.empty()) {
    if (o.disk_tier.empty()) return Fail("--idle-disk needs --disk-tier DIR");
    auto ms = ParseDurationMs("--idle-disk", o.idle_disk);
    if (!ms.ok()) return Fail(ms.status().message());
    idle_disk_ms = *ms;
  }
  if (!o.idle_zero.empty()) {
    auto ms = ParseDurationMs("--idle-zero", o.idle_zero);
    if (!ms.ok()) return Fail(ms.status().message());
    idle_zero_ms = *ms;
    // Against the swap timeout it will run with (the flag, else the QoS's default).
    auto qos = ParseQosFlag(o.qos);
    if (!qos.ok()) return Fail(qos.status().message());
    const uint64_t swap_ms = idle_swap_ms ? *idle_swap_ms : limiter::DefaultIdleSwapMs(*qos);
    Status valid = controller::ValidateIdleZero("--idle-zero", static_cast<int64_t>(*idle_zero_ms),
                                                idle_swap_ms ? "--idle-swap" : "the QoS's idle swap timeout",
                                                static_cast<int64_t>(swap_ms));
    if (!valid.ok()) return Fail(valid.message());
  }
  if (!o.disk_tier.empty()) {
    struct stat st;
    if (stat(o.disk_tier.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || access(o.disk_tier.c_str(), W_OK) != 0) {
      return Fail("--disk-tier " + o.disk_tier + ": not a folder this user can write");
    }
  }
  StatusOr<std::string> mps_dir = ChooseMpsPipeDirectory(o.mps_pipe_dir, "tfusion run");
  if (!mps_dir.ok()) return Fail(mps_dir.status().message());
  std::optional<Pooled> pooled;
  if (!o.controller.empty() && !o.vgpu.empty()) {
    // Each pooled run gets an allocation of its own: a name would not make two runs share one.
    return Fail("--vgpu names a vGPU of this machine; a run the pool places (--controller, or TFUSION_URL) gets an "
                "allocation of its own: leave out --vgpu, or --controller and TFUSION_URL to share a local vGPU");
  }
  if (!o.controller.empty()) {
    auto placed = PlaceThroughController(o, LocalGpusIfAny(o), idle_swap_ms, idle_disk_ms, idle_zero_ms);
    if (!placed.ok()) return Fail(placed.status().message());
    if (!placed->remote_worker.empty()) {
      // The worker's session takes the allocation's idle timeouts, scale to zero included; a disk
      // tier folder is this machine's only.
      if (!o.disk_tier.empty()) {
        return Fail("--disk-tier works on a local vGPU only (this one was placed on another node)");
      }
      if (tiering && !placed->tiering) {
        return Fail("--tiering, --idle-swap and --idle-zero need a pool that oversells VRAM when the vGPU is on "
                    "another node");
      }
      if (!mps_dir->empty()) {
        std::fprintf(stderr, "tfusion run: MPS (%s) is this machine's; the command runs on another node's "
                     "worker without it\n", mps_dir->c_str());
      }
      const std::string& token = o.worker_token.empty() ? o.token : o.worker_token;
      // The worker makes the session a vGPU of the allocation's size on the allocation's GPU.
      RemoteLimits limits;
      limits.gpu = placed->gpu_uuid;
      limits.vram = std::to_string(placed->limits.vram_bytes) + "B";
      char percent[32];
      std::snprintf(percent, sizeof(percent), "%.4f", placed->limits.share_ppm / 10'000.0);
      limits.percent = percent;
      if (placed->limits.limit_ppm > placed->limits.share_ppm) {
        std::snprintf(percent, sizeof(percent), "%.4f", placed->limits.limit_ppm / 10'000.0);
        limits.percent_limit = percent;
      }
      limits.qos = placed->qos;
      if (placed->tiering) {  // the allocation's overrides, else its QoS's defaults (as a node agent applies them)
        StatusOr<uint32_t> q = ParseQosFlag(placed->qos.empty() ? "medium" : placed->qos);
        const uint32_t qos = q.ok() ? *q : limiter::kDefaultQos;
        const int64_t swap = placed->idle_swap_ms >= 0 ? placed->idle_swap_ms : static_cast<int64_t>(limiter::DefaultIdleSwapMs(qos));
        const int64_t disk = placed->idle_disk_ms >= 0 ? placed->idle_disk_ms : static_cast<int64_t>(limiter::DefaultIdleDiskMs(qos));
        limits.idle_swap = swap == 0 ? "never" : std::to_string(swap) + "ms";
        limits.idle_disk = disk == 0 ? "never" : std::to_string(disk) + "ms";
        // Never unless the allocation sets it, as for a local tenant; the worker's --idle-zero
        // applies only to clients that send none.
        const int64_t zero = placed->idle_zero_ms > 0 ? placed->idle_zero_ms : static_cast<int64_t>(limiter::DefaultIdleZeroMs(qos));
        limits.idle_zero = zero == 0 ? "never" : std::to_string(zero) + "ms";
      }
      // The session's vGPU is bound to the allocation, tiering or not: the node agent reports its
      // use and processes as the allocation's, stops it when the allocation is taken back
      // (released, preempted, its lease or node lost), and passes the allocation's freeze, zero
      // and thaw requests on to it.
      limits.allocation = placed->allocation_id;
      int rc = 0;
      {
        LeaseKeeper lease(o, placed->allocation_id);
        rc = RunRemote(placed->remote_worker, token, o.command, limits);
      }
      ReleaseAfterRun(o, placed->allocation_id);
      return rc;
    }
    if (!placed->allocation_id.empty()) pooled = *placed;
  }
  auto driver = FindDriverLibrary("libcuda.so.1", o.driver, "TFUSION_REAL_LIBCUDA");
  if (!driver.ok()) return Fail(driver.status().message());
  auto nvml = FindDriverLibrary("libnvidia-ml.so.1", o.nvml, "TFUSION_REAL_LIBNVML");
  if (!nvml.ok()) return Fail(nvml.status().message());
  auto inject = InjectDir();
  if (!inject.ok()) return Fail(inject.status().message());
  auto gpus = DiscoverGpus(*nvml);
  if (!gpus.ok()) return Fail(gpus.status().message());
  const LocalGpu* gpu = SelectGpu(*gpus, o);
  if (gpu == nullptr) return Fail(NoSuchGpu(*gpus, o));
  StatusOr<Limits> limits = Limits{};
  std::string pooled_id;  // the controller's allocation, released when the command ends
  if (pooled) {
    pooled_id = pooled->allocation_id;
    gpu = nullptr;
    for (const auto& g : *gpus)
      if (g.uuid == pooled->gpu_uuid) gpu = &g;
    if (gpu == nullptr) {  // placed on a GPU the first discovery saw and this one does not
      ReleasePoolAllocation(o.controller, o.token, pooled_id);
      return Fail("GPU " + pooled->gpu_uuid + " that the pool chose is not visible any more");
    }
    limits = pooled->limits;
  }
  // A run that fails before its command starts (its vGPU cannot be made, a fork fails) gives its
  // allocation back at once: it stayed held until its lease ran out, a minute later.
  struct ReleaseIfNotStarted {
    const RunOptions& o;
    const std::string& id;
    bool started = false;
    ~ReleaseIfNotStarted() {
      if (!started && !id.empty()) (void)ReleasePoolAllocation(o.controller, o.token, id);
    }
  } release_if_not_started{o, pooled_id};
  if (pooled_id.empty()) limits = ResolveLimits(o, *gpu);
  if (!limits.ok()) return Fail(limits.status().message());

  GpuRegion region;
  limiter::RegionErrorDetail why;
  RegionError e = GpuRegion::Create(RegionDir().c_str(), gpu->uuid.c_str(), gpu->name.c_str(),
                                    gpu->total_bytes, CapacityMtflops(gpu->name), &region, &why);
  if (e != RegionError::kOk) {
    return Fail("cannot open the shared region of GPU " + gpu->uuid + ": " +
                limiter::RegionErrorName(e) + " " + why.message);
  }
  if (const char* budget = getenv("TFUSION_HOST_TIER_BUDGET"); budget != nullptr && *budget) {
    // The host memory the swapped VRAM of this GPU's tenants may take together.
    auto bytes = std::string(budget) == "0" ? StatusOr<uint64_t>(uint64_t{0})
                                            : ParseVramSize("TFUSION_HOST_TIER_BUDGET", budget);
    if (!bytes.ok()) return Fail(bytes.status().message());
    region.SetHostTierBudget(*bytes);
  }
  const bool own_vgpu = pooled_id.empty() && o.vgpu.empty();
  std::string vgpu_id = !pooled_id.empty() ? pooled_id : own_vgpu ? hypervisor::RunVgpuId(getpid()) : o.vgpu;
  if (vgpu_id.size() >= limiter::kVgpuIdBytes) return Fail("--vgpu: the name is longer than 63 characters");
  // The vGPU's lock, held by us and inherited by the command: should we be killed outright
  // (SIGKILL), whoever sweeps next (`tfusion smi`, a worker, the node agent, the next run to end)
  // removes the vGPU once the command has exited too (with `--vgpu NAME`, once every run of that
  // name and its command have). Without a lock folder of our user's the run goes on, and nothing
  // is removed that way. A pool allocation's vGPU is the node agent's to remove.
  int run_lock = -1;
  if (pooled_id.empty()) {
    const std::string dir = RegionDir();
    // A vGPU of this id left by an earlier run of the same pid killed outright is removed, so that
    // ours starts afresh; while a process still holds its lock or uses it (that run's command, or
    // a run of another PID namespace) the id is taken, and ours gets a name of its own.
    if (own_vgpu && !hypervisor::ClearEndedVgpuOfId(dir, vgpu_id)) {
      char suffix[16];
      std::snprintf(suffix, sizeof(suffix), "-%08x", static_cast<unsigned>(std::random_device{}()));
      vgpu_id += suffix;
    }
    // A named vGPU whose runs were all killed outright (its lock ended, nothing sweeping since) is
    // removed too: ours starts on fresh counters, not on theirs. One in use is joined below.
    if (!o.vgpu.empty()) hypervisor::ClearEndedVgpuOfId(dir, vgpu_id);
    std::string why;
    if (!hypervisor::SessionVgpuLockPath(dir, vgpu_id).empty()) {
      run_lock = hypervisor::HoldSessionVgpuLock(dir, vgpu_id, &why);
      if (run_lock < 0 && hypervisor::SessionLockDirTrusted(dir, false, nullptr))
        return Fail("cannot take the lock of vGPU '" + vgpu_id + "': " + why);
    }
  }
  // The tier policy this run writes into its vGPU: a pool's (the allocation's overrides, else the
  // QoS's, as the node agent writes them), else the flags' (--idle-swap, else the QoS's default).
  // The defaults follow the QoS, which a run joining a vGPU in use may take from it: resolved
  // once the limits are.
  bool tier_on = tiering || (pooled && pooled->tiering);
  bool write_tier = tier_on;
  uint64_t swap_ms = 0, disk_ms = 0, zero_ms = 0;
  auto resolve_tier_policy = [&] {
    const uint32_t qos = limits->qos;
    swap_ms = idle_swap_ms ? *idle_swap_ms : limiter::DefaultIdleSwapMs(qos);
    disk_ms = o.disk_tier.empty() ? 0 : idle_disk_ms ? *idle_disk_ms : limiter::DefaultIdleDiskMs(qos);
    zero_ms = idle_zero_ms ? *idle_zero_ms : 0;
    if (pooled && pooled->tiering) {
      swap_ms = pooled->idle_swap_ms >= 0 ? static_cast<uint64_t>(pooled->idle_swap_ms) : limiter::DefaultIdleSwapMs(qos);
      disk_ms = pooled->idle_disk_ms >= 0 ? static_cast<uint64_t>(pooled->idle_disk_ms) : limiter::DefaultIdleDiskMs(qos);
      zero_ms = pooled->idle_zero_ms > 0 ? static_cast<uint64_t>(pooled->idle_zero_ms) : 0;
    }
  };
  uint32_t existing = 0;
  if (!o.vgpu.empty() && region.FindVgpu(vgpu_id.c_str(), &existing) == RegionError::kOk) {
    // A vGPU that live processes use keeps the limits they were started under: a run that joins
    // it takes them when it gives none, and is refused when it gives others (it would change
    // them under every process of the vGPU, and for good).
    region.ReapDeadOfVgpu(existing);
    auto snap = std::make_unique<limiter::RegionSnapshot>();
    region.Snapshot(snap.get());
    uint32_t users = 0;
    for (uint32_t k = 0; k < snap->process_count; ++k)
      if (snap->processes[k].vgpu_index == existing) ++users;
    const limiter::VgpuInfo* in_use = nullptr;
    for (uint32_t i = 0; i < snap->vgpu_count && users > 0; ++i)
      if (snap->vgpus[i].index == existing && vgpu_id == snap->vgpus[i].id) in_use = &snap->vgpus[i];
    if (in_use != nullptr) {
      const Limits current{in_use->vram_limit_bytes, in_use->compute_share_ppm, in_use->compute_limit_ppm, in_use->qos};
      const bool given = !o.vram.empty() || !o.tflops.empty() || !o.percent.empty() || !o.tflops_limit.empty() ||
                         !o.percent_limit.empty() || !o.qos.empty();
      if (!given) {
        limits = current;
      } else if (limits->vram_bytes != current.vram_bytes || limits->share_ppm != current.share_ppm ||
                 limits->limit_ppm != current.limit_ppm || limits->qos != current.qos) {
        char shares[96];
        std::snprintf(shares, sizeof(shares), "request %.1f%%, limit %.1f%%, qos %s", current.share_ppm / 1e4,
                      current.limit_ppm / 1e4, hypervisor::QosLabel(current.qos));
        return Fail("vGPU '" + vgpu_id + "' is in use (" + std::to_string(users) + " process(es)) with --vram " +
                    FormatBytes(current.vram_bytes) + ", " + shares +
                    ": a run that joins it gives the same limits, or none to take them");
      }
      // Its tier policy likewise: a joiner with no tier flag takes it (and restores its processes
      // scaled to zero while it waits), one whose flags ask for another is refused.
      resolve_tier_policy();
      auto ms_text = [](uint64_t ms) { return ms == 0 ? std::string("never") : std::to_string(ms) + "ms"; };
      if (tiering && (!in_use->tier_enabled || in_use->idle_swap_ms != swap_ms || in_use->idle_disk_ms != disk_ms ||
                      in_use->idle_zero_ms != zero_ms)) {
        const std::string policy = !in_use->tier_enabled
                                       ? std::string("tiering off")
                                       : "--idle-swap " + ms_text(in_use->idle_swap_ms) + ", --idle-disk " +
                                             ms_text(in_use->idle_disk_ms) + ", --idle-zero " +
                                             ms_text(in_use->idle_zero_ms);
        return Fail("vGPU '" + vgpu_id + "' is in use (" + std::to_string(users) + " process(es)) with " + policy +
                    ": a run that joins it gives the same tier flags, or none to take them");
      }
      tier_on = in_use->tier_enabled;
      write_tier = tiering;  // the same values again: kept should the vGPU be made afresh below
    }
  }
  // This process holds a slot (and no VRAM) until the command ends, so that another run of the
  // same vGPU that ends first cannot remove the vGPU before our command has attached to it. A
  // sibling run may remove the vGPU between our create and our attach (it was the last to leave):
  // then create it again, until we hold a slot of the vGPU of this name.
  uint32_t index = 0;
  uint32_t guard_slot = 0;
  bool guarded = false;
  if (write_tier) resolve_tier_policy();
  for (int attempt = 0; attempt < 20 && !guarded; ++attempt) {
    e = region.CreateOrUpdateVgpu(vgpu_id.c_str(), limits->vram_bytes, limits->share_ppm, limits->limit_ppm,
                                  limits->qos, &index);
    if (e != RegionError::kOk) return Fail("cannot create vGPU '" + vgpu_id + "': " + limiter::RegionErrorName(e));
    uint32_t made = 0;
    if (write_tier && region.FindVgpu(vgpu_id.c_str(), &made) == RegionError::kOk && made == index) {
      // Before our slot makes it "in use": a run of the same name joining meanwhile sees no user
      // yet (and writes the same) or the whole policy, never a vGPU in use without it.
      e = region.SetTierPolicy(index, true, swap_ms, disk_ms);
      if (e != RegionError::kOk) return Fail("cannot enable tiering on vGPU '" + vgpu_id + "': " + limiter::RegionErrorName(e));
      // Scale to zero after idle_zero: this process's zero keeper (below) checkpoints the tenant.
      e = region.SetIdleZero(index, zero_ms);
      if (e != RegionError::kOk) return Fail("cannot set --idle-zero on vGPU '" + vgpu_id + "': " + limiter::RegionErrorName(e));
    }
    if (region.AttachProcess(index, getpid(), &guard_slot) != RegionError::kOk) continue;
    uint32_t now = 0;
    guarded = region.FindVgpu(vgpu_id.c_str(), &now) == RegionError::kOk && now == index;
    if (!guarded) region.DetachProcess(guard_slot);  // the slot was reused for another vGPU
  }

  std::string ld = *inject;
  if (const char* old = getenv("LD_LIBRARY_PATH"); old && *old) ld += std::string(":") + old;
  std::string region_path = region.path();

  g_child = fork();
  if (g_child < 0) return Fail(std::string("fork: ") + std::strerror(errno));
  release_if_not_started.started = true;  // from here the command's end releases it (below)
  if (g_child == 0) {
    setenv("LD_LIBRARY_PATH", ld.c_str(), 1);
    setenv("TFUSION_REAL_LIBCUDA", driver->c_str(), 1);
    setenv("TFUSION_REAL_LIBNVML", nvml->c_str(), 1);
    setenv("TFUSION_REGION", region_path.c_str(), 1);
    setenv("TFUSION_VGPU", vgpu_id.c_str(), 1);
    if (run_lock >= 0) fcntl(run_lock, F_SETFD, 0);  // the command holds the vGPU's lock too
    if (!o.disk_tier.empty()) setenv("TFUSION_TIER_DIR", o.disk_tier.c_str(), 1);
    setenv("CUDA_VISIBLE_DEVICES", gpu->uuid.c_str(), 1);
    setenv("TRITON_LIBCUDA_PATH", inject->c_str(), 1);
    if (!mps_dir->empty()) {
      for (const auto& [k, v] : hypervisor::MpsTenantEnv(*mps_dir, limits->limit_ppm, limits->vram_bytes))
        setenv(k.c_str(), v.c_str(), 1);
    }
    // The tenant needs no credential on its own GPU: the controller's token stays with us.
    unsetenv("TFUSION_TOKEN");
    std::vector<char*> argv;
    for (const auto& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    const int why = errno;
    std::fprintf(stderr, "tfusion run: cannot run %s: %s\n", argv[0], std::strerror(why));
    _exit(why == ENOENT ? 127 : 126);  // as a shell: not found, or found and not runnable
  }
  ForwardSignalsTo(g_child);
  int status = 0;
  {
    std::optional<LeaseKeeper> lease;  // started after the fork: the child runs no thread of ours
    if (!pooled_id.empty()) lease.emplace(o, pooled_id);
    // Scale to zero: a checkpointed process of this vGPU asks for its restore while we wait.
    std::optional<hypervisor::ZeroRestorer> restorer;
    if (guarded && tier_on) {
      restorer.emplace(*driver, std::vector<std::string>{region_path}, vgpu_id);
      restorer->Start();
    }
    while (waitpid(g_child, &status, 0) < 0 && errno == EINTR) {
    }
    StopForwardingSignals();
  }
  // The vGPU goes with its last process: RemoveVgpu refuses (busy) while another live process
  // still uses it, e.g. a second `tfusion run --vgpu NAME`, whose own exit removes it later. A
  // locked vGPU goes once nobody holds its lock either: a process the command left running in the
  // background that has not started CUDA yet keeps it, and the sweep after its exit removes it.
  // Pool allocations ("a-...") belong to the node agent, which removes them on release.
  if (guarded) region.DetachProcess(guard_slot);
  if (pooled_id.empty() && run_lock < 0) {
    region.ReapDeadOfVgpu(index);
    region.RemoveVgpu(index, vgpu_id.c_str());
  }
  if (run_lock >= 0) {
    close(run_lock);
    RemoveEndedSessionVgpus();  // our vGPU and lock file unless still held or used, and what others left
  }
  if (!pooled_id.empty()) ReleaseAfterRun(o, pooled_id);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

ComputeFlags ComputeFlagsOf(const RunOptions& o) {
  return ComputeFlags{o.tflops, o.percent, o.tflops_limit, o.percent_limit};
}

StatusOr<std::string> ChooseMpsPipeDirectory(const std::string& flag_value, const std::string& program) {
  std::string source = "--mps-pipe-dir";
  std::string dir = flag_value;
  if (dir.empty()) {
    source = hypervisor::kMpsPipeDirEnv;
    if (const char* env = getenv(hypervisor::kMpsPipeDirEnv); env != nullptr) dir = env;
  }
  if (!dir.empty()) {
    TF_RETURN_IF_ERROR(hypervisor::CheckMpsPipeDirectory(source, dir));
    return dir;
  }
  return PublishedMpsPipeDirectoryIfRunning(program);
}

std::string PublishedMpsPipeDirectoryIfRunning(const std::string& program) {
  std::string why;
  std::string dir = hypervisor::PublishedMpsPipeDirectory(RegionDir(), &why);
  if (!why.empty()) std::fprintf(stderr, "%s: ignoring the node agent's MPS setting: %s\n", program.c_str(), why.c_str());
  if (dir.empty()) return dir;
  if (Status st = hypervisor::CheckMpsPipeDirectory("the node agent's MPS pipe directory", dir); !st.ok()) {
    std::fprintf(stderr, "%s: %s; running without MPS\n", program.c_str(), st.message().c_str());
    return std::string();
  }
  return dir;
}

StatusOr<PreparedVgpu> PrepareVgpu(const RunOptions& o, const std::string& vgpu_id) {
  if (vgpu_id.empty() || vgpu_id.size() >= limiter::kVgpuIdBytes) {
    return InvalidArgument("vGPU id '" + vgpu_id + "' is empty or longer than 63 characters");
  }
  auto driver = FindDriverLibrary("libcuda.so.1", o.driver, "TFUSION_REAL_LIBCUDA");
  if (!driver.ok()) return driver.status();
  auto nvml = FindDriverLibrary("libnvidia-ml.so.1", o.nvml, "TFUSION_REAL_LIBNVML");
  if (!nvml.ok()) return nvml.status();
  auto inject = InjectDir();
  if (!inject.ok()) return inject.status();
  auto gpus = DiscoverGpus(*nvml);
  if (!gpus.ok()) return gpus.status();
  const LocalGpu* gpu = SelectGpu(*gpus, o);
  if (gpu == nullptr) return InvalidArgument(NoSuchGpu(*gpus, o));
  auto limits = ResolveLimits(o, *gpu);
  if (!limits.ok()) return limits.status();
  GpuRegion region;
  limiter::RegionErrorDetail why;
  RegionError e = GpuRegion::Create(RegionDir().c_str(), gpu->uuid.c_str(), gpu->name.c_str(),
                                    gpu->total_bytes, CapacityMtflops(gpu->name), &region, &why);
  if (e != RegionError::kOk) {
    return Unavailable("cannot open the shared region of GPU " + gpu->uuid + ": " +
                       limiter::RegionErrorName(e) + " " + why.message);
  }
  uint32_t index = 0;
  e = region.CreateOrUpdateVgpu(vgpu_id.c_str(), limits->vram_bytes, limits->share_ppm, limits->limit_ppm,
                                limits->qos, &index);
  if (e != RegionError::kOk) {
    return Unavailable("cannot create vGPU '" + vgpu_id + "': " + limiter::RegionErrorName(e));
  }
  if (o.tiering || !o.idle_swap.empty()) {
    uint64_t idle_ms = limiter::DefaultIdleSwapMs(limits->qos);
    if (!o.idle_swap.empty()) {
      auto ms = ParseDurationMs("--idle-swap", o.idle_swap);
      if (!ms.ok()) return ms.status();
      idle_ms = *ms;
    }
    uint64_t disk_ms = 0;  // sessions have no disk tier folder: kept for what `tfusion smi -p` shows
    if (!o.idle_disk.empty()) {
      auto ms = ParseDurationMs("--idle-disk", o.idle_disk);
      if (!ms.ok()) return ms.status();
      disk_ms = *ms;
    }
    e = region.SetTierPolicy(index, true, idle_ms, disk_ms);
    if (e != RegionError::kOk) return Unavailable("cannot enable tiering on vGPU '" + vgpu_id + "'");
    // Scale to zero after idle_zero (the worker's --idle-zero; its zero keeper acts on it). It must
    // be longer than the swap timeout in force, which a client's allocation may have made longer
    // than the worker's: then this session is never checkpointed for idleness, and the log says so.
    uint64_t zero_ms = 0;
    if (!o.idle_zero.empty()) {
      auto ms = ParseDurationMs("--idle-zero", o.idle_zero);
      if (!ms.ok()) return ms.status();
      zero_ms = *ms;
      if (zero_ms != 0 && (idle_ms == 0 || zero_ms <= idle_ms)) {
        std::fprintf(stderr, "tfusion: vGPU %s: --idle-zero %s ignored: %s\n", vgpu_id.c_str(), o.idle_zero.c_str(),
                     idle_ms == 0 ? "it swaps out on request only"
                                  : ("not longer than its idle swap timeout of " + std::to_string(idle_ms) + " ms").c_str());
        zero_ms = 0;
      }
    }
    e = region.SetIdleZero(index, zero_ms);
    if (e != RegionError::kOk) return Unavailable("cannot set --idle-zero on vGPU '" + vgpu_id + "'");
  }
  PreparedVgpu out;
  out.limiter = *inject + "/libcuda.so.1";
  out.env = {{"TFUSION_REAL_LIBCUDA", *driver},
             {"TFUSION_REAL_LIBNVML", *nvml},
             {"TFUSION_REGION", region.path()},
             {"TFUSION_VGPU", vgpu_id},
             {"CUDA_VISIBLE_DEVICES", gpu->uuid}};
  if (!o.mps_pipe_dir.empty()) {
    for (auto& kv : hypervisor::MpsTenantEnv(o.mps_pipe_dir, limits->limit_ppm, limits->vram_bytes))
      out.env.push_back(std::move(kv));
  }
  out.region_path = region.path();
  return out;
}

Status ParseGpuSelector(const std::string& text, RunOptions* o) {
  if (!text.empty() && text.size() <= 4 && text.find_first_not_of("0123456789") == std::string::npos) {
    o->gpu = std::stoi(text);
    o->gpu_uuid.clear();
    return Status::Ok();
  }
  if (text.rfind("GPU-", 0) == 0 && text.size() > 4 && text.size() <= 64 &&
      text.find_first_of(" ,=") == std::string::npos) {
    o->gpu_uuid = text;
    return Status::Ok();
  }
  return InvalidArgument("--gpu " + text + ": give the GPU's index (0, 1, ...) or its UUID (GPU-...)");
}

void RemoveVgpuEverywhere(const std::string& vgpu_id) {
  for (const std::string& f : hypervisor::RegionFiles(RegionDir())) hypervisor::RemoveUnusedVgpu(f, vgpu_id);
}

namespace {

// "25.0%", "100%".
std::string Percent(double ppm) {
  char buf[24];
  if (ppm >= limiter::kShareWholeGpuPpm) std::snprintf(buf, sizeof(buf), "%.0f%%", ppm / 10'000.0);
  else std::snprintf(buf, sizeof(buf), "%.1f%%", ppm / 10'000.0);
  return buf;
}

// The vGPU's GPU-busy time between two snapshots over the wall time between them, in ppm of the
// GPU; -1 when `before` has no such vGPU (it appeared in between) or no time passed.
double UsePpm(const limiter::RegionSnapshot& before, const limiter::RegionSnapshot& after,
              const limiter::VgpuInfo& v) {
  const int64_t wall = after.snapshot_ns - before.snapshot_ns;
  if (wall <= 0) return -1;
  for (uint32_t i = 0; i < before.vgpu_count; ++i) {
    const limiter::VgpuInfo& b = before.vgpus[i];
    if (b.index != v.index || std::strcmp(b.id, v.id) != 0) continue;
    if (v.busy_ns_total < b.busy_ns_total) return -1;
    return static_cast<double>(v.busy_ns_total - b.busy_ns_total) / static_cast<double>(wall) * 1e6;
  }
  return -1;
}

// `tfusion smi -p`: the idle timeouts each tiered vGPU's processes follow (its allocation's
// overrides or the QoS defaults, as the region holds them); IDLE ZERO is carried out by the
// vGPU's zero keeper (tfusion run, the node agent).
// The VGPU column: 24 characters, wider for a longer name (up to 63), so the columns stay aligned.
int VgpuColumnWidth(const limiter::RegionSnapshot& snap) {
  size_t w = 24;
  for (uint32_t i = 0; i < snap.vgpu_count; ++i) w = std::max(w, strnlen(snap.vgpus[i].id, limiter::kVgpuIdBytes));
  return static_cast<int>(w);
}

void PrintTierIdlePolicy(const limiter::RegionSnapshot& snap) {
  const int w = VgpuColumnWidth(snap);
  bool header = false;
  for (uint32_t i = 0; i < snap.vgpu_count; ++i) {
    const auto& v = snap.vgpus[i];
    if (!v.tier_enabled) continue;
    if (!header) std::printf("  %-*s %-10s %-10s %s\n", w, "VGPU", "IDLE SWAP", "IDLE DISK", "IDLE ZERO");
    header = true;
    std::printf("  %-*s %-10s %-10s %s\n", w, v.id, controller::TierIdleText(static_cast<int64_t>(v.idle_swap_ms)).c_str(),
                controller::TierIdleText(static_cast<int64_t>(v.idle_disk_ms)).c_str(),
                controller::TierIdleText(static_cast<int64_t>(v.idle_zero_ms)).c_str());
  }
}

}  // namespace

int SmiCommand(bool all_processes, double sample_seconds) {
  std::vector<std::string> files = hypervisor::RegionFiles(RegionDir());
  if (files.empty()) {
    std::printf("No vGPUs on this machine (no GPU regions in %s).\n", RegionDir().c_str());
    return 0;
  }
  struct Sampled {
    std::string file;
    GpuRegion region;
    std::unique_ptr<limiter::RegionSnapshot> before = std::make_unique<limiter::RegionSnapshot>();
    std::unique_ptr<limiter::RegionSnapshot> after = std::make_unique<limiter::RegionSnapshot>();
  };
  std::vector<Sampled> regions;
  int rc = 0;
  RemoveEndedSessionVgpus();  // left by a worker killed outright: not listed as if still there
  for (const auto& f : files) {
    Sampled s;
    s.file = f;
    limiter::RegionErrorDetail why;
    RegionError e = GpuRegion::Attach(f.c_str(), &s.region, &why);
    if (e != RegionError::kOk) {
      std::fprintf(stderr, "tfusion smi: %s: %s %s\n", f.c_str(), limiter::RegionErrorName(e), why.message);
      rc = 1;
      continue;
    }
    s.region.ReapDead();
    s.region.Snapshot(s.before.get());
    regions.push_back(std::move(s));
  }
  // Current use is a rate: one pause for all GPUs between the two snapshots.
  if (sample_seconds > 0 && !regions.empty()) usleep(static_cast<useconds_t>(sample_seconds * 1e6));
  for (Sampled& s : regions) {
    s.region.Snapshot(s.after.get());
    hypervisor::MakePrintable(s.after.get());  // ids and names a tenant wrote: no terminal escapes
    const limiter::RegionSnapshot& snap = *s.after;
    const int w = VgpuColumnWidth(snap);
    std::printf("GPU %s  %s  %s VRAM  %.1f TFLOPS  host tier %s of %s\n", snap.gpu_uuid, snap.gpu_name,
                FormatBytes(snap.total_vram_bytes).c_str(), snap.capacity_mtflops / 1000.0,
                FormatBytes(snap.host_tier_used_bytes).c_str(), FormatBytes(snap.host_tier_budget_bytes).c_str());
    std::printf("  %-*s %-8s %12s %12s %8s %8s %6s %6s %12s %12s %9s %10s %5s %-9s %10s\n", w, "VGPU", "QOS",
                "VRAM USED", "VRAM LIMIT", "REQUEST", "LIMIT", "USE", "PROCS", "GPU BUSY s", "THROTTLED s",
                "TURNS s", "LAUNCHES", "OOMS", "TIER", "SWAPPED");
    for (uint32_t i = 0; i < snap.vgpu_count; ++i) {
      const auto& v = snap.vgpus[i];
      const double use = sample_seconds > 0 ? UsePpm(*s.before, snap, v) : -1;
      char use_text[16];
      if (use < 0) std::snprintf(use_text, sizeof(use_text), "-");
      else std::snprintf(use_text, sizeof(use_text), "%.1f%%", use / 10'000.0);
      // Tier: the state its processes are in ("mixed" when they differ), bytes in host memory.
      uint64_t swapped = 0;
      int tier_state = -1;
      for (uint32_t k = 0; k < snap.process_count; ++k) {
        const auto& p = snap.processes[k];
        if (p.vgpu_index != v.index || p.tier_state == limiter::kTierOff) continue;
        // Out of VRAM: in host memory, or all of it on the disk tier (its host copies let go).
        swapped += p.tier_state == limiter::kTierOnDisk || p.tier_state == limiter::kTierCheckpointed
                       ? std::max(p.movable_bytes, p.host_bytes)
                       : p.host_bytes;
        tier_state = tier_state < 0 || tier_state == static_cast<int>(p.tier_state) ? static_cast<int>(p.tier_state) : 99;
      }
      const char* tier = !v.tier_enabled ? "-" : tier_state < 0 ? "resident" : tier_state == 99 ? "mixed"
                                                                   : TierStateText(static_cast<uint32_t>(tier_state));
      // The `tfusion run` that holds a slot of its vGPU while its command runs is not one of the
      // vGPU's programs: PROCS counts those only.
      uint32_t programs = v.process_count;
      for (uint32_t k = 0; k < snap.process_count; ++k)
        if (snap.processes[k].vgpu_index == v.index && programs > 0 && hypervisor::IsRunWrapper(snap.processes[k].pid)) --programs;
      std::printf("  %-*s %-8s %12s %12s %8s %8s %6s %6u %12.3f %12.3f %9.3f %10llu %5llu %-9s %10s\n", w, v.id,
                  hypervisor::QosLabel(v.qos), FormatBytes(v.vram_used_bytes).c_str(), FormatBytes(v.vram_limit_bytes).c_str(),
                  Percent(static_cast<double>(v.compute_share_ppm)).c_str(),
                  Percent(static_cast<double>(std::max(v.compute_limit_ppm, v.compute_share_ppm))).c_str(), use_text,
                  programs, v.busy_ns_total / 1e9, v.throttled_ns_total / 1e9, v.held_turn_ns_total / 1e9,
                  static_cast<unsigned long long>(v.launches_total), static_cast<unsigned long long>(v.oom_total),
                  tier, v.tier_enabled ? FormatBytes(swapped).c_str() : "-");
    }
    if (all_processes) {
      std::printf("  %-8s %-*s %12s %12s %-12s %12s %12s %8s\n", "PID", w, "VGPU", "VRAM", "THROTTLED s", "TIER",
                  "IN HOST", "FIXED", "IDLE s");
      for (uint32_t i = 0; i < snap.process_count; ++i) {
        const auto& p = snap.processes[i];
        const char* id = "?";
        for (uint32_t k = 0; k < snap.vgpu_count; ++k) {
          if (snap.vgpus[k].index == p.vgpu_index) id = snap.vgpus[k].id;
        }
        char idle[24] = "-";
        if (p.last_active_ns > 0 && snap.snapshot_ns > p.last_active_ns) {
          std::snprintf(idle, sizeof(idle), "%.1f", (snap.snapshot_ns - p.last_active_ns) / 1e9);
        }
        const bool tiered = p.tier_state != limiter::kTierOff;
        std::printf("  %-8d %-*s %12s %12.3f %-12s %12s %12s %8s\n", p.pid, w, id, FormatBytes(p.vram_bytes).c_str(),
                    p.throttled_ns / 1e9, TierStateText(p.tier_state), tiered ? FormatBytes(p.host_bytes).c_str() : "-",
                    tiered ? FormatBytes(p.fixed_bytes).c_str() : "-", tiered ? idle : "-");
      }
      PrintTierIdlePolicy(snap);
    }
  }
  return rc;
}

}  // namespace tf::cli
