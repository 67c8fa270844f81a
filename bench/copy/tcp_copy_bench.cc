// tcp_copy_bench: bulk copy bandwidth of the remote vGPU over TCP, and the plain-socket rate it is
// measured against. Two halves, run by tests/gpu/tcp_copy.sh in one go:
//
//   tcp_copy_bench socket [--min KiB] [--max MiB] [--budget MiB]
//       One process sends a message of N bytes over loopback TCP to another (fork), which reads
//       all of it and answers one byte: the least a synchronous copy of N bytes over the
//       connection does. Blocking sockets, TCP_NODELAY, the kernel's default buffer sizes.
//   tcp_copy_bench copy [--min KiB] [--max MiB] [--budget MiB]
//       A driver-API program: cuMemcpyHtoD/DtoH, and their Async forms followed by a stream
//       synchronize, from pageable (malloc) and page-locked (cuMemAllocHost) memory. Run it
//       through the client stub against a worker (TFUSION_REMOTE=HOST:PORT), or natively.
//
// Sizes go from --min (default 4 KiB) to --max (default 1024 MiB) by factors of 4 (the largest
// is always --max). Each size is copied once to warm up and then max(3, min(200, budget / N))
// times (--budget default 1024 MiB); the median copy gives the rate. Output, one line per point:
//   socket BYTES GBPS
//   copy KIND BYTES GBPS        KIND: htod|dtoh _ pageable|pinned [_async]
// GB/s are 10^9 bytes per second. Exit 0, 1 on a failed call or socket error, 2 on bad usage.
#include <arpa/inet.h>
#include <cuda.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  uint64_t min_bytes = 4 << 10;
  uint64_t max_bytes = 1ull << 30;
  uint64_t budget = 1ull << 30;
};

std::vector<uint64_t> Sizes(const Options& o) {
  std::vector<uint64_t> v;
  for (uint64_t n = o.min_bytes; n < o.max_bytes; n *= 4) v.push_back(n);
  v.push_back(o.max_bytes);
  return v;
}

int Reps(const Options& o, uint64_t n) {
  return static_cast<int>(std::max<uint64_t>(3, std::min<uint64_t>(200, o.budget / n)));
}

double MedianGbps(std::vector<double> secs, uint64_t n) {
  std::sort(secs.begin(), secs.end());
  return n / secs[secs.size() / 2] / 1e9;
}

// ---- plain sockets ----

bool WriteAll(int fd, const uint8_t* p, uint64_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<uint64_t>(w);
  }
  return true;
}

bool ReadAll(int fd, uint8_t* p, uint64_t n) {
  while (n > 0) {
    ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<uint64_t>(r);
  }
  return true;
}

int Socket(const Options& o) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (lfd < 0 || bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(lfd, 1) != 0 ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("listen");
    return 1;
  }
  const std::vector<uint64_t> sizes = Sizes(o);
  std::vector<uint8_t> buf(o.max_bytes, 1);  // written: no page faults while timing
  const int one = 1;
  pid_t child = fork();
  if (child == 0) {  // receiver: reads each message in full, answers one byte
    close(lfd);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) _exit(1);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    uint8_t ack = 1;
    for (uint64_t n : sizes) {
      for (int i = 0; i <= Reps(o, n); ++i) {
        if (!ReadAll(fd, buf.data(), n) || !WriteAll(fd, &ack, 1)) _exit(1);
      }
    }
    _exit(0);
  }
  int fd = accept(lfd, nullptr, nullptr);
  close(lfd);
  if (fd < 0) {
    std::perror("accept");
    return 1;
  }
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  bool ok = true;
  for (uint64_t n : sizes) {
    std::vector<double> secs;
    for (int i = 0; ok && i <= Reps(o, n); ++i) {
      uint8_t ack = 0;
      const auto t0 = Clock::now();
      ok = WriteAll(fd, buf.data(), n) && ReadAll(fd, &ack, 1);
      if (i > 0) secs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    if (!ok) break;
    std::printf("socket %llu %.3f\n", static_cast<unsigned long long>(n), MedianGbps(secs, n));
    std::fflush(stdout);
  }
  close(fd);
  int status = 0;
  waitpid(child, &status, 0);
  if (!ok || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "socket benchmark failed\n");
    return 1;
  }
  return 0;
}

// ---- remote copies ----

bool Check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return true;
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  std::printf("error %s %s\n", what, name ? name : "?");
  return false;
}

int Copy(const Options& o) {
  CUdevice dev;
  CUcontext ctx;
  if (!Check(cuInit(0), "cuInit") || !Check(cuDeviceGet(&dev, 0), "cuDeviceGet") ||
      !Check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain") ||
      !Check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent")) {
    return 1;
  }
  const uint64_t top = o.max_bytes;
  CUdeviceptr d = 0;
  void* pinned = nullptr;
  CUstream s = nullptr;
  if (!Check(cuMemAlloc(&d, top), "cuMemAlloc") || !Check(cuMemAllocHost(&pinned, top), "cuMemAllocHost") ||
      !Check(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate")) {
    return 1;
  }
  std::vector<uint8_t> pageable(top, 1);
  std::memset(pinned, 2, top);
  struct Kind {
    const char* name;
    bool htod, pinned, async;
  };
  const Kind kinds[] = {
      {"htod_pageable", true, false, false},      {"dtoh_pageable", false, false, false},
      {"htod_pinned", true, true, false},         {"dtoh_pinned", false, true, false},
      {"htod_pageable_async", true, false, true}, {"dtoh_pageable_async", false, false, true},
      {"htod_pinned_async", true, true, true},    {"dtoh_pinned_async", false, true, true},
  };
  for (const Kind& k : kinds) {
    void* h = k.pinned ? pinned : static_cast<void*>(pageable.data());
    for (uint64_t n : Sizes(o)) {
      std::function<CUresult()> one;
      if (k.htod && k.async) {
        one = [&] {
          CUresult r = cuMemcpyHtoDAsync(d, h, n, s);
          return r == CUDA_SUCCESS ? cuStreamSynchronize(s) : r;
        };
      } else if (k.async) {
        one = [&] {
          CUresult r = cuMemcpyDtoHAsync(h, d, n, s);
          return r == CUDA_SUCCESS ? cuStreamSynchronize(s) : r;
        };
      } else if (k.htod) {
        one = [&] { return cuMemcpyHtoD(d, h, n); };
      } else {
        one = [&] { return cuMemcpyDtoH(h, d, n); };
      }
      std::vector<double> secs;
      for (int i = 0; i <= Reps(o, n); ++i) {
        const auto t0 = Clock::now();
        if (!Check(one(), k.name)) return 1;
        if (i > 0) secs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      }
      std::printf("copy %s %llu %.3f\n", k.name, static_cast<unsigned long long>(n), MedianGbps(secs, n));
      std::fflush(stdout);
    }
  }
  cuStreamDestroy(s);
  cuMemFreeHost(pinned);
  cuMemFree(d);
  return 0;
}

int Usage() {
  std::fprintf(stderr,
               "usage: tcp_copy_bench socket|copy [--min KiB] [--max MiB] [--budget MiB]\n"
               "  4 <= --min KiB <= --max; 1 <= --max MiB <= 4096; 1 <= --budget MiB <= 65536\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage();
  const std::string mode = argv[1];
  Options o;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return Usage();
    char* end = nullptr;
    const unsigned long long v = std::strtoull(argv[++i], &end, 10);
    if (end == argv[i] || *end != '\0') return Usage();
    if (a == "--min" && v >= 4 && v <= (4ull << 20)) {
      o.min_bytes = v << 10;
    } else if (a == "--max" && v >= 1 && v <= 4096) {
      o.max_bytes = v << 20;
    } else if (a == "--budget" && v >= 1 && v <= 65536) {
      o.budget = v << 20;
    } else {
      return Usage();
    }
  }
  if (o.min_bytes > o.max_bytes) return Usage();
  if (mode == "socket") return Socket(o);
  if (mode == "copy") return Copy(o);
  return Usage();
}
