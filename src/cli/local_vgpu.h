// LocalVgpu: what `tfusion run` needs to put a process on a local vGPU: the real driver
// libraries, the GPU (discovered through NVML, cached per boot), its shared region, and the
// vGPU's slot in it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace tf::cli {

struct LocalGpu {
  int index = 0;
  std::string uuid;
  std::string name;
  uint64_t total_bytes = 0;
};

// The folder holding the per-GPU regions: $TFUSION_SHM_DIR or /dev/shm/tensorfusion.
std::string RegionDir();

// Finds a real driver library ("libcuda.so.1" or "libnvidia-ml.so.1"): the explicit path, else
// the environment variable, else well-known folders, else the loader cache. Never returns one of
// our own libraries. kUnavailable with an explanation when none exists.
StatusOr<std::string> FindDriverLibrary(const std::string& soname, const std::string& explicit_path,
                                        const char* env_var);

// GPUs of this machine through NVML (cached per user in RegionDir()/gpus-UID.tsv for this boot and NVML library).
StatusOr<std::vector<LocalGpu>> DiscoverGpus(const std::string& nvml_path);

// The folder `tfusion run` puts first on LD_LIBRARY_PATH (libcuda.so.1 -> the limiter).
StatusOr<std::string> InjectDir();

}  // namespace tf::cli
