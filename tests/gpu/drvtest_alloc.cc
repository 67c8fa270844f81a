// VRAM quota behaviour through every allocation path: fill until refused, free one chunk,
// allocate again (alloc); and the multi-process pieces driven by vgpu_share.py: hold what one
// process obtained until released (hold), and measure how soon a killed process's share can be
// allocated again (reclaim).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "chunk_allocators.h"
#include "drvtest.h"

namespace tf::gpu {
namespace {

struct FillOutcome {
  uint64_t granted = 0;
  CUresult error = CUDA_SUCCESS;  // CUDA_SUCCESS: stopped at the cap or the target
  std::string failed_call;
};

// Allocates `chunk` at a time until the driver refuses or `cap` would be passed.
FillOutcome Fill(ChunkAllocator& alloc, uint64_t chunk, uint64_t cap) {
  FillOutcome out;
  while (out.granted + chunk <= cap) {
    const CUresult rc = alloc.AllocOne(chunk, &out.granted, &out.failed_call);
    if (rc != CUDA_SUCCESS) {
      out.error = rc;
      break;
    }
  }
  return out;
}

void ReportFill(const FillOutcome& fill) {
  Result("total_bytes", fill.granted);
  Result("total_mib", fill.granted / kMiB);
  Result("status", fill.error == CUDA_SUCCESS ? "capped" : "refused");
  Result("error", CuErrorName(fill.error));
  Result("error_code", static_cast<uint64_t>(fill.error));
  if (!fill.failed_call.empty()) Result("failed_call", fill.failed_call);
}

int SetupFailed(const DriverSession& session) {
  Result("setup_failed", session.failed_call() + ":" + CuErrorName(session.rc()));
  Result("verdict", "FAIL");
  return 2;
}

}  // namespace

int RunAlloc(const Flags& flags) {
  const std::string path = flags.Str("path", "mem_alloc");
  const uint64_t chunk = flags.Bytes("chunk", 64 * kMiB);
  const uint64_t cap = flags.Bytes("max", 4 * kGiB);
  const uint64_t limit = flags.Bytes("limit", 0);
  if (!FlagsOk(flags)) return 2;
  DriverSession session;
  if (!session.ok()) return SetupFailed(session);
  auto alloc = MakeChunkAllocator(path, session.device());
  if (alloc == nullptr) {
    std::fprintf(stderr, "unknown --path %s\n", path.c_str());
    return 2;
  }
  Result("path", path);
  Result("chunk_bytes", chunk);
  Result("max_bytes", cap);
  Result("limit_bytes", limit);
  const uint64_t start = NowNs();
  const FillOutcome fill = Fill(*alloc, chunk, cap);
  ReportFill(fill);
  Result("fill_ms", (NowNs() - start) / 1000000);

  // Freeing one chunk must make room for one new chunk of the same size.
  std::string realloc = "none";
  if (alloc->count() > 0) {
    uint64_t released = 0;
    const CUresult freed = alloc->FreeLast(&released);
    uint64_t granted = 0;
    std::string call;
    const CUresult again = freed == CUDA_SUCCESS ? alloc->AllocOne(chunk, &granted, &call) : freed;
    realloc = again == CUDA_SUCCESS ? "ok" : CuErrorName(again);
  }
  Result("realloc", realloc);
  alloc->FreeAll();

  std::string why;
  if (realloc != "ok") why = "realloc_after_free_failed";
  if (limit == 0) {
    if (fill.error != CUDA_SUCCESS && fill.error != CUDA_ERROR_OUT_OF_MEMORY) why = "unexpected_error";
  } else {
    if (fill.error != CUDA_ERROR_OUT_OF_MEMORY) why = "not_refused_with_out_of_memory";
    if (fill.granted > limit + kGranule) why = "exceeded_limit";
    if (fill.granted < limit / 2) why = "less_than_half_the_limit";
  }
  if (!why.empty()) Result("reason", why);
  Result("verdict", why.empty() ? "PASS" : "FAIL");
  return why.empty() ? 0 : 1;
}

int RunHold(const Flags& flags) {
  const uint64_t chunk = flags.Bytes("chunk", 32 * kMiB);
  const uint64_t cap = flags.Bytes("max", 3 * kGiB);
  const uint64_t target = flags.Bytes("target", 0);
  const std::string init_file = flags.Str("init-file", "");
  const std::string go_file = flags.Str("go-file", "");
  const std::string ready_file = flags.Str("ready-file", "");
  const std::string release_file = flags.Str("release-file", "");
  const double hold_s = flags.Num("hold-seconds", 30);
  const double go_timeout_s = flags.Num("go-timeout", 60);
  if (!FlagsOk(flags)) return 2;
  DriverSession session;
  if (!session.ok()) return SetupFailed(session);
  const std::string pid = std::to_string(getpid());
  Result("pid", pid);
  if (!init_file.empty() && !WriteFileAtomic(init_file, pid + "\n")) return 2;
  if (!go_file.empty() && !WaitForFile(go_file, go_timeout_s)) {
    Result("go_timeout", "yes");
    return 2;
  }
  auto alloc = MakeChunkAllocator("mem_alloc", session.device());
  const FillOutcome fill = Fill(*alloc, chunk, target != 0 ? target : cap);
  ReportFill(fill);
  if (!ready_file.empty()) {
    const std::string line = pid + " " + std::to_string(fill.granted) + " " +
                             std::to_string(static_cast<int>(fill.error)) + "\n";
    if (!WriteFileAtomic(ready_file, line)) return 2;
  }
  if (!release_file.empty()) {
    Result("released", WaitForFile(release_file, hold_s) ? "yes" : "timeout");
  } else {
    std::this_thread::sleep_for(std::chrono::duration<double>(hold_s));
  }
  alloc->FreeAll();
  return 0;
}

int RunReclaim(const Flags& flags) {
  const uint64_t chunk = flags.Bytes("chunk", 64 * kMiB);
  const uint64_t cap = flags.Bytes("max", 3 * kGiB);
  const uint64_t target = flags.Bytes("target", 0);
  const std::string init_file = flags.Str("init-file", "");
  const std::string go_file = flags.Str("go-file", "");
  const double deadline_ms = flags.Num("deadline-ms", 2000);
  const double give_up_ms = flags.Num("give-up-ms", 10000);
  const double go_timeout_s = flags.Num("go-timeout", 60);
  if (!FlagsOk(flags)) return 2;
  if (target == 0 || target > cap) {
    std::fprintf(stderr, "reclaim needs 0 < --target <= --max\n");
    return 2;
  }
  DriverSession session;
  if (!session.ok()) return SetupFailed(session);
  if (!init_file.empty() && !WriteFileAtomic(init_file, std::to_string(getpid()) + "\n")) return 2;
  if (!go_file.empty() && !WaitForFile(go_file, go_timeout_s)) {
    Result("go_timeout", "yes");
    return 2;
  }
  // The go file is written right after the SIGKILL, so latency counts from the kill.
  const uint64_t start = NowNs();
  auto alloc = MakeChunkAllocator("mem_alloc", session.device());
  uint64_t attempts = 0;
  double elapsed_ms = 0;
  uint64_t best = 0;
  bool reached = false;
  while (true) {
    ++attempts;
    const FillOutcome fill = Fill(*alloc, chunk, target);
    alloc->FreeAll();
    elapsed_ms = static_cast<double>(NowNs() - start) / 1e6;
    if (fill.granted > best) best = fill.granted;
    if (fill.granted >= target) {
      reached = true;
      break;
    }
    if (elapsed_ms > give_up_ms) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Result("target_bytes", target);
  Result("best_bytes", best);
  Result("attempts", attempts);
  ResultF("reclaim_ms", elapsed_ms);
  const bool pass = reached && elapsed_ms <= deadline_ms;
  if (!pass) Result("reason", reached ? "reclaimed_too_late" : "never_reclaimed");
  Result("verdict", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace tf::gpu
