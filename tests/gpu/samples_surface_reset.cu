// cudaDeviceReset on the GPU (natively, and remotely over shared memory and TCP): a kernel fills
// device memory, a page-locked copy reads it back, the device is reset, and the same work runs
// again on new memory, a new stream and new page-locked memory. What must be equal natively and
// remotely: the data both rounds computed. (Round 1's objects are not touched after the reset:
// the real driver's handles are freed memory then.)
#include <vector>

#include "samples.h"

namespace {

__global__ void FillRound(unsigned* data, unsigned n, unsigned round) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] = i * 7u + round;
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
