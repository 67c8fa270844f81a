// Occupancy queries (cuOccupancy*), which cuBLAS asks while it creates a handle and libraries ask
// before launches. The answer depends only on the function, its attributes and the arguments, so
// each distinct question goes to the worker once and is kept in the session's answers until an
// attribute of a function changes (ForgetOccupancy). The plain queries (active blocks, available
// shared memory) are generated (api/remote_surface.tsv: sync with cache=); written here are
// cuOccupancyMaxPotentialBlockSize*, whose block-size-to-shared-memory callback is a function of
// this process: with one, the search runs here, the callback outside the stub's lock and each
// candidate block size an ordinary (cached) active-blocks query; and the cluster queries, whose
// launch configuration carries a stream and an array of launch attributes.
#include <cstring>

#include "client/client_internal.h"
#include "tf_client_impl.h"

namespace tf::client {
namespace {

using driver::Fn;
using remote::Op;
using transport::Writer;

// cuOccupancyMaxPotentialBlockSize* without a callback, asked of the worker: the grid (high half)
// and block size (low half).
CUresult Query(Fn fn, CUfunction func, int32_t limit, uint64_t smem, uint32_t flags, uint64_t* answer) {
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  if (!s->functions.count(H(func)) && !s->kernels.count(H(func))) return CUDA_ERROR_INVALID_HANDLE;
  if (CachedAnswer(s, fn, H(func), static_cast<uint32_t>(limit), smem, answer, flags)) return CUDA_SUCCESS;
  uint8_t buf[24];
  Writer w(buf, sizeof(buf));
  w.U64(H(func));
  w.I32(limit);
  w.U64(smem);
  w.U32(flags);
  ReplyView rv;
  CUresult r = CallSync(s, Op(fn), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  int32_t grid = 0, block = 0;
  if (!rv.reader.I32(&grid) || !rv.reader.I32(&block)) return CUDA_ERROR_UNKNOWN;
  *answer = (static_cast<uint64_t>(static_cast<uint32_t>(grid)) << 32) | static_cast<uint32_t>(block);
  StoreAnswer(s, fn, H(func), static_cast<uint32_t>(limit), smem, *answer, flags);
  return CUDA_SUCCESS;
}

// The largest block size worth trying and the device's SM count and threads per SM.
CUresult SearchLimits(CUfunction func, int limit, int* max_block, int* sms, int* threads_per_sm) {
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  int max_threads = 1024;
  if (auto it = s->functions.find(H(func)); it != s->functions.end()) {
    const auto& attrs = it->second.attrs;
    if (static_cast<size_t>(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK) < attrs.size() &&
        attrs[CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK] > 0) {
      max_threads = attrs[CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK];
    }
  } else if (!s->kernels.count(H(func))) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  int dev = 0;
  if (auto it = s->context_info.find(CurrentContext()); it != s->context_info.end()) {
    dev = it->second.device;
  }
  *sms = 1;
  *threads_per_sm = 2048;
  if (dev >= 0 && static_cast<size_t>(dev) < s->devices.size()) {
    const auto& a = s->devices[dev].attrs;
    if (static_cast<size_t>(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) < a.size()) {
      *sms = a[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT];
    }
    if (static_cast<size_t>(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) < a.size()) {
      *threads_per_sm = a[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR];
    }
  }
  *max_block = (limit > 0 && limit < max_threads) ? limit : max_threads;
  return CUDA_SUCCESS;
}

CUresult PotentialBlockSize(Fn fn, int* min_grid, int* block_size, CUfunction func,
                            CUoccupancyB2DSize cb, size_t smem, int limit, unsigned flags) {
  if (min_grid == nullptr || block_size == nullptr || limit < 0) return CUDA_ERROR_INVALID_VALUE;
  if (cb == nullptr) {
    uint64_t a = 0;
    CUresult r = Query(fn, func, limit, smem, flags, &a);
    if (r != CUDA_SUCCESS) return r;
    *min_grid = static_cast<int>(a >> 32);
    *block_size = static_cast<int>(a & 0xffffffffu);
    return CUDA_SUCCESS;
  }
  int max_block = 0, sms = 0, per_sm = 0;
  CUresult r = SearchLimits(func, limit, &max_block, &sms, &per_sm);
  if (r != CUDA_SUCCESS) return r;
  constexpr int kWarp = 32;
  int best_threads = -1, best_block = 0, best_blocks = 0;
  for (int bs = max_block / kWarp * kWarp; bs >= kWarp; bs -= kWarp) {
    int blocks = 0;
    r = Impl_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, func, bs, cb(bs), flags);
    if (r != CUDA_SUCCESS) return r;
    int threads = blocks * bs;
    if (threads > best_threads) {
      best_threads = threads;
      best_block = bs;
      best_blocks = blocks;
    }
    if (best_threads >= per_sm) break;  // full occupancy: no smaller block does better
  }
  *min_grid = best_blocks * sms;
  *block_size = best_block;
  return CUDA_SUCCESS;
}

}  // namespace

void ForgetOccupancy(Session* s) {
  for (Fn fn : {Fn::cuOccupancyAvailableDynamicSMemPerBlock, Fn::cuOccupancyMaxActiveBlocksPerMultiprocessor,
                Fn::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags,
                Fn::cuOccupancyMaxPotentialBlockSize, Fn::cuOccupancyMaxPotentialBlockSizeWithFlags}) {
    ForgetAnswers(s, fn);
  }
}

CUresult Impl_cuOccupancyMaxPotentialBlockSize(int* minGridSize, int* blockSize, CUfunction func,
                                               CUoccupancyB2DSize blockSizeToDynamicSMemSize,
                                               size_t dynamicSMemSize, int blockSizeLimit) {
  return PotentialBlockSize(Fn::cuOccupancyMaxPotentialBlockSize, minGridSize, blockSize, func,
                            blockSizeToDynamicSMemSize, dynamicSMemSize, blockSizeLimit, 0);
}

CUresult Impl_cuOccupancyMaxPotentialBlockSizeWithFlags(
    int* minGridSize, int* blockSize, CUfunction func, CUoccupancyB2DSize blockSizeToDynamicSMemSize,
    size_t dynamicSMemSize, int blockSizeLimit, unsigned int flags) {
  return PotentialBlockSize(Fn::cuOccupancyMaxPotentialBlockSizeWithFlags, minGridSize, blockSize,
                            func, blockSizeToDynamicSMemSize, dynamicSMemSize, blockSizeLimit,
                            flags);
}

// ---- clusters: the launch configuration travels as for cuLaunchKernelEx (grid, block, shared
// memory, stream), with the attributes that are plain values (cluster dimension, scheduling
// policy and the like); a configuration naming events or windows is not supported here.

namespace {

CUresult ClusterQuery(Fn fn, int* out, CUfunction func, const CUlaunchConfig* config) {
  if (out == nullptr || config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (config->numAttrs > remote::kMaxLaunchAttributes ||
      (config->numAttrs > 0 && config->attrs == nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  TF_LOCK(l);
  TF_CTX(l);
  Session* s = l.session();
  if (!s->functions.count(H(func)) && !s->kernels.count(H(func))) return CUDA_ERROR_INVALID_HANDLE;
  uint8_t buf[64 + remote::kMaxLaunchAttributes * 68];
  Writer w(buf, sizeof(buf));
  w.U64(H(func));
  WriteLaunchGeometry(config, w);
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    const uint32_t id = static_cast<uint32_t>(config->attrs[i].id);
    if (!remote::IsPlainLaunchAttribute(id)) return Unsupported(fn);
    w.U32(id);
    w.Bytes(&config->attrs[i].value, sizeof(config->attrs[i].value));
  }
  ReplyView rv;
  CUresult r = CallSync(s, Op(fn), w, &rv);
  if (r != CUDA_SUCCESS) return r;
  int32_t v = 0;
  if (!rv.reader.I32(&v)) return CUDA_ERROR_UNKNOWN;
  *out = v;
  return CUDA_SUCCESS;
}

}  // namespace

CUresult Impl_cuOccupancyMaxActiveClusters(int* numClusters, CUfunction func,
                                           const CUlaunchConfig* config) {
  return ClusterQuery(Fn::cuOccupancyMaxActiveClusters, numClusters, func, config);
}

CUresult Impl_cuOccupancyMaxPotentialClusterSize(int* clusterSize, CUfunction func,
                                                 const CUlaunchConfig* config) {
  return ClusterQuery(Fn::cuOccupancyMaxPotentialClusterSize, clusterSize, func, config);
}

}  // namespace tf::client
