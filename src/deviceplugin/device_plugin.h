// The kubelet device plugin (`tfusion device-plugin`): serves the v1beta1 DevicePlugin service on
// a unix socket in the kubelet's device-plugin folder, registers the vGPU resource with the
// kubelet, streams the devices of VgpuDeviceTable and their health, and answers Allocate with
// what binds a container to its GPU (vgpu_devices.h).
//
// Life cycle (DevicePlugin::Run): serve, register, then every tick (100 ms): re-create the socket
// and register again when the kubelet restarted (it deletes the plugin sockets and makes a new
// kubelet.sock), re-discover the GPUs every health interval, and return on SIGTERM, SIGINT or
// SIGHUP, with the streams ended and the socket removed.
//
// gRPC lives only here: this code is built into libtfusion-deviceplugin.so, which `tfusion
// device-plugin` loads (device_plugin_command.h), so no other tfusion command loads gRPC.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"
#include "deviceplugin/plugin_options.h"
#include "deviceplugin/vgpu_devices.h"
#include "hypervisor/gpu_source.h"

namespace tf::deviceplugin {

// The device list and its change counter, shared by the health loop (writer) and every gRPC call
// (readers). Thread safe: everything under mu_.
class DeviceState {
 public:
  DeviceState(int devices_per_gpu, RegionMount regions) : table_(devices_per_gpu), regions_(std::move(regions)) {}

  // Re-discovers the GPUs through `source` and updates their health; logs GPUs that come, go
  // or come back. Returns false when neither discovery nor sampling worked (no driver).
  bool Refresh(hypervisor::GpuSource& source);

  // The list and its generation (bumped at every change).
  std::vector<VgpuDevice> Devices(uint64_t* generation) const;
  // Blocks until the generation differs from `seen`, `wake` is set or `timeout_ms` passed.
  void WaitForChange(uint64_t seen, const std::atomic<bool>& wake, int timeout_ms) const;
  void WakeAll() const { changed_.notify_all(); }

  StatusOr<ContainerBinding> Bind(const std::vector<std::string>& ids) const;
  StatusOr<std::vector<std::string>> Prefer(const std::vector<std::string>& available,
                                            const std::vector<std::string>& must_include, int size) const;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  VgpuDeviceTable table_;
  const RegionMount regions_;
  uint64_t generation_ = 0;
  std::string last_problem_;  // the last discovery failure logged, to log each one once
};

class DevicePlugin {
 public:
  // `make_source` makes the GPU source (again after a discovery that found no driver).
  DevicePlugin(DevicePluginOptions options,
               std::function<std::unique_ptr<hypervisor::GpuSource>()> make_source);
  ~DevicePlugin();

  // Runs until SIGTERM, SIGINT or SIGHUP (blocked in the calling thread and, through it, in
  // every thread it starts; call it before starting other threads). Returns the exit status:
  // 0 after a signal, 1 when the socket cannot be served.
  int Run();

 private:
  class Service;
  Status Serve();            // (re)creates the socket and the gRPC server
  void StopServing();        // ends the streams, stops the server, removes the socket
  Status Register() const;   // one Register call to the kubelet

  const DevicePluginOptions options_;
  const std::string socket_path_;
  const std::string kubelet_socket_;
  std::function<std::unique_ptr<hypervisor::GpuSource>()> make_source_;
  DeviceState state_;
  struct Server;
  std::unique_ptr<Server> server_;
};

}  // namespace tf::deviceplugin
