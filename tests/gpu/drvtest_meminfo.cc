// What a tenant is told about memory: cuMemGetInfo against NVML, before and after allocating.
// Under the limiter both must describe the vGPU (total = limit; free and used agree to the MiB);
// natively both describe the physical device.
#include <cstdlib>
#include <string>

#include "drvtest.h"
#include "nvml_probe.h"

namespace tf::gpu {
namespace {

// Tolerances. Natively NVML's total includes memory the driver reserves for itself (hundreds of
// MiB on an H100) and the two free values are read at different instants.
constexpr uint64_t kLimitedTolerance = kMiB;
constexpr uint64_t kNativeFreeTolerance = 64 * kMiB;
constexpr uint64_t kNativeReservedMax = 2 * kGiB;

uint64_t AbsDiff(uint64_t a, uint64_t b) { return a > b ? a - b : b - a; }

void ReportMemory(const std::string& tag, const NvmlMemory& mem) {
  Result(tag + "_total_mib", mem.total / kMiB);
  Result(tag + "_free_mib", mem.free / kMiB);
  Result(tag + "_used_mib", mem.used / kMiB);
}

struct Snapshot {
  NvmlMemory cuda;
  NvmlMemory v1;
  NvmlMemory v2;
  bool have_v1 = false;
  bool have_v2 = false;
};

bool Take(NvmlProbe& nvml, const std::string& tag, Snapshot* snap) {
  size_t free = 0;
  size_t total = 0;
  if (cuMemGetInfo(&free, &total) != CUDA_SUCCESS) return false;
  snap->cuda = NvmlMemory{total, free, total - free, 0};
  snap->have_v1 = nvml.MemoryV1(&snap->v1);
  snap->have_v2 = nvml.MemoryV2(&snap->v2);
  ReportMemory(tag + "_cuda", snap->cuda);
  if (snap->have_v1) ReportMemory(tag + "_nvml", snap->v1);
  if (snap->have_v2) ReportMemory(tag + "_nvml2", snap->v2);
  return true;
}

}  // namespace

int RunMemInfo(const Flags& flags) {
  const uint64_t limit = flags.Bytes("limit", 0);
  const uint64_t alloc_bytes = flags.Bytes("alloc", 512 * kMiB);
  if (!FlagsOk(flags)) return 2;
  DriverSession session;
  if (!session.ok()) {
    Result("setup_failed", session.failed_call() + ":" + CuErrorName(session.rc()));
    return 2;
  }
  CUuuid uuid{};
  cuDeviceGetUuid(&uuid, session.device());
  NvmlProbe nvml;
  const bool nvml_ok = nvml.Open(reinterpret_cast<const unsigned char*>(uuid.bytes));
  Result("nvml", nvml_ok ? "ok" : nvml.error());
  Result("nvml_memory_info_lib", nvml.MemoryInfoLibrary());

  Snapshot before;
  Snapshot after;
  std::string why;
  CUdeviceptr ptr = 0;
  if (!Take(nvml, "before", &before)) why = "cuMemGetInfo_failed";
  const CUresult alloc_rc = cuMemAlloc(&ptr, alloc_bytes);
  Result("alloc", CuErrorName(alloc_rc));
  if (alloc_rc != CUDA_SUCCESS) why = "alloc_failed";
  if (!Take(nvml, "after", &after)) why = "cuMemGetInfo_failed";
  if (ptr != 0) cuMemFree(ptr);

  auto fail = [&why](bool bad, const char* reason) {
    if (bad && why.empty()) why = reason;
  };
  fail(!nvml_ok || !after.have_v1, "nvml_unavailable");
  const uint64_t cuda_drop = before.cuda.free > after.cuda.free ? before.cuda.free - after.cuda.free : 0;
  Result("cuda_free_drop_mib", cuda_drop / kMiB);
  fail(cuda_drop + kMiB < alloc_bytes, "cuda_free_did_not_drop");
  if (limit != 0) {
    fail(AbsDiff(after.cuda.total, limit) >= kLimitedTolerance, "cuda_total_is_not_the_limit");
    fail(after.cuda.used < alloc_bytes, "cuda_used_below_allocation");
    if (after.have_v1) {
      fail(AbsDiff(after.v1.total, limit) >= kLimitedTolerance, "nvml_total_is_not_the_limit");
      fail(AbsDiff(after.v1.free, after.cuda.free) > kLimitedTolerance, "nvml_free_disagrees");
      fail(AbsDiff(after.v1.used, after.cuda.used) > kLimitedTolerance, "nvml_used_disagrees");
    }
    if (after.have_v2) {
      fail(AbsDiff(after.v2.total, limit) >= kLimitedTolerance, "nvml_v2_total_is_not_the_limit");
      fail(AbsDiff(after.v2.free, after.cuda.free) > kLimitedTolerance, "nvml_v2_free_disagrees");
    }
  } else if (after.have_v1) {
    fail(after.v1.total < after.cuda.total, "nvml_total_below_cuda_total");
    fail(after.v1.total - after.cuda.total > kNativeReservedMax, "nvml_total_far_above_cuda_total");
    fail(AbsDiff(after.v1.free, after.cuda.free) > kNativeFreeTolerance, "nvml_free_disagrees");
  }
  if (!why.empty()) Result("reason", why);
  Result("verdict", why.empty() ? "PASS" : "FAIL");
  return why.empty() ? 0 : 1;
}

}  // namespace tf::gpu
