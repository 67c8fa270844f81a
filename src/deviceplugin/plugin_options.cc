#include "deviceplugin/plugin_options.h"

#include <sys/stat.h>
#include <sys/un.h>

#include <regex>
#include <utility>

#include "deviceplugin/vgpu_devices.h"

namespace tf::deviceplugin {
namespace {

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

std::string EndpointFor(const std::string& resource_name) {
  std::string name = resource_name;
  for (char& c : name)
    if (c == '/') c = '_';
  return name + ".sock";
}

Status ValidateOptions(const DevicePluginOptions& o) {
  // An extended resource name, as the kubelet checks it: "domain/name", the domain a DNS
  // subdomain outside kubernetes.io, the name a qualified-name part.
  static const std::regex kDomain("[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*");
  static const std::regex kName("[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?");
  const std::string& r = o.resource_name;
  size_t slash = r.find('/');
  std::string domain = slash == std::string::npos ? "" : r.substr(0, slash);
  std::string name = slash == std::string::npos ? "" : r.substr(slash + 1);
  if (slash == std::string::npos || domain.size() > 253 || name.size() > 63 || !std::regex_match(domain, kDomain) ||
      !std::regex_match(name, kName) || domain == "kubernetes.io" ||
      (domain.size() > 14 && domain.compare(domain.size() - 14, 14, ".kubernetes.io") == 0) ||
      r.rfind("requests.", 0) == 0) {
    return InvalidArgument("--resource-name " + r +
                           ": not an extended resource name the kubelet accepts (DOMAIN/NAME, e.g. "
                           "tensor-fusion.ai/vgpu; the domain lower-case and not kubernetes.io)");
  }
  if (o.devices_per_gpu < 1 || o.devices_per_gpu > kMaxDevicesPerGpu) {
    return InvalidArgument("--devices-per-gpu " + std::to_string(o.devices_per_gpu) + ": must be 1 to " +
                           std::to_string(kMaxDevicesPerGpu));
  }
  if (o.plugin_dir.empty() || o.plugin_dir[0] != '/' || !IsDirectory(o.plugin_dir)) {
    return InvalidArgument("--plugin-dir " + o.plugin_dir + ": not an existing folder given by its absolute path "
                           "(the kubelet's device-plugin folder)");
  }
  const std::string socket = o.plugin_dir + "/" + EndpointFor(r);
  if (socket.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return InvalidArgument("--plugin-dir " + o.plugin_dir + ": the socket path " + socket + " is longer than a unix socket allows (" +
                           std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + " characters)");
  }
  for (auto [flag, dir] : {std::pair{"--host-shm-dir", &o.host_region_dir},
                           std::pair{"--container-shm-dir", &o.container_region_dir}}) {
    if (!dir->empty() && (dir->at(0) != '/' || dir->find(',') != std::string::npos || dir->find(':') != std::string::npos))
      return InvalidArgument(std::string(flag) + " " + *dir + ": must be an absolute path without ',' or ':'");
  }
  if (o.container_region_dir.empty()) return InvalidArgument("--container-shm-dir: must not be empty");
  if (!(o.health_interval_seconds >= 0.05 && o.health_interval_seconds <= 3600)) {
    return InvalidArgument("--health-interval " + std::to_string(o.health_interval_seconds) +
                           ": must be 0.05 to 3600 seconds");
  }
  return Status::Ok();
}

}  // namespace tf::deviceplugin
