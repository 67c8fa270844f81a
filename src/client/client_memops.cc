// Stream memory operations, batched copies, the device's current pool and the legacy forms of
// calls whose current form is generated or hand-written elsewhere (docs/remote.md "Stream memory
// operations, batches, pools and peers"; payloads in remote_memops.h).
//
// cuStreamBatchMemOp travels as one fire-and-forget message that the worker checks operation by
// operation. Batched copies never travel as such: every copy goes through the copy path of its
// kind (client_async.cc UnifiedCopy: device to device on the worker, pageable host memory of this
// process sent or fetched as by cuMemcpyHtoD/DtoH), in the order given, on the batch's stream, so
// that host memory here is never handed to the worker as an address.
#include <cstdint>
#include <vector>

#include "client/client_internal.h"
#include "client/remote_memops.h"
#include "tf_client_impl.h"

namespace tf::client {

using driver::Fn;
using remote::Op;
using transport::Writer;

bool BatchIndexList(size_t count, const size_t* idxs, size_t num) {
  if (num == 0 || num > count || idxs == nullptr || idxs[0] != 0) return false;
  for (size_t i = 1; i < num; ++i) {
    if (idxs[i] <= idxs[i - 1] || idxs[i] >= count) return false;
  }
  return true;
}

namespace {

bool LegacyStream(CUstream s) { return s == nullptr || s == CU_STREAM_LEGACY; }

// The checks the driver makes before any copy of a batch runs (a bad batch copies nothing).
CUresult CheckCopyBatch(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                        CUmemcpyAttributes* attrs, size_t* attr_idxs, size_t num_attrs, CUstream s) {
  if (count == 0 || dsts == nullptr || srcs == nullptr || sizes == nullptr || attrs == nullptr ||
      !BatchIndexList(count, attr_idxs, num_attrs) || LegacyStream(s)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (size_t i = 0; i < num_attrs; ++i) {
    if (attrs[i].srcAccessOrder < CU_MEMCPY_SRC_ACCESS_ORDER_STREAM ||
        attrs[i].srcAccessOrder > CU_MEMCPY_SRC_ACCESS_ORDER_ANY ||
        (attrs[i].flags & ~static_cast<unsigned>(CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  for (size_t i = 0; i < count; ++i) {
    if (sizes[i] == 0) return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult CopyBatch(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                   CUmemcpyAttributes* attrs, size_t* attr_idxs, size_t num_attrs, size_t* fail_idx,
                   CUstream s) {
  if (fail_idx != nullptr) *fail_idx = SIZE_MAX;
  CUresult r = CheckCopyBatch(dsts, srcs, sizes, count, attrs, attr_idxs, num_attrs, s);
  if (r != CUDA_SUCCESS) return r;
  for (size_t i = 0; i < count; ++i) {
    r = Impl_cuMemcpyAsync(dsts[i], srcs[i], sizes[i], s);
    if (r != CUDA_SUCCESS) {
      if (fail_idx != nullptr) *fail_idx = i;
      return r;
    }
  }
  return CUDA_SUCCESS;
}


CUresult BatchMemOp(Fn fn, CUstream s, unsigned count, CUstreamBatchMemOpParams* ops, unsigned flags) {
  if (count == 0 || count > remote::kMaxBatchMemOps || ops == nullptr || flags != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  TF_LOCK(l);
  TF_CTX(l);
  Session* session = l.session();
  std::vector<uint8_t> buf(16 + 24 * static_cast<size_t>(count));
  Writer w(buf.data(), buf.size());
  w.U64(H(s));
  w.U32(count);
  w.U32(flags);
  for (unsigned i = 0; i < count; ++i) {
    const CUstreamBatchMemOpParams& op = ops[i];
    w.U32(static_cast<uint32_t>(op.operation));
    switch (op.operation) {
      case CU_STREAM_MEM_OP_WAIT_VALUE_32:
      case CU_STREAM_MEM_OP_WAIT_VALUE_64:
        MirrorIfUsedAsDevice(session, op.waitValue.address);
        w.U32(op.waitValue.flags);
        w.U64(op.waitValue.address);
        w.U64(op.operation == CU_STREAM_MEM_OP_WAIT_VALUE_32 ? op.waitValue.value : op.waitValue.value64);
        break;
      case CU_STREAM_MEM_OP_WRITE_VALUE_32:
      case CU_STREAM_MEM_OP_WRITE_VALUE_64:
        MirrorIfUsedAsDevice(session, op.writeValue.address);
        w.U32(op.writeValue.flags);
        w.U64(op.writeValue.address);
        w.U64(op.operation == CU_STREAM_MEM_OP_WRITE_VALUE_32 ? op.writeValue.value : op.writeValue.value64);
        break;
      case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
        w.U32(op.flushRemoteWrites.flags);
        w.U64(0);
        w.U64(0);
        break;
      case CU_STREAM_MEM_OP_BARRIER:
        w.U32(op.memoryBarrier.flags);
        w.U64(0);
        w.U64(0);
        break;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }
  if (!w.ok()) return CUDA_ERROR_INVALID_VALUE;
  return SendAsync(session, Op(fn), w);
}

}  // namespace

// ---- stream memory operations: the legacy forms are the _v2 calls (same arguments)

CUresult Impl_cuStreamWaitValue32(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  return Impl_cuStreamWaitValue32_v2(s, addr, value, flags);
}
CUresult Impl_cuStreamWaitValue64(CUstream s, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  return Impl_cuStreamWaitValue64_v2(s, addr, value, flags);
}
CUresult Impl_cuStreamWriteValue32(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  return Impl_cuStreamWriteValue32_v2(s, addr, value, flags);
}
CUresult Impl_cuStreamWriteValue64(CUstream s, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  return Impl_cuStreamWriteValue64_v2(s, addr, value, flags);
}
CUresult Impl_cuStreamBatchMemOp_v2(CUstream s, unsigned int count, CUstreamBatchMemOpParams* ops,
                                    unsigned int flags) {
  return BatchMemOp(Fn::cuStreamBatchMemOp_v2, s, count, ops, flags);
}
CUresult Impl_cuStreamBatchMemOp(CUstream s, unsigned int count, CUstreamBatchMemOpParams* ops,
                                 unsigned int flags) {
  return BatchMemOp(Fn::cuStreamBatchMemOp_v2, s, count, ops, flags);
}

// ---- batched copies

CUresult Impl_cuMemcpyBatchAsync_v2(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                                    CUmemcpyAttributes* attrs, size_t* attr_idxs, size_t num_attrs,
                                    CUstream s) {
  return CopyBatch(dsts, srcs, sizes, count, attrs, attr_idxs, num_attrs, nullptr, s);
}
CUresult Impl_cuMemcpyBatchAsync(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                                 CUmemcpyAttributes* attrs, size_t* attr_idxs, size_t num_attrs,
                                 size_t* fail_idx, CUstream s) {
  return CopyBatch(dsts, srcs, sizes, count, attrs, attr_idxs, num_attrs, fail_idx, s);
}

// ---- the device's current memory pool (published by the worker like its default pool)

CUresult Impl_cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  TF_LOCK(l);
  TF_CTX_IF_ANY(l);
  uint8_t buf[8];
  Writer w(buf, sizeof(buf));
  w.I32(dev);
  ReplyView rv;
  CUresult r = CallSync(l.session(), Op(Fn::cuDeviceGetMemPool), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  uint64_t p = 0;
  if (!rv.reader.U64(&p)) return CUDA_ERROR_UNKNOWN;
  *pool = reinterpret_cast<CUmemoryPool>(p);
  return CUDA_SUCCESS;
}

// ---- legacy context creation: cuCtxCreate_v4 without create parameters

CUresult Impl_cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return Impl_cuCtxCreate_v4(pctx, nullptr, flags, dev);
}
CUresult Impl_cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return Impl_cuCtxCreate_v4(pctx, nullptr, flags, dev);
}

}  // namespace tf::client
