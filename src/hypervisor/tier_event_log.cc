#include "hypervisor/tier_event_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iterator>
#include <set>

#include "hypervisor/quota_regions.h"

namespace tf::hypervisor {

namespace {

// Text written by another process (a vGPU id, a command name), made safe for one log line.
std::string Printable(const char* s, size_t max) {
  std::string out;
  for (size_t i = 0; i < max && s[i] != '\0'; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    out += c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?';
  }
  return out;
}

// The command name of `pid` (the agent shares the tenants' PID namespace), empty when unreadable.
std::string CommandOf(int32_t pid) {
  if (pid <= 0) return "";
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/comm", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[64] = {};
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return "";
  buf[n] = '\0';
  if (buf[n - 1] == '\n') buf[n - 1] = '\0';
  return Printable(buf, sizeof(buf));
}

std::string Describe(const limiter::TierEventRead& e) {
  char what[160];
  switch (e.kind) {
    case limiter::kTierEventSwapOut:
      snprintf(what, sizeof(what), "swapped out %u MiB to host memory", e.host_mib);
      break;
    case limiter::kTierEventSwapIn:
      snprintf(what, sizeof(what), "swapped in %u MiB (%u MiB from host memory, %u MiB from the disk tier)",
               e.host_mib + e.disk_mib, e.host_mib, e.disk_mib);
      break;
    default:
      snprintf(what, sizeof(what), "moved %u MiB from host memory to the disk tier", e.disk_mib);
      break;
  }
  char line[256];
  snprintf(line, sizeof(line), "%s in %.1f ms (cause: %s)", what, e.duration_us / 1e3,
           limiter::TierEventCauseLabel(e.cause));
  return line;
}

}  // namespace

TierEventLog::TierEventLog(std::vector<std::string> region_paths, std::string log_prefix,
                           std::function<void(const std::string&)> sink)
    : region_paths_(std::move(region_paths)), log_prefix_(std::move(log_prefix)), sink_(std::move(sink)) {}

TierEventLog::~TierEventLog() { Stop(); }

void TierEventLog::Start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] {
    while (!stop_.load(std::memory_order_relaxed)) {
      ScanOnce();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
}

void TierEventLog::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void TierEventLog::Emit(const std::string& line) {
  if (sink_) {
    sink_(line);
  } else {
    std::fprintf(stderr, "%s: %s\n", log_prefix_.c_str(), line.c_str());
  }
}

void TierEventLog::AttachLazily() { AttachRegionsOnce(region_paths_, &regions_); }

int TierEventLog::ScanOnce() {
  AttachLazily();
  int lines = 0;
  const bool first = first_pass_;
  first_pass_ = false;
  for (size_t ri = 0; ri < regions_.size(); ++ri) {
    limiter::GpuRegion& region = *regions_[ri];
    if (!region.attached()) continue;
    // Cheap check first: any process with an event at all.
    bool any = false;
    for (uint32_t slot = 0; slot < limiter::kMaxProcesses && !any; ++slot) any = region.TierEventCount(slot) != 0;
    if (!any) {
      for (auto it = seen_.begin(); it != seen_.end();) it = it->first.first == ri ? seen_.erase(it) : std::next(it);
      continue;
    }
    auto snap = std::make_unique<limiter::RegionSnapshot>();
    region.Snapshot(snap.get());
    std::set<uint32_t> live;
    for (uint32_t i = 0; i < snap->process_count; ++i) {
      const limiter::ProcessInfo& p = snap->processes[i];
      live.insert(p.slot);
      const uint32_t n = region.TierEventCount(p.slot);
      Seen& s = seen_[{ri, p.slot}];
      if (s.pid != p.pid || s.start_time_ticks != p.start_time_ticks) {
        // Another process in this slot: its events count from 0, except those recorded before
        // the agent's first look (not repeated after a restart).
        s.pid = p.pid;
        s.start_time_ticks = p.start_time_ticks;
        s.events = first ? n : 0;
      }
      const uint32_t behind = n - s.events;  // wraps as the counter does
      if (behind == 0) continue;
      if (behind > (1u << 31)) {  // the counter went back: not one this process keeps
        s.events = n;
        continue;
      }
      std::string vgpu = "?";
      for (uint32_t v = 0; v < snap->vgpu_count; ++v) {
        if (snap->vgpus[v].index == p.vgpu_index) vgpu = Printable(snap->vgpus[v].id, sizeof(snap->vgpus[v].id));
      }
      const std::string command = CommandOf(p.pid);
      const std::string who = "vGPU " + vgpu + ": process " + std::to_string(p.pid) +
                              (command.empty() ? "" : " (" + command + ")");
      uint32_t from = s.events + 1;
      if (behind > limiter::kTierLogDepth) {
        Emit(who + ": " + std::to_string(behind - limiter::kTierLogDepth) + " swap event(s) not logged (more than " +
             std::to_string(limiter::kTierLogDepth) + " since the last look)");
        ++lines;
        from = n - limiter::kTierLogDepth + 1;
      }
      for (uint32_t k = from; k != n + 1; ++k) {
        limiter::TierEventRead e;
        if (region.ReadTierEvent(p.slot, k, &e)) {
          Emit(who + " " + Describe(e));
        } else {
          Emit(who + ": swap event " + std::to_string(k) + " unreadable (overwritten or invalid)");
        }
        ++lines;
      }
      s.events = n;
    }
    // Forget the slots whose process is gone.
    for (auto it = seen_.begin(); it != seen_.end();) {
      it = it->first.first == ri && !live.count(it->first.second) ? seen_.erase(it) : std::next(it);
    }
  }
  return lines;
}

}  // namespace tf::hypervisor
