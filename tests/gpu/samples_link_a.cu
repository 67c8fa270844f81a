// Relocatable PTX unit A of the culink sample (tests/gpu/samples.cu): a kernel that calls a
// device function defined only in unit B (samples_link_b.cu); cuLink* resolves it at run time.
extern "C" __device__ float samples_link_scale(float x, int i);

extern "C" __global__ void samples_link_kernel(const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = samples_link_scale(x[i], i);
}
