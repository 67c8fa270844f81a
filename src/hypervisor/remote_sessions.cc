// Remote worker sessions bound to a pool allocation: see remote_sessions.h.
#include "hypervisor/remote_sessions.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string_view>

#include "hypervisor/quota_regions.h"
#include "limiter/core/process_identity.h"
#include "limiter/core/tier_defaults.h"

namespace tf::hypervisor {

namespace {

constexpr char kSessionPrefix[] = "remote-";
constexpr char kRunPrefix[] = "run-";
constexpr char kNamedLockPrefix[] = "vgpu-";  // the lock file of a run vGPU of another name: "vgpu-HEX.lock"

// The bytes hex digits (lower case, two per byte) spell, or "" when `hex` is not such a spelling.
std::string FromHex(const std::string& hex) {
  auto digit = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  std::string out;
  if (hex.size() % 2 != 0) return "";
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = digit(hex[i]), lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0) return "";
    out += static_cast<char>(hi * 16 + lo);
  }
  return out;
}

// The pid part of "PREFIX-PID[@...]", or -1.
long PidAfter(const std::string& vgpu_id, std::string_view prefix) {
  if (vgpu_id.rfind(prefix, 0) != 0) return -1;
  size_t i = prefix.size();
  long pid = 0;
  size_t digits = 0;
  for (; i < vgpu_id.size() && vgpu_id[i] >= '0' && vgpu_id[i] <= '9' && digits < 10; ++i, ++digits)
    pid = pid * 10 + (vgpu_id[i] - '0');
  if (digits == 0 || (i < vgpu_id.size() && vgpu_id[i] != '@')) return -1;
  return pid;
}

long SessionPidOf(const std::string& vgpu_id) { return PidAfter(vgpu_id, kSessionPrefix); }

}  // namespace

bool IsAllocationId(const std::string& id) {
  if (id.size() < 3 || id.size() > 42 || id.rfind("a-", 0) != 0) return false;
  for (size_t i = 2; i < id.size(); ++i)
    if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'z'))) return false;
  return true;
}

std::string SessionVgpuId(pid_t session, const std::string& allocation) {
  std::string id = kSessionPrefix + std::to_string(session);
  return allocation.empty() ? id : id + "@" + allocation;
}

std::string BoundAllocation(const std::string& vgpu_id) {
  if (SessionPidOf(vgpu_id) < 0) return "";
  size_t at = vgpu_id.find('@');
  if (at == std::string::npos) return "";
  std::string allocation = vgpu_id.substr(at + 1);
  return IsAllocationId(allocation) ? allocation : "";
}

bool IsVgpuOfSession(const std::string& vgpu_id, pid_t session) { return SessionPidOf(vgpu_id) == session; }

pid_t SessionOfVgpu(const std::string& vgpu_id) {
  const long pid = SessionPidOf(vgpu_id);
  return pid > 0 && pid <= 0x7FFFFFFF ? static_cast<pid_t>(pid) : -1;
}

std::vector<limiter::ProcessInfo> LiveSessionProcess(const limiter::RegionSnapshot& snap, const limiter::VgpuInfo& v,
                                                     const std::string& region_path) {
  std::vector<limiter::ProcessInfo> out;
  const pid_t session = SessionOfVgpu(v.id);
  if (session <= 0) return out;
  for (uint32_t k = 0; k < snap.process_count; ++k) {
    const limiter::ProcessInfo& p = snap.processes[k];
    // "": a worker session, started for no vGPU itself.
    if (p.vgpu_index == v.index && p.pid == session && IsTenantOfRegion(p.pid, p.start_time_ticks, region_path, "")) {
      out.push_back(p);
      break;
    }
  }
  return out;
}

Status MarkSessionVgpuNotAdopted(const std::string& region_path, const std::string& vgpu_id) {
  limiter::GpuRegion region;
  limiter::RegionErrorDetail why;
  TF_RETURN_IF_ERROR(RegionStatus(limiter::GpuRegion::Attach(region_path.c_str(), &region, &why),
                                  "region " + region_path, &why));
  uint32_t index = 0;
  TF_RETURN_IF_ERROR(RegionStatus(region.FindVgpu(vgpu_id.c_str(), &index), "vGPU " + vgpu_id));
  limiter::VgpuTier* t = region.TierOfVgpu(index);
  if (t == nullptr) return FailedPrecondition("vGPU " + vgpu_id + " has no tier block");
  t->api_freeze_gen.store(kRequestsNotAdopted);
  t->api_thaw_gen.store(kRequestsNotAdopted);
  t->api_zero_gen.store(kRequestsNotAdopted);
  return Status::Ok();
}

std::string RemoteZeroKeeperLockPath(const std::string& region_dir) { return region_dir + "/remote-zero-keeper.lock"; }

int HoldRemoteZeroKeeperLock(const std::string& region_dir) {
  if (mkdir(region_dir.c_str(), 01777) == 0) chmod(region_dir.c_str(), 01777);  // as GpuRegion::Create makes it
  const std::string path = RemoteZeroKeeperLockPath(region_dir);
  int fd = open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  fchmod(fd, 0644);  // whoever made it: readable by the node agent (a lock needs only a read descriptor)
  while (flock(fd, LOCK_SH) != 0) {
    if (errno != EINTR) {
      close(fd);
      return -1;
    }
  }
  return fd;
}

bool RemoteZeroKeeperAlive(const std::string& region_dir) {
  int fd = open(RemoteZeroKeeperLockPath(region_dir).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool alive = false;
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    alive = errno == EWOULDBLOCK;
  } else {
    flock(fd, LOCK_UN);
  }
  close(fd);
  return alive;
}

namespace {

// True when `fd` and `path` name the same file (it was not removed or replaced since `fd` opened it).
bool SameFile(int fd, const std::string& path) {
  struct stat a, b;
  return fstat(fd, &a) == 0 && lstat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// A lock file of the lock folder, opened read-only (a lock needs no more), never blocking (a FIFO
// put there would block a plain open) and never through a link; -1 unless it is a regular file.
int OpenLockFile(const std::string& path, bool create) {
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC | (create ? O_CREAT : 0), 0600);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    errno = EINVAL;
    return -1;
  }
  return fd;
}

}  // namespace

std::string SessionLockDir(const std::string& region_dir) {
  return region_dir + "/session-locks-" + std::to_string(geteuid());
}

bool SessionLockDirTrusted(const std::string& region_dir, bool create, std::string* why) {
  const std::string dir = SessionLockDir(region_dir);
  if (create) {
    if (mkdir(region_dir.c_str(), 01777) == 0) chmod(region_dir.c_str(), 01777);  // as GpuRegion::Create makes it
    mkdir(dir.c_str(), 0700);
  }
  struct stat st;
  std::string problem;
  if (lstat(dir.c_str(), &st) != 0) problem = std::string("cannot read it: ") + strerror(errno);
  else if (!S_ISDIR(st.st_mode)) problem = "it is not a directory";
  else if (st.st_uid != geteuid()) problem = "another user owns it";
  else if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%03o", static_cast<unsigned>(st.st_mode & 0777));
    problem = std::string("other users can use it (mode ") + mode + ", not 700)";
  }
  if (problem.empty()) return true;
  if (why != nullptr) *why = "the session lock folder " + dir + " is not usable: " + problem;
  return false;
}

std::string RunVgpuId(pid_t run) { return kRunPrefix + std::to_string(run); }

std::string SessionVgpuLockPath(const std::string& region_dir, const std::string& vgpu_id) {
  const pid_t session = SessionOfVgpu(vgpu_id);
  const long run = PidAfter(vgpu_id, kRunPrefix);
  // Only the canonical spelling: the id comes from a region any tenant can write, and it names a file.
  const bool canonical = session > 0 ? SessionVgpuId(session, BoundAllocation(vgpu_id)) == vgpu_id
                                     : run > 0 && run <= 0x7FFFFFFF && RunVgpuId(static_cast<pid_t>(run)) == vgpu_id;
  if (canonical) return SessionLockDir(region_dir) + "/" + vgpu_id + ".lock";
  // Any other name a run may give (`--vgpu NAME`, or "run-PID-XXXXXXXX"), spelt in hex: it may hold
  // any character. Not a pool allocation's ("a-..."), which the node agent makes and removes.
  if (session > 0 || vgpu_id.empty() || vgpu_id.size() >= limiter::kVgpuIdBytes || vgpu_id.rfind("a-", 0) == 0 ||
      vgpu_id.find('\0') != std::string::npos)
    return "";
  std::string path = SessionLockDir(region_dir) + "/" + kNamedLockPrefix;
  static constexpr char kHex[] = "0123456789abcdef";
  for (unsigned char c : vgpu_id) {
    path += kHex[c >> 4];
    path += kHex[c & 15];
  }
  return path + ".lock";
}

int HoldSessionVgpuLock(const std::string& region_dir, const std::string& vgpu_id, std::string* why) {
  const std::string path = SessionVgpuLockPath(region_dir, vgpu_id);
  if (path.empty()) {
    *why = "\"" + vgpu_id + "\" is not a session or run vGPU id";
    return -1;
  }
  if (!SessionLockDirTrusted(region_dir, true, why)) return -1;
  // A reaper holds it exclusively while it removes a vGPU of the same id (a session of an earlier
  // worker with this pid); a file it removed meanwhile is made afresh.
  for (int attempt = 0; attempt < 1000; ++attempt) {
    int fd = OpenLockFile(path, true);
    if (fd < 0) {
      *why = "cannot open " + path + ": " + strerror(errno);
      return -1;
    }
    if (flock(fd, LOCK_SH | LOCK_NB) == 0) {
      if (SameFile(fd, path)) return fd;
    } else if (errno != EWOULDBLOCK && errno != EINTR) {
      *why = "cannot lock " + path + ": " + strerror(errno);
      close(fd);
      return -1;
    }
    close(fd);
    usleep(10'000);
  }
  *why = "another process kept " + path + " locked for 10 s";
  return -1;
}

SessionState SessionVgpuState(const std::string& region_dir, const std::string& vgpu_id, int* held_fd) {
  *held_fd = -1;
  const std::string path = SessionVgpuLockPath(region_dir, vgpu_id);
  if (path.empty() || !SessionLockDirTrusted(region_dir, false, nullptr)) return SessionState::kUnknown;
  int fd = OpenLockFile(path, false);
  if (fd < 0) return errno == ENOENT ? SessionState::kUnknown : SessionState::kLive;  // not ours to judge
  if (flock(fd, LOCK_EX | LOCK_NB) != 0 || !SameFile(fd, path)) {
    close(fd);
    return SessionState::kLive;
  }
  *held_fd = fd;
  return SessionState::kEnded;
}

void DropSessionVgpuLock(const std::string& region_dir, const std::string& vgpu_id, int held_fd) {
  if (held_fd < 0) return;
  const std::string path = SessionVgpuLockPath(region_dir, vgpu_id);
  if (!path.empty() && SameFile(held_fd, path)) unlink(path.c_str());
  close(held_fd);
}

std::vector<std::string> SessionLockIds(const std::string& region_dir) {
  std::vector<std::string> ids;
  if (!SessionLockDirTrusted(region_dir, false, nullptr)) return ids;
  const std::string dir = SessionLockDir(region_dir);
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return ids;
  constexpr std::string_view kSuffix = ".lock";
  while (dirent* e = readdir(d)) {
    std::string_view name = e->d_name;
    if (name.size() <= kSuffix.size() || name.substr(name.size() - kSuffix.size()) != kSuffix) continue;
    std::string id(name.substr(0, name.size() - kSuffix.size()));
    if (id.rfind(kNamedLockPrefix, 0) == 0) id = FromHex(id.substr(std::strlen(kNamedLockPrefix)));
    if (SessionVgpuLockPath(region_dir, id) == dir + "/" + std::string(name)) ids.push_back(std::move(id));
  }
  closedir(d);
  return ids;
}

namespace {

struct EndedSweep {
  bool had = false;   // a region file held a vGPU of the id
  bool left = false;  // one still does (a live process uses it), or a file could not be read
};

// With the ended lock of `id` held (`held`, from SessionVgpuState), removes the vGPU of that id
// from every region file unless a live process still uses it, looked up again while the lock is
// held (no session or run of this id can make its vGPU meanwhile). Its lock file goes once no
// vGPU of the id is left; otherwise it stays for a later sweep, and `held` is closed.
EndedSweep SweepEndedVgpu(const std::string& dir, const std::vector<std::string>& files, const std::string& id,
                          int held) {
  EndedSweep out;
  for (const std::string& f : files) {
    limiter::GpuRegion region;
    if (limiter::GpuRegion::Attach(f.c_str(), &region) != limiter::RegionError::kOk) {
      out.left = true;  // unknown: its lock file stays, and so does the question
      continue;
    }
    uint32_t index = 0;
    if (region.FindVgpu(id.c_str(), &index) != limiter::RegionError::kOk) continue;
    out.had = true;
    RemoveUnusedVgpu(f, id);  // refused (kept) while a live process still uses it
    if (region.FindVgpu(id.c_str(), &index) == limiter::RegionError::kOk) out.left = true;
  }
  if (out.left) {
    close(held);
  } else {
    DropSessionVgpuLock(dir, id, held);
  }
  return out;
}

}  // namespace

std::vector<std::string> RemoveEndedSessionVgpus(const std::string& dir) {
  std::vector<std::string> removed;
  if (!SessionLockDirTrusted(dir, false, nullptr)) return removed;
  const std::vector<std::string> files = RegionFiles(dir);
  // Every session or run vGPU id of a region, and every lock file's (its session may have ended
  // before making its vGPU).
  std::set<std::string> ids;
  auto snap = std::make_unique<limiter::RegionSnapshot>();
  for (const std::string& f : files) {
    limiter::GpuRegion region;
    if (limiter::GpuRegion::Attach(f.c_str(), &region) != limiter::RegionError::kOk) continue;
    region.Snapshot(snap.get());
    for (uint32_t i = 0; i < snap->vgpu_count; ++i) {
      std::string id = snap->vgpus[i].id;  // Snapshot ends every id
      if (!SessionVgpuLockPath(dir, id).empty()) ids.insert(std::move(id));
    }
  }
  for (std::string& id : SessionLockIds(dir)) ids.insert(std::move(id));
  for (const std::string& id : ids) {
    int held = -1;
    if (SessionVgpuState(dir, id, &held) != SessionState::kEnded) continue;
    const EndedSweep swept = SweepEndedVgpu(dir, files, id, held);
    if (swept.had && !swept.left) removed.push_back(id);
  }
  return removed;
}

void RemoveUnusedVgpu(const std::string& region_path, const std::string& vgpu_id) {
  limiter::GpuRegion region;
  if (limiter::GpuRegion::Attach(region_path.c_str(), &region) != limiter::RegionError::kOk) return;
  uint32_t index = 0;
  if (region.FindVgpu(vgpu_id.c_str(), &index) != limiter::RegionError::kOk) return;
  region.ReapDeadOfVgpu(index);
  region.RemoveVgpu(index, vgpu_id.c_str());
}

bool ClearEndedVgpuOfId(const std::string& region_dir, const std::string& vgpu_id) {
  int held = -1;
  const SessionState state = SessionVgpuState(region_dir, vgpu_id, &held);
  if (state == SessionState::kLive) return false;
  const std::vector<std::string> files = RegionFiles(region_dir);
  if (state == SessionState::kEnded) return !SweepEndedVgpu(region_dir, files, vgpu_id, held).left;
  // Without a lock file in our folder the vGPU may be another user's (whose lock we cannot see),
  // or a process of another PID namespace's, whose pids this /proc cannot judge: nothing is
  // removed on this /proc's word, and the id is free only where no region holds it.
  for (const std::string& f : files) {
    limiter::GpuRegion region;
    uint32_t index = 0;
    if (limiter::GpuRegion::Attach(f.c_str(), &region) != limiter::RegionError::kOk ||
        region.FindVgpu(vgpu_id.c_str(), &index) == limiter::RegionError::kOk)
      return false;
  }
  return true;
}

// The allocation's suspension reaches its session's vGPU `id` (slot `index`, tier block `t`, with
// tiering) as it reaches the allocation's own (QuotaRegions::Sync): held with the least compute
// share, then the allocation's request and limit again and a thaw. Also before the session's
// process has bound to it, so that a session binding while its allocation is held starts held.
Status SyncSessionHold(limiter::GpuRegion& r, uint32_t index, limiter::VgpuTier* t, const std::string& id,
                       const VgpuAssignment& a) {
  if ((t->held.load() != 0) == a.held) return Status::Ok();
  uint64_t share = a.compute_share_ppm > 0 ? a.compute_share_ppm : limiter::kShareWholeGpuPpm;
  uint64_t limit = std::max(a.compute_limit_ppm, share);
  if (a.held) share = limit = kHeldSharePpm;
  Status st = RegionStatus(r.SetHold(index, a.held), "hold of vGPU " + id);
  Status compute = RegionStatus(r.UpdateVgpuCompute(id.c_str(), share, limit), "compute share of vGPU " + id);
  if (st.ok()) st = compute;
  std::fprintf(stderr, "hypervisor: allocation %s: remote session vGPU %s %s\n", a.id.c_str(), id.c_str(),
               a.held ? "suspended: held swapped out until the controller resumes it" : "resumed: hold released");
  if (!a.held) {
    Status thaw = RegionStatus(r.RequestThaw(index, nullptr), "thaw of vGPU " + id);
    if (st.ok()) st = thaw;
  }
  return st;
}

Status SyncBoundSessions(limiter::GpuRegion& r, const limiter::RegionSnapshot& snap, const VgpuAssignment& a,
                         bool keeper_alive, std::vector<LingeringVgpu>* stop) {
  Status first;
  auto note = [&](const Status& s) {
    if (!s.ok() && first.ok()) first = s;
  };
  for (uint32_t i = 0; i < snap.vgpu_count; ++i) {
    const limiter::VgpuInfo& v = snap.vgpus[i];
    const std::string id = v.id;
    if (BoundAllocation(id) != a.id) continue;
    uint32_t index = 0;
    if (r.FindVgpu(id.c_str(), &index) != limiter::RegionError::kOk || index != v.index) continue;
    limiter::VgpuTier* t = r.TierOfVgpu(index);
    if (t == nullptr) continue;
    if (t->enabled.load() != 0) note(SyncSessionHold(r, index, t, id, a));
    // The rest only once its session process has bound to it (the worker makes the vGPU just
    // before).
    bool live = false;
    for (uint32_t k = 0; k < snap.process_count && !live; ++k) {
      const limiter::ProcessInfo& p = snap.processes[k];
      live = p.vgpu_index == v.index && limiter::ProcessAlive(p.pid, p.start_time_ticks);
    }
    if (!live) continue;
    if (a.held && t->enabled.load() == 0) {
      // Nothing to swap out: the session would keep the VRAM its preemptor was promised.
      std::vector<limiter::ProcessInfo> session = LiveSessionProcess(snap, v, r.path());
      if (stop != nullptr && !session.empty()) {
        LingeringVgpu l;
        l.gpu_uuid = a.gpu_uuid;
        l.id = id;
        l.processes = std::move(session);
        l.allocation = a.id;
        l.reason = "preempted";
        l.cannot_hold = true;
        stop->push_back(std::move(l));
      }
      continue;
    }
    if (t->api_freeze_gen.load() == kRequestsNotAdopted || t->api_thaw_gen.load() == kRequestsNotAdopted ||
        t->api_zero_gen.load() == kRequestsNotAdopted) {
      t->api_freeze_gen.store(a.freeze_requests);
      t->api_thaw_gen.store(a.thaw_requests);
      t->api_zero_gen.store(a.zero_requests);
      std::fprintf(stderr, "hypervisor: remote session vGPU %s follows allocation %s's tier requests\n", id.c_str(),
                   a.id.c_str());
    }
    const bool tiered = t->enabled.load() != 0;
    if (a.tiering && tiered) {
      // What the allocation's own vGPU gets (QuotaRegions::Sync): the overrides, else the QoS's.
      const uint32_t qos = std::min(a.qos, limiter::kMaxQos);
      const uint64_t swap_ms = a.idle_swap_ms >= 0 ? static_cast<uint64_t>(a.idle_swap_ms) : limiter::DefaultIdleSwapMs(qos);
      const uint64_t disk_ms = a.idle_disk_ms >= 0 ? static_cast<uint64_t>(a.idle_disk_ms) : limiter::DefaultIdleDiskMs(qos);
      if (t->idle_swap_ms.load() != swap_ms || t->idle_disk_ms.load() != disk_ms)
        note(RegionStatus(r.SetTierPolicy(index, true, swap_ms, disk_ms), "tiering of vGPU " + id));
      const uint64_t zero_ms = a.idle_zero_ms > 0 ? static_cast<uint64_t>(a.idle_zero_ms) : limiter::DefaultIdleZeroMs(qos);
      if (t->idle_zero_ms.load() != zero_ms) note(RegionStatus(r.SetIdleZero(index, zero_ms), "idle zero timeout of vGPU " + id));
    }
    const bool zero_new = t->api_zero_gen.load() != a.zero_requests;
    const bool freeze_new = t->api_freeze_gen.load() != a.freeze_requests;
    if (zero_new && (!keeper_alive || !tiered)) {
      // Checkpointed with nobody to restore it, the session would hang its client's next call.
      t->api_freeze_gen.store(a.freeze_requests);
      t->api_zero_gen.store(a.zero_requests);
      std::fprintf(stderr,
                   "hypervisor: allocation %s: scale to zero of remote session vGPU %s refused: its worker has no "
                   "zero keeper (%s); the session was neither frozen nor checkpointed\n",
                   a.id.c_str(), id.c_str(),
                   tiered ? "none holds the lock: a keeper that could not start, or a worker older than this"
                          : "it runs without --tiering");
    } else if (tiered) {
      if (freeze_new) {
        note(RegionStatus(r.RequestFreeze(index, nullptr), "freeze of vGPU " + id));
        t->api_freeze_gen.store(a.freeze_requests);
      }
      if (zero_new) {
        note(RegionStatus(r.RequestZero(index), "zero request of vGPU " + id));
        t->api_zero_gen.store(a.zero_requests);
        std::fprintf(stderr, "hypervisor: allocation %s: scale to zero of remote session vGPU %s requested\n",
                     a.id.c_str(), id.c_str());
      }
    } else {
      t->api_freeze_gen.store(a.freeze_requests);  // nothing to move without tiering
    }
    if (t->api_thaw_gen.load() != a.thaw_requests) {
      if (tiered) note(RegionStatus(r.RequestThaw(index, nullptr), "thaw of vGPU " + id));
      t->api_thaw_gen.store(a.thaw_requests);
    }
  }
  return first;
}

}  // namespace tf::hypervisor
