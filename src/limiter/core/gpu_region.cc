// GpuRegion lifecycle (create, attach, detach), the vGPU and process tables, reaping and
// snapshots. The VRAM ledger is in vram_ledger.cc, the compute lease in compute_lease.cc.
#include "limiter/core/gpu_region.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <new>

#include "limiter/core/process_identity.h"
#include "limiter/core/robust_mutex.h"

namespace tf::limiter {

const char* RegionErrorName(RegionError e) {
  switch (e) {
    case RegionError::kOk: return "ok";
    case RegionError::kInvalidArgument: return "invalid_argument";
    case RegionError::kNotFound: return "not_found";
    case RegionError::kIo: return "io_error";
    case RegionError::kBadMagic: return "bad_magic";
    case RegionError::kVersionMismatch: return "version_mismatch";
    case RegionError::kLayoutMismatch: return "layout_mismatch";
    case RegionError::kTruncated: return "truncated";
    case RegionError::kIncompatibleGpu: return "incompatible_gpu";
    case RegionError::kFull: return "full";
    case RegionError::kOutOfMemory: return "out_of_memory";
    case RegionError::kBusy: return "busy";
    case RegionError::kNotHolder: return "not_holder";
    case RegionError::kUnrecoverable: return "unrecoverable";
  }
  return "unknown";
}

namespace {

__attribute__((format(printf, 4, 5))) RegionError Fail(RegionErrorDetail* why, RegionError e,
                                                       int err, const char* fmt, ...) {
  if (why != nullptr) {
    why->sys_errno = err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why->message, sizeof(why->message), fmt, ap);
    va_end(ap);
  }
  return e;
}

// Copies a NUL-terminated string of 1..cap-1 characters into a zero-filled field.
bool CopyField(char* dst, size_t cap, const char* src) {
  if (src == nullptr) return false;
  size_t n = strnlen(src, cap);
  if (n == 0 || n >= cap) return false;
  memset(dst, 0, cap);
  memcpy(dst, src, n);
  return true;
}

bool FieldEquals(const char* field, size_t cap, const char* s) {
  return strnlen(s, cap) < cap && strncmp(field, s, cap) == 0;
}

// Initial bucket: a full burst, so a new vGPU can start at once.
int64_t InitialTokensNs(uint64_t share_ppm) {
  int64_t burst = static_cast<int64_t>(share_ppm < kShareWholeGpuPpm ? share_ppm : kShareWholeGpuPpm) * 100;
  return burst > 2'000'000 ? burst : 2'000'000;
}

}  // namespace

GpuRegion::GpuRegion(GpuRegion&& other) noexcept { *this = static_cast<GpuRegion&&>(other); }

GpuRegion& GpuRegion::operator=(GpuRegion&& other) noexcept {
  if (this != &other) {
    Detach();
    base_ = other.base_;
    map_size_ = other.map_size_;
    memcpy(path_, other.path_, sizeof(path_));
    other.base_ = nullptr;
    other.map_size_ = 0;
    other.path_[0] = '\0';
  }
  return *this;
}

void GpuRegion::Detach() {
  if (base_ != nullptr) munmap(base_, map_size_);
  base_ = nullptr;
  map_size_ = 0;
  path_[0] = '\0';
}

bool GpuRegion::RegionPath(const char* dir, const char* uuid, char* buf, size_t len) {
  if (dir == nullptr || uuid == nullptr) return false;
  int n = snprintf(buf, len, "%s/gpu-%s.region", dir, uuid);
  return n > 0 && static_cast<size_t>(n) < len;
}

RegionError GpuRegion::MapFile(int fd, const char* path, GpuRegion* out, RegionErrorDetail* why) {
  struct stat st;
  if (fstat(fd, &st) != 0) return Fail(why, RegionError::kIo, errno, "fstat %s failed", path);
  size_t size = static_cast<size_t>(st.st_size);
  if (size < sizeof(RegionHeader)) {
    char magic[8] = {};
    if (size >= sizeof(magic) && pread(fd, magic, sizeof(magic), 0) == sizeof(magic) &&
        memcmp(magic, kRegionMagic, sizeof(magic)) != 0) {
      return Fail(why, RegionError::kBadMagic, 0, "%s is not a TensorFusion GPU region", path);
    }
    return Fail(why, RegionError::kTruncated, 0, "%s is %zu bytes, shorter than its header (%zu)",
                path, size, sizeof(RegionHeader));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Fail(why, RegionError::kIo, errno, "mmap %s failed", path);
  auto* h = static_cast<const RegionHeader*>(p);
  RegionError e = RegionError::kOk;
  if (memcmp(h->magic, kRegionMagic, sizeof(kRegionMagic)) != 0) {
    e = Fail(why, RegionError::kBadMagic, 0, "%s is not a TensorFusion GPU region (bad magic)", path);
  } else if (h->layout_version != kLayoutVersion) {
    e = Fail(why, RegionError::kVersionMismatch, 0,
             "%s has layout_version %u, this build understands only %u: refusing to attach "
             "(restart the node agent and tenants with one TensorFusion version)",
             path, h->layout_version, kLayoutVersion);
  } else if (h->header_size != sizeof(RegionHeader) || h->vgpu_slot_size != sizeof(VgpuSlot) ||
             h->process_slot_size != sizeof(ProcessSlot) ||
             h->lease_block_size != sizeof(LeaseBlock) || h->max_vgpus != kMaxVgpus ||
             h->max_processes != kMaxProcesses || h->mutex_size != sizeof(pthread_mutex_t) ||
             h->vgpu_array_offset != kVgpuArrayOffset ||
             h->process_array_offset != kProcessArrayOffset || h->lease_offset != kLeaseOffset ||
             h->total_size != kRegionTotalSize) {
    e = Fail(why, RegionError::kLayoutMismatch, 0,
             "%s: layout sizes differ from this build (header %u/%zu, vgpu slot %u/%zu, process "
             "slot %u/%zu, mutex %u/%zu, total %llu/%llu)",
             path, h->header_size, sizeof(RegionHeader), h->vgpu_slot_size, sizeof(VgpuSlot),
             h->process_slot_size, sizeof(ProcessSlot), h->mutex_size, sizeof(pthread_mutex_t),
             static_cast<unsigned long long>(h->total_size),
             static_cast<unsigned long long>(kRegionTotalSize));
  } else if (size < h->total_size) {
    e = Fail(why, RegionError::kTruncated, 0, "%s is %zu bytes, its layout needs %llu", path, size,
             static_cast<unsigned long long>(h->total_size));
  }
  if (e != RegionError::kOk) {
    munmap(p, size);
    return e;
  }
  out->Detach();
  out->base_ = static_cast<uint8_t*>(p);
  out->map_size_ = size;
  snprintf(out->path_, sizeof(out->path_), "%s", path);
  return RegionError::kOk;
}

RegionError GpuRegion::Attach(const char* path, GpuRegion* out, RegionErrorDetail* why) {
  if (path == nullptr || out == nullptr || strlen(path) >= sizeof(out->path_)) {
    return Fail(why, RegionError::kInvalidArgument, 0, "bad region path");
  }
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return Fail(why, err == ENOENT ? RegionError::kNotFound : RegionError::kIo, err,
                "open %s: %s", path, strerror(err));
  }
  RegionError e = MapFile(fd, path, out, why);
  close(fd);
  return e;
}

RegionError GpuRegion::Create(const char* dir, const char* uuid, const char* name,
                              uint64_t total_vram_bytes, uint64_t capacity_mtflops,
                              GpuRegion* out, RegionErrorDetail* why) {
  if (out == nullptr || dir == nullptr || uuid == nullptr || name == nullptr) {
    return Fail(why, RegionError::kInvalidArgument, 0, "null argument");
  }
  size_t uuid_len = strnlen(uuid, kGpuUuidBytes);
  if (uuid_len == 0 || uuid_len >= kGpuUuidBytes || strchr(uuid, '/') != nullptr) {
    return Fail(why, RegionError::kInvalidArgument, 0, "GPU uuid must be 1..63 chars without '/'");
  }
  if (strnlen(name, kGpuNameBytes) >= kGpuNameBytes) {
    return Fail(why, RegionError::kInvalidArgument, 0, "GPU name longer than 95 chars");
  }
  char path[sizeof(out->path_)];
  if (!RegionPath(dir, uuid, path, sizeof(path))) {
    return Fail(why, RegionError::kInvalidArgument, 0, "region path too long");
  }
  if (mkdir(dir, 01777) == 0) {
    chmod(dir, 01777);  // mkdir applies the umask; the directory is shared by every tenant
  } else if (errno != EEXIST) {
    return Fail(why, RegionError::kIo, errno, "mkdir %s: %s", dir, strerror(errno));
  }

  auto attach_existing = [&]() -> RegionError {
    GpuRegion existing;
    RegionError e = Attach(path, &existing, why);
    if (e != RegionError::kOk) return e;
    const RegionHeader* h = existing.header();
    if (!FieldEquals(h->gpu_uuid, kGpuUuidBytes, uuid) || h->total_vram_bytes != total_vram_bytes) {
      return Fail(why, RegionError::kIncompatibleGpu, 0,
                  "%s belongs to GPU %.63s with %llu bytes, not %s with %llu bytes", path,
                  h->gpu_uuid, static_cast<unsigned long long>(h->total_vram_bytes), uuid,
                  static_cast<unsigned long long>(total_vram_bytes));
    }
    existing.header()->capacity_mtflops.store(capacity_mtflops, std::memory_order_relaxed);
    *out = static_cast<GpuRegion&&>(existing);
    return RegionError::kOk;
  };

  RegionError e = attach_existing();
  if (e != RegionError::kNotFound) return e;

  // Build the whole region under a private name, then publish it with link(2), which fails with
  // EEXIST instead of replacing a region another creator published meanwhile.
  char tmp[sizeof(path) + 64];
  snprintf(tmp, sizeof(tmp), "%s/.gpu-%s.region.tmp-%d-%lld", dir, uuid, static_cast<int>(getpid()),
           static_cast<long long>(MonotonicNowNs()));
  int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) return Fail(why, RegionError::kIo, errno, "create %s: %s", tmp, strerror(errno));
  fchmod(fd, 0666);  // undo the umask: every tenant process attaches read-write
  if (ftruncate(fd, static_cast<off_t>(kRegionTotalSize)) != 0) {
    int err = errno;
    close(fd);
    unlink(tmp);
    return Fail(why, RegionError::kIo, err, "ftruncate %s: %s", tmp, strerror(err));
  }
  void* p = mmap(nullptr, kRegionTotalSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    int err = errno;
    unlink(tmp);
    return Fail(why, RegionError::kIo, err, "mmap %s: %s", tmp, strerror(err));
  }
  auto* base = static_cast<uint8_t*>(p);  // zero-filled by ftruncate
  auto* h = new (base) RegionHeader;
  memcpy(h->magic, kRegionMagic, sizeof(kRegionMagic));
  h->layout_version = kLayoutVersion;
  h->header_size = sizeof(RegionHeader);
  h->vgpu_slot_size = sizeof(VgpuSlot);
  h->process_slot_size = sizeof(ProcessSlot);
  h->lease_block_size = sizeof(LeaseBlock);
  h->max_vgpus = kMaxVgpus;
  h->max_processes = kMaxProcesses;
  h->mutex_size = sizeof(pthread_mutex_t);
  h->total_size = kRegionTotalSize;
  h->vgpu_array_offset = kVgpuArrayOffset;
  h->process_array_offset = kProcessArrayOffset;
  h->lease_offset = kLeaseOffset;
  h->total_vram_bytes = total_vram_bytes;
  h->capacity_mtflops.store(capacity_mtflops, std::memory_order_relaxed);
  timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  h->created_unix_ns = static_cast<uint64_t>(rt.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(rt.tv_nsec);
  CopyField(h->gpu_uuid, kGpuUuidBytes, uuid);
  if (name[0] != '\0') CopyField(h->gpu_name, kGpuNameBytes, name);
  bool ok = InitRobustMutex(&h->table_mutex);
  for (uint32_t i = 0; i < kMaxVgpus; ++i) {
    auto* v = new (base + kVgpuArrayOffset + i * sizeof(VgpuSlot)) VgpuSlot;
    ok = ok && InitRobustMutex(&v->mutex);
  }
  for (uint32_t i = 0; i < kMaxProcesses; ++i) {
    new (base + kProcessArrayOffset + i * sizeof(ProcessSlot)) ProcessSlot;
  }
  auto* l = new (base + kLeaseOffset) LeaseBlock;
  l->lease_deadline_ns.store(kNoDeadline, std::memory_order_relaxed);
  auto* th = new (base + kTierHeaderOffset) TierHeader;
  th->host_budget_bytes.store(DefaultHostTierBudget(total_vram_bytes), std::memory_order_relaxed);
  if (!ok) {
    munmap(p, kRegionTotalSize);
    unlink(tmp);
    return Fail(why, RegionError::kIo, 0, "cannot initialise robust process-shared mutexes");
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  int rc = link(tmp, path);
  int err = errno;
  unlink(tmp);
  if (rc != 0) {
    munmap(p, kRegionTotalSize);
    if (err == EEXIST) return attach_existing();  // another creator won the race
    return Fail(why, RegionError::kIo, err, "link %s -> %s: %s", tmp, path, strerror(err));
  }
  out->Detach();
  out->base_ = base;
  out->map_size_ = kRegionTotalSize;
  snprintf(out->path_, sizeof(out->path_), "%s", path);
  return RegionError::kOk;
}

// ---- tables ----

RegionError GpuRegion::LockTable() {
  // Nothing to rebuild: every table transition publishes `state` last (see FreeProcessSlotLocked
  // and CreateOrUpdateVgpu), so a holder that died mid-update left each slot either unchanged or
  // complete.
  return LockRobust(&header()->table_mutex, nullptr, nullptr);
}

bool GpuRegion::ValidActiveProcess(uint32_t slot, uint32_t* vgpu_index) const {
  if (base_ == nullptr || slot >= kMaxProcesses) return false;
  if (process(slot)->state.load(std::memory_order_acquire) != kSlotActive) return false;
  const uint32_t v = process(slot)->vgpu_index.load(std::memory_order_relaxed);
  if (v >= kMaxVgpus) return false;
  if (vgpu_index != nullptr) *vgpu_index = v;
  return true;
}

RegionError GpuRegion::CreateOrUpdateVgpu(const char* id, uint64_t vram_limit_bytes,
                                          uint64_t compute_share_ppm, uint32_t* index_out) {
  return CreateOrUpdateVgpu(id, vram_limit_bytes, compute_share_ppm, compute_share_ppm, kDefaultQos,
                            index_out);
}

RegionError GpuRegion::CreateOrUpdateVgpu(const char* id, uint64_t vram_limit_bytes,
                                          uint64_t request_ppm, uint64_t limit_ppm, uint32_t qos,
                                          uint32_t* index_out) {
  if (base_ == nullptr || id == nullptr || request_ppm == 0 || limit_ppm < request_ppm || qos > kMaxQos) {
    return RegionError::kInvalidArgument;
  }
  size_t n = strnlen(id, kVgpuIdBytes);
  if (n == 0 || n >= kVgpuIdBytes) return RegionError::kInvalidArgument;
  RegionError e = LockTable();
  if (e != RegionError::kOk) return e;
  RobustGuard table(&header()->table_mutex);
  int64_t free_index = -1;
  for (uint32_t i = 0; i < kMaxVgpus; ++i) {
    VgpuSlot* v = vgpu(i);
    if (v->state.load(std::memory_order_acquire) == kSlotActive) {
      if (FieldEquals(v->id, kVgpuIdBytes, id)) {
        v->vram_limit_bytes.store(vram_limit_bytes, std::memory_order_relaxed);
        v->compute_share_ppm.store(request_ppm, std::memory_order_relaxed);
        v->compute_limit_ppm.store(limit_ppm, std::memory_order_relaxed);
        v->qos.store(qos, std::memory_order_relaxed);
        if (index_out != nullptr) *index_out = i;
        return RegionError::kOk;
      }
    } else if (free_index < 0) {
      free_index = i;
    }
  }
  if (free_index < 0) return RegionError::kFull;
  VgpuSlot* v = vgpu(static_cast<uint32_t>(free_index));
  CopyField(v->id, kVgpuIdBytes, id);
  v->vram_limit_bytes.store(vram_limit_bytes, std::memory_order_relaxed);
  v->compute_share_ppm.store(request_ppm, std::memory_order_relaxed);
  v->compute_limit_ppm.store(limit_ppm, std::memory_order_relaxed);
  v->qos.store(qos, std::memory_order_relaxed);
  v->vram_used_bytes.store(0, std::memory_order_relaxed);
  v->drift_events.store(0, std::memory_order_relaxed);
  v->oom_total.store(0, std::memory_order_relaxed);
  // Exclusive mode refills tokens_ns at the request (its only bucket); shared mode at the limit.
  v->tokens_ns.store(InitialTokensNs(request_ppm == limit_ppm ? request_ppm : limit_ppm),
                     std::memory_order_relaxed);
  v->request_tokens_ns.store(InitialTokensNs(request_ppm), std::memory_order_relaxed);
  v->last_demand_ns.store(0, std::memory_order_relaxed);
  v->last_refill_ns.store(MonotonicNowNs(), std::memory_order_relaxed);
  v->busy_ns_total.store(0, std::memory_order_relaxed);
  v->throttled_ns_total.store(0, std::memory_order_relaxed);
  v->held_turn_ns_total.store(0, std::memory_order_relaxed);
  v->held_limit_ns_total.store(0, std::memory_order_relaxed);
  v->held_others_ns_total.store(0, std::memory_order_relaxed);
  v->launches_total.store(0, std::memory_order_relaxed);
  v->leases_total.store(0, std::memory_order_relaxed);
  ResetVgpuTier(TierOfVgpu(static_cast<uint32_t>(free_index)));
  v->state.store(kSlotActive, std::memory_order_release);  // publish last
  if (index_out != nullptr) *index_out = static_cast<uint32_t>(free_index);
  return RegionError::kOk;
}

RegionError GpuRegion::FindVgpu(const char* id, uint32_t* index_out) const {
  if (base_ == nullptr || id == nullptr) return RegionError::kInvalidArgument;
  for (uint32_t i = 0; i < kMaxVgpus; ++i) {
    const VgpuSlot* v = vgpu(i);
    if (v->state.load(std::memory_order_acquire) == kSlotActive && FieldEquals(v->id, kVgpuIdBytes, id)) {
      if (index_out != nullptr) *index_out = i;
      return RegionError::kOk;
    }
  }
  return RegionError::kNotFound;
}

RegionError GpuRegion::UpdateVgpuCompute(const char* id, uint64_t request_ppm, uint64_t limit_ppm) {
  if (base_ == nullptr || id == nullptr || request_ppm == 0 || limit_ppm < request_ppm) return RegionError::kInvalidArgument;
  RegionError e = LockTable();  // serialized with creation and removal
  if (e != RegionError::kOk) return e;
  RobustGuard table(&header()->table_mutex);
  for (uint32_t i = 0; i < kMaxVgpus; ++i) {
    VgpuSlot* v = vgpu(i);
    if (v->state.load(std::memory_order_acquire) != kSlotActive || !FieldEquals(v->id, kVgpuIdBytes, id)) continue;
    v->compute_share_ppm.store(request_ppm, std::memory_order_relaxed);
    v->compute_limit_ppm.store(limit_ppm, std::memory_order_relaxed);
    return RegionError::kOk;
  }
  return RegionError::kNotFound;
}

RegionError GpuRegion::RemoveVgpu(uint32_t vgpu_index, const char* expected_id) {
  if (base_ == nullptr || vgpu_index >= kMaxVgpus) return RegionError::kInvalidArgument;
  if (vgpu(vgpu_index)->state.load(std::memory_order_acquire) != kSlotActive) return RegionError::kNotFound;
  Reap(vgpu_index);
  RegionError e = LockTable();
  if (e != RegionError::kOk) return e;
  RobustGuard table(&header()->table_mutex);
  if (vgpu(vgpu_index)->state.load(std::memory_order_acquire) != kSlotActive ||
      (expected_id != nullptr && !FieldEquals(vgpu(vgpu_index)->id, kVgpuIdBytes, expected_id))) {
    return RegionError::kNotFound;
  }
  for (uint32_t i = 0; i < kMaxProcesses; ++i) {
    const ProcessSlot* p = process(i);
    if (p->state.load(std::memory_order_acquire) == kSlotActive &&
        p->vgpu_index.load(std::memory_order_relaxed) == vgpu_index) {
      return RegionError::kBusy;
    }
  }
  vgpu(vgpu_index)->state.store(kSlotFree, std::memory_order_release);
  return RegionError::kOk;
}

RegionError GpuRegion::AttachProcess(uint32_t vgpu_index, pid_t pid, uint32_t* slot_out) {
  if (base_ == nullptr || vgpu_index >= kMaxVgpus || pid <= 0) return RegionError::kInvalidArgument;
  ProcessStat st;
  if (!ReadProcessStat(pid, &st)) return RegionError::kNotFound;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (attempt == 1 && Reap(-1) == 0) break;
    RegionError e = LockTable();
    if (e != RegionError::kOk) return e;
    RobustGuard table(&header()->table_mutex);
    if (vgpu(vgpu_index)->state.load(std::memory_order_acquire) != kSlotActive) return RegionError::kNotFound;
    for (uint32_t i = 0; i < kMaxProcesses; ++i) {
      ProcessSlot* p = process(i);
      if (p->state.load(std::memory_order_acquire) != kSlotFree) continue;
      p->pid.store(pid, std::memory_order_relaxed);
      p->start_time_ticks.store(st.start_time_ticks, std::memory_order_relaxed);
      p->vgpu_index.store(vgpu_index, std::memory_order_relaxed);
      p->vram_bytes.store(0, std::memory_order_relaxed);
      p->throttled_ns.store(0, std::memory_order_relaxed);
      p->last_hold.store(0, std::memory_order_relaxed);
      p->wait_since_ns.store(0, std::memory_order_relaxed);
      p->host_kept_bytes.store(0, std::memory_order_relaxed);
      ResetProcessTier(TierOfProcess(i));
      ResetProcessZero(ZeroOfProcess(i));
      ResetProcessTierLog(TierLogOfProcess(i));
      p->state.store(kSlotActive, std::memory_order_release);  // publish last
      if (slot_out != nullptr) *slot_out = i;
      return RegionError::kOk;
    }
  }
  return RegionError::kFull;
}

void GpuRegion::FreeProcessSlotLocked(uint32_t slot, uint32_t vgpu_index) {
  // Update order for kill -9 safety: the vGPU total first, the slot after. A death in between
  // leaves the vGPU mutex EOWNERDEAD, whose recovery recomputes the total from the (still active)
  // slots; the later reap then frees the slot consistently.
  ProcessSlot* p = process(slot);
  if (vgpu_index < kMaxVgpus) {
    VgpuSlot* v = vgpu(vgpu_index);
    uint64_t held = p->vram_bytes.load(std::memory_order_relaxed);
    uint64_t used = v->vram_used_bytes.load(std::memory_order_relaxed);
    v->vram_used_bytes.store(used >= held ? used - held : 0, std::memory_order_relaxed);
  }
  p->vram_bytes.store(0, std::memory_order_relaxed);
  // A process gone while swapped (or keeping copies for its next swap-out): its host copies died
  // with it; its share of the budget returns.
  ProcessTier* t = TierOfProcess(slot);
  ReleaseHostTier(t->host_bytes.exchange(0, std::memory_order_relaxed));
  ReleaseHostTier(p->host_kept_bytes.exchange(0, std::memory_order_relaxed));
  t->state.store(kTierOff, std::memory_order_relaxed);
  ClearWaiting(p);
  p->state.store(kSlotFree, std::memory_order_release);
}

RegionError GpuRegion::DetachProcess(uint32_t slot) {
  if (!ValidActiveProcess(slot)) return RegionError::kInvalidArgument;
  RegionError e = LockTable();
  if (e != RegionError::kOk) return e;
  RobustGuard table(&header()->table_mutex);
  if (process(slot)->state.load(std::memory_order_acquire) != kSlotActive) return RegionError::kInvalidArgument;
  FreeLeaseIfHeldBy(slot);
  // Loaded once more under the table lock (it may have been rewritten since the check above) and
  // used only as loaded: out of range, the slot is freed without a vGPU to return its bytes to.
  const uint32_t vi = process(slot)->vgpu_index.load(std::memory_order_relaxed);
  if (vi >= kMaxVgpus) {
    FreeProcessSlotLocked(slot, vi);
    return RegionError::kOk;
  }
  e = LockVgpu(vi);
  if (e != RegionError::kOk) return e;
  RobustGuard vg(&vgpu(vi)->mutex);
  FreeProcessSlotLocked(slot, vi);
  return RegionError::kOk;
}

uint32_t GpuRegion::ReapDead() { return base_ == nullptr ? 0 : Reap(-1); }

uint32_t GpuRegion::ReapDeadOfVgpu(uint32_t vgpu_index) {
  return base_ == nullptr || vgpu_index >= kMaxVgpus ? 0 : Reap(vgpu_index);
}

uint32_t GpuRegion::Reap(int64_t only_vgpu) {
  // Liveness is checked without the table lock (it reads /proc); the candidates are then
  // re-verified under it, so a slot reused meanwhile by a live process is never freed.
  struct Candidate {
    uint32_t slot;
    int32_t pid;
    uint64_t start;
  };
  Candidate dead[kMaxProcesses];
  uint32_t n = 0;
  for (uint32_t i = 0; i < kMaxProcesses; ++i) {
    const ProcessSlot* p = process(i);
    if (p->state.load(std::memory_order_acquire) != kSlotActive) continue;
    if (only_vgpu >= 0 && p->vgpu_index.load(std::memory_order_relaxed) != static_cast<uint32_t>(only_vgpu)) continue;
    int32_t pid = p->pid.load(std::memory_order_relaxed);
    uint64_t start = p->start_time_ticks.load(std::memory_order_relaxed);
    if (!ProcessAlive(pid, start)) dead[n++] = {i, pid, start};
  }
  if (n == 0) return 0;
  if (LockTable() != RegionError::kOk) return 0;
  RobustGuard table(&header()->table_mutex);
  uint32_t reaped = 0;
  for (uint32_t k = 0; k < n; ++k) {
    ProcessSlot* p = process(dead[k].slot);
    if (p->state.load(std::memory_order_acquire) != kSlotActive || p->pid.load() != dead[k].pid ||
        p->start_time_ticks.load() != dead[k].start) {
      continue;
    }
    FreeLeaseIfHeldBy(dead[k].slot);
    // Loaded once, under the table lock, and used only as loaded. A slot whose vGPU index is out
    // of range (written by a tenant: the region is world-writable) is freed without touching any
    // vGPU; its index would address memory outside the vGPU array.
    const uint32_t v = p->vgpu_index.load(std::memory_order_relaxed);
    if (v >= kMaxVgpus) {
      FreeProcessSlotLocked(dead[k].slot, v);
      ++reaped;
      continue;
    }
    if (LockVgpu(v) != RegionError::kOk) continue;
    FreeProcessSlotLocked(dead[k].slot, v);
    pthread_mutex_unlock(&vgpu(v)->mutex);
    ++reaped;
  }
  return reaped;
}

void GpuRegion::Snapshot(RegionSnapshot* out) const {
  memset(out, 0, sizeof(*out));
  if (base_ == nullptr) return;
  const RegionHeader* h = header();
  memcpy(out->gpu_uuid, h->gpu_uuid, kGpuUuidBytes);
  memcpy(out->gpu_name, h->gpu_name, kGpuNameBytes);
  out->gpu_uuid[kGpuUuidBytes - 1] = out->gpu_name[kGpuNameBytes - 1] = '\0';
  out->total_vram_bytes = h->total_vram_bytes;
  out->capacity_mtflops = h->capacity_mtflops.load(std::memory_order_relaxed);
  uint64_t w = lease()->word.load(std::memory_order_acquire);
  uint32_t owner = static_cast<uint32_t>(w >> 54);
  out->lease_owner_slot = owner == 0 ? -1 : static_cast<int32_t>(owner - 1);
  out->lease_steals_total = lease()->steals_total.load(std::memory_order_relaxed);
  out->contention_scale_ppm = share()->scale_ppm.load(std::memory_order_relaxed);
  if (out->contention_scale_ppm == 0) out->contention_scale_ppm = kShareWholeGpuPpm;
  out->snapshot_ns = MonotonicNowNs();
  out->active_processes = share()->active_processes.load(std::memory_order_relaxed);
  const TierHeader* th = tier_header();
  out->host_tier_budget_bytes = th->host_budget_bytes.load(std::memory_order_relaxed);
  out->host_tier_used_bytes = th->host_used_bytes.load(std::memory_order_relaxed);
  out->swaps_out_total = th->swaps_out_total.load(std::memory_order_relaxed);
  out->swaps_in_total = th->swaps_in_total.load(std::memory_order_relaxed);
  out->bytes_out_total = th->bytes_out_total.load(std::memory_order_relaxed);
  out->bytes_in_total = th->bytes_in_total.load(std::memory_order_relaxed);
  out->swap_failures_total = th->swap_failures_total.load(std::memory_order_relaxed);
  uint32_t counts[kMaxVgpus] = {};
  for (uint32_t i = 0; i < kMaxProcesses; ++i) {
    const ProcessSlot* p = process(i);
    if (p->state.load(std::memory_order_acquire) != kSlotActive) continue;
    ProcessInfo& pi = out->processes[out->process_count++];
    pi.slot = i;
    pi.vgpu_index = p->vgpu_index.load(std::memory_order_relaxed);
    pi.pid = p->pid.load(std::memory_order_relaxed);
    pi.start_time_ticks = p->start_time_ticks.load(std::memory_order_relaxed);
    pi.vram_bytes = p->vram_bytes.load(std::memory_order_relaxed);
    pi.throttled_ns = p->throttled_ns.load(std::memory_order_relaxed);
    pi.waiting = p->wait_since_ns.load(std::memory_order_relaxed) != 0;
    pi.active_until_ns = p->active_until_ns.load(std::memory_order_relaxed);
    pi.holds_lease = owner == i + 1;
    const ProcessTier* t = TierOfProcess(i);
    pi.tier_state = t->state.load(std::memory_order_relaxed);
    pi.tier_last_error = t->last_error.load(std::memory_order_relaxed);
    pi.last_active_ns = t->last_active_ns.load(std::memory_order_relaxed);
    pi.movable_bytes = t->movable_bytes.load(std::memory_order_relaxed);
    pi.host_bytes = t->host_bytes.load(std::memory_order_relaxed);
    pi.fixed_bytes = t->fixed_bytes.load(std::memory_order_relaxed);
    pi.swaps_out = t->swaps_out.load(std::memory_order_relaxed);
    pi.swaps_in = t->swaps_in.load(std::memory_order_relaxed);
    pi.last_out_us = t->last_out_us.load(std::memory_order_relaxed);
    pi.last_in_us = t->last_in_us.load(std::memory_order_relaxed);
    FillZeroInfo(ZeroOfProcess(i), &pi);
    if (pi.vgpu_index < kMaxVgpus) ++counts[pi.vgpu_index];
  }
  for (uint32_t i = 0; i < kMaxVgpus; ++i) {
    const VgpuSlot* v = vgpu(i);
    if (v->state.load(std::memory_order_acquire) != kSlotActive) continue;
    VgpuInfo& vi = out->vgpus[out->vgpu_count++];
    vi.index = i;
    memcpy(vi.id, v->id, kVgpuIdBytes);
    vi.id[kVgpuIdBytes - 1] = '\0';
    vi.vram_limit_bytes = v->vram_limit_bytes.load(std::memory_order_relaxed);
    vi.vram_used_bytes = v->vram_used_bytes.load(std::memory_order_relaxed);
    vi.compute_share_ppm = v->compute_share_ppm.load(std::memory_order_relaxed);
    vi.compute_limit_ppm = v->compute_limit_ppm.load(std::memory_order_relaxed);
    vi.qos = v->qos.load(std::memory_order_relaxed);
    vi.request_tokens_ns = v->request_tokens_ns.load(std::memory_order_relaxed);
    vi.last_demand_ns = v->last_demand_ns.load(std::memory_order_relaxed);
    vi.tokens_ns = v->tokens_ns.load(std::memory_order_relaxed);
    vi.busy_ns_total = v->busy_ns_total.load(std::memory_order_relaxed);
    // The reasons before the total they are part of (each added after it, with release: ShareTick),
    // so that they never add up to more than the throttled time read here.
    vi.held_turn_ns_total = v->held_turn_ns_total.load(std::memory_order_acquire);
    vi.held_limit_ns_total = v->held_limit_ns_total.load(std::memory_order_acquire);
    vi.held_others_ns_total = v->held_others_ns_total.load(std::memory_order_acquire);
    vi.throttled_ns_total = v->throttled_ns_total.load(std::memory_order_relaxed);
    vi.launches_total = v->launches_total.load(std::memory_order_relaxed);
    vi.leases_total = v->leases_total.load(std::memory_order_relaxed);
    vi.oom_total = v->oom_total.load(std::memory_order_relaxed);
    vi.drift_events = v->drift_events.load(std::memory_order_relaxed);
    vi.process_count = counts[i];
    vi.tier_enabled = TierOfVgpu(i)->enabled.load(std::memory_order_relaxed) != 0;
    vi.idle_swap_ms = TierOfVgpu(i)->idle_swap_ms.load(std::memory_order_relaxed);
    vi.idle_disk_ms = TierOfVgpu(i)->idle_disk_ms.load(std::memory_order_relaxed);
    vi.held = TierOfVgpu(i)->held.load(std::memory_order_relaxed) != 0;
    vi.idle_zero_ms = TierOfVgpu(i)->idle_zero_ms.load(std::memory_order_relaxed);
  }
}

}  // namespace tf::limiter
