// `tfusion device-plugin`: its flags (added to the CLI by AddDevicePluginCommand) and its entry,
// which loads the plugin itself from libtfusion-deviceplugin.so (gRPC and its ~50 libraries are
// loaded by this command only): $TFUSION_LIB_DIR, else beside tfusion in the build tree
// (../deviceplugin/), else ../lib/tensorfusion/ of an installed tfusion.
#pragma once

#include <cstddef>
#include <memory>

#include "deviceplugin/plugin_options.h"

namespace CLI {
class App;
}

namespace tf::deviceplugin {

struct DevicePluginCommand {
  CLI::App* cmd = nullptr;
  std::shared_ptr<DevicePluginOptions> options;  // filled by the parse
};

DevicePluginCommand AddDevicePluginCommand(CLI::App* app);

// Validates the options (exit status 2 with the reason), loads the module and runs the plugin
// until SIGTERM (exit status 1 when the module cannot be loaded).
int RunDevicePluginCommand(const DevicePluginOptions& options);

// The module's entry point, by this name.
using DevicePluginEntry = int (*)(const DevicePluginOptions* options, size_t options_size);
inline constexpr const char* kDevicePluginEntry = "tfusion_device_plugin_run";
inline constexpr const char* kDevicePluginModule = "libtfusion-deviceplugin.so";

}  // namespace tf::deviceplugin
