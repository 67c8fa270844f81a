// `tfusion freeze` and `tfusion thaw`: VRAM tiering requests for a local vGPU, made through its
// GPU region and carried out by the limiter inside each of its processes.
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "cli/local_vgpu.h"
#include "cli/quantity.h"
#include "cli/run_command.h"
#include "hypervisor/process_checkpoint.h"
#include "hypervisor/quota_regions.h"
#include "limiter/core/gpu_region.h"

namespace tf::cli {
namespace {

using limiter::GpuRegion;
using limiter::RegionError;

double NowS() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

const char* TierStateName(uint32_t s) { return limiter::TierStateLabel(s); }

// Generation `done` has reached `gen` (both wrap around).
bool Reached(uint32_t done, uint32_t gen) { return static_cast<int32_t>(done - gen) >= 0; }

struct Found {
  GpuRegion region;
  uint32_t index = 0;
};

}  // namespace

const char* TierStateText(uint32_t state) { return TierStateName(state); }

int FreezeCommand(const std::string& vgpu, bool freeze, double timeout_s, bool wait) {
  return FreezeCommand(vgpu, freeze, timeout_s, wait, ZeroOptions{});
}

namespace {

StatusOr<std::unique_ptr<hypervisor::CheckpointDriver>> LoadCheckpointDriver(const std::string& path) {
  auto lib = FindDriverLibrary("libcuda.so.1", path, "TFUSION_REAL_LIBCUDA");
  if (!lib.ok()) return lib.status();
  return hypervisor::CheckpointDriver::Load(*lib);
}

// Checkpoints every swapped process of the vGPU with the driver, printing what each did.
int CheckpointVgpu(GpuRegion& region, uint32_t index, const std::string& vgpu, const ZeroOptions& zero) {
  auto driver = LoadCheckpointDriver(zero.driver);
  if (!driver.ok()) {
    std::fprintf(stderr, "tfusion freeze --zero: %s; vGPU '%s' stays swapped out\n", driver.status().message().c_str(),
                 vgpu.c_str());
    return 1;
  }
  auto snap = std::make_unique<limiter::RegionSnapshot>();
  region.Snapshot(snap.get());
  int rc = 0;
  for (uint32_t i = 0; i < snap->process_count; ++i) {
    const auto& p = snap->processes[i];
    if (p.vgpu_index != index || p.tier_state == limiter::kTierOff || p.zero_state == limiter::kZeroCheckpointed) continue;
    if (p.zero_state != limiter::kZeroNone) {
      // Mid-way: a checkpoint or restore killed outright left it (put back first), or one works on it.
      const int e = hypervisor::RecoverFromGoneActor(region, p.slot, driver->get());
      if (e < 0) {
        std::printf("process %d: a checkpoint or restore is under way; left to it\n", p.pid);
        continue;
      }
      std::printf("process %d: a checkpoint or restore killed mid-way had left it; put back%s\n", p.pid,
                  e == 0 ? "" : (" FAILED (CUDA error " + std::to_string(e) + ")").c_str());
      if (e != 0) {
        rc = 1;
        continue;
      }
      // Back to swapped and running: checkpointed below like any other.
    } else if (p.tier_state != limiter::kTierSwapped && p.tier_state != limiter::kTierOnDisk) {
      continue;
    }
    hypervisor::CheckpointOutcome o = hypervisor::CheckpointProcess(region, p.slot, **driver);
    if (o.ok) {
      std::printf("process %d: checkpointed, %s fixed left the GPU with its context; park %.1f ms, checkpoint %.1f ms\n",
                  p.pid, FormatBytes(p.fixed_bytes).c_str(), o.park_ms, o.checkpoint_ms);
    } else {
      rc = 1;
      std::printf("process %d: checkpoint FAILED: %s; it stays swapped out\n", p.pid, o.why.c_str());
    }
  }
  return rc;
}

// Restores every checkpointed process of the vGPU (before a thaw). Returns processes that failed;
// `*busy`: those a live checkpoint or restore works on now.
int RestoreVgpu(GpuRegion& region, uint32_t index, const ZeroOptions& zero, int* busy) {
  auto snap = std::make_unique<limiter::RegionSnapshot>();
  region.Snapshot(snap.get());
  std::unique_ptr<hypervisor::CheckpointDriver> driver;
  int failed = 0;
  auto load = [&]() -> bool {
    if (driver) return true;
    auto loaded = LoadCheckpointDriver(zero.driver);
    if (!loaded.ok()) {
      std::fprintf(stderr, "tfusion thaw: cannot restore checkpointed processes: %s\n", loaded.status().message().c_str());
      return false;
    }
    driver = std::move(*loaded);
    return true;
  };
  for (uint32_t i = 0; i < snap->process_count; ++i) {
    const auto& p = snap->processes[i];
    if (p.vgpu_index != index || p.zero_state == limiter::kZeroNone) continue;
    if (p.zero_state != limiter::kZeroCheckpointed) {
      // Mid-way: a freeze --zero or thaw killed outright left it (RecoverFromGoneActor), or one
      // still works on it. Parked, it is put back without the driver.
      int e = hypervisor::RecoverFromGoneActor(region, p.slot, nullptr);
      if (e < 0 && (p.zero_state == limiter::kZeroCheckpointing || p.zero_state == limiter::kZeroRestoring)) {
        if (!load()) return 1;
        e = hypervisor::RecoverFromGoneActor(region, p.slot, driver.get());
      }
      if (e < 0) {
        ++*busy;
        std::fprintf(stderr, "tfusion thaw: process %d: a checkpoint or restore is under way; try again when it is done\n",
                     p.pid);
      }
      if (e == 0) std::printf("process %d: a checkpoint or restore killed mid-way had left it; put back\n", p.pid);
      if (e > 0) {
        ++failed;
        std::printf("process %d: a checkpoint or restore killed mid-way had left it; putting it back FAILED (CUDA "
                    "error %d)\n", p.pid, e);
      }
      continue;
    }
    if (!load()) return 1;
    int e = hypervisor::RestoreProcess(region, p.slot, *driver);
    if (e != 0) {
      ++failed;
      std::printf("process %d: restore FAILED (CUDA error %d): it stays checkpointed\n", p.pid, e);
    }
  }
  return failed;
}

}  // namespace

int FreezeCommand(const std::string& vgpu, bool freeze, double timeout_s, bool wait, const ZeroOptions& zero) {
  const char* verb = freeze ? "freeze" : "thaw";
  if (!wait && zero.zero) {
    std::fprintf(stderr, "tfusion freeze: --zero waits for the swap-out; it cannot be combined with --no-wait\n");
    return 2;
  }
  if (vgpu.empty() || vgpu.size() >= limiter::kVgpuIdBytes) {
    std::fprintf(stderr, "tfusion %s: give a vGPU name of 1 to 63 characters (tfusion smi lists them)\n", verb);
    return 2;
  }
  std::unique_ptr<Found> found;
  for (const auto& f : hypervisor::RegionFiles(RegionDir())) {
    auto c = std::make_unique<Found>();
    if (GpuRegion::Attach(f.c_str(), &c->region) != RegionError::kOk) continue;
    if (c->region.FindVgpu(vgpu.c_str(), &c->index) == RegionError::kOk) {
      found = std::move(c);
      break;
    }
  }
  if (!found) {
    std::fprintf(stderr, "tfusion %s: no vGPU '%s' on this machine (tfusion smi lists them)\n", verb, vgpu.c_str());
    return 2;
  }
  GpuRegion& region = found->region;
  region.ReapDeadOfVgpu(found->index);
  auto snap = std::make_unique<limiter::RegionSnapshot>();
  region.Snapshot(snap.get());
  bool enabled = false;
  for (uint32_t i = 0; i < snap->vgpu_count; ++i) {
    if (snap->vgpus[i].index == found->index) enabled = snap->vgpus[i].tier_enabled;
  }
  if (!enabled) {
    std::fprintf(stderr,
                 "tfusion %s: vGPU '%s' does not have VRAM tiering (start its processes with tfusion run "
                 "--tiering)\n", verb, vgpu.c_str());
    return 2;
  }
  for (uint32_t i = 0; i < snap->process_count; ++i) {
    const auto& p = snap->processes[i];
    if (p.vgpu_index != found->index) continue;
    if (p.tier_state == limiter::kTierSwappingOut || p.tier_state == limiter::kTierSwappingIn) {
      std::fprintf(stderr, "tfusion %s: vGPU '%s' is already %s (process %d); try again when it is done\n",
                   verb, vgpu.c_str(), TierStateName(p.tier_state), p.pid);
      return 2;
    }
  }
  // Every process already out of VRAM: a new request would change nothing (and a checkpointed
  // process could not even answer it), so none is made.
  int out_of_vram = 0, tiered = 0;
  for (uint32_t i = 0; i < snap->process_count; ++i) {
    const auto& p = snap->processes[i];
    if (p.vgpu_index != found->index || p.tier_state == limiter::kTierOff) continue;
    ++tiered;
    out_of_vram += p.tier_state == limiter::kTierSwapped || p.tier_state == limiter::kTierOnDisk ||
                   p.tier_state == limiter::kTierCheckpointed;
  }
  if (freeze && tiered != 0 && out_of_vram == tiered) {
    std::printf("vGPU '%s' is already swapped out: nothing changed\n", vgpu.c_str());
    for (uint32_t i = 0; i < snap->process_count; ++i) {
      const auto& p = snap->processes[i];
      if (p.vgpu_index != found->index || p.tier_state == limiter::kTierOff) continue;
      std::printf("process %d: %s, %s movable (%s in host memory), %s fixed\n", p.pid, TierStateName(p.tier_state),
                  FormatBytes(p.movable_bytes).c_str(), FormatBytes(p.host_bytes).c_str(),
                  FormatBytes(p.fixed_bytes).c_str());
    }
    return zero.zero ? CheckpointVgpu(region, found->index, vgpu, zero) : 0;
  }
  int resident = 0;
  for (uint32_t i = 0; i < snap->process_count; ++i) {
    const auto& p = snap->processes[i];
    resident += p.vgpu_index == found->index && p.tier_state == limiter::kTierResident &&
                p.zero_state == limiter::kZeroNone;
  }
  if (!freeze && tiered != 0 && resident == tiered) {
    std::printf("vGPU '%s' is already resident: nothing changed\n", vgpu.c_str());
    return 0;
  }
  if (!freeze) {
    int busy = 0;
    if (RestoreVgpu(region, found->index, zero, &busy) != 0) return 1;
    if (busy != 0) return 2;  // nothing requested, as for a vGPU swapping in or out
  }
  // Each process's completed swap-outs before the request (slot -> pid, count): a busy process
  // swaps out and, at its next GPU call, straight back in, which is no failure.
  std::map<uint32_t, std::pair<int32_t, uint32_t>> swaps_before;
  std::map<uint32_t, int32_t> tiered_before;  // slot -> pid of the vGPU's processes that use tiering
  for (uint32_t i = 0; i < snap->process_count; ++i) {
    const auto& p = snap->processes[i];
    swaps_before[p.slot] = {p.pid, p.swaps_out};
    if (p.vgpu_index == found->index && p.tier_state != limiter::kTierOff) tiered_before[p.slot] = p.pid;
  }
  uint32_t gen = 0;
  RegionError e = freeze ? region.RequestFreeze(found->index, &gen) : region.RequestThaw(found->index, &gen);
  if (e != RegionError::kOk) {
    std::fprintf(stderr, "tfusion %s: %s\n", verb, limiter::RegionErrorName(e));
    return 1;
  }
  if (!wait) {
    std::printf("%s requested for vGPU '%s'\n", freeze ? "Freeze" : "Thaw", vgpu.c_str());
    return 0;
  }
  // Wait until every live process of the vGPU that uses tiering has acted on this request.
  const double start = NowS();
  double last_report = start;
  for (;;) {
    region.ReapDeadOfVgpu(found->index);
    region.Snapshot(snap.get());
    int pending = 0;
    uint64_t moved = 0, total = 0;
    for (uint32_t i = 0; i < snap->process_count; ++i) {
      const auto& p = snap->processes[i];
      if (p.vgpu_index != found->index || p.tier_state == limiter::kTierOff) continue;
      const limiter::ProcessTier* t = region.TierOfProcess(p.slot);
      uint32_t done = freeze ? t->freeze_done_gen.load() : t->thaw_done_gen.load();
      if (!Reached(done, gen)) ++pending;
      total += p.movable_bytes;
      moved += freeze ? p.host_bytes : p.movable_bytes - p.host_bytes;
    }
    const double now = NowS();
    if (pending == 0) break;
    if (now - start > timeout_s) {
      std::fprintf(stderr, "tfusion %s: %d process(es) of vGPU '%s' did not finish within %.0f s\n", verb,
                   pending, vgpu.c_str(), timeout_s);
      return 1;
    }
    if (now - last_report >= 1.0) {
      std::printf("  %s of %s %s, %d process(es) still working\n", FormatBytes(moved).c_str(),
                  FormatBytes(total).c_str(), freeze ? "in host memory" : "back in VRAM", pending);
      std::fflush(stdout);
      last_report = now;
    }
    usleep(5'000);
  }
  int rc = 0;
  int shown = 0;
  std::set<int32_t> answered;
  for (uint32_t i = 0; i < snap->process_count; ++i) {
    const auto& p = snap->processes[i];
    if (p.vgpu_index != found->index || p.tier_state == limiter::kTierOff) continue;
    ++shown;
    answered.insert(p.pid);
    bool ok = freeze ? (p.tier_state == limiter::kTierSwapped || p.tier_state == limiter::kTierOnDisk ||
                        p.tier_state == limiter::kTierCheckpointed || p.movable_bytes == 0)
                     : p.tier_state == limiter::kTierResident;
    double ms = (freeze ? p.last_out_us : p.last_in_us) / 1000.0;
    const auto before = swaps_before.find(p.slot);
    const bool swapped_and_back = freeze && !ok && p.tier_last_error == 0 && before != swaps_before.end() &&
                                  before->second.first == p.pid && p.swaps_out != before->second.second;
    if (swapped_and_back) {
      std::printf("process %d: swapped out in %.1f ms, then back in VRAM: its GPU calls needed it (a busy process "
                  "does not stay swapped out); %s movable\n",
                  p.pid, ms, FormatBytes(p.movable_bytes).c_str());
    } else if (ok) {
      std::printf("process %d: %s, %s movable (%s in host memory), %s fixed; last %s %.1f ms\n", p.pid,
                  TierStateName(p.tier_state), FormatBytes(p.movable_bytes).c_str(), FormatBytes(p.host_bytes).c_str(),
                  FormatBytes(p.fixed_bytes).c_str(), freeze ? "swap-out" : "swap-in", ms);
    } else {
      rc = 1;
      std::printf("process %d: %s FAILED (CUDA error %u): it keeps running %s\n", p.pid, verb, p.tier_last_error,
                  freeze ? "resident" : "swapped; its next GPU call retries");
    }
  }
  // Processes that held movable VRAM when the request was made and exited before acting on it: what
  // was asked did not happen to them, which a script that goes on to rely on it must hear.
  int exited = 0;
  for (const auto& [slot, before] : tiered_before) {
    if (answered.count(before)) continue;
    ++exited;
    std::printf("process %d: exited during the %s\n", before, verb);
  }
  if (exited != 0) {
    rc = 1;
    std::fprintf(stderr, "tfusion %s: %d process(es) of vGPU '%s' exited during the %s\n", verb, exited, vgpu.c_str(), verb);
  } else if (shown == 0) {
    std::printf("vGPU '%s' has no process holding movable VRAM: nothing to %s\n", vgpu.c_str(), verb);
  }
  if (freeze && zero.zero && rc == 0 && shown != 0) rc = CheckpointVgpu(region, found->index, vgpu, zero);
  return rc;
}

}  // namespace tf::cli
