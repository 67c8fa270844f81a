// One behaviour suite, run against both transports: handshake refusals, ordering, request/reply,
// bulk integrity, timeouts, and a peer killed with SIGKILL turning into an error within 2 s.
#include "transport/transport.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "transport/shm_transport.h"
#include "transport/tcp_transport.h"

namespace tf::transport {
namespace {

constexpr const char* kToken = "tenant-token";

ClientHello Hello(const char* token = kToken) {
  ClientHello h;
  h.SetToken(token, strlen(token));
  h.SetHostId("test-host");
  h.client_pid = static_cast<uint32_t>(getpid());
  return h;
}

ServerPolicy Policy() {
  ServerPolicy p;
  p.token = reinterpret_cast<const uint8_t*>(kToken);
  p.token_length = strlen(kToken);
  return p;
}

std::string Describe(const TransportStatus& s) {
  return std::string(TransportErrcName(s.code())) + ": " + s.message();
}

class TransportTest : public ::testing::TestWithParam<const char*> {
 protected:
  bool is_shm() const { return strcmp(GetParam(), "shm") == 0; }

  void SetUp() override {
    if (is_shm()) {
      static std::atomic<int> counter{0};
      path_ = "/tmp/tf-transport-test-" + std::to_string(getpid()) + "-" +
              std::to_string(counter++) + ".sock";
      TransportStatus st = ListenShm(path_.c_str(), &listener_);
      ASSERT_TRUE(st.ok()) << Describe(st);
    } else {
      TransportStatus st = ListenTcp("127.0.0.1:0", &listener_);
      ASSERT_TRUE(st.ok()) << Describe(st);
    }
  }

  TransportStatus Connect(const ClientHello& hello, std::unique_ptr<Transport>* out) {
    return is_shm() ? ConnectShm(listener_->address(), hello, options_, out)
                    : ConnectTcp(listener_->address(), hello, options_, out);
  }

  // Connects a client (in a thread) to an accepted server transport.
  void MakePair(std::unique_ptr<Transport>* client, std::unique_ptr<Transport>* server) {
    TransportStatus cst;
    std::thread t([&] { cst = Connect(Hello(), client); });
    ClientHello peer;
    TransportStatus sst = listener_->Accept(Policy(), options_, 5000, server, &peer);
    t.join();
    ASSERT_TRUE(sst.ok()) << Describe(sst);
    ASSERT_TRUE(cst.ok()) << Describe(cst);
    EXPECT_EQ(std::string(peer.host_id, peer.host_id_length), "test-host");
    EXPECT_EQ((*client)->session().session_id, (*server)->session().session_id);
    EXPECT_STREQ((*client)->kind(), GetParam());
  }

  // Expects the client to be refused with `reason`, and the server to report the same.
  void ExpectRefused(const ClientHello& hello, RefusalReason reason) {
    std::unique_ptr<Transport> client, server;
    TransportStatus cst;
    std::thread t([&] { cst = Connect(hello, &client); });
    TransportStatus sst = listener_->Accept(Policy(), options_, 5000, &server, nullptr);
    t.join();
    EXPECT_EQ(sst.code(), TransportErrc::kRefused) << Describe(sst);
    EXPECT_EQ(cst.code(), TransportErrc::kRefused) << Describe(cst);
    EXPECT_EQ(cst.refusal_reason(), static_cast<uint16_t>(reason)) << Describe(cst);
    EXPECT_EQ(client, nullptr);
    EXPECT_EQ(server, nullptr);
  }

  TransportOptions options_;
  std::string path_;
  std::unique_ptr<Listener> listener_;
};

TEST_P(TransportTest, WrongTokenIsRefusedWithReason) {
  ExpectRefused(Hello("wrong"), RefusalReason::kBadToken);
}

TEST_P(TransportTest, VersionMismatchIsRefusedWithReason) {
  ClientHello h = Hello();
  h.min_version = h.max_version = kProtocolVersionMax + 1;
  ExpectRefused(h, RefusalReason::kVersionMismatch);
}

TEST_P(TransportTest, UnknownRequiredFeatureIsRefusedWithReason) {
  ClientHello h = Hello();
  h.features_supported |= 1ull << 62;
  h.features_required = 1ull << 62;
  ExpectRefused(h, RefusalReason::kUnknownRequiredFeature);
}

TEST_P(TransportTest, ListenerSurvivesARefusal) {
  ExpectRefused(Hello("wrong"), RefusalReason::kBadToken);
  std::unique_ptr<Transport> c, s;
  MakePair(&c, &s);
}

TEST_P(TransportTest, OrderedFireAndForgetThenRequestReply) {
  std::unique_ptr<Transport> client, server;
  MakePair(&client, &server);
  constexpr uint64_t kFrames = 100000;
  std::atomic<uint64_t> server_seen{0};
  std::string server_error;
  std::thread srv([&] {
    for (;;) {
      InFrame f;
      TransportStatus st = server->Receive(&f, 10000);
      if (!st.ok()) {
        server_error = Describe(st);
        return;
      }
      uint64_t n = server_seen.load();
      if (f.header.flags & kFlagReplyExpected) {
        uint8_t reply[8];
        Writer w(reply, sizeof(reply));
        w.U64(n);
        OutFrame r;
        r.opcode = static_cast<uint16_t>(Opcode::kCallReply);
        r.sequence = f.header.sequence;
        r.payload = reply;
        r.payload_length = 8;
        st = server->Send(r);
        if (!st.ok()) server_error = Describe(st);
        return;
      }
      uint64_t v = 0;
      Reader rd(f.payload, f.payload_length);
      if (f.header.sequence != n || !rd.U64(&v) || v != n * 3 ||
          f.header.opcode != DriverCallOpcode(static_cast<uint16_t>(n % 100))) {
        server_error = "out of order at " + std::to_string(n);
        return;
      }
      server_seen.store(n + 1);
    }
  });
  for (uint64_t i = 0; i < kFrames; ++i) {
    uint8_t payload[24] = {};
    Writer w(payload, sizeof(payload));
    w.U64(i * 3);
    OutFrame f;
    f.opcode = DriverCallOpcode(static_cast<uint16_t>(i % 100));
    f.sequence = i;
    f.payload = payload;
    f.payload_length = 8 + static_cast<uint32_t>(i % 16);
    TransportStatus st = client->Send(f);
    ASSERT_TRUE(st.ok()) << i << " " << Describe(st);
  }
  OutFrame sync;
  sync.opcode = DriverCallOpcode(500);
  sync.flags = kFlagReplyExpected;
  sync.sequence = kFrames;
  ASSERT_TRUE(client->Send(sync).ok());
  InFrame reply;
  TransportStatus st = client->Receive(&reply, 20000);
  srv.join();
  ASSERT_TRUE(st.ok()) << Describe(st) << " server: " << server_error;
  EXPECT_EQ(server_error, "");
  EXPECT_EQ(reply.header.opcode, static_cast<uint16_t>(Opcode::kCallReply));
  EXPECT_EQ(reply.header.sequence, kFrames);
  uint64_t seen = 0;
  Reader rd(reply.payload, reply.payload_length);
  ASSERT_TRUE(rd.U64(&seen));
  EXPECT_EQ(seen, kFrames);  // the sync call observed every async call before it
}

uint64_t PatternWord(uint64_t index) {
  uint64_t x = index * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  return x * 0xBF58476D1CE4E5B9ull;
}

void FillPattern(uint64_t byte_offset, uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    uint64_t w = PatternWord((byte_offset + i) / 8);
    memcpy(p + i, &w, 8);
  }
}

TEST_P(TransportTest, BulkTransferOfOneGibInSlicesKeepsContent) {
  std::unique_ptr<Transport> client, server;
  MakePair(&client, &server);
  constexpr uint64_t kTotal = 1ull << 30;
  uint64_t slice = 8ull << 20;
  if (slice > client->max_bulk_bytes()) slice = client->max_bulk_bytes();
  ASSERT_EQ(kTotal % slice, 0u);
  std::string error;
  uint64_t received = 0;
  std::thread srv([&] {
    std::vector<uint8_t> expect(slice);
    while (received < kTotal) {
      InFrame f;
      TransportStatus st = server->Receive(&f, 10000);
      if (!st.ok()) {
        error = Describe(st);
        return;
      }
      if (f.bulk_length != slice || f.header.sequence != received / slice) {
        error = "bad slice at " + std::to_string(received);
        return;
      }
      FillPattern(received, expect.data(), slice);
      if (memcmp(f.bulk, expect.data(), slice) != 0) {
        error = "content mismatch in slice at " + std::to_string(received);
        return;
      }
      received += f.bulk_length;
    }
    OutFrame done;
    done.opcode = static_cast<uint16_t>(Opcode::kCallReply);
    server->Send(done);
  });
  std::vector<uint8_t> buf(slice);
  for (uint64_t off = 0; off < kTotal; off += slice) {
    FillPattern(off, buf.data(), slice);
    OutFrame f;
    f.opcode = DriverCallOpcode(3);
    f.sequence = off / slice;
    f.bulk = buf.data();
    f.bulk_length = slice;
    TransportStatus st = client->Send(f);
    ASSERT_TRUE(st.ok()) << Describe(st);
  }
  InFrame done;
  TransportStatus st = client->Receive(&done, 30000);
  srv.join();
  ASSERT_TRUE(st.ok()) << Describe(st) << " server: " << error;
  EXPECT_EQ(error, "");
  EXPECT_EQ(received, kTotal);
}

TEST_P(TransportTest, BulkFlowsFromWorkerToClientToo) {
  std::unique_ptr<Transport> client, server;
  MakePair(&client, &server);
  const uint64_t slice = client->max_bulk_bytes() < (1u << 20) ? client->max_bulk_bytes() : 1u << 20;
  std::vector<uint8_t> buf(slice);
  std::thread srv([&] {
    for (uint64_t i = 0; i < 64; ++i) {
      FillPattern(i * slice, buf.data(), slice);
      OutFrame f;
      f.opcode = static_cast<uint16_t>(Opcode::kCallReply);
      f.sequence = i;
      f.bulk = buf.data();
      f.bulk_length = slice;
      if (!server->Send(f).ok()) return;
    }
  });
  std::vector<uint8_t> expect(slice);
  for (uint64_t i = 0; i < 64; ++i) {
    InFrame f;
    TransportStatus st = client->Receive(&f, 10000);
    ASSERT_TRUE(st.ok()) << Describe(st);
    ASSERT_EQ(f.bulk_length, slice);
    FillPattern(i * slice, expect.data(), slice);
    ASSERT_EQ(0, memcmp(f.bulk, expect.data(), slice)) << i;
  }
  srv.join();
}

// Optional capabilities: shm shares host memory and has zero-copy bulk; TCP says it has neither.
TEST_P(TransportTest, SharedHostMemoryTravelsInOrderWithItsRegionId) {
  std::unique_ptr<Transport> client, server;
  MakePair(&client, &server);
  int fd = memfd_create("tf-transport-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  if (!is_shm()) {
    EXPECT_FALSE(client->CanShareHostMemory());
    EXPECT_EQ(client->OfferHostMemory(1, fd).code(), TransportErrc::kInvalidArgument);
    close(fd);
    return;
  }
  ASSERT_TRUE(client->CanShareHostMemory());
  auto* mine = static_cast<uint8_t*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(mine, MAP_FAILED);
  ASSERT_TRUE(client->OfferHostMemory(7, fd).ok());
  ASSERT_TRUE(client->OfferHostMemory(8, fd).ok());
  close(fd);
  int got = -1;
  EXPECT_EQ(server->TakeHostMemory(8, 100, &got).code(), TransportErrc::kProtocol)
      << "the next offer is region 7: refused and dropped";
  EXPECT_EQ(got, -1);
  TransportStatus st = server->TakeHostMemory(8, 1000, &got);
  ASSERT_TRUE(st.ok()) << Describe(st);
  auto* theirs = static_cast<uint8_t*>(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, got, 0));
  ASSERT_NE(theirs, MAP_FAILED);
  mine[100] = 42;
  EXPECT_EQ(theirs[100], 42) << "both ends map the same memory";
  EXPECT_EQ(server->TakeHostMemory(9, 0, &got).code(), TransportErrc::kTimeout);
  // The connection still works after all that.
  OutFrame f;
  f.opcode = 0x0100;
  ASSERT_TRUE(client->Send(f).ok());
  InFrame in;
  ASSERT_TRUE(server->Receive(&in, 5000).ok());
  munmap(mine, 4096);
  munmap(theirs, 4096);
  close(got);
}

TEST_P(TransportTest, HeldSlicesStayValidAndReservedSlicesGoOutInOrder) {
  options_.shm_arena_bytes = 8u << 20;  // 2 MiB slices: holding two fills a half
  options_.tcp_arena_bytes = 8u << 20;
  std::unique_ptr<Transport> client, server;
  MakePair(&client, &server);
  const uint64_t slice = client->max_bulk_bytes();
  ASSERT_EQ(slice, 2u << 20);
  void* arena = nullptr;
  uint64_t arena_len = 0;
  ASSERT_TRUE(server->BulkMemory(&arena, &arena_len)) << "memory a worker registers once";
  auto in_arena = [&](const uint8_t* p) {
    return p >= static_cast<uint8_t*>(arena) && p < static_cast<uint8_t*>(arena) + arena_len;
  };
  std::vector<uint8_t> buf(slice);
  // Client -> server: the server holds two slices (the whole half) across later Receives and
  // releases them out of order; the client's next Send waits until both are back.
  std::vector<uint64_t> tokens;
  std::vector<const uint8_t*> views;
  for (uint64_t i = 0; i < 2; ++i) {
    FillPattern(i * slice, buf.data(), slice);
    OutFrame f;
    f.opcode = 0x0100;
    f.sequence = i;
    f.bulk = buf.data();
    f.bulk_length = slice;
    ASSERT_TRUE(client->Send(f).ok());
    InFrame in;
    ASSERT_TRUE(server->Receive(&in, 5000).ok());
    uint64_t token = 0;
    ASSERT_TRUE(server->HoldBulk(&token));
    tokens.push_back(token);
    views.push_back(in.bulk);
  }
  std::vector<uint8_t> expect(slice);
  InFrame none;
  EXPECT_EQ(server->Receive(&none, 0).code(), TransportErrc::kTimeout);
  for (uint64_t i = 0; i < 2; ++i) {
    FillPattern(i * slice, expect.data(), slice);
    EXPECT_EQ(0, memcmp(views[i], expect.data(), slice)) << "held slice " << i;
  }
  for (uint64_t i = 0; i < 2; ++i) EXPECT_TRUE(in_arena(views[i])) << "slice " << i;
  if (!is_shm()) {
    // TCP: the sender never waits for the receiver's holds. With the arena's half held, the next
    // frame is read into other memory (intact, but it cannot be held); once the slices are back,
    // bulk lands in the arena again.
    FillPattern(77, buf.data(), slice);
    OutFrame f;
    f.opcode = 0x0100;
    f.bulk = buf.data();
    f.bulk_length = slice;
    ASSERT_TRUE(client->Send(f).ok());
    InFrame in;
    ASSERT_TRUE(server->Receive(&in, 5000).ok());
    EXPECT_FALSE(in_arena(in.bulk));
    FillPattern(77, expect.data(), slice);
    EXPECT_EQ(0, memcmp(in.bulk, expect.data(), slice));
    uint64_t token = 0;
    EXPECT_FALSE(server->HoldBulk(&token));
    server->ReleaseBulk(tokens[1]);
    server->ReleaseBulk(tokens[0]);
    ASSERT_TRUE(client->Send(f).ok());
    ASSERT_TRUE(server->Receive(&in, 5000).ok());
    EXPECT_TRUE(in_arena(in.bulk));
    EXPECT_EQ(0, memcmp(in.bulk, expect.data(), slice));
  }
  std::thread release([&] {
    if (!is_shm()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    server->ReleaseBulk(tokens[1]);
    server->ReleaseBulk(tokens[0]);  // only now does the space come back
  });
  for (uint64_t i = 2; i < 8; ++i) {
    OutFrame f;
    f.opcode = 0x0100;
    f.sequence = i;
    f.bulk = buf.data();
    f.bulk_length = slice;
    TransportStatus st = client->Send(f);
    ASSERT_TRUE(st.ok()) << Describe(st);
    InFrame in;
    ASSERT_TRUE(server->Receive(&in, 5000).ok());
  }
  release.join();
  // Server -> client: reserved slices filled in place, sent in reservation order.
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_TRUE(server->ReserveBulk(1000, 1000, &a).ok());
  ASSERT_TRUE(server->ReserveBulk(2000, 1000, &b).ok());
  memset(a, 0xa1, 1000);
  memset(b, 0xb2, 2000);
  OutFrame fb;
  fb.opcode = static_cast<uint16_t>(Opcode::kCallReply);
  fb.bulk = b;
  fb.bulk_length = 2000;
  fb.bulk_reserved = true;
  EXPECT_EQ(server->Send(fb).code(), TransportErrc::kInvalidArgument) << "b before a";
  OutFrame plain = fb;
  plain.bulk = buf.data();
  plain.bulk_reserved = false;
  EXPECT_EQ(server->Send(plain).code(), TransportErrc::kInvalidArgument) << "plain before a";
  OutFrame fa = fb;
  fa.bulk = a;
  fa.bulk_length = 1000;
  ASSERT_TRUE(server->Send(fa).ok());
  ASSERT_TRUE(server->Send(fb).ok());
  InFrame in;
  ASSERT_TRUE(client->Receive(&in, 5000).ok());
  ASSERT_EQ(in.bulk_length, 1000u);
  EXPECT_EQ(in.bulk[999], 0xa1);
  ASSERT_TRUE(client->Receive(&in, 5000).ok());
  ASSERT_EQ(in.bulk_length, 2000u);
  EXPECT_EQ(in.bulk[0], 0xb2);
}

// TCP reads a frame's bulk straight into the memory the receiver's placer names (a copy's
// destination), and into its own memory where the placer declines; shm has no placer (its bulk
// already lies in the shared arena).
TEST_P(TransportTest, BulkLandsWhereThePlacerSays) {
  std::unique_ptr<Transport> client, server;
  MakePair(&client, &server);
  struct Target {
    std::vector<uint8_t> memory = std::vector<uint8_t>(1 << 20);
    int asked = 0;
  } target;
  auto place = [](void* ctx, const FrameHeader& h, const uint8_t* payload, uint32_t payload_length,
                  uint64_t bulk_length) -> uint8_t* {
    auto* t = static_cast<Target*>(ctx);
    ++t->asked;
    // Frames of opcode 0x0101 go to the offset their payload names; others are declined.
    if (h.opcode != 0x0101 || payload_length != 4) return nullptr;
    uint32_t off = 0;
    memcpy(&off, payload, 4);
    return off + bulk_length <= t->memory.size() ? t->memory.data() + off : nullptr;
  };
  if (!server->SetBulkPlacer(place, &target)) {
    EXPECT_TRUE(is_shm());
    return;
  }
  std::vector<uint8_t> bulk(300000);
  FillPattern(5, bulk.data(), bulk.size());
  const uint32_t offsets[] = {12345, 0, 700001};  // the last one does not fit: declined
  for (uint32_t off : offsets) {
    OutFrame f;
    f.opcode = 0x0101;
    f.payload = &off;
    f.payload_length = 4;
    f.bulk = bulk.data();
    f.bulk_length = bulk.size();
    ASSERT_TRUE(client->Send(f).ok());
    InFrame in;
    TransportStatus st = server->Receive(&in, 5000);
    ASSERT_TRUE(st.ok()) << Describe(st);
    ASSERT_EQ(in.bulk_length, bulk.size());
    EXPECT_EQ(0, memcmp(in.bulk, bulk.data(), bulk.size())) << "offset " << off;
    const bool placed = off + bulk.size() <= target.memory.size();
    EXPECT_EQ(in.bulk == target.memory.data() + off, placed) << "offset " << off;
  }
  EXPECT_EQ(target.asked, 3);
  ASSERT_TRUE(server->SetBulkPlacer(nullptr, nullptr));
  OutFrame f;
  f.opcode = 0x0101;
  uint32_t zero = 0;
  f.payload = &zero;
  f.payload_length = 4;
  f.bulk = bulk.data();
  f.bulk_length = 100;
  ASSERT_TRUE(client->Send(f).ok());
  InFrame in;
  ASSERT_TRUE(server->Receive(&in, 5000).ok());
  EXPECT_NE(in.bulk, target.memory.data()) << "no placer: the transport's own memory";
  EXPECT_EQ(target.asked, 3);
}

TEST_P(TransportTest, ReceiveTimesOutAndStaysUsable) {
  std::unique_ptr<Transport> client, server;
  MakePair(&client, &server);
  InFrame f;
  auto t0 = std::chrono::steady_clock::now();
  TransportStatus st = server->Receive(&f, 50);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(st.code(), TransportErrc::kTimeout) << Describe(st);
  EXPECT_GE(ms, 45);
  EXPECT_LT(ms, 1000);
  OutFrame ping;
  ping.opcode = static_cast<uint16_t>(Opcode::kPing);
  ping.sequence = 5;
  ASSERT_TRUE(client->Send(ping).ok());
  st = server->Receive(&f, 5000);
  ASSERT_TRUE(st.ok()) << Describe(st);
  EXPECT_EQ(f.header.sequence, 5u);
}

TEST_P(TransportTest, OversizeFramesAreRefusedLocally) {
  std::unique_ptr<Transport> client, server;
  MakePair(&client, &server);
  std::vector<uint8_t> big(client->max_payload_bytes() + 1);
  OutFrame f;
  f.payload = big.data();
  f.payload_length = static_cast<uint32_t>(big.size());
  EXPECT_EQ(client->Send(f).code(), TransportErrc::kInvalidArgument);
  f.payload_length = 0;
  f.bulk = big.data();
  f.bulk_length = client->max_bulk_bytes() + 1;
  EXPECT_EQ(client->Send(f).code(), TransportErrc::kInvalidArgument);
  f.bulk_length = 0;
  f.flags = kFlagBulkFollows;  // the transport owns this flag
  EXPECT_EQ(client->Send(f).code(), TransportErrc::kInvalidArgument);
  // Still usable.
  f.flags = 0;
  EXPECT_TRUE(client->Send(f).ok());
  InFrame in;
  EXPECT_TRUE(server->Receive(&in, 5000).ok());
}

TEST_P(TransportTest, OrderlyCloseDeliversQueuedFramesThenPeerClosed) {
  std::unique_ptr<Transport> client, server;
  MakePair(&client, &server);
  for (uint64_t i = 0; i < 10; ++i) {
    OutFrame f;
    f.opcode = DriverCallOpcode(1);
    f.sequence = i;
    ASSERT_TRUE(client->Send(f).ok());
  }
  client->Close();
  EXPECT_EQ(client->Send(OutFrame{}).code(), TransportErrc::kClosed);
  for (uint64_t i = 0; i < 10; ++i) {
    InFrame f;
    TransportStatus st = server->Receive(&f, 5000);
    ASSERT_TRUE(st.ok()) << i << " " << Describe(st);
    EXPECT_EQ(f.header.sequence, i);
  }
  InFrame f;
  TransportStatus st = server->Receive(&f, 5000);
  EXPECT_EQ(st.code(), TransportErrc::kPeerClosed) << Describe(st);
}

TEST_P(TransportTest, CloseWakesABlockedReceive) {
  std::unique_ptr<Transport> client, server;
  MakePair(&client, &server);
  TransportStatus st;
  std::thread t([&] {
    InFrame f;
    st = server->Receive(&f, 10000);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto t0 = std::chrono::steady_clock::now();
  server->Close();
  t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  EXPECT_EQ(st.code(), TransportErrc::kClosed) << Describe(st);
}

// The peer is a forked child that completes the handshake and then is killed with SIGKILL.
// Waiting for a reply, and sending into a peer that no longer reads, must both fail within 2 s.
void ExpectErrorWithinTwoSeconds(Transport* t, pid_t child, bool keep_sending) {
  kill(child, SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  TransportStatus st;
  if (keep_sending) {
    std::vector<uint8_t> payload(4096);
    OutFrame f;
    f.opcode = DriverCallOpcode(9);
    f.payload = payload.data();
    f.payload_length = static_cast<uint32_t>(payload.size());
    while (st.ok() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
      st = t->Send(f);
    }
  } else {
    InFrame f;
    st = t->Receive(&f, 10000);
  }
  auto elapsed = std::chrono::steady_clock::now() - t0;
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(st.code() == TransportErrc::kPeerDead || st.code() == TransportErrc::kPeerClosed)
      << Describe(st);
  EXPECT_LT(elapsed, std::chrono::seconds(2)) << Describe(st);
  waitpid(child, nullptr, 0);
}

TEST_P(TransportTest, KilledClientBecomesAnErrorOnTheWorker) {
  for (bool keep_sending : {false, true}) {
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      std::unique_ptr<Transport> c;
      if (!Connect(Hello(), &c).ok()) _exit(1);
      for (;;) pause();
    }
    std::unique_ptr<Transport> server;
    TransportStatus st = listener_->Accept(Policy(), options_, 5000, &server, nullptr);
    ASSERT_TRUE(st.ok()) << Describe(st);
    ExpectErrorWithinTwoSeconds(server.get(), child, keep_sending);
  }
}

TEST_P(TransportTest, KilledWorkerBecomesAnErrorOnTheClient) {
  for (bool keep_sending : {false, true}) {
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      std::unique_ptr<Transport> s;
      if (!listener_->Accept(Policy(), options_, 5000, &s, nullptr).ok()) _exit(1);
      for (;;) pause();
    }
    std::unique_ptr<Transport> client;
    TransportStatus st = Connect(Hello(), &client);
    ASSERT_TRUE(st.ok()) << Describe(st);
    ExpectErrorWithinTwoSeconds(client.get(), child, keep_sending);
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportTest, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return std::string(info.param); });

TEST(TcpAddressTest, ParsesHostPortForms) {
  HostPort hp;
  ASSERT_TRUE(ParseHostPort("10.0.0.5:7000", &hp).ok());
  EXPECT_STREQ(hp.host, "10.0.0.5");
  EXPECT_EQ(hp.port, 7000);
  ASSERT_TRUE(ParseHostPort("[::1]:0", &hp).ok());
  EXPECT_STREQ(hp.host, "::1");
  EXPECT_EQ(hp.port, 0);
  ASSERT_TRUE(ParseHostPort("gpu-host.example:65535", &hp).ok());
  EXPECT_STREQ(hp.host, "gpu-host.example");
  ASSERT_TRUE(ParseHostPort("*:80", &hp).ok());
  EXPECT_STREQ(hp.host, "");
  ASSERT_TRUE(ParseHostPort(":80", &hp).ok());
  EXPECT_STREQ(hp.host, "");
}

TEST(TcpAddressTest, RejectsMalformedAddressesWithClearErrors) {
  HostPort hp;
  struct Case {
    const char* text;
    const char* says;
  } cases[] = {
      {"", "empty address"},
      {"gpu1", "missing ':PORT'"},
      {"gpu1:", "missing port"},
      {"gpu1:http", "not a number"},
      {"gpu1:70000", "out of range"},
      {"::1:80", "must be in brackets"},
      {"[::1]80", "missing ':PORT' after ']'"},
      {"[::1:80", "missing ']'"},
  };
  for (const Case& c : cases) {
    TransportStatus st = ParseHostPort(c.text, &hp);
    EXPECT_EQ(st.code(), TransportErrc::kInvalidArgument) << c.text;
    EXPECT_NE(std::string(st.message()).find(c.says), std::string::npos)
        << c.text << " -> " << st.message();
  }
}

TEST(TcpAddressTest, ListensAndConnectsOverIpv6LoopbackWhenAvailable) {
  std::unique_ptr<Listener> l;
  if (!ListenTcp("[::1]:0", &l).ok()) GTEST_SKIP() << "no IPv6 loopback here";
  EXPECT_EQ(std::string(l->address()).rfind("[::1]:", 0), 0u) << l->address();
  std::unique_ptr<Transport> c, s;
  TransportStatus cst;
  std::thread t([&] { cst = ConnectTcp(l->address(), Hello(), TransportOptions{}, &c); });
  TransportStatus sst = l->Accept(Policy(), TransportOptions{}, 5000, &s, nullptr);
  t.join();
  EXPECT_TRUE(sst.ok()) << Describe(sst);
  EXPECT_TRUE(cst.ok()) << Describe(cst);
}

TEST(TcpAddressTest, ConnectToNothingFailsPromptly) {
  std::unique_ptr<Listener> l;
  ASSERT_TRUE(ListenTcp("127.0.0.1:0", &l).ok());
  std::string addr = l->address();
  l->Close();
  std::unique_ptr<Transport> c;
  TransportStatus st = ConnectTcp(addr.c_str(), Hello(), TransportOptions{}, &c);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("cannot connect"), std::string::npos) << st.message();
}

TEST(ShmRendezvousTest, RefusesALivePathAndReplacesAStaleOne) {
  std::string path = "/tmp/tf-transport-stale-" + std::to_string(getpid()) + ".sock";
  std::unique_ptr<Listener> a, b;
  ASSERT_TRUE(ListenShm(path.c_str(), &a).ok());
  TransportStatus st = ListenShm(path.c_str(), &b);
  EXPECT_EQ(st.code(), TransportErrc::kInvalidArgument) << Describe(st);
  // A listener that died leaves its socket file behind.
  pid_t child = fork();
  if (child == 0) {
    std::unique_ptr<Listener> l;
    std::string p2 = path + ".2";
    if (!ListenShm(p2.c_str(), &l).ok()) _exit(1);
    _exit(0);  // no Close: the file stays
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_EQ(WEXITSTATUS(status), 0);
  std::string p2 = path + ".2";
  st = ListenShm(p2.c_str(), &b);
  EXPECT_TRUE(st.ok()) << Describe(st);
}

// A receiver spins before sleeping only while the load it is told to watch (the worker's live
// sessions) is within its maximum.
TEST(SpinLoadTest, SpinsOnlyWhileTheLoadIsWithinItsMaximum) {
  TransportOptions o;
  EXPECT_EQ(SpinNsNow(200'000, o), 200'000u) << "no load to watch: always";
  std::atomic<uint32_t> live{0};
  o.spin_load = &live;
  o.spin_load_max = 4;
  for (uint32_t n : {0u, 1u, 4u}) {
    live.store(n);
    EXPECT_EQ(SpinNsNow(200'000, o), 200'000u) << n << " live";
  }
  for (uint32_t n : {5u, 8u, 1000u}) {
    live.store(n);
    EXPECT_EQ(SpinNsNow(200'000, o), 0u) << n << " live";
  }
  EXPECT_EQ(SpinNsNow(0, o), 0u);
  o.spin_load_max = 0;  // never
  live.store(1);
  EXPECT_EQ(SpinNsNow(200'000, o), 0u);
}

}  // namespace
}  // namespace tf::transport
