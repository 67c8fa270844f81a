#include "cli/local_vgpu.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "hypervisor/nvml_gpu_source.h"
#include "hypervisor/quota_regions.h"
#include "limiter/core/gpu_region.h"

namespace tf::cli {
namespace {

const char* const kLibFolders[] = {
    "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64", "/usr/lib/wsl/lib",
    "/lib/x86_64-linux-gnu",     "/usr/lib",   "/lib",
};

bool IsFile(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string RealPath(const std::string& p) {
  char buf[PATH_MAX];
  return realpath(p.c_str(), buf) ? std::string(buf) : p;
}

std::string ExeDir() {
  std::string exe = RealPath("/proc/self/exe");
  return exe.substr(0, exe.rfind('/'));
}

// Our own libraries carry the driver's sonames; they must never be taken for the real ones.
bool IsOurs(const std::string& path) {
  std::string rp = RealPath(path);
  return rp.find("libtfusion-") != std::string::npos;
}

}  // namespace

std::string RegionDir() { return hypervisor::DefaultRegionDir(); }

StatusOr<std::string> FindDriverLibrary(const std::string& soname, const std::string& explicit_path,
                                        const char* env_var) {
  if (!explicit_path.empty()) {
    if (!IsFile(explicit_path)) return InvalidArgument(explicit_path + ": no such file");
    if (IsOurs(explicit_path)) return InvalidArgument(explicit_path + " is a TensorFusion library, not the driver");
    return RealPath(explicit_path);
  }
  const char* env = getenv(env_var);
  if (env && *env && IsFile(env) && !IsOurs(env)) return RealPath(env);
  for (const char* dir : kLibFolders) {
    std::string p = std::string(dir) + "/" + soname;
    if (IsFile(p) && !IsOurs(p)) return RealPath(p);
  }
  // Folders the loader would search first (a driver outside the system's folders, as some
  // container images have it), skipping ours.
  if (const char* ld = getenv("LD_LIBRARY_PATH"); ld != nullptr && *ld) {
    std::string paths = ld;
    for (size_t start = 0; start <= paths.size();) {
      size_t end = paths.find(':', start);
      if (end == std::string::npos) end = paths.size();
      std::string dir = paths.substr(start, end - start);
      start = end + 1;
      if (dir.empty()) continue;
      std::string p = dir + "/" + soname;
      if (IsFile(p) && !IsOurs(p)) return RealPath(p);
    }
  }
  // The loader cache knows folders configured in /etc/ld.so.conf.d.
  if (FILE* f = popen("/sbin/ldconfig -p 2>/dev/null", "r")) {
    char line[1024];
    std::string found;
    while (fgets(line, sizeof(line), f)) {
      std::string s(line);
      if (s.find(soname + " ") == std::string::npos) continue;
      auto arrow = s.find("=> ");
      if (arrow == std::string::npos) continue;
      std::string p = s.substr(arrow + 3);
      while (!p.empty() && (p.back() == '\n' || p.back() == ' ')) p.pop_back();
      if (found.empty() && IsFile(p) && !IsOurs(p)) found = p;
    }
    pclose(f);
    if (!found.empty()) return RealPath(found);
  }
  const bool nvml = soname.find("nvidia-ml") != std::string::npos;
  return Unavailable("no NVIDIA driver found on this machine (" + soname + " is not in the system's library " +
                     "folders, LD_LIBRARY_PATH or the loader cache; is this a GPU host?). Where it lives elsewhere, " +
                     "name it with " + (nvml ? "--nvml" : "--driver") + " or " + env_var);
}

namespace {

// The first line of the GPU cache: what its list holds for (this boot, this NVML library, the
// GPUs the driver has now: a GPU added or taken away, or the driver reloaded, makes it stale).
std::string GpuCacheKey(const std::string& nvml_path) {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(boot, id);
  std::vector<std::string> gpus;
  if (DIR* d = opendir("/proc/driver/nvidia/gpus"); d != nullptr) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') gpus.push_back(e->d_name);
    closedir(d);
  }
  std::sort(gpus.begin(), gpus.end());
  std::string key = "# boot " + id + " nvml " + nvml_path + " gpus";
  for (const std::string& g : gpus) key += " " + g;
  return key;
}

// The cache file, opened for reading, when this user (or root) made it and no one else may write
// it: the region folder is open to every user, and another's list could name other GPUs.
bool OpenGpuCache(const std::string& path, std::ifstream* in) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 022) != 0 ||
      (st.st_uid != geteuid() && st.st_uid != 0))
    return false;
  in->open(path);
  return in->is_open();
}

}  // namespace

StatusOr<std::vector<LocalGpu>> DiscoverGpus(const std::string& nvml_path) {
  // One per user: another user's cannot be replaced (the folder is sticky), nor trusted.
  const std::string cache = RegionDir() + "/gpus-" + std::to_string(geteuid()) + ".tsv";
  const std::string key = GpuCacheKey(nvml_path);
  if (std::ifstream in; OpenGpuCache(cache, &in)) {
    std::vector<LocalGpu> gpus;
    std::string line;
    if (!std::getline(in, line) || line != key) in.setstate(std::ios::failbit);  // another boot, or driver
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      LocalGpu g;
      std::string total;
      if (!std::getline(fields, total, '\t')) break;
      g.index = std::atoi(total.c_str());
      if (!std::getline(fields, g.uuid, '\t') || !std::getline(fields, g.name, '\t') ||
          !std::getline(fields, total, '\t')) {
        gpus.clear();
        break;
      }
      g.total_bytes = std::strtoull(total.c_str(), nullptr, 10);
      gpus.push_back(g);
    }
    if (!gpus.empty()) return gpus;
  }
  hypervisor::NvmlGpuSource nvml(nvml_path);
  auto found = nvml.Discover();
  if (!found.ok()) return found.status();
  std::vector<LocalGpu> gpus;
  for (const auto& d : *found) {
    gpus.push_back({d.index, d.uuid, d.name, static_cast<uint64_t>(d.memory_total_mib) << 20});
  }
  if (gpus.empty()) return Unavailable("the NVIDIA driver reports no GPU on this machine");
  // Best effort: the next run skips NVML start-up. Written whole, then renamed.
  mkdir(RegionDir().c_str(), 01777);
  std::string tmp = cache + "." + std::to_string(getpid());
  // A new file of ours, never through a link another user put there (the folder is open to all).
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return gpus;
  fchmod(fd, 0644);  // whatever the umask: read only if no one else may write it
  std::string text = key + '\n';
  for (const auto& g : gpus)
    text += std::to_string(g.index) + '\t' + g.uuid + '\t' + g.name + '\t' + std::to_string(g.total_bytes) + '\n';
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  if (!written || rename(tmp.c_str(), cache.c_str()) != 0) unlink(tmp.c_str());
  return gpus;
}

StatusOr<std::string> InjectDir() {
  std::vector<std::string> candidates;
  if (const char* env = getenv("TFUSION_LIB_DIR"); env && *env) candidates.push_back(std::string(env) + "/inject");
  std::string exe_dir = ExeDir();
  candidates.push_back(exe_dir + "/../limiter/inject");          // build tree
  candidates.push_back(exe_dir + "/../lib/tensorfusion/inject");  // installed
  for (const auto& c : candidates) {
    if (IsFile(c + "/libcuda.so.1")) return RealPath(c);
  }
  return FailedPrecondition("the limiter library is not installed next to tfusion (looked in " +
                            candidates.back() + "; set TFUSION_LIB_DIR)");
}

}  // namespace tf::cli
