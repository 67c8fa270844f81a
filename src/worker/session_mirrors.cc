// Mirrored host memory on the worker side: see session_mirrors.h.
#include "worker/session_mirrors.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

namespace tf::worker {
namespace {


uint64_t PageSize() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }

struct PullTarget {
  transport::Transport* t;
  std::atomic<uint64_t>* seq;
};

bool SendEvent(void* ctx, const uint8_t* payload, uint32_t payload_len, const uint8_t* bulk,
               uint64_t bulk_len) {
  auto* p = static_cast<PullTarget*>(ctx);
  transport::OutFrame f;
  f.opcode = remote::kEvtMirrorData;
  f.sequence = (*p->seq)++;
  f.payload = payload;
  f.payload_length = payload_len;
  f.bulk = bulk;
  f.bulk_length = bulk_len;
  return p->t->Send(f).ok();  // a dead client is noticed by the session's next Receive
}

}  // namespace

#define CALL(fn, ...) (d_.fn ? d_.fn(__VA_ARGS__) : CUDA_ERROR_NOT_SUPPORTED)

const SessionMirrors::Mirror* SessionMirrors::FindLocked(uint64_t p, uint64_t n,
                                                         uint64_t* base) const {
  auto it = mirrors_.upper_bound(p);
  if (it == mirrors_.begin()) return nullptr;
  --it;
  const uint64_t off = p - it->first;
  if (off >= it->second.len || n > it->second.len - off) return nullptr;
  if (base) *base = it->first;
  return &it->second;
}

CUresult SessionMirrors::Call(uint16_t op, transport::Reader& rd, transport::Writer& out) {
  if (op == remote::kOpMirrorMap) {
    uint64_t addr = 0, len = 0;
    uint32_t kind = 0;
    rd.U64(&addr);
    rd.U64(&len);
    rd.U32(&kind);
    if (!rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
    return Map(addr, len, kind, out);
  }
  uint64_t addr = 0;
  rd.U64(&addr);
  if (!rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
  return Unmap(addr);
}

CUresult SessionMirrors::Map(uint64_t addr, uint64_t len, uint32_t kind, transport::Writer& out) {
  const uint64_t page = PageSize();
  const char* why = nullptr;
  if (addr == 0 || len == 0) why = "empty range";
  else if (len > remote::kMaxMirrorBytes || addr + len < addr ||
           addr + len > (1ull << 47)) why = "range too large";
  else if (kind != remote::kMirrorMapped && kind != remote::kMirrorManaged) why = "unknown kind";
  if (why == nullptr) {
    std::lock_guard<std::mutex> g(mu_);
    if (FindLocked(addr, 1, nullptr) ||
        mirrors_.lower_bound(addr) != mirrors_.lower_bound(addr + len)) {
      why = "range overlaps a mirror of this session";
    }
  }
  if (why) {
    SessionLog("mirror [0x%llx, +%llu) refused: %s", static_cast<unsigned long long>(addr),
        static_cast<unsigned long long>(len), why);
    return CUDA_ERROR_INVALID_VALUE;
  }
  Mirror m;
  m.len = len;
  const uint64_t start = addr / page * page;
  m.map_len = (addr + len - start + page - 1) / page * page;
  CUresult charged = kind == remote::kMirrorManaged
                         ? host_memory_.ChargeManaged(m.map_len, &m.charge)
                         : host_memory_.ChargePinned(m.map_len, "mapped page-locked memory", &m.charge);
  if (charged != CUDA_SUCCESS) return charged;
  // At the client's address or not at all: a kernel is given that address.
  void* p = mmap(reinterpret_cast<void*>(start), m.map_len, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (p == MAP_FAILED || reinterpret_cast<uint64_t>(p) != start) {
    host_memory_.Release(&m.charge);
    if (p != MAP_FAILED) munmap(p, m.map_len);
    SessionLog("mirror [0x%llx, +%llu) refused: the address is taken in the session process",
        static_cast<unsigned long long>(addr), static_cast<unsigned long long>(len));
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  m.map_base = static_cast<uint8_t*>(p);
  CUresult r = CALL(cuMemHostRegister_v2, p, m.map_len,
                    CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
  if (r != CUDA_SUCCESS) {
    munmap(p, m.map_len);
    host_memory_.Release(&m.charge);
    SessionLog("mirror [0x%llx, +%llu) refused: cuMemHostRegister failed with %d",
        static_cast<unsigned long long>(addr), static_cast<unsigned long long>(len),
        static_cast<int>(r));
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  CUdeviceptr dptr = 0;
  r = CALL(cuMemHostGetDevicePointer_v2, &dptr, reinterpret_cast<void*>(addr), 0);
  if (r != CUDA_SUCCESS || dptr != addr) {
    CALL(cuMemHostUnregister, p);
    munmap(p, m.map_len);
    host_memory_.Release(&m.charge);
    SessionLog("mirror [0x%llx, +%llu) refused: the device pointer is not the host address (%d)",
        static_cast<unsigned long long>(addr), static_cast<unsigned long long>(len),
        static_cast<int>(r));
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  void* twin = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (twin == MAP_FAILED) {
    CALL(cuMemHostUnregister, p);
    munmap(p, m.map_len);
    host_memory_.Release(&m.charge);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  m.twin = static_cast<uint8_t*>(twin);
  {
    std::lock_guard<std::mutex> g(mu_);
    mirrors_[addr] = m;
    count_.store(mirrors_.size());
  }
  out.U64(dptr);
  return CUDA_SUCCESS;
}

void SessionMirrors::Release(Mirror& m) {
  CALL(cuMemHostUnregister, m.map_base);
  munmap(m.map_base, m.map_len);
  munmap(m.twin, m.len);
  host_memory_.Release(&m.charge);
}

CUresult SessionMirrors::Unmap(uint64_t addr) {
  Mirror m;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = mirrors_.find(addr);
    if (it == mirrors_.end()) {
      SessionLog("mirror unmap of 0x%llx refused: no mirror there", static_cast<unsigned long long>(addr));
      return CUDA_ERROR_INVALID_VALUE;
    }
    m = it->second;
    mirrors_.erase(it);
    count_.store(mirrors_.size());
  }
  // As cuMemFreeHost: nothing may still be using it.
  CALL(cuCtxSynchronize);
  Release(m);
  return CUDA_SUCCESS;
}

CUresult SessionMirrors::Apply(const uint8_t* payload, uint32_t payload_len, const uint8_t* bulk,
                               uint64_t bulk_len) {
  if (!remote::DecodeMirrorData(payload, payload_len, bulk, bulk_len, &runs_) || bulk == nullptr) {
    SessionLog("mirror data refused: malformed message");
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard<std::mutex> g(mu_);
  const bool applied = remote::ApplyMirrorRuns(runs_, bulk, [&](uint64_t addr, uint64_t len) -> uint8_t* {
    uint64_t base = 0;
    const Mirror* m = FindLocked(addr, len, &base);
    if (m == nullptr) {
      SessionLog("mirror data refused: [0x%llx, +%llu) is not inside a mirror of this session",
                 static_cast<unsigned long long>(addr), static_cast<unsigned long long>(len));
      return nullptr;
    }
    return m->twin + (addr - base);
  });
  return applied ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

void SessionMirrors::Pull(transport::Transport* t, std::atomic<uint64_t>* seq, bool after_work_only) {
  if (count_.load(std::memory_order_relaxed) == 0) return;
  // Cleared before the compare, by the session thread's pulls only (they follow the calls that
  // note work): work noted from now on is compared next time. A host function's pull on a stream
  // thread compares without clearing, or a reply after it could miss what finished in between.
  if (after_work_only && !work_.exchange(false, std::memory_order_acq_rel)) return;
  PullTarget target{t, seq};
  remote::MirrorRunPacker packer(std::min<uint64_t>(t->max_bulk_bytes(), 8ull << 20), &SendEvent,
                                 &target);
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [addr, m] : mirrors_) {
    const bool spans = resident_.ForEach(addr, m.len, &m.seen, [&](uint64_t off, uint64_t n) {
      packer.AddChanges(addr + off, n, m.twin + off);
    });
    if (!spans) packer.AddChanges(addr, m.len, m.twin);
  }
  packer.Flush();
}

bool SessionMirrors::Contains(uint64_t p, uint64_t n) const {
  if (count_.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard<std::mutex> g(mu_);
  return FindLocked(p, n, nullptr) != nullptr;
}

size_t SessionMirrors::Clear() {
  std::map<uint64_t, Mirror> all;
  {
    std::lock_guard<std::mutex> g(mu_);
    all.swap(mirrors_);
    count_.store(0);
  }
  for (auto& [addr, m] : all) Release(m);
  return all.size();
}

}  // namespace tf::worker
