// The byte runs mirrored memory sends (src/client/mirror_runs.h): exact at byte granularity,
// packed into messages within their limits, and decoded with every malformation refused.
#include "client/mirror_runs.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <utility>
#include <vector>

namespace {

using tf::remote::DecodeMirrorRuns;
using tf::remote::ForEachChangedRun;
using tf::remote::MirrorRun;
using tf::remote::MirrorRunPacker;
using tf::remote::ResidentSpans;

std::vector<std::pair<uint64_t, uint64_t>> Runs(const std::vector<uint8_t>& cur,
                                                const std::vector<uint8_t>& twin) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  ForEachChangedRun(cur.data(), twin.data(), cur.size(), [&](uint64_t off, uint64_t n) {
    out.emplace_back(off, n);
  });
  return out;
}

TEST(MirrorRuns, OnlyTheBytesThatChangedAreSent) {
  std::vector<uint8_t> twin(10000, 0), cur(10000, 0);
  EXPECT_TRUE(Runs(cur, twin).empty());
  cur[3] = 1;                  // one byte inside a word
  cur[7] = cur[8] = 2;         // across a word boundary
  cur[20] = 3;                 // bytes 21, 22 equal: two runs, not one
  cur[23] = 4;
  for (int i = 5000; i < 5100; ++i) cur[i] = 9;  // a long run past 64-byte blocks
  cur[9999] = 5;               // the tail after the last whole word
  using R = std::vector<std::pair<uint64_t, uint64_t>>;
  EXPECT_EQ(Runs(cur, twin), (R{{3, 1}, {7, 2}, {20, 1}, {23, 1}, {5000, 100}, {9999, 1}}));
  std::vector<uint8_t> odd(13, 0), odd_twin(13, 0);
  odd[12] = 1;
  odd[0] = 1;
  EXPECT_EQ(Runs(odd, odd_twin), (R{{0, 1}, {12, 1}}));
}

struct Sent {
  std::vector<std::vector<MirrorRun>> runs;
  std::vector<std::vector<uint8_t>> bulk;
};

bool Collect(void* ctx, const uint8_t* payload, uint32_t payload_len, const uint8_t* bulk,
             uint64_t bulk_len) {
  auto* s = static_cast<Sent*>(ctx);
  std::vector<MirrorRun> runs;
  if (!DecodeMirrorRuns(payload, payload_len, bulk_len, &runs)) return false;
  s->runs.push_back(runs);
  s->bulk.emplace_back(bulk, bulk + bulk_len);
  return true;
}

TEST(MirrorRuns, PackingSplitsAtTheBulkLimitAndUpdatesTheTwin) {
  std::vector<uint8_t> cur(100), twin(100, 0);
  for (int i = 0; i < 100; ++i) cur[i] = static_cast<uint8_t>(i + 1);
  Sent sent;
  MirrorRunPacker packer(64, &Collect, &sent);
  ASSERT_TRUE(packer.Add(0x1000, cur.data(), twin.data(), 100));
  ASSERT_TRUE(packer.Flush());
  ASSERT_EQ(sent.runs.size(), 2u);
  EXPECT_EQ(sent.runs[0][0].addr, 0x1000u);
  EXPECT_EQ(sent.runs[0][0].len, 64u);
  EXPECT_EQ(sent.runs[1][0].addr, 0x1040u);
  EXPECT_EQ(sent.runs[1][0].len, 36u);
  EXPECT_EQ(twin, cur);
  EXPECT_EQ(sent.bulk[1].front(), 65);
}

TEST(MirrorRuns, MalformedMessagesAreRefused) {
  uint8_t buf[64];
  std::vector<MirrorRun> runs;
  auto encode = [&](uint32_t n, std::vector<std::pair<uint64_t, uint64_t>> r) {
    tf::transport::Writer w(buf, sizeof(buf));
    w.U32(n);
    for (auto [a, l] : r) {
      w.U64(a);
      w.U64(l);
    }
    return static_cast<uint32_t>(w.size());
  };
  EXPECT_TRUE(DecodeMirrorRuns(buf, encode(1, {{0x1000, 4}}), 4, &runs));
  EXPECT_FALSE(DecodeMirrorRuns(buf, encode(1, {{0x1000, 4}}), 5, &runs));  // bulk mismatch
  EXPECT_FALSE(DecodeMirrorRuns(buf, encode(0, {}), 0, &runs));             // no runs
  EXPECT_FALSE(DecodeMirrorRuns(buf, encode(2, {{0x1000, 4}}), 4, &runs));  // truncated
  EXPECT_FALSE(DecodeMirrorRuns(buf, encode(1, {{0x1000, 0}}), 0, &runs));  // empty run
  EXPECT_FALSE(DecodeMirrorRuns(buf, encode(1, {{~0ull - 1, 4}}), 4, &runs));  // wraps
}

struct SentData {
  int messages = 0;
  uint64_t bytes = 0;  // payload and bulk
  std::vector<std::vector<uint8_t>> payloads, bulks;
};

bool CollectData(void* ctx, const uint8_t* payload, uint32_t payload_len, const uint8_t* bulk,
                 uint64_t bulk_len) {
  auto* s = static_cast<SentData*>(ctx);
  ++s->messages;
  s->bytes += payload_len + bulk_len;
  s->payloads.emplace_back(payload, payload + payload_len);
  s->bulks.emplace_back(bulk, bulk + bulk_len);
  return true;
}

// A kernel that adds to every int of an array changes a byte in four: those go as masked runs (a
// bitmap and the bytes), a fraction of one run per byte; the receiver gets exactly the changed
// bytes, and a byte it changed itself meanwhile (not changed here) keeps its value.
TEST(MirrorRuns, ScatteredChangesGoAsMaskedRunsThatWriteOnlyTheChangedBytes) {
  const size_t ints = 64 * 1024;  // 256 KiB
  std::vector<uint32_t> before(ints), after(ints);
  for (size_t i = 0; i < ints; ++i) {
    before[i] = static_cast<uint32_t>(i * 7);
    after[i] = before[i] + 25 + (i % 5 == 0 ? 256 : 0);  // low bytes; every fifth also the second
  }
  std::vector<uint8_t> twin(ints * 4);
  memcpy(twin.data(), before.data(), twin.size());
  SentData sent;
  MirrorRunPacker packer(8u << 20, &CollectData, &sent);
  const uint64_t addr = reinterpret_cast<uint64_t>(after.data());
  packer.AddChanges(addr, ints * 4, twin.data());
  ASSERT_TRUE(packer.Flush());
  EXPECT_EQ(memcmp(twin.data(), after.data(), twin.size()), 0) << "the twin holds what was sent";
  // One run per changed byte would be 16 bytes of header each (over 4 MiB here).
  EXPECT_LT(sent.bytes, ints * 4 / 2) << sent.messages << " messages";
  // The receiver: its memory as before, but it changed a byte this side did not (byte 2 of int 3).
  std::vector<uint32_t> theirs(before);
  reinterpret_cast<uint8_t*>(theirs.data())[3 * 4 + 2] = 0xee;
  std::vector<uint8_t> their_twin(ints * 4);
  memcpy(their_twin.data(), before.data(), their_twin.size());
  const uint64_t shift = reinterpret_cast<uint64_t>(theirs.data()) - addr;
  for (size_t m = 0; m < sent.payloads.size(); ++m) {
    std::vector<MirrorRun> runs;
    ASSERT_TRUE(tf::remote::DecodeMirrorData(sent.payloads[m].data(), static_cast<uint32_t>(sent.payloads[m].size()),
                                             sent.bulks[m].data(), sent.bulks[m].size(), &runs));
    EXPECT_FALSE(DecodeMirrorRuns(sent.payloads[m].data(), static_cast<uint32_t>(sent.payloads[m].size()),
                                  sent.bulks[m].size(), &runs))
        << "exact-only decoding (graph copy data) refuses masked runs";
    ASSERT_TRUE(tf::remote::DecodeMirrorData(sent.payloads[m].data(), static_cast<uint32_t>(sent.payloads[m].size()),
                                             sent.bulks[m].data(), sent.bulks[m].size(), &runs));
    for (MirrorRun& r : runs) r.addr += shift;  // the receiver's copy lives elsewhere in this test
    ASSERT_TRUE(tf::remote::ApplyMirrorRuns(runs, sent.bulks[m].data(), [&](uint64_t a, uint64_t) {
      return their_twin.data() + (a - reinterpret_cast<uint64_t>(theirs.data()));
    }));
  }
  std::vector<uint32_t> want(after);
  reinterpret_cast<uint8_t*>(want.data())[3 * 4 + 2] = 0xee;
  EXPECT_EQ(theirs, want);
}

TEST(MirrorRuns, MalformedMaskedRunsAreRefused) {
  uint8_t payload[64], bulk[64] = {};
  auto encode = [&](uint64_t len) {
    tf::transport::Writer w(payload, sizeof(payload));
    w.U32(1);
    w.U64(0x1000);
    w.U64(len | tf::remote::kMaskedRun);
    return static_cast<uint32_t>(w.size());
  };
  std::vector<MirrorRun> runs;
  bulk[0] = 0x05;  // span of 8: bytes 0 and 2 -> bulk = 1 mask byte + 2 data bytes
  EXPECT_TRUE(tf::remote::DecodeMirrorData(payload, encode(8), bulk, 3, &runs));
  EXPECT_FALSE(tf::remote::DecodeMirrorData(payload, encode(8), bulk, 4, &runs));   // bulk too long
  EXPECT_FALSE(tf::remote::DecodeMirrorData(payload, encode(8), bulk, 2, &runs));   // truncated
  bulk[0] = 0x81;  // bit 7 set for a span of 4
  EXPECT_FALSE(tf::remote::DecodeMirrorData(payload, encode(4), bulk, 3, &runs));   // bit past span
  bulk[0] = 0;
  EXPECT_FALSE(tf::remote::DecodeMirrorData(payload, encode(8), bulk, 1, &runs));   // no byte named
  EXPECT_FALSE(tf::remote::DecodeMirrorData(payload, encode(tf::remote::kMaxMaskedSpan + 8), bulk, 64, &runs));
  EXPECT_FALSE(tf::remote::DecodeMirrorData(payload, encode(0), bulk, 0, &runs));   // empty span
}

}  // namespace

namespace {

// Anonymous memory the program never touched is not compared; what it touched is, from then on
// (even after the pages went away again), and a range that starts or ends inside a page is
// clipped to itself.
TEST(MirrorRuns, OnlyPagesEverPopulatedAreCompared) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t pages = 700;  // more than one pagemap read of 512 entries
  auto* m = static_cast<uint8_t*>(
      mmap(nullptr, pages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(m, MAP_FAILED);
  const uint64_t base = reinterpret_cast<uint64_t>(m);
  ResidentSpans resident;
  std::vector<uint64_t> seen;
  using R = std::vector<std::pair<uint64_t, uint64_t>>;
  auto spans = [&](uint64_t from, uint64_t len) {
    R out;
    EXPECT_TRUE(resident.ForEach(base + from, len, &seen, [&](uint64_t off, uint64_t n) {
      out.emplace_back(off, n);
    }));
    return out;
  };
  EXPECT_EQ(spans(0, pages * page), R{});
  m[3 * page + 5] = 1;
  for (uint64_t p = 10; p < 13; ++p) m[p * page] = 1;
  m[600 * page] = 1;  // in the second read
  EXPECT_EQ(spans(0, pages * page),
            (R{{3 * page, page}, {10 * page, 3 * page}, {600 * page, page}}));
  // Gone from memory (reads as zero now), still compared: its twin may hold what it had.
  ASSERT_EQ(madvise(m + 3 * page, page, MADV_DONTNEED), 0);
  EXPECT_EQ(spans(0, pages * page),
            (R{{3 * page, page}, {10 * page, 3 * page}, {600 * page, page}}));
  munmap(m, pages * page);

  // A range that is not page aligned: spans relative to its start, within it.
  auto* u = static_cast<uint8_t*>(
      mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(u, MAP_FAILED);
  u[0] = 1;
  u[3 * page + 1] = 1;
  std::vector<uint64_t> seen2;
  R out;
  EXPECT_TRUE(resident.ForEach(reinterpret_cast<uint64_t>(u) + 100, 3 * page, &seen2,
                               [&](uint64_t off, uint64_t n) { out.emplace_back(off, n); }));
  EXPECT_EQ(out, (R{{0, page - 100}, {3 * page - 100, 100}}));
  munmap(u, 4 * page);
}

}  // namespace
