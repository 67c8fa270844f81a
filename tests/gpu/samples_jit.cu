// Compiled to PTX (nvcc -ptx) and embedded as text in tests/gpu/samples.cu, which JIT-compiles it
// with cuModuleLoadDataEx (sample ptx_jit).
extern "C" __global__ void samples_jit_saxpy(float a, const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
