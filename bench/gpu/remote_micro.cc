// remote_micro: the micro-benchmarks of the remote vGPU (issue 3, item 8), run the same way
// natively and through the client stub, so that the numbers can be divided.
//
//   remote_micro [--parts async,sync,bandwidth] [--iters 100000] [--burst 256]
//                [--sync-iters 10000] [--min-bytes 4KiB] [--max-bytes 1GiB] [--seconds 60]
//
// async      client CPU cost of an asynchronous call: host wall time of issuing --burst calls
//            (cuLaunchKernel of an empty kernel; cuEventRecord) divided by the calls, bursts
//            separated by a stream synchronize that is not timed, so a full launch queue never
//            throttles the measurement. --iters calls per kind in all.
// sync       round trip of a synchronizing call with nothing to wait for: cuStreamSynchronize
//            on an idle stream, cuCtxSynchronize, cuStreamQuery, and an empty-kernel launch
//            followed by cuStreamSynchronize; --sync-iters timed calls each (p50/p99/mean/min).
// bandwidth  synchronous cuMemcpyHtoD / cuMemcpyDtoH from page-locked (cuMemAllocHost) and
//            pageable (malloc) memory, sizes from --min-bytes to --max-bytes by factors of 4;
//            GB/s (10^9 bytes/s) of the summed copy time per size, and the median copy in µs.
//            Largest size first (the number the targets are about). Each point gets an equal
//            share of 60% of --seconds (at least two timed copies); past --seconds points make
//            only their two copies, past 1.5 x --seconds they print "skipped". A last round trip
//            of a pattern checks the bytes (copy_check).
//
// Output: `RESULT key=value` lines (tests/gpu/gpu_harness.h); exit 0 when every part ran
// without a CUDA error, 1 on a CUDA error, 2 on a bad command line.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "gpu_harness.h"

extern "C" const unsigned char tf_fatbin_micro_kernels[];

namespace tf::gpu {
namespace {

struct Options {
  bool async = true;
  bool sync = true;
  bool bandwidth = true;
  uint64_t iters = 100000;
  uint64_t burst = 256;
  uint64_t sync_iters = 10000;
  uint64_t min_bytes = 4 * 1024;
  uint64_t max_bytes = kGiB;
  double seconds = 60;
};

// Reads an integer flag in [lo, hi]; on anything else prints why and returns false.
bool IntFlag(const Flags& flags, const std::string& name, uint64_t lo, uint64_t hi, uint64_t* out) {
  if (!flags.Has(name)) return true;
  const double value = flags.Num(name, static_cast<double>(*out));
  if (!FlagsOk(flags)) return false;
  if (value < static_cast<double>(lo) || value > static_cast<double>(hi) ||
      value != static_cast<double>(static_cast<uint64_t>(value))) {
    std::fprintf(stderr, "--%s must be a whole number from %llu to %llu, got %s\n", name.c_str(),
                 static_cast<unsigned long long>(lo), static_cast<unsigned long long>(hi),
                 flags.Str(name, "").c_str());
    return false;
  }
  *out = static_cast<uint64_t>(value);
  return true;
}

bool ParseOptions(const Flags& flags, Options* opt) {
  if (!flags.OnlyKnown({"parts", "iters", "burst", "sync-iters", "min-bytes", "max-bytes", "seconds"})) {
    return false;
  }
  if (flags.Has("parts")) {
    opt->async = opt->sync = opt->bandwidth = false;
    std::string parts = flags.Str("parts", "") + ",";
    for (size_t start = 0, comma; (comma = parts.find(',', start)) != std::string::npos; start = comma + 1) {
      const std::string part = parts.substr(start, comma - start);
      if (part == "async") {
        opt->async = true;
      } else if (part == "sync") {
        opt->sync = true;
      } else if (part == "bandwidth") {
        opt->bandwidth = true;
      } else {
        std::fprintf(stderr, "--parts: unknown part '%s' (async, sync, bandwidth)\n", part.c_str());
        return false;
      }
    }
  }
  if (!IntFlag(flags, "iters", 1, 100000000, &opt->iters) ||
      !IntFlag(flags, "burst", 1, 4096, &opt->burst) ||
      !IntFlag(flags, "sync-iters", 1, 10000000, &opt->sync_iters)) {
    return false;
  }
  opt->min_bytes = flags.Bytes("min-bytes", opt->min_bytes);
  opt->max_bytes = flags.Bytes("max-bytes", opt->max_bytes);
  opt->seconds = flags.Num("seconds", opt->seconds);
  if (!FlagsOk(flags)) return false;
  if (opt->min_bytes < 4 || opt->max_bytes > 16 * kGiB || opt->min_bytes > opt->max_bytes) {
    std::fprintf(stderr, "need 4 <= --min-bytes <= --max-bytes <= 16GiB (sizes like 4KiB, 64MiB, 1GiB)\n");
    return false;
  }
  if (!(opt->seconds > 0 && opt->seconds <= 3600)) {
    std::fprintf(stderr, "--seconds must be in (0, 3600], got %s\n", flags.Str("seconds", "").c_str());
    return false;
  }
  return true;
}

std::string SizeLabel(uint64_t bytes) {
  if (bytes >= kGiB && bytes % kGiB == 0) return std::to_string(bytes / kGiB) + "GiB";
  if (bytes >= kMiB && bytes % kMiB == 0) return std::to_string(bytes / kMiB) + "MiB";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes / 1024) + "KiB";
  return std::to_string(bytes) + "B";
}

// Prints mean/p50/p99/min of `samples` (already in the unit named by `key`'s suffix).
void Stats(const std::string& key, const std::vector<double>& samples) {
  if (samples.empty()) return;
  const double sum = std::accumulate(samples.begin(), samples.end(), 0.0);
  ResultF(key + "_mean", sum / static_cast<double>(samples.size()));
  ResultF(key + "_p50", Percentile(samples, 0.50));
  ResultF(key + "_p99", Percentile(samples, 0.99));
  ResultF(key + "_min", Percentile(samples, 0.0));
}

class MicroBench {
 public:
  explicit MicroBench(const Options& opt) : opt_(opt) {}
  ~MicroBench() {
    if (stream_ != nullptr) cuStreamDestroy(stream_);
    if (event_ != nullptr) cuEventDestroy(event_);
    if (module_ != nullptr) cuModuleUnload(module_);
  }

  // Returns false (after a RESULT error line) when the module, stream or event cannot be made.
  bool Setup() {
    if (!Check(LoadModule(tf_fatbin_micro_kernels, &module_), "cuModuleLoadData") ||
        !Check(cuModuleGetFunction(&empty_, module_, "tf_empty"), "cuModuleGetFunction") ||
        !Check(cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate") ||
        !Check(cuEventCreate(&event_, CU_EVENT_DISABLE_TIMING), "cuEventCreate")) {
      return false;
    }
    for (int i = 0; i < 1000; ++i) {
      if (!Check(Launch(), "cuLaunchKernel(warmup)")) return false;
    }
    return Check(cuStreamSynchronize(stream_), "cuStreamSynchronize(warmup)");
  }

  bool Async() {
    Result("burst", opt_.burst);
    return AsyncCalls("launch_ns", [this] { return Launch(); }) &&
           AsyncCalls("record_ns", [this] { return cuEventRecord(event_, stream_); });
  }

  bool Sync() {
    Result("sync_iters", opt_.sync_iters);
    return SyncCalls("stream_sync_us", [this] { return cuStreamSynchronize(stream_); }) &&
           SyncCalls("ctx_sync_us", [] { return cuCtxSynchronize(); }) &&
           SyncCalls("stream_query_us", [this] { return cuStreamQuery(stream_); }) &&
           SyncCalls("launch_sync_us", [this] {
             const CUresult rc = Launch();
             return rc != CUDA_SUCCESS ? rc : cuStreamSynchronize(stream_);
           });
  }

  bool Bandwidth() {
    std::vector<uint64_t> sizes;
    for (uint64_t s = opt_.min_bytes; s <= opt_.max_bytes; s *= 4) sizes.push_back(s);
    const uint64_t top = sizes.back();
    std::string labels;
    for (uint64_t s : sizes) labels += (labels.empty() ? "" : ",") + SizeLabel(s);
    Result("bw_sizes", labels);
    ResultF("bw_budget_s", opt_.seconds);

    CUdeviceptr device = 0;
    if (!Check(cuMemAlloc(&device, top), "cuMemAlloc(" + SizeLabel(top) + ")")) return false;
    void* pinned = nullptr;
    const CUresult pinned_rc = cuMemAllocHost(&pinned, top);
    if (pinned_rc != CUDA_SUCCESS) {
      Result("pinned_error", "cuMemAllocHost(" + SizeLabel(top) + "):" + CuErrorName(pinned_rc));
      pinned = nullptr;
    }
    auto* pageable = static_cast<unsigned char*>(std::malloc(top));
    if (pageable == nullptr) {
      Result("pageable_error", "malloc(" + SizeLabel(top) + ") failed");
    } else {
      std::memset(pageable, 1, top);  // fault the pages in before timing
    }
    if (pinned != nullptr) std::memset(pinned, 1, top);

    const double points = static_cast<double>(sizes.size() * 4);
    const uint64_t point_ns = static_cast<uint64_t>(0.6 * opt_.seconds / points * 1e9);
    const uint64_t start = NowNs();
    const uint64_t soft_deadline = start + static_cast<uint64_t>(opt_.seconds * 1e9);
    const uint64_t hard_deadline = start + static_cast<uint64_t>(1.5 * opt_.seconds * 1e9);
    bool ok = true;
    for (auto it = sizes.rbegin(); it != sizes.rend(); ++it) {
      const uint64_t size = *it;
      for (int mem = 0; mem < 2 && ok; ++mem) {
        void* host = mem == 0 ? pinned : static_cast<void*>(pageable);
        const std::string kind = mem == 0 ? "pinned" : "pageable";
        for (int dir = 0; dir < 2 && ok; ++dir) {
          const std::string key = std::string(dir == 0 ? "htod_" : "dtoh_") + kind + "_" + SizeLabel(size);
          if (host == nullptr) {
            Result(key + "_gbps", "no-host-buffer");
            continue;
          }
          if (NowNs() >= hard_deadline) {
            Result(key + "_gbps", "skipped");
            continue;
          }
          ok = CopyPoint(key, dir == 0, host, device, size, NowNs() < soft_deadline ? point_ns : 0);
        }
      }
    }
    if (ok && pinned != nullptr && pageable != nullptr) ok = CopyCheck(pinned, pageable, device, std::min(top, 64 * kMiB));
    if (pinned != nullptr) cuMemFreeHost(pinned);
    std::free(pageable);
    cuMemFree(device);
    return ok;
  }

 private:
  CUresult Launch() { return cuLaunchKernel(empty_, 1, 1, 1, 32, 1, 1, 0, stream_, nullptr, nullptr); }

  bool Check(CUresult rc, const std::string& call) {
    if (rc == CUDA_SUCCESS) return true;
    Result("error", call + ":" + CuErrorName(rc));
    return false;
  }

  // Issues opt_.iters calls of `call` in bursts of opt_.burst; only the issuing is timed.
  bool AsyncCalls(const std::string& key, const std::function<CUresult()>& call) {
    std::vector<double> per_call_ns;
    per_call_ns.reserve(opt_.iters / opt_.burst + 1);
    uint64_t issued = 0;
    uint64_t issue_ns = 0;
    while (issued < opt_.iters) {
      const uint64_t n = std::min(opt_.burst, opt_.iters - issued);
      CUresult rc = CUDA_SUCCESS;
      const uint64_t t0 = NowNs();
      for (uint64_t i = 0; i < n && rc == CUDA_SUCCESS; ++i) rc = call();
      const uint64_t t1 = NowNs();
      if (!Check(rc, key + " call") || !Check(cuStreamSynchronize(stream_), key + " cuStreamSynchronize")) {
        return false;
      }
      issued += n;
      issue_ns += t1 - t0;
      per_call_ns.push_back(static_cast<double>(t1 - t0) / static_cast<double>(n));
    }
    Result(key + "_calls", issued);
    ResultF(key + "_mean", static_cast<double>(issue_ns) / static_cast<double>(issued));
    ResultF(key + "_p50", Percentile(per_call_ns, 0.50));
    ResultF(key + "_p99", Percentile(per_call_ns, 0.99));
    return true;
  }

  // Times opt_.sync_iters calls of `call` one by one (after 100 untimed ones), in µs.
  bool SyncCalls(const std::string& key, const std::function<CUresult()>& call) {
    for (int i = 0; i < 100; ++i) {
      if (!Check(call(), key + " warmup")) return false;
    }
    std::vector<double> us;
    us.reserve(opt_.sync_iters);
    for (uint64_t i = 0; i < opt_.sync_iters; ++i) {
      const uint64_t t0 = NowNs();
      const CUresult rc = call();
      const uint64_t t1 = NowNs();
      if (!Check(rc, key + " call")) return false;
      us.push_back(static_cast<double>(t1 - t0) / 1e3);
    }
    Stats(key, us);
    return true;
  }

  // One warm-up copy, then timed copies until `point_ns` has passed (at least two, at most
  // 100,000).
  bool CopyPoint(const std::string& key, bool to_device, void* host, CUdeviceptr device, uint64_t size,
                 uint64_t point_ns) {
    auto copy = [&] {
      return to_device ? cuMemcpyHtoD(device, host, size) : cuMemcpyDtoH(host, device, size);
    };
    if (!Check(copy(), key + " warmup")) return false;
    std::vector<double> us;
    double total_ns = 0;
    const uint64_t start = NowNs();
    while (us.size() < 2 || (NowNs() - start < point_ns && us.size() < 100000)) {
      const uint64_t t0 = NowNs();
      const CUresult rc = copy();
      const uint64_t t1 = NowNs();
      if (!Check(rc, key)) return false;
      total_ns += static_cast<double>(t1 - t0);
      us.push_back(static_cast<double>(t1 - t0) / 1e3);
    }
    ResultF(key + "_gbps", static_cast<double>(size) * static_cast<double>(us.size()) / total_ns);
    ResultF(key + "_us", Percentile(us, 0.5));
    Result(key + "_copies", static_cast<uint64_t>(us.size()));
    return true;
  }

  // pinned -> device -> pageable and pageable -> device -> pinned with a pattern: every byte must
  // come back.
  bool CopyCheck(void* pinned, unsigned char* pageable, CUdeviceptr device, uint64_t size) {
    auto* p = static_cast<unsigned char*>(pinned);
    for (uint64_t i = 0; i < size; ++i) p[i] = static_cast<unsigned char>((i * 2654435761ull) >> 13);
    std::memset(pageable, 0, size);
    if (!Check(cuMemcpyHtoD(device, p, size), "copy_check HtoD") ||
        !Check(cuMemcpyDtoH(pageable, device, size), "copy_check DtoH")) {
      return false;
    }
    bool same = std::memcmp(p, pageable, size) == 0;
    for (uint64_t i = 0; i < size; ++i) pageable[i] = static_cast<unsigned char>(i * 31 + 7);
    std::memset(p, 0, size);
    if (!Check(cuMemcpyHtoD(device, pageable, size), "copy_check HtoD pageable") ||
        !Check(cuMemcpyDtoH(p, device, size), "copy_check DtoH pinned")) {
      return false;
    }
    same = same && std::memcmp(p, pageable, size) == 0;
    Result("copy_check", same ? "ok" : "mismatch");
    Result("copy_check_bytes", size);
    return same;
  }

  const Options opt_;
  CUmodule module_ = nullptr;
  CUfunction empty_ = nullptr;
  CUstream stream_ = nullptr;
  CUevent event_ = nullptr;
};

int Run(const Options& opt) {
  DriverSession session;
  if (!session.ok()) {
    Result("error", session.failed_call() + ":" + CuErrorName(session.rc()));
    return 1;
  }
  char name[256] = {};
  if (cuDeviceGetName(name, sizeof(name), session.device()) == CUDA_SUCCESS) Result("device", name);
  MicroBench bench(opt);
  if (!bench.Setup()) return 1;
  // Every part runs even when an earlier one failed: its numbers are still worth having.
  bool ok = true;
  if (opt.async) ok = bench.Async() && ok;
  if (opt.sync) ok = bench.Sync() && ok;
  if (opt.bandwidth) ok = bench.Bandwidth() && ok;
  Result("status", ok ? "ok" : "error");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace tf::gpu

int main(int argc, char** argv) {
  tf::gpu::Flags flags;
  tf::gpu::Options opt;
  if (!flags.Parse(argc, argv, 1) || !tf::gpu::ParseOptions(flags, &opt)) {
    std::fprintf(stderr,
                 "usage: remote_micro [--parts async,sync,bandwidth] [--iters N] [--burst N] "
                 "[--sync-iters N] [--min-bytes 4KiB] [--max-bytes 1GiB] [--seconds S]\n");
    return 2;
  }
  return tf::gpu::Run(opt);
}
