// `tfusion run`: runs a command on a local vGPU (VRAM ceiling and compute share enforced by the
// limiter injected in front of the driver).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cli/compute_flags.h"
#include "common/status.h"

namespace tf::cli {

struct RunOptions {
  std::string vram;      // "8GiB"; empty = the whole GPU
  std::string tflops;    // compute request, FP16 dense TFLOPS; exclusive with percent
  std::string percent;   // compute request, percent of the GPU (0, 100]
  std::string tflops_limit;   // compute ceiling (burst), TFLOPS; empty = the request
  std::string percent_limit;  // compute ceiling (burst), percent; empty = the request
  int gpu = 0;           // NVML index of the physical GPU (as nvidia-smi numbers them)
  std::string gpu_uuid;  // the physical GPU by UUID instead ("GPU-..."); wins over gpu
  std::string vgpu;      // vGPU id shared by several processes; empty = a private one
  std::string driver;    // the real libcuda.so.1 (default: found on this machine)
  std::string nvml;      // the real libnvidia-ml.so.1 (default: found on this machine)
  std::string controller;  // controller URL: the vGPU is placed by the pool when reachable
  std::string token;       // the controller's API token
  std::string worker_token;  // token of the worker a remote placement runs through; empty: token
  std::string pool;        // pool to place in (controller default when empty)
  std::string qos;         // low | medium | high | critical (medium when empty)
  std::string tenant;      // whose quota the allocation counts against (none when empty)
  bool tiering = false;    // movable VRAM: the vGPU can be frozen (swapped to host memory) and thawed
  std::string idle_swap;   // swap out after this long idle ("10s", "0"/"never"); default by QoS
  std::string disk_tier;   // folder for the disk tier (swapped copies moved on from host memory)
  std::string idle_disk;   // move to the disk tier after this long idle; default by QoS
  std::string idle_zero;   // scale to zero (driver checkpoint) after this long idle; default never
  // The MPS daemon's pipe directory (hypervisor/mps.h); empty: the one the node agent published,
  // if any. For PrepareVgpu: the directory already chosen and checked; empty: no MPS.
  std::string mps_pipe_dir;
  std::vector<std::string> command;
};

// Validates, prepares the vGPU, runs the command and returns its exit status (128+signal when
// it was killed). Problems before the command starts are reported on stderr with exit status 2.
int RunCommand(const RunOptions& options);

// A vGPU made for another process (a remote client's session in `tfusion worker`): the limits
// of `o` (vram, compute request/limit and qos, GPU `o.gpu_uuid` or else `o.gpu`) in the GPU's region under `vgpu_id`, and what a
// process needs to run on it: the limiter to load as its driver and the environment to set.
struct PreparedVgpu {
  std::string limiter;
  std::string region_path;
  std::vector<std::pair<std::string, std::string>> env;
};
// The environment pins the process to that GPU alone (CUDA_VISIBLE_DEVICES=its UUID), so it is
// the process's device 0. A GPU this machine does not have is an error, never another GPU.
// With o.mps_pipe_dir it also holds the MPS client environment of the vGPU's limits
// (hypervisor::MpsTenantEnv).
StatusOr<PreparedVgpu> PrepareVgpu(const RunOptions& o, const std::string& vgpu_id);

// The MPS daemon a tenant started by `program` ("tfusion run", "tfusion worker") goes under:
// `flag_value` (--mps-pipe-dir), else $TFUSION_MPS_PIPE_DIRECTORY, both checked (an error: the
// reason); else the directory the node agent published, while it still looks like a running
// daemon's (else "" and a message on stderr). "": no MPS.
StatusOr<std::string> ChooseMpsPipeDirectory(const std::string& flag_value, const std::string& program);
// Only the node agent's part of that (never an error: "" and a message when it is not usable).
std::string PublishedMpsPipeDirectoryIfRunning(const std::string& program);

// `--gpu` as typed: an index (digits) or a UUID ("GPU-..."), into o->gpu or o->gpu_uuid.
Status ParseGpuSelector(const std::string& text, RunOptions* o);
// Removes vGPU `vgpu_id` from every GPU region of this machine once its processes are gone (a
// live one keeps it: busy; hypervisor::RemoveUnusedVgpu).
void RemoveVgpuEverywhere(const std::string& vgpu_id);

// The compute flags of `o`.
ComputeFlags ComputeFlagsOf(const RunOptions& o);

// `tfusion smi`: every vGPU of every GPU region on this machine: VRAM, compute request and limit,
// current use (GPU-busy time over `sample_seconds` between two snapshots, as percent of the GPU;
// 0: no sampling) and time throttled.
int SmiCommand(bool all_processes, double sample_seconds = 0.5);

// `tfusion freeze VGPU` / `tfusion thaw VGPU`: asks every process of a local vGPU with tiering to
// swap its VRAM out to host memory (or back in) and waits up to timeout_s for all of them,
// printing what each did. Exit status 0 when every process did it, 1 when one failed, 2 for bad
// input (unknown vGPU, tiering off, a swap already in progress).
// "resident", "swapped", ... for a limiter::TierState ("off" when tiering is not used).
const char* TierStateText(uint32_t state);
int FreezeCommand(const std::string& vgpu, bool freeze, double timeout_s, bool wait);

// Scale to zero. freeze with `zero`: after every process is swapped out, each is checkpointed by
// the driver from this process (its context and fixed VRAM leave the GPU); thaw restores
// checkpointed processes first. `driver`: the real libcuda (else TFUSION_REAL_LIBCUDA, else the
// system's). A process whose checkpoint fails stays swapped (exit status 1).
struct ZeroOptions {
  bool zero = false;
  std::string driver;
};
int FreezeCommand(const std::string& vgpu, bool freeze, double timeout_s, bool wait, const ZeroOptions& zero);

}  // namespace tf::cli
