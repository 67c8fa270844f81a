#include "hypervisor/quota_regions.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include "hypervisor/remote_sessions.h"
#include "limiter/core/process_identity.h"

namespace tf::hypervisor {

using limiter::RegionError;

Status RegionStatus(RegionError e, const std::string& what, const limiter::RegionErrorDetail* why) {
  if (e == RegionError::kOk) return Status::Ok();
  std::string m = what + ": " + limiter::RegionErrorName(e);
  if (why && why->message[0]) m += std::string(" (") + why->message + ")";
  switch (e) {
    case RegionError::kInvalidArgument: return InvalidArgument(m);
    case RegionError::kNotFound: return NotFound(m);
    case RegionError::kFull: return ResourceExhausted(m);
    case RegionError::kBusy: return Unavailable(m);
    default: return FailedPrecondition(m);
  }
}

std::string DefaultRegionDir() {
  const char* env = getenv("TFUSION_SHM_DIR");
  return env && *env ? env : limiter::kDefaultRegionDir;
}

namespace {

// The contents of /proc/PID/NAME, at most `max` bytes; nullopt when it cannot be read (gone, or
// another user's process without CAP_SYS_PTRACE: said once per pid on stderr).
std::optional<std::string> ProcFile(pid_t pid, const char* name, size_t max) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/%s", static_cast<int>(pid), name);
  FILE* f = std::fopen(path, "re");
  if (f == nullptr) {
    if (errno == EACCES || errno == EPERM) {
      static std::mutex mu;
      static std::set<pid_t> told;
      std::lock_guard<std::mutex> lock(mu);
      if (told.size() < 4096 && told.insert(pid).second) {
        std::fprintf(stderr, "hypervisor: cannot read %s (%s): without it process %d cannot be checked as a "
                     "tenant and is not signalled or checkpointed (the agent needs CAP_SYS_PTRACE)\n",
                     path, std::strerror(errno), static_cast<int>(pid));
      }
    }
    return std::nullopt;
  }
  std::string out;
  char buf[4096];
  size_t n = 0;
  while (out.size() < max && (n = std::fread(buf, 1, std::min(sizeof(buf), max - out.size()), f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}

// The first TFUSION_VGPU of `pid`'s environment at its start (/proc/PID/environ, as getenv reads
// it): its value, "" when it has none, nullopt when it cannot be read.
std::optional<std::string> VgpuOfEnvironment(pid_t pid) {
  const std::optional<std::string> env = ProcFile(pid, "environ", 256u << 10);
  if (!env) return std::nullopt;
  static constexpr char kKey[] = "TFUSION_VGPU=";
  for (size_t at = 0; at < env->size();) {
    size_t end = env->find('\0', at);
    if (end == std::string::npos) end = env->size();
    if (env->compare(at, sizeof(kKey) - 1, kKey) == 0) return env->substr(at + sizeof(kKey) - 1, end - at - (sizeof(kKey) - 1));
    at = end + 1;
  }
  return std::string();
}

// The parent of `pid`, 0 when unreadable.
pid_t ParentOf(pid_t pid) {
  limiter::ProcessStat st;
  return limiter::ReadProcessStat(pid, &st) ? st.parent : 0;
}

// The TFUSION_VGPU of each child of `pid` that has one (/proc/PID/task/PID/children: those its
// main thread forked, as `tfusion run` forks its command; at most 256 looked at).
std::vector<std::string> VgpusOfChildren(pid_t pid) {
  std::vector<std::string> out;
  char name[48];
  std::snprintf(name, sizeof(name), "task/%d/children", static_cast<int>(pid));
  const std::optional<std::string> list = ProcFile(pid, name, 4096);
  if (!list) return out;
  std::istringstream in(*list);
  int child = 0;
  for (int n = 0; n < 256 && in >> child; ++n) {
    if (child <= 0) continue;
    if (std::optional<std::string> v = VgpuOfEnvironment(child); v && !v->empty()) out.push_back(*v);
  }
  return out;
}

// Whether `pid` was started for `vgpu_id`, or, for "", is a worker session.
bool StartedFor(pid_t pid, const std::string& vgpu_id) {
  const std::optional<std::string> own = VgpuOfEnvironment(pid);
  if (!own) return false;
  if (!vgpu_id.empty() && *own == vgpu_id) return true;  // the common case: a tenant itself
  const std::vector<std::string> children = VgpusOfChildren(pid);
  if (vgpu_id.empty()) {
    // A worker session: started for no vGPU, nor the parent of a process that was, and forked by
    // its worker without an exec (its parent runs the same program with the same command line).
    if (!own->empty() || !children.empty()) return false;
    const pid_t parent = ParentOf(pid);
    if (parent <= 1) return false;
    const std::optional<std::string> cmd = ProcFile(pid, "cmdline", 64u << 10);
    return cmd && !cmd->empty() && cmd == ProcFile(parent, "cmdline", 64u << 10);
  }
  // A child's variable (`tfusion run`, which registers itself beside its command).
  if (std::find(children.begin(), children.end(), vgpu_id) != children.end()) return true;
  if (!own->empty()) return false;  // started for another vGPU
  // None of its own (a program that rewrote its environment area, as setproctitle does, or was
  // started with a cleared environment): the variable of its nearest ancestor that has one.
  pid_t a = ParentOf(pid);
  for (int depth = 0; a > 1 && depth < 4; ++depth, a = ParentOf(a)) {
    const std::optional<std::string> v = VgpuOfEnvironment(a);
    if (!v) return false;
    if (!v->empty()) return *v == vgpu_id;
  }
  return false;
}

}  // namespace

bool IsRunWrapper(int32_t pid) {
  if (pid <= 0) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string arg;
  if (!std::getline(in, arg, '\0')) return false;
  const size_t slash = arg.rfind('/');
  if ((slash == std::string::npos ? arg : arg.substr(slash + 1)) != "tfusion") return false;
  for (int i = 0; i < 64 && std::getline(in, arg, '\0'); ++i) {
    if (arg == "--") return false;
    if (arg == "run") return true;
    if (arg.empty() || arg[0] != '-') return false;  // another subcommand
  }
  return false;
}

bool IsTenantOfRegion(pid_t pid, uint64_t start_ticks, const std::string& region_path, const std::string& vgpu_id) {
  // Never the agent itself, whatever a slot says.
  if (pid <= 0 || pid == getpid() || !limiter::ProcessAlive(pid, start_ticks)) return false;
  if (!StartedFor(pid, vgpu_id)) return false;
  struct stat st {};
  if (stat(region_path.c_str(), &st) != 0) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/maps", static_cast<int>(pid));
  FILE* f = std::fopen(path, "re");
  if (f == nullptr) return false;
  // Each line: range perms offset major:minor inode [path].
  char line[4352];
  bool found = false;
  while (!found && std::fgets(line, sizeof(line), f) != nullptr) {
    unsigned major_no = 0, minor_no = 0;
    unsigned long long inode = 0;
    if (std::sscanf(line, "%*s %*s %*s %x:%x %llu", &major_no, &minor_no, &inode) != 3) continue;
    found = inode == static_cast<unsigned long long>(st.st_ino) && major_no == major(st.st_dev) &&
            minor_no == minor(st.st_dev);
  }
  std::fclose(f);
  return found && limiter::ProcessAlive(pid, start_ticks);  // still that process after the read
}

std::vector<std::string> RegionFiles(const std::string& dir) {
  std::vector<std::string> files;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return files;
  while (dirent* ent = readdir(d)) {
    std::string f(ent->d_name);
    if (f.rfind("gpu-", 0) == 0 && f.size() > 7 && f.substr(f.size() - 7) == ".region") files.push_back(dir + "/" + f);
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  return files;
}

void AttachRegionsOnce(const std::vector<std::string>& paths, std::vector<std::unique_ptr<limiter::GpuRegion>>* regions) {
  if (regions->size() == paths.size()) return;
  regions->clear();
  for (const auto& p : paths) {
    auto r = std::make_unique<limiter::GpuRegion>();
    limiter::GpuRegion::Attach(p.c_str(), r.get());
    regions->push_back(std::move(r));
  }
}

QuotaRegions::QuotaRegions(std::string dir) : dir_(dir.empty() ? DefaultRegionDir() : std::move(dir)) {}

Status QuotaRegions::AttachGpu(const DiscoveredGpu& gpu, double capacity_tflops) {
  auto region = std::make_unique<limiter::GpuRegion>();
  limiter::RegionErrorDetail why;
  const uint64_t vram_bytes = static_cast<uint64_t>(gpu.memory_total_mib) << 20;
  const uint64_t mtflops = capacity_tflops > 0 ? static_cast<uint64_t>(capacity_tflops * 1000.0 + 0.5) : 0;
  RegionError e = limiter::GpuRegion::Create(dir_.c_str(), gpu.uuid.c_str(), gpu.name.c_str(),
                                             vram_bytes, mtflops, region.get(), &why);
  if (e != RegionError::kOk) return RegionStatus(e, "quota region of " + gpu.uuid + " in " + dir_, &why);
  regions_[gpu.uuid] = std::move(region);
  return Status::Ok();
}

Status QuotaRegions::Sync(const std::vector<VgpuAssignment>& assignments,
                          std::vector<LingeringVgpu>* lingering) {
  Status first;
  auto note = [&](const Status& s) {
    if (!s.ok() && first.ok()) first = s;
  };
  std::map<std::string, std::set<std::string>> wanted;  // GPU uuid -> vGPU ids
  // Worker sessions bound to the allocations (remote_sessions.h) are looked up in one snapshot
  // of each region, taken before this pass.
  std::map<std::string, std::unique_ptr<limiter::RegionSnapshot>> sessions;
  for (auto& [uuid, r] : regions_) {
    sessions[uuid] = std::make_unique<limiter::RegionSnapshot>();
    r->Snapshot(sessions[uuid].get());
  }
  const bool keeper_alive = RemoteZeroKeeperAlive(dir_);
  for (const VgpuAssignment& a : assignments) {
    limiter::GpuRegion* r = region(a.gpu_uuid);
    if (r == nullptr) continue;
    wanted[a.gpu_uuid].insert(a.id);
    uint32_t index = 0;
    uint64_t share = a.compute_share_ppm > 0 ? a.compute_share_ppm : limiter::kShareWholeGpuPpm;
    uint64_t limit = std::max(a.compute_limit_ppm, share);
    if (a.held) share = limit = kHeldSharePpm;
    const uint32_t qos = std::min(a.qos, limiter::kMaxQos);
    RegionError made = r->CreateOrUpdateVgpu(a.id.c_str(), a.vram_limit_bytes, share, limit, qos, &index);
    note(RegionStatus(made, "vGPU " + a.id + " on " + a.gpu_uuid));
    if (made == RegionError::kOk && a.tiering) {
      limiter::VgpuTier* t = r->TierOfVgpu(index);
      const uint64_t swap_ms = a.idle_swap_ms >= 0 ? static_cast<uint64_t>(a.idle_swap_ms) : limiter::DefaultIdleSwapMs(qos);
      const uint64_t disk_ms = a.idle_disk_ms >= 0 ? static_cast<uint64_t>(a.idle_disk_ms) : limiter::DefaultIdleDiskMs(qos);
      if (t != nullptr && (t->enabled.load() == 0 || t->idle_swap_ms.load() != swap_ms || t->idle_disk_ms.load() != disk_ms)) {
        note(RegionStatus(r->SetTierPolicy(index, true, swap_ms, disk_ms), "tiering of vGPU " + a.id));
      }
      // Each new API request once; the counters live in the region, so a restarted agent does not
      // repeat an old request.
      const uint64_t zero_ms = a.idle_zero_ms > 0 ? static_cast<uint64_t>(a.idle_zero_ms) : limiter::DefaultIdleZeroMs(qos);
      if (t != nullptr && t->idle_zero_ms.load() != zero_ms) {
        note(RegionStatus(r->SetIdleZero(index, zero_ms), "idle zero timeout of vGPU " + a.id));
      }
      if (t != nullptr && t->api_freeze_gen.load() != a.freeze_requests) {
        note(RegionStatus(r->RequestFreeze(index, nullptr), "freeze of vGPU " + a.id));
        t->api_freeze_gen.store(a.freeze_requests);
      }
      // After the freeze it belongs to: the zero keeper checkpoints once the swap-out is done.
      if (t != nullptr && t->api_zero_gen.load() != a.zero_requests) {
        note(RegionStatus(r->RequestZero(index), "zero request of vGPU " + a.id));
        t->api_zero_gen.store(a.zero_requests);
        std::fprintf(stderr, "hypervisor: vGPU %s on %s: scale to zero requested\n", a.id.c_str(), a.gpu_uuid.c_str());
      }
      if (t != nullptr && t->api_thaw_gen.load() != a.thaw_requests) {
        note(RegionStatus(r->RequestThaw(index, nullptr), "thaw of vGPU " + a.id));
        t->api_thaw_gen.store(a.thaw_requests);
      }
    }
    note(SyncBoundSessions(*r, *sessions[a.gpu_uuid], a, keeper_alive, lingering));
    if (limiter::VgpuTier* t = made == RegionError::kOk ? r->TierOfVgpu(index) : nullptr;
        t != nullptr && (t->held.load() != 0) != a.held) {
      note(RegionStatus(r->SetHold(index, a.held), "hold of vGPU " + a.id));
      std::fprintf(stderr, "hypervisor: vGPU %s on %s %s\n", a.id.c_str(), a.gpu_uuid.c_str(),
                   a.held ? "suspended: held swapped out until the controller resumes it" : "resumed: hold released");
      if (!a.held && t->enabled.load() != 0) note(RegionStatus(r->RequestThaw(index, nullptr), "thaw of vGPU " + a.id));
    }
  }
  std::set<std::string> allocations;  // every GPU's: a session may sit on another GPU than its allocation
  for (const VgpuAssignment& a : assignments) allocations.insert(a.id);
  auto snapshot = std::make_unique<limiter::RegionSnapshot>();
  for (auto& [uuid, r] : regions_) {
    r->Snapshot(snapshot.get());
    const std::set<std::string>& keep = wanted[uuid];
    for (uint32_t i = 0; i < snapshot->vgpu_count; ++i) {
      const limiter::VgpuInfo& v = snapshot->vgpus[i];
      std::string id = v.id;
      if (const std::string bound = BoundAllocation(id); !bound.empty() && !allocations.count(bound)) {
        // A worker session of an allocation taken back: its session process is stopped as the
        // allocation's own processes are; the worker removes the vGPU when the session ends.
        std::vector<limiter::ProcessInfo> session = LiveSessionProcess(*snapshot, v, r->path());
        if (lingering != nullptr && !session.empty()) {
          LingeringVgpu l;
          l.gpu_uuid = uuid;
          l.id = id;
          l.processes = std::move(session);
          l.allocation = bound;
          lingering->push_back(std::move(l));
        }
        continue;
      }
      if (id.rfind("a-", 0) != 0 || keep.count(id)) continue;
      RegionError e = r->RemoveVgpu(v.index, v.id);
      if (e == RegionError::kBusy) {  // a live process still uses it: next Sync
        if (lingering == nullptr) continue;
        LingeringVgpu l{uuid, id, {}, "", "", false};
        for (uint32_t p = 0; p < snapshot->process_count; ++p) {
          const limiter::ProcessInfo& info = snapshot->processes[p];
          if (info.vgpu_index == v.index && IsTenantOfRegion(info.pid, info.start_time_ticks, r->path(), id))
            l.processes.push_back(info);
        }
        lingering->push_back(std::move(l));
        continue;
      }
      note(RegionStatus(e, "removing vGPU " + id + " from " + uuid));
    }
  }
  return first;
}

void QuotaRegions::DetachAll() { regions_.clear(); }

std::vector<std::string> QuotaRegions::attached() const {
  std::vector<std::string> out;
  for (const auto& [uuid, r] : regions_) out.push_back(uuid);
  return out;
}

limiter::GpuRegion* QuotaRegions::region(const std::string& gpu_uuid) {
  auto it = regions_.find(gpu_uuid);
  return it == regions_.end() ? nullptr : it->second.get();
}

}  // namespace tf::hypervisor
