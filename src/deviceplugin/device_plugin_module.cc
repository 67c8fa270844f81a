// The entry point of libtfusion-deviceplugin.so, the one symbol it exports (module.map).
#include <cstdio>

#include "deviceplugin/device_plugin.h"
#include "hypervisor/nvml_gpu_source.h"

extern "C" __attribute__((visibility("default"))) int tfusion_device_plugin_run(
    const tf::deviceplugin::DevicePluginOptions* options, size_t options_size) {
  using tf::deviceplugin::DevicePluginOptions;
  if (options == nullptr || options_size != sizeof(DevicePluginOptions)) {
    std::fprintf(stderr, "tfusion device-plugin: libtfusion-deviceplugin.so is from another build of tfusion\n");
    return 1;
  }
  tf::deviceplugin::DevicePlugin plugin(*options, [library = options->nvml_library] {
    return std::make_unique<tf::hypervisor::NvmlGpuSource>(library);
  });
  return plugin.Run();
}
