// Stream memory operations, batched copies, the device's current pool and the legacy forms of
// calls whose current form is generated or hand-written elsewhere (docs/remote.md "Stream memory
// operations, batches, pools and peers"; payloads in remote_memops.h).
//
// cuStreamBatchMemOp travels as one fire-and-forget message that the worker checks operation by
// operation. Batched copies never travel as such: every copy goes through the copy path of its
// kind (client_copies.cc UnifiedCopy: device to device on the worker, pageable host memory of this
// process sent or fetched as by cuMemcpyHtoD/DtoH), in the order given, on the batch's stream, so
// that host memory here is never handed to the worker as an address.
#include <cstdint>
#include <cstring>
#include <vector>

#include "client/client_internal.h"
#include "client/remote_arrays.h"
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

// ---- stream memory operations (the single ones and their legacy forms are generated)

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

// ---- memory locations (the generated calls' `loc=`) and VMM queries (payloads in remote_memops.h)

CUresult CheckMemLocation(Session* session, Fn fn, const CUmemLocation* loc) {
  if (loc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (loc->type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (loc->id < 0 || static_cast<size_t>(loc->id) >= session->devices.size()) {
        return CUDA_ERROR_INVALID_DEVICE;
      }
      return CUDA_SUCCESS;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
      ClientLog("%s: host memory locations are not served by the remote vGPU (the worker's host is "
                "not this one): returning CUDA_ERROR_NOT_SUPPORTED", driver::FunctionName(fn));
      return CUDA_ERROR_NOT_SUPPORTED;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// ---- pointer attributes that can be set

CUresult Impl_cuPointerSetAttribute(const void* value, CUpointer_attribute attribute, CUdeviceptr ptr) {
  // The driver sets CU_POINTER_ATTRIBUTE_SYNC_MEMOPS only.
  if (value == nullptr || attribute != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS) return CUDA_ERROR_INVALID_VALUE;
  unsigned v = 0;
  std::memcpy(&v, value, sizeof(v));
  TF_LOCK(l);
  TF_CTX(l);
  Session* session = l.session();
  const DeviceAlloc* a = FindDeviceAlloc(session, ptr);
  if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint8_t buf[12];
  Writer w(buf, sizeof(buf));
  w.U64(ptr);
  w.U32(v != 0 ? 1 : 0);
  CUresult r = Simple(l, Fn::cuPointerSetAttribute, w);
  // The pointer queries are answered here (client_local.cc): keep what was set.
  if (r == CUDA_SUCCESS) const_cast<DeviceAlloc*>(a)->sync_memops = v != 0;
  return r;
}

// ---- 3D peer copies: a session serves one device, so a peer copy between two of its contexts is
// the 3D copy of the same description (client_arrays.cc), once both contexts are known.

namespace {

CUresult PeerAs3D(const CUDA_MEMCPY3D_PEER* p, CUDA_MEMCPY3D* c) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  {
    TF_LOCK(l);
    const auto& known = l.session()->context_info;
    if (!known.count(reinterpret_cast<uint64_t>(p->srcContext)) ||
        !known.count(reinterpret_cast<uint64_t>(p->dstContext))) {
      return CUDA_ERROR_INVALID_CONTEXT;
    }
  }
  *c = CUDA_MEMCPY3D{};
  c->srcXInBytes = p->srcXInBytes;
  c->srcY = p->srcY;
  c->srcZ = p->srcZ;
  c->srcLOD = p->srcLOD;
  c->srcMemoryType = p->srcMemoryType;
  c->srcHost = p->srcHost;
  c->srcDevice = p->srcDevice;
  c->srcArray = p->srcArray;
  c->srcPitch = p->srcPitch;
  c->srcHeight = p->srcHeight;
  c->dstXInBytes = p->dstXInBytes;
  c->dstY = p->dstY;
  c->dstZ = p->dstZ;
  c->dstLOD = p->dstLOD;
  c->dstMemoryType = p->dstMemoryType;
  c->dstHost = p->dstHost;
  c->dstDevice = p->dstDevice;
  c->dstArray = p->dstArray;
  c->dstPitch = p->dstPitch;
  c->dstHeight = p->dstHeight;
  c->WidthInBytes = p->WidthInBytes;
  c->Height = p->Height;
  c->Depth = p->Depth;
  return CUDA_SUCCESS;
}

}  // namespace

CUresult Impl_cuMemcpy3DPeer(const CUDA_MEMCPY3D_PEER* p) {
  CUDA_MEMCPY3D c;
  if (CUresult r = PeerAs3D(p, &c); r != CUDA_SUCCESS) return r;
  return Impl_cuMemcpy3D_v2(&c);
}
CUresult Impl_cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER* p, CUstream stream) {
  CUDA_MEMCPY3D c;
  if (CUresult r = PeerAs3D(p, &c); r != CUDA_SUCCESS) return r;
  return Impl_cuMemcpy3DAsync_v2(&c, stream);
}

// ---- 3D batched copies: every operation checked first (a bad batch copies nothing), then each
// goes as the 3D copy of its description (client_arrays.cc) on the batch's stream, in order.

namespace {

// Bytes of one element of an operand: 1 for a pointer, the array's element otherwise (0: unknown
// array).
uint64_t OperandElement(Session* s, const CUmemcpy3DOperand& op) {
  if (op.type == CU_MEMCPY_OPERAND_TYPE_POINTER) return 1;
  auto it = s->arrays.find(reinterpret_cast<uint64_t>(op.op.array.array));
  if (it == s->arrays.end()) return 0;
  return uint64_t{remote::FormatBytes(it->second.desc.Format)} * it->second.desc.NumChannels;
}

// One side of a CUDA_MEMCPY3D from an operand; elem is the copy's element size in bytes.
bool OperandSide(const CUmemcpy3DOperand& op, const CUextent3D& extent, uint64_t elem, bool is_src,
                 CUDA_MEMCPY3D* c) {
  if (op.type == CU_MEMCPY_OPERAND_TYPE_POINTER) {
    const size_t row = op.op.ptr.rowLength, layer = op.op.ptr.layerHeight;
    if ((row != 0 && row < extent.width) || (layer != 0 && layer < extent.height)) return false;
    const size_t pitch = (row != 0 ? row : extent.width) * elem;
    const size_t height = layer != 0 ? layer : extent.height;
    if (is_src) {
      c->srcMemoryType = CU_MEMORYTYPE_UNIFIED;
      c->srcDevice = op.op.ptr.ptr;
      c->srcPitch = pitch;
      c->srcHeight = height;
    } else {
      c->dstMemoryType = CU_MEMORYTYPE_UNIFIED;
      c->dstDevice = op.op.ptr.ptr;
      c->dstPitch = pitch;
      c->dstHeight = height;
    }
    return true;
  }
  if (op.type != CU_MEMCPY_OPERAND_TYPE_ARRAY) return false;
  if (is_src) {
    c->srcMemoryType = CU_MEMORYTYPE_ARRAY;
    c->srcArray = op.op.array.array;
    c->srcXInBytes = op.op.array.offset.x * elem;
    c->srcY = op.op.array.offset.y;
    c->srcZ = op.op.array.offset.z;
  } else {
    c->dstMemoryType = CU_MEMORYTYPE_ARRAY;
    c->dstArray = op.op.array.array;
    c->dstXInBytes = op.op.array.offset.x * elem;
    c->dstY = op.op.array.offset.y;
    c->dstZ = op.op.array.offset.z;
  }
  return true;
}

CUresult Copy3DBatch(size_t num_ops, CUDA_MEMCPY3D_BATCH_OP* ops, unsigned long long flags, size_t* fail_idx,
                     CUstream stream) {
  if (fail_idx != nullptr) *fail_idx = SIZE_MAX;
  if (num_ops == 0 || ops == nullptr || flags != 0 || LegacyStream(stream)) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUDA_MEMCPY3D> copies(num_ops);
  {
    TF_LOCK(l);
    for (size_t i = 0; i < num_ops; ++i) {
      const CUDA_MEMCPY3D_BATCH_OP& op = ops[i];
      if (op.extent.width == 0 || op.extent.height == 0 || op.extent.depth == 0 ||
          op.srcAccessOrder < CU_MEMCPY_SRC_ACCESS_ORDER_STREAM || op.srcAccessOrder > CU_MEMCPY_SRC_ACCESS_ORDER_ANY ||
          (op.flags & ~static_cast<unsigned>(CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE)) != 0) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      const uint64_t es = OperandElement(l.session(), op.src), ed = OperandElement(l.session(), op.dst);
      // The element size: an array's; the two arrays' must match.
      if (es == 0 || ed == 0 || (op.src.type == CU_MEMCPY_OPERAND_TYPE_ARRAY &&
                                 op.dst.type == CU_MEMCPY_OPERAND_TYPE_ARRAY && es != ed)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      const uint64_t elem = op.src.type == CU_MEMCPY_OPERAND_TYPE_ARRAY ? es : ed;
      CUDA_MEMCPY3D& c = copies[i];
      c = CUDA_MEMCPY3D{};
      if (!OperandSide(op.src, op.extent, elem, true, &c) || !OperandSide(op.dst, op.extent, elem, false, &c)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      c.WidthInBytes = op.extent.width * elem;
      c.Height = op.extent.height;
      c.Depth = op.extent.depth;
    }
  }
  for (size_t i = 0; i < num_ops; ++i) {
    CUresult r = Impl_cuMemcpy3DAsync_v2(&copies[i], stream);
    if (r != CUDA_SUCCESS) {
      if (fail_idx != nullptr) *fail_idx = i;
      return r;
    }
  }
  return CUDA_SUCCESS;
}

}  // namespace

CUresult Impl_cuMemcpy3DBatchAsync_v2(size_t num_ops, CUDA_MEMCPY3D_BATCH_OP* ops, unsigned long long flags,
                                      CUstream stream) {
  return Copy3DBatch(num_ops, ops, flags, nullptr, stream);
}
CUresult Impl_cuMemcpy3DBatchAsync(size_t num_ops, CUDA_MEMCPY3D_BATCH_OP* ops, size_t* fail_idx,
                                   unsigned long long flags, CUstream stream) {
  return Copy3DBatch(num_ops, ops, flags, fail_idx, stream);
}

}  // namespace tf::client
