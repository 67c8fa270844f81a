// transport_bench: round-trip latency and small-message throughput of the TCP (loopback) and
// shared-memory transports on this machine. Not a test: it prints a table for docs/.
//
// The worker side is a forked child process (an echo server), so the numbers include the real
// cross-process wake-ups. Usage: transport_bench [round_trips] [async_frames]
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "transport/shm_transport.h"
#include "transport/tcp_transport.h"
#include "transport/transport.h"

namespace tf::transport {
namespace {

// Echo server: answers every reply-expected frame with an empty kCallReply of the same
// sequence; drops everything else. Exits when the client goes away.
[[noreturn]] void Serve(Listener* listener) {
  std::unique_ptr<Transport> t;
  TransportOptions o;
  if (!listener->Accept(ServerPolicy{}, o, 10000, &t, nullptr).ok()) _exit(1);
  for (;;) {
    InFrame f;
    TransportStatus st = t->Receive(&f, 60000);
    if (!st.ok()) _exit(0);
    if (f.header.flags & kFlagReplyExpected) {
      OutFrame r;
      r.opcode = static_cast<uint16_t>(Opcode::kCallReply);
      r.sequence = f.header.sequence;
      if (!t->Send(r).ok()) _exit(1);
    }
  }
}

double Percentile(std::vector<double>* v, double p) {
  std::sort(v->begin(), v->end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v->size() - 1));
  return (*v)[i];
}

bool RoundTrip(Transport* t, uint64_t seq, const uint8_t* payload, uint32_t len) {
  OutFrame f;
  f.opcode = DriverCallOpcode(1);
  f.flags = kFlagReplyExpected;
  f.sequence = seq;
  f.payload = payload;
  f.payload_length = len;
  if (!t->Send(f).ok()) return false;
  InFrame r;
  return t->Receive(&r, 10000).ok() && r.header.sequence == seq;
}

void Run(const char* kind, int round_trips, int async_frames) {
  std::unique_ptr<Listener> listener;
  std::string path = "/tmp/tf-transport-bench-" + std::to_string(getpid()) + ".sock";
  TransportStatus st = strcmp(kind, "tcp") == 0 ? ListenTcp("127.0.0.1:0", &listener)
                                                : ListenShm(path.c_str(), &listener);
  if (!st.ok()) {
    fprintf(stderr, "%s: listen: %s\n", kind, st.message());
    return;
  }
  pid_t child = fork();
  if (child == 0) Serve(listener.get());
  ClientHello hello;
  std::unique_ptr<Transport> t;
  TransportOptions o;
  st = strcmp(kind, "tcp") == 0 ? ConnectTcp(listener->address(), hello, o, &t)
                                : ConnectShm(listener->address(), hello, o, &t);
  if (!st.ok()) {
    fprintf(stderr, "%s: connect: %s\n", kind, st.message());
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    return;
  }
  uint8_t payload[64] = {};
  uint64_t seq = 0;
  for (int i = 0; i < 1000; ++i) RoundTrip(t.get(), seq++, payload, sizeof(payload));
  std::vector<double> us;
  us.reserve(static_cast<size_t>(round_trips));
  for (int i = 0; i < round_trips; ++i) {
    int64_t t0 = MonotonicNowNs();
    if (!RoundTrip(t.get(), seq++, payload, sizeof(payload))) {
      fprintf(stderr, "%s: round trip failed\n", kind);
      break;
    }
    us.push_back(static_cast<double>(MonotonicNowNs() - t0) / 1000.0);
  }

  // Small fire-and-forget frames (64-byte payload, like a kernel launch), then one sync call
  // that returns once the worker has consumed all of them.
  int64_t t0 = MonotonicNowNs();
  OutFrame f;
  f.opcode = DriverCallOpcode(2);
  f.payload = payload;
  f.payload_length = sizeof(payload);
  for (int i = 0; i < async_frames; ++i) {
    f.sequence = seq++;
    if (!t->Send(f).ok()) break;
  }
  int64_t t_enqueued = MonotonicNowNs();
  RoundTrip(t.get(), seq++, payload, sizeof(payload));
  int64_t t1 = MonotonicNowNs();
  double secs = static_cast<double>(t1 - t0) / 1e9;
  double send_ns = static_cast<double>(t_enqueued - t0) / async_frames;

  // Bulk: 1 GiB in slices of up to 8 MiB (sender-side copy into the transport included).
  uint64_t slice = std::min<uint64_t>(8ull << 20, t->max_bulk_bytes());
  std::vector<uint8_t> buf(slice, 0x5A);
  const uint64_t total = 1ull << 30;
  int64_t b0 = MonotonicNowNs();
  OutFrame bf;
  bf.opcode = DriverCallOpcode(3);
  bf.bulk = buf.data();
  bf.bulk_length = slice;
  for (uint64_t off = 0; off < total; off += slice) {
    bf.sequence = seq++;
    if (!t->Send(bf).ok()) break;
  }
  RoundTrip(t.get(), seq++, payload, sizeof(payload));
  double bulk_gib_s = 1.0 / (static_cast<double>(MonotonicNowNs() - b0) / 1e9);

  printf("| %-4s | %8.1f | %8.1f | %8.1f | %10.0f | %8.2f | %12.0f | %6.2f |\n", kind,
         Percentile(&us, 0.50), Percentile(&us, 0.99), Percentile(&us, 0.999),
         async_frames / secs, async_frames * (28.0 + 64.0) / secs / 1e6, send_ns, bulk_gib_s);
  t->Close();
  t.reset();
  waitpid(child, nullptr, 0);
  listener->Close();
}

}  // namespace
}  // namespace tf::transport

int main(int argc, char** argv) {
  int round_trips = argc > 1 ? atoi(argv[1]) : 20000;
  int async_frames = argc > 2 ? atoi(argv[2]) : 1000000;
  if (round_trips < 1) round_trips = 1;
  if (async_frames < 1) async_frames = 1;
  printf("round trips: %d (64-byte request, empty reply); async frames: %d (64-byte payload);\n"
         "bulk: 1 GiB in slices of min(8 MiB, max_bulk_bytes)\n\n",
         round_trips, async_frames);
  printf("| kind | RTT p50 us | RTT p99 us | RTT p99.9 us | async frames/s | async MB/s | "
         "send ns/frame | bulk GiB/s |\n");
  printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  tf::transport::Run("tcp", round_trips, async_frames);
  tf::transport::Run("shm", round_trips, async_frames);
  return 0;
}
