#include "deviceplugin/device_plugin_command.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace tf::deviceplugin {
namespace {

std::string ExeDir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string exe(buf, static_cast<size_t>(n));
  return exe.substr(0, exe.rfind('/'));
}

}  // namespace

DevicePluginCommand AddDevicePluginCommand(CLI::App* app) {
  DevicePluginCommand c;
  c.options = std::make_shared<DevicePluginOptions>();
  DevicePluginOptions* o = c.options.get();
  c.cmd = app->add_subcommand("device-plugin",
                              "kubelet device plugin: advertise this node's GPUs as vGPU devices and bind "
                              "containers to them");
  c.cmd->add_option("--plugin-dir", o->plugin_dir, "the kubelet's device-plugin folder (holds kubelet.sock)")
      ->capture_default_str();
  c.cmd->add_option("--resource-name", o->resource_name, "extended resource the devices make up")
      ->capture_default_str();
  c.cmd->add_option("--devices-per-gpu", o->devices_per_gpu, "vGPU devices advertised per physical GPU")
      ->capture_default_str();
  c.cmd->add_option("--nvml", o->nvml_library, "NVML library to discover the GPUs with")->capture_default_str();
  c.cmd->add_option("--host-shm-dir", o->host_region_dir,
                    "host folder of the quota regions, mounted into containers (default: $TFUSION_SHM_DIR, "
                    "else /dev/shm/tensorfusion)");
  c.cmd->add_option("--container-shm-dir", o->container_region_dir, "where containers see that folder")
      ->capture_default_str();
  c.cmd->add_option("--health-interval", o->health_interval_seconds,
                    "seconds between two GPU health checks")
      ->capture_default_str();
  return c;
}

int RunDevicePluginCommand(const DevicePluginOptions& options) {
  Status valid = ValidateOptions(options);
  if (!valid.ok()) {
    std::fprintf(stderr, "tfusion device-plugin: %s\n", valid.message().c_str());
    return 2;
  }
  std::vector<std::string> candidates;
  if (const char* env = getenv("TFUSION_LIB_DIR"); env && *env) candidates.push_back(env);
  const std::string exe_dir = ExeDir();
  candidates.push_back(exe_dir + "/../deviceplugin");       // build tree
  candidates.push_back(exe_dir + "/../lib/tensorfusion");   // installed
  std::string tried;
  for (const std::string& dir : candidates) {
    const std::string path = dir + "/" + kDevicePluginModule;
    if (access(path.c_str(), R_OK) != 0) {
      tried += (tried.empty() ? "" : ", ") + dir;
      continue;
    }
    void* module = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    auto entry = module ? reinterpret_cast<DevicePluginEntry>(dlsym(module, kDevicePluginEntry)) : nullptr;
    if (entry == nullptr) {
      const char* err = dlerror();
      std::fprintf(stderr, "tfusion device-plugin: cannot load %s: %s\n", path.c_str(), err ? err : "no entry point");
      return 1;
    }
    return entry(&options, sizeof(options));
  }
  std::fprintf(stderr, "tfusion device-plugin: %s is not installed next to tfusion (looked in %s; set TFUSION_LIB_DIR)\n",
               kDevicePluginModule, tried.c_str());
  return 1;
}

}  // namespace tf::deviceplugin
