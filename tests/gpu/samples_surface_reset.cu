// cudaDeviceReset on the GPU (natively, and remotely over shared memory and TCP): a kernel fills
// device memory, a page-locked copy reads it back, the device is reset, and the same work runs
// again on new memory, a new stream and new page-locked memory. What must be equal natively and
// remotely: the data both rounds computed. (Round 1's objects are not touched after the reset:
// the real driver's handles are freed memory then.) device_reset_managed_mapped does the same with
// managed and mapped page-locked memory.
#include <vector>

#include "samples.h"

namespace {

__global__ void FillRound(unsigned* data, unsigned n, unsigned round) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] = i * 7u + round;
}

__global__ void ScaleAdd(unsigned* data, unsigned n, unsigned add) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] = data[i] * 3u + add;
}

}  // namespace

TF_SAMPLE(device_reset) {
  constexpr unsigned kN = 1 << 16;
  for (unsigned round = 1; round <= 2; ++round) {
    unsigned* d = nullptr;
    unsigned* h = nullptr;
    cudaStream_t st = nullptr;
    RT(o, cudaMalloc(&d, kN * sizeof(unsigned)));
    RT(o, cudaMallocHost(&h, kN * sizeof(unsigned)));
    RT(o, cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    FillRound<<<kN / 256, 256, 0, st>>>(d, kN, round);
    RT(o, cudaGetLastError());
    RT(o, cudaMemcpyAsync(h, d, kN * sizeof(unsigned), cudaMemcpyDeviceToHost, st));
    RT(o, cudaStreamSynchronize(st));
    for (unsigned i = 0; i < kN; ++i) {
      if (h[i] != i * 7u + round) {
        o.Fail("round " + std::to_string(round) + ": wrong value at " + std::to_string(i));
        return;
      }
    }
    o.Result(h, kN * sizeof(unsigned));
    if (round == 1) {
      // Everything of round 1 (memory, stream, page-locked memory) goes with the reset.
      RT(o, cudaDeviceReset());
    } else {
      RT(o, cudaStreamDestroy(st));
      RT(o, cudaFreeHost(h));
      RT(o, cudaFree(d));
    }
  }
}

// cudaDeviceReset with managed and mapped page-locked memory alive (remotely over TCP both are
// mirrors, over shared memory host regions) and a kernel on the managed memory still in flight:
// the reset frees both, then new managed and mapped memory, written by the host and then by
// kernels, work. Equal natively and remotely: what both rounds read back. Round 1's memory is not
// touched after the reset (it is freed memory then).
TF_SAMPLE(device_reset_managed_mapped) {
  constexpr unsigned kN = 1 << 14;
  constexpr size_t kBytes = kN * sizeof(unsigned);
  for (unsigned round = 1; round <= 2; ++round) {
    unsigned* m = nullptr;
    unsigned* h = nullptr;
    unsigned* hd = nullptr;
    RT(o, cudaMallocManaged(&m, kBytes));
    RT(o, cudaHostAlloc(&h, kBytes, cudaHostAllocMapped));
    RT(o, cudaHostGetDevicePointer(&hd, h, 0));
    for (unsigned i = 0; i < kN; ++i) {
      m[i] = i + round;
      h[i] = 2 * i + round;
    }
    ScaleAdd<<<kN / 256, 256>>>(m, kN, round);
    ScaleAdd<<<kN / 256, 256>>>(hd, kN, round + 10);
    RT(o, cudaGetLastError());
    RT(o, cudaDeviceSynchronize());
    for (unsigned i = 0; i < kN; ++i) {
      if (m[i] != (i + round) * 3u + round || h[i] != (2 * i + round) * 3u + round + 10) {
        o.Fail("round " + std::to_string(round) + ": wrong value at " + std::to_string(i));
        return;
      }
    }
    o.Result(m, kBytes);
    o.Result(h, kBytes);
    if (round == 1) {
      ScaleAdd<<<kN / 256, 256>>>(m, kN, 5);  // still running, or queued, at the reset
      RT(o, cudaDeviceReset());
    } else {
      RT(o, cudaFree(m));
      RT(o, cudaFreeHost(h));
    }
  }
}
