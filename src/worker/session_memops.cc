// Batches of stream memory operations and the settable pointer attribute (session_memops.h).
#include "worker/session_memops.h"

#include <vector>

#include "client/remote_memops.h"

namespace tf::worker {

using driver::Fn;
using transport::Reader;
using transport::Writer;

namespace {

constexpr uint32_t kWaitFlags = 0x3 | CU_STREAM_WAIT_VALUE_FLUSH;  // condition, then FLUSH
constexpr uint32_t kWriteFlags = CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER;

}  // namespace

bool SessionMemops::Handles(Fn fn) {
  switch (fn) {
    case Fn::cuStreamBatchMemOp_v2:
    case Fn::cuPointerSetAttribute:
      return true;
    default:
      return false;
  }
}

CUresult SessionMemops::Call(Fn fn, Reader& rd, Writer& out) {
  if (fn == Fn::cuStreamBatchMemOp_v2) return BatchMemOp(rd);
  (void)out;  // neither has outputs
  if (fn == Fn::cuPointerSetAttribute) return SetAttribute(rd);
  return CUDA_ERROR_NOT_SUPPORTED;
}

// u64 address, u32 value: CU_POINTER_ATTRIBUTE_SYNC_MEMOPS of device memory of the session.
CUresult SessionMemops::SetAttribute(Reader& rd) {
  uint64_t p = 0;
  uint32_t v = 0;
  rd.U64(&p);
  if (!rd.U32(&v) || !rd.Finish() || v > 1 || !host_.DeviceRange(p, 1)) return CUDA_ERROR_INVALID_VALUE;
  if (d_.cuPointerSetAttribute == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  unsigned value = v;
  return d_.cuPointerSetAttribute(&value, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p);
}

// u64 stream, u32 count, u32 flags, count x (u32 operation, u32 flags, u64 address, u64 value)
CUresult SessionMemops::BatchMemOp(Reader& rd) {
  uint64_t s = 0;
  uint32_t count = 0, flags = 0;
  rd.U64(&s);
  rd.U32(&count);
  if (!rd.U32(&flags) || count == 0 || count > remote::kMaxBatchMemOps || flags != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::vector<CUstreamBatchMemOpParams> ops(count);
  for (CUstreamBatchMemOpParams& op : ops) {
    uint32_t kind = 0, op_flags = 0;
    uint64_t address = 0, value = 0;
    rd.U32(&kind);
    rd.U32(&op_flags);
    rd.U64(&address);
    if (!rd.U64(&value)) return CUDA_ERROR_INVALID_VALUE;
    op = CUstreamBatchMemOpParams{};
    op.operation = static_cast<CUstreamBatchMemOpType>(kind);
    switch (kind) {
      case CU_STREAM_MEM_OP_WAIT_VALUE_32:
      case CU_STREAM_MEM_OP_WAIT_VALUE_64: {
        const uint64_t n = kind == CU_STREAM_MEM_OP_WAIT_VALUE_32 ? 4 : 8;
        if ((op_flags & ~kWaitFlags) != 0 || !host_.DeviceRange(address, n)) return CUDA_ERROR_INVALID_VALUE;
        if (n == 4 && value > UINT32_MAX) return CUDA_ERROR_INVALID_VALUE;
        op.waitValue.address = address;
        op.waitValue.flags = op_flags;
        if (n == 4) op.waitValue.value = static_cast<cuuint32_t>(value);
        else op.waitValue.value64 = value;
        break;
      }
      case CU_STREAM_MEM_OP_WRITE_VALUE_32:
      case CU_STREAM_MEM_OP_WRITE_VALUE_64: {
        const uint64_t n = kind == CU_STREAM_MEM_OP_WRITE_VALUE_32 ? 4 : 8;
        if ((op_flags & ~kWriteFlags) != 0 || !host_.DeviceRange(address, n)) return CUDA_ERROR_INVALID_VALUE;
        if (n == 4 && value > UINT32_MAX) return CUDA_ERROR_INVALID_VALUE;
        op.writeValue.address = address;
        op.writeValue.flags = op_flags;
        if (n == 4) op.writeValue.value = static_cast<cuuint32_t>(value);
        else op.writeValue.value64 = value;
        break;
      }
      case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
        if (op_flags != 0 || address != 0 || value != 0) return CUDA_ERROR_INVALID_VALUE;
        op.flushRemoteWrites.flags = 0;
        break;
      case CU_STREAM_MEM_OP_BARRIER:
        if (op_flags > CU_STREAM_MEMORY_BARRIER_TYPE_GPU || address != 0 || value != 0) {
          return CUDA_ERROR_INVALID_VALUE;
        }
        op.memoryBarrier.flags = op_flags;
        break;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }
  if (!rd.Finish()) return CUDA_ERROR_INVALID_VALUE;
  if (!host_.KnownStream(s)) return CUDA_ERROR_INVALID_HANDLE;
  if (d_.cuStreamBatchMemOp_v2 == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return d_.cuStreamBatchMemOp_v2(reinterpret_cast<CUstream>(s), count, ops.data(), 0);
}

}  // namespace tf::worker
