// Legacy CUDA IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle / cuIpcCloseMemHandle) of movable
// memory. A tiered tenant's cudaMalloc memory is VMM memory (cuMemCreate + cuMemMap, tiering.h),
// for which the driver gives no legacy IPC handle. So the limiter hands out a handle of its own
// (movable_ipc_wire.h: magic, version, the exporter's pid, its secret, an export id and the
// offset of the exported address) and serves it itself:
//
//  - Exporter (IpcExports): the range's physical chunks are created exportable
//    (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR); an export turns each into a file descriptor kept
//    until the range is freed, and a listener thread (started on the first export) answers on an
//    abstract unix socket named after the pid and the secret: a peer of the same uid that names an
//    export id with the right secret gets the chunks' layout and their descriptors (SCM_RIGHTS).
//  - Importer (IpcImports), in every process that loads the limiter, tiered or not: a handle with
//    our magic is opened by asking the exporter (the peer must be the handle's pid, same uid),
//    importing each descriptor, reserving one address range, mapping the chunks and making them
//    readable and writable by the current device; the range's start is returned, as the driver
//    returns an allocation's start. Opening it again in the process returns the same address and
//    counts one more open (the driver's documented behaviour); the last close unmaps and
//    releases. Imported memory is not charged to the importer (it is the exporter's VRAM) and is
//    no movable range of the importer. Any other handle is the driver's.
//
// Every socket operation has a deadline (kIpcTimeoutMs in all for one open, the same for one
// served request), so a dead or stuck peer fails the call, never hangs the tenant; every message
// is checked on both ends. Freeing exported memory while an importer has it mapped: the physical
// memory lives until the importer closes it (VMM semantics).
//
// Thread safety: every member may be called from any thread; each class has its own mutex (an
// open holds the importer's for its whole exchange with the exporter).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tf_driver_api.h"

namespace tf::limiter {

// One open's (or one served request's) time limit, in milliseconds.
inline constexpr int kIpcTimeoutMs = 5000;

class IpcExports {
 public:
  static IpcExports& Instance();

  // Exports the range [base, base + size) backed by the physical allocation `phys` (created with
  // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) and writes our handle for `addr` (inside the range)
  // into *out. The same base again: the same export. The driver's error when the chunk cannot be
  // exported, CUDA_ERROR_OPERATING_SYSTEM when the socket or the listener cannot be set up (then
  // nothing is exported).
  CUresult Export(CUdeviceptr base, size_t size, CUmemGenericAllocationHandle phys, CUdeviceptr addr,
                  CUipcMemHandle* out);
  // The range is freed: its descriptors are closed; importers keep what they mapped.
  void Forget(CUdeviceptr base);
  // In a forked child: no exports, no listener (the parent's serve the parent's).
  void ResetAfterFork();

 private:
  IpcExports() = default;
};

class IpcImports {
 public:
  static IpcImports& Instance();

  // cuIpcOpenMemHandle(_v2): true when `handle` is ours (then *result is the answer and *pdptr the
  // mapped range's start), false for the driver's handles.
  bool Open(CUdeviceptr* pdptr, const CUipcMemHandle& handle, unsigned int flags, CUresult* result);
  // cuIpcCloseMemHandle: true when `dptr` is a range this process opened from our handle.
  bool Close(CUdeviceptr dptr, CUresult* result);
  void ResetAfterFork();

 private:
  IpcImports() = default;
};

}  // namespace tf::limiter
