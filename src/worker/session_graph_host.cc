// Shadows of the client's pageable memory for graph memcpy nodes: see session_graph_host.h.
#include "worker/session_graph_host.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "client/mirror_runs.h"
#include "worker/session_mirrors.h"  // SessionLog

namespace tf::worker {
namespace {

// Rows of a 2D/3D copy sent back one run each up to this many; beyond, the whole span.
constexpr uint64_t kMaxRowsPerCopy = 4096;

struct SendBackArg {
  GraphHostCopies* self;
  std::vector<GraphHostCopies::Range> ranges;
};

}  // namespace

#define CALL(fn, ...) (d_.fn ? d_.fn(__VA_ARGS__) : CUDA_ERROR_NOT_SUPPORTED)

GraphHostCopies::ShadowMem* GraphHostCopies::FindLocked(uint64_t addr, uint64_t n, uint64_t* base) {
  // Shadows may overlap: the latest one holding the whole range.
  ShadowMem* found = nullptr;
  for (auto it = shadows_.begin(); it != shadows_.end() && it->first <= addr; ++it) {
    const uint64_t off = addr - it->first;
    if (off < it->second.len && n <= it->second.len - off) {
      found = &it->second;
      if (base) *base = it->first;
    }
  }
  return found;
}

bool GraphHostCopies::ClientRangeLocked(const void* local, uint64_t n, uint64_t* addr) const {
  const auto* p = static_cast<const uint8_t*>(local);
  for (const auto& [base, s] : shadows_) {
    if (p >= s.local && p < s.local + s.len && n <= static_cast<uint64_t>(s.local + s.len - p)) {
      *addr = base + static_cast<uint64_t>(p - s.local);
      return true;
    }
  }
  return false;
}

void* GraphHostCopies::Shadow(uint64_t addr, uint64_t n) {
  if (n == 0 || addr == 0 || n > remote::kMaxMirrorBytes || addr + n < addr) return nullptr;
  std::lock_guard<std::mutex> g(mu_);
  uint64_t base = 0;
  if (ShadowMem* s = FindLocked(addr, n, &base)) return s->local + (addr - base);
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  ShadowMem s;
  s.len = n;
  s.map_len = (n + page - 1) / page * page;
  if (host_memory_.ChargePinned(s.map_len, "graph copies of pageable memory", &s.charge) !=
      CUDA_SUCCESS) {
    return nullptr;
  }
  void* p = mmap(nullptr, s.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    host_memory_.Release(&s.charge);
    return nullptr;
  }
  s.local = static_cast<uint8_t*>(p);
  // Pinned, so the node is a DMA as with page-locked memory; the driver copies unregistered
  // memory too (staged), so a refusal only costs speed. Shadows are made while a stream captures,
  // where registering is an unsafe call that would invalidate a global-mode capture: this thread
  // registers in relaxed mode (the program made no such call natively).
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  const bool exchanged = CALL(cuThreadExchangeStreamCaptureMode, &mode) == CUDA_SUCCESS;
  s.registered = CALL(cuMemHostRegister_v2, p, s.map_len, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS;
  if (exchanged) CALL(cuThreadExchangeStreamCaptureMode, &mode);
  shadows_.emplace(addr, s);
  return s.local;
}

void GraphHostCopies::AddCopyLocked(const CUDA_MEMCPY3D& c, std::vector<Range>* out) const {
  const uint64_t w = c.WidthInBytes, h = c.Height ? c.Height : 1, d = c.Depth ? c.Depth : 1;
  if (w == 0) return;
  for (int side = 0; side < 2; ++side) {
    const bool src = side == 0;
    // The driver may describe the node's host side as unified memory (the pointer in *Device).
    const CUmemorytype type = src ? c.srcMemoryType : c.dstMemoryType;
    if (type != CU_MEMORYTYPE_HOST && type != CU_MEMORYTYPE_UNIFIED) continue;
    const auto* host = type == CU_MEMORYTYPE_HOST
                           ? static_cast<const uint8_t*>(src ? c.srcHost : c.dstHost)
                           : reinterpret_cast<const uint8_t*>(src ? c.srcDevice : c.dstDevice);
    const uint64_t x = src ? c.srcXInBytes : c.dstXInBytes, y = src ? c.srcY : c.dstY,
                   z = src ? c.srcZ : c.dstZ;
    const uint64_t pitch = (src ? c.srcPitch : c.dstPitch) ? (src ? c.srcPitch : c.dstPitch) : w;
    const uint64_t rows = (src ? c.srcHeight : c.dstHeight) ? (src ? c.srcHeight : c.dstHeight) : h;
    const uint8_t* first = host + z * pitch * rows + y * pitch + x;
    const uint64_t span = (d - 1) * pitch * rows + (h - 1) * pitch + w;
    uint64_t addr = 0;
    if (!ClientRangeLocked(first, span, &addr)) continue;  // a host region or a mirror
    const uint8_t dir = src ? remote::kRegionToDevice : remote::kRegionToHost;
    // Written ranges row by row: the bytes between rows are the program's, not the node's.
    if (dir == remote::kRegionToHost && pitch != w && h * d <= kMaxRowsPerCopy) {
      for (uint64_t k = 0; k < d; ++k) {
        for (uint64_t r = 0; r < h; ++r) {
          const uint64_t at = k * pitch * rows + r * pitch;
          out->push_back({addr + at, w, dir, first + at});
        }
      }
    } else {
      out->push_back({addr, span, dir, first});
    }
  }
}

void GraphHostCopies::Scan(CUgraph g, int depth, CUgraphNode top, NodeRanges* out) {
  if (depth > 16) return;
  size_t count = 0;
  if (CALL(cuGraphGetNodes, g, nullptr, &count) != CUDA_SUCCESS || count == 0) return;
  std::vector<CUgraphNode> nodes(count);
  if (CALL(cuGraphGetNodes, g, nodes.data(), &count) != CUDA_SUCCESS) return;
  for (size_t i = 0; i < count; ++i) {
    CUgraphNodeType t = CU_GRAPH_NODE_TYPE_EMPTY;
    if (CALL(cuGraphNodeGetType, nodes[i], &t) != CUDA_SUCCESS) continue;
    const CUgraphNode key = top ? top : nodes[i];
    if (t == CU_GRAPH_NODE_TYPE_MEMCPY) {
      CUDA_MEMCPY3D c = {};
      if (CALL(cuGraphMemcpyNodeGetParams, nodes[i], &c) == CUDA_SUCCESS) {
        std::vector<Range> ranges;
        {
          std::lock_guard<std::mutex> l(mu_);
          AddCopyLocked(c, &ranges);
        }
        if (!ranges.empty()) {
          auto& v = (*out)[reinterpret_cast<uint64_t>(key)];
          v.insert(v.end(), ranges.begin(), ranges.end());
        }
      }
    } else if (t == CU_GRAPH_NODE_TYPE_GRAPH) {
      CUgraph child = nullptr;
      if (CALL(cuGraphChildGraphNodeGetGraph, nodes[i], &child) == CUDA_SUCCESS) Scan(child, depth + 1, key, out);
    }
  }
}

void GraphHostCopies::Instantiated(CUgraphExec e, CUgraph g) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (shadows_.empty()) {
      execs_.erase(reinterpret_cast<uint64_t>(e));
      return;  // no shadow: nothing to scan for
    }
  }
  NodeRanges ranges;
  Scan(g, 0, nullptr, &ranges);
  HostAncestors(e, g, ranges);
  std::lock_guard<std::mutex> l(mu_);
  if (ranges.empty()) execs_.erase(reinterpret_cast<uint64_t>(e));
  else execs_[reinterpret_cast<uint64_t>(e)] = std::move(ranges);
}

void GraphHostCopies::HostAncestors(CUgraphExec e, CUgraph g, const NodeRanges& ranges) {
  std::map<const void*, std::vector<uint64_t>> before;
  size_t count = 0;
  std::vector<CUgraphNode> nodes;
  if (!ranges.empty() && CALL(cuGraphGetNodes, g, nullptr, &count) == CUDA_SUCCESS && count > 0) {
    nodes.resize(count);
    if (CALL(cuGraphGetNodes, g, nodes.data(), &count) != CUDA_SUCCESS) nodes.clear();
    nodes.resize(std::min(nodes.size(), count));
  }
  auto deps_of = [&](CUgraphNode n, std::vector<CUgraphNode>* out) {
    size_t k = 0;
    out->clear();
    if (d_.cuGraphNodeGetDependencies_v2) {
      if (d_.cuGraphNodeGetDependencies_v2(n, nullptr, nullptr, &k) != CUDA_SUCCESS || k == 0) return;
      out->resize(k);
      if (d_.cuGraphNodeGetDependencies_v2(n, out->data(), nullptr, &k) != CUDA_SUCCESS) k = 0;
    } else {
      if (CALL(cuGraphNodeGetDependencies, n, nullptr, &k) != CUDA_SUCCESS || k == 0) return;
      out->resize(k);
      if (CALL(cuGraphNodeGetDependencies, n, out->data(), &k) != CUDA_SUCCESS) k = 0;
    }
    out->resize(std::min(out->size(), k));
  };
  for (CUgraphNode n : nodes) {
    CUgraphNodeType t = CU_GRAPH_NODE_TYPE_EMPTY;
    CUDA_HOST_NODE_PARAMS hp = {};
    if (CALL(cuGraphNodeGetType, n, &t) != CUDA_SUCCESS || t != CU_GRAPH_NODE_TYPE_HOST ||
        CALL(cuGraphHostNodeGetParams, n, &hp) != CUDA_SUCCESS) {
      continue;
    }
    // Its ancestors, breadth first (a graph is acyclic; bounded by the node count anyway).
    std::set<uint64_t> seen;
    std::vector<CUgraphNode> todo{n}, deps;
    while (!todo.empty() && seen.size() <= nodes.size()) {
      CUgraphNode x = todo.back();
      todo.pop_back();
      deps_of(x, &deps);
      for (CUgraphNode p : deps) {
        if (seen.insert(reinterpret_cast<uint64_t>(p)).second) todo.push_back(p);
      }
    }
    auto& v = before[hp.userData];
    for (uint64_t a : seen) {
      if (ranges.count(a)) v.push_back(a);
    }
  }
  std::lock_guard<std::mutex> l(mu_);
  if (before.empty()) host_before_.erase(reinterpret_cast<uint64_t>(e));
  else host_before_[reinterpret_cast<uint64_t>(e)] = std::move(before);
}

void GraphHostCopies::BeforeHostNode(const void* user) {
  std::vector<Range> out;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& [e, hosts] : host_before_) {
      auto h = hosts.find(user);
      auto x = execs_.find(e);
      if (h == hosts.end() || x == execs_.end()) continue;
      for (uint64_t node : h->second) {
        auto r = x->second.find(node);
        if (r == x->second.end()) continue;
        for (const Range& range : r->second) {
          if (range.direction == remote::kRegionToHost) out.push_back(range);
        }
      }
    }
  }
  if (!out.empty() && !SendRanges(out)) SessionLog("graph copy data not sent: the client is gone");
}

void GraphHostCopies::ChildSet(CUgraphExec e, CUgraphNode node, CUgraph child) {
  NodeRanges ranges;
  Scan(child, 1, node, &ranges);
  std::lock_guard<std::mutex> l(mu_);
  auto& x = execs_[reinterpret_cast<uint64_t>(e)];
  x.erase(reinterpret_cast<uint64_t>(node));
  for (auto& [k, v] : ranges) x[k] = std::move(v);
}

void GraphHostCopies::CopySet(CUgraphExec e, CUgraphNode node, const CUDA_MEMCPY3D& c) {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<Range> ranges;
  AddCopyLocked(c, &ranges);
  auto& x = execs_[reinterpret_cast<uint64_t>(e)];
  if (ranges.empty()) x.erase(reinterpret_cast<uint64_t>(node));
  else x[reinterpret_cast<uint64_t>(node)] = std::move(ranges);
}

void GraphHostCopies::Destroyed(CUgraphExec e) {
  std::lock_guard<std::mutex> l(mu_);
  execs_.erase(reinterpret_cast<uint64_t>(e));
  host_before_.erase(reinterpret_cast<uint64_t>(e));
}

void GraphHostCopies::Describe(CUgraphExec e, transport::Writer& out) const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<Range> all;
  auto it = execs_.find(reinterpret_cast<uint64_t>(e));
  if (it != execs_.end()) {
    for (const auto& [node, v] : it->second) all.insert(all.end(), v.begin(), v.end());
  }
  const size_t n = std::min<size_t>(all.size(), remote::kMaxMirrorRuns);
  out.U32(static_cast<uint32_t>(n));
  for (size_t i = 0; i < n; ++i) {
    out.U64(all[i].addr);
    out.U64(all[i].len);
    out.U8(all[i].direction);
  }
}

CUresult GraphHostCopies::Launched(CUgraphExec e, CUstream stream) {
  auto* arg = new SendBackArg{this, {}};
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = execs_.find(reinterpret_cast<uint64_t>(e));
    if (it != execs_.end()) {
      for (const auto& [node, v] : it->second) {
        for (const Range& r : v) {
          if (r.direction == remote::kRegionToHost) arg->ranges.push_back(r);
        }
      }
    }
  }
  if (arg->ranges.empty()) {
    delete arg;
    return CUDA_SUCCESS;
  }
  CUresult r = CALL(cuLaunchHostFunc, stream, &GraphHostCopies::SendBack, arg);
  if (r != CUDA_SUCCESS) delete arg;
  return r;
}

void GraphHostCopies::SendBack(void* p) {
  auto* arg = static_cast<SendBackArg*>(p);
  if (!arg->self->SendRanges(arg->ranges)) SessionLog("graph copy data not sent: the client is gone");
  delete arg;
}

bool GraphHostCopies::SendRanges(const std::vector<Range>& ranges) {
  if (t_ == nullptr) return false;
  const uint64_t limit = std::min<uint64_t>(t_->max_bulk_bytes(), 8ull << 20);
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  std::vector<uint8_t> bulk, payload;
  auto flush = [&]() {
    if (runs.empty()) return true;
    payload.resize(4 + 16 * runs.size());
    transport::Writer w(payload.data(), payload.size());
    w.U32(static_cast<uint32_t>(runs.size()));
    for (auto& [a, n] : runs) {
      w.U64(a);
      w.U64(n);
    }
    transport::OutFrame f;
    f.opcode = remote::kEvtGraphHostData;
    f.sequence = (*seq_)++;
    f.payload = w.data();
    f.payload_length = static_cast<uint32_t>(w.size());
    f.bulk = bulk.data();
    f.bulk_length = bulk.size();
    runs.clear();
    bulk.clear();
    return t_->Send(f).ok();
  };
  std::lock_guard<std::mutex> l(mu_);
  for (const Range& r : ranges) {
    const uint8_t* from = r.local;
    if (from == nullptr) {
      uint64_t base = 0;
      ShadowMem* s = FindLocked(r.addr, r.len, &base);
      if (s == nullptr) continue;
      from = s->local + (r.addr - base);
    }
    uint64_t off = 0;
    while (off < r.len) {
      if (runs.size() == remote::kMaxMirrorRuns || bulk.size() == limit) {
        if (!flush()) return false;
      }
      const uint64_t take = std::min<uint64_t>(r.len - off, limit - bulk.size());
      const uint8_t* src = from + off;
      bulk.insert(bulk.end(), src, src + take);
      runs.push_back({r.addr + off, take});
      off += take;
    }
  }
  return flush();
}

CUresult GraphHostCopies::Apply(const uint8_t* payload, uint32_t payload_len, const uint8_t* bulk,
                                uint64_t bulk_len) {
  std::vector<remote::MirrorRun> runs;
  if (!remote::DecodeMirrorRuns(payload, payload_len, bulk_len, &runs) || bulk == nullptr) {
    SessionLog("graph copy data refused: malformed message");
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard<std::mutex> l(mu_);
  std::vector<std::vector<uint8_t*>> to(runs.size());  // every shadow holding the run
  for (size_t i = 0; i < runs.size(); ++i) {
    const uint64_t addr = runs[i].addr, n = runs[i].len;
    for (auto it = shadows_.begin(); it != shadows_.end() && it->first <= addr; ++it) {
      const uint64_t off = addr - it->first;
      if (off < it->second.len && n <= it->second.len - off) to[i].push_back(it->second.local + off);
    }
    if (to[i].empty()) {
      SessionLog("graph copy data refused: [0x%llx, +%llu) is not memory a graph copy of this "
                 "session names", static_cast<unsigned long long>(addr),
                 static_cast<unsigned long long>(n));
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    for (uint8_t* p : to[i]) memcpy(p, bulk, runs[i].len);
    bulk += runs[i].len;
  }
  return CUDA_SUCCESS;
}

size_t GraphHostCopies::Clear() {
  std::multimap<uint64_t, ShadowMem> all;
  {
    std::lock_guard<std::mutex> l(mu_);
    all.swap(shadows_);
    execs_.clear();
    host_before_.clear();
  }
  for (auto& [addr, s] : all) {
    if (s.registered) CALL(cuMemHostUnregister, s.local);
    munmap(s.local, s.map_len);
    host_memory_.Release(&s.charge);
  }
  return all.size();
}

}  // namespace tf::worker
