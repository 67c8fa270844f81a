// The few NVML calls the GPU tier needs, declared here (nvml.h is not on the development
// machine) and loaded with dlopen so the programs run where NVML is absent.
#ifndef TF_TESTS_GPU_NVML_PROBE_H_
#define TF_TESTS_GPU_NVML_PROBE_H_

#include <cstdint>
#include <string>

namespace tf::gpu {

struct NvmlMemory {
  uint64_t total = 0;
  uint64_t free = 0;
  uint64_t used = 0;
  uint64_t reserved = 0;  // v2 only
};

// Not thread-safe. Loads libnvidia-ml.so.1 on Open() and shuts NVML down on destruction.
class NvmlProbe {
 public:
  NvmlProbe() = default;
  ~NvmlProbe();
  NvmlProbe(const NvmlProbe&) = delete;
  NvmlProbe& operator=(const NvmlProbe&) = delete;

  // Loads the library, initializes NVML and finds the device whose UUID is `uuid` (the 16 raw
  // bytes of cuDeviceGetUuid). On failure error() says why.
  bool Open(const unsigned char uuid[16]);
  // nvmlDeviceGetMemoryInfo (v1) and nvmlDeviceGetMemoryInfo_v2; false when unavailable.
  bool MemoryV1(NvmlMemory* out);
  bool MemoryV2(NvmlMemory* out);
  // The file that nvmlDeviceGetMemoryInfo was resolved from (dladdr), for the log.
  std::string MemoryInfoLibrary() const;
  const std::string& error() const { return error_; }

 private:
  void* lib_ = nullptr;
  void* device_ = nullptr;
  bool initialized_ = false;
  std::string error_;
};

}  // namespace tf::gpu

#endif  // TF_TESTS_GPU_NVML_PROBE_H_
