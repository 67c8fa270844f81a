// Green contexts on the GPU (natively, and remotely over shared memory and TCP): the device's SMs
// split in two groups, a green context of the first, a stream on it, a kernel whose blocks record
// the SM they ran on (%smid), and events recorded and waited across the green and the primary
// context. What must be equal natively and remotely: the split (group count and sizes) and the
// data the kernels computed; the SM ids themselves differ run to run and are only checked (no more
// distinct SMs than the group has).
#include <algorithm>
#include <set>
#include <vector>

#include "samples.h"

namespace {

__global__ void RecordSm(unsigned* sm, unsigned* data, unsigned n) {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  if (threadIdx.x == 0) sm[blockIdx.x] = id;
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] = i * 3u + 1u;
}

__global__ void AddOne(unsigned* data, unsigned n) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] += 1u;
}

}  // namespace

TF_SAMPLE(green_context_sm_split) {
  RT(o, cudaFree(nullptr));  // the primary context, current
  CUcontext primary = nullptr;
  DRV(o, cuCtxGetCurrent(&primary));
  CUdevResource dev;
  DRV(o, cuDeviceGetDevResource(0, &dev, CU_DEV_RESOURCE_TYPE_SM));
  const unsigned align = std::max(1u, std::max(dev.sm.minSmPartitionSize, dev.sm.smCoscheduledAlignment));
  const unsigned half = std::max(dev.sm.minSmPartitionSize, dev.sm.smCount / 2 / align * align);
  CUdevResource groups[2], rest;
  unsigned n = 2;
  DRV(o, cuDevSmResourceSplitByCount(groups, &n, &dev, &rest, 0, half));
  if (n < 1 || groups[0].sm.smCount < half) {
    o.Fail("split gave " + std::to_string(n) + " groups of " + std::to_string(groups[0].sm.smCount));
    return;
  }
  CUdevResourceDesc desc;
  DRV(o, cuDevResourceGenerateDesc(&desc, &groups[0], 1));
  CUgreenCtx green;
  DRV(o, cuGreenCtxCreate(&green, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM));
  CUdevResource got;
  DRV(o, cuGreenCtxGetDevResource(green, &got, CU_DEV_RESOURCE_TYPE_SM));
  CUcontext gctx;
  DRV(o, cuCtxFromGreenCtx(&gctx, green));
  CUstream gs;
  DRV(o, cuGreenCtxStreamCreate(&gs, green, CU_STREAM_NON_BLOCKING, 0));
  CUgreenCtx of_stream = nullptr;
  DRV(o, cuStreamGetGreenCtx(gs, &of_stream));
  if (of_stream != green) o.Fail("cuStreamGetGreenCtx does not name the green context");

  const unsigned blocks = dev.sm.smCount * 4, threads = 128, count = blocks * threads;
  unsigned *sm = nullptr, *data = nullptr;
  RT(o, cudaMalloc(&sm, blocks * sizeof(unsigned)));
  RT(o, cudaMalloc(&data, count * sizeof(unsigned)));
  CUstream ps;
  DRV(o, cuStreamCreate(&ps, CU_STREAM_NON_BLOCKING));
  CUevent from_green, from_primary;
  DRV(o, cuEventCreate(&from_green, CU_EVENT_DISABLE_TIMING));
  DRV(o, cuEventCreate(&from_primary, CU_EVENT_DISABLE_TIMING));

  DRV(o, cuCtxPushCurrent(gctx));
  RecordSm<<<blocks, threads, 0, reinterpret_cast<cudaStream_t>(gs)>>>(sm, data, count);
  RT(o, cudaGetLastError());
  DRV(o, cuGreenCtxRecordEvent(green, from_green));
  CUcontext popped;
  DRV(o, cuCtxPopCurrent(&popped));
  // The primary context's stream adds one after the green context's kernel; the green context
  // adds one more after that.
  DRV(o, cuStreamWaitEvent(ps, from_green, 0));
  AddOne<<<blocks, threads, 0, reinterpret_cast<cudaStream_t>(ps)>>>(data, count);
  RT(o, cudaGetLastError());
  DRV(o, cuEventRecord(from_primary, ps));
  DRV(o, cuGreenCtxWaitEvent(green, from_primary));
  DRV(o, cuCtxPushCurrent(gctx));
  AddOne<<<blocks, threads, 0, reinterpret_cast<cudaStream_t>(gs)>>>(data, count);
  RT(o, cudaGetLastError());
  DRV(o, cuStreamSynchronize(gs));
  DRV(o, cuCtxPopCurrent(&popped));

  std::vector<unsigned> host_sm(blocks), host(count);
  RT(o, cudaMemcpy(host_sm.data(), sm, blocks * sizeof(unsigned), cudaMemcpyDeviceToHost));
  RT(o, cudaMemcpy(host.data(), data, count * sizeof(unsigned), cudaMemcpyDeviceToHost));
  const std::set<unsigned> distinct(host_sm.begin(), host_sm.end());
  if (distinct.size() > got.sm.smCount) {
    o.Fail("blocks ran on " + std::to_string(distinct.size()) + " SMs; the green context has " +
           std::to_string(got.sm.smCount));
  }
  for (unsigned i = 0; i < count; ++i) {
    if (host[i] != i * 3u + 3u) {
      o.Fail("element " + std::to_string(i) + " is " + std::to_string(host[i]));
      break;
    }
  }
  const unsigned shape[4] = {n, groups[0].sm.smCount, got.sm.smCount, dev.sm.smCount};
  o.Result(shape, sizeof(shape));
  o.Result(host.data(), host.size() * sizeof(unsigned));

  RT(o, cudaFree(sm));
  RT(o, cudaFree(data));
  DRV(o, cuEventDestroy(from_green));
  DRV(o, cuEventDestroy(from_primary));
  DRV(o, cuStreamDestroy(ps));
  DRV(o, cuStreamDestroy(gs));
  DRV(o, cuGreenCtxDestroy(green));
  DRV(o, cuCtxSetCurrent(primary));
}
