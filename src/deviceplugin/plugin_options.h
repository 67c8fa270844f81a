// The options of `tfusion device-plugin` and their validation. No gRPC here: tfusion parses and
// checks them before it loads the plugin module (device_plugin_command.h).
#pragma once

#include <string>

#include "common/status.h"

namespace tf::deviceplugin {

inline constexpr const char* kApiVersion = "v1beta1";
inline constexpr const char* kKubeletSocket = "kubelet.sock";

struct DevicePluginOptions {
  std::string plugin_dir = "/var/lib/kubelet/device-plugins";
  std::string resource_name = "tensor-fusion.ai/vgpu";
  int devices_per_gpu = 16;
  std::string nvml_library = "libnvidia-ml.so.1";
  // The quota regions: the host folder (empty: $TFUSION_SHM_DIR, else /dev/shm/tensorfusion) and
  // where containers see it.
  std::string host_region_dir;
  std::string container_region_dir = "/dev/shm/tensorfusion";
  double health_interval_seconds = 5;
};

// Refuses options that cannot work, with the flag's name: a resource name the kubelet would
// refuse, a devices-per-gpu out of range, a missing plugin folder, a socket path too long for a
// unix socket, relative region folders, an interval out of range.
Status ValidateOptions(const DevicePluginOptions& o);

// The socket name (in plugin_dir) for a resource: "tensor-fusion.ai/vgpu" -> "tensor-fusion.ai_vgpu.sock".
std::string EndpointFor(const std::string& resource_name);

}  // namespace tf::deviceplugin
