// What both fakes (libcuda.so.1 and libnvidia-ml.so.1) agree on about the fake devices: how many
// there are, their memory size, their UUIDs, and how much memory the CUDA side has allocated.
#ifndef TF_TESTS_FAKECUDA_FAKE_DEVICE_IDENTITY_H_
#define TF_TESTS_FAKECUDA_FAKE_DEVICE_IDENTITY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fakecuda {

inline constexpr const char* kDeviceName = "Fake GPU H100";
inline constexpr int kMultiprocessorCount = 132;

struct FakeTopology {
  int device_count = 1;             // FAKECUDA_DEVICES, default 1
  uint64_t total_bytes = 16ull << 30;  // FAKECUDA_TOTAL_MIB (MiB), default 16384
};

// Reads the environment; each library calls it once at its init.
FakeTopology ReadTopologyFromEnv();

// The physical devices the CUDA side shows, in ordinal order, as the real driver reads
// CUDA_VISIBLE_DEVICES (unset: all of them): a comma-separated list of indices or UUIDs
// ("GPU-..." as NVML spells them, a unique prefix is enough); the list ends at the first entry
// that names no device or repeats one. The fake NVML ignores it, as the real one does.
std::vector<int> VisibleDevices(int physical_count);

// Deterministic 16-byte UUID for device `index` (the same in both libraries).
void DeviceUuid(int index, unsigned char out[16]);
// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", the NVML spelling of DeviceUuid.
std::string DeviceUuidString(int index);
// "0000:xx:00.0", distinct per index.
std::string DevicePciBusId(int index);

// Device memory in use per fake device, shared across processes through one POSIX shared-memory
// object per device (named "<FAKECUDA_SHM_NAME or fakecuda-<uid>>-dev<N>"). Each process owns one
// slot (its pid and its bytes in use); readers sum the slots of live processes, so a crashed
// process stops counting. Thread-safe: slots are updated with atomics.
class UsageBoard {
 public:
  // Adds `delta` bytes (may be negative) to this process's slot for `device`. Best effort: if
  // shared memory is unavailable the call does nothing.
  static void Add(int device, int64_t delta);
  // Bytes in use on `device` summed over live processes; 0 if nothing was ever recorded.
  static uint64_t Used(int device);
};

}  // namespace fakecuda

#endif  // TF_TESTS_FAKECUDA_FAKE_DEVICE_IDENTITY_H_
