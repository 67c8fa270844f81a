// Payloads of the stream-memory-operation family of the remote vGPU protocol (client_memops.cc,
// worker session_memops.cc). Fields are little-endian, written with transport::Writer and read
// with Reader. The worker checks every address against the session's device memory, every
// operation and flag against cuda.h, and every handle against its session's table before it
// calls the driver. docs/remote.md "Stream memory operations, batches, pools and peers".
//
//   cuStreamBatchMemOp_v2 (fire-and-forget; the legacy form and _ptsz send it too)
//       u64 stream, u32 count (1..kMaxBatchMemOps), u32 flags (0),
//       count x (u32 CUstreamBatchMemOpType, u32 the operation's flags, u64 address, u64 value)
//       (address and value are 0 for barriers and flushes; a 32-bit value in the low half)
//
// A location (LOC below) is u32 CUmemLocationType, i32 id; the remote vGPU serves device
// locations of the session only (the client refuses host ones before sending).
//   cuMemGetAllocationPropertiesFromHandle  u64 handle -> u32 type, u32 handle types, LOC,
//                                           u8 compression, u8 RDMA, u16 usage
//   cuMemRetainAllocationHandle             u64 address (in a cuMemMap range) -> u64 handle (the
//                                           name cuMemCreate gave; one more cuMemRelease is owed)
//   cuPointerSetAttribute                   u64 address (device memory of the session), u32 value
//                                           (CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, the only settable one)
//
// cuStreamWaitValue32/64_v2, cuStreamWriteValue32/64_v2, cuMemcpyPeer(Async),
// cuCtxEnablePeerAccess/DisablePeerAccess, cuStreamCopyAttributes, cuDeviceSetMemPool,
// cuDeviceGetMemPool (new=pool: published as the session's pool), pools by location
// (cuMemGetDefaultMemPool, cuMemGetMemPool, cuMemSetMemPool: loc=, unserved= for managed-memory
// pools, values= for the pinned type), pool access (cuMemPoolGetAccess/SetAccess, loc=: the
// locations checked as LOC above), cuMemGetAccess (loc=, vmm=: an address in a cuMemMap range) and the
// atomic-capability queries (count=capabilities:count:64) are generated (api/remote_surface.tsv).
// Batched copies, prefetches and discards never travel as
// such: the client sends each copy through the copy paths of its kind (client_memops.cc).
#pragma once

#include <cstdint>

namespace tf::remote {

// The most operations one cuStreamBatchMemOp may carry (the driver's documented maximum).
inline constexpr uint32_t kMaxBatchMemOps = 256;

}  // namespace tf::remote
