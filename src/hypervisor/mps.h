// NVIDIA MPS where an operator runs it (docs/compute-sharing.md, "MPS mode"). With an MPS control
// daemon the kernels of different processes run on the GPU at the same time instead of taking
// time slices. We never start or stop a daemon: the operator gives its pipe directory to the node
// agent (`tfusion hypervisor --mps-pipe-dir DIR`) or to `tfusion run` (the same flag, or
// TFUSION_MPS_PIPE_DIRECTORY), and each tenant we start is pointed at it with its compute limit as
// its active thread percentage and its VRAM limit as its pinned device memory limit.
//
// The node agent publishes the directory in a file beside the GPU regions, so that `tfusion run`
// on that machine (pooled or not) uses it without a flag; the file goes when the agent stops.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace tf::hypervisor {

// The environment variable `tfusion hypervisor` and `tfusion run` read when the flag is not given.
inline constexpr const char* kMpsPipeDirEnv = "TFUSION_MPS_PIPE_DIRECTORY";
// The control daemon's pipe, in its pipe directory (a FIFO or socket the daemon creates).
inline constexpr const char* kMpsControlPipe = "control";
// The file, in the region directory, in which the node agent publishes the pipe directory.
inline constexpr const char* kMpsPublishedFile = "mps-pipe-directory";

// Checks that `dir` is a running MPS control daemon's pipe directory as far as a file system can
// tell: it exists, is a directory and holds the control pipe. `source` names where the value came
// from in the message ("--mps-pipe-dir").
Status CheckMpsPipeDirectory(const std::string& source, const std::string& dir);

// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for a compute limit in parts per million of the GPU: the
// percentage rounded up, 1 to 100.
int MpsActiveThreadPercentage(uint64_t limit_ppm);

// What a tenant started under MPS gets: CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
// (from the compute limit) and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (from the VRAM limit, rounded up
// to MiB, for its device 0: the tenant sees its GPU alone).
std::vector<std::pair<std::string, std::string>> MpsTenantEnv(const std::string& pipe_dir, uint64_t limit_ppm,
                                                              uint64_t vram_bytes);

// The node agent's side: writes `pipe_dir` (already checked) into region_dir/kMpsPublishedFile
// (mode 0644, written to a temporary name and renamed), or removes that file.
Status PublishMpsPipeDirectory(const std::string& region_dir, const std::string& pipe_dir);
void WithdrawMpsPipeDirectory(const std::string& region_dir);

// `tfusion run`'s side: the directory the node agent published, or "" when none is. The region
// directory may be writable by every user, so a file that is not owned by root or by this user,
// or that others may write, is ignored (*why says so).
std::string PublishedMpsPipeDirectory(const std::string& region_dir, std::string* why);

}  // namespace tf::hypervisor
