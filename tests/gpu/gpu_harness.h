// Shared plumbing for the GPU-tier programs (tests/gpu, bench/gpu): flag parsing, byte sizes,
// the `RESULT key=value` output contract, a primary-context session and file barriers used by
// the Python and shell coordinators.
//
// Every program of the tier talks to the driver API only (NEEDED libcuda.so.1), so that the
// dynamic loader decides whether it gets the real driver or the limiter in front of it.
#ifndef TF_TESTS_GPU_GPU_HARNESS_H_
#define TF_TESTS_GPU_GPU_HARNESS_H_

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tf::gpu {

constexpr uint64_t kMiB = 1024ull * 1024ull;
constexpr uint64_t kGiB = 1024ull * kMiB;

// Parses "64MiB", "2GiB", "512KiB", "4096" (bytes). Returns false on anything else.
bool ParseBytes(const std::string& text, uint64_t* bytes);

// `--name value` pairs after the subcommand; a flag without a value is an error.
class Flags {
 public:
  // Returns false (and prints why) on a malformed command line.
  bool Parse(int argc, char** argv, int first);
  bool Has(const std::string& name) const { return values_.count(name) != 0; }
  std::string Str(const std::string& name, const std::string& fallback) const;
  uint64_t Bytes(const std::string& name, uint64_t fallback) const;
  double Num(const std::string& name, double fallback) const;
  // Prints every flag not in `known` and returns false if there was one (a misspelt flag must
  // not silently fall back to its default).
  bool OnlyKnown(const std::vector<std::string>& known) const;
  // Flags that failed to parse as numbers or sizes, in the order they were asked for.
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  std::map<std::string, std::string> values_;
  mutable std::vector<std::string> errors_;
};

// Prints every flag value that failed to parse; false if there was one. Call after reading all
// flags and before touching the GPU.
bool FlagsOk(const Flags& flags);

// Machine-readable output: one `RESULT key=value` line per call, flushed at once so that a
// killed process still leaves what it measured.
void Result(const std::string& key, const std::string& value);
void Result(const std::string& key, uint64_t value);
void ResultF(const std::string& key, double value);

// "CUDA_ERROR_OUT_OF_MEMORY" or "CUresult(N)" when the driver has no name for it.
std::string CuErrorName(CUresult rc);

// The value below which a fraction `p` (0..1) of `values` lies (nearest rank); 0 when empty.
double Percentile(std::vector<double> values, double p);

// Nanoseconds of CLOCK_MONOTONIC.
uint64_t NowNs();

// cuInit, device `ordinal`, primary context retained and made current. Check ok() before use.
class DriverSession {
 public:
  explicit DriverSession(int ordinal = 0);
  ~DriverSession();
  DriverSession(const DriverSession&) = delete;
  DriverSession& operator=(const DriverSession&) = delete;

  bool ok() const { return rc_ == CUDA_SUCCESS; }
  CUresult rc() const { return rc_; }
  const std::string& failed_call() const { return failed_call_; }
  CUdevice device() const { return device_; }
  CUcontext context() const { return ctx_; }
  int Attribute(CUdevice_attribute attr) const;

 private:
  CUresult rc_ = CUDA_SUCCESS;
  std::string failed_call_;
  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
  bool retained_ = false;
};

// Writes `content` to `path` through a temporary file and rename, so a reader never sees a
// partial file. Returns false on any I/O error.
bool WriteFileAtomic(const std::string& path, const std::string& content);
// Polls every millisecond until `path` exists; false after `timeout_s` seconds.
bool WaitForFile(const std::string& path, double timeout_s);

// Loads a fatbin image (embedded by tf_gpu_embed_fatbin) into the current context.
CUresult LoadModule(const unsigned char* image, CUmodule* module);

}  // namespace tf::gpu

#endif  // TF_TESTS_GPU_GPU_HARNESS_H_
