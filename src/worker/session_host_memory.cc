// The host memory a session holds and its limits: see session_host_memory.h.
#include "worker/session_host_memory.h"

#include <dlfcn.h>
#include <unistd.h>

#include "worker/session_mirrors.h"  // SessionLog

namespace tf::worker {
namespace {

double Mib(uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

uint64_t DefaultSessionHostMemory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 4ull << 30;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 4;
}

SessionHostMemory::SessionHostMemory(const driver::DriverTable& d, uint64_t limit)
    : d_(d), limit_(limit != 0 ? limit : DefaultSessionHostMemory()) {}

void SessionHostMemory::BindDriver(void* library) {
  charge_vram_ = reinterpret_cast<ChargeVramFn>(dlsym(library, "tfusion_limiter_charge_vram"));
  release_vram_ = reinterpret_cast<ReleaseVramFn>(dlsym(library, "tfusion_limiter_release_vram"));
  if (charge_vram_ == nullptr || release_vram_ == nullptr) charge_vram_ = nullptr;
}

CUresult SessionHostMemory::ChargePinned(uint64_t bytes, const char* what, Charge* c) {
  if (bytes > limit_ || used_ > limit_ - bytes) {
    SessionLog("%s of %.4g MiB refused (CUDA_ERROR_OUT_OF_MEMORY): the session may pin %.4g MiB "
               "of host memory (tfusion worker --session-host-mem) and holds %.4g MiB",
               what, Mib(bytes), Mib(limit_), Mib(used_));
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  used_ += bytes;
  *c = Charge{Pool::kHost, bytes};
  return CUDA_SUCCESS;
}

CUresult SessionHostMemory::ChargeManaged(uint64_t bytes, Charge* c) {
  if (charge_vram_ == nullptr) return ChargePinned(bytes, "managed memory", c);
  int charged = 0;
  CUresult r = charge_vram_(bytes, &charged);
  if (r == CUDA_SUCCESS && charged == 0) return ChargePinned(bytes, "managed memory", c);
  if (r != CUDA_SUCCESS) {
    size_t free = 0, total = 0;
    if (d_.cuMemGetInfo_v2 && d_.cuMemGetInfo_v2(&free, &total) == CUDA_SUCCESS) {
      SessionLog("managed memory of %.4g MiB refused (CUDA_ERROR_OUT_OF_MEMORY): it counts against "
                 "the VRAM limit of the session's vGPU, %.4g MiB, of which %.4g MiB are free",
                 Mib(bytes), Mib(total), Mib(free));
    } else {
      SessionLog("managed memory of %.4g MiB refused (CUDA_ERROR_OUT_OF_MEMORY): it counts against "
                 "the VRAM limit of the session's vGPU", Mib(bytes));
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *c = Charge{Pool::kVram, bytes};
  return CUDA_SUCCESS;
}

void SessionHostMemory::Release(Charge* c) {
  if (c->pool == Pool::kHost) used_ -= c->bytes;
  if (c->pool == Pool::kVram && release_vram_ != nullptr) release_vram_(c->bytes);
  *c = Charge{};
}

}  // namespace tf::worker
