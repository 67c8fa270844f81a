// Samples of the remote surface: the occupancy queries that are generated with a client-side answer
// cache (cuOccupancyMaxActiveBlocksPerMultiprocessor[WithFlags],
// cuOccupancyAvailableDynamicSMemPerBlock, api/remote_surface.tsv `cache=`), the hand-written
// cuOccupancyMaxPotentialBlockSize that searches through them when it has a callback, and the
// answers after a function attribute changes (the client must forget what it kept). Each runs in
// milliseconds; one small kernel is launched.
#include <cstring>

#include "samples.h"

namespace {

__global__ void OccupancyFill(unsigned* data, unsigned n) {
  extern __shared__ unsigned scratch[];
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  scratch[threadIdx.x] = i * 3u + 1u;
  __syncthreads();
  if (i < n) data[i] = scratch[threadIdx.x];
}

size_t SmemPerThread(int block) { return static_cast<size_t>(block) * 40; }

void Int(tf_samples::Outcome& o, int v) { o.Result(&v, sizeof(v)); }

}  // namespace

TF_SAMPLE(occupancy_generated_queries) {
  RT(o, cudaFree(nullptr));
  cudaFunction_t rf = nullptr;
  RT(o, cudaGetFuncBySymbol(&rf, reinterpret_cast<const void*>(OccupancyFill)));
  CUfunction f = reinterpret_cast<CUfunction>(rf);
  int blocks[4] = {};
  DRV(o, cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks[0], f, 256, 1024));
  DRV(o, cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks[1], f, 256, 1024));  // kept: same answer
  DRV(o, cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks[2], f, 128, 0,
                                                              CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE));
  DRV(o, cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks[3], f, 1024, 4096, CU_OCCUPANCY_DEFAULT));
  if (blocks[0] != blocks[1]) o.Fail("a repeated occupancy query changed its answer");
  if (blocks[0] <= 0) o.Fail("no block of 256 threads fits an SM");
  o.Result(blocks, sizeof(blocks));
  size_t avail[2] = {};
  DRV(o, cuOccupancyAvailableDynamicSMemPerBlock(&avail[0], f, 2, 256));
  DRV(o, cuOccupancyAvailableDynamicSMemPerBlock(&avail[1], f, 1, 1024));
  o.Result(avail, sizeof(avail));
  // cudart's template searches through the WithFlags query (many questions, most of them repeats).
  int grid = 0, block = 0;
  RT(o, cudaOccupancyMaxPotentialBlockSizeVariableSMem(&grid, &block, OccupancyFill, SmemPerThread));
  Int(o, grid);
  Int(o, block);
  int rt_blocks = 0;
  RT(o, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&rt_blocks, OccupancyFill, block, SmemPerThread(block)));
  Int(o, rt_blocks);
  // The driver's own search with a callback (run in the client when remote) and without one.
  int dgrid = 0, dblock = 0, pgrid = 0, pblock = 0;
  DRV(o, cuOccupancyMaxPotentialBlockSize(&dgrid, &dblock, f, [](int b) -> size_t { return b * 40; }, 0, 0));
  DRV(o, cuOccupancyMaxPotentialBlockSize(&pgrid, &pblock, f, nullptr, 2048, 512));
  Int(o, dgrid);
  Int(o, dblock);
  Int(o, pgrid);
  Int(o, pblock);
  // The kernel runs at the block size the search chose.
  const unsigned n = 4096;
  unsigned* d = nullptr;
  RT(o, cudaMalloc(&d, n * sizeof(unsigned)));
  OccupancyFill<<<(n + block - 1) / block, block, block * sizeof(unsigned)>>>(d, n);
  RT(o, cudaGetLastError());
  unsigned h[8] = {};
  RT(o, cudaMemcpy(h, d + n - 8, sizeof(h), cudaMemcpyDeviceToHost));
  if (h[7] != (n - 1) * 3u + 1u) o.Fail("the kernel's last element");
  o.Result(h, sizeof(h));
  cudaFree(d);
}

// An answer kept for a function must not outlive a change of its attributes: dynamic shared memory
// above the default limit fits no block until the function opts in to it.
TF_SAMPLE(occupancy_after_attribute_change) {
  RT(o, cudaFree(nullptr));
  cudaFunction_t rf = nullptr;
  RT(o, cudaGetFuncBySymbol(&rf, reinterpret_cast<const void*>(OccupancyFill)));
  CUfunction f = reinterpret_cast<CUfunction>(rf);
  int optin = 0;
  DRV(o, cuDeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 0));
  const size_t big = 64 << 10;
  int was = 0;
  DRV(o, cuFuncGetAttribute(&was, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f));
  int before = -1, after = -1, restored = -1;
  DRV(o, cuOccupancyMaxActiveBlocksPerMultiprocessor(&before, f, 128, big));
  size_t avail_before = 0, avail_after = 0;
  DRV(o, cuOccupancyAvailableDynamicSMemPerBlock(&avail_before, f, 1, 128));
  if (static_cast<size_t>(optin) >= big) {
    DRV(o, cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(big)));
  }
  DRV(o, cuOccupancyMaxActiveBlocksPerMultiprocessor(&after, f, 128, big));
  DRV(o, cuOccupancyAvailableDynamicSMemPerBlock(&avail_after, f, 1, 128));
  DRV(o, cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, was));
  DRV(o, cuOccupancyMaxActiveBlocksPerMultiprocessor(&restored, f, 128, big));
  if (restored != before) o.Fail("the answer after restoring the attribute");
  Int(o, before);
  Int(o, after);
  Int(o, restored);
  o.Result(&avail_before, sizeof(avail_before));
  o.Result(&avail_after, sizeof(avail_after));
}

// Pool access (generated with the location checks of `loc=`): the owning device's access is set
// (to what it always is) through an array of one descriptor and read back; the device's current
// pool (generated with `new=`) is the same handle twice.
TF_SAMPLE(pool_access_generated) {
  RT(o, cudaFree(nullptr));
  CUdevice dev = 0;
  DRV(o, cuCtxGetDevice(&dev));
  CUmemLocation loc = {};
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  loc.id = dev;
  CUmemPoolProps props = {};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location = loc;
  CUmemoryPool pool = nullptr;
  DRV(o, cuMemPoolCreate(&pool, &props));
  CUmemAccessDesc desc = {};
  desc.location = loc;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const int set = static_cast<int>(cuMemPoolSetAccess(pool, &desc, 1));
  CUmemAccess_flags got = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  DRV(o, cuMemPoolGetAccess(&got, pool, &loc));
  CUmemoryPool cur1 = nullptr, cur2 = nullptr;
  DRV(o, cuDeviceGetMemPool(&cur1, dev));
  DRV(o, cuDeviceGetMemPool(&cur2, dev));
  if (cur1 == nullptr || cur1 != cur2) o.Fail("the device's current pool changed between two asks");
  if (got != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) o.Fail("the owning device's access");
  const int answers[2] = {set, static_cast<int>(got)};
  o.Result(answers, sizeof(answers));
  cuMemPoolDestroy(pool);
}

// The PCI bus id (generated with `str=`, kept per connection with `cache=`): whole, refused for a
// buffer too short for it (as the driver refuses it), asked again, through cudart, and back to the
// device.
TF_SAMPLE(pci_bus_id_generated) {
  RT(o, cudaFree(nullptr));
  char id[64] = {}, again[64] = {}, rt[64] = {}, cut[8] = {};
  DRV(o, cuDeviceGetPCIBusId(id, sizeof(id), 0));
  // Too short for the id and its NUL: the driver refuses it (CUDA_ERROR_INVALID_VALUE on an H100).
  const CUresult cut_r = cuDeviceGetPCIBusId(cut, sizeof(cut), 0);
  DRV(o, cuDeviceGetPCIBusId(again, sizeof(again), 0));
  RT(o, cudaDeviceGetPCIBusId(rt, sizeof(rt), 0));
  CUdevice back = -1;
  DRV(o, cuDeviceGetByPCIBusId(&back, id));
  const size_t n = strnlen(id, sizeof(id));
  if (n == 0 || strcmp(id, again) != 0 || strcmp(id, rt) != 0) o.Fail("the bus id changed between asks");
  if (cut_r != CUDA_ERROR_INVALID_VALUE) o.Fail("a buffer too short for the bus id was not refused");
  if (back != 0) o.Fail("the bus id does not name device 0");
  const int answers[2] = {static_cast<int>(n), static_cast<int>(back)};
  o.Result(answers, sizeof(answers));
}
