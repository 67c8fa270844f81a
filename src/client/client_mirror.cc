// Mirrored host memory, the client's side (remote_protocol.h kOpMirror*, docs/remote.md
// "Mirrored memory"). Where the transport cannot share memory (TCP), host memory that kernels on
// the worker must reach (cuMemHostAlloc with DEVICEMAP, cuMemHostRegister with DEVICEMAP,
// page-locked memory whose device pointer was asked for, managed memory) is mirrored: the worker
// maps memory at the same address and registers it, and each side sends the other the bytes that
// changed since they last agreed. This file keeps the table of mirrors and their twins (what the
// worker last saw), pushes this side's changes before every call the stub sends (SendFrame) and
// before every host-function acknowledgement, and applies the worker's changes (kEvtMirrorData)
// as they arrive.
//
// Locking: g_mirror_mu guards the table and every read or write of twins done here; it is taken
// after State().mu (or without it: the callback thread's push), never before.
#include <sys/mman.h>

#include <map>
#include <mutex>
#include <vector>

#include "client/client_internal.h"
#include "client/mirror_runs.h"

namespace tf::client {
namespace {

using transport::Writer;

struct Mirror {
  uint64_t size = 0;
  uint8_t* twin = nullptr;  // size bytes: what the worker has, as far as this side knows
  const Session* owner = nullptr;
  bool anonymous = false;       // compared where populated only (mirror_runs.h ResidentSpans)
  std::vector<uint64_t> seen;   // pages populated at an earlier push (anonymous mirrors)
};

std::mutex g_mirror_mu;
remote::ResidentSpans g_resident;  // guarded by g_mirror_mu
std::map<uint64_t, Mirror>& Mirrors() {
  static auto* m = new std::map<uint64_t, Mirror>();  // never destroyed
  return *m;
}

// REQUIRES g_mirror_mu.
const Mirror* FindLocked(const Session* s, uint64_t p, uint64_t n, uint64_t* base) {
  auto& m = Mirrors();
  auto it = m.upper_bound(p);
  if (it == m.begin()) return nullptr;
  --it;
  const uint64_t off = p - it->first;
  if (it->second.owner != s || off >= it->second.size || n > it->second.size - off) return nullptr;
  if (base) *base = it->first;
  return &it->second;
}

bool SendPush(void* ctx, const uint8_t* payload, uint32_t payload_len, const uint8_t* bulk,
              uint64_t bulk_len) {
  auto* s = static_cast<Session*>(ctx);
  transport::OutFrame f;
  f.opcode = remote::kOpMirrorData;
  f.sequence = s->next_seq++;
  f.payload = payload;
  f.payload_length = payload_len;
  f.bulk = bulk;
  f.bulk_length = bulk_len;
  return s->transport->Send(f).ok();  // a broken transport fails the call that follows
}

void LogRefusedOnce() {
  static std::atomic<bool> logged{false};
  if (!logged.exchange(true)) {
    ClientLog("the worker could not map host memory at this process's address (mirrored "
              "memory), so kernels cannot use it: returning CUDA_ERROR_NOT_SUPPORTED; copies "
              "to and from it still work");
  }
}

}  // namespace

CUresult MirrorMap(Session* s, uint64_t base, uint64_t size, uint32_t kind, bool anonymous) {
  if (!s->mirrors || size == 0) return CUDA_ERROR_NOT_SUPPORTED;
  uint8_t buf[24];
  Writer w(buf, sizeof(buf));
  w.U64(base);
  w.U64(size);
  w.U32(kind);
  ReplyView rv;
  CUresult r = CallSync(s, remote::kOpMirrorMap, w, &rv);
  if (r == CUDA_ERROR_NOT_SUPPORTED) LogRefusedOnce();
  if (r != CUDA_SUCCESS) return r;
  uint64_t dptr = 0;
  const bool same = rv.reader.U64(&dptr) && dptr == base;
  void* twin = same ? mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                    : MAP_FAILED;
  if (twin == MAP_FAILED) {
    Writer u(buf, sizeof(buf));
    u.U64(base);
    (void)CallSync(s, remote::kOpMirrorUnmap, u, nullptr);
    return same ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_NOT_SUPPORTED;
  }
  std::lock_guard<std::mutex> g(g_mirror_mu);
  Mirrors()[base] = Mirror{size, static_cast<uint8_t*>(twin), s, anonymous, {}};
  s->mirror_count.fetch_add(1);
  return CUDA_SUCCESS;
}

CUresult MirrorUnmap(Session* s, uint64_t base) {
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.U64(base);
  // The mirror stays in the table until the reply: changes the worker sends before it are valid.
  CUresult r = CallSync(s, remote::kOpMirrorUnmap, w, nullptr);
  std::lock_guard<std::mutex> g(g_mirror_mu);
  auto it = Mirrors().find(base);
  if (it != Mirrors().end() && it->second.owner == s) {
    munmap(it->second.twin, it->second.size);
    Mirrors().erase(it);
    s->mirror_count.fetch_sub(1);
  }
  return r;
}

void ForgetMirrors(Session* s) {
  std::lock_guard<std::mutex> g(g_mirror_mu);
  for (auto it = Mirrors().begin(); it != Mirrors().end();) {
    if (it->second.owner != s) {
      ++it;
      continue;
    }
    munmap(it->second.twin, it->second.size);
    it = Mirrors().erase(it);
    s->mirror_count.fetch_sub(1);
  }
}

void PushMirrors(Session* s) {
  std::lock_guard<std::mutex> g(g_mirror_mu);
  remote::MirrorRunPacker packer(std::min<uint64_t>(s->transport->max_bulk_bytes(), 8ull << 20),
                                 &SendPush, s);
  for (auto& [base, m] : Mirrors()) {
    if (m.owner != s) continue;
    const bool spans = m.anonymous && g_resident.ForEach(base, m.size, &m.seen, [&](uint64_t off, uint64_t n) {
      packer.AddChanges(base + off, n, m.twin + off);
    });
    if (!spans) packer.AddChanges(base, m.size, m.twin);
  }
  packer.Flush();
}

bool ApplyMirrorData(Session* s, const transport::InFrame& in) {
  static std::vector<remote::MirrorRun>* runs = new std::vector<remote::MirrorRun>();
  std::lock_guard<std::mutex> g(g_mirror_mu);
  if (!remote::DecodeMirrorData(in.payload, in.payload_length, in.bulk, in.bulk_length, runs)) return false;
  return remote::ApplyMirrorRuns(*runs, in.bulk, [&](uint64_t addr, uint64_t len) -> uint8_t* {
    uint64_t base = 0;
    const Mirror* m = FindLocked(s, addr, len, &base);
    return m == nullptr ? nullptr : m->twin + (addr - base);
  });
}

}  // namespace tf::client
