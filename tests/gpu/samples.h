// What every sample of tests/gpu/samples shares: its outcome, the checks that fill it, the
// deterministic inputs, and the registry through which the samples_surface_*.cu files (compiled
// into the same program) add samples of their own:
//
//   TF_SAMPLE(stream_wait_value) { ... o.Drv(cuStreamWaitValue32(...), "cuStreamWaitValue32"); ... }
//
// registers the sample `stream_wait_value`; it runs after the built-in samples, in name order.
#ifndef TF_TESTS_GPU_SAMPLES_H_
#define TF_TESTS_GPU_SAMPLES_H_

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tf_samples {


struct Outcome {
  bool pass = true;
  std::string detail;
  bool has_result = false;
  uint64_t checksum = 0;

  // Records a failure (the first one's text becomes the detail).
  bool Fail(const std::string& why) {
    if (pass) detail = why;
    pass = false;
    return false;
  }
  bool Rt(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return true;
    return Fail(std::string(what) + ": " + cudaGetErrorName(e));
  }
  bool Drv(CUresult r, const char* what) {
    if (r == CUDA_SUCCESS) return true;
    const char* name = nullptr;
    cuGetErrorName(r, &name);
    return Fail(std::string(what) + ": " + (name ? name : "?") + " (" + std::to_string(r) + ")");
  }
  void Result(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    uint64_t h = has_result ? checksum : 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    checksum = h;
    has_result = true;
  }
};

#define RT(o, call) \
  if (!(o).Rt((call), #call)) return
#define DRV(o, call) \
  if (!(o).Drv((call), #call)) return

// Deterministic inputs: small multiples of 1/4, so float sums and products are exact.
inline float Input(size_t i, int salt) {
  return static_cast<float>(static_cast<int>((i * 7 + salt * 13) % 9) - 4) * 0.25f;
}

struct Sample {
  const char* name;
  void (*run)(Outcome&);
};

// The samples registered by TF_SAMPLE, in no particular order.
inline std::vector<Sample>& RegistryOf() {
  static std::vector<Sample> samples;
  return samples;
}
inline std::vector<Sample> Registered() { return RegistryOf(); }
inline bool Register(const char* name, void (*run)(Outcome&)) {
  RegistryOf().push_back({name, run});
  return true;
}

}  // namespace tf_samples

#define TF_SAMPLE(name)                                                                \
  static void tf_sample_##name(tf_samples::Outcome& o);                                \
  static const bool tf_sample_registered_##name = tf_samples::Register(#name, tf_sample_##name); \
  static void tf_sample_##name(tf_samples::Outcome& o)

#endif  // TF_TESTS_GPU_SAMPLES_H_
