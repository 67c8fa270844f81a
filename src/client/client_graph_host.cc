// Graph memcpy nodes with pageable memory of this process, the client's side (remote_protocol.h
// kOpGraphHostCopies / kOpGraphHostData / kEvtGraphHostData; worker session_graph_host.h). The
// worker copies such a node through a shadow of its own. Before each launch of an executable
// graph this file sends the current bytes of the ranges its nodes read, and it writes the bytes
// its nodes wrote into this process's memory when the worker's event arrives (before the reply
// of the call that waited for the stream). Which ranges an executable graph copies is asked of
// the worker once, at its first launch, and again after it was updated.
//
// Locking: g_mu guards the table; the event may be applied by the callback thread without
// State().mu.
#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "client/client_internal.h"
#include "client/mirror_runs.h"

namespace tf::client {
namespace {

using transport::Writer;

struct Range {
  uint64_t addr = 0, len = 0;
  uint8_t direction = 0;
};
using Key = std::pair<const Session*, uint64_t>;  // session, executable graph

std::mutex g_mu;
std::map<Key, std::vector<Range>>& Table() {
  static auto* t = new std::map<Key, std::vector<Range>>();  // never destroyed
  return *t;
}
// Ranges written by executable graphs since destroyed or updated: a launch still running may yet
// send their bytes (natively its copies land too). The latest kMaxRetired per session.
constexpr size_t kMaxRetired = 4096;
std::map<const Session*, std::deque<Range>>& Retired() {
  static auto* t = new std::map<const Session*, std::deque<Range>>();  // never destroyed
  return *t;
}

// REQUIRES g_mu.
void RetireLocked(Session* s, uint64_t exec) {
  auto it = Table().find({s, exec});
  if (it == Table().end()) return;
  auto& q = Retired()[s];
  for (const Range& x : it->second) {
    if (x.direction == remote::kRegionToHost) q.push_back(x);
  }
  while (q.size() > kMaxRetired) q.pop_front();
  Table().erase(it);
}

bool SendData(Session* s, const std::vector<std::pair<uint64_t, uint64_t>>& runs,
              const std::vector<uint8_t>& bulk) {
  std::vector<uint8_t> payload(4 + 16 * runs.size());
  Writer w(payload.data(), payload.size());
  w.U32(static_cast<uint32_t>(runs.size()));
  for (auto& [a, n] : runs) {
    w.U64(a);
    w.U64(n);
  }
  transport::OutFrame f;
  f.opcode = remote::kOpGraphHostData;
  f.sequence = s->next_seq++;
  f.payload = w.data();
  f.payload_length = static_cast<uint32_t>(w.size());
  f.bulk = bulk.data();
  f.bulk_length = bulk.size();
  return s->transport->Send(f).ok();
}

}  // namespace

CUresult SendGraphHostSources(Session* s, uint64_t exec) {
  std::vector<Range> ranges;
  bool known = false;
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = Table().find({s, exec});
    if (it != Table().end()) {
      ranges = it->second;
      known = true;
    }
  }
  if (!known) {
    uint8_t buf[8];
    Writer w(buf, sizeof(buf));
    w.U64(exec);
    ReplyView rv;
    CUresult r = CallSync(s, remote::kOpGraphHostCopies, w, &rv);
    // A worker without graph copies of pageable memory: nothing to send.
    if (r == CUDA_ERROR_NOT_SUPPORTED) r = CUDA_SUCCESS;
    else {
      if (r != CUDA_SUCCESS) return r;
      uint32_t n = 0;
      if (!rv.reader.U32(&n) || n > remote::kMaxMirrorRuns) return CUDA_ERROR_UNKNOWN;
      ranges.resize(n);
      for (Range& x : ranges) {
        rv.reader.U64(&x.addr);
        rv.reader.U64(&x.len);
        if (!rv.reader.U8(&x.direction) || x.len == 0 || x.addr + x.len < x.addr) return CUDA_ERROR_UNKNOWN;
      }
    }
    std::lock_guard<std::mutex> g(g_mu);
    RetireLocked(s, exec);
    Table()[{s, exec}] = ranges;
  }
  // The bytes the program's memory holds now: the nodes read them at this launch.
  const uint64_t limit = std::min<uint64_t>(s->transport->max_bulk_bytes(), 8ull << 20);
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  std::vector<uint8_t> bulk;
  for (const Range& x : ranges) {
    if (x.direction != remote::kRegionToDevice) continue;
    for (uint64_t off = 0; off < x.len;) {
      if (runs.size() == remote::kMaxMirrorRuns || bulk.size() == limit) {
        if (!SendData(s, runs, bulk)) return CUDA_ERROR_LAUNCH_FAILED;
        runs.clear();
        bulk.clear();
      }
      const uint64_t take = std::min<uint64_t>(x.len - off, limit - bulk.size());
      const auto* src = reinterpret_cast<const uint8_t*>(x.addr + off);
      bulk.insert(bulk.end(), src, src + take);
      runs.push_back({x.addr + off, take});
      off += take;
    }
  }
  if (!runs.empty() && !SendData(s, runs, bulk)) return CUDA_ERROR_LAUNCH_FAILED;
  return CUDA_SUCCESS;
}

void ForgetGraphHostCopies(Session* s, uint64_t exec) {
  std::lock_guard<std::mutex> g(g_mu);
  RetireLocked(s, exec);
}

bool ApplyGraphHostData(Session* s, const transport::InFrame& in) {
  std::vector<remote::MirrorRun> runs;
  if (in.bulk == nullptr ||
      !remote::DecodeMirrorRuns(in.payload, in.payload_length, in.bulk_length, &runs)) {
    return false;
  }
  std::lock_guard<std::mutex> g(g_mu);
  // Only where an executable graph of this session writes: checked for every run first.
  auto within = [](const remote::MirrorRun& r, const Range& x) {
    return x.direction == remote::kRegionToHost && r.addr >= x.addr && r.len <= x.len &&
           r.addr - x.addr <= x.len - r.len;
  };
  auto inside = [&](const remote::MirrorRun& r) {
    auto rt = Retired().find(s);
    if (rt != Retired().end()) {
      for (const Range& x : rt->second) {
        if (within(r, x)) return true;
      }
    }
    for (auto it = Table().lower_bound({s, 0}); it != Table().end() && it->first.first == s; ++it) {
      for (const Range& x : it->second) {
        if (within(r, x)) return true;
      }
    }
    return false;
  };
  for (const auto& r : runs) {
    if (!inside(r)) return false;
  }
  const uint8_t* p = in.bulk;
  for (const auto& r : runs) {
    memcpy(reinterpret_cast<void*>(r.addr), p, r.len);
    p += r.len;
  }
  return true;
}

}  // namespace tf::client
