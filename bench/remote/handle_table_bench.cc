// What the session's virtual handles cost the worker per call, measured on the CPU alone: the
// lookups a forwarded call makes (docs/remote.md, "Session-scoped virtual handles").
//   handle_table_bench [--functions N] [--iters N]
// Prints ns per operation: Resolve of a launch's two names (function, stream) over a table of N
// functions visited in a random order (cache misses as a big model's launches have), Publish of a
// real handle already named (an output such as cuModuleGetFunction again), and Publish + Retire
// of a new one (a create and destroy).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "worker/session_handles.h"

namespace {

using tf::worker::HandleKind;
using tf::worker::HandleTable;
using Clock = std::chrono::steady_clock;

double NsPer(Clock::time_point t0, Clock::time_point t1, long n) {
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) {
  long functions = 20000, iters = 20'000'000;
  for (int i = 1; i + 1 < argc; i += 2) {
    char* end = nullptr;
    long v = std::strtol(argv[i + 1], &end, 10);
    if (end == argv[i + 1] || *end != '\0' || v <= 0) {
      std::fprintf(stderr, "handle_table_bench: %s needs a positive whole number\n", argv[i]);
      return 2;
    }
    if (std::strcmp(argv[i], "--functions") == 0) functions = v;
    else if (std::strcmp(argv[i], "--iters") == 0) iters = v;
    else {
      std::fprintf(stderr, "usage: handle_table_bench [--functions N] [--iters N]\n");
      return 2;
    }
  }
  HandleTable table(0x1234);
  std::vector<uint64_t> fn_names, stream_names;
  for (long i = 0; i < functions; ++i) fn_names.push_back(table.Publish(HandleKind::kFunction, 0x7f0000000000 + i * 64));
  for (int i = 0; i < 64; ++i) stream_names.push_back(table.Publish(HandleKind::kStream, 0x7e0000000000 + i * 64));
  // A launch sequence: random functions (a model's kernels in an order the cache does not know),
  // a few streams.
  std::mt19937_64 rng(42);
  const size_t seq = 1 << 16;
  std::vector<uint64_t> launch_fn(seq), launch_stream(seq);
  for (size_t i = 0; i < seq; ++i) {
    launch_fn[i] = fn_names[rng() % fn_names.size()];
    launch_stream[i] = stream_names[rng() % 4];
  }
  uint64_t sink = 0, real = 0;
  auto t0 = Clock::now();
  for (long i = 0; i < iters; ++i) {
    const size_t k = static_cast<size_t>(i) & (seq - 1);
    if (!table.Resolve(HandleKind::kFunction, launch_fn[k], &real)) return 1;
    sink += real;
    if (!table.Resolve(HandleKind::kStream, launch_stream[k], &real)) return 1;
    sink += real;
  }
  auto t1 = Clock::now();
  const double resolve_pair = NsPer(t0, t1, iters);
  // A forged name: the check that refuses it costs the same path.
  t0 = Clock::now();
  long refused = 0;
  for (long i = 0; i < iters; ++i) refused += !table.Resolve(HandleKind::kFunction, launch_fn[i & (seq - 1)] ^ (1ull << 30), &real);
  t1 = Clock::now();
  const double forged = NsPer(t0, t1, iters);
  const long publish_iters = iters / 10;
  t0 = Clock::now();
  for (long i = 0; i < publish_iters; ++i) sink += table.Publish(HandleKind::kFunction, 0x7f0000000000 + (rng() % functions) * 64);
  t1 = Clock::now();
  const double republish = NsPer(t0, t1, publish_iters);
  t0 = Clock::now();
  for (long i = 0; i < publish_iters; ++i) {
    uint64_t w = table.Publish(HandleKind::kEvent, 0x7d0000000000 + (i & 1023) * 64);
    if (!table.Retire(HandleKind::kEvent, w)) return 1;
  }
  t1 = Clock::now();
  const double create_destroy = NsPer(t0, t1, publish_iters);
  std::printf("functions=%ld\niters=%ld\nresolve_launch_pair_ns=%.2f\nresolve_forged_ns=%.2f\nrepublish_ns=%.2f\n"
              "publish_retire_ns=%.2f\nrefused=%ld\nsink=%llu\n", functions, iters, resolve_pair, forged, republish,
              create_destroy, refused, static_cast<unsigned long long>(sink & 1));
  return refused == iters ? 0 : 1;
}
