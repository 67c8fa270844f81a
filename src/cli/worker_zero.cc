// The zero keeper of `tfusion worker --tiering`: see worker_zero.h.
#include "cli/worker_zero.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "cli/local_vgpu.h"
#include "hypervisor/process_checkpoint.h"
#include "hypervisor/quota_regions.h"

namespace tf::cli {

void RunWorkerZeroKeeper(const std::string& libcuda_path, const std::atomic<bool>& stop) {
  std::fprintf(stderr, "tfusion worker: zero keeper (pid %d) checkpoints and restores sessions with %s\n",
               static_cast<int>(getpid()), libcuda_path.c_str());
  std::vector<std::string> paths;
  std::unique_ptr<hypervisor::ZeroRestorer> keeper;
  while (!stop.load()) {
    std::vector<std::string> now = hypervisor::RegionFiles(RegionDir());
    if (now != paths || !keeper) {
      // A new region (the first session of a GPU made it): watch it too. The idle policy's
      // memory of failed attempts starts afresh, which at worst tries a checkpoint once more.
      if (keeper) keeper->Stop();
      paths = now;
      keeper = std::make_unique<hypervisor::ZeroRestorer>(libcuda_path, paths, "", "remote-",
                                                          "tfusion worker (zero keeper)");
      keeper->Start();
    }
    for (int i = 0; i < 10 && !stop.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (keeper) keeper->Stop();
}

}  // namespace tf::cli
