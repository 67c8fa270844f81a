// copy_bench: how fast this host copies out of shared memory into a process's pageable memory,
// the last step of a pageable device-to-host copy over the shared-memory transport. No GPU.
//
//   copy_bench [--mode memcpy|parallel] [--bytes MiB] [--slice KiB] [--reps N] [--fresh]
//
// The source is a 32 MiB memfd mapping (as the transport's bulk memory), read slice by slice
// round-robin; the destination is one malloc'd buffer, written in full before timing unless
// --fresh (then a new, never-touched mapping per repetition, so page faults are counted).
// `parallel` is the client's ParallelCopy (threads and streaming stores from TFUSION_COPY_THREADS
// and TFUSION_COPY_NT). Prints RESULT lines: GB/s per repetition and the median.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client/parallel_copy.h"

int main(int argc, char** argv) {
  std::string mode = "parallel";
  size_t mib = 1024, slice_kib = 4096;
  int reps = 5;
  bool fresh = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&](const char* what) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", what);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--mode") mode = next("--mode");
    else if (a == "--bytes") mib = std::strtoul(next("--bytes"), nullptr, 10);
    else if (a == "--slice") slice_kib = std::strtoul(next("--slice"), nullptr, 10);
    else if (a == "--reps") reps = std::atoi(next("--reps"));
    else if (a == "--fresh") fresh = true;
    else {
      std::fprintf(stderr, "usage: copy_bench [--mode memcpy|parallel] [--bytes MiB] [--slice KiB] [--reps N] [--fresh]\n");
      return 2;
    }
  }
  if ((mode != "memcpy" && mode != "parallel") || mib < 1 || mib > 65536 || slice_kib < 4 ||
      slice_kib > 32768 || reps < 1 || reps > 1000) {
    std::fprintf(stderr, "bad arguments: mode memcpy|parallel, 1 <= MiB <= 65536, 4 <= slice KiB <= 32768\n");
    return 2;
  }
  const size_t n = mib << 20, slice = slice_kib << 10, ring = 32u << 20;
  int fd = memfd_create("copy_bench", 0);
  if (fd < 0 || ftruncate(fd, ring) != 0) {
    std::perror("memfd");
    return 1;
  }
  auto* src = static_cast<unsigned char*>(mmap(nullptr, ring, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  if (src == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  std::memset(src, 3, ring);
  unsigned char* dst = nullptr;
  if (!fresh) {
    dst = static_cast<unsigned char*>(std::malloc(n));
    if (dst == nullptr) return 1;
    std::memset(dst, 1, n);
  }
  std::vector<double> gbps;
  for (int r = 0; r < reps; ++r) {
    if (fresh) {
      dst = static_cast<unsigned char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
      if (dst == MAP_FAILED) return 1;
    }
    auto t0 = std::chrono::steady_clock::now();
    for (size_t off = 0; off < n; off += slice) {
      const size_t len = std::min(slice, n - off);
      const unsigned char* s = src + (off % ring);
      if (mode == "memcpy") std::memcpy(dst + off, s, std::min(len, ring - off % ring));
      else tf::client::ParallelCopy(dst + off, s, std::min(len, ring - off % ring));
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    gbps.push_back(static_cast<double>(n) / s / 1e9);
    if (dst[n - 1] != 3) {
      std::fprintf(stderr, "copy wrong\n");
      return 1;
    }
    if (fresh) munmap(dst, n);
  }
  std::vector<double> sorted = gbps;
  std::sort(sorted.begin(), sorted.end());
  std::printf("RESULT mode=%s threads=%s nt=%s fresh=%d slice_kib=%zu median_gbps=%.2f all=",
              mode.c_str(), getenv("TFUSION_COPY_THREADS") ? getenv("TFUSION_COPY_THREADS") : "auto",
              getenv("TFUSION_COPY_NT") ? getenv("TFUSION_COPY_NT") : "1", fresh ? 1 : 0, slice_kib,
              sorted[sorted.size() / 2]);
  for (double g : gbps) std::printf("%.2f,", g);
  std::printf("\n");
  return 0;
}
