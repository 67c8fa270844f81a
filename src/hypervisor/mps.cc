#include "hypervisor/mps.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tf::hypervisor {

Status CheckMpsPipeDirectory(const std::string& source, const std::string& dir) {
  const std::string what = source + " " + dir;
  if (dir.empty() || dir[0] != '/') return InvalidArgument(what + ": give the MPS pipe directory as an absolute path");
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) return InvalidArgument(what + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return InvalidArgument(what + ": not a directory");
  const std::string control = dir + "/" + kMpsControlPipe;
  if (stat(control.c_str(), &st) != 0 || !(S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) {
    return InvalidArgument(what + ": no MPS control pipe (" + control +
                           ") in it: is nvidia-cuda-mps-control -d running with CUDA_MPS_PIPE_DIRECTORY=" + dir +
                           "? (tfusion never starts or stops the MPS daemon)");
  }
  return Status::Ok();
}

int MpsActiveThreadPercentage(uint64_t limit_ppm) {
  const uint64_t percent = (limit_ppm + 9'999) / 10'000;
  return percent < 1 ? 1 : percent > 100 ? 100 : static_cast<int>(percent);
}

std::vector<std::pair<std::string, std::string>> MpsTenantEnv(const std::string& pipe_dir, uint64_t limit_ppm,
                                                              uint64_t vram_bytes) {
  const uint64_t mib = (vram_bytes + (1u << 20) - 1) >> 20;
  return {{"CUDA_MPS_PIPE_DIRECTORY", pipe_dir},
          {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", std::to_string(MpsActiveThreadPercentage(limit_ppm))},
          {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=" + std::to_string(mib < 1 ? 1 : mib) + "M"}};
}

Status PublishMpsPipeDirectory(const std::string& region_dir, const std::string& pipe_dir) {
  mkdir(region_dir.c_str(), 01777);
  const std::string path = region_dir + "/" + kMpsPublishedFile;
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return Unavailable("cannot write " + tmp + ": " + std::strerror(errno));
  const std::string text = pipe_dir + "\n";
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  fchmod(fd, 0644);  // whatever the umask
  close(fd);
  if (!written || rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    unlink(tmp.c_str());
    return Unavailable("cannot write " + path + ": " + why);
  }
  return Status::Ok();
}

void WithdrawMpsPipeDirectory(const std::string& region_dir) {
  unlink((region_dir + "/" + kMpsPublishedFile).c_str());
}

std::string PublishedMpsPipeDirectory(const std::string& region_dir, std::string* why) {
  why->clear();
  const std::string path = region_dir + "/" + kMpsPublishedFile;
  int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st;
  std::string dir;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    *why = path + " is not a regular file";
  } else if ((st.st_uid != 0 && st.st_uid != geteuid()) || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    *why = path + " is owned by another user or writable by others";
  } else {
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) dir.assign(buf, static_cast<size_t>(n));
    while (!dir.empty() && (dir.back() == '\n' || dir.back() == ' ')) dir.pop_back();
    if (dir.empty() || dir.find('\n') != std::string::npos) {
      *why = path + " does not hold one directory";
      dir.clear();
    }
  }
  close(fd);
  return dir;
}

}  // namespace tf::hypervisor
