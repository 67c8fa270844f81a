// Kernels of tests/gpu/samples.cu: loaded through the driver API (cuModuleLoadData of the fatbin
// built from this file, embedded in the program; extern "C": looked up by these names), and
// compiled into the program itself for the runtime-API samples (samples.cu includes this file).
extern "C" __global__ void samples_vecadd(const float* a, const float* b, float* c, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

// C = A * B for n x n row-major matrices, 16 x 16 tiles in shared memory; n a multiple of 16.
extern "C" __global__ void samples_matmul(const float* a, const float* b, float* c, int n) {
  __shared__ float ta[16][16];
  __shared__ float tb[16][16];
  const int row = blockIdx.y * 16 + threadIdx.y;
  const int col = blockIdx.x * 16 + threadIdx.x;
  float sum = 0.0f;
  for (int t = 0; t < n; t += 16) {
    ta[threadIdx.y][threadIdx.x] = a[row * n + t + threadIdx.x];
    tb[threadIdx.y][threadIdx.x] = b[(t + threadIdx.y) * n + col];
    __syncthreads();
    for (int k = 0; k < 16; ++k) sum += ta[threadIdx.y][k] * tb[k][threadIdx.x];
    __syncthreads();
  }
  c[row * n + col] = sum;
}
