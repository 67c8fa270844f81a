// RegionError: the error currency of the per-GPU shared-memory region (src/limiter/core).
//
// This library loads into arbitrary tenant processes, so it cannot use tf::Status (which allocates
// std::string and lives in tf_common). Callers outside the data plane convert a RegionError plus
// its RegionErrorDetail into a Status at their edge.
#pragma once

#include <cstdint>

namespace tf::limiter {

enum class RegionError : uint8_t {
  kOk = 0,
  kInvalidArgument,  // bad index, empty or over-long id/uuid, zero share, ...
  kNotFound,         // no such file, vGPU id or process
  kIo,               // a system call failed; RegionErrorDetail::sys_errno says which errno
  kBadMagic,         // the file is not a TensorFusion GPU region
  kVersionMismatch,  // layout_version differs from kLayoutVersion: refused, never ignored
  kLayoutMismatch,   // same version but a header/slot/total size differs (ABI drift)
  kTruncated,        // the file is shorter than the layout it declares
  kIncompatibleGpu,  // existing region was made for another GPU (uuid or total VRAM differ)
  kFull,             // no free vGPU or process slot (after reaping dead processes)
  kOutOfMemory,      // the VRAM reservation would exceed the vGPU's limit
  kBusy,             // a robust lock was not acquired within its timeout, or vGPU still in use
  kNotHolder,        // ReleaseLease by a process that no longer holds the lease (it was stolen)
  kUnrecoverable,    // a robust mutex became ENOTRECOVERABLE; the region must be recreated
};

// Stable lower-case name ("version_mismatch") for logs and the CLI. Never null.
const char* RegionErrorName(RegionError e);

// Optional out-parameter of Create/Attach: a human-readable reason ("layout_version 2, this
// build understands 1") and the errno of the failing call (0 when none).
struct RegionErrorDetail {
  int sys_errno = 0;
  char message[256] = {};
};

}  // namespace tf::limiter
