// dtoh_probe: where a pageable device-to-host copy's time can go on this host, natively and in
// the shape the shared-memory transport gives it (DMA into a registered shared ring, then a CPU
// copy out into the program's pageable memory), all in one process on the real driver.
//
//   dtoh_probe [--bytes 1GiB] [--ring 32MiB] [--slice 4MiB] [--depth 4] [--reps 3]
//
// native_pageable  cuMemcpyDtoH into malloc'd memory: GB/s and the process's CPU time per second
//                  of copy (about 1: the driver copies through the CPU; about 0: the copy engine
//                  wrote the pages itself).
// native_pinned    cuMemcpyDtoH into the registered ring, slice by slice: the DMA alone.
// serial_*         DMA one slice, then copy it out: GB/s of the copy-out alone, from memory the
//                  GPU just wrote (memcpy, or the client's ParallelCopy).
// pipelined_*      up to --depth slices in flight on a stream while earlier ones are copied out:
//                  the best an in-process staged copy does (what the transport does across two
//                  processes).
// cross_process_*  the pipelined copy split across two processes as the transport splits it: a
//                  child process owns the GPU and DMAs into the shared ring, this process copies
//                  out, the two hand slices over through counters in shared memory.
// Output: RESULT key=value lines, GB/s (10^9 bytes/s) the median of --reps; exit 1 on a CUDA error.
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "client/parallel_copy.h"
#include "gpu_harness.h"

namespace tf::gpu {
namespace {

bool Check(CUresult rc, const char* call) {
  if (rc == CUDA_SUCCESS) return true;
  Result("error", std::string(call) + ":" + CuErrorName(rc));
  return false;
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Probe {
  uint64_t bytes, ring_bytes, slice;
  int depth, reps;
  CUdeviceptr dev = 0;
  uint8_t* pageable = nullptr;
  uint8_t* ring = nullptr;
  CUstream stream = nullptr;
  std::vector<CUevent> events;

  bool Setup() {
    if (!Check(cuMemAlloc(&dev, bytes), "cuMemAlloc") ||
        !Check(cuMemsetD8(dev, 7, bytes), "cuMemsetD8") ||
        !Check(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate")) {
      return false;
    }
    pageable = static_cast<uint8_t*>(std::malloc(bytes));
    if (pageable == nullptr) return false;
    std::memset(pageable, 1, bytes);
    const int fd = memfd_create("dtoh_probe", 0);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(ring_bytes)) != 0) return false;
    void* m = mmap(nullptr, ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return false;
    ring = static_cast<uint8_t*>(m);
    std::memset(ring, 0, ring_bytes);
    if (!Check(cuMemHostRegister(ring, ring_bytes, CU_MEMHOSTREGISTER_PORTABLE), "cuMemHostRegister")) {
      return false;
    }
    events.resize(static_cast<size_t>(depth));
    for (CUevent& e : events) {
      if (!Check(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate")) return false;
    }
    return true;
  }

  uint8_t* Slot(uint64_t i) { return ring + (i * slice) % (ring_bytes / slice * slice); }

  // Runs body reps times; reports the median GB/s under key.
  bool Measure(const std::string& key, const std::function<bool(double*)>& body) {
    std::vector<double> gbps;
    for (int r = 0; r < reps; ++r) {
      double seconds = 0;
      if (!body(&seconds)) return false;
      gbps.push_back(static_cast<double>(bytes) / seconds / 1e9);
    }
    ResultF(key + "_gbps", Median(gbps));
    return true;
  }

  bool Run() {
    double cpu_per_s = 0;
    if (!Measure("native_pageable", [&](double* s) {
          const double c0 = CpuSeconds();
          const uint64_t t0 = NowNs();
          if (!Check(cuMemcpyDtoH(pageable, dev, bytes), "cuMemcpyDtoH(pageable)")) return false;
          *s = static_cast<double>(NowNs() - t0) / 1e9;
          cpu_per_s = (CpuSeconds() - c0) / *s;
          return true;
        })) {
      return false;
    }
    ResultF("native_pageable_cpu_per_s", cpu_per_s);
    if (!Measure("native_pinned", [&](double* s) {
          const uint64_t t0 = NowNs();
          for (uint64_t off = 0, i = 0; off < bytes; off += slice, ++i) {
            if (!Check(cuMemcpyDtoH(Slot(i), dev + off, std::min(slice, bytes - off)), "cuMemcpyDtoH(ring)")) {
              return false;
            }
          }
          *s = static_cast<double>(NowNs() - t0) / 1e9;
          return true;
        })) {
      return false;
    }
    using CopyFn = void (*)(void*, const void*, size_t);
    const std::pair<const char*, CopyFn> copies[] = {
        {"memcpy", [](void* d, const void* s, size_t n) { std::memcpy(d, s, n); }},
        {"parallel", [](void* d, const void* s, size_t n) { client::ParallelCopy(d, s, n); }}};
    for (const auto& [name, copy] : copies) {
      if (!Measure(std::string("serial_") + name, [&, copy = copy](double* s) {
            uint64_t copy_ns = 0;
            for (uint64_t off = 0, i = 0; off < bytes; off += slice, ++i) {
              const uint64_t len = std::min(slice, bytes - off);
              if (!Check(cuMemcpyDtoH(Slot(i), dev + off, len), "cuMemcpyDtoH(ring)")) return false;
              const uint64_t t0 = NowNs();
              copy(pageable + off, Slot(i), len);
              copy_ns += NowNs() - t0;
            }
            *s = static_cast<double>(copy_ns) / 1e9;
            return true;
          })) {
        return false;
      }
      if (!Measure(std::string("pipelined_") + name, [&, copy = copy](double* s) {
            const uint64_t t0 = NowNs();
            const uint64_t n_slices = (bytes + slice - 1) / slice;
            uint64_t issued = 0;
            for (uint64_t done = 0; done < n_slices; ++done) {
              while (issued < n_slices && issued < done + static_cast<uint64_t>(depth)) {
                const uint64_t off = issued * slice;
                if (!Check(cuMemcpyDtoHAsync(Slot(issued), dev + off, std::min(slice, bytes - off), stream),
                           "cuMemcpyDtoHAsync") ||
                    !Check(cuEventRecord(events[issued % events.size()], stream), "cuEventRecord")) {
                  return false;
                }
                ++issued;
              }
              if (!Check(cuEventSynchronize(events[done % events.size()]), "cuEventSynchronize")) return false;
              const uint64_t off = done * slice;
              copy(pageable + off, Slot(done), std::min(slice, bytes - off));
            }
            *s = static_cast<double>(NowNs() - t0) / 1e9;
            return true;
          })) {
        return false;
      }
    }
    return pageable[bytes - 1] == 7 || (std::fprintf(stderr, "copied bytes are wrong\n"), false);
  }
};

// Counters in memory shared by both processes.
struct Handoff {
  std::atomic<uint64_t> produced{0};  // slices whose DMA completed
  std::atomic<uint64_t> consumed{0};  // slices copied out (their slots free again)
  std::atomic<int> child_failed{0};
};

// The child: DMAs `total` slices (the device buffer over and over) into the ring, at most depth
// ahead of the parent's copy-out. Never returns.
[[noreturn]] void CrossProcessChild(Handoff* h, uint8_t* ring, uint64_t ring_bytes, uint64_t bytes,
                                    uint64_t slice, int depth, uint64_t total) {
  DriverSession session;
  CUdeviceptr dev = 0;
  CUstream stream = nullptr;
  std::vector<CUevent> events(static_cast<size_t>(depth));
  bool ok = session.ok() && Check(cuMemAlloc(&dev, bytes), "cuMemAlloc") &&
            Check(cuMemsetD8(dev, 7, bytes), "cuMemsetD8") &&
            Check(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate") &&
            Check(cuMemHostRegister(ring, ring_bytes, CU_MEMHOSTREGISTER_PORTABLE), "cuMemHostRegister");
  for (CUevent& e : events) ok = ok && Check(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  const uint64_t per_rep = (bytes + slice - 1) / slice, slots = ring_bytes / slice;
  uint64_t issued = 0;
  for (uint64_t done = 0; ok && done < total; ++done) {
    while (ok && issued < total && issued < done + static_cast<uint64_t>(depth)) {
      while (issued >= h->consumed.load(std::memory_order_acquire) + slots) {}  // slot still being read
      const uint64_t off = (issued % per_rep) * slice;
      ok = Check(cuMemcpyDtoHAsync(ring + (issued % slots) * slice, dev + off, std::min(slice, bytes - off), stream),
                 "cuMemcpyDtoHAsync") &&
           Check(cuEventRecord(events[issued % events.size()], stream), "cuEventRecord");
      ++issued;
    }
    ok = ok && Check(cuEventSynchronize(events[done % events.size()]), "cuEventSynchronize");
    h->produced.store(done + 1, std::memory_order_release);
  }
  if (!ok) h->child_failed.store(1);
  _exit(ok ? 0 : 1);
}

// The parent: copies each slice out once the child says its DMA completed.
bool CrossProcess(uint64_t bytes, uint64_t ring_bytes, uint64_t slice, int depth, int reps) {
  auto* h = static_cast<Handoff*>(mmap(nullptr, sizeof(Handoff), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  const int fd = memfd_create("dtoh_probe_cross", 0);
  if (h == MAP_FAILED || fd < 0 || ftruncate(fd, static_cast<off_t>(ring_bytes)) != 0) return false;
  void* m = mmap(nullptr, ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return false;
  auto* ring = static_cast<uint8_t*>(m);
  std::memset(ring, 0, ring_bytes);
  new (h) Handoff();
  auto* dst = static_cast<uint8_t*>(std::malloc(bytes));
  if (dst == nullptr) return false;
  std::memset(dst, 1, bytes);
  const uint64_t per_rep = (bytes + slice - 1) / slice, slots = ring_bytes / slice;
  const int kinds = 2;  // memcpy, then ParallelCopy
  const uint64_t total = per_rep * static_cast<uint64_t>(reps) * kinds;
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) CrossProcessChild(h, ring, ring_bytes, bytes, slice, depth, total);
  bool ok = true;
  uint64_t g = 0;
  for (int kind = 0; ok && kind < kinds; ++kind) {
    std::vector<double> gbps;
    rusage u0{}, u1{};
    getrusage(RUSAGE_SELF, &u0);
    for (int r = 0; ok && r < reps; ++r) {
      const uint64_t t0 = NowNs();
      for (uint64_t i = 0; i < per_rep; ++i, ++g) {
        while (h->produced.load(std::memory_order_acquire) <= g) {
          if (h->child_failed.load() != 0) {
            ok = false;
            break;
          }
        }
        if (!ok) break;
        const uint64_t off = i * slice, len = std::min(slice, bytes - off);
        if (kind == 0) std::memcpy(dst + off, ring + (g % slots) * slice, len);
        else client::ParallelCopy(dst + off, ring + (g % slots) * slice, len);
        h->consumed.store(g + 1, std::memory_order_release);
      }
      gbps.push_back(static_cast<double>(bytes) / (static_cast<double>(NowNs() - t0) / 1e9) / 1e9);
    }
    getrusage(RUSAGE_SELF, &u1);
    const std::string key = kind == 0 ? "cross_process_memcpy" : "cross_process_parallel";
    if (ok) ResultF(key + "_gbps", Median(gbps));
    Result(key + "_minor_faults", static_cast<uint64_t>(u1.ru_minflt - u0.ru_minflt));
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0 && dst[bytes - 1] == 7;
  std::free(dst);
  munmap(ring, ring_bytes);
  munmap(h, sizeof(Handoff));
  return ok;
}

}  // namespace
}  // namespace tf::gpu

int main(int argc, char** argv) {
  using namespace tf::gpu;
  Flags flags;
  if (!flags.Parse(argc, argv, 1) || !flags.OnlyKnown({"bytes", "ring", "slice", "depth", "reps"})) return 2;
  const uint64_t bytes = flags.Bytes("bytes", kGiB), ring = flags.Bytes("ring", 32 * kMiB),
                 slice = flags.Bytes("slice", 4 * kMiB);
  const int depth = static_cast<int>(flags.Num("depth", 4));
  const int reps = static_cast<int>(flags.Num("reps", 3));
  if (!FlagsOk(flags) || slice < 4096 || slice % 4096 || ring < slice || ring % 4096 || bytes < slice ||
      depth < 1 || static_cast<uint64_t>(depth) > ring / slice || reps < 1 || reps > 100) {
    std::fprintf(stderr, "usage: dtoh_probe [--bytes 1GiB] [--ring 32MiB] [--slice 4MiB] [--depth 4] [--reps 3]\n"
                         "(slice a multiple of 4 KiB, depth slices fit in the ring)\n");
    return 2;
  }
  // First, before this process touches CUDA (the child of a fork must be the one that does).
  if (!CrossProcess(bytes, ring, slice, depth, reps)) {
    std::fprintf(stderr, "the cross-process copy failed\n");
    return 1;
  }
  DriverSession session;
  if (!session.ok()) {
    std::fprintf(stderr, "%s failed: %s\n", session.failed_call().c_str(), CuErrorName(session.rc()).c_str());
    return 1;
  }
  Result("pageable_memory_access", static_cast<uint64_t>(session.Attribute(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)));
  Probe p{bytes, ring, slice, depth, reps};
  return p.Setup() && p.Run() ? 0 : 1;
}
