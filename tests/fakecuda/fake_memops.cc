// Fake driver: stream memory operations (wait and write values, batches of them), peer copies
// between contexts of one device and peer access, batched copies and managed-memory prefetches
// and discards, stream attribute copies and the device's current memory pool.
//
// A wait-value really waits: its stream's worker thread polls the word until the condition holds
// (so a write on another stream, or from the host, releases it), giving up after 30 s so that a
// test that never writes fails instead of hanging the process for ever.
#include <chrono>
#include <cstring>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "fake_driver.h"

using fakecuda::Driver;

namespace {

constexpr auto kWaitLimit = std::chrono::seconds(30);

void* AsHost(CUdeviceptr p) { return reinterpret_cast<void*>(p); }

// [p, p + n) lies inside one allocation of the driver, aligned to n (the words of memory ops).
bool AlignedWord(CUdeviceptr p, size_t n) {
  if (p % n != 0) return false;
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::Allocation* a = d.FindAllocation(p);
  return a != nullptr && p + n <= a->base + a->size;
}

bool InsideAllocation(CUdeviceptr p, size_t n, bool managed_only) {
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  fakecuda::Allocation* a = d.FindAllocation(p);
  if (a == nullptr || n > a->size || p - a->base > a->size - n) return false;
  return !managed_only || a->kind == fakecuda::MemoryKind::kManaged;
}

template <typename T>
bool Satisfied(T now, T value, unsigned cond) {
  switch (cond) {
    case CU_STREAM_WAIT_VALUE_GEQ: return static_cast<typename std::make_signed<T>::type>(now - value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return now == value;
    case CU_STREAM_WAIT_VALUE_AND: return (now & value) != 0;
    default: return static_cast<T>(~(now | value)) != 0;  // NOR
  }
}

template <typename T>
void WaitWord(CUdeviceptr addr, T value, unsigned flags) {
  const auto give_up = std::chrono::steady_clock::now() + kWaitLimit;
  const unsigned cond = flags & 0x3;
  T* word = static_cast<T*>(AsHost(addr));
  while (!Satisfied<T>(__atomic_load_n(word, __ATOMIC_ACQUIRE), value, cond) &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

template <typename T>
void WriteWord(CUdeviceptr addr, T value) {
  __atomic_store_n(static_cast<T*>(AsHost(addr)), value, __ATOMIC_RELEASE);
}

constexpr unsigned kWaitFlags = 0x3 | CU_STREAM_WAIT_VALUE_FLUSH;

template <typename T>
CUresult WaitValue(CUstream s, CUdeviceptr addr, T value, unsigned flags) {
  if ((flags & ~kWaitFlags) != 0 || !AlignedWord(addr, sizeof(T))) return CUDA_ERROR_INVALID_VALUE;
  return fakecuda::RunAsync(s, [=] { WaitWord<T>(addr, value, flags); });
}

template <typename T>
CUresult WriteValue(CUstream s, CUdeviceptr addr, T value, unsigned flags) {
  if ((flags & ~1u) != 0 || !AlignedWord(addr, sizeof(T))) return CUDA_ERROR_INVALID_VALUE;
  return fakecuda::RunAsync(s, [=] { WriteWord<T>(addr, value); });
}

bool LiveContext(CUcontext c) {
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  return c != nullptr && d.contexts.count(reinterpret_cast<fakecuda::Context*>(c)) != 0;
}

// The checks the batched copies and prefetches share: a count, and attributes or locations given
// as (item, index of the first copy it applies to) lists that start at 0 and increase.
bool IndexList(size_t count, const size_t* idxs, size_t num) {
  if (num == 0 || num > count || idxs == nullptr || idxs[0] != 0) return false;
  for (size_t i = 1; i < num; ++i) {
    if (idxs[i] <= idxs[i - 1] || idxs[i] >= count) return false;
  }
  return true;
}

bool LegacyStream(CUstream s) { return s == nullptr || s == CU_STREAM_LEGACY; }

CUresult PrefetchOrDiscard(CUdeviceptr* dptrs, size_t* sizes, size_t count, CUmemLocation* locs,
                           size_t* loc_idxs, size_t num_locs, unsigned long long flags, CUstream s,
                           bool prefetch) {
  if (count == 0 || dptrs == nullptr || sizes == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (prefetch && (locs == nullptr || !IndexList(count, loc_idxs, num_locs))) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; prefetch && i < num_locs; ++i) {
    if (locs[i].type != CU_MEM_LOCATION_TYPE_DEVICE && locs[i].type != CU_MEM_LOCATION_TYPE_HOST) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (locs[i].type == CU_MEM_LOCATION_TYPE_DEVICE &&
        (locs[i].id < 0 || locs[i].id >= Driver::Get().topology.device_count)) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
  }
  for (size_t i = 0; i < count; ++i) {
    if (sizes[i] == 0 || !InsideAllocation(dptrs[i], sizes[i], true)) return CUDA_ERROR_INVALID_VALUE;
  }
  // Nothing migrates in host memory: in stream order, the data stays as it was.
  return fakecuda::RunAsync(s, [] {});
}

}  // namespace

CUresult cuStreamWaitValue32_v2(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  FAKECUDA_ENTER();
  return WaitValue<uint32_t>(s, addr, value, flags);
}
CUresult cuStreamWaitValue64_v2(CUstream s, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  FAKECUDA_ENTER();
  return WaitValue<uint64_t>(s, addr, value, flags);
}
CUresult cuStreamWriteValue32_v2(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  FAKECUDA_ENTER();
  return WriteValue<uint32_t>(s, addr, value, flags);
}
CUresult cuStreamWriteValue64_v2(CUstream s, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  FAKECUDA_ENTER();
  return WriteValue<uint64_t>(s, addr, value, flags);
}

// At most 256 operations per batch, as the driver reports (CU_DEVICE_ATTRIBUTE_... not modelled).
CUresult cuStreamBatchMemOp_v2(CUstream s, unsigned int count, CUstreamBatchMemOpParams* ops,
                               unsigned int flags) {
  FAKECUDA_ENTER();
  if (count == 0 || count > 256 || ops == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUstreamBatchMemOpParams> copy(ops, ops + count);
  for (const CUstreamBatchMemOpParams& op : copy) {
    switch (op.operation) {
      case CU_STREAM_MEM_OP_WAIT_VALUE_32:
      case CU_STREAM_MEM_OP_WAIT_VALUE_64:
        if ((op.waitValue.flags & ~kWaitFlags) != 0 ||
            !AlignedWord(op.waitValue.address, op.operation == CU_STREAM_MEM_OP_WAIT_VALUE_32 ? 4 : 8)) {
          return CUDA_ERROR_INVALID_VALUE;
        }
        break;
      case CU_STREAM_MEM_OP_WRITE_VALUE_32:
      case CU_STREAM_MEM_OP_WRITE_VALUE_64:
        if ((op.writeValue.flags & ~1u) != 0 ||
            !AlignedWord(op.writeValue.address, op.operation == CU_STREAM_MEM_OP_WRITE_VALUE_32 ? 4 : 8)) {
          return CUDA_ERROR_INVALID_VALUE;
        }
        break;
      case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
        if (op.flushRemoteWrites.flags != 0) return CUDA_ERROR_INVALID_VALUE;
        break;
      case CU_STREAM_MEM_OP_BARRIER:
        if (op.memoryBarrier.flags > CU_STREAM_MEMORY_BARRIER_TYPE_GPU) return CUDA_ERROR_INVALID_VALUE;
        break;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return fakecuda::RunAsync(s, [copy] {
    for (const CUstreamBatchMemOpParams& op : copy) {
      switch (op.operation) {
        case CU_STREAM_MEM_OP_WAIT_VALUE_32:
          WaitWord<uint32_t>(op.waitValue.address, op.waitValue.value, op.waitValue.flags);
          break;
        case CU_STREAM_MEM_OP_WAIT_VALUE_64:
          WaitWord<uint64_t>(op.waitValue.address, op.waitValue.value64, op.waitValue.flags);
          break;
        case CU_STREAM_MEM_OP_WRITE_VALUE_32:
          WriteWord<uint32_t>(op.writeValue.address, op.writeValue.value);
          break;
        case CU_STREAM_MEM_OP_WRITE_VALUE_64:
          WriteWord<uint64_t>(op.writeValue.address, op.writeValue.value64);
          break;
        default:
          __atomic_thread_fence(__ATOMIC_SEQ_CST);
          break;
      }
    }
  });
}

// ---- peer copies and peer access (one device: contexts of it share its memory)

CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                      size_t n) {
  FAKECUDA_ENTER();
  if (!LiveContext(dst_ctx) || !LiveContext(src_ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (n == 0) return CUDA_SUCCESS;
  if (!InsideAllocation(dst, n, false) || !InsideAllocation(src, n, false)) return CUDA_ERROR_INVALID_VALUE;
  return fakecuda::RunSynchronous([=] { std::memmove(AsHost(dst), AsHost(src), n); });
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                           size_t n, CUstream s) {
  FAKECUDA_ENTER();
  if (!LiveContext(dst_ctx) || !LiveContext(src_ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (n == 0) return CUDA_SUCCESS;
  if (!InsideAllocation(dst, n, false) || !InsideAllocation(src, n, false)) return CUDA_ERROR_INVALID_VALUE;
  return fakecuda::RunAsync(s, [=] { std::memmove(AsHost(dst), AsHost(src), n); });
}

// A device never reaches itself as a peer (cuDeviceCanAccessPeer answers 0), so a context of the
// same device cannot be enabled; nothing is ever enabled to disable.
CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  FAKECUDA_ENTER();
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!LiveContext(peer) || reinterpret_cast<fakecuda::Context*>(peer) == ctx) {
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  return CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuCtxDisablePeerAccess(CUcontext peer) {
  FAKECUDA_ENTER();
  FAKECUDA_REQUIRE_CONTEXT(ctx);
  (void)ctx;
  if (!LiveContext(peer)) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
}

// ---- stream attributes, the current pool

CUresult cuStreamCopyAttributes(CUstream dst, CUstream src) {
  FAKECUDA_ENTER();
  CUresult err = CUDA_SUCCESS;
  std::shared_ptr<fakecuda::Stream> to = fakecuda::ResolveStream(dst, &err);
  if (to == nullptr) return err;
  std::shared_ptr<fakecuda::Stream> from = fakecuda::ResolveStream(src, &err);
  if (from == nullptr) return err;
  to->priority = from->priority;
  return CUDA_SUCCESS;
}

CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  FAKECUDA_ENTER();
  Driver& d = Driver::Get();
  std::lock_guard<std::mutex> lock(d.mu);
  if (dev < 0 || dev >= d.topology.device_count) return CUDA_ERROR_INVALID_DEVICE;
  auto* p = reinterpret_cast<fakecuda::MemPool*>(pool);
  if (p == d.devices[dev].default_pool.get()) {
    d.devices[dev].current_pool = p;
    return CUDA_SUCCESS;
  }
  auto it = d.pools.find(p);
  if (it == d.pools.end() || p->device != dev) return CUDA_ERROR_INVALID_VALUE;
  d.devices[dev].current_pool = p;
  return CUDA_SUCCESS;
}

// ---- batched copies and managed-memory prefetches and discards

CUresult cuMemcpyBatchAsync_v2(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                               CUmemcpyAttributes* attrs, size_t* attr_idxs, size_t num_attrs,
                               CUstream s) {
  FAKECUDA_ENTER();
  if (count == 0 || dsts == nullptr || srcs == nullptr || sizes == nullptr || attrs == nullptr ||
      !IndexList(count, attr_idxs, num_attrs) || LegacyStream(s)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (size_t i = 0; i < num_attrs; ++i) {
    if (attrs[i].srcAccessOrder < CU_MEMCPY_SRC_ACCESS_ORDER_STREAM ||
        attrs[i].srcAccessOrder > CU_MEMCPY_SRC_ACCESS_ORDER_ANY ||
        (attrs[i].flags & ~static_cast<unsigned>(CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE)) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  std::vector<std::tuple<CUdeviceptr, CUdeviceptr, size_t>> copies;
  for (size_t i = 0; i < count; ++i) {
    if (sizes[i] == 0) return CUDA_ERROR_INVALID_VALUE;
    copies.emplace_back(dsts[i], srcs[i], sizes[i]);
  }
  return fakecuda::RunAsync(s, [copies] {
    for (const auto& [dst, src, n] : copies) std::memmove(AsHost(dst), AsHost(src), n);
  });
}

CUresult cuMemPrefetchBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count, CUmemLocation* locs,
                                 size_t* loc_idxs, size_t num_locs, unsigned long long flags, CUstream s) {
  FAKECUDA_ENTER();
  return PrefetchOrDiscard(dptrs, sizes, count, locs, loc_idxs, num_locs, flags, s, true);
}

CUresult cuMemDiscardBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count, unsigned long long flags,
                                CUstream s) {
  FAKECUDA_ENTER();
  return PrefetchOrDiscard(dptrs, sizes, count, nullptr, nullptr, 0, flags, s, false);
}

CUresult cuMemDiscardAndPrefetchBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                           CUmemLocation* locs, size_t* loc_idxs, size_t num_locs,
                                           unsigned long long flags, CUstream s) {
  FAKECUDA_ENTER();
  return PrefetchOrDiscard(dptrs, sizes, count, locs, loc_idxs, num_locs, flags, s, true);
}
