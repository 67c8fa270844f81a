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
#include "hypervisor/remote_sessions.h"

namespace tf::cli {

void RunWorkerZeroKeeper(const std::string& libcuda_path, const std::atomic<bool>& stop) {
  std::fprintf(stderr, "tfusion worker: zero keeper (pid %d) checkpoints and restores sessions with %s\n",
               static_cast<int>(getpid()), libcuda_path.c_str());
  // Held as long as this process lives: the node agent passes an allocation's zero requests on to
  // the worker sessions bound to it only while a keeper holds it (hypervisor/remote_sessions.h).
  const int lock = hypervisor::HoldRemoteZeroKeeperLock(RegionDir());
  if (lock < 0) {
    std::fprintf(stderr, "tfusion worker: zero keeper: cannot lock %s (the node agent will refuse scale to zero "
                 "of this worker's pooled sessions)\n", hypervisor::RemoteZeroKeeperLockPath(RegionDir()).c_str());
  }
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
  if (lock >= 0) close(lock);
}

}  // namespace tf::cli
