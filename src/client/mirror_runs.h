// Mirrored host memory (remote_protocol.h kOpMirrorData / kEvtMirrorData), the part both sides
// share: finding the bytes of a mirror that differ from its twin, packing them into messages, and
// decoding a message's runs. Header-only; no allocation on the compare path.
//
// Comparing a whole mirror at every call costs its size each time, so a program allocating managed
// memory in steps paid for every earlier step at every call. ResidentSpans narrows the compare of
// anonymous private memory to the pages that were ever populated: a page the kernel never
// populated reads as zero, and so does the twin's page (it is written only where the memory
// differed from it), so there is nothing to compare there.
//
// A "run" is a maximal span of bytes that differ from the twin. Runs are exact: a byte equal to
// its twin is never inside one, because the other side may have changed that byte meanwhile (a
// kernel writing other bytes of the same page, the application writing other fields of a struct)
// and sending our stale copy of it would undo that write. Where runs lie close together (a kernel
// that adds to every int of an array changes its low bytes only: a run of one byte every four),
// one "masked run" carries them instead: a span, a bitmap of the bytes that differ and those bytes
// only, so the same guarantee holds at a fraction of the per-run cost.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "client/remote_protocol.h"
#include "transport/wire.h"

namespace tf::remote {

// Calls run(offset, length) for each run where cur[0, n) differs from twin[0, n), in order.
// Equal memory is skipped a 4 KiB block, then 64 bytes, then 8-byte word at a time; a differing
// word is split byte by byte.
template <class F>
void ForEachChangedRun(const uint8_t* cur, const uint8_t* twin, uint64_t n, F&& run) {
  uint64_t start = 0;
  bool open = false;
  auto at = [&](uint64_t i, bool differs) {
    if (differs && !open) {
      start = i;
      open = true;
    } else if (!differs && open) {
      run(start, i - start);
      open = false;
    }
  };
  uint64_t i = 0;
  const uint64_t words_end = n & ~uint64_t{7};
  while (i < words_end) {
    if (!open) {
      if (i + 4096 <= words_end && memcmp(cur + i, twin + i, 4096) == 0) {
        i += 4096;
        continue;
      }
      if (i + 64 <= words_end && memcmp(cur + i, twin + i, 64) == 0) {
        i += 64;
        continue;
      }
    }
    uint64_t a = 0, b = 0;
    memcpy(&a, cur + i, 8);
    memcpy(&b, twin + i, 8);
    const uint64_t x = a ^ b;
    if (x == 0) {
      at(i, false);
    } else {
      for (int k = 0; k < 8; ++k) at(i + k, ((x >> (8 * k)) & 0xff) != 0);  // little-endian
    }
    i += 8;
  }
  for (; i < n; ++i) at(i, cur[i] != twin[i]);
  if (open) run(start, n - start);
}

// Which pages of this process's anonymous private memory were ever populated, from
// /proc/self/pagemap (bit 63 present, bit 62 swapped; both readable without privileges). Not
// thread-safe: the caller's mirror lock guards it. Reopened in a forked child (the descriptor
// names the process that opened it).
class ResidentSpans {
 public:
  ResidentSpans() = default;
  ResidentSpans(const ResidentSpans&) = delete;
  ResidentSpans& operator=(const ResidentSpans&) = delete;
  ~ResidentSpans() {
    if (fd_ >= 0) close(fd_);
  }

  // Calls span(offset, length) for each maximal run of pages of [base, base + size) that is
  // populated now or was at an earlier call (seen: one bit per page, kept by the caller, sized
  // here), clipped to the range. False when the pagemap cannot be read: the caller then compares
  // the whole range (spans already reported were correct ones).
  template <class F>
  bool ForEach(uint64_t base, uint64_t size, std::vector<uint64_t>* seen, F&& span) {
    if (size == 0) return true;
    if (!Open()) return false;
    const uint64_t first = base / page_, last = (base + size - 1) / page_;
    const uint64_t pages = last - first + 1;
    if (seen->size() < (pages + 63) / 64) seen->resize((pages + 63) / 64, 0);
    uint64_t entries[512];
    uint64_t run = 0;
    bool open = false;
    auto emit = [&](uint64_t end_page) {  // pages [run, end_page) relative to `first`
      const uint64_t from = std::max(base, (first + run) * page_);
      const uint64_t to = std::min(base + size, (first + end_page) * page_);
      span(from - base, to - from);
      open = false;
    };
    for (uint64_t at = 0; at < pages; at += 512) {
      const uint64_t n = std::min<uint64_t>(512, pages - at);
      const ssize_t want = static_cast<ssize_t>(n * sizeof(uint64_t));
      if (pread(fd_, entries, want, static_cast<off_t>((first + at) * sizeof(uint64_t))) != want) {
        return false;
      }
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t pg = at + i;
        uint64_t& word = (*seen)[pg / 64];
        const uint64_t bit = 1ull << (pg % 64);
        if ((entries[i] >> 62) != 0) word |= bit;
        if ((word & bit) != 0) {
          if (!open) {
            run = pg;
            open = true;
          }
        } else if (open) {
          emit(pg);
        }
      }
    }
    if (open) emit(pages);
    return true;
  }

 private:
  bool Open() {
    if (fd_ >= 0 && pid_ == getpid()) return true;
    if (fd_ >= 0) close(fd_);
    fd_ = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    pid_ = getpid();
    page_ = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    return fd_ >= 0;
  }
  int fd_ = -1;
  pid_t pid_ = 0;
  uint64_t page_ = 4096;
};

// Collects runs into kOpMirrorData / kEvtMirrorData messages of at most kMaxMirrorRuns runs and
// `bulk_limit` bytes each, handing each full message to send(payload, payload_len, bulk,
// bulk_len). The bytes are copied when added (a snapshot: the memory may change while the message
// is sent) and the same snapshot is written to the twin, so the twin holds exactly what the other
// side will have.
class MirrorRunPacker {
 public:
  using SendFn = bool (*)(void* ctx, const uint8_t* payload, uint32_t payload_len,
                          const uint8_t* bulk, uint64_t bulk_len);
  MirrorRunPacker(uint64_t bulk_limit, SendFn send, void* ctx)
      : limit_(bulk_limit == 0 ? 1 : bulk_limit), send_(send), ctx_(ctx) {}

  // The run of `len` bytes at address `addr`, whose current bytes are src; twin receives them.
  // False when a send failed (later adds are dropped).
  bool Add(uint64_t addr, const uint8_t* src, uint8_t* twin, uint64_t len) {
    if (len == 0) return ok_;
    while (len > 0 && ok_) {
      if (runs_.size() == kMaxMirrorRuns || bulk_.size() == limit_) Flush();
      const uint64_t take = std::min<uint64_t>(len, limit_ - bulk_.size());
      const size_t at = bulk_.size();
      bulk_.resize(at + take);
      memcpy(bulk_.data() + at, src, take);
      memcpy(twin, bulk_.data() + at, take);
      runs_.push_back({addr, take});
      addr += take;
      src += take;
      twin += take;
      len -= take;
    }
    return ok_;
  }
  // The bytes of [addr, addr + len) that differ from the twin, as one masked run (bitmap and
  // those bytes) from a snapshot of src; twin receives the snapshot. Falls back to exact runs when
  // the span does not fit a message of this packer.
  bool AddMasked(uint64_t addr, const uint8_t* src, uint8_t* twin, uint64_t len) {
    if (len == 0 || len > kMaxMaskedSpan || !ok_) return ok_;
    snap_.assign(src, src + len);
    const uint64_t mask_bytes = (len + 7) / 8;
    mask_.assign(mask_bytes, 0);
    uint64_t changed = 0;
    for (uint64_t i = 0; i < len; ++i) {
      if (snap_[i] != twin[i]) {
        mask_[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
        ++changed;
      }
    }
    if (changed == 0) return ok_;
    const uint64_t need = mask_bytes + changed;
    if (need > limit_) {
      ForEachChangedRun(snap_.data(), twin, len, [&](uint64_t off, uint64_t n) {
        Add(addr + off, snap_.data() + off, twin + off, n);
      });
      return ok_;
    }
    if (runs_.size() == kMaxMirrorRuns || bulk_.size() + need > limit_) Flush();
    if (!ok_) return ok_;
    bulk_.insert(bulk_.end(), mask_.begin(), mask_.end());
    for (uint64_t i = 0; i < len; ++i) {
      if (mask_[i / 8] & (1u << (i % 8))) bulk_.push_back(snap_[i]);
    }
    memcpy(twin, snap_.data(), len);
    runs_.push_back({addr, len | kMaskedRun});
    return ok_;
  }
  // Adds every run where the mirror at `addr` (size bytes, in this process at that address)
  // differs from its twin: runs separated by fewer than kMaskGap equal bytes go as one masked run
  // where that is smaller than sending them one by one.
  void AddChanges(uint64_t addr, uint64_t size, uint8_t* twin) {
    const auto* cur = reinterpret_cast<const uint8_t*>(addr);
    uint64_t start = 0, end = 0, runs = 0;  // the pending group: [start, end), runs runs
    auto flush_group = [&]() {
      if (runs == 0) return;
      const uint64_t len = end - start;
      if (runs > 1 && (runs - 1) * 16 > (len + 7) / 8) {
        AddMasked(addr + start, cur + start, twin + start, len);
      } else {
        // Exact runs, found again (the memory may have changed since).
        ForEachChangedRun(cur + start, twin + start, len, [&](uint64_t off, uint64_t n) {
          Add(addr + start + off, cur + start + off, twin + start + off, n);
        });
      }
      runs = 0;
    };
    ForEachChangedRun(cur, twin, size, [&](uint64_t off, uint64_t n) {
      if (runs > 0 && off - end < kMaskGap && off + n - start <= kMaxMaskedSpan) {
        end = off + n;
        ++runs;
        return;
      }
      flush_group();
      start = off;
      end = off + n;
      runs = 1;
    });
    flush_group();
  }
  // Sends what is collected. False when a send failed.
  bool Flush() {
    if (runs_.empty() || !ok_) return ok_;
    payload_.resize(4 + 16 * runs_.size());
    transport::Writer w(payload_.data(), payload_.size());
    w.U32(static_cast<uint32_t>(runs_.size()));
    for (const Run& r : runs_) {
      w.U64(r.addr);
      w.U64(r.len);
    }
    ok_ = send_(ctx_, w.data(), static_cast<uint32_t>(w.size()), bulk_.data(), bulk_.size());
    runs_.clear();
    bulk_.clear();
    return ok_;
  }

 private:
  struct Run {
    uint64_t addr, len;
  };
  uint64_t limit_;
  SendFn send_;
  void* ctx_;
  bool ok_ = true;
  std::vector<Run> runs_;
  std::vector<uint8_t> bulk_;
  std::vector<uint8_t> payload_;
  std::vector<uint8_t> snap_, mask_;
};

// Decodes a message's runs: false unless 1 <= n <= kMaxMirrorRuns, every length is non-zero, the
// payload has nothing else and the runs' bytes add up to bulk_len. Each run goes to out with where
// its bytes start in the bulk. Exact runs only: a masked run (mirror data) is refused here.
struct MirrorRun {
  uint64_t addr = 0, len = 0;
  bool masked = false;    // len bytes of span; the bulk holds its bitmap, then the bytes set in it
  uint64_t bulk_off = 0;  // where its bytes (or bitmap) start in the bulk
};
inline bool DecodeMirrorRuns(const uint8_t* payload, uint32_t payload_len, uint64_t bulk_len,
                             std::vector<MirrorRun>* out) {
  transport::Reader rd(payload, payload_len);
  uint32_t n = 0;
  if (!rd.U32(&n) || n == 0 || n > kMaxMirrorRuns) return false;
  out->resize(n);
  uint64_t total = 0;
  for (MirrorRun& r : *out) {
    if (!rd.U64(&r.addr) || !rd.U64(&r.len) || r.len == 0 || r.len > kMaxMirrorBytes ||
        r.addr + r.len < r.addr) {
      return false;
    }
    r.masked = false;
    r.bulk_off = total;
    total += r.len;
  }
  return rd.Finish() && total == bulk_len;
}

// As DecodeMirrorRuns, also taking masked runs (kOpMirrorData, kEvtMirrorData): a length with
// kMaskedRun set names a span of at most kMaxMaskedSpan bytes whose bulk is a bitmap of
// ceil(span / 8) bytes (no bit set past the span, at least one set) followed by one byte per set
// bit.
inline bool DecodeMirrorData(const uint8_t* payload, uint32_t payload_len, const uint8_t* bulk,
                             uint64_t bulk_len, std::vector<MirrorRun>* out) {
  transport::Reader rd(payload, payload_len);
  uint32_t n = 0;
  if (!rd.U32(&n) || n == 0 || n > kMaxMirrorRuns || (bulk == nullptr && bulk_len != 0)) return false;
  out->resize(n);
  uint64_t total = 0;
  for (MirrorRun& r : *out) {
    uint64_t len = 0;
    if (!rd.U64(&r.addr) || !rd.U64(&len)) return false;
    r.masked = (len & kMaskedRun) != 0;
    r.len = len & ~kMaskedRun;
    r.bulk_off = total;
    if (r.len == 0 || r.addr + r.len < r.addr) return false;
    if (!r.masked) {
      if (r.len > kMaxMirrorBytes || r.len > bulk_len - total) return false;
      total += r.len;
      continue;
    }
    const uint64_t mask_bytes = (r.len + 7) / 8;
    if (r.len > kMaxMaskedSpan || mask_bytes > bulk_len - total) return false;
    const uint8_t* mask = bulk + total;
    uint64_t set = 0;
    for (uint64_t i = 0; i < mask_bytes; ++i) set += static_cast<uint64_t>(__builtin_popcount(mask[i]));
    const unsigned tail = static_cast<unsigned>(r.len % 8);
    if (set == 0 || (tail != 0 && (mask[mask_bytes - 1] >> tail) != 0)) return false;
    if (set > bulk_len - total - mask_bytes) return false;
    total += mask_bytes + set;
  }
  return rd.Finish() && total == bulk_len;
}

// Writes decoded runs to their addresses and to the twins, all or none: twin_of(addr, len) gives
// where the run's bytes go in its mirror's twin, or nullptr when the run is not wholly inside one
// mirror of this connection (then nothing is written). A masked run writes the bytes its bitmap
// names only.
template <class TwinOf>
bool ApplyMirrorRuns(const std::vector<MirrorRun>& runs, const uint8_t* bulk, TwinOf twin_of) {
  if (bulk == nullptr) return false;
  for (const MirrorRun& r : runs) {
    if (twin_of(r.addr, r.len) == nullptr) return false;
  }
  for (const MirrorRun& r : runs) {
    auto* dst = reinterpret_cast<uint8_t*>(r.addr);
    uint8_t* twin = twin_of(r.addr, r.len);
    if (!r.masked) {
      memcpy(dst, bulk + r.bulk_off, r.len);
      memcpy(twin, bulk + r.bulk_off, r.len);
      continue;
    }
    const uint8_t* mask = bulk + r.bulk_off;
    const uint8_t* data = mask + (r.len + 7) / 8;
    for (uint64_t i = 0; i < r.len; ++i) {
      if (mask[i / 8] & (1u << (i % 8))) {
        dst[i] = *data;
        twin[i] = *data;
        ++data;
      }
    }
  }
  return true;
}

}  // namespace tf::remote
